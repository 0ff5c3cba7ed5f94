"""The progress bar (rich): drawn on a terminal naming the phase under way, silent in logs and pipes."""

from __future__ import annotations

import io
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specparity.progress import PHASES, Progress, phase, stream_is_interactive

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def screen(tty: io.StringIO) -> str:
    return ANSI.sub("", tty.getvalue())


@pytest.fixture(autouse=True)
def _terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)


def test_draws_each_phase_on_a_terminal_and_clears_at_the_end() -> None:
    tty = FakeTTY()
    with Progress(3, "gate", stream=tty, auto_refresh=False) as progress:
        progress(0, 3)
        assert "gate: start-up" in screen(tty) and "0/3" in screen(tty)
        progress(1, 3)
        assert "gate: prefill" in screen(tty) and "1/3" in screen(tty)
        progress(2, 3)
        assert "gate: atlas" in screen(tty)
        progress(3, 3)
        assert "gate: done" in screen(tty) and "3/3" in screen(tty)
        drawn = len(tty.getvalue())
    assert len(tty.getvalue()) > drawn  # stop() clears the transient bar


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
    assert Progress(1, "x", stream=FakeTTY()).enabled is False
    monkeypatch.setenv("TERM", "xterm")
    forced = io.StringIO()  # not a terminal, drawn anyway
    with Progress(1, "x", stream=forced, enabled=True, auto_refresh=False) as p:
        p(1)
    assert "x: done" in screen(forced)
    off = FakeTTY()
    Progress(1, "x", stream=off, enabled=False)(1)
    assert off.getvalue() == ""


def test_no_color_still_draws_the_bar_without_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    tty = FakeTTY()
    with Progress(2, "gate", stream=tty, auto_refresh=False) as p:
        p(1, 2)
        assert "gate: prefill" in screen(tty)
    assert not re.search(r"\x1b\[[0-9;]*3[0-9]m", tty.getvalue())  # no foreground colour codes


def test_closed_stream_is_not_interactive() -> None:
    class Closed(io.StringIO):
        def isatty(self) -> bool:
            raise ValueError("I/O operation on closed file")

    assert not stream_is_interactive(Closed())


def test_advance_and_new_totals() -> None:
    p = Progress(10, "p", stream=io.StringIO())
    p(4)
    p.advance()
    assert p.done == 5 and p.description() == "p: step 6 of 10"
    p(1, 2)
    assert (p.total, p.description()) == (2, "p: prefill")


def test_close_without_drawing_writes_nothing() -> None:
    tty = FakeTTY()
    Progress(5, "p", stream=tty).close()
    assert tty.getvalue() == ""
    with pytest.raises(ValueError):
        Progress(-1, "p", stream=tty)


@given(total=st.integers(0, 50), done=st.integers(-5, 60))
def test_phase_names_for_any_progress(total: int, done: int) -> None:
    name = phase(done, total)
    if done >= total:
        assert name == "done"
    elif 0 <= done < len(PHASES):
        assert name == PHASES[done]
    else:
        assert name == f"step {done + 1} of {total}"


def test_the_gate_hands_its_progress_to_every_level_that_starts_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    import specparity.gate as gate
    from specparity.serving.engine import get_engine

    class Called(Exception):
        pass

    class Engine:
        name, label = "sglang", "SGLang"

        def spec_args(self, *values: int | None) -> dict[str, object]:
            return get_engine("sglang").spec_args(*values)

        def capture(self, *_a: object, **kw: object) -> None:
            raise Called(kw.get("progress"))

    monkeypatch.setattr(gate, "get_engine", lambda name: Engine())
    root = Path(__file__).resolve().parents[2]
    bar = Progress(3, "gate", stream=io.StringIO())
    for level in ("capture", "outcome", "all"):
        with pytest.raises(Called) as got:
            gate.run_gate(root / "contracts" / "tiny-llama-eagle3.json", root / "fixtures" / "default" / "target",
                          root / "fixtures" / "default" / "draft", level=level, progress=bar)
        assert got.value.args[0] is bar, level
