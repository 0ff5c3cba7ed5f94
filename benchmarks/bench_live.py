"""Benchmark: the gate on the user's own vLLM server (issue 33 item 7), as ratios measured in one run, not asserts.

  (a) launched gate wall: ``specparity gate --launch -- <command>`` against a bare start of the same command (no
      hook switches), ``/health``, the same probes and the same outcome prompts sent the same way, and a stop.
      Goal <= 1.2x.
  (b) decode throughput with the hook switches present but idle against without them: the same server command,
      tokens/s over sequential greedy completions after a warm-up. The idle server's tap is armed once and disarmed
      first (its hooks are then installed and must return at once: the state a server is in after a gate run). An
      A/A control runs a second server without the switches in the same interleaving: the idle ratio means
      something only where the A/A ratio is within 1% of 1.0. Goal >= 0.98x.
  (c) evidence bytes moved per probe: what the server's /collective_rpc returned (fc calls and boundaries of every
      rank), from the gate's JSON report.

The deployment is the real model (SmolLM2-135M-Instruct and its trained drafter, with vLLM's ids for the trained
layers) when it is fetched (``python -m specparity.realmodel fetch``), else the bundled tiny vLLM models.

Run: ``.venv/bin/python benchmarks/bench_live.py [--vllm-python .tox/vllm-0.32/bin/python] [--tiny] [--decode-only]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from specparity.serving.live.server import LaunchedServer, ServerClient, free_port  # noqa: E402
from specparity.serving.vllm.live import LAUNCH_ENV, LAUNCH_FLAGS  # noqa: E402

GOAL_WALL, GOAL_DECODE = 1.2, 0.98
DECODE_REQUESTS, DECODE_TOKENS = 12, 64


def deployment(tiny: bool, tmp: Path) -> tuple[Path, Path, Path, str]:
    """(contract, target, draft, dtype): the real model's healthy vLLM deployment, or the bundled one."""
    if not tiny:
        try:
            from specparity.realmodel.fetch import fetch
            from specparity.realmodel.scenarios import CONTRACT, VLLM, draft_for

            return CONTRACT, fetch().fp32, draft_for(VLLM[0], tmp), "float32"
        except Exception as e:  # not fetched here: the bundled models say the same about the machinery
            print(f"(real model unavailable: {e}; using the bundled tiny models)")
    draft = tmp / "healthy"
    subprocess.run(["cp", "-r", str(REPO / "fixtures" / "vllm" / "draft"), str(draft)], check=True)
    cfg = json.loads((draft / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 4, 6]
    (draft / "config.json").write_text(json.dumps(cfg))
    contract = REPO / "fixtures" / "vllm" / "contract" / "tiny-llama-eagle3-hd32.json"
    return contract, REPO / "fixtures" / "vllm" / "target", draft, "float32"


def command(python: str, target: Path, draft: Path, dtype: str) -> tuple[list[str], dict[str, str]]:
    spec = json.dumps({"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3})
    return ([python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target), "--dtype", dtype,
             "--enforce-eager", "--max-model-len", "1024", "--speculative-config", spec],
            {"VLLM_CPU_KVCACHE_SPACE": "1"})


def probe_prompts(contract: Path) -> tuple[list[list[int]], list[list[int]]]:
    """The contract's probes, and the outcome's prompts (each probe up to its assistant's first token)."""
    from specparity.contract import load_contract, read_contract_probes
    from specparity.serving.engine import outcome_request

    c = load_contract(contract)
    pack = read_contract_probes(c, contract)
    probes = [[int(t) for t in s.input_ids] for s in pack.samples]
    lengths = outcome_request(pack).prompt_lengths
    return probes, [p[: max(1, n or len(p))] for p, n in zip(probes, lengths, strict=True)]


def serve(argv: list[str], env: dict[str, str], log: Path) -> LaunchedServer:
    port = free_port()
    server = LaunchedServer([*argv, "--host", "127.0.0.1", "--port", str(port)], env, f"http://127.0.0.1:{port}",
                            cwd=str(REPO), log=log)
    server.start()
    server.wait_healthy(900)
    return server


def complete(client: ServerClient, model: str, prompt: list[int], tokens: int) -> int:
    out = client.post_json("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": tokens,
                                               "temperature": 0.0, "ignore_eos": True})
    return int(out["usage"]["completion_tokens"])


def bare_run(argv: list[str], env: dict[str, str], probes: list[list[int]], prompts: list[list[int]],
             tmp: Path) -> float:
    t0 = time.perf_counter()
    server = serve(argv, env, tmp / "bare.log")
    try:
        with ServerClient(server.url, timeout_s=600) as c:
            model = c.get_json("/v1/models")["data"][0]["id"]
            for p in [*probes, *prompts]:
                complete(c, model, p, 16)
    finally:
        server.stop()
    return time.perf_counter() - t0


def decode_rates(arms: dict[str, tuple[list[str], dict[str, str]]], prompt: list[int], tmp: Path, *,
                 armed_once: tuple[str, ...] = ()) -> dict[str, float]:
    """Decode tokens/s of each arm's server, all up at once and their requests interleaved (A, B, C, A, B, C, ...),
    so a change in the machine's load falls on every arm alike (a shared 2-core machine drifts over minutes). The
    ``armed_once`` arms get the tap armed and disarmed after their warm-up."""
    from specparity.serving.vllm import tap

    servers = {name: serve(argv, env, tmp / f"{name}.log") for name, (argv, env) in arms.items()}
    try:
        clients = {name: ServerClient(s.url, timeout_s=600) for name, s in servers.items()}
        models = {name: c.get_json("/v1/models")["data"][0]["id"] for name, c in clients.items()}
        for name, c in clients.items():
            complete(c, models[name], prompt, DECODE_TOKENS)  # warm-up
            if name in armed_once:
                for method in (tap.ARM, tap.DISARM):
                    c.post_json("/collective_rpc", {"method": method, "kwargs": {}, "timeout": 60})
        tokens = dict.fromkeys(arms, 0)
        seconds = dict.fromkeys(arms, 0.0)
        for i in range(DECODE_REQUESTS * len(arms)):
            name = list(arms)[i % len(arms)]
            t0 = time.perf_counter()
            tokens[name] += complete(clients[name], models[name], prompt, DECODE_TOKENS)
            seconds[name] += time.perf_counter() - t0
        for c in clients.values():
            c.close()
        return {name: tokens[name] / seconds[name] for name in arms}
    finally:
        for s in servers.values():
            s.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-python", default=str(REPO / ".tox" / "vllm-0.32" / "bin" / "python"))
    parser.add_argument("--tiny", action="store_true", help="the bundled tiny models even when the real one is here")
    parser.add_argument("--decode-only", action="store_true", help="(b) alone: the idle-switch and A/A decode ratios")
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="specparity-bench-live-") as tmp_s:
        tmp = Path(tmp_s)
        contract, target, draft, dtype = deployment(args.tiny, tmp)
        base, env = command(args.vllm_python, target, draft, dtype)
        probes, prompts = probe_prompts(contract)
        print(f"deployment: {target.name} + {draft.name}, {len(probes)} probes")

        bare_s = 0.0 if args.decode_only else bare_run(base, env, probes, prompts, tmp)
        report = tmp / "gate.json"
        t0 = time.perf_counter()
        words = [sys.executable, "-m", "specparity.cli", "gate", "--contract", str(contract), "--json", str(report),
                 "--launch", "--", *(f"{k}={v}" for k, v in env.items()), *base]
        gate = None if args.decode_only else subprocess.run(words, cwd=REPO, capture_output=True, text=True)
        gate_s = time.perf_counter() - t0
        d = json.loads(report.read_text()) if report.is_file() else {}
        parse_s = (d.get("launch") or {}).get("timings", {}).get("parse_s")
        start_s = (d.get("live") or {}).get("startup_s")
        if gate is not None:
            print(f"(a) launched gate: {gate_s:.1f} s (exit {gate.returncode}: {d.get('verdict')}; parse {parse_s} s, "
                  f"server healthy after {start_s and round(start_s, 1)} s); bare start + same requests + stop: "
                  f"{bare_s:.1f} s")
            print(f"    ratio {gate_s / bare_s:.2f}x (goal <= {GOAL_WALL}x)")
        moved = (d.get("live") or {}).get("evidence_bytes")
        if moved is not None and probes:
            print(f"(c) evidence moved through /collective_rpc: {moved / len(probes) / 1e6:.2f} MB per probe "
                  f"({moved / 1e6:.1f} MB for {len(probes)} probes)")

        idle_arm = ([*base, *LAUNCH_FLAGS], {**env, **LAUNCH_ENV, "PYTHONPATH": str(REPO / "src")})
        rates = decode_rates({"plain": (base, env), "plain-again": (base, env), "idle": idle_arm}, prompts[0], tmp,
                             armed_once=("idle",))
        off, again, idle = rates["plain"], rates["plain-again"], rates["idle"]
        print(f"(b) decode ({DECODE_REQUESTS} x {DECODE_TOKENS} tokens per server, three servers interleaved): "
              f"{idle:.1f} tok/s with the hook switches idle (armed once, disarmed), {off:.1f} tok/s without; "
              f"ratio {idle / off:.3f}x (goal >= {GOAL_DECODE}x); A/A control (a second server without them) "
              f"{again:.1f} tok/s, ratio {again / off:.3f}x (the idle ratio is meaningful where A/A is within 1%)")
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
    print(f"measured {time.strftime('%Y-%m-%d')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
