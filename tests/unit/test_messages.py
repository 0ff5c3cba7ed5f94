"""Messages that name the right thing, each kept fixed by a test here or beside the code it
names: the engine in an acceptance collapse, the in-process layout, the CLI help, an empty served layout, an unknown
engine in a deployment table, a corrupt model-module cache. (The JUnit suite time: tests/unit/test_report_files.py;
swapped --target/--draft and the replay limit: tests/unit/test_bad_inputs.py.)
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from specparity.cli import main
from specparity.compare.diagnosis import layout_findings
from specparity.errors import InputError
from specparity.plugin_deployments import from_ini_line, from_pyproject
from specparity.replay.acceptance import AcceptanceResult
from specparity.replay.diagnosis import diagnose
from specparity.report.layout import layout_line
from specparity.verdict import Verdict


@pytest.mark.parametrize("engine", ["vLLM", "SGLang"])
def test_an_acceptance_collapse_names_the_engine_that_served(engine: str) -> None:
    recorded = AcceptanceResult(num_steps=1, at_risk=(200,), accepted=(160,))
    served = AcceptanceResult(num_steps=1, at_risk=(200,), accepted=(10,))
    _, findings = diagnose(recorded, served, engine=engine)
    [collapse] = [f for f in findings if f.kind.value == "acceptance_collapse"]
    assert collapse.message.startswith(f"drafter acceptance collapses on the fc input {engine} serves: ")
    assert ("SGLang" in collapse.message) == (engine == "SGLang")


def _in_process(reported: list[int] | None) -> Verdict:
    return Verdict(contract_name="c", contract_hash=None, level="capture", status="pass", engine_version="0.5.23",
                   target_architecture="LlamaForCausalLM", draft_path="d", expected_layout=["layer:1"],
                   served_layout=["layer:1"],
                   layout={"engine": "sglang", "executor": "in-process", "tensor_parallel_size": 1,
                           "pipeline_parallel_size": 1, "data_parallel_size": 1, "expert_parallel_size": 1,
                           "ranks_expected": [0], "ranks_reported": reported, "nodes": 1 if reported else None,
                           "ranks": None})


def test_an_in_process_layout_never_reads_0_of_0() -> None:
    captured, static = layout_line(_in_process([0])), layout_line(_in_process(None))
    assert captured == ("Layout: sglang (in-process) TP=1 PP=1 DP=1 EP=1, 1 node, ranks reported 1 of 1 "
                        "(rank 0, in-process)")
    assert static is not None and static.endswith("ranks reported none: no capture ran in-process")
    assert "0 of 0" not in captured + static


def test_the_help_names_both_engines() -> None:
    text = CliRunner().invoke(main, ["--help"]).output
    assert "SGLang or vLLM" in text and "what SGLang really feeds" not in text
    gate_help = CliRunner().invoke(main, ["gate", "--help"]).output
    assert "Seconds before the engine is stopped" in gate_help
    assert "the engine (SGLang or vLLM) will feed" in CliRunner().invoke(main, ["explain", "--help"]).output


def test_an_empty_served_layout_says_nothing_was_served() -> None:
    findings = layout_findings(["layer:1", "layer:3"], [])
    assert [f.message for f in findings] == ["layer:1 is in the contract but in no served chunk (nothing served)",
                                             "layer:3 is in the contract but in no served chunk (nothing served)"]
    [one] = layout_findings(["layer:1", "layer:3"], ["layer:1"])
    assert one.message.endswith("(served layer:1)")


def test_an_unknown_engine_in_a_deployment_table_is_named_where_written(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[tool.specparity.deployments.x]\ncontract = "c.json"\ntarget = "t"\ndraft = "d"\n'
                         'engine = "tensorrt"\n')
    with pytest.raises(InputError) as e:
        from_pyproject(pyproject)
    assert str(e.value) == (f"{pyproject}: tool.specparity.deployments.x.engine: unknown engine 'tensorrt'; "
                            "choose one of sglang, vllm")
    with pytest.raises(InputError) as e:
        from_ini_line("x contract=c.json target=t draft=d engine=trt", base=tmp_path, where="tox.ini")
    assert "unknown engine 'trt'" in str(e.value) and "--engine" not in str(e.value)


def test_an_unknown_engine_fails_at_collection_not_at_run_time(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml('[tool.specparity.deployments.x]\ncontract = "c.json"\ntarget = "t"\ndraft = "d"\n'
                               'engine = "tensorrt"\n')
    collected = pytester.runpytest_subprocess("-m", "parity", "--collect-only", "-q", "-p", "no:cacheprovider")
    collected.stdout.fnmatch_lines(["parity::configuration"])
    result = pytester.runpytest_subprocess("-m", "parity", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*tool.specparity.deployments.x.engine: unknown engine 'tensorrt'; choose one of "
                                 "sglang, vllm*"])
    assert "--engine" not in result.stdout.str()


def test_a_corrupt_model_module_cache_is_written_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A torn ``sglang-model-modules-*.json`` is read as no cache, and the next full registry import repairs it
    (it used to stay, so every later run imported SGLang's whole registry)."""
    from specparity.serving.sglang import model_modules

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(model_modules, "_ENABLED", None)
    monkeypatch.setenv(model_modules.ENV, "")
    monkeypatch.delenv(model_modules.ENV)  # recorded, so the variable limit_registry sets is removed after
    models = model_modules._models_dir()
    if models is None or "sglang.srt.models.registry" in sys.modules:
        pytest.skip("needs sglang installed and its registry not imported in this process")
    cache = model_modules._cache_file(models)
    cache.parent.mkdir(parents=True)
    cache.write_text('{"LlamaForCausalLM": "lla')  # torn mid-write
    assert model_modules.limit_registry(["LlamaForCausalLM"]) is None  # the full registry, not a crash

    llama = type("LlamaForCausalLM", (), {"__module__": "sglang.srt.models.llama"})
    registry = types.ModuleType("sglang.srt.models.registry")
    registry.ModelRegistry = types.SimpleNamespace(models={"LlamaForCausalLM": llama})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sglang.srt.models.registry", registry)
    model_modules.record_full_registry()
    assert json.loads(cache.read_text()) == {"LlamaForCausalLM": "llama"}
    assert sorted(p.name for p in cache.parent.iterdir()) == [cache.name]  # no temporary file left
    monkeypatch.delitem(sys.modules, "sglang.srt.models.registry")
    assert model_modules.limit_registry(["LlamaForCausalLM"]) == frozenset({"llama"})


# --- a target the engine loads only partly is the engine's partial load, never "deploy the right target" ------------
_LOAD = {"engine_file_line": "sglang/srt/models/qwen3_moe.py:1157", "function": "Qwen3MoeForCausalLM.load_weights",
         "parameters": 97, "parameters_checked": 97, "checkpoint_tensors": 107,
         "never_loaded": ["model.layers.0.mlp.experts.w13_weight", "model.layers.0.mlp.experts.w2_weight",
                          "model.layers.0.mlp.gate.weight"], "never_loaded_count": 3,
         "modules": ["model.layers.0.mlp (Qwen3MoeSparseMoeBlock, sglang/srt/models/qwen3_moe.py:234)"],
         "partly_loaded": [], "partly_loaded_count": 0,
         "skipped": ["model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.gate_proj.weight",
                     "model.layers.0.mlp.up_proj.weight"], "skipped_count": 3}


def test_a_partial_load_names_the_engines_load_weights_and_what_it_left() -> None:
    from specparity.compare.findings import FindingKind
    from specparity.compare.target import partial_load_findings

    [f] = partial_load_findings(_LOAD, engine="sglang", version="0.5.23")
    assert f.kind is FindingKind.TARGET_PARTLY_LOADED and f.kind.value == "target_partly_loaded" and f.is_failure
    assert f.message.startswith("SGLang 0.5.23 loaded the target only partly: its Qwen3MoeForCausalLM.load_weights "
                                "(sglang/srt/models/qwen3_moe.py:1157) left 3 of the target's 97 parameters unloaded "
                                "(model.layers.0.mlp.experts.w13_weight, "), f.message
    assert ", in model.layers.0.mlp (Qwen3MoeSparseMoeBlock, sglang/srt/models/qwen3_moe.py:234)" in f.message
    assert "it skipped 3 of the checkpoint's 107 tensors (no weight loader ran for them): " \
           "model.layers.0.mlp.down_proj.weight, model.layers.0.mlp.gate_proj.weight, " in f.message, f.message
    assert f.fix is not None and f.fix.startswith("SGLang 0.5.23 loads this checkpoint only partly: ")
    assert "model.layers.0.mlp (Qwen3MoeSparseMoeBlock" in f.fix and "not at fault" in f.fix
    assert f.details["cite"] == "sglang/srt/models/qwen3_moe.py:1157" and f.details["check"] == "capture"
    # nothing skipped: the checkpoint lacks the tensors; not said exactly: no claim about the tensors
    [none] = partial_load_findings({**_LOAD, "skipped": [], "skipped_count": 0}, engine="sglang", version="0.5.23")
    assert none.fix is not None and "the checkpoint has no tensor for" in none.fix
    [unsaid] = partial_load_findings({**_LOAD, "skipped": None, "skipped_count": None}, engine="sglang",
                                     version="0.5.23")
    assert "cannot be said exactly" in unsaid.message and "not at fault" not in (unsaid.fix or "")
    assert partial_load_findings({}, engine="sglang", version="0.5.23") == []
    assert partial_load_findings({**_LOAD, "never_loaded": [], "never_loaded_count": 0}, engine="sglang",
                                 version="0.5.23") == []


def test_with_a_partial_load_target_mismatch_on_the_weights_gives_no_deploy_the_trained_target_fix() -> None:
    from specparity.compare.findings import Finding, FindingKind, Severity
    from specparity.compare.target import explained_by_partial_load, partial_load_findings

    weights = Finding(FindingKind.TARGET_MISMATCH, Severity.ERROR, "no recorded chunk matches any boundary of the "
                      "deployed target (closest: ...): the deployed target has other weights than the one training "
                      "recorded",
                      details={"reason": "weights"}, fix="deploy the target the drafter was trained against")
    config = Finding(FindingKind.TARGET_MISMATCH, Severity.ERROR, "config.json differs",
                     details={"reason": "config"}, fix="deploy the target the drafter was trained against, or ...")
    assert explained_by_partial_load([weights, config]) == [weights, config]  # no partial load: unchanged
    partly = partial_load_findings(_LOAD, engine="sglang", version="0.5.23")
    out = explained_by_partial_load([weights, config, *partly])
    assert out[0].fix is None and "loaded this target only partly (target_partly_loaded)" in out[0].message
    assert "other weights" not in out[0].message and "computes other hidden states" in out[0].message
    assert out[0].details["explained_by"] == "target_partly_loaded"
    assert out[1] == config and out[2] == partly[0]  # a config that differs is still the target's own
