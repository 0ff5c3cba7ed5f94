"""The HTML report: one self-contained file (no scripts, no external resources), from one Jinja2
template (report/templates/report.html) with autoescape on.

It holds the verdict banner, the fix (and its JSON patch), the fc-input chunk table, the
chunk-by-boundary cosine heatmap drawn by matplotlib (:mod:`specparity.report.heatmap`) as an
embedded PNG, every finding, the outcome table, the probe samples, the environment and the
plain-text report. This module only shapes the verdict into rows; the template lays them out.
"""

from __future__ import annotations

import base64
import io
import json
import math
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from specparity.compare.findings import engine_label
from specparity.report.environment import environment_rows
from specparity.report.heatmap import expected_layout, heatmap_png, verdict_heatmap
from specparity.report.layout import layout_rows
from specparity.report.terminal import (
    DIAGNOSIS_TEXT,
    fix_text,
    fmt_cosine,
    fmt_num,
    note_lines,
    render_text,
    spec_config_line,
    summary_line,
)
from specparity.verdict import Heatmap, OutcomeSummary, Verdict

if TYPE_CHECKING:
    from jinja2 import Environment

TEMPLATE = "report.html"
Row = tuple[list[str], bool]  # (cells, is_bad)


@lru_cache(maxsize=1)
def _environment() -> Environment:
    from jinja2 import Environment, PackageLoader, StrictUndefined

    return Environment(loader=PackageLoader("specparity.report", "templates"), autoescape=True,
                       undefined=StrictUndefined, keep_trailing_newline=True)


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) of PNG bytes, read by Pillow."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return int(im.size[0]), int(im.size[1])


def _heatmap_context(heatmap: Heatmap, expected: Sequence[str | None]) -> dict[str, Any]:
    data = heatmap_png(heatmap, expected)
    width, height = png_size(data)
    labels = [heatmap.rows[i] if i < len(heatmap.rows) else f"row {i}" for i in range(len(heatmap.values))]
    return {
        "png_b64": base64.b64encode(data).decode("ascii"), "width": width, "height": height,
        "nrows": len(heatmap.values), "ncols": len(heatmap.columns),
        "headers": ["chunk", *heatmap.columns], "numeric": range(1, len(heatmap.columns) + 1),
        "rows": [([label, *(fmt_cosine(float(v)) for v in row)], False)
                 for label, row in zip(labels, heatmap.values, strict=True)],
    }


def _outcome_context(outcome: OutcomeSummary) -> dict[str, Any]:
    n = max(len(outcome.recorded_acceptance), len(outcome.served_acceptance), len(outcome.expected_acceptance or ()))

    def row(label: str, values: Sequence[float] | None) -> Row:
        vals = list(values or ())
        return [label] + [f"{vals[i]:.2f}" if i < len(vals) else "" for i in range(n)], False

    rows = [row("recorded fc input", outcome.recorded_acceptance), row("served fc input", outcome.served_acceptance)]
    if outcome.expected_acceptance is not None:
        rows.append(row("expected (training)", outcome.expected_acceptance))
    return {"diagnosis": DIAGNOSIS_TEXT.get(outcome.diagnosis, outcome.diagnosis),
            "headers": ["acceptance at draft position", *(str(i) for i in range(n))], "rows": rows,
            "numeric": range(1, n + 1), "recorded_length": f"{outcome.recorded_acceptance_length:.2f}",
            "served_length": f"{outcome.served_acceptance_length:.2f}"}


def _probe_cell(value: object) -> str:
    if isinstance(value, float):
        return fmt_num(value)
    return str(value if value is not None else "")


def _no_heatmap_reason(verdict: Verdict) -> str:
    if verdict.status == "error":
        return f"{engine_label(verdict.engine)} failed before any tensor was captured"
    return f"no tensors were captured at level {verdict.level}"


def report_context(verdict: Verdict) -> dict[str, Any]:
    """Everything the template shows, as plain strings and rows (the template escapes them)."""
    word, _, rest = summary_line(verdict).partition(" ")
    fix = None
    if verdict.status != "pass":
        patch = verdict.fix.json_patch if verdict.fix is not None else ()
        fix = {"summary": fix_text(verdict), "file": verdict.fix.file if verdict.fix is not None else None,
               "patch": json.dumps([dict(op) for op in patch], indent=2) if patch else ""}
    chunks: list[Row] = [
        ([str(c.index), c.served or ("unknown" if c.captured else "not captured"), c.expected or "(none)",
          c.recorded or "", fmt_cosine(c.cosine),
          fmt_num(c.max_abs_err), fmt_num(c.min_passing_atol) if c.min_passing_atol is not None else ""],
         c.served != c.expected)
        for c in verdict.chunks
    ]
    heatmap = verdict_heatmap(verdict)
    probes = None
    if verdict.probes:
        keys = list(dict.fromkeys(str(k) for p in verdict.probes for k in p))
        probes = {"headers": keys, "rows": [([_probe_cell(p.get(k)) for k in keys], p.get("status") not in
                                             (None, "pass")) for p in verdict.probes]}
    run = [
        ("contract", verdict.contract_name), ("contract hash", verdict.contract_hash or "n/a"),
        ("level", verdict.level), ("target architecture", verdict.target_architecture or "n/a"),
        ("draft", verdict.draft_path or "n/a"), ("expected layout", ", ".join(verdict.expected_layout)),
        ("served layout", "n/a" if verdict.served_layout is None
         else ", ".join(s or "unknown" for s in verdict.served_layout)),
    ] + [(f"time: {k}", f"{v:.2f} s" if math.isfinite(v) else str(v)) for k, v in verdict.timings.items()]
    return {
        "word": word, "headline": rest.strip(), "status": verdict.status, "contract_name": verdict.contract_name,
        "fix": fix,
        "spec_config": spec_config_line(verdict.resolved_spec_config) if verdict.resolved_spec_config is not None
        else None,
        "chunks": chunks,
        "heatmap": _heatmap_context(heatmap, expected_layout(verdict)) if heatmap is not None else None,
        "no_heatmap_reason": _no_heatmap_reason(verdict),
        "findings": [{"severity": f.severity.value, "kind": f.kind.value, "chunk": "" if f.chunk is None else f.chunk,
                      "message": f.message, "fix": f.fix or "", "failure": f.is_failure} for f in verdict.findings],
        "notes": [n for n in note_lines(verdict) if "fix.json_patch" not in n],  # the patch is shown above
        "outcome": _outcome_context(verdict.outcome) if verdict.outcome is not None else None,
        "probes": probes,
        "environment": [([k, v], False) for k, v in environment_rows(verdict)],
        "layout": [([k, v], "missing" in v) for k, v in layout_rows(verdict)],
        "run": [([k, str(v)], False) for k, v in run],
        "text_report": render_text(verdict),
    }


def render_html(verdict: Verdict) -> str:
    """The whole report as one self-contained HTML document."""
    return _environment().get_template(TEMPLATE).render(report_context(verdict))
