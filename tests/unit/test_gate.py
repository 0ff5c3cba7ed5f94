"""The gate's own rules, on hand-built serving results (SGLang itself is exercised in tests/catalog)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.resolved_deployments import tiny_deployment

from specparity import engine_args, gate, gate_verdict
from specparity.contract import load_contract, read_contract_probes
from specparity.errors import InputError
from specparity.serving import ResolvedDeployment
from specparity.serving.engine import engine_args_for, get_engine

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "contracts" / "tiny-llama-eagle3.json"
BUNDLE = ROOT / "fixtures" / "default"


def test_parse_engine_args_types_values_and_normalises_keys() -> None:
    assert engine_args.parse_engine_args(["--speculative-num-steps=3", "dtype=bfloat16", "disable_cuda_graph=true",
                                   "mem_fraction_static=0.5", "x=none"]) == {
        "speculative_num_steps": 3, "dtype": "bfloat16", "disable_cuda_graph": True, "mem_fraction_static": 0.5,
        "x": None}
    with pytest.raises(InputError) as e:
        engine_args.parse_engine_args(["speculative_num_steps"])
    assert e.value.field == "--sglang-arg"


def test_contract_serving_settings_are_defaults_the_user_overrides() -> None:
    c = load_contract(CONTRACT)
    sglang = get_engine("sglang")
    assert engine_args_for(sglang, c, {}) == {"speculative_num_steps": 3, "speculative_eagle_topk": 1,
                                              "speculative_num_draft_tokens": 4}
    assert engine_args_for(sglang, c, {"speculative_num_draft_tokens": 16})["speculative_num_draft_tokens"] == 16


def test_unknown_level_is_bad_input() -> None:
    with pytest.raises(InputError) as e:
        gate.run_gate(CONTRACT, BUNDLE / "target", BUNDLE / "draft", level="everything")
    assert e.value.field == "--level"


def _deployment() -> ResolvedDeployment:
    return tiny_deployment(BUNDLE)


def test_a_capture_without_tensors_is_never_a_pass() -> None:
    """Even a serving result that reports no failure but brings no tensors back cannot pass."""
    run = gate_verdict.GateRun(contract=load_contract(CONTRACT), draft=BUNDLE / "draft", deployment=_deployment())
    v = gate_verdict.verdict_of(run, level="capture", timings={})
    assert v.status != "pass" and any("no fc input" in f.message for f in v.errors)
    v = gate_verdict.verdict_of(run, level="static", timings={})
    assert v.status == "pass"  # static level: the resolved layout is the evidence


def test_outcome_level_without_figures_is_never_a_pass() -> None:
    run = gate_verdict.GateRun(contract=load_contract(CONTRACT), draft=BUNDLE / "draft", deployment=_deployment())
    v = gate_verdict.verdict_of(run, level="all", timings={})
    assert v.status != "pass" and any("no acceptance figures" in f.message for f in v.errors)


class _RecordingEngine:
    """An engine adapter whose one run returns canned evidence, recording how the gate called it."""

    name, label = "sglang", "SGLang"

    def __init__(self, make: Any) -> None:
        self.make, self.calls = make, []

    def spec_args(self, *values: int | None) -> dict[str, object]:
        return get_engine("sglang").spec_args(*values)

    def capture(self, target: Any, draft: Any, **kw: Any) -> Any:
        self.calls.append(kw)
        return self.make(kw)

    def layout_fix(self, *a: Any, **kw: Any) -> Any:
        return get_engine("sglang").layout_fix(*a, **kw)

    def reading(self, *a: Any, **kw: Any) -> None:
        return None


def _fed_back(kw: dict[str, Any], *, replay: Any) -> Any:
    """What a healthy engine would serve: the recorded rows themselves (and an atlas holding exactly those
    layers and the recorded final norm), plus the given drafter replay."""
    from specparity.serving.results import CaptureResult, FcCapture, LayerAtlas

    pack = read_contract_probes(load_contract(CONTRACT), CONTRACT)
    rows = [s.fc_input for s in pack.samples]
    atlas = [{**dict(zip(("layer:1", "layer:3", "layer:5"), r.chunk(3, dim=-1), strict=True)),
              "final_norm": s.final_norm} for r, s in zip(rows, pack.samples, strict=True)]
    fc = FcCapture(per_sample=rows, dtype="float32", engine_version="0.5.23", hook_calls=1,
                   aux_states_captured=3, aux_states_expected=3, kernel_stub_calls=())
    return CaptureResult(deployment=_deployment(), fc=fc, atlas=LayerAtlas(atlas, num_layers=8), failures=(),
                         replay=replay)


def test_one_engine_run_serves_capture_and_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine adapter is started once per gate run; only the outcome levels ask it for outcome evidence."""
    eng = _RecordingEngine(lambda kw: _fed_back(kw, replay=None))
    monkeypatch.setattr(gate, "get_engine", lambda name: eng)
    pack = read_contract_probes(load_contract(CONTRACT), CONTRACT)
    for level, asks in (("capture", False), ("outcome", True), ("all", True)):
        eng.calls.clear()
        gate.run_gate(CONTRACT, BUNDLE / "target", BUNDLE / "draft", level=level)
        [kw] = eng.calls
        assert (kw["outcome"] is not None) == asks, level
        if asks:
            assert len(kw["outcome"].recorded_fc) == len(pack.samples)
            assert all(r.shape == s.fc_input.shape for r, s in zip(kw["outcome"].recorded_fc, pack.samples, strict=True))


def test_outcome_cannot_pass_on_the_training_side_replay_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """When SGLang's own drafter replay fails, healthy training-side figures are not a pass."""
    from specparity.compare.findings import FindingKind, Severity
    from specparity.serving.results import ServingFailure

    replay_failed = ServingFailure("sglang_exception", "the drafter replay raised RuntimeError at sglang/x.py:1")
    eng = _RecordingEngine(lambda kw: _fed_back(kw, replay=replay_failed))
    monkeypatch.setattr(gate, "get_engine", lambda name: eng)
    v = gate.run_gate(CONTRACT, BUNDLE / "target", BUNDLE / "draft", level="outcome")
    assert v.outcome is not None and v.outcome.diagnosis == "healthy"  # the training side alone looks fine
    [f] = [f for f in v.findings if f.details.get("check") == "outcome"]
    assert (f.kind, f.severity) == (FindingKind.ENGINE_ERROR, Severity.ERROR)
    assert "training-side replay alone" in f.message and "sglang/x.py:1" in f.message
    assert v.status != "pass" and gate.check_failures(v, "outcome") is not None
    assert gate.check_failures(v, "capture") is None  # the wiring itself is fine: only the outcome fails


def test_healthy_evidence_with_the_engines_own_replay_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The counterpart: the same evidence with the engine's own first drafts passes (so the test above fails
    for the missing replay alone)."""
    from specparity.serving.results import DrafterReplay

    def with_replay(kw: dict[str, Any]) -> Any:
        from specparity.replay.acceptance import draft_next_ids, greedy_from_final_norm
        from specparity.replay.checkpoint import read_target_lm_head
        from specparity.replay.drafter import Eagle3Drafter

        d = Eagle3Drafter.load(BUNDLE / "draft", target_dir=BUNDLE / "target")
        head = read_target_lm_head(BUNDLE / "target")
        pack = read_contract_probes(load_contract(CONTRACT), CONTRACT)
        logits = [d.extend(s.fc_input, draft_next_ids(s.input_ids, greedy_from_final_norm(s.final_norm, head))).logits
                  for s in pack.samples if s.final_norm is not None]
        return _fed_back(kw, replay=DrafterReplay(logits, [x.clone() for x in logits], d.hot_token_id, {}))

    monkeypatch.setattr(gate, "get_engine", lambda name: _RecordingEngine(with_replay))
    v = gate.run_gate(CONTRACT, BUNDLE / "target", BUNDLE / "draft", level="outcome")
    assert v.status == "pass", [str(f) for f in v.errors]
    assert v.outcome is not None and v.outcome.diagnosis == "healthy"


def test_static_and_capture_that_disagree_fail_the_static_item(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine resolved layer:2, 4, 6 but fc really got layer:1, 3, 5 (what the contract wants):
    the capture item passes, and the static answer (what explain and --level static say) fails as its own finding."""
    import dataclasses

    from specparity.compare.findings import FindingKind

    def wrong_static(kw: dict[str, Any]) -> Any:
        r = _fed_back(kw, replay=None)
        dep = dataclasses.replace(r.deployment, layers_to_capture=(3, 5, 7),
                                  served_sources=("layer:2", "layer:4", "layer:6"))
        return dataclasses.replace(r, deployment=dep)

    monkeypatch.setattr(gate, "get_engine", lambda name: _RecordingEngine(wrong_static))
    v = gate.run_gate(CONTRACT, BUNDLE / "target", BUNDLE / "draft", level="capture")
    [f] = [f for f in v.errors if f.kind is FindingKind.STATIC_CAPTURE_DISAGREEMENT]
    assert f.details["static"] == ["layer:2", "layer:4", "layer:6"] and f.details["chunks"] == [0, 1, 2]
    assert f.details["captured"] == ["layer:1", "layer:3", "layer:5"] and "sglang 0.5.23" in f.message.lower()
    assert v.status == "fail" and v.exit_code == 1
    assert gate.check_failures(v, "static") is not None and gate.check_failures(v, "capture") is None
    monkeypatch.setattr(gate, "get_engine", lambda name: _RecordingEngine(lambda kw: _fed_back(kw, replay=None)))
    agreed = gate.run_gate(CONTRACT, BUNDLE / "target", BUNDLE / "draft", level="capture")
    assert agreed.status == "pass" and not [f for f in agreed.findings
                                            if f.kind is FindingKind.STATIC_CAPTURE_DISAGREEMENT]
