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


def test_explain_engine_vllm_names_the_key_and_the_rule(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import subprocess
    import sys

    from vllm_helpers import REPO

    out = tmp_path / "e.json"
    proc = subprocess.run([sys.executable, "-m", "specparity.cli", "explain", "--engine", "vllm", "--target",
                           str(BUNDLE / "target"), "--draft", str(BUNDLE / "draft"), "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "vLLM 0.32" in proc.stdout and "layer:0, layer:2, layer:4" in proc.stdout
    data = json.loads(out.read_text())
    assert data["engine"] == "vllm" and data["draft_ids"] == [1, 3, 5]
    assert data["ids_source"] == "draft config.json: eagle_config.eagle_aux_hidden_state_layer_ids"
