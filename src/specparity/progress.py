"""Progress bars for long work (an engine start, prefill, atlas, replay), drawn by rich on a terminal.

``Progress`` is a callback: pass it where a ``progress(done, total)`` callable is expected (the
serving child reports ``@@specparity-progress DONE TOTAL`` after each phase; serving/child/process.py). It
draws a rich progress bar on an interactive terminal, naming the phase under way, and stays silent
otherwise (CI logs, pipes, files, ``TERM=dumb``), so logs never fill with partial bars. rich is
imported only when a bar is drawn.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from types import TracebackType
from typing import Any, TextIO

# What is under way while ``done`` phases have finished (serving/sglang/since_0_5_11/core.py:237,296,311:
# progress(1, ...) after start-up, (2, ...) after the fc-input prefill, (3, 3) after the atlas).
PHASES: tuple[str, ...] = ("start-up", "prefill", "atlas", "replay")


def stream_is_interactive(stream: TextIO) -> bool:
    """True when ``stream`` is a terminal that can redraw a line (not ``TERM=dumb``)."""
    if os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):  # a closed stream
        return False


def phase(done: int, total: int, phases: Sequence[str] = PHASES) -> str:
    """The phase under way after ``done`` of ``total`` steps: ``start-up`` at 0, ..., ``done`` at the end."""
    if done >= total:
        return "done"
    return phases[done] if 0 <= done < len(phases) else f"step {done + 1} of {total}"


class Progress:
    """``Progress(total, label)``; call ``progress(done)`` or ``progress(done, total)`` as work advances.

    ``enabled=None`` (the default) draws only when ``stream`` is an interactive terminal; ``True`` or
    ``False`` force it. ``NO_COLOR`` does not disable the bar (rich draws it without colour);
    ``TERM=dumb`` does. Use as a context manager, or call :meth:`close`, to end the bar.
    ``auto_refresh=False`` redraws only on updates (tests).
    """

    def __init__(
        self,
        total: int,
        label: str,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        phases: Sequence[str] = PHASES,
        auto_refresh: bool = True,
    ) -> None:
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self.total = total
        self.label = label
        self.phases = tuple(phases)
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = stream_is_interactive(self.stream) if enabled is None else enabled
        self.done = 0
        self._auto_refresh = auto_refresh
        self._bar: Any = None  # rich.progress.Progress, started on the first update
        self._task: Any = None

    def description(self) -> str:
        """``gate: prefill``: the label and the phase under way."""
        return f"{self.label}: {phase(self.done, self.total, self.phases)}"

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        console = Console(file=self.stream, force_terminal=True, force_interactive=True)
        self._bar = RichProgress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True,
                                 auto_refresh=self._auto_refresh)
        self._bar.start()
        self._task = self._bar.add_task(self.description(), total=self.total)

    def __call__(self, done: int, total: int | None = None) -> None:
        """Record progress; redraw when enabled."""
        if total is not None:
            self.total = total
        self.done = done
        if not self.enabled:
            return
        if self._bar is None:
            self._start()
        self._bar.update(self._task, completed=max(0, min(done, self.total)), total=self.total,
                         description=self.description())
        if not self._auto_refresh:
            self._bar.refresh()

    def advance(self, step: int = 1) -> None:
        """``progress(done + step)``."""
        self(self.done + step)

    def close(self) -> None:
        """Stop the bar (it clears itself); nothing is written if it never drew."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
