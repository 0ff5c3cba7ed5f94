"""vLLM's real engine on CPU: the tap's fc input and atlas at TP=1 and TP=2, against the recordings."""

from __future__ import annotations

import pytest
import torch
from vllm_helpers import BUNDLE, CONTRACT

from specparity.contract import load_contract, probe_pack_path, read_probe_pack
from specparity.serving.results import CaptureResult
from specparity.serving.vllm.client import capture_deployment

pytestmark = pytest.mark.vllm


def _refused() -> str | None:
    import vllm

    from specparity.serving.vllm.versions import capture_refusal

    return capture_refusal(str(vllm.__version__), "cpu", "capture")


# vLLM's CPU model runner refuses speculative decoding before 0.20 (serving/vllm/versions.py): there the capture is
# refused by name, never attempted
needs_cpu_capture = pytest.mark.skipif(_refused() is not None, reason="this release cannot capture on CPU")


@pytest.mark.skipif(_refused() is None, reason="this release captures on CPU")
def test_a_release_whose_cpu_runner_refuses_spec_decode_is_exit_3_by_name(pack, vllm_python) -> None:  # type: ignore[no-untyped-def]
    from specparity.verdict.rules import failure_cause

    result = _capture(pack, vllm_python)
    assert not result.ok and result.failures[0].kind == "unsupported_version", result.failures
    assert "refuses speculative decoding" in result.failures[0].message
    assert failure_cause(result.failures[0].kind, result.failures[0].message) == "environment"  # exit 3


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


@needs_cpu_capture
def test_tp1_prefill_fc_is_what_the_releases_id_rules_say(tp1, pack) -> None:  # type: ignore[no-untyped-def]
    """The SpecForge-style nested ids [1, 3, 5] as the installed release reads them (idrules/vllm_releases.py): on
    0.22-0.33 boundaries 1, 3, 5 (embedding-side by one layer); on 0.11.1-0.21 the nested key is not read, so the
    default (2, L//2, L-3) = boundaries 2, 4, 5 serves."""
    import json

    import vllm

    from specparity.idrules.vllm import read_ids

    assert tp1.ok, tp1.failures
    dep = tp1.deployment
    assert dep is not None and dep.engine == "vllm" and dep.engine_version == vllm.__version__
    rules = read_ids(json.loads((BUNDLE / "draft" / "config.json").read_text()), num_layers=8,
                     version=vllm.__version__)
    assert dep.draft_config_ids == rules.ids
    assert dep.served_sources == rules.sources
    if vllm.__version__.startswith("0.32"):
        assert rules.sources == ("layer:0", "layer:2", "layer:4")
    assert tp1.fc is not None and tp1.atlas is not None
    for fc, atlas, rec in zip(tp1.fc.per_sample, tp1.atlas.per_sample, pack.samples, strict=True):
        assert fc.shape == rec.fc_input.shape
        served = torch.cat([atlas[s] for s in rules.sources], dim=-1)
        assert torch.equal(fc, served)  # the tap's atlas is the very tensors vLLM packed
        # and the recording's layer:1 chunk is the atlas's layer:1 (fp32, CPU: stated tolerance 1e-4)
        assert float((atlas["layer:1"] - rec.fc_input[:, :64]).abs().max()) < 1e-4


@needs_cpu_capture
def test_tp1_every_verify_step_reaches_fc(tp1) -> None:  # type: ignore[no-untyped-def]
    loop = tp1.loop
    assert loop is not None
    assert all(n >= 1 for n in loop["verify_calls"])
    counters = loop["counters"]
    assert counters["spec_decode_num_drafts"] >= sum(loop["verify_calls"]) - len(loop["verify_calls"])
    assert len(counters["spec_decode_num_accepted_tokens_per_pos"]) == loop["num_speculative_tokens"]


# the topology tier (make test-topology): in the default CI, TP=2 runs through the gate (test_vllm_gate.py
# test_tp2_gives_the_tp1_verdict, in-process), the live server (the seed's wiring at TP=2) and the MoE class at TP=2;
# this direct rank-by-rank comparison adds ~104 s of a second in-process TP=2 start on the CI's longest lane
@needs_cpu_capture
@pytest.mark.topology
def test_tp2_ranks_agree_with_each_other_and_with_tp1(tp1, pack, vllm_python) -> None:  # type: ignore[no-untyped-def]
    tp2 = _capture(pack, vllm_python, tensor_parallel_size=2)
    assert tp2.ok, tp2.failures
    assert tp2.loop is not None and set(tp2.loop["ranks"]) == {"0", "1"}
    assert all(r["fc_calls"] > 0 for r in tp2.loop["ranks"].values())
    assert tp2.loop["rank_max_abs_diff"] < 1e-4
    assert tp2.fc is not None and tp1.fc is not None
    for a, b in zip(tp1.fc.per_sample, tp2.fc.per_sample, strict=True):
        assert a.shape == b.shape and float((a - b).abs().max()) < 1e-4
