"""The terminal report drawn by rich: its home is :mod:`specparity.report.terminal`, beside the plain lines it
styles (:func:`~specparity.report.terminal.render_lines`); the names stay importable from here."""

from __future__ import annotations

from specparity.report.terminal import SEVERITY_STYLE as SEVERITY_STYLE
from specparity.report.terminal import STATUS_STYLE as STATUS_STYLE
from specparity.report.terminal import ansi_text as ansi_text
from specparity.report.terminal import console as console
from specparity.report.terminal import print_verdict as print_verdict
from specparity.report.terminal import styled_lines as styled_lines
from specparity.report.terminal import use_color as use_color
