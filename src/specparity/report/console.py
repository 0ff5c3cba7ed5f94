"""The terminal report drawn by rich: the same lines as :func:`specparity.report.terminal.render_lines`
(the house failure shape), styled: the verdict word, a chunk that serves the wrong source, each
finding's severity, notes. Colour on a terminal; plain text in CI logs, pipes and files, and under
``NO_COLOR`` or ``TERM=dumb`` (rich's own detection). Lines are never wrapped or cropped, so a log
holds exactly the plain text.

rich is imported when a report is styled, never when :mod:`specparity.report` is imported.
"""

from __future__ import annotations

import io
import re
import sys
from typing import TYPE_CHECKING, TextIO

from specparity.compare.findings import Severity
from specparity.verdict import Verdict

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

STATUS_STYLE = {"PASS": "bold green", "FAIL": "bold red", "ERROR": "bold yellow"}
SEVERITY_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
_CHUNK = re.compile(r"chunk (\d+): served (\S+)")


def styled_lines(verdict: Verdict) -> list[Text]:
    """The report's lines as rich Text; ``Text.plain`` of each is exactly the plain line."""
    from rich.text import Text

    from specparity.report.terminal import render_lines

    chunks = {c.index: c for c in verdict.chunks}
    out: list[Text] = []
    for line in render_lines(verdict):
        text = Text(line)
        word = line.split(" ", 1)[0]
        if out == [] and word in STATUS_STYLE:
            text.stylize(STATUS_STYLE[word], 0, len(word))
        elif line.startswith(("Fix: ", "Spec config: ", "Outcome: ", "Measured with: ", "Stand-ins active: ")):
            text.stylize("bold", 0, line.index(":") + 1)
        elif line.startswith("Note: "):
            text.stylize("dim")
        elif m := _CHUNK.match(line):
            c = chunks.get(int(m.group(1)))
            if c is not None:
                text.stylize("green" if c.served == c.expected else "bold red", m.start(2), m.end(2))
        else:
            for sev, style in SEVERITY_STYLE.items():
                if line.startswith(sev.value.ljust(7) + " "):
                    text.stylize(style, 0, len(sev.value))
                    break
        out.append(text)
    return out


def console(stream: TextIO | None = None, *, color: bool | None = None) -> Console:
    """A rich Console for reports: no wrapping, no markup or highlighting; ``color`` None = detect."""
    from rich.console import Console

    return Console(file=stream if stream is not None else sys.stdout, force_terminal=color,
                   no_color=None if color is None else not color, color_system="standard" if color else "auto",
                   highlight=False, markup=False, emoji=False, soft_wrap=True, width=100_000 if color else None)


def print_verdict(verdict: Verdict, stream: TextIO | None = None, *, color: bool | None = None) -> None:
    """Print the terminal report to ``stream`` (default stdout); colour only on a terminal."""
    c = console(stream, color=color)
    for text in styled_lines(verdict):
        c.print(text, soft_wrap=True, crop=False, overflow="ignore")


def ansi_text(verdict: Verdict) -> str:
    """The terminal report with ANSI colours, as a string (``render_text(color=True)``)."""
    buf = io.StringIO()
    print_verdict(verdict, buf, color=True)
    return buf.getvalue()


def use_color(stream: TextIO) -> bool:
    """Whether rich would colour ``stream``: a terminal, ``NO_COLOR`` unset, ``TERM`` not dumb."""
    try:
        c = console(stream)
        return bool(c.is_terminal and not c.is_dumb_terminal and not c.no_color and c.color_system)
    except (AttributeError, ValueError, OSError):
        return False
