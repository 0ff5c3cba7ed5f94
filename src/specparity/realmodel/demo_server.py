"""``make demo-server``: the gate on vLLM's own server, launched from a deploy command, on the real model.

SmolLM2-135M-Instruct (fetched once) and its trained drafter, served by ``python -m vllm.entrypoints.openai.api_server``
from the vLLM env, twice: the healthy deployment (vLLM's ids for the trained layers, bf16), then the seed's wiring (the
embedding in chunk 0, fp32). Each time specparity parses the command with vLLM's own parser, starts the server with
vLLM's own hook switches, sends the contract's probes, reads the fc input back through the server's ``/collective_rpc``
and the acceptance from its ``/metrics``, and stops it. It ends with one table (scenario, verdict, exit code, the named
finding, acceptance on recorded/served inputs and the server's own loop per position); the full reports go into a
folder it names (``-v`` prints them).

Exit 0 when both verdicts are as expected (the healthy one passes, the seed's is named), 1 otherwise, 3 when the vLLM
venv is absent (``make vllm-env`` builds it).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from specparity.realmodel.scenarios import CONTRACT, REPO, VLLM, draft_for

VLLM_PYTHON = REPO / ".tox" / "vllm-0.32" / "bin" / "python"


def command(target: Path, draft: Path, dtype: str) -> str:
    """The deploy command as a CPU user writes it (vLLM's CPU KV-cache size, eager, the target's dtype)."""
    spec = json.dumps({"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3})
    return (f"VLLM_CPU_KVCACHE_SPACE=1 python -m vllm.entrypoints.openai.api_server --model {target} "
            f"--dtype {dtype} --enforce-eager --max-model-len 2048 --speculative-config '{spec}'")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specparity.realmodel.demo_server", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-python", default=str(VLLM_PYTHON), help="the vLLM venv's python")
    parser.add_argument("--reports", type=Path, default=REPO / "reports" / "demo-server",
                        help="where the full reports go (default: %(default)s)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each gate's full report too")
    args = parser.parse_args(argv)
    if not Path(args.vllm_python).is_file():
        print(f"specparity: the vLLM env is absent ({args.vllm_python}): make vllm-env builds it", file=sys.stderr)
        return 3
    from specparity.deploy_command import read_launch
    from specparity.gate import run_gate
    from specparity.realmodel.fetch import fetch
    from specparity.report import render_text, write_reports
    from specparity.report.summary import print_summary, verdict_row
    from specparity.serving.command.parse import parse_launch

    model = fetch()
    healthy, _, seed = VLLM
    runs = [(healthy, model.bf16, "bfloat16"), (seed, model.fp32, "float32")]
    print(f"specparity demo-server: vLLM's own server on SmolLM2-135M-Instruct, {len(runs)} launches "
          "(each: parse, start, probes, stop; a few minutes on 2 cores)", flush=True)
    rows = []
    args.reports.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="specparity-demo-server-") as tmp:
        for scenario, target, dtype in runs:
            text = command(target, draft_for(scenario, Path(tmp)), dtype)
            print(f"\n$ specparity gate --contract {CONTRACT.relative_to(REPO)} --launch -- {text}", flush=True)
            spec = parse_launch(read_launch(text, source="--launch", cwd=REPO), python=args.vllm_python)
            verdict = run_gate(CONTRACT, level="all", launch=spec, timeout_s=1200)
            stem = args.reports / f"vllm-server-{scenario.key}"
            write_reports(verdict, json_path=stem.with_suffix(".json"), html_path=stem.with_suffix(".html"))
            if args.verbose:
                print(render_text(verdict, color=False), end="")
            rows.append(verdict_row(f"vLLM server: {scenario.title}", verdict, expect_status=scenario.expect_status,
                                    expect_kinds=scenario.expect_kinds))
    print()
    print_summary(rows, title="specparity demo-server: the gate on vLLM's own server (launched from the command, "
                              "acceptance from its /metrics)", color=sys.stdout.isatty())
    print(f"Full reports: {args.reports}" + ("" if args.verbose else " (-v prints them here)"))
    return 0 if all(r.as_expected for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
