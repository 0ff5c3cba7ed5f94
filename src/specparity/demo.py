"""``make demo``: the gate on the bundled tiny models, healthy and with two real failure modes.

1. healthy: the drafter served as trained (``layer:1, layer:3, layer:5``): PASS.
2. the Kimi-K2.5 bug: a draft config whose ids ``[-1, 1, 3]`` make SGLang serve the embedding plus
   layers (an id of -1 under SGLang's +1 rule): FAIL with ``extra_embedding`` and the fix.
3. the silent rewrite: ``speculative_num_draft_tokens=16`` with topk 1 is served as ``steps + 1``:
   FAIL with ``spec_config_rewritten`` and the fix.

The three gates run concurrently (each SGLang runs in its own child process); the reports are
printed in order. Exit 0 when every scenario ends as expected.
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
from specparity.verdict import Verdict

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Scenario:
    title: str
    draft: Path
    sglang_args: dict[str, object]
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


def _ends_as_expected(s: Scenario, v: Verdict) -> bool:
    return v.status == s.expect_status and (s.expect_kind is None or any(f.kind.value == s.expect_kind
                                                                         for f in v.findings))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specparity.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contract", type=Path, default=REPO / "contracts" / "tiny-llama-eagle3.json")
    parser.add_argument("--bundle", type=Path, default=REPO / "fixtures" / "default")
    parser.add_argument("--level", default="all", choices=["static", "capture", "outcome", "all"])
    parser.add_argument("--reports", type=Path, default=None, help="write JSON/HTML/JUnit reports per scenario here")
    args = parser.parse_args(argv)
    if not (args.bundle / "target" / "config.json").is_file() or not args.contract.is_file():
        print(f"specparity demo: bundled example not found under {args.bundle} / {args.contract}", file=sys.stderr)
        return 2
    color = use_color(sys.stdout)
    with tempfile.TemporaryDirectory(prefix="specparity-demo-") as tmp:
        todo = scenarios(args.bundle, Path(tmp))
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=len(todo)) as pool:
            futures = [pool.submit(run_gate, args.contract, args.bundle / "target", s.draft, sglang_args=s.sglang_args,
                                   level=args.level) for s in todo]
            verdicts = [f.result() for f in futures]
        wall = time.perf_counter() - t0
    ok = True
    for i, (s, v) in enumerate(zip(todo, verdicts, strict=True), 1):
        print(f"=== {i}. {s.title}  (expected: {s.expect_status.upper()}"
              f"{' with ' + s.expect_kind if s.expect_kind else ''})")
        print(render_text(v, color=color))
        if args.reports is not None:
            write_reports(v, args.reports / f"scenario-{i}")
        if not _ends_as_expected(s, v):
            ok = False
            print(f"!!! scenario {i} did not end as expected (got {v.status})")
    print(f"=== gate time for the three scenarios: {wall:.1f} s (run concurrently)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
