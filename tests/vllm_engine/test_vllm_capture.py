"""vLLM's real engine on CPU: the tap's fc input and atlas at TP=1 and TP=2, against the recordings."""

from __future__ import annotations

import pytest
import torch
from vllm_helpers import BUNDLE, CONTRACT

from specparity.contract import load_contract, probe_pack_path, read_probe_pack
from specparity.serving.results import CaptureResult
from specparity.serving.vllm.client import capture_deployment

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def pack():  # type: ignore[no-untyped-def]
    c = load_contract(CONTRACT)
    return read_probe_pack(probe_pack_path(c, CONTRACT))


def _capture(pack, python: str, **args: object) -> CaptureResult:  # type: ignore[no-untyped-def]
    return capture_deployment(BUNDLE / "target", BUNDLE / "draft", probes=[s.input_ids.tolist() for s in pack.samples],
                              engine_args=args, python=python, timeout_s=600)


@pytest.fixture(scope="module")
def tp1(pack, vllm_python):  # type: ignore[no-untyped-def]
    return _capture(pack, vllm_python)


def test_tp1_prefill_fc_is_hidden_states_k_for_id_k(tp1, pack) -> None:  # type: ignore[no-untyped-def]
    """The SpecForge-style ids [1, 3, 5] are served as boundaries 1, 3, 5: embedding-side by one layer."""
    assert tp1.ok, tp1.failures
    dep = tp1.deployment
    assert dep is not None and dep.engine == "vllm" and dep.engine_version.startswith("0.32")
    assert dep.draft_config_ids == (1, 3, 5)
    assert dep.served_sources == ("layer:0", "layer:2", "layer:4")
    assert tp1.fc is not None and tp1.atlas is not None
    for fc, atlas, rec in zip(tp1.fc.per_sample, tp1.atlas.per_sample, pack.samples, strict=True):
        assert fc.shape == rec.fc_input.shape
        served = torch.cat([atlas["layer:0"], atlas["layer:2"], atlas["layer:4"]], dim=-1)
        assert torch.equal(fc, served)  # the tap's atlas is the very tensors vLLM packed
        # and the recording's layer:1 chunk is the atlas's layer:1 (fp32, CPU: stated tolerance 1e-4)
        assert float((atlas["layer:1"] - rec.fc_input[:, :64]).abs().max()) < 1e-4


def test_tp1_every_verify_step_reaches_fc(tp1) -> None:  # type: ignore[no-untyped-def]
    loop = tp1.loop
    assert loop is not None
    assert all(n >= 1 for n in loop["verify_calls"])
    counters = loop["counters"]
    assert counters["spec_decode_num_drafts"] >= sum(loop["verify_calls"]) - len(loop["verify_calls"])
    assert len(counters["spec_decode_num_accepted_tokens_per_pos"]) == loop["num_speculative_tokens"]


def test_tp2_ranks_agree_with_each_other_and_with_tp1(tp1, pack, vllm_python) -> None:  # type: ignore[no-untyped-def]
    tp2 = _capture(pack, vllm_python, tensor_parallel_size=2)
    assert tp2.ok, tp2.failures
    assert tp2.loop is not None and set(tp2.loop["ranks"]) == {"0", "1"}
    assert all(r["fc_calls"] > 0 for r in tp2.loop["ranks"].values())
    assert tp2.loop["rank_max_abs_diff"] < 1e-4
    assert tp2.fc is not None and tp1.fc is not None
    for a, b in zip(tp1.fc.per_sample, tp2.fc.per_sample, strict=True):
        assert a.shape == b.shape and float((a - b).abs().max()) < 1e-4
