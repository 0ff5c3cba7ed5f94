"""Benchmark: attribution on a Kimi-sized synthetic probe, reported as ratios.

Probe: one sample of 512 tokens, H = 7168, bf16, a 61-layer target (62 boundaries: ``embedding`` and
``layer:0..60``), 3 served chunks and 3 recorded chunks (``layer:{1,29,57}``).

Baselines, over the same bytes:
  (a) plain read: ``t.sum()`` once over every atlas, served and recorded tensor;
  (b) pairwise ``torch.testing.assert_close`` of every served chunk against every boundary.

Goals: attribution (identity by relative error and separation, drift percentiles included, issue 10)
reaches >= 50% of plain-read bandwidth and is >= 5x faster than (b).
Run: ``.venv/bin/python benchmarks/bench_attribution.py [--threads 1] [--tokens 512] [--hidden 7168] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import time
from collections.abc import Callable

import torch

from specparity.compare.attribution import attribute
from specparity.compare.synthetic import bf16_noise, concat_sources, residual_stream
from specparity.compare.tolerances import default_tolerance

SOURCES = ["layer:1", "layer:29", "layer:57"]


def _best_of(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) if times else float("nan")


def _max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--layers", type=int, default=61)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--block-tokens", type=int, default=8)
    parser.add_argument("--pairwise-repeat", type=int, default=1)
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
    print(f"probe: {args.tokens} tokens, H={args.hidden}, bf16, {len(SOURCES)} chunks x {len(states)} boundaries "
          f"(built in {time.perf_counter() - t0:.1f} s, {torch.get_num_threads()} threads)")

    tensors = [*states.values(), served, recorded]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    rss_before = _max_rss_mib()

    def plain_read() -> None:
        for t in tensors:
            t.sum()

    tol = default_tolerance("bfloat16")

    def attribution() -> object:
        return attribute([served], [recorded], [states], expected=SOURCES, tolerance=tol,
                         block_tokens=args.block_tokens)

    chunks = [served[:, c * args.hidden:(c + 1) * args.hidden] for c in range(len(SOURCES))]

    def pairwise() -> None:
        for chunk in chunks:
            for state in states.values():
                with contextlib.suppress(AssertionError):
                    torch.testing.assert_close(chunk, state)

    table = attribution()
    t_read = _best_of(plain_read, args.repeat)
    t_attr = _best_of(attribution, args.repeat)
    rss_after = _max_rss_mib()
    t_pair = _best_of(pairwise, args.pairwise_repeat)
    attributed = [c.attributed for c in table.served]  # type: ignore[attr-defined]
    print(f"bytes read: {nbytes / 2**20:.0f} MiB")
    print(f"plain read:        {t_read * 1e3:8.1f} ms  {nbytes / t_read / 2**30:6.2f} GiB/s")
    print(f"attribution:       {t_attr * 1e3:8.1f} ms  {nbytes / t_attr / 2**30:6.2f} GiB/s  -> {attributed}")
    print(f"pairwise assert_close: {t_pair * 1e3:8.1f} ms ({len(chunks) * len(states)} calls)")
    print(f"ratio bandwidth (attribution / plain read): {t_read / t_attr:.2f}  (goal >= 0.5)")
    print(f"ratio speed-up vs pairwise assert_close:    {t_pair / t_attr:.1f}x (goal >= 5x)")
    # attribution's own working set: float32 block buffers plus per-token [T, chunks, boundaries] sums
    chunks_total, pairs = 2 * len(SOURCES), 2 * len(SOURCES)
    blocks = args.block_tokens * (len(states) + chunks_total + 2 * pairs) * args.hidden * 4
    per_token = args.tokens * (chunks_total * len(states) + chunks_total + len(states) + 4 * pairs) * 4
    print(f"working buffers: {(blocks + per_token) / 2**20:.1f} MiB (no copy of the {nbytes / 2**20:.0f} MiB probe); "
          f"peak RSS {rss_after:.0f} MiB, of which the probe and its generator {rss_before:.0f} MiB")
    if attributed != SOURCES:
        raise SystemExit(f"attribution wrong: {attributed} != {SOURCES}")


if __name__ == "__main__":
    main()
