"""Benchmark: attribution on a Kimi-sized synthetic probe, reported as ratios.

Probe: one sample of 512 tokens, H = 7168, bf16, a 61-layer target (62 boundaries: ``embedding`` and
``layer:0..60``), 3 served chunks and 3 recorded chunks (``layer:{1,29,57}``).

Baselines, over the same bytes:
  (a) plain read: ``t.sum()`` once over every atlas, served and recorded tensor;
  (b) pairwise ``torch.testing.assert_close`` of every served chunk against every boundary.

Goals (issue 10 item 6): attribution, with every criterion the verdict uses (identity by exact relative
error and separation, drift percentiles), reaches >= 0.5 of plain-read bandwidth with one thread, and is
>= 5x faster than (b).

On a shared machine both timings move with the load, so the plain read and attribution run in
alternation and each pair gives one ratio; the min, median and max of those ratios are printed, for
wall-clock time and for CPU time (process time: less sensitive to other processes, one thread only).
Run: ``.venv/bin/python benchmarks/bench_attribution.py --threads 1 [--tokens 512] [--hidden 7168] [--repeat 7]
[--backend auto|numba|torch]``.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import statistics
import time
from collections.abc import Callable

import torch

from specparity.compare.attribution import attribute
from specparity.compare.scan import resolve_backend
from specparity.compare.synthetic import bf16_noise, concat_sources, residual_stream
from specparity.compare.tolerances import default_tolerance

SOURCES = ["layer:1", "layer:29", "layer:57"]


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one call."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def _max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _spread(values: list[float]) -> str:
    return f"min {min(values):.2f}  median {statistics.median(values):.2f}  max {max(values):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--layers", type=int, default=61)
    parser.add_argument("--repeat", type=int, default=7, help="alternating (plain read, attribution) pairs")
    parser.add_argument("--block-tokens", type=int, default=8, help="token block of the torch backend")
    parser.add_argument("--backend", choices=("auto", "numba", "torch"), default="auto")
    parser.add_argument("--pairwise-repeat", type=int, default=1, help="0 skips the assert_close baseline")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (0: torch's default); on a shared box 1 avoids oversubscription")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    states = residual_stream(args.layers, args.hidden, tokens=args.tokens, seed=0, dtype=torch.bfloat16)
    states.pop("final_norm")
    recorded = concat_sources(states, SOURCES)
    served = bf16_noise(recorded, seed=1)
    tensors = [*states.values(), served, recorded]
    backend = resolve_backend(args.backend, tensors)
    print(f"probe: {args.tokens} tokens, H={args.hidden}, bf16, {len(SOURCES)} chunks x {len(states)} boundaries "
          f"(built in {time.perf_counter() - t0:.1f} s, {torch.get_num_threads()} threads, backend {backend})")

    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    rss_before = _max_rss_mib()

    def plain_read() -> None:
        for t in tensors:
            t.sum()

    tol = default_tolerance("bfloat16")

    def attribution() -> object:
        return attribute([served], [recorded], [states], expected=SOURCES, tolerance=tol,
                         block_tokens=args.block_tokens, backend=args.backend)

    chunks = [served[:, c * args.hidden:(c + 1) * args.hidden] for c in range(len(SOURCES))]

    def pairwise() -> None:
        for chunk in chunks:
            for state in states.values():
                with contextlib.suppress(AssertionError):
                    torch.testing.assert_close(chunk, state)

    first_wall, _ = _timed(attribution)  # numba compiles (or loads its on-disk cache) here
    table = attribution()
    reads, attrs = [], []
    for _ in range(args.repeat):
        reads.append(_timed(plain_read))
        attrs.append(_timed(attribution))
    rss_after = _max_rss_mib()
    wall = [r[0] / a[0] for r, a in zip(reads, attrs, strict=True)]
    cpu = [r[1] / a[1] for r, a in zip(reads, attrs, strict=True)]
    t_read, t_attr = min(r[0] for r in reads), min(a[0] for a in attrs)
    attributed = [c.attributed for c in table.served]  # type: ignore[attr-defined]
    print(f"bytes read: {nbytes / 2**20:.0f} MiB")
    print(f"plain read:        {t_read * 1e3:8.1f} ms  {nbytes / t_read / 2**30:6.2f} GiB/s  (best of {args.repeat})")
    print(f"attribution:       {t_attr * 1e3:8.1f} ms  {nbytes / t_attr / 2**30:6.2f} GiB/s  -> {attributed}")
    print(f"first attribution: {first_wall * 1e3:8.1f} ms  (numba compile or cache load, once per process)")
    print(f"ratio bandwidth (attribution / plain read), per alternating pair (goal >= 0.5):\n"
          f"  wall {_spread(wall)}\n  cpu  {_spread(cpu)}")
    if args.pairwise_repeat:
        t_pair = min(_timed(pairwise)[0] for _ in range(args.pairwise_repeat))
        print(f"pairwise assert_close: {t_pair * 1e3:8.1f} ms ({len(chunks) * len(states)} calls)")
        print(f"ratio speed-up vs pairwise assert_close:    {t_pair / t_attr:.1f}x (goal >= 5x)")
    # attribution's own working set: the kernel's float32 chunk rows (two tokens), or the torch backend's
    # float32 block buffers, plus per-token [T, rows] / [T, pairs] statistics; never a copy of the atlas
    rows, pairs = 2 * len(SOURCES), 2 * len(SOURCES)
    per_token = args.tokens * (rows + 4 * pairs + 6 * len(SOURCES)) * 4
    if backend == "numba":
        blocks = 2 * rows * args.hidden * 4
    else:
        blocks = args.block_tokens * (len(states) + rows + 2 * pairs) * args.hidden * 4
    print(f"working buffers: {(blocks + per_token) / 2**20:.1f} MiB (no copy of the {nbytes / 2**20:.0f} MiB probe); "
          f"peak RSS {rss_after:.0f} MiB, of which the probe and its generator {rss_before:.0f} MiB")
    if attributed != SOURCES:
        raise SystemExit(f"attribution wrong: {attributed} != {SOURCES}")


if __name__ == "__main__":
    main()
