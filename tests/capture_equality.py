"""One comparison for the warm-start tests of both engines (tests/serving/test_warm_start_sglang.py,
tests/vllm_engine/test_vllm_warm_start.py): a capture forked from a zygote gives a cold capture's evidence."""

from __future__ import annotations

import torch

from specparity.serving.results import CaptureResult


def assert_same_evidence(cold: CaptureResult, got: CaptureResult, *, samples: int) -> None:
    """Both captures ran clean, with the same fc input and atlas per probe: same code on the same machine, so equal
    up to 1e-6 (no tolerance for another CPU or thread count is needed: both ran here, one after the other)."""
    assert not cold.failures and not got.failures, (cold.failures, got.failures)
    assert cold.fc is not None and got.fc is not None and cold.atlas is not None and got.atlas is not None
    assert len(got.fc.per_sample) == len(cold.fc.per_sample) == samples
    # equal and empty would pass the comparisons below: every probe's fc rows and boundaries were really captured
    assert all(t.numel() > 0 for t in cold.fc.per_sample), [tuple(t.shape) for t in cold.fc.per_sample]
    assert len(cold.atlas.per_sample) == samples and all(cold.atlas.per_sample), "an empty atlas"
    for a, b in zip(cold.fc.per_sample, got.fc.per_sample, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)
    for a_map, b_map in zip(cold.atlas.per_sample, got.atlas.per_sample, strict=True):
        assert a_map.keys() == b_map.keys()
        for k in a_map:
            torch.testing.assert_close(b_map[k], a_map[k], rtol=0, atol=1e-6)
    assert cold.deployment is not None and got.deployment is not None
