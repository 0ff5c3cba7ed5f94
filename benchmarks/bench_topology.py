"""Benchmark: the vLLM gate at TP=2, PP=2 and TP=2 on two Ray nodes, against a bare engine start plus prefill in the
same layout (issue 23 item 7): wall time and peak RSS of the whole process tree, as ratios measured in one run.

Both sides start vLLM's real engine in a fresh interpreter of the vLLM env on the bundled models (fixtures/vllm):
  (a) bare: ``python -c`` that builds ``vllm.LLM`` in the layout with the gate's settings and prefills each probe
      (``max_tokens=1``), nothing else;
  (b) the gate: ``run_gate(..., engine="vllm", level="capture")`` in the layout (the tap, per-rank evidence through
      collective_rpc, atlas, attribution), from this interpreter with ``python=<vllm env>``.
Peak RSS is sampled every 0.1 s over the process and all its descendants (engine core, workers). The Ray layout
starts two Ray nodes on loopback (tests/vllm_engine/ray_cluster.py) and is measured with the cluster up.
Where vLLM refuses a layout on this CPU machine, both sides stop at that refusal: the line says so and the ratio is
of the time to the refusal. Goal: (b) / (a) <= 1.3x where the layout serves.
Run: ``.venv/bin/python benchmarks/bench_topology.py [--python .tox/vllm-0.32/bin/python] [--layouts tp2 pp2 ray]``.
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
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / "fixtures" / "vllm"
CONTRACT = BUNDLE / "contract" / "tiny-llama-eagle3-hd32.json"
LAYOUTS: dict[str, dict[str, Any]] = {
    "tp2": {"tensor_parallel_size": 2},
    "pp2": {"pipeline_parallel_size": 2},
    "ray": {"tensor_parallel_size": 2, "distributed_executor_backend": "ray"},
}

BARE = r"""
import json, os, sys
args = json.loads(sys.argv[1])
workers = int(args.get("tensor_parallel_size", 1)) * int(args.get("pipeline_parallel_size", 1))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(r % (os.cpu_count() or 1)) for r in range(workers)))
def main():
    from vllm import LLM, SamplingParams
    llm = LLM(model=sys.argv[2], seed=0, enforce_eager=True, enable_prefix_caching=False, max_num_seqs=1,
              max_model_len=256, max_num_batched_tokens=256, dtype="float32", gpu_memory_utilization=0.3,
              speculative_config={"method": "eagle3", "model": sys.argv[3], "num_speculative_tokens": 3}, **args)
    for p in json.loads(sys.argv[4]):
        llm.generate([{"prompt_token_ids": p}], SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    sys.stdout.flush()
    os._exit(0)
if __name__ == "__main__":
    main()
"""


class PeakRss:
    """The largest sum of RSS over ``root`` and its descendants, sampled every 0.1 s while running."""

    def __init__(self, root: int) -> None:
        self.root, self.peak, self._stop = root, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(self.root)
                total = 0
                for p in [proc, *proc.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        total += p.memory_info().rss
                self.peak = max(self.peak, total)
            self._stop.wait(0.1)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def bare(python: str, args: dict[str, Any], probes: list[list[int]]) -> tuple[float, int, str]:
    """Wall time, peak RSS and outcome of the bare run, start to the main process's exit; its process group (engine
    core, workers) is then killed, as the gate's child runner does (serving/child/process.py). Its stderr goes to a file:
    the engine core outlives ``os._exit`` and would hold a pipe open."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([python, "-c", BARE, json.dumps(args), str(BUNDLE / "target"), str(BUNDLE / "draft"),
                                 json.dumps(probes)], stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        with PeakRss(proc.pid) as rss:
            rc = proc.wait()
        wall = time.perf_counter() - t0
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        err.seek(0)
        last = [ln for ln in err.read().decode(errors="replace").splitlines() if "Error" in ln]
    return wall, rss.peak, "served" if rc == 0 else f"refused: {last[-1][:120] if last else rc}"


def gate(python: str, args: dict[str, Any]) -> tuple[float, int, str]:
    """The gate as a user runs it (``specparity gate`` in its own process): wall time, the peak RSS of its whole tree
    (its own interpreter included), and its verdict's exit code."""
    cmd = [sys.executable, "-m", "specparity.cli", "gate", "--engine", "vllm", "--python", python, "--level",
           "capture", "--contract", str(CONTRACT), "--target", str(BUNDLE / "target"), "--draft",
           str(BUNDLE / "draft"), *[a for k, v in args.items() for a in ("--engine-arg", f"{k}={v}")]]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    with PeakRss(proc.pid) as rss:
        out, _ = proc.communicate()
    head = out.decode(errors="replace").splitlines()[:1]
    return time.perf_counter() - t0, rss.peak, f"exit {proc.returncode}: {head[0][:60] if head else ''}"


@contextlib.contextmanager
def layout_env(name: str, python: str) -> Iterator[None]:
    if name != "ray":
        yield
        return
    sys.path.insert(0, str(REPO / "tests" / "vllm_engine"))
    from ray_cluster import two_nodes

    with two_nodes(python) as cluster:
        os.environ["RAY_ADDRESS"] = cluster.address
        try:
            yield
        finally:
            os.environ.pop("RAY_ADDRESS", None)
    if cluster.orphans:
        print(f"  Ray processes left after the cluster stopped: {cluster.orphans}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=str(REPO / ".tox" / "vllm-0.32" / "bin" / "python"))
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    args = parser.parse_args()
    from specparity.contract import load_contract, probe_pack_path, read_probe_pack

    c = load_contract(CONTRACT)
    probes = [s.input_ids.tolist() for s in read_probe_pack(probe_pack_path(c, CONTRACT)).samples]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mb: Callable[[int], str] = lambda b: f"{b / 2**20:6.0f} MB"  # noqa: E731
    for name in args.layouts:
        with layout_env(name, args.python):
            b_s, b_rss, b_out = bare(args.python, LAYOUTS[name], probes)
            g_s, g_rss, g_out = gate(args.python, LAYOUTS[name])
        print(f"{name}: bare start+prefill {b_s:6.1f} s {mb(b_rss)} ({b_out}); gate {g_s:6.1f} s {mb(g_rss)} "
              f"({g_out}); wall {g_s / b_s:.2f}x, peak RSS {g_rss / max(b_rss, 1):.2f}x (goal <= 1.3x)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
