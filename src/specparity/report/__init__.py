"""Reports: every face renders the same :class:`~specparity.verdict.Verdict`.

- :func:`render_text`: terminal, house failure shape (``report/terminal.py``)
- :func:`render_json`: the documented JSON report (``Verdict.to_dict``, docs/report-format.md)
- :func:`render_html`: one self-contained HTML file (Jinja2) with the matplotlib heatmap as an embedded PNG
- :func:`heatmap_svg`: the same heatmap as SVG (``heatmap.svg`` in a report directory)
- :func:`write_junit` / :func:`render_junit`: JUnit XML for CI test summaries
- :func:`write_reports`: the requested faces as files, whole or not at all; :func:`check_report_paths` checks their
  paths before the engine starts (``report/writing.py``)
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from specparity.report.heatmap import expected_layout, heatmap_svg, verdict_heatmap
from specparity.report.html import render_html
from specparity.report.junit import render_junit, write_junit
from specparity.report.terminal import render_text, use_color
from specparity.report.writing import ReportFile, ReportWriteError, check_report_path, write_files
from specparity.verdict import Verdict

__all__ = ["ReportWriteError", "check_report_path", "check_report_paths", "heatmap_svg", "render_html", "render_json",
           "render_junit", "render_text", "use_color", "write_junit", "write_reports"]


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


def check_report_paths(*, json_path: Path | None = None, html_path: Path | None = None,
                       junit_path: Path | None = None, directory: Path | None = None,
                       directory_option: str = "--parity-report") -> None:
    """Before the engine starts: each report path given can be written, else an InputError naming its option
    (``--json``, ``--html``, ``--junit``, ``directory_option`` for a report directory)."""
    for option, path in (("--json", json_path), ("--html", html_path), ("--junit", junit_path)):
        if path is not None:
            check_report_path(path, option=option)
    if directory is not None:
        check_report_path(directory, option=directory_option, directory=True)


def write_reports(
    verdict: Verdict,
    directory: Path | None = None,
    *,
    json_path: Path | None = None,
    html_path: Path | None = None,
    junit_path: Path | None = None,
) -> list[Path]:
    """Write the requested reports (parent folders created), all of them or none: each goes to a temporary file
    beside it and is renamed into place once every one is on disk (``report/writing.py``). A failure while writing
    is a :class:`ReportWriteError` (exit 3) naming the faces written and not written; no partial file is left.

    ``directory`` writes report.json, report.html, report.txt, junit.xml and, when the verdict has a
    heatmap, heatmap.svg there.
    """
    files: list[ReportFile] = []
    faces = {"json": "--json report", "html": "--html report", "junit": "--junit report"}
    if directory is not None:
        faces = {"json": "report.json", "html": "report.html", "junit": "junit.xml"}
        json_path = json_path or directory / "report.json"
        html_path = html_path or directory / "report.html"
        junit_path = junit_path or directory / "junit.xml"
        files.append(ReportFile("report.txt", directory / "report.txt", render_text(verdict)))
        heatmap = verdict_heatmap(verdict)
        if heatmap is not None:
            files.append(ReportFile("heatmap.svg", directory / "heatmap.svg",
                                    heatmap_svg(heatmap, expected_layout(verdict))))
    if json_path is not None:
        files.append(ReportFile(faces["json"], Path(json_path), render_json(verdict) + "\n"))
    if html_path is not None:
        files.append(ReportFile(faces["html"], Path(html_path), render_html(verdict)))
    if junit_path is not None:
        files.append(ReportFile(faces["junit"], Path(junit_path), render_junit(verdict)))
    return write_files(files)
