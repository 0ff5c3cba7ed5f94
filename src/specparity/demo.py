"""``make demo``: the gate on the bundled tiny models, healthy and with two real failure modes.

1. healthy: the drafter served as trained (``layer:1, layer:3, layer:5``): PASS.
2. the Kimi-K2.5 bug: a draft config whose ids ``[-1, 1, 3]`` make SGLang serve the embedding plus
   layers (an id of -1 under SGLang's +1 rule): FAIL with ``extra_embedding`` and the fix.
3. the silent rewrite: ``speculative_num_draft_tokens=16`` with topk 1 is served as ``steps + 1``:
   FAIL with ``spec_config_rewritten`` and the fix.

The three gates run concurrently (each SGLang runs in its own child process). The demo ends with one table
(scenario, expected, verdict and exit code, the named finding, acceptance); each scenario's full reports go into
a folder it names (``--reports``, default ``reports/demo``), and ``-v`` prints them inline too. Exit 0 when every
scenario ends as expected.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from specparity.gate import run_gate
from specparity.report import render_text, use_color, write_reports
from specparity.report.summary import print_summary, verdict_row

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Scenario:
    title: str
    draft: Path
    engine_args: dict[str, object]
    expect_status: str
    expect_kind: str | None


def _kimi_draft(base: Path, work: Path) -> Path:
    """A copy of the bundled draft whose config serves the embedding plus layers (the user's files stay untouched)."""
    out = work / "draft-kimi-bug"
    shutil.copytree(base, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [-1, 1, 3]
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def scenarios(bundle: Path, work: Path) -> list[Scenario]:
    draft = bundle / "draft"
    return [
        Scenario("healthy deployment", draft, {}, "pass", None),
        Scenario("Kimi-K2.5 bug: draft ids [-1, 1, 3] serve the embedding plus layers",
                 _kimi_draft(draft, work), {}, "fail", "extra_embedding"),
        Scenario("silent rewrite: num_draft_tokens 16 with topk 1",
                 draft, {"speculative_num_steps": 1, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 16},
                 "fail", "spec_config_rewritten"),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specparity.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contract", type=Path, default=REPO / "contracts" / "tiny-llama-eagle3.json")
    parser.add_argument("--bundle", type=Path, default=REPO / "fixtures" / "default")
    parser.add_argument("--level", default="all", choices=["static", "capture", "outcome", "all"])
    parser.add_argument("--reports", type=Path, default=REPO / "reports" / "demo",
                        help="write each scenario's JSON/HTML/JUnit/text reports here (default: %(default)s)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each scenario's full report too")
    args = parser.parse_args(argv)
    if not (args.bundle / "target" / "config.json").is_file() or not args.contract.is_file():
        print(f"specparity demo: bundled example not found under {args.bundle} / {args.contract}", file=sys.stderr)
        return 2
    color = use_color(sys.stdout)
    with tempfile.TemporaryDirectory(prefix="specparity-demo-") as tmp:
        todo = scenarios(args.bundle, Path(tmp))
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=len(todo)) as pool:
            futures = [pool.submit(run_gate, args.contract, args.bundle / "target", s.draft, engine_args=s.engine_args,
                                   level=args.level) for s in todo]
            verdicts = [f.result() for f in futures]
        wall = time.perf_counter() - t0
    rows = []
    for i, (s, v) in enumerate(zip(todo, verdicts, strict=True), 1):
        row = verdict_row(s.title, v, expect_status=s.expect_status, expect_kinds=(s.expect_kind,) if s.expect_kind else ())
        rows.append(row)
        if args.verbose:
            print(f"=== {i}. {s.title}  (expected: {row.expected})")
            print(render_text(v, color=color))
        write_reports(v, args.reports / f"scenario-{i}")
    ok = all(r.as_expected for r in rows)
    print_summary(rows, title=f"specparity demo: the gate on the bundled tiny models ({wall:.1f} s, the three "
                  "scenarios run concurrently)", color=color)
    print(f"Full reports (text, JSON, HTML, JUnit): {args.reports}/scenario-<#>" + ("" if args.verbose else "; -v (make: DEMO_ARGS=-v) prints them here"))
    if not ok:
        print("!!! " + ", ".join(f"scenario {i}" for i, r in enumerate(rows, 1) if not r.as_expected)
              + " did not end as expected")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
