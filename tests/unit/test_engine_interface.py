"""The gate's engine-interface steps on hand-built results (vLLM itself runs in tests/vllm_engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.resolved_deployments import tiny_deployment

from specparity import gate, gate_verdict
from specparity.compare.findings import FindingKind
from specparity.contract import load_contract
from specparity.errors import InputError
from specparity.replay.outcome import loop_summary
from specparity.serving import LoopAcceptance, ResolvedDeployment
from specparity.serving.engine import convention_findings, engine_args_for, get_engine, outcome_request
from specparity.serving.vllm.client import loop_acceptance

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "fixtures" / "vllm"
CONTRACT = BUNDLE / "contract" / "tiny-llama-eagle3-hd32.json"


def _vllm_deployment(served: tuple[str, ...] = ("layer:0", "layer:2", "layer:4")) -> ResolvedDeployment:
    return tiny_deployment(BUNDLE, engine_version="0.32.0", adapter="vllm_0_32", layers_to_capture=(1, 3, 5),
                           served_sources=served, engine="vllm")


def test_unknown_engine_is_bad_input() -> None:
    with pytest.raises(InputError) as e:
        gate.run_gate(CONTRACT, BUNDLE / "target", BUNDLE / "draft", engine="trt")
    assert e.value.field == "--engine"


def test_contract_steps_become_num_speculative_tokens_for_vllm() -> None:
    c = load_contract(CONTRACT)
    assert engine_args_for(get_engine("vllm"), c, {}) == {"num_speculative_tokens": 3}
    assert engine_args_for(get_engine("vllm"), c, {"num_speculative_tokens": 5, "tensor_parallel_size": 2}) == {
        "num_speculative_tokens": 5, "tensor_parallel_size": 2}


def test_vllm_counters_become_loop_acceptance_and_a_per_position_summary_with_wilson_intervals() -> None:
    loop = {"engine": "vllm", "tensor_parallel_size": 2, "loop_prompts": "assistant_start",
            "counters": {"spec_decode_num_drafts": 50, "spec_decode_num_accepted_tokens": 30,
                         "spec_decode_num_draft_tokens": 150, "spec_decode_num_accepted_tokens_per_pos": [20, 8, 2]}}
    acc = loop_acceptance(loop)
    assert acc == LoopAcceptance(engine="vllm", drafts=50, accepted_per_position=(20, 8, 2), accepted=30,
                                 draft_tokens=150, tensor_parallel_size=2, prompts="assistant_start")
    s = loop_summary(acc)
    assert s is not None
    assert s["per_position"] == [0.4, 0.16, 0.04] and s["acceptance_length"] == pytest.approx(1.6)
    assert s["prompts"] == "assistant_start" and s["tensor_parallel_size"] == 2 and s["drafts"] == 50
    for p, (lo, hi) in zip(s["per_position"], s["intervals"], strict=True):
        assert lo < p < hi
    # no drafts, or no loop at all: no figures (and so no pass on them)
    assert loop_acceptance({"counters": {"spec_decode_num_drafts": 0}}) is None
    assert loop_acceptance(None) is None and loop_summary(None) is None


def test_outcome_request_carries_the_recorded_rows_and_each_probes_prompt() -> None:
    import torch

    from specparity.contract.probes import ProbePack, ProbeSample

    def sample(mask: list[int] | None) -> ProbeSample:
        n = 6
        return ProbeSample(input_ids=torch.arange(n), fc_input=torch.zeros(n, 3),
                           loss_mask=None if mask is None else torch.tensor(mask))

    pack = ProbePack(samples=[sample([0, 0, 1, 1, 1, 0]), sample(None), sample([1] * 6), sample([0] * 6)],
                     sources=["layer:1"], hidden_size=3)
    req = outcome_request(pack)
    # the assistant's first token; the whole probe where the mask starts at 0 or is all 0; unknown without a mask
    assert req.prompt_lengths == (2, None, 6, 6)
    assert all(r is s.fc_input for r, s in zip(req.recorded_fc, pack.samples, strict=True))


def test_specforge_ids_on_vllm_are_an_engine_convention_mismatch() -> None:
    c = load_contract(CONTRACT)
    cfg = json.loads((BUNDLE / "draft" / "config.json").read_text())
    [f] = convention_findings(get_engine("vllm"), c, _vllm_deployment(), cfg, fix_summary="set ... [2, 4, 6]")
    assert f.kind is FindingKind.ENGINE_CONVENTION_MISMATCH and f.details["served"] == ["layer:0", "layer:2", "layer:4"]
    assert f.details["expected"] == ["layer:1", "layer:3", "layer:5"]
    patched = {**cfg, "eagle_config": {**cfg["eagle_config"], "eagle_aux_hidden_state_layer_ids": [2, 4, 6]}}
    assert convention_findings(get_engine("vllm"), c, _vllm_deployment(), patched, fix_summary=None) == []


def test_static_vllm_verdict_names_the_mismatch_and_gives_the_vllm_patch() -> None:
    run = gate_verdict.GateRun(contract=load_contract(CONTRACT), draft=BUNDLE / "draft", deployment=_vllm_deployment(),
                    engine="vllm")
    v = gate_verdict.verdict_of(run, level="static", timings={})
    assert v.status == "fail" and v.engine == "vllm"
    assert FindingKind.ENGINE_CONVENTION_MISMATCH in {f.kind for f in v.errors}
    assert v.fix is not None and list(v.fix.json_patch) == [
        {"op": "replace", "path": "/eagle_config/eagle_aux_hidden_state_layer_ids", "value": [2, 4, 6]}]
    assert v.to_dict()["engine"] == "vllm" and v.to_dict()["engine_version"] == "0.32.0"
