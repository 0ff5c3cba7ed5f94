"""The chunk-by-boundary similarity heatmap, drawn with matplotlib (Agg, no pyplot, no global state).

Columns are the target's residual-stream boundaries (``embedding``, ``layer:<i>``, ...), rows the
fc-input chunks as served and as recorded at training time. Each cell is the mean per-token cosine
of that chunk against that boundary, on a 0..1 viridis scale with a colour bar; NaN is grey. In each
row a red frame marks the best-matching boundary and a white dashed frame the one the contract
expects for that chunk. The figure widens with the number of boundaries, so every boundary keeps a
readable label at 62 and more (past :data:`MAX_LABELLED_COLUMNS` every n-th boundary is labelled,
plus every expected and best one).

matplotlib is imported when a heatmap is drawn, never when :mod:`specparity.report` is imported.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specparity.verdict import Heatmap, Verdict

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 100
COLUMN_WIDTH_IN = 0.14  # at DPI 100: 14 px per boundary, room for a vertical 7 pt label
ROW_HEIGHT_IN = 0.32
MIN_WIDTH_IN = 6.4
MAX_LABELLED_COLUMNS = 120
BEST_COLOUR = "#e00000"
EXPECTED_COLOUR = "#ffffff"
NAN_COLOUR = "#a0a0a0"
X_LABEL = "residual-stream boundary of the target"
Y_LABEL = "fc-input chunk (served, then recorded)"
COLOUR_BAR_LABEL = "mean per-token cosine"
_ROW_CHUNK = re.compile(r"(\d+)\s*$")


@dataclass(frozen=True)
class HeatmapMarks:
    """Per row: the column of the best match and of the expected boundary (None when unknown)."""

    best: tuple[int | None, ...]
    expected: tuple[int | None, ...]


def marks(heatmap: Heatmap, expected_layout: Sequence[str | None] = ()) -> HeatmapMarks:
    """Best column per row (largest finite cosine) and the contract's column for the row's chunk.

    A row label ending in a number (``served 2``, ``recorded 2``) is chunk 2, which the contract
    expects at ``expected_layout[2]``.
    """
    columns = list(heatmap.columns)
    best: list[int | None] = []
    expected: list[int | None] = []
    for r, row in enumerate(heatmap.values):
        finite = [(float(v), c) for c, v in enumerate(row) if not math.isnan(float(v))]
        best.append(max(finite)[1] if finite else None)
        label = heatmap.rows[r] if r < len(heatmap.rows) else ""
        m = _ROW_CHUNK.search(label)
        source = expected_layout[int(m.group(1))] if m and int(m.group(1)) < len(expected_layout) else None
        expected.append(columns.index(source) if source in columns else None)
    return HeatmapMarks(tuple(best), tuple(expected))


def labelled_columns(ncols: int, keep: Sequence[int | None] = ()) -> list[int]:
    """Which columns get a tick label: all up to MAX_LABELLED_COLUMNS, else every n-th plus ``keep``."""
    if ncols <= MAX_LABELLED_COLUMNS:
        return list(range(ncols))
    step = math.ceil(ncols / MAX_LABELLED_COLUMNS * 2)
    return sorted(set(range(0, ncols, step)) | {k for k in keep if k is not None} | {ncols - 1})


def figure_size(nrows: int, ncols: int) -> tuple[float, float]:
    """(width, height) in inches: a fixed margin for labels and the colour bar, plus per-cell room."""
    longest = 9  # "layer:123" in 7 pt, vertical
    return (max(MIN_WIDTH_IN, 2.6 + COLUMN_WIDTH_IN * ncols), 1.5 + 0.07 * longest + ROW_HEIGHT_IN * nrows)


def heatmap_figure(heatmap: Heatmap, expected_layout: Sequence[str | None] = ()) -> Figure:
    """The heatmap as a matplotlib Figure (Agg canvas); ``expected_layout`` places the expected marks."""
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    values = np.array([[float(v) for v in row] for row in heatmap.values], dtype=float).reshape(
        len(heatmap.values), len(heatmap.columns))
    nrows, ncols = values.shape
    rows = [heatmap.rows[i] if i < len(heatmap.rows) else f"row {i}" for i in range(nrows)]
    m = marks(heatmap, expected_layout)
    fig = Figure(figsize=figure_size(nrows, ncols), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    cmap = colormaps["viridis"].with_extremes(bad=NAN_COLOUR)
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, norm=Normalize(0.0, 1.0), aspect="auto",
                      interpolation="nearest")
    shown = labelled_columns(ncols, [*m.best, *m.expected])
    ax.set_xticks(shown, [str(heatmap.columns[c]) for c in shown], rotation=90, fontsize=7 if ncols > 24 else 9)
    ax.set_yticks(range(nrows), rows, fontsize=9)
    ax.set_xlabel(X_LABEL)
    ax.set_ylabel(Y_LABEL)
    ax.tick_params(axis="x", length=2, pad=2)
    ax.set_xticks(np.arange(-0.5, ncols, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, nrows, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=0.6 if ncols <= 80 else 0.3)
    ax.tick_params(which="minor", length=0)
    for r in range(nrows):
        exp, best = m.expected[r], m.best[r]
        if exp is not None:
            ax.add_patch(Rectangle((exp - 0.38, r - 0.38), 0.76, 0.76, fill=False, edgecolor=EXPECTED_COLOUR,
                                   linewidth=1.4, linestyle=(0, (2, 1)), gid=f"expected-{r}-{exp}"))
        if best is not None:
            ax.add_patch(Rectangle((best - 0.5, r - 0.5), 1.0, 1.0, fill=False, edgecolor=BEST_COLOUR,
                                   linewidth=2.0, antialiased=False, gid=f"best-{r}-{best}"))
    bar = fig.colorbar(image, ax=ax, fraction=0.04 if ncols > 30 else 0.06, pad=0.01)
    bar.set_label(COLOUR_BAR_LABEL)
    handles = [Line2D([], [], color=BEST_COLOUR, linewidth=2, label="best match"),
               Line2D([], [], color="#444444", linewidth=1.4, linestyle=(0, (2, 1)), label="expected (contract)"),
               Line2D([], [], marker="s", linestyle="", markersize=8, markerfacecolor=NAN_COLOUR,
                      markeredgecolor=NAN_COLOUR, label="not a number")]
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.01), ncols=3, fontsize=8, frameon=False,
              borderaxespad=0.0)
    return fig


def _save(fig: Figure, fmt: str, **kw: Any) -> bytes:
    import matplotlib

    buf = io.BytesIO()
    # fixed hash salt and no date: the same verdict always gives the same bytes
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "specparity"}):
        fig.savefig(buf, format=fmt, dpi=DPI, **kw)
    return buf.getvalue()


def heatmap_png(heatmap: Heatmap, expected_layout: Sequence[str | None] = ()) -> bytes:
    """The heatmap as PNG bytes (embedded in the HTML report)."""
    return _save(heatmap_figure(heatmap, expected_layout), "png", metadata={"Software": None})


def heatmap_svg(heatmap: Heatmap, expected_layout: Sequence[str | None] = ()) -> str:
    """The heatmap as SVG text, labels kept as text (written into ``--report`` dirs as heatmap.svg)."""
    return _save(heatmap_figure(heatmap, expected_layout), "svg", metadata={"Date": None}).decode("utf-8")


def verdict_heatmap(verdict: Verdict) -> Heatmap | None:
    """The verdict's heatmap when it has cells to draw."""
    hm = verdict.heatmap
    return hm if hm is not None and hm.values and hm.columns else None


def expected_layout(verdict: Verdict) -> list[str | None]:
    """What the contract expects per chunk, for the expected marks."""
    if verdict.chunks:
        return [c.expected for c in sorted(verdict.chunks, key=lambda c: c.index)]
    return list(verdict.expected_layout)
