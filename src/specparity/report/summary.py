"""Several gate runs in one table: how ``make demo`` and ``make demo-real`` end.

One row per scenario: what it is, what it should end as, the verdict and its exit code, the finding that names it,
the drafter's first-draft acceptance (on the recorded and on the served fc input, and in the engine's own loop
where it ran), the outcome's cause (wiring: the serving path; model: the drafter itself) and tokens per second where
they were measured. A row may be a measurement alone (tok/s with no
speculation). Drawn by rich: colour on a terminal, plain text in logs and pipes; cells are never cut.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from specparity.report.terminal import STATUS_STYLE
from specparity.verdict import Verdict

if TYPE_CHECKING:
    from rich.table import Table

NONE = "-"
SCENARIO_WIDTH = 48  # a longer scenario folds inside its cell


@dataclass(frozen=True)
class SummaryRow:
    """One line of the summary table; text cells as printed. ``as_expected`` None: a measurement, nothing expected."""

    scenario: str
    expected: str = NONE
    verdict: str = NONE
    exit_code: int | None = None
    finding: str = NONE
    acceptance: str = NONE
    engine_loop: str = NONE
    cause: str = NONE
    tok_s: float | None = None
    as_expected: bool | None = None


# the outcome's diagnosis (replay/outcome.py) as the table says it, and the legend printed under the table
CAUSE = {"healthy": "healthy", "wiring": "wiring", "model_quality": "model", "inconclusive": "inconclusive"}
CAUSE_LEGEND = ("cause: wiring = the engine feeds fc other inputs than training recorded (the serving path, not the "
                "model); model = the drafter accepts little even on its recorded inputs (the model, not the wiring)")


def verdict_row(scenario: str, verdict: Verdict, *, expect_status: str, expect_kinds: Sequence[str] = (),
                tok_s: float | None = None) -> SummaryRow:
    """The row of one gate run that should end as ``expect_status`` naming every kind in ``expect_kinds``."""
    kinds = [f.kind.value for f in verdict.errors]
    named = [k for k in expect_kinds if k in kinds] or kinds[:1]
    more = len(set(kinds) - set(named))
    finding = NONE if not named else ", ".join(named) + (f" (+{more} more)" if more else "")
    o = verdict.outcome
    acceptance = engine_loop = NONE
    if o is not None and o.recorded_acceptance and o.served_acceptance:
        acceptance = f"{o.recorded_acceptance[0]:.1%} / {o.served_acceptance[0]:.1%}"
    if o is not None and o.engine_loop and o.engine_loop.get("per_position"):
        engine_loop = " ".join(f"{a:.0%}" for a in o.engine_loop["per_position"])
        judged = o.engine_loop.get("server_acceptance") or {}
        if judged.get("floor") and judged.get("reference"):  # a live server's own figure, judged against the band
            engine_loop += (f" ({judged['state']}: floor {judged['floor'][0]:.0%} of the {judged['reference_from']}'s "
                            f"{judged['reference'][0]:.0%})")
    cause = CAUSE.get(o.diagnosis, o.diagnosis) if o is not None else NONE
    expected = expect_status.upper() + (f": {', '.join(expect_kinds)}" if expect_kinds else "")
    ok = verdict.status == expect_status and all(k in kinds for k in expect_kinds)
    return SummaryRow(scenario=scenario, expected=expected, verdict=verdict.status.upper(),
                      exit_code=verdict.exit_code, finding=finding, acceptance=acceptance, engine_loop=engine_loop,
                      cause=cause, tok_s=tok_s, as_expected=ok)


def summary_table(rows: Sequence[SummaryRow]) -> Table:
    """The rich table of ``rows``; the engine-loop, cause and tok/s columns only when some row has them."""
    from rich.table import Table
    from rich.text import Text

    loop = any(r.engine_loop != NONE for r in rows)
    cause = any(r.cause != NONE for r in rows)
    tok_s = any(r.tok_s is not None for r in rows)
    table = Table()
    table.add_column("#", justify="right")
    table.add_column("scenario", max_width=SCENARIO_WIDTH, overflow="fold")
    for header in ("expected", "verdict"):
        table.add_column(header)
    table.add_column("exit", justify="right")
    table.add_column("finding")
    table.add_column("acceptance\nrecorded / served")
    if loop:
        table.add_column("engine loop\nper position")
    if cause:
        table.add_column("cause")
    if tok_s:
        table.add_column("tok/s", justify="right")
    table.add_column("as\nexpected")
    for i, r in enumerate(rows, 1):
        cells: list[str | Text] = [str(i), r.scenario, r.expected, Text(r.verdict, style=STATUS_STYLE.get(r.verdict, "")),
                                   NONE if r.exit_code is None else str(r.exit_code), r.finding, r.acceptance]
        if loop:
            cells.append(r.engine_loop)
        if cause:
            cells.append(r.cause)
        if tok_s:
            cells.append(NONE if r.tok_s is None else f"{r.tok_s:.1f}")
        cells.append(Text(NONE) if r.as_expected is None
                     else Text("yes", style="green") if r.as_expected else Text("NO", style="bold red"))
        table.add_row(*cells)
    return table


def print_summary(rows: Sequence[SummaryRow], *, title: str, stream: TextIO | None = None, color: bool = False) -> None:
    """Print ``title`` and the summary table to ``stream`` (default stdout), in colour when ``color``: on a terminal
    as wide as the terminal (a long cell folds), elsewhere as wide as its cells."""
    from rich.console import Console
    from rich.text import Text

    table = summary_table(rows)
    out = stream if stream is not None else sys.stdout
    terminal = Console(file=out)
    width = terminal.width if terminal.is_terminal else Console(file=io.StringIO(), width=10_000).measure(table).maximum
    console = Console(file=out, force_terminal=color, no_color=not color, color_system="standard" if color else None,
                      highlight=False, markup=False, emoji=False, width=width)
    console.print(Text(title, style="bold"), soft_wrap=True)
    console.print(table)
    if any(r.cause not in (NONE, "healthy") for r in rows):
        console.print(CAUSE_LEGEND, soft_wrap=True)
