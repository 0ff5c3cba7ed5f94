"""SIGTERM, SIGINT, SIGHUP and SIGKILL to a real ``specparity gate`` on the bundled tiny models, at four points of the
run: while the engine is imported, while SGLang loads the model, while it captures, and while the reports are
written (the points are src/specparity/testpoints.py's; the run waits there until the signal comes).

A Hypothesis state machine drives which signal meets which point, run after run: each step is one gate run, drawn
from the points and signals not yet used, so every example pairs each point with one signal and uses every signal
once. A step that finds something wrong records it and the machine goes on (every run is independent, and a failing
example replayed by Hypothesis would cost its runs again); the test fails after the machine with every problem
found. Its first example is Hypothesis's simplest (the lists' orders); the cold and the warm machines order their
signals the opposite way, so one CI run meets each point with two signals and each signal at two points (8 runs).
``SPECPARITY_FAULT_EXAMPLES=N`` adds random pairings (each example is 4 more runs, ~1-2 minutes).

The runs signalled at engine import, model load and capture are ``--level capture``; the one signalled while its
reports are written is ``--level static`` (the same writing of the same three faces, without a capture's minute).

Cold: the engine child is a new interpreter. Warm (``SPECPARITY_WARM_START=1``): the child is forked from a zygote
that imports SGLang, which is where the engine import happens then.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from tests.faults.fault_runs import SIGNALS, Run, expected_code, gate_argv, report_paths

pytestmark = [pytest.mark.faults, pytest.mark.sglang, pytest.mark.slow]

POINTS = ("engine_import", "model_load", "capture", "report_write")
EXAMPLES = int(os.environ.get("SPECPARITY_FAULT_EXAMPLES", "1"))


class Interrupts(RuleBasedStateMachine):
    """One gate run per step, cut short at a point by a signal; nothing of any run is left after it."""

    base: Path
    warm: bool
    signals: tuple[signal.Signals, ...]
    runs = 0
    problems: list[str]

    def __init__(self) -> None:
        super().__init__()
        self.points_left = list(POINTS)
        self.signals_left = list(self.signals)
        self.done: list[Run] = []

    @rule(data=st.data())
    def interrupt(self, data: st.DataObject) -> None:
        point = data.draw(st.sampled_from(self.points_left or POINTS), label="point")
        sig = data.draw(st.sampled_from(self.signals_left or self.signals), label="signal")
        for left, item in ((self.points_left, point), (self.signals_left, sig)):
            if item in left:
                left.remove(item)
        type(self).runs += 1
        root = self.base / f"run-{type(self).runs}-{point}-{sig.name}"
        reports = root / "reports"
        level = "static" if point == "report_write" else "capture"
        run = Run(root, gate_argv(level=level, reports=reports), name=root.name, warm=self.warm, pause_at=point,
                  reports=report_paths(reports))
        try:
            run.start()
            took = run.wait_point()
            run.signal(sig)
            code = run.wait()
            print(f"{root.name} ({'warm' if self.warm else 'cold'}): {point} reached after {took:.1f} s; exit {code}")
            assert code == expected_code(sig), f"{root.name}: exit {code}, expected {expected_code(sig)}\n{run.output()}"
            if sig != signal.SIGKILL:
                assert f"specparity: interrupted by {sig.name}" in run.stderr, run.output()
                assert "Traceback" not in run.stderr, run.output()
            run.check_clean()
            run.check_reports(code)
        except AssertionError as e:
            self.problems.append(str(e))
            run.kill()
        self.done.append(run)

    @invariant()
    def nothing_of_an_earlier_run_came_back(self) -> None:
        for run in self.done[:-1]:
            try:
                run.check_clean()
            except AssertionError as e:
                self.problems.append(f"after a later run: {e}")


def _machine(base: Path, *, warm: bool, signals: tuple[signal.Signals, ...]) -> type[Interrupts]:
    return type("WarmInterrupts" if warm else "ColdInterrupts", (Interrupts,),
                {"base": base, "warm": warm, "signals": signals, "runs": 0, "problems": []})


SETTINGS = settings(max_examples=EXAMPLES, stateful_step_count=len(POINTS), deadline=None, database=None,
                    phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))


def _run(machine: type[Interrupts]) -> None:
    run_state_machine_as_test(machine, settings=SETTINGS)
    assert machine.runs == len(POINTS) * EXAMPLES
    assert not machine.problems, "\n\n".join(machine.problems)


def test_signals_on_a_cold_child(tmp_path: Path) -> None:
    _run(_machine(tmp_path, warm=False, signals=SIGNALS))


def test_signals_on_a_warm_child(tmp_path: Path) -> None:
    _run(_machine(tmp_path, warm=True, signals=tuple(reversed(SIGNALS))))
