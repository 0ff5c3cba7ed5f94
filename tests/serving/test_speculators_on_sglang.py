"""A speculators-format drafter on SGLang. vLLM serves it (capture and outcome levels:
tests/vllm_engine/test_vllm_gate.py); SGLang's transformers config reader cannot (no model_type), so the gate
refuses it on every level with why and what to do, SGLang's own message kept, never a bare start-up traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from version_facts import capture_level_supported

from specparity.cli import main

pytestmark = pytest.mark.sglang
REPO = Path(__file__).resolve().parents[2]
VLLM = REPO / "fixtures" / "vllm"


def test_a_speculators_drafter_on_sglang_is_refused_with_why_on_every_level(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    level = "all" if capture_level_supported() else "static"  # family A (<= 0.4.8) is checked at the static level
    r = CliRunner().invoke(main, [
        "gate", "--contract", str(VLLM / "contract-speculators" / "tiny-llama-eagle3-hd32-speculators.json"),
        "--target", str(VLLM / "target"), "--draft", str(VLLM / "speculators" / "draft"), "--level", level,
        "--json", str(report)])
    assert r.exit_code == 1, r.output  # SGLang cannot serve this draft as deployed: the deployment's problem
    data = json.loads(report.read_text())
    errors = [f for f in data["findings"] if f["severity"] == "error"]
    first = errors[0]
    assert first["details"]["serving_failure"] == "draft_unreadable", errors
    assert "speculators-format config" in first["message"] and "--engine vllm" in first["message"]
    assert "SGLang" in first["message"] and "raised" in first["message"]  # SGLang's own words kept
    assert first["fix"] and "--engine vllm" in first["fix"]
    # the outcome item fails with the same reason, never silently absent
    outcome = [f for f in errors if f["details"].get("check") == "outcome"]
    assert level == "static" or (outcome and "draft_unreadable" not in outcome[0]["message"] and "could not run" in outcome[0]["message"])
    # nothing was captured: no chunk is diagnosed
    assert "residual-stream boundary" not in r.output and "served not captured" in r.output
