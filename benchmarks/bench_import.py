"""Benchmark: `contract from-specforge` time against the number of recorded files (issue 11 item 9).

Writes SpecForge-shaped runs of 10, 100 and 1000 sample files (the bundled target and draft,
fixtures/default: H=64, ids [1, 3, 5]; each file S=2048 tokens, float32, 2 MB; 16 distinct files, the rest
hard links to them, so 1000 files need 32 MB of disk: every name is still a file the importer may open), times
``contract_from_specforge`` on each (best of ``--repeat``), and prints the ratio against 10 files.
Goal: at most 1.2x at 1000 files against 10: the importer reads the probes plus a bounded sample, so its
cost must not grow with the dataset (a 100K-sample run is terabytes).

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/bench_import.py [--repeat 3] [--counts 10,100,1000]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from specparity.training.specforge import contract_from_specforge

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / "fixtures" / "default"
GOAL = 1.2
SEQ, HIDDEN, CHUNKS = 2048, 64, 3
DISTINCT = 16


def _write_run(root: Path, count: int) -> Path:
    """``count`` SpecForge sample files under root/rows_0-2000: DISTINCT real files, the rest hard links."""
    gen = torch.Generator().manual_seed(count)
    base_aux = torch.randn(1, SEQ, CHUNKS * HIDDEN, generator=gen)
    base_hid = torch.randn(1, SEQ, HIDDEN, generator=gen)
    ids = torch.randint(0, 256, (SEQ,), generator=gen)
    mask = torch.ones(SEQ, dtype=torch.int64)
    paths = []
    for i in range(count):
        group = (i // 2000) * 2000
        path = root / f"rows_{group}-{group + 2000}" / f"data_{i}.ckpt"
        path.parent.mkdir(parents=True, exist_ok=True)
        if i < DISTINCT:
            torch.save({"input_ids": ids, "loss_mask": mask, "hidden_state": base_hid + i,
                        "aux_hidden_state": base_aux + i}, path)
        else:
            os.link(paths[i % DISTINCT], path)
        paths.append(path)
    return root


def _time(hidden_states: Path, out: Path, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        contract_from_specforge(hidden_states, BUNDLE / "draft", BUNDLE / "target", out=out / "c.json", probes=4)
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--counts", default="10,100,1000")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]
    torch.set_num_threads(1)
    times: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench_import_") as tmp:
        _time(_write_run(Path(tmp) / "warmup", 2), Path(tmp) / "out_warmup", 1)  # imports, first-call caches
        for n in counts:
            run = _write_run(Path(tmp) / f"hs_{n}", n)
            times[n] = _time(run, Path(tmp) / f"out_{n}", args.repeat)
    base = times[counts[0]]
    print(f"contract from-specforge, best of {args.repeat} (load average {os.getloadavg()[0]:.2f}):")
    for n in counts:
        print(f"  {n:>5} files: {times[n]:.3f} s  ratio {times[n] / base:.2f}x vs {counts[0]}")
    worst = times[counts[-1]] / base
    verdict = "meets" if worst <= GOAL else "misses"
    print(f"goal <= {GOAL}x at {counts[-1]} vs {counts[0]} files: {verdict} ({worst:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
