"""The gate's own rules, on hand-built serving results (SGLang itself is exercised in tests/catalog)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specparity import gate
from specparity.contract import load_contract
from specparity.errors import InputError
from specparity.serving import ResolvedDeployment

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "contracts" / "tiny-llama-eagle3.json"
BUNDLE = ROOT / "fixtures" / "default"


def test_parse_sglang_args_types_values_and_normalises_keys() -> None:
    assert gate.parse_sglang_args(["--speculative-num-steps=3", "dtype=bfloat16", "disable_cuda_graph=true",
                                   "mem_fraction_static=0.5", "x=none"]) == {
        "speculative_num_steps": 3, "dtype": "bfloat16", "disable_cuda_graph": True, "mem_fraction_static": 0.5,
        "x": None}
    with pytest.raises(InputError) as e:
        gate.parse_sglang_args(["speculative_num_steps"])
    assert e.value.field == "--sglang-arg"


def test_contract_serving_settings_are_defaults_the_user_overrides() -> None:
    c = load_contract(CONTRACT)
    assert gate.server_args_for(c, {}) == {"speculative_num_steps": 3, "speculative_eagle_topk": 1,
                                           "speculative_num_draft_tokens": 4}
    assert gate.server_args_for(c, {"speculative_num_draft_tokens": 16})["speculative_num_draft_tokens"] == 16


def test_unknown_level_is_bad_input() -> None:
    with pytest.raises(InputError) as e:
        gate.run_gate(CONTRACT, BUNDLE / "target", BUNDLE / "draft", level="everything")
    assert e.value.field == "--level"


def _deployment() -> ResolvedDeployment:
    from specparity.serving import SpecSettings

    spec = SpecSettings(3, 1, 4)
    return ResolvedDeployment(
        sglang_version="0.5.23", adapter="sglang-0.5.23", target_path=str(BUNDLE / "target"),
        draft_path=str(BUNDLE / "draft"), device="cpu", target_architecture="LlamaForCausalLM", num_layers=8,
        target_hidden_size=64, target_vocab_size=512, target_dtype="float32",
        draft_architecture="LlamaForCausalLMEagle3", draft_hidden_size=64, draft_vocab_size=256,
        requested_spec=spec, resolved_spec=spec, spec_warnings=(), draft_config_ids=(1, 3, 5),
        ids_fallback_reason=None, layers_to_capture=(2, 4, 6), served_sources=("layer:1", "layer:3", "layer:5"),
        fc_in_features=192, fc_out_features=64, fc_bias=False, num_aux_hidden_states=3, fc_applied=True,
        norm_before_fc=False, fc_norm=False, norm_output=False, fc_bias_in_config=False, server_args={}, timings={})


def test_a_capture_without_tensors_is_never_a_pass() -> None:
    """Even a serving result that reports no failure but brings no tensors back cannot pass."""
    run = gate._Run(contract=load_contract(CONTRACT), draft=BUNDLE / "draft", deployment=_deployment())
    v = gate._verdict(run, level="capture", timings={})
    assert v.status != "pass" and any("no fc input" in f.message for f in v.errors)
    v = gate._verdict(run, level="static", timings={})
    assert v.status == "pass"  # static level: the resolved layout is the evidence


def test_outcome_level_without_figures_is_never_a_pass() -> None:
    run = gate._Run(contract=load_contract(CONTRACT), draft=BUNDLE / "draft", deployment=_deployment())
    v = gate._verdict(run, level="all", timings={})
    assert v.status != "pass" and any("no acceptance figures" in f.message for f in v.errors)


def test_outcome_cannot_pass_on_the_training_side_replay_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 11 item 8: when SGLang's own drafter replay fails, healthy training-side figures are not a pass."""
    import torch

    import specparity.replay.outcome as outcome_mod
    from specparity.compare.findings import FindingKind, Severity
    from specparity.replay.acceptance import AcceptanceResult
    from specparity.replay.diagnosis import diagnose
    from specparity.serving.results import CaptureResult, FcCapture, ServingFailure

    fc = FcCapture(per_sample=[torch.zeros(4, 192)], dtype="float32", sglang_version="0.5.23", hook_calls=1,
                   aux_states_captured=3, aux_states_expected=3, kernel_stub_calls=())
    capture = CaptureResult(deployment=_deployment(), fc=fc, atlas=None, failures=())
    good = AcceptanceResult(1, (300,), (255,))
    summary, findings = diagnose(good, good)
    assert summary.diagnosis == "healthy" and findings == []
    report = outcome_mod.OutcomeReport(summary=summary, findings=findings, recorded=good, served=good, num_steps=1,
                                       first_draft_source="training_side", sglang_agreement=None)
    replay_failed = ServingFailure("sglang_exception", "the drafter replay raised RuntimeError at sglang/x.py:1")
    monkeypatch.setattr(outcome_mod, "check_outcome", lambda *a, **k: outcome_mod.OutcomeRun(
        capture=capture, report=report, failures=(replay_failed,)))
    run = gate._Run(contract=load_contract(CONTRACT), draft=BUNDLE / "draft", deployment=_deployment())
    gate._capture(run, None, BUNDLE / "target", BUNDLE / "draft", {}, level="outcome",  # type: ignore[arg-type]
                  device="cpu", python=None, timeout_s=1, progress=None)
    assert run.outcome is summary
    [f] = run.outcome_findings
    assert (f.kind, f.severity) == (FindingKind.SGLANG_ERROR, Severity.ERROR)
    assert "training-side replay alone" in f.message and "sglang/x.py:1" in f.message
    assert gate._verdict(run, level="outcome", timings={}).status != "pass"
