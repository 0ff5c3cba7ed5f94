"""The progress bar: drawn on a terminal, silent in logs and pipes."""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specparity.progress import BAR_WIDTH, Progress, stream_is_interactive


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def _terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")


def test_draws_on_a_terminal_and_ends_the_line() -> None:
    tty, clock = FakeTTY(), FakeClock()
    with Progress(4, "capture", stream=tty, clock=clock) as progress:
        for done in range(1, 5):
            clock.now += 1.0
            progress(done, 4)
    assert tty.getvalue() == (
        "\rcapture [######------------------] 1/4"
        "\rcapture [############------------] 2/4"
        "\rcapture [##################------] 3/4"
        "\rcapture [########################] 4/4\n"
    )


def test_silent_when_not_a_terminal() -> None:
    pipe = io.StringIO()
    with Progress(3, "capture", stream=pipe) as progress:
        for done in range(4):
            progress(done, 3)
    assert pipe.getvalue() == ""
    assert progress.enabled is False and progress.done == 3


def test_term_dumb_disables_and_enabled_forces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "dumb")
    assert not stream_is_interactive(FakeTTY())
    forced = io.StringIO()
    Progress(1, "x", stream=forced, enabled=True)(1)
    assert forced.getvalue() == "\rx [" + "#" * BAR_WIDTH + "] 1/1"
    off = FakeTTY()
    monkeypatch.setenv("TERM", "xterm")
    Progress(1, "x", stream=off, enabled=False)(1)
    assert off.getvalue() == ""


def test_closed_stream_is_not_interactive() -> None:
    class Closed(io.StringIO):
        def isatty(self) -> bool:
            raise ValueError("I/O operation on closed file")

    assert not stream_is_interactive(Closed())


def test_rate_limited_but_final_update_always_drawn() -> None:
    tty, clock = FakeTTY(), FakeClock()
    progress = Progress(100, "p", stream=tty, clock=clock)
    for done in range(1, 101):  # all at the same instant
        progress(done)
    assert tty.getvalue().count("\r") == 2  # the first update and the last
    assert tty.getvalue().endswith("100/100")


def test_shorter_line_erases_longer_one_and_advance() -> None:
    tty, clock = FakeTTY(), FakeClock()
    progress = Progress(10, "p", stream=tty, clock=clock)
    progress(10)
    clock.now += 1
    progress(1, 9)
    assert tty.getvalue().split("\r")[-1] == "p [###---------------------] 1/9  "  # two blanks erase "10/10"
    clock.now += 1
    progress.advance()
    assert progress.done == 2 and tty.getvalue().endswith("] 2/9")


def test_close_without_drawing_writes_nothing() -> None:
    tty = FakeTTY()
    Progress(5, "p", stream=tty).close()
    assert tty.getvalue() == ""
    with pytest.raises(ValueError):
        Progress(-1, "p", stream=tty)


@given(total=st.integers(0, 500), done=st.integers(-5, 600))
def test_bar_width_is_constant_for_any_progress(total: int, done: int) -> None:
    progress = Progress(total, "p", stream=io.StringIO())
    progress(done)
    bar = progress.line().split("[", 1)[1].split("]", 1)[0]
    assert len(bar) == BAR_WIDTH and set(bar) <= {"#", "-"}
    assert bar == "".join(sorted(bar))  # filled part first
