"""The polling loop: one read of ``/metrics`` every ``interval_s``, a sliding window of ``window_s`` over the readings,
the band's judgement of each window, and a streak of consecutive ``below`` windows that becomes an alert.

Memory is bounded whatever the run's length: the readings of one window (a deque), the last ``history`` windows'
lengths for the sparkline, and at most :data:`~specparity.watch.load.MAX_REQUESTS_KEPT` per-request figures.
An idle window ends a streak, as an empty result resets a Prometheus alert's ``for`` (the rules agree with watch).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from specparity.errors import EnvironmentProblem
from specparity.serving.live.server import ServerError
from specparity.watch.band import BELOW, IDLE, Band
from specparity.watch.engines import MetricSet, detect, engine_of, missing_message
from specparity.watch.load import PromptLoad
from specparity.watch.window import Reading, WindowAcceptance, sample_names, select, window

HISTORY = 30


class MetricsSource(Protocol):
    url: str

    def text(self, path: str, *, timeout_s: float | None = None) -> str: ...


@dataclass(frozen=True)
class WindowResult:
    """One judged window."""

    index: int
    wall_time: float
    acceptance: WindowAcceptance
    state: str
    streak: int  # consecutive below windows, this one included
    alert: bool  # the streak has reached the watcher's ``windows``


@dataclass
class Watcher:
    """Watches one server. :meth:`poll` reads once and returns the window ending now (None on the first read)."""

    source: MetricsSource
    band: Band
    engine: str | None = None
    window_s: float = 60.0
    interval_s: float = 10.0
    windows: int = 3
    history: int = HISTORY
    load: PromptLoad | None = None
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    metrics: MetricSet | None = None
    waiting: str | None = None  # why no metric set is known yet (SGLang before its first finished request)
    _readings: deque[Reading] = field(default_factory=deque, repr=False)
    first: Reading | None = None
    last: Reading | None = None
    lengths: deque[float | None] = field(default_factory=deque, repr=False)
    index: int = 0
    polls: int = 0
    streak: int = 0
    alerted: bool = False
    counts: dict[str, int] = field(default_factory=lambda: {"idle": 0, "inside": 0, "below": 0})

    def __post_init__(self) -> None:
        self._readings = deque(maxlen=max(2, math.ceil(self.window_s / self.interval_s) + 1))
        self.lengths = deque(maxlen=self.history)

    def _scrape(self) -> str:
        try:
            return self.source.text("/metrics", timeout_s=max(5.0, self.interval_s))
        except ServerError as e:
            raise EnvironmentProblem(f"cannot read {self.source.url}/metrics: {e}") from None

    def _resolve(self, text: str) -> None:
        names = sample_names(text)
        engine = self.engine or engine_of(names)
        if engine == "sglang":
            # SGLang's exporter (multiprocess mode) shows a labelled family only once a value is written: before its
            # first finished request nothing tells a server with speculative decoding from one without, nor 0.5.14's
            # verify counter from an older release's gauges; so only samples count, after that first request
            names = sample_names(text, declared=False)
            if "sglang:generation_tokens_total" not in names:
                self.waiting = "SGLang exports its speculative-decoding metrics after the first finished request"
                return
        row = detect(names, engine) if engine else None
        if row is None:
            raise EnvironmentProblem(missing_message(engine, names, self.source.url))
        self.metrics, self.engine, self.waiting = row, row.engine, None

    def poll(self) -> WindowResult | None:
        text = self._scrape()
        now = self.clock()
        self.polls += 1
        if self.metrics is None:
            self._resolve(text)
        elif self.metrics.source == "gauge" and "sglang:spec_verify_calls_total{" in text:
            self.metrics = None  # a finished request with verify steps showed 0.5.14's counter: read the counters
            self._readings.clear()
            self._resolve(text)
        if self.metrics is not None:
            reading = Reading.of(select(text, self.metrics.names), self.metrics, now)
            self._readings.append(reading)
            self.first = self.first or reading
            self.last = reading
        metrics = self.metrics
        if metrics is None or len(self._readings) < 2:
            # nothing to compare yet: the first read, or SGLang before its first finished request (idle)
            return None if self.polls == 1 else self._judge(WindowAcceptance(self.interval_s, "counters"))
        old, new = self._readings[0], self._readings[-1]
        per_req = self.load.between(old.t, new.t) if self.load else ()
        return self._judge(window(new, old, metrics, per_request=per_req, num_steps=self.band.num_steps))

    def _judge(self, w: WindowAcceptance) -> WindowResult:
        state = self.band.judge(w)
        self.streak = self.streak + 1 if state == BELOW else 0
        alert = self.streak >= self.windows
        self.alerted = self.alerted or alert
        self.counts[state] += 1
        self.lengths.append(None if state == IDLE else w.length)
        self.index += 1
        return WindowResult(self.index, self.wall(), w, state, self.streak, alert)

    def total(self) -> WindowAcceptance | None:
        """The whole run pooled: the first reading with counters to the last (None before two)."""
        if self.first is None or self.last is None or self.metrics is None or self.last is self.first:
            return None
        per_req = [v for _, v in self.load.figures] if self.load else []
        return window(self.last, self.first, self.metrics, per_request=per_req, num_steps=self.band.num_steps)

    def run(self, *, duration_s: float | None, on_window: Callable[[WindowResult], Any],
            sleep: Callable[[float], None] = time.sleep, first_done: bool = False) -> None:
        """Poll every ``interval_s`` until ``duration_s`` (None: until interrupted); ``first_done``: the caller has
        made the first read already."""
        start = self.clock()
        ticks = 0
        if not first_done:
            self.poll()
        while duration_s is None or self.clock() - start < duration_s - 1e-6:
            ticks += 1
            target = start + ticks * self.interval_s
            if duration_s is not None:
                target = min(target, start + duration_s)
            sleep(max(0.0, target - self.clock()))
            result = self.poll()
            if result is not None:
                on_window(result)
