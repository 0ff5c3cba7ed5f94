"""vLLM's tap in a server is bounded and leased: what it holds between two drains has a ceiling, past which
it disarms itself and says so, and a tap nobody drains (a gate killed with SIGKILL) disarms itself and drops what it
held when its lease runs out, with no traffic needed. The gate reads either as exit 3 by name.

The tap's own code on a loaded runner's shape (the drafter's fc a real ``nn.Linear``, its hooks the tap's own); the
real server's lease is held in tests/vllm_engine/test_vllm_live_trust.py.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tests.resolved_deployments import tiny_deployment

from specparity.serving.results import FAILURE_KINDS, TAP_LEASE_EXPIRED, TAP_OVERFLOW
from specparity.serving.vllm import tap
from specparity.serving.vllm.evidence import assemble_capture
from specparity.serving.vllm.ranks import RankEvidence
from specparity.verdict import rules

BUNDLE = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"


def vllm_resolved() -> Any:
    return tiny_deployment(BUNDLE, engine_version="0.32.0", adapter="vllm-0.32", fc_in_features=8,
                           layout={"ranks_expected": [0], "tensor_parallel_size": 1, "pipeline_parallel_size": 1})


class _Target(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Identity() for _ in range(2))
        self.norm = torch.nn.Identity()
        self.aux_hidden_state_layers = (1,)

    def _maybe_add_hidden_state(self, aux: Any, layer_idx: int, hidden: Any, residual: Any) -> Any:
        return aux


@pytest.fixture
def worker() -> Any:
    fc = torch.nn.Linear(8, 4)
    runner = SimpleNamespace(model=SimpleNamespace(model=_Target()), drafter=SimpleNamespace(
        model=SimpleNamespace(model=SimpleNamespace(fc=fc))))
    before = tap._ACTIVE
    tap._ACTIVE = None
    yield SimpleNamespace(model_runner=runner, fc=fc)
    if tap._ACTIVE is not None:
        tap._ACTIVE.disarm()
    tap._ACTIVE = before


def _forward(worker: Any, rows: int = 3) -> None:
    worker.fc(torch.ones(rows, 8))


class _Workers:
    """``collective_rpc`` as vLLM's executor gives it, reaching the one worker's tap."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def collective_rpc(self, method: str, kwargs: Any = None) -> list[dict[str, Any]]:
        return [tap.drain(self.worker)]


def test_past_its_bound_the_tap_disarms_drops_everything_and_the_gate_reads_exit_3(worker: Any) -> None:
    tap.arm(worker, "", max_calls="3")
    for _ in range(3):
        _forward(worker)
    active = tap._ACTIVE
    assert active is not None and active.armed and len(active.pending) == 3
    _forward(worker)  # the fourth call is past the bound
    assert not active.armed and active.pending == [] and active.held == 0
    _forward(worker)  # disarmed: nothing more is held
    assert active.pending == []
    evidence = RankEvidence(_Workers(worker))
    evidence.end_probe()
    assert evidence.disarmed[0]["why"] == "overflow" and evidence.calls(0, 0) == []
    result = assemble_capture(vllm_resolved(), evidence, [[1, 2, 3]], atlas=False, loop={}, shared=True)
    assert [f.kind for f in result.failures] == [TAP_OVERFLOW]  # not fc_not_called (exit 1) for the empty probe
    assert "past its bound" in result.failures[0].message
    assert rules.failure_cause(TAP_OVERFLOW, result.failures[0].message) == "environment"
    # the byte bound as well
    tap.arm(worker, "", max_bytes="100")
    _forward(worker)
    assert not active.armed and active.disarmed is not None and active.disarmed["max_bytes"] == 100


def test_an_undrained_tap_disarms_itself_when_its_lease_runs_out_with_no_traffic(worker: Any) -> None:
    tap.arm(worker, "", lease_s="0.3")
    _forward(worker)
    _forward(worker)
    active = tap._ACTIVE
    assert active is not None and len(active.pending) == 2
    deadline = time.monotonic() + 5
    while active.armed and time.monotonic() < deadline:  # no call, no drain: the gate is gone
        time.sleep(0.05)
    assert not active.armed and active.pending == [] and active.held == 0
    _forward(worker)
    assert active.pending == []  # and records nothing after it
    reply = tap.drain(worker)
    assert reply["disarmed"] == {"why": "lease", "lease_s": 0.3} and reply["calls"] == []
    evidence = RankEvidence(_Workers(worker))
    evidence.disarmed = {0: reply["disarmed"]}
    evidence.identity = {0: {k: v for k, v in reply.items() if k != "calls"}}
    result = assemble_capture(vllm_resolved(), evidence, [[1, 2, 3]], atlas=False, loop={}, shared=True)
    assert [f.kind for f in result.failures] == [TAP_LEASE_EXPIRED]
    assert rules.failure_cause(TAP_LEASE_EXPIRED, result.failures[0].message) == "environment"


def test_a_gate_that_drains_within_the_lease_keeps_it_armed(worker: Any) -> None:
    tap.arm(worker, "", lease_s="0.4")
    active = tap._ACTIVE
    assert active is not None
    for _ in range(8):  # 0.8 s in all, a drain every 0.1 s
        _forward(worker)
        time.sleep(0.1)
        assert len(tap.drain(worker)["calls"]) == 1
    assert active.armed and active.disarmed is None
    tap.disarm(worker)
    assert not active.armed


def test_the_kinds_are_named_failures() -> None:
    assert {TAP_OVERFLOW, TAP_LEASE_EXPIRED} <= set(FAILURE_KINDS)
