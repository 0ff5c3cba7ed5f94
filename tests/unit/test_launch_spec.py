"""The deploy command after its engine's parse, without an engine: LaunchSpec records, the command's own findings
(serving/command/findings.py), explain's exit rule, the gate's static level with a launch (gate_live.py), the CLI
options and a pyproject ``launch`` key. The engines' own parses of real commands are tests/serving/test_launch_parse.py
and tests/vllm_engine/test_vllm_launch_parse.py."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from tests.resolved_deployments import tiny_deployment

from specparity import gate
from specparity.cli import main
from specparity.cli_command import explain_exit, read_command
from specparity.compare.findings import Finding, FindingKind, Severity
from specparity.deploy_command import read_launch
from specparity.errors import EXIT_BAD_INPUT, InputError
from specparity.plugin_deployments import from_pyproject
from specparity.serving.command.findings import command_findings, rewrite_findings
from specparity.serving.command.parse import LaunchSpec
from specparity.serving.results import SpecSettings

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "fixtures" / "default"
VLLM = ROOT / "fixtures" / "vllm"
CONTRACT = ROOT / "contracts" / "tiny-llama-eagle3.json"
DRAFT_CFG = json.loads((BUNDLE / "draft" / "config.json").read_text())
SPECULATORS_CFG = json.loads((VLLM / "speculators" / "draft" / "config.json").read_text())


def _spec(text: str, **fields: Any) -> LaunchSpec:
    command = fields.pop("command", None) or read_launch(text, source="--launch", cwd=ROOT, environ={})
    base = LaunchSpec(command=command, engine=command.engine, engine_version="0.5.23", parsed={},
                      target=str(BUNDLE / "target"), draft=str(BUNDLE / "draft"), engine_args={},
                      target_flag="--model-path", draft_flag="--speculative-draft-model-path", python="/py")
    return dataclasses.replace(base, **fields)


def _kinds(findings: list[Finding]) -> list[str]:
    return [f.kind.value for f in findings]


# ------------------------------------------------------------------------------------------------ findings
@pytest.mark.parametrize(("algorithm", "resolved", "found"), [
    ("EAGLE", None, True), ("NEXTN", "EAGLE", True), ("EAGLE3", None, False), (None, None, False)])
def test_eagle3_drafter_under_sglangs_eagle_is_an_error(algorithm: str | None, resolved: str | None,
                                                        found: bool) -> None:
    spec = _spec("python -m sglang.launch_server --model-path m", speculative={"algorithm": algorithm},
                 resolved={"speculative_algorithm": resolved} if resolved else None)
    findings = command_findings(spec, draft_config=DRAFT_CFG)
    assert (_kinds(findings) == ["eagle3_served_as_eagle"]) is found
    if found:
        (f,) = findings
        assert f.severity is Severity.ERROR and "LlamaForCausalLMEagle3" in f.message
        assert "spec_aux_hidden_state.py:185-186" in f.message and f.fix == "serve it with --speculative-algorithm EAGLE3"


def test_eagle3_drafter_under_vllms_method_eagle_is_an_error() -> None:
    spec = _spec("vllm serve m", engine="vllm", draft=str(VLLM / "speculators" / "draft"), target=str(VLLM / "target"),
                 speculative={"method": "eagle", "effective_method": "eagle"})
    (f,) = command_findings(spec, draft_config=SPECULATORS_CFG)
    assert f.kind is FindingKind.EAGLE3_SERVED_AS_EAGLE and "Eagle3Speculator" in f.message
    assert "gpu_model_runner.py:644-648" in f.message and '"method": "eagle3"' in (f.fix or "")
    ok = dataclasses.replace(spec, speculative={"method": "eagle3", "effective_method": "eagle3"})
    assert command_findings(ok, draft_config=SPECULATORS_CFG) == []


def test_an_eagle2_drafter_under_eagle_is_fine() -> None:
    spec = _spec("python -m sglang.launch_server --model-path m", speculative={"algorithm": "EAGLE"})
    assert command_findings(spec, draft_config={"architectures": ["LlamaForCausalLMEagle"]}) == []


def test_the_served_target_against_the_one_the_drafter_names() -> None:
    draft = VLLM / "speculators" / "draft"  # verifier.name_or_path "../../target": fixtures/vllm/target
    spec = _spec("vllm serve m", engine="vllm", target=str(VLLM / "target"), draft=str(draft))
    assert command_findings(spec, draft_config=SPECULATORS_CFG) == []
    other = dataclasses.replace(spec, target=str(BUNDLE / "target"))
    (f,) = command_findings(other, draft_config=SPECULATORS_CFG)
    assert f.kind is FindingKind.SERVED_TARGET_UNEXPECTED and f.severity is Severity.WARNING
    assert "'../../target'" in f.message and "speculators_config.verifier.name_or_path" in f.message


@pytest.mark.parametrize(("named", "served", "same"), [
    ("meta-llama/Llama-3.1-8B-Instruct", "/models/Llama-3.1-8B-Instruct", True),
    ("meta-llama/Llama-3.1-8B-Instruct",
     "/hf/hub/models--meta-llama--Llama-3.1-8B-Instruct/snapshots/abc123", True),
    ("meta-llama/Llama-3.1-8B-Instruct", "/models/Qwen3-8B", False),
])
def test_the_served_target_against_the_contracts_name(named: str, served: str, same: bool) -> None:
    spec = _spec("python -m sglang.launch_server --model-path m", target=served)
    findings = command_findings(spec, draft_config=DRAFT_CFG, contract_target=named)
    assert (findings == []) is same


def test_vllms_speculators_form_is_said() -> None:
    spec = _spec("vllm serve d", engine="vllm", target=str(VLLM / "target"),
                 draft=str(VLLM / "speculators" / "draft"), target_flag="speculators_config.verifier.name_or_path",
                 draft_from_config={"draft": "d", "verifier": "../../target"})
    (f,) = command_findings(spec, draft_config=SPECULATORS_CFG)  # the verifier is the served target: no warning
    assert f.kind is FindingKind.TARGET_FROM_DRAFT_CONFIG and f.severity is Severity.INFO


def test_a_rewrite_is_a_warning_citing_the_rule() -> None:
    data = {"engine_version": "0.5.23", "requested_spec": {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 16},
            "resolved_spec": {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}}
    (f,) = rewrite_findings(data, engine="sglang", rule="sglang/srt/arg_groups/speculative_hook.py:1255-1266")
    assert f.kind is FindingKind.SPEC_CONFIG_REWRITTEN and f.severity is Severity.WARNING
    assert "16 -> 4" in f.message and "speculative_hook.py:1255-1266" in f.message
    assert f.fix and "--speculative-num-steps 15" in f.fix
    same = {**data, "requested_spec": data["resolved_spec"]}
    assert rewrite_findings(same, engine="sglang", rule=None) == []


@pytest.mark.parametrize(("code", "severities", "strict", "notes", "want"), [
    (0, [], False, [], 0), (0, ["warning"], False, [], 0), (0, ["warning"], True, [], 1),
    (0, [], True, [{"kind": "untested_version", "severity": "warning"}], 1), (0, ["error"], False, [], 1),
    (3, ["error"], True, [], 3), (2, [], True, [], 2)])
def test_explain_exit(code: int, severities: list[str], strict: bool, notes: list[dict[str, str]], want: int) -> None:
    findings = [Finding(FindingKind.SPEC_CONFIG_REWRITTEN, Severity(s), "m") for s in severities]
    got, summary = explain_exit(code, "S", findings, {"adapter_notes": notes}, strict=strict)
    assert got == want
    assert summary == "S" or got != code


# ------------------------------------------------------------------------------------------------ records
def test_to_dict_is_safe_to_print_and_reads_back() -> None:
    command = read_launch("export HF_TOKEN=hf_x\nvllm serve m --api-key sk-1", source="--launch", cwd=ROOT,
                          environ={})
    spec = _spec("vllm serve m", command=command, engine="vllm", api_key_set=True,
                 secret_args=(command.args.index("sk-1"),), engine_args={"tensor_parallel_size": 2})
    text = json.dumps(spec.to_dict()) + "\n".join(spec.lines())
    assert "sk-1" not in text and "hf_x" not in text and "***" in text
    back = LaunchSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert back.to_dict() == spec.to_dict()
    assert spec.command.args[-1] == "sk-1"  # what re-runs the command keeps it


# ------------------------------------------------------------------------------------------------ the gate
class _Resolver:
    name, label = "sglang", "SGLang"

    def __init__(self, **fields: Any) -> None:
        self.calls: list[dict[str, Any]] = []
        self.fields = fields

    def spec_args(self, *values: int | None) -> dict[str, object]:
        from specparity.serving.engine import get_engine

        return get_engine("sglang").spec_args(*values)

    def resolve(self, target: Any, draft: Any, **kw: Any) -> Any:
        self.calls.append({"target": target, "draft": draft, "env": os.environ.get("SPECPARITY_TEST_ENV"), **kw})
        return tiny_deployment(BUNDLE, **self.fields)

    def layout_fix(self, *a: Any, **kw: Any) -> Any:
        from specparity.serving.engine import get_engine

        return get_engine("sglang").layout_fix(*a, **kw)

    def reading(self, *a: Any, **kw: Any) -> None:
        return None


def _launched(algorithm: str = "EAGLE3") -> LaunchSpec:
    command = read_launch(f"SPECPARITY_TEST_ENV=from-command python -m sglang.launch_server --model-path "
                          f"{BUNDLE / 'target'} --speculative-algorithm {algorithm}", source="--launch", cwd=ROOT,
                          environ={})
    return _spec("x", command=command, speculative={"algorithm": algorithm},
                 engine_args={"speculative_algorithm": algorithm, "tp_size": 1, "speculative_num_steps": 3})


def test_static_gate_runs_the_commands_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    eng = _Resolver()
    monkeypatch.setattr(gate, "get_engine", lambda name: eng)
    v = gate.run_gate(CONTRACT, level="static", launch=_launched(), engine_args={"tp_size": 1})
    [call] = eng.calls
    assert Path(call["target"]) == BUNDLE / "target" and Path(call["draft"]) == BUNDLE / "draft"
    assert call["args"]["speculative_algorithm"] == "EAGLE3" and call["args"]["speculative_num_steps"] == 3
    assert call["env"] == "from-command" and os.environ.get("SPECPARITY_TEST_ENV") is None
    assert v.status == "pass" and v.launch is not None and v.launch["engine_args"]["tp_size"] == 1
    assert v.to_dict()["launch"]["command"]["env"] == {"SPECPARITY_TEST_ENV": "from-command"}
    from specparity.report import render_text

    text = render_text(v)
    assert "Launch command (--launch): SPECPARITY_TEST_ENV=from-command python -m sglang.launch_server" in text
    assert "Launch parsed by SGLang 0.5.23" in text


def test_static_gate_fails_an_eagle3_drafter_served_as_eagle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gate, "get_engine", lambda name: _Resolver())
    v = gate.run_gate(CONTRACT, level="static", launch=_launched("EAGLE"))
    assert v.status == "fail" and "eagle3_served_as_eagle" in _kinds(list(v.findings))


def test_a_target_other_than_the_commands_is_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gate, "get_engine", lambda name: _Resolver())
    with pytest.raises(InputError, match=r"--target .* but the launch command serves") as e:
        gate.run_gate(CONTRACT, BUNDLE / "draft", level="static", launch=_launched())
    assert e.value.exit_code == EXIT_BAD_INPUT


def test_the_gate_reports_a_rewrite_of_the_commands_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    rewritten = {"requested_spec": SpecSettings(3, 1, 16), "resolved_spec": SpecSettings(3, 1, 4)}
    monkeypatch.setattr(gate, "get_engine", lambda name: _Resolver(**rewritten))
    v = gate.run_gate(CONTRACT, level="static", launch=_launched())
    assert "spec_config_rewritten" in _kinds(list(v.findings)) and v.status == "fail"


# ------------------------------------------------------------------------------------------------ CLI and plugin
def test_read_command_forms(tmp_path: Path) -> None:
    assert read_command(False, (), None) is None
    c = read_command(True, ("SGLANG_X=1", "vllm", "serve", "m", "--speculative-config", '{"a": 1}'), None)
    assert c is not None and c.env == {"SGLANG_X": "1"} and c.args == ("m", "--speculative-config", '{"a": 1}')
    one = read_command(True, ("vllm serve m --tp 2",), None)  # the command quoted as one word
    assert one is not None and one.args == ("m", "--tp", "2")
    script = tmp_path / "serve.sh"
    script.write_text("#!/bin/bash\nexport A=1\nvllm serve m\n")
    from_file = read_command(False, (), script)
    assert from_file is not None and from_file.env == {"A": "1"} and from_file.path == str(script)


@pytest.mark.parametrize(("args", "message"), [
    (["--launch"], "--launch needs the command"),
    (["--", "vllm", "serve", "m"], "--launch -- COMMAND"),
    (["--launch", "--", "trtllm-serve", "m"], "starts neither engine"),
    (["--launch", "--", "vllm serve $NOT_SET_ANYWHERE"], "is not set"),  # one word: the command's own text
    (["--launch-file", "/no/such/file.sh"], "launch file"),
])
def test_cli_bad_launch_input_is_exit_2(args: list[str], message: str) -> None:
    for cmd in (["gate", "--contract", str(CONTRACT)], ["explain"]):
        result = CliRunner().invoke(main, [*cmd, *args])
        assert result.exit_code == EXIT_BAD_INPUT, result.output
        assert message in result.output
        assert "Traceback" not in result.output


def test_cli_without_launch_still_needs_target_and_draft() -> None:
    result = CliRunner().invoke(main, ["explain", "--draft", str(BUNDLE / "draft")])
    assert result.exit_code == EXIT_BAD_INPUT and "missing --target" in result.output


def test_pyproject_launch_key(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.specparity.deployments.srv]\ncontract = "{CONTRACT}"\nlevel = "static"\n'
        "launch = '''\nexport SGLANG_ENABLE_SPEC_V2=1\npython -m sglang.launch_server \\\n"
        "  --model-path ../m --speculative-algorithm EAGLE3\n'''\n")
    (d,) = from_pyproject(tmp_path / "pyproject.toml")
    assert d.engine == "sglang" and d.target is None and d.draft is None
    assert d.launch is not None and "SGLANG_ENABLE_SPEC_V2" in d.launch and d.launch_cwd == str(tmp_path)
    assert d.to_dict()["launch"] == d.launch


@pytest.mark.parametrize(("extra", "message"), [
    ('engine = "vllm"\nlaunch = "python -m sglang.launch_server --model-path m"', "the launch command starts sglang"),
    ('launch = "echo hi"', "starts neither engine"),
    ('target = "t"\ndraft = "d"\nlaunch = 3', "expected the deploy command as a string"),
    ('draft = "d"', "missing key 'target' (or a launch key"),
])
def test_pyproject_launch_key_bad_input(tmp_path: Path, extra: str, message: str) -> None:
    (tmp_path / "pyproject.toml").write_text(f'[tool.specparity.deployments.srv]\ncontract = "c.json"\n{extra}\n')
    with pytest.raises(InputError, match=re.escape(message)):
        from_pyproject(tmp_path / "pyproject.toml")


def test_the_plugin_parses_a_launch_key_when_the_gate_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pyproject launch key reaches run_gate as the engine's parse of the command, read in the pyproject's
    directory, with the table's python; nothing is parsed by an engine at collection."""
    from specparity import plugin_items
    from specparity.serving.command import parse as launch_mod

    (tmp_path / "pyproject.toml").write_text(
        f'[tool.specparity.deployments.srv]\ncontract = "{CONTRACT}"\nlevel = "static"\npython = "/venv/bin/python"\n'
        'launch = "python -m sglang.launch_server --model-path m --tp 2"\n')
    (d,) = from_pyproject(tmp_path / "pyproject.toml")
    seen: dict[str, Any] = {}

    def fake_parse(command: Any, *, python: str | None = None, **kw: Any) -> str:
        seen.update(command=command, python=python)
        return "the spec"

    def fake_gate(contract: Any, target: Any, draft: Any, **kw: Any) -> str:
        seen.update(target=target, draft=draft, **kw)
        return "verdict"

    monkeypatch.setattr(launch_mod, "parse_launch", fake_parse)
    monkeypatch.setattr(gate, "run_gate", fake_gate)
    assert plugin_items._run_gate(d) == "verdict"
    assert seen["launch"] == "the spec" and seen["target"] is None and seen["draft"] is None
    assert seen["command"].cwd == str(tmp_path) and seen["command"].args == ("--model-path", "m", "--tp", "2")
    assert seen["python"] == "/venv/bin/python"
