"""The pytest plugin with ``--parity-engine vllm`` on vLLM's real engine (static level: no weights loaded)."""

from __future__ import annotations

import pytest
from vllm_helpers import BUNDLE, CONTRACT

pytestmark = pytest.mark.vllm


def test_parity_engine_vllm_runs_the_gate_on_vllm(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess(
        "-m", "parity", "-p", "no:cacheprovider", "--parity-engine", "vllm", "--parity-level", "static",
        "--parity-contract", str(CONTRACT), "--parity-target", str(BUNDLE / "target"),
        "--parity-draft", str(BUNDLE / "draft"), "--parity-engine-arg", "num_speculative_tokens=3",
        "--parity-report", str(pytester.path / "reports"))
    result.assert_outcomes(failed=1, deselected=1)
    text = result.stdout.str()
    assert "engine_convention_mismatch" in text and "(vllm 0.32" in text
    assert "[2, 4, 6]" in text
