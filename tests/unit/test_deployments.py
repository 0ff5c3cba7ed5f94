"""Deployments from pyproject.toml and ini lines: their engine arguments reach the gate with the types written."""

from __future__ import annotations

import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from specparity import gate, plugin
from specparity.compare.findings import FindingKind
from specparity.contract import load_contract
from specparity.errors import InputError
from specparity.plugin_deployments import Deployment, from_ini_line, from_pyproject
from specparity.serving import ResolvedDeployment, SpecSettings
from specparity.serving.engine import get_engine
from specparity.serving.results import SPEC_SERVER_ARGS

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "contracts" / "tiny-llama-eagle3.json"
BUNDLE = ROOT / "fixtures" / "default"


def _one(tmp_path: Path, engine_args: str) -> Deployment:
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.specparity.deployments.x]\ncontract = "{CONTRACT}"\ntarget = "{BUNDLE / "target"}"\n'
        f'draft = "{BUNDLE / "draft"}"\nlevel = "static"\nengine_args = {engine_args}\n')
    (d,) = from_pyproject(tmp_path / "pyproject.toml")
    return d


def _gate_kwargs(d: Deployment, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What the plugin hands run_gate for ``d`` (run_gate replaced by a recorder)."""
    seen: dict[str, Any] = {}

    def fake(contract: Any, target: Any, draft: Any, **kw: Any) -> str:
        seen.update(kw)
        return "verdict"

    monkeypatch.setattr(gate, "run_gate", fake)
    assert plugin._run_gate(d) == "verdict"
    return seen


def test_toml_engine_args_reach_the_gate_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _one(tmp_path, '{ a = "3", b = "True", c = 3, d = true, e = "none", f = [1, "2"], g = { h = 0.5 } }')
    want = {"a": "3", "b": "True", "c": 3, "d": True, "e": "none", "f": [1, "2"], "g": {"h": 0.5}}
    got = _gate_kwargs(d, monkeypatch)["deployed_args"]
    assert got == want
    assert [type(v) for v in got.values()] == [type(v) for v in want.values()]  # 3 is not True, "3" is not 3
    assert pickle.loads(pickle.dumps(d)) == d and hash(d) == hash(replace(d))  # lists inside: still hashable


def test_text_is_typed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    line = from_ini_line(f"x contract={CONTRACT} target=t draft=d engine_arg=n=3 engine_arg=b=True engine_arg=e=none",
                         base=tmp_path, where="tox.ini")
    listed = _one(tmp_path, '["n=3", "b=True", "e=none"]')  # a TOML list of KEY=VALUE strings is text too
    for d in (line, listed):
        assert _gate_kwargs(d, monkeypatch)["deployed_args"] == {"n": 3, "b": True, "e": None}


def test_keys_are_spelled_as_for_text_and_a_toml_date_is_refused(tmp_path: Path) -> None:
    assert _one(tmp_path, '{ "--speculative-num-steps" = 3 }').engine_args == (("speculative_num_steps", 3),)
    with pytest.raises(InputError) as e:
        _one(tmp_path, "{ when = 2024-01-01 }")
    assert e.value.field == "tool.specparity.deployments.x.engine_args.when"
    with pytest.raises(InputError) as e:
        _one(tmp_path, '{ "a b" = 1 }')
    assert e.value.field == "tool.specparity.deployments.x.engine_args.a b"


class _ResolvingEngine:
    """The SGLang adapter's spelling, with a resolve that reports what the child would: the requested settings
    read back from the arguments it received, the resolved ones from a ServerArgs that kept them."""

    name, label = "sglang", "SGLang"

    def __init__(self) -> None:
        self.args: dict[str, object] = {}
        self.real = get_engine("sglang")

    def spec_args(self, *values: int | None) -> dict[str, object]:
        return self.real.spec_args(*values)

    def resolve(self, target: Any, draft: Any, *, args: dict[str, object], **kw: Any) -> ResolvedDeployment:
        self.args = dict(args)
        spec = SpecSettings(*(args.get(k) for k in SPEC_SERVER_ARGS))  # as since_0_5_11/core.py builds requested_spec
        return ResolvedDeployment(
            engine_version="0.5.23", adapter="sglang-0.5.23", target_path=str(target), draft_path=str(draft),
            device="cpu", target_architecture="LlamaForCausalLM", num_layers=8, target_hidden_size=64,
            target_vocab_size=512, target_dtype="float32", draft_architecture="LlamaForCausalLMEagle3",
            draft_hidden_size=64, draft_vocab_size=256, requested_spec=spec, resolved_spec=SpecSettings(3, 1, 4),
            spec_warnings=(), draft_config_ids=(1, 3, 5), ids_fallback_reason=None, layers_to_capture=(2, 4, 6),
            served_sources=("layer:1", "layer:3", "layer:5"), fc_in_features=192, fc_out_features=64,
            fc_bias=False, num_aux_hidden_states=3, fc_applied=True, norm_before_fc=False, fc_norm=False,
            norm_output=False, fc_bias_in_config=False, server_args=dict(args), timings={})

    def layout_fix(self, *a: Any, **kw: Any) -> Any:
        return self.real.layout_fix(*a, **kw)

    def reading(self, *a: Any, **kw: Any) -> None:
        return None


def test_toml_num_steps_equals_the_contracts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = load_contract(CONTRACT).serving
    assert (c.num_steps, c.eagle_topk, c.num_draft_tokens) == (3, 1, 4)
    d = _one(tmp_path, "{ speculative_num_steps = 3, speculative_eagle_topk = 1, speculative_num_draft_tokens = 4 }")
    eng = _ResolvingEngine()
    monkeypatch.setattr(gate, "get_engine", lambda name: eng)
    verdict = plugin._run_gate(d)  # the plugin's path: deployment -> run_gate -> the engine's arguments
    assert eng.args == {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
    assert not [f for f in verdict.findings if f.kind is FindingKind.SPEC_CONFIG_REWRITTEN]
    assert verdict.status == "pass"


def test_a_server_key_is_a_running_server_to_check(tmp_path: Path) -> None:
    """``server = "URL"``: target, draft and engine optional (the server reports them); with launch, or not a URL,
    exit 2 naming the key."""
    py = tmp_path / "pyproject.toml"
    py.write_text(f'[tool.specparity.deployments.staging]\ncontract = "{CONTRACT}"\nserver = "http://127.0.0.1:8000"\n')
    (d,) = from_pyproject(py)
    assert d.server == "http://127.0.0.1:8000" and d.target is None and d.draft is None
    assert d.to_dict()["server"] == d.server
    for bad, field in (('server = "127.0.0.1:8000"', "server"),
                       ('server = "http://h:1"\nlaunch = "vllm serve m"', "server")):
        py.write_text(f'[tool.specparity.deployments.staging]\ncontract = "{CONTRACT}"\n{bad}\n')
        with pytest.raises(InputError) as e:
            from_pyproject(py)
        assert e.value.exit_code == 2 and (e.value.field or "").endswith(field)
