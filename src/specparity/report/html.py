"""The HTML report: one self-contained file (no scripts, no external resources).

It holds the verdict banner, the fix (and its JSON patch), the fc-input chunk table, the
chunk-by-boundary cosine heatmap as an embedded PNG (encoded by :mod:`specparity.report.png`), every
finding, the outcome table, the probe samples and the plain-text report. All text is escaped.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable, Sequence
from html import escape

from specparity.report import png
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

HEATMAP_CELL_HEIGHT = 28
_HEATMAP_TARGET_WIDTH = 640  # px; cells shrink (down to 10 px) for deep targets so the image stays readable

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d1d1f;background:#fff}
main{max-width:1100px;margin:0 auto;padding:0 16px 32px}
.banner{padding:14px 16px;color:#fff;margin:0 0 12px}
.banner h1{margin:0;font-size:26px;letter-spacing:.05em}
.banner p{margin:4px 0 0;font-size:15px}
.pass{background:#1e7d32}.fail{background:#b3261e}.error{background:#8a5a00}
h2{font-size:17px;margin:22px 0 8px;border-bottom:1px solid #ddd;padding-bottom:3px}
table{border-collapse:collapse;font-size:13px}
th,td{border:1px solid #d0d0d0;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3}
td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.bad td{background:#fdecea}
code,pre{font:12.5px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:#f6f8fa;padding:8px;overflow-x:auto;border:1px solid #e1e4e8}
.sev-error{color:#b3261e;font-weight:600}.sev-warning{color:#8a5a00;font-weight:600}.sev-info{color:#1558b0}
.hm{display:grid;gap:0;align-items:end;justify-content:start}
.hm img{image-rendering:pixelated;display:block}
.cols{display:flex;padding-left:1px}
.cols span{writing-mode:vertical-rl;transform:rotate(180deg);font-size:10px;line-height:1;
 white-space:nowrap;overflow:hidden;text-align:left;padding-bottom:3px}
.rows{display:flex;flex-direction:column;padding-top:1px;padding-right:6px}
.rows span{font-size:11px;white-space:nowrap;text-align:right;display:flex;align-items:center;justify-content:flex-end}
.axis{font-size:12px;color:#555}
.scale{display:flex;align-items:center;gap:6px;margin-top:8px;font-size:12px}
.scale img{border:1px solid #999}
.muted{color:#666}
"""


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def _data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _table(headers: Sequence[str], rows: Iterable[tuple[Sequence[str], bool]], *, table_id: str,
           numeric: Sequence[int] = ()) -> str:
    """Rows are (already escaped cells, is_bad)."""
    out = [f'<table id="{table_id}"><thead><tr>' + "".join(f"<th>{_e(h)}</th>" for h in headers) + "</tr></thead><tbody>"]
    for cells, bad in rows:
        tds = "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(cells))
        out.append(f'<tr class="bad">{tds}</tr>' if bad else f"<tr>{tds}</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def heatmap_cell_width(ncols: int) -> int:
    """Pixel width of one heatmap cell for ``ncols`` boundaries."""
    return max(10, min(48, _HEATMAP_TARGET_WIDTH // max(1, ncols)))


def heatmap_png(heatmap: Heatmap) -> bytes:
    """The heatmap as PNG bytes: one cell per (chunk row, boundary column), best match framed in red."""
    values = [[float(v) for v in row] for row in heatmap.values]
    pixels = png.heatmap_pixels(values, cell_width=heatmap_cell_width(len(heatmap.columns)),
                                cell_height=HEATMAP_CELL_HEIGHT)
    return png.encode_png(pixels)


def _heatmap_section(verdict: Verdict) -> str:
    head = "<h2>Chunk-by-boundary similarity</h2>"
    heatmap = verdict.heatmap
    if heatmap is None or not heatmap.values or not heatmap.columns:
        why = ("SGLang failed before any tensor was captured" if verdict.status == "error"
               else f"no tensors were captured at level {verdict.level}")
        return f'<section id="heatmap-section">{head}<p class="muted">No heatmap: {_e(why)}.</p></section>'
    data = heatmap_png(heatmap)
    width, height = png.png_size(data)
    cw = heatmap_cell_width(len(heatmap.columns))
    cols = "".join(f'<span style="width:{cw}px">{_e(c)}</span>' for c in heatmap.columns)
    labels = [heatmap.rows[i] if i < len(heatmap.rows) else f"row {i}" for i in range(len(heatmap.values))]
    rows = "".join(f'<span style="height:{HEATMAP_CELL_HEIGHT}px">{_e(r)}</span>' for r in labels)
    img = (f'<img id="heatmap" alt="chunk-by-boundary similarity heatmap" width="{width}" height="{height}" '
           f'data-rows="{len(heatmap.rows)}" data-columns="{len(heatmap.columns)}" src="{_data_uri(data)}">')
    scale = png.encode_png(png.colour_scale_pixels(width=200, height=14))
    values_rows = (([_e(label)] + [_e(fmt_cosine(v)) for v in row], False)
                   for label, row in zip(labels, heatmap.values, strict=True))
    values_table = _table(["chunk", *heatmap.columns], values_rows, table_id="heatmap-values",
                          numeric=range(1, len(heatmap.columns) + 1))
    return (
        f'<section id="heatmap-section">{head}'
        '<p class="axis">Rows: fc-input chunks (served by SGLang, and as recorded at training time). '
        "Columns: residual-stream boundaries of the target. Colour: mean per-token cosine; "
        "a red frame marks each row's best match.</p>"
        f'<div class="hm" style="grid-template-columns:auto {width}px">'
        f'<div></div><div class="cols">{cols}</div><div class="rows">{rows}</div>{img}</div>'
        f'<div class="scale"><span>cosine 0 (or below)</span><img id="colour-scale" alt="colour scale from '
        f'cosine 0 to 1" width="200" height="14" src="{_data_uri(scale)}"><span>1</span>'
        '<span class="muted">grey: not a number</span></div>'
        f"<details><summary>values</summary>{values_table}</details></section>"
    )


def _outcome_section(outcome: OutcomeSummary | None) -> str:
    if outcome is None:
        return ""
    n = max(len(outcome.recorded_acceptance), len(outcome.served_acceptance), len(outcome.expected_acceptance or ()))

    def row(label: str, values: Sequence[float] | None) -> tuple[list[str], bool]:
        vals = list(values or ())
        return [_e(label)] + [_e(f"{vals[i]:.2f}") if i < len(vals) else "" for i in range(n)], False

    rows = [row("recorded fc input", outcome.recorded_acceptance), row("served fc input", outcome.served_acceptance)]
    if outcome.expected_acceptance is not None:
        rows.append(row("expected (training)", outcome.expected_acceptance))
    table = _table(["acceptance at draft position", *(str(i) for i in range(n))], rows, table_id="outcome-table",
                   numeric=range(1, n + 1))
    return (
        f'<section id="outcome"><h2>Outcome</h2><p id="diagnosis">{_e(DIAGNOSIS_TEXT[outcome.diagnosis])}</p>{table}'
        f"<p>Acceptance length: recorded {outcome.recorded_acceptance_length:.2f}, "
        f"served {outcome.served_acceptance_length:.2f}</p></section>"
    )


def _probe_cell(value: object) -> str:
    if isinstance(value, float):
        return _e(fmt_num(value))
    return _e(value if value is not None else "")


def render_html(verdict: Verdict) -> str:
    """The whole report as one self-contained HTML document."""
    status = verdict.status
    summary = summary_line(verdict)
    word, _, rest = summary.partition(" ")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>specparity {_e(word)}: {_e(verdict.contract_name)}</title><style>{_CSS}</style></head><body>",
        f'<header id="verdict" class="banner {status}" data-status="{status}"><h1>{_e(word)}</h1>'
        f"<p>{_e(rest.strip())}</p></header><main>",
    ]
    if status != "pass":
        fix = f'<p id="fix-summary">{_e(fix_text(verdict))}</p>'
        if verdict.fix is not None and verdict.fix.json_patch:
            patch = json.dumps([dict(op) for op in verdict.fix.json_patch], indent=2)
            where = f" for <code>{_e(verdict.fix.file)}</code>" if verdict.fix.file else ""
            fix += f'<p>JSON patch (RFC 6902){where}:</p><pre id="json-patch">{_e(patch)}</pre>'
        parts.append(f'<section id="fix"><h2>Fix</h2>{fix}</section>')
    if verdict.resolved_spec_config is not None:
        parts.append(f'<section id="spec-config"><h2>Speculative settings</h2>'
                     f"<p>{_e(spec_config_line(verdict.resolved_spec_config))}</p></section>")
    if verdict.chunks:
        rows = (
            ([_e(c.index), _e(c.served or "unknown"), _e(c.expected or "(none)"), _e(c.recorded or ""),
              _e(fmt_cosine(c.cosine)), _e(fmt_num(c.max_abs_err)),
              _e(fmt_num(c.min_passing_atol) if c.min_passing_atol is not None else "")],
             c.served != c.expected)
            for c in verdict.chunks
        )
        parts.append('<section id="chunks"><h2>fc input chunks</h2>' + _table(
            ["chunk", "served", "expected", "recording matches", "cosine", "max|d|", "min passing atol"], rows,
            table_id="chunk-table", numeric=(0, 4, 5, 6)) + "</section>")
    parts.append(_heatmap_section(verdict))
    if verdict.findings:
        rows = (
            ([f'<span class="sev-{f.severity.value}">{_e(f.severity.value)}</span>', f"<code>{_e(f.kind.value)}</code>",
              _e("" if f.chunk is None else f.chunk), _e(f.message), _e(f.fix or "")], f.is_failure)
            for f in verdict.findings
        )
        parts.append(f'<section id="findings"><h2>Findings ({len(verdict.findings)})</h2>'
                     + _table(["severity", "kind", "chunk", "message", "fix"], rows, table_id="findings-table")
                     + "</section>")
    else:
        parts.append('<section id="findings"><h2>Findings (0)</h2><p class="muted">None.</p></section>')
    notes = [n for n in note_lines(verdict) if "fix.json_patch" not in n]  # the patch is shown above
    if notes:
        parts.append('<section id="notes"><h2>Notes</h2><ul>' + "".join(f"<li>{_e(n)}</li>" for n in notes)
                     + "</ul></section>")
    parts.append(_outcome_section(verdict.outcome))
    if verdict.probes:
        keys = list(dict.fromkeys(k for p in verdict.probes for k in p))
        rows = (([_probe_cell(p.get(k)) for k in keys], p.get("status") not in (None, "pass")) for p in verdict.probes)
        parts.append(f'<section id="probes"><h2>Probe samples ({len(verdict.probes)})</h2>'
                     + _table(keys, rows, table_id="probe-table") + "</section>")
    facts = [
        ("contract", verdict.contract_name), ("contract hash", verdict.contract_hash or "n/a"),
        ("level", verdict.level), ("sglang", verdict.sglang_version or "n/a"),
        ("target architecture", verdict.target_architecture or "n/a"), ("draft", verdict.draft_path or "n/a"),
        ("expected layout", ", ".join(verdict.expected_layout)),
        ("served layout", "n/a" if verdict.served_layout is None
         else ", ".join(s or "unknown" for s in verdict.served_layout)),
    ] + [(f"time: {k}", f"{v:.2f} s" if math.isfinite(v) else str(v)) for k, v in verdict.timings.items()]
    parts.append('<section id="run"><h2>Run</h2>' + _table(
        ["item", "value"], (([_e(k), _e(v)], False) for k, v in facts), table_id="run-table") + "</section>")
    parts.append(f'<section id="text-report"><h2>Text report</h2><pre>{_e(render_text(verdict))}</pre></section>')
    parts.append("</main></body></html>\n")
    return "\n".join(p for p in parts if p)
