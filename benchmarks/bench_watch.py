"""Benchmark: what `specparity watch` costs (issue 36 item 5), as ratios measured in one run, not asserts.

  (a) the watcher's CPU over the server's CPU at a steady load: one vLLM server of the real model (SmolLM2-135M-Instruct
      and its trained drafter, vLLM's ids for the trained layers), one sequential stream of chat prompts, and
      ``specparity watch`` reading its /metrics every --interval seconds for --seconds. CPU is user + system time: the
      watcher's own (its exit rusage), the server's whole process group (/proc, from the watcher's start to its end).
      Goal <= 1%.
  (b) memory over 10,000 windows: the watcher's polling loop in this process on a vLLM-sized exposition (the spec-decode
      counters among ~100 histogram families), with no sleep; Python heap (tracemalloc) and RSS after 1,000 and after
      10,000 windows. Goal: flat (the growth is the figure).

Run: ``.venv/bin/python benchmarks/bench_watch.py [--vllm-python .tox/vllm-0.32/bin/python] [--seconds 120]
[--interval 10] [--memory-only]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from specparity.serving.live.server import LaunchedServer, ServerClient, free_port  # noqa: E402

GOAL_CPU = 0.01
CLK = os.sysconf("SC_CLK_TCK")


def group_cpu_s(pgid: int) -> float:
    """User + system seconds of every live process in ``pgid`` (the server, its engine core, its workers)."""
    total = 0.0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # field 5 of stat: pgrp
            total += (int(fields[11]) + int(fields[12])) / CLK  # utime, stime
    return total


def vllm_exposition(drafts: int, filler: int = 100) -> str:
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    labels = {"model_name": "smol", "engine": "0"}
    r = CollectorRegistry()
    for name, v in (("vllm:spec_decode_num_drafts", drafts), ("vllm:spec_decode_num_draft_tokens", 3 * drafts),
                    ("vllm:spec_decode_num_accepted_tokens", drafts), ("vllm:generation_tokens", 2 * drafts)):
        Counter(name, "d", list(labels), registry=r).labels(**labels).inc(v)
    pp = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "d", [*labels, "position"], registry=r)
    for j, share in enumerate((0.5, 0.3, 0.2)):
        pp.labels(**labels, position=str(j)).inc(drafts * share)
    for i in range(filler):
        Histogram(f"vllm:filler_{i}_seconds", "f", list(labels), registry=r).labels(**labels).observe(0.1)
    return generate_latest(r).decode()


def memory(windows: int = 10_000) -> dict[str, float]:
    from specparity.realmodel.scenarios import CONTRACT
    from specparity.watch.band import Band, ContractFigures
    from specparity.watch.watcher import Watcher

    base = vllm_exposition(1)  # every counter linear in drafts: each read scales them
    size = len(base)
    moving = ("vllm:spec_decode", "vllm:generation_tokens_total")
    lines = [(line, line.startswith(moving)) for line in base.splitlines()]
    state = {"drafts": 0}

    class Source:
        url = "http://bench"

        def text(self, path: str, *, timeout_s: float | None = None) -> str:
            state["drafts"] += 100
            d = state["drafts"]
            return "\n".join(f"{ln.rsplit(' ', 1)[0]} {float(ln.rsplit(' ', 1)[1]) * d}" if mv else ln
                             for ln, mv in lines) + "\n"

    clock = iter(range(10**9))
    w = Watcher(Source(), Band(ContractFigures.load(CONTRACT)), window_s=60, interval_s=10,
                clock=lambda: float(next(clock)))
    tracemalloc.start()
    t0 = time.process_time()
    out: dict[str, float] = {"exposition_bytes": size}
    for i in range(1, windows + 1):
        w.poll()
        if i in (1_000, 5_000, windows):
            current, _ = tracemalloc.get_traced_memory()
            out[f"heap_kb_at_{i}"] = round(current / 1024, 1)
            out[f"rss_mb_at_{i}"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    tracemalloc.stop()
    out["cpu_ms_per_window"] = round((time.process_time() - t0) / windows * 1000, 3)
    return out


def cpu(vllm_python: str, seconds: float, interval: float) -> dict[str, float]:
    from specparity.realmodel.fetch import fetch
    from specparity.realmodel.scenarios import CONTRACT, VLLM, draft_for

    prompts = [json.loads(x)["prompt"] for x in (REPO / "tests/watch/chat_prompts.jsonl").read_text().splitlines()]
    with tempfile.TemporaryDirectory(prefix="specparity-bench-watch-") as tmp:
        port = free_port()
        spec = json.dumps({"method": "eagle3", "model": str(draft_for(VLLM[0], Path(tmp))),
                           "num_speculative_tokens": 3})
        argv = [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(fetch().fp32), "--dtype",
                "float32", "--enforce-eager", "--max-model-len", "2048", "--speculative-config", spec, "--host",
                "127.0.0.1", "--port", str(port), "--served-model-name", "smol"]
        with LaunchedServer(argv, {"VLLM_CPU_KVCACHE_SPACE": "1"}, f"http://127.0.0.1:{port}") as server:
            server.wait_healthy(900)
            stop = threading.Event()

            def load() -> None:
                with ServerClient(server.url, timeout_s=120) as c:
                    i = 0
                    while not stop.is_set():
                        c.post_json("/v1/chat/completions", {"model": "smol", "max_tokens": 64, "temperature": 0,
                                                             "messages": [{"role": "user",
                                                                           "content": prompts[i % len(prompts)]}]})
                        i += 1

            thread = threading.Thread(target=load, daemon=True)
            thread.start()
            time.sleep(10)  # steady state
            assert server.proc is not None
            before = group_cpu_s(server.proc.pid)
            watch = subprocess.Popen([sys.executable, "-m", "specparity.cli", "watch", "--server", server.url,
                                      "--contract", str(CONTRACT), "--once", "--duration", str(seconds),
                                      "--interval", str(interval), "--json"], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=REPO)
            _, status, usage = os.wait4(watch.pid, 0)
            after = group_cpu_s(server.proc.pid)
            out = watch.stdout.read() if watch.stdout else ""  # type: ignore[union-attr]
            stop.set()
            thread.join(timeout=120)
    watcher_s = usage.ru_utime + usage.ru_stime
    server_s = after - before
    summary = json.loads(out.splitlines()[-1]) if out.strip() else {}
    return {"seconds": seconds, "interval_s": interval, "windows": sum((summary.get("windows") or {}).values()),
            "watcher_cpu_s": round(watcher_s, 2), "server_cpu_s": round(server_s, 1),
            "ratio": round(watcher_s / server_s, 4) if server_s else float("nan"),
            "watcher_peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "exit": os.waitstatus_to_exitcode(status)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-python", default=str(REPO / ".tox/vllm-0.32/bin/python"))
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--memory-only", action="store_true")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    mem = memory()
    growth = mem["heap_kb_at_10000"] - mem["heap_kb_at_1000"]
    print(f"(b) memory over 10,000 windows: {json.dumps(mem)}; heap growth 1,000 -> 10,000 windows: {growth:+.1f} KB")
    if not args.memory_only:
        c = cpu(args.vllm_python, args.seconds, args.interval)
        verdict = "within" if c["ratio"] <= GOAL_CPU else "OVER"
        print(f"(a) watcher CPU over server CPU: {c['ratio']:.2%} ({verdict} the goal {GOAL_CPU:.0%}): {json.dumps(c)}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
