"""A disarmed hook costs no tensor arithmetic, on both engines: it returns before touching a tensor.

The tensors handed to the hooks here are spies that record every arithmetic or tensor method called on them; a
disarmed hook must leave the record empty (the armed one is shown to use them, so the spy does see arithmetic).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from specparity.serving.sglang import live_hooks, live_wire
from specparity.serving.vllm import tap


class Spy:
    """A tensor stand-in: every arithmetic operator and every tensor method it is asked for is recorded."""

    def __init__(self, log: list[str]) -> None:
        self._log = log

    def _op(self, name: str) -> Any:
        self._log.append(name)
        return torch.ones(2, 4)

    def __add__(self, other: Any) -> Any:
        return self._op("add")

    __radd__ = __add__

    def __mul__(self, other: Any) -> Any:
        return self._op("mul")

    __rmul__ = __mul__

    def __getattr__(self, name: str) -> Any:  # detach, to, clone, float, ...: any tensor method
        if name.startswith("__"):
            raise AttributeError(name)
        self._log.append(name)
        return lambda *a, **k: torch.ones(2, 4)


class _Target(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Identity() for _ in range(2))
        self.norm = torch.nn.Identity()
        self.aux_hidden_state_layers = (1,)
        self.seen: list[int] = []

    def _maybe_add_hidden_state(self, aux: Any, layer_idx: int, hidden: Any, residual: Any) -> Any:
        self.seen.append(int(layer_idx))
        return aux


@pytest.fixture
def vllm_runner() -> Any:
    target = _Target()
    fc = torch.nn.Linear(8, 4)
    runner = SimpleNamespace(model=SimpleNamespace(model=target), drafter=SimpleNamespace(
        model=SimpleNamespace(model=SimpleNamespace(fc=fc))))
    before = tap._ACTIVE
    yield runner
    tap._ACTIVE = before


def test_a_disarmed_vllm_boundary_hook_does_no_tensor_arithmetic(vllm_runner: Any) -> None:
    tap.install(vllm_runner, atlas=True, armed=False)
    target = vllm_runner.model.model
    log: list[str] = []
    for i in range(3):
        target._maybe_add_hidden_state([], i, Spy(log), Spy(log))
    target.norm(torch.ones(2, 4))
    assert log == [] and target.seen == [0, 1, 2]  # vLLM's own function still ran, untouched
    assert tap._ACTIVE is not None and tap._ACTIVE.atlas == {} and tap._ACTIVE.pending == []
    tap._ACTIVE.armed = True  # armed: the same call computes the boundary (the spy sees it)
    target._maybe_add_hidden_state([], 0, Spy(log), Spy(log))
    assert log[0] == "add" and "b0" in tap._ACTIVE.atlas


def test_a_disarmed_vllm_fc_hook_reads_no_tensor(vllm_runner: Any) -> None:
    tap.install(vllm_runner, atlas=True, armed=False)
    assert tap._ACTIVE is not None
    log: list[str] = []
    tap._ACTIVE.fc_call(Spy(log))
    tap._ACTIVE.final_norm(Spy(log))
    tap._ACTIVE.boundary(0, Spy(log))
    assert log == [] and tap._ACTIVE.pending == []


def test_a_disarmed_sglang_hook_does_no_tensor_arithmetic(tmp_path: Path) -> None:
    evidence = tmp_path / "ev"
    evidence.mkdir(mode=0o700)
    process = live_hooks._Process(evidence)
    module = torch.nn.Module()
    log: list[str] = []
    args = (Spy(log), Spy(log), SimpleNamespace(forward_mode=SimpleNamespace(name="EXTEND")))
    process.end_hook(module, args, Spy(log))  # adoption (the first call): installs the pre-hook only
    for _ in range(3):
        process.start_hook(module, args)  # disarmed: one stat of the flag
        process.end_hook(module, args, (Spy(log), Spy(log)))
    hook = process._tap("atlas")
    hook(module, (Spy(log), Spy(log)), (Spy(log), Spy(log)))
    assert log == []
    assert not (evidence / live_wire.RECORDS).exists()
