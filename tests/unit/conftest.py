"""Fixtures for unit tests: synthetic SpecForge runs (builders in sf_builders.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from sf_builders import SpecForgeRun, write_draft, write_record, write_target


@pytest.fixture
def specforge_run(tmp_path: Path) -> Callable[..., SpecForgeRun]:
    """``make(ids=[0,1,2], num_layers=4, hidden=8, samples=3)`` -> a SpecForge-shaped run on disk."""

    def make(
        *, ids: Sequence[int] | None = (0, 1, 2), num_layers: int = 4, hidden: int = 8, samples: int = 3, k: int | None = None
    ) -> SpecForgeRun:
        k = k if k is not None else (len(set(ids)) if ids is not None else 3)
        root = tmp_path / "run"
        target = write_target(root / "target", num_layers=num_layers, hidden=hidden)
        draft = write_draft(root / "draft", ids=ids, target_hidden=hidden, k=k)
        hs = root / "hidden_states"
        for i in range(samples):
            write_record(hs / "rows_0-2000" / f"data_{i}.ckpt", seq=10, width=k * hidden, hidden=hidden, seed=i, pad=2 * (i % 2))
        vm = root / "vocab_mapping" / "vocab_mapping.pt"
        vm.parent.mkdir(parents=True)
        torch.save({"d2t": torch.zeros(32, dtype=torch.int64), "t2d": torch.ones(64, dtype=torch.bool)}, vm)
        return SpecForgeRun(root, target, draft, hs, vm, num_layers, hidden)

    return make
