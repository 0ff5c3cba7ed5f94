"""Every finding kind, each from a realistic synthetic scenario; all findings come at once."""

from __future__ import annotations

import json
from random import Random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specparity.compare.attribution import AttributionTable, attribute
from specparity.compare.diagnosis import DeploymentFacts, ExpectedFacts, diagnose
from specparity.compare.findings import Finding, FindingKind, Severity, worst_severity
from specparity.compare.synthetic import bf16_noise, concat_sources, residual_stream, rms_norm
from specparity.compare.tolerances import default_tolerance
from specparity.sources import all_sources

H = 48
L = 8
FP32 = default_tolerance("float32")
BF16 = default_tolerance("bfloat16")
CONTRACT = ("layer:1", "layer:3", "layer:5")  # what training recorded (domain.md §3.4, 8-layer target)


def _states(seed: int = 0, tokens: int = 16) -> dict[str, torch.Tensor]:
    return residual_stream(L, H, tokens=tokens, seed=seed)


def _table(served_sources: list[str] | torch.Tensor, *, expected: tuple[str, ...] = CONTRACT,
           recorded_sources: tuple[str, ...] | None = None, seed: int = 0) -> AttributionTable:
    states = _states(seed)
    served = served_sources if isinstance(served_sources, torch.Tensor) else concat_sources(states, served_sources)
    recorded = concat_sources(states, list(recorded_sources or expected))
    return attribute([served], [recorded], [states], expected=list(expected), tolerance=FP32)


def _diagnose(table: AttributionTable | None, deployment: DeploymentFacts | None = None, *,
              expected: tuple[str, ...] = CONTRACT, layout_fix: str | None = None,
              **facts: object) -> list[Finding]:
    exp = ExpectedFacts(name="tiny-llama-eagle3", sources=expected, hidden_size=H, **facts)  # type: ignore[arg-type]
    return diagnose(exp, deployment or DeploymentFacts(engine_version="0.5.23", architecture="LlamaForCausalLM"),
                    table=table, tolerance=FP32, layout_fix=layout_fix)


def _kinds(findings: list[Finding]) -> list[FindingKind]:
    return [f.kind for f in findings]


def test_correct_layout_has_no_finding() -> None:
    assert _diagnose(_table(list(CONTRACT))) == []


def test_extra_embedding_from_minus_one_id() -> None:
    # draft config [-1, 1, 3] -> layers_to_capture [0, 2, 4] (domain.md §3.4)
    fix = "set eagle_config.eagle_aux_hidden_state_layer_ids = [1, 3, 5] in <draft>/config.json"
    findings = _diagnose(_table(["embedding", "layer:1", "layer:3"]), layout_fix=fix)
    assert _kinds(findings) == [FindingKind.EXTRA_EMBEDDING, FindingKind.MISSING_SOURCE]
    extra, missing = findings
    assert extra.chunk == 0 and extra.message.startswith("chunk 0: served embedding, expected layer:1")
    assert missing.details["source"] == "layer:5"
    assert "layer:5 is in the contract but in no served chunk" in missing.message
    assert extra.fix == missing.fix == fix


def test_default_ids_give_off_by_one_and_the_fallback_is_named() -> None:
    # no eagle_config -> SGLang default [2, 4, 5] = layer:{1, 3, 4}
    dep = DeploymentFacts(engine_version="0.5.23", architecture="LlamaForCausalLM",
                          ids_fallback_reason="draft config has no eagle_config")
    findings = _diagnose(_table(["layer:1", "layer:3", "layer:4"]), dep)
    assert _kinds(findings) == [FindingKind.DEFAULT_IDS_FALLBACK, FindingKind.OFF_BY_ONE]
    assert findings[0].severity is Severity.ERROR and "no eagle_config" in findings[0].message
    assert findings[1].chunk == 2 and "served layer:4, expected layer:5: one layer early" in findings[1].message


def test_deepseek_raw_ids_shift_every_chunk_by_one() -> None:
    # DeepSeek >= 0.5.13, ids not starting at 1 are taken raw: [2,4,6] serves layer:{1,3,5} (domain.md §3.2)
    expected = ("layer:2", "layer:4", "layer:6")
    findings = _diagnose(_table(["layer:1", "layer:3", "layer:5"], expected=expected), expected=expected)
    assert _kinds(findings) == [FindingKind.OFF_BY_ONE] * 3  # and no redundant missing_source
    assert [f.chunk for f in findings] == [0, 1, 2]


def test_default_that_matches_by_luck_is_still_an_error() -> None:
    dep = DeploymentFacts(ids_fallback_reason="eagle_config is null (bare except, I32)")
    findings = _diagnose(_table(list(CONTRACT)), dep)
    assert _kinds(findings) == [FindingKind.DEFAULT_IDS_FALLBACK]
    assert worst_severity(findings) is Severity.ERROR


def test_order_mismatch_when_training_list_is_not_ascending() -> None:
    expected = ("layer:5", "layer:1", "layer:3")
    findings = _diagnose(_table(["layer:1", "layer:3", "layer:5"], expected=expected), expected=expected)
    assert _kinds(findings) == [FindingKind.ORDER_MISMATCH]
    assert "ascending" in findings[0].message and findings[0].fix is not None


def test_missing_source_and_capture_count_short_for_an_unreachable_last_layer() -> None:
    # id L-1 = 7 -> boundary 8 is never reached: only 2 states captured (domain.md §3.2 "Last layer")
    expected = ("layer:1", "layer:3", "layer:7")
    states = _states()
    served = concat_sources(states, ["layer:1", "layer:3"])
    recorded = concat_sources(states, list(expected))
    table = attribute([served], [recorded], [states], expected=list(expected), tolerance=FP32)
    dep = DeploymentFacts(captured_states=2, served_width=2 * H)
    findings = _diagnose(table, dep, expected=expected)
    assert _kinds(findings) == [FindingKind.CAPTURE_COUNT_SHORT, FindingKind.WIDTH_MISMATCH,
                                FindingKind.MISSING_SOURCE]
    assert "captured 2 of 3" in findings[0].message
    assert f"fc input is {2 * H} wide, the contract's is 3 x {H} = {3 * H}" in findings[1].message
    assert findings[2].details["source"] == "layer:7"


def test_width_mismatch_from_the_table_alone() -> None:
    states = _states()
    served = concat_sources(states, ["layer:1", "layer:3", "layer:5", "layer:6"])
    table = attribute([served], [concat_sources(states, list(CONTRACT))], [states], expected=list(CONTRACT),
                      tolerance=FP32)
    findings = _diagnose(table)
    assert _kinds(findings) == [FindingKind.WIDTH_MISMATCH, FindingKind.LAYOUT_MISMATCH]
    assert findings[1].chunk == 3 and "beyond the contract's 3 chunks" in findings[1].message


def test_layout_mismatch_for_a_chunk_that_matches_nothing() -> None:
    states = _states()
    served = concat_sources(states, list(CONTRACT)).clone()
    served[:, H:2 * H] = torch.randn(16, H, generator=torch.Generator().manual_seed(1))  # a foreign tensor
    findings = _diagnose(_table(served))
    assert _kinds(findings) == [FindingKind.LAYOUT_MISMATCH]
    assert findings[0].chunk == 1 and "matches no boundary" in findings[0].message
    assert findings[0].message.startswith("chunk 1: served unknown (best ")


def test_layout_mismatch_two_layers_away() -> None:
    # the chunk finding names the expected source, so layer:5 is not reported again as missing
    findings = _diagnose(_table(["layer:1", "layer:3", "layer:7"]))
    assert _kinds(findings) == [FindingKind.LAYOUT_MISMATCH]
    assert findings[0].message.startswith("chunk 2: served layer:7, expected layer:5")


def test_fc_not_called() -> None:
    findings = _diagnose(None, DeploymentFacts(fc_calls=0))
    assert _kinds(findings) == [FindingKind.FC_NOT_CALLED]
    assert "models/llama_eagle3.py:238" in findings[0].message


def test_spec_config_rewritten_with_fix() -> None:
    # topk 1 and num_draft_tokens != steps+1 -> rewritten to steps+1 (I33, our motivating 16 -> 2)
    dep = DeploymentFacts(
        requested_spec={"num_steps": 1, "eagle_topk": 1, "num_draft_tokens": 16},
        resolved_spec={"num_steps": 1, "eagle_topk": 1, "num_draft_tokens": 2},
    )
    findings = _diagnose(None, dep)
    assert _kinds(findings) == [FindingKind.SPEC_CONFIG_REWRITTEN]
    assert findings[0].message == "SGLang rewrote speculative num_draft_tokens from 16 to 2"
    assert findings[0].fix == ("pass --speculative-num-steps 15 to get 16 draft tokens with topk 1, "
                               "or raise --speculative-eagle-topk above 1")


def test_norm_mismatch_from_tensors() -> None:
    # the served chunk is RMSNorm(layer:5): same direction per token, different scale
    states = _states()
    served = concat_sources(states, list(CONTRACT)).clone()
    weight = 1.0 + 0.05 * torch.randn(H, generator=torch.Generator().manual_seed(2))
    served[:, 2 * H:] = rms_norm(states["layer:5"], weight)
    findings = _diagnose(_table(served))
    assert _kinds(findings) == [FindingKind.NORM_MISMATCH]
    f = findings[0]
    assert f.chunk == 2 and "served layer:5 after a norm" in f.message
    # an RMSNorm output has a nearly constant per-token norm, the residual stream does not
    assert float(f.details["served_norm_cv"]) < 0.05 < float(f.details["recorded_norm_cv"])  # type: ignore[arg-type]


def test_norm_mismatch_from_flags() -> None:
    dep = DeploymentFacts(norm_flags={"norm_before_fc": False, "fc_norm": False, "norm_output": False})
    findings = _diagnose(_table(list(CONTRACT)), dep, norm_flags={"norm_before_fc": True})
    assert _kinds(findings) == [FindingKind.NORM_MISMATCH]
    assert "norm_before_fc=False, training used norm_before_fc=True" in findings[0].message


@pytest.mark.parametrize("shift", [1, -1])
def test_position_shift(shift: int) -> None:
    states = _states()
    recorded = concat_sources(states, list(CONTRACT))
    served = recorded.clone()
    served[:, :H] = torch.roll(recorded[:, :H], shifts=-shift, dims=0)  # served row t = recorded row t+shift
    findings = _diagnose(_table(served))
    assert _kinds(findings) == [FindingKind.POSITION_SHIFT]
    assert findings[0].chunk == 0 and findings[0].details["shift"] == shift


def test_nonfinite() -> None:
    states = _states()
    served = concat_sources(states, list(CONTRACT)).clone()
    served[4:, H:2 * H] = float("nan")  # from token 4 on, chunk 1 is NaN
    findings = _diagnose(_table(served))
    assert FindingKind.NONFINITE in _kinds(findings)
    nf = next(f for f in findings if f.kind is FindingKind.NONFINITE)
    assert nf.chunk == 1 and nf.details["served"] == 12 * H
    assert FindingKind.LAYOUT_MISMATCH not in _kinds(findings)


def test_numeric_drift_is_info_within_and_warning_outside_tolerance() -> None:
    states = {k: v.to(torch.bfloat16) for k, v in _states().items()}
    served = concat_sources(states, list(CONTRACT))
    exp = ExpectedFacts(name="t", sources=CONTRACT, hidden_size=H)
    small = attribute([served], [bf16_noise(served, seed=1)], [states], expected=list(CONTRACT), tolerance=BF16)
    findings = diagnose(exp, DeploymentFacts(), table=small, tolerance=BF16)
    assert _kinds(findings) == [FindingKind.NUMERIC_DRIFT] * 3
    assert {f.severity for f in findings} == {Severity.INFO}
    assert "within drift limits (bfloat16" in findings[0].message and "x inside" in findings[0].message and "infx" not in findings[0].message
    big = attribute([served], [bf16_noise(served, seed=1, rel=0.1)], [states], expected=list(CONTRACT),
                    tolerance=BF16)
    findings = diagnose(exp, DeploymentFacts(), table=big, tolerance=BF16)
    assert FindingKind.NUMERIC_DRIFT in _kinds(findings)
    assert Severity.WARNING in {f.severity for f in findings if f.kind is FindingKind.NUMERIC_DRIFT}


def test_vocab_map_mismatch_and_missing_map() -> None:
    dep = DeploymentFacts(vocab_map_observed=True, vocab_map_hash="sha256:bbbb")
    findings = _diagnose(None, dep, vocab_map_hash="sha256:aaaa")
    assert _kinds(findings) == [FindingKind.VOCAB_MAP_MISMATCH]
    missing = _diagnose(None, DeploymentFacts(vocab_map_observed=True), vocab_map_hash="sha256:aaaa")
    assert "none (draft ids taken as target ids)" in missing[0].message  # I13
    assert _diagnose(None, DeploymentFacts(), vocab_map_hash="sha256:aaaa") == []  # not observed: no claim


def test_contract_self_inconsistent_when_recording_is_not_what_contract_says() -> None:
    # the contract claims layer:2 first, but the recording holds layer:1 (ids misread at training time)
    expected = ("layer:2", "layer:3", "layer:5")
    table = _table(list(expected), expected=expected, recorded_sources=("layer:1", "layer:3", "layer:5"))
    findings = _diagnose(table, expected=expected)
    kinds = _kinds(findings)
    assert FindingKind.CONTRACT_SELF_INCONSISTENT in kinds
    f = next(f for f in findings if f.kind is FindingKind.CONTRACT_SELF_INCONSISTENT)
    assert f.chunk == 0 and f.message.startswith("recorded chunk 0 is layer:1, the contract says layer:2")


def test_environment_failures() -> None:
    dep = DeploymentFacts(engine_version="0.5.23", engine_error="TypeError: unsupported operand (hs + None)",
                          timeout_s=600.0)
    findings = _diagnose(None, dep)
    assert _kinds(findings) == [FindingKind.ENGINE_ERROR, FindingKind.TIMEOUT]
    assert "hs + None" in findings[0].message and "600 s" in findings[1].message


def test_all_findings_at_once() -> None:
    dep = DeploymentFacts(
        engine_version="0.5.23", architecture="LlamaForCausalLM",
        ids_fallback_reason="eagle_config malformed",
        requested_spec={"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 8},
        resolved_spec={"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4},
        vocab_map_observed=True, vocab_map_hash="sha256:bbbb",
    )
    findings = _diagnose(_table(["embedding", "layer:1", "layer:3"]), dep, vocab_map_hash="sha256:aaaa")
    assert set(_kinds(findings)) == {
        FindingKind.DEFAULT_IDS_FALLBACK, FindingKind.SPEC_CONFIG_REWRITTEN, FindingKind.VOCAB_MAP_MISMATCH,
        FindingKind.EXTRA_EMBEDDING, FindingKind.MISSING_SOURCE,
    }
    payload = json.loads(json.dumps([f.to_dict() for f in findings]))
    assert payload[0]["kind"] == "default_ids_fallback" and payload[0]["severity"] == "error"


def test_every_kind_diagnose_can_produce_is_produced_in_this_file() -> None:
    import pathlib
    import re

    from specparity.compare import diagnosis, recorded

    text = pathlib.Path(__file__).read_text()
    source = pathlib.Path(diagnosis.__file__).read_text() + pathlib.Path(recorded.__file__).read_text()
    produced_here = set(re.findall(r"FindingKind\.([A-Z_]+)", text))
    rules = set(re.findall(r"FindingKind\.([A-Z_]+)", source))
    assert rules <= produced_here
    brief = {"extra_embedding", "missing_source", "off_by_one", "order_mismatch", "layout_mismatch",
             "default_ids_fallback", "width_mismatch", "capture_count_short", "fc_not_called",
             "spec_config_rewritten", "norm_mismatch", "position_shift", "nonfinite", "numeric_drift",
             "vocab_map_mismatch", "contract_self_inconsistent", "engine_error", "timeout"}
    assert brief <= {FindingKind[name].value for name in rules}


def test_finding_to_dict_is_plain_json() -> None:
    f = Finding(FindingKind.NUMERIC_DRIFT, Severity.INFO, "m", chunk=1,
                details={"x": float("inf"), "t": (1, 2), "k": FindingKind.OFF_BY_ONE})
    assert f.to_dict() == {"kind": "numeric_drift", "severity": "info", "message": "m", "chunk": 1,
                           "details": {"x": "inf", "t": [1, 2], "k": "off_by_one"}, "fix": None}
    hash(f)  # findings are hashable despite the details mapping
    assert not f.is_failure
    import pickle

    assert pickle.loads(pickle.dumps(f)) == f  # findings cross process boundaries (xdist, workers)


def test_static_layout_rules_on_source_lists() -> None:
    from specparity.compare.diagnosis import layout_findings

    assert layout_findings(CONTRACT, CONTRACT) == []
    kinds = _kinds(layout_findings(CONTRACT, ["embedding", "layer:1", "layer:3"]))
    assert kinds == [FindingKind.EXTRA_EMBEDDING, FindingKind.MISSING_SOURCE]
    off = layout_findings(["layer:2", "layer:30", "layer:58"], ["layer:1", "layer:29", "layer:57"], layout_fix="f")
    assert _kinds(off) == [FindingKind.OFF_BY_ONE] * 3 and all(f.fix == "f" for f in off)
    assert off[0].message == "chunk 0: served layer:1, expected layer:2: one layer early"
    short = layout_findings(CONTRACT, ["layer:1", "layer:3"])
    assert _kinds(short) == [FindingKind.MISSING_SOURCE]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(all_sources(12)), min_size=1, max_size=4, unique=True), st.randoms())
def test_static_permutation_is_order_mismatch_only(expected: list[str], rnd: Random) -> None:
    from specparity.compare.diagnosis import layout_findings

    served = list(expected)
    rnd.shuffle(served)
    kinds = _kinds(layout_findings(expected, served))
    assert kinds == ([] if served == expected else [FindingKind.ORDER_MISMATCH])


def test_a_recording_of_other_weights_is_a_target_mismatch_not_a_contract_fault() -> None:
    deployed = _states()
    trained = residual_stream(L, H, tokens=16, seed=99)  # another target's weights, same config
    served = concat_sources(deployed, list(CONTRACT))
    table = attribute([served], [concat_sources(trained, list(CONTRACT))], [deployed], expected=list(CONTRACT),
                      tolerance=FP32)
    findings = diagnose(ExpectedFacts(name="t", sources=CONTRACT, hidden_size=H), DeploymentFacts(), table=table,
                        tolerance=FP32)
    errors = [f for f in findings if f.severity is Severity.ERROR]
    assert [f.kind for f in errors] == [FindingKind.TARGET_MISMATCH]
    assert "other weights" in errors[0].message and errors[0].fix


def test_a_target_that_computes_nan_is_nonfinite_not_other_weights() -> None:
    states = _states()
    served = concat_sources(states, list(CONTRACT))
    broken = {k: (v.clone().fill_(float("nan")) if k != "embedding" else v) for k, v in states.items()}
    table = attribute([served], [served.clone()], [broken], expected=list(CONTRACT), tolerance=FP32)
    findings = diagnose(ExpectedFacts(name="t", sources=CONTRACT, hidden_size=H), DeploymentFacts(), table=table,
                        tolerance=FP32)
    kinds = {f.kind for f in findings if f.severity is Severity.ERROR}
    assert FindingKind.NONFINITE in kinds and FindingKind.TARGET_MISMATCH not in kinds


def test_extra_embedding_quotes_the_serving_engines_own_rule() -> None:
    # seen in make demo-real: vLLM serving the embedding (id 0) was explained by SGLang's -1 / +1 rule
    from specparity.compare.diagnosis import layout_findings

    expected, served = ["layer:1", "layer:14", "layer:26"], ["embedding", "layer:1", "layer:14"]
    for engine, says, never in (("sglang", "SGLang's +1 rule", "vLLM"), ("vllm", "vLLM reads id k", "SGLang")):
        f = next(x for x in layout_findings(expected, served, engine=engine) if x.kind.value == "extra_embedding")
        assert says in f.message and never not in f.message, f.message
    default = next(x for x in layout_findings(expected, served) if x.kind.value == "extra_embedding")
    assert "SGLang's +1 rule" in default.message
