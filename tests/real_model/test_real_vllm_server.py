"""The gate on vLLM's own server, on the real target: SmolLM2-135M-Instruct and its trained drafter.

``make demo-server``'s two launches as tests: each deploy command is parsed by vLLM's own parser, its server started by
the gate with vLLM's hook switches, the probes sent, the fc input read back through ``/collective_rpc`` and the
acceptance from ``/metrics``; then the server is stopped and nothing of it may be left. The healthy deployment is
served in bf16, the seed's wiring in fp32 (src/specparity/realmodel/demo_server.py builds both commands).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from tests.process_marks import describe, gone, marked_alive

from specparity.compare.findings import FindingKind
from specparity.deploy_command import read_launch
from specparity.gate import run_gate
from specparity.realmodel.demo_server import command
from specparity.realmodel.fetch import RealModel
from specparity.realmodel.scenarios import CONTRACT, REPO, VLLM, draft_for
from specparity.serving.child.reaper import MARKER_ENV
from specparity.serving.command.parse import parse_launch
from specparity.verdict import Verdict

pytestmark = [pytest.mark.real_model, pytest.mark.vllm, pytest.mark.slow]
HEALTHY, _, SEED = VLLM


def _launched(target: Path, draft: Path, dtype: str, marker: str, monkeypatch: pytest.MonkeyPatch) -> Verdict:
    # parsed before the run's marker is set, as tests/serving/test_sglang_live_server.py does: under the suite's warm
    # start (SPECPARITY_WARM_START=1, tests only) the parse runs in a job forked from a zygote that this process keeps
    # for its later parses and stops when it exits; the run's own processes (the server, its engine) must be gone
    spec = parse_launch(read_launch(command(target, draft, dtype), source="--launch", cwd=REPO), python=sys.executable)
    monkeypatch.setenv(MARKER_ENV, marker)
    v = run_gate(CONTRACT, level="all", launch=spec, timeout_s=1200)
    assert gone(marker, within_s=15), describe(marked_alive(marker))
    return v


def test_the_healthy_deployment_passes_on_its_server_with_the_servers_own_acceptance(
        real_model: RealModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    v = _launched(real_model.bf16, draft_for(HEALTHY, tmp_path), "bfloat16", f"real-server-ok-{os.getpid()}",
                  monkeypatch)
    assert v.status == "pass", [str(f) for f in v.errors]
    assert list(v.served_layout or []) == ["layer:1", "layer:14", "layer:26"]
    assert v.live is not None and v.live["mode"] == "launched"
    loop = v.outcome.engine_loop if v.outcome is not None else None
    # the server's own counters over the probes' prompts: a drafter that learned something real is accepted
    assert loop is not None and loop["drafts"] > 0 and loop["per_position"][0] > 0.2, loop
    # and judged: inside the contract's band, counted from the probes' own requests (the launch added the switch)
    judged = loop["server_acceptance"]
    assert judged["state"] == "inside" and judged["confirms"] == "healthy", judged
    assert judged["source"] == "per_request" and judged["reference_from"] == "contract"
    assert "--per-request-spec-decode-metrics" in v.live["added_flags"]


def test_the_seeds_wiring_is_named_on_its_server(real_model: RealModel, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    v = _launched(real_model.fp32, draft_for(SEED, tmp_path), "float32", f"real-server-seed-{os.getpid()}",
                  monkeypatch)
    assert v.status == "fail"
    assert FindingKind.EXTRA_EMBEDDING in {f.kind for f in v.errors}
    assert list(v.served_layout or []) == ["embedding", "layer:1", "layer:14"]
    assert v.outcome is not None and v.outcome.diagnosis == "wiring"
    loop = v.outcome.engine_loop
    assert loop is not None and loop["drafts"] > 0
    # the seed's symptom from the server's side: its own acceptance is below the contract's band, and says so
    judged = loop["server_acceptance"]
    assert judged["state"] == "below" and judged["confirms"] == "wiring", judged
    collapse = next(f for f in v.errors if f.kind is FindingKind.SERVED_ACCEPTANCE_COLLAPSE)
    assert "confirms the wiring fault" in collapse.message
