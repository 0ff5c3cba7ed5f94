"""One pytest item's failure text: the verdict's summary, its fix and the findings on the item, in the terminal's
own lines (``terminal.py``); which findings are on an item is the verdict's rule (``verdict/rules.py``)."""

from __future__ import annotations

from specparity.report.terminal import chunk_lines, finding_lines, fix_text, summary_line
from specparity.verdict import Verdict
from specparity.verdict.rules import item_findings


def item_report(verdict: Verdict, check: str, *, probe: int | None = None) -> str | None:
    """The failure text of one pytest item, or None when it passes (no error finding is on it).

    Its first line is the verdict's summary line, which for a failing item is FAIL or ERROR, never
    PASS (an error finding makes the verdict fail); the ``Fix:`` line follows only then.
    """
    mine = item_findings(verdict.findings, check, probe)
    if not mine:
        return None
    lines = [summary_line(verdict), f"Fix: {fix_text(verdict)}"]
    if check == "capture":
        lines += chunk_lines(verdict.chunks)
        if probe is not None and probe < len(verdict.probes):
            p = verdict.probes[probe]
            lines.append(f"probe {probe} ({p.get('tokens')} tokens): max|d| {p.get('max_abs_err')}")
    lines += finding_lines(mine)
    return "\n".join(lines)
