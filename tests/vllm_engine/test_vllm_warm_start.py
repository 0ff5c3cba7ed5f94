"""Warm start on real vLLM: a capture or resolve forked from a zygote equals a cold one.

The suites run with ``SPECPARITY_WARM_START=1`` (root conftest.py), so vLLM's worker children are forked from a
zygote that has imported vLLM (``serving/vllm/worker.py`` ``warm``) instead of paying vLLM's imports (~16 CPU-s)
in every child. This test is what makes that safe: the same deployment, captured cold (a new interpreter) and
warm (two jobs of one zygote), gives the same fc input, atlas, resolution and environment, and the warm jobs
really ran in a zygote (one that cannot serve falls back cold, which the equality alone could not tell).
"""

from __future__ import annotations

import pytest
from tests.capture_equality import assert_same_evidence
from vllm_helpers import BUNDLE, CONTRACT

from specparity.contract import load_contract, probe_pack_path, read_probe_pack
from specparity.serving.child import warm
from specparity.serving.results import CaptureResult, ResolvedDeployment
from specparity.serving.vllm.client import WORKER_MODULE, capture_deployment, resolve_deployment

pytestmark = pytest.mark.vllm


def _captures_on_cpu() -> bool:
    import vllm

    from specparity.serving.vllm.versions import capture_refusal

    return capture_refusal(str(vllm.__version__), "cpu", "capture") is None


def _ran_in_a_zygote() -> bool:
    return any(z.ready and WORKER_MODULE in z.proc.args for z in warm._ZYGOTES.values())


@pytest.mark.skipif(not _captures_on_cpu(), reason="this release cannot capture on CPU")
def test_a_warm_capture_equals_a_cold_one(vllm_python: str, monkeypatch: pytest.MonkeyPatch) -> None:
    c = load_contract(CONTRACT)
    probes = [s.input_ids.tolist() for s in read_probe_pack(probe_pack_path(c, CONTRACT)).samples[:2]]
    runs: list[CaptureResult] = []
    for flag in ("0", "1", "1"):  # cold, then two jobs of the same zygote
        monkeypatch.setenv(warm.WARM_START_ENV, flag)
        runs.append(capture_deployment(BUNDLE / "target", BUNDLE / "draft", probes=probes, engine_args={},
                                       python=vllm_python, timeout_s=600))
    assert _ran_in_a_zygote()
    cold = runs[0]
    for got in runs[1:]:
        assert cold.ok and got.ok, (cold.failures, got.failures)
        assert_same_evidence(cold, got, samples=2)
        assert cold.deployment is not None and got.deployment is not None
        assert got.deployment.served_sources == cold.deployment.served_sources
        assert got.deployment.environment == cold.deployment.environment
        assert got.deployment.stand_ins == cold.deployment.stand_ins


def test_a_warm_resolve_equals_a_cold_one(vllm_python: str, monkeypatch: pytest.MonkeyPatch) -> None:
    results = []
    for flag in ("0", "1"):
        monkeypatch.setenv(warm.WARM_START_ENV, flag)
        r = resolve_deployment(BUNDLE / "target", BUNDLE / "draft", python=vllm_python, timeout_s=600)
        assert isinstance(r, ResolvedDeployment), r
        d = r.to_dict()
        d.pop("timings")  # the warm one skips vLLM's import: that is the point
        results.append(d)
    assert _ran_in_a_zygote()
    assert results[0] == results[1]
