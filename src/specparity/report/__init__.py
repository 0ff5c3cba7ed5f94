"""Reports: every face renders the same :class:`~specparity.verdict.Verdict`.

- :func:`render_text`: terminal, house failure shape (``report/terminal.py``)
- :func:`render_json`: the documented JSON report (``Verdict.to_dict``, docs/report-format.md)
- :func:`render_html`: one self-contained HTML file with the heatmap as an embedded PNG
- :func:`write_junit` / :func:`render_junit`: JUnit XML for CI test summaries
"""

from __future__ import annotations

import json
import math
from typing import Any

from specparity.report.html import render_html
from specparity.report.junit import render_junit, write_junit
from specparity.report.terminal import render_text, use_color
from specparity.verdict import Verdict

__all__ = ["render_html", "render_json", "render_junit", "render_text", "use_color", "write_junit"]


def _finite(value: Any) -> Any:
    """Non-finite floats as strings (``"nan"``, ``"inf"``, ``"-inf"``), as in ``Finding.details``:
    ``json.dumps`` would otherwise write the bare ``NaN`` that strict JSON parsers reject."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def render_json(verdict: Verdict) -> str:
    """The JSON report: ``json.dumps(verdict.to_dict(), indent=2)`` (keys in docs/report-format.md).

    A cosine or error that is not finite (a NaN in the capture) is written as a string.
    """
    return json.dumps(_finite(verdict.to_dict()), indent=2, allow_nan=False)
