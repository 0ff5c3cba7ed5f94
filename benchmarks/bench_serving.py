"""Benchmark: the real-SGLang serving adapter on the bundled example, reported against its goals.

Measures, each in a fresh child process (as the product runs it):
  resolve   - ``resolve_deployment``: ServerArgs + draft ids + capture list + fc shape, no forward.
              Goal: < 10 s wall on 2 cores.
  capture   - ``capture_deployment``: worker start-up, the fc-capture prefill, the atlas extends.

Model: fixtures/default (L=8, H=64) when it exists, else the reference builder's model of the same
shape (/work/shared/reference/sglang-cpu/make_models.py). Also prints the load average, because
start-up time is dominated by imports and scales with CPU contention.

Run: ``.venv/bin/python benchmarks/bench_serving.py [--repeat 3] [--samples 4] [--tokens 64]``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specparity.serving import ResolvedDeployment, capture_deployment, resolve_deployment

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "fixtures" / "default"
REFERENCE_BUILDER = Path("/work/shared/reference/sglang-cpu/make_models.py")
RESOLVE_GOAL_S = 10.0


def _models(tmp: Path) -> Path:
    if (BUNDLED / "target" / "config.json").is_file():
        return BUNDLED
    out = tmp / "models"
    subprocess.run(
        [sys.executable, str(REFERENCE_BUILDER), str(out), "[1,3,5]"], check=True, capture_output=True
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="resolve runs (median reported)")
    ap.add_argument("--samples", type=int, default=4, help="probe samples in the capture batch")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per probe sample")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        models = _models(Path(tmp))
        target, draft = models / "target", models / "draft"
        print(f"model: {models}  cores: {os.cpu_count()}  load average: {os.getloadavg()[0]:.2f}")

        walls: list[float] = []
        for i in range(args.repeat):
            t0 = time.perf_counter()
            r = resolve_deployment(target, draft)
            walls.append(time.perf_counter() - t0)
            if not isinstance(r, ResolvedDeployment):
                print(f"resolve failed: {r}")
                return 1
            inner = r.timings
            print(
                f"resolve #{i + 1}: wall {walls[-1]:.2f} s (sglang import {inner['sglang_import_s']:.2f} s, "
                f"ServerArgs {inner['server_args_s']:.2f} s, ids+setter+fc {inner['resolve_s']:.2f} s; "
                "the rest is interpreter start + torch import)"
            )
        med = statistics.median(walls)
        print(f"resolve median {med:.2f} s = {med / RESOLVE_GOAL_S:.2f}x the {RESOLVE_GOAL_S:.0f} s goal")

        rng = random.Random(0)
        probes = [[rng.randrange(1, 256) for _ in range(args.tokens)] for _ in range(args.samples)]
        t0 = time.perf_counter()
        c = capture_deployment(target, draft, probes=probes, atlas=True)
        wall = time.perf_counter() - t0
        if c.deployment is None or c.fc is None:
            print(f"capture failed: {c.failures}")
            return 1
        t = c.deployment.timings
        print(
            f"capture ({args.samples} x {args.tokens} tokens): wall {wall:.2f} s; in child: start-up "
            f"{t['startup_s']:.2f} s, fc prefill {t['fc_forward_s']:.3f} s, atlas {t['atlas_forward_s']:.3f} s"
        )
        print(f"capture start-up share of wall: {t['startup_s'] / wall:.2f}; failures: {c.failure_kinds()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
