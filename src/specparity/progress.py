"""A tiny progress bar for long work (capture over many probes), drawn only on a terminal.

``Progress`` is a callback: pass it where a ``progress(done, total)`` callable is expected. It draws
one self-overwriting line (``\\r``) on an interactive terminal and stays silent otherwise (CI logs,
pipes, files), so logs never fill with partial bars.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

BAR_WIDTH = 24
_MIN_INTERVAL_S = 0.1  # redraw at most ten times a second, except for the final update


def stream_is_interactive(stream: TextIO) -> bool:
    """True when ``stream`` is a terminal that can redraw a line (not ``TERM=dumb``)."""
    if os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):  # a closed stream
        return False


class Progress:
    """``Progress(total, label)``; call ``progress(done)`` or ``progress(done, total)`` as work advances.

    ``enabled=None`` (the default) draws only when ``stream`` is an interactive terminal; ``True`` or
    ``False`` force it. ``NO_COLOR`` does not disable the bar (it draws no colour); ``TERM=dumb`` does.
    Use as a context manager, or call :meth:`close`, to end the line.
    """

    def __init__(
        self,
        total: int,
        label: str,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self.total = total
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = stream_is_interactive(self.stream) if enabled is None else enabled
        self.done = 0
        self._clock = clock
        self._last_draw: float | None = None
        self._drawn = False
        self._width = 0

    def line(self) -> str:
        """The bar as text, e.g. ``capture [############------------] 2/4``."""
        frac = 1.0 if self.total == 0 else min(1.0, max(0.0, self.done / self.total))
        filled = round(frac * BAR_WIDTH)
        return f"{self.label} [{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {self.done}/{self.total}"

    def __call__(self, done: int, total: int | None = None) -> None:
        """Record progress; redraw when enabled (rate-limited, but always at the end)."""
        if total is not None:
            self.total = total
        self.done = done
        if not self.enabled:
            return
        now = self._clock()
        final = self.done >= self.total
        if not final and self._last_draw is not None and now - self._last_draw < _MIN_INTERVAL_S:
            return
        self._last_draw = now
        text = self.line()
        pad = " " * max(0, self._width - len(text))  # erase a longer previous line
        self._width = len(text)
        self.stream.write("\r" + text + pad)
        self.stream.flush()
        self._drawn = True

    def advance(self, step: int = 1) -> None:
        """``progress(done + step)``."""
        self(self.done + step)

    def close(self) -> None:
        """End the bar's line (only if one was drawn)."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
