"""One reading of an engine's speculative-decoding metrics, and the acceptance of a window between two readings.

**Two definitions of acceptance** are in use, and they give different numbers for the same deployment:

- *pooled* over draft tokens: Σaccepted / Σproposed over every verify step of the window, as vLLM and SGLang count
  it (vLLM's ``vllm:spec_decode_*`` counters, SGLang's ``spec_accept_length`` over its log interval). Long requests
  weigh more. **The verdict uses this one**: it is what the engine's counters give, and the contract's replay figures
  are pooled the same way (over scored tokens, ``replay/acceptance.py``).
- *mean of per-request means*: each request's own acceptance length, averaged over requests with equal weight, as
  SpecForge's ``bench_eagle3`` reports it. No engine's ``/metrics`` carries it; it is reported when the figures of
  single requests are at hand (:mod:`~specparity.watch.load`: the canary's own requests, which vLLM answers with
  ``metrics.speculative_decoding`` under ``--per-request-spec-decode-metrics summary`` and SGLang with
  ``spec_tokens_details``).

**Intervals.** The pooled acceptance rate (accepted / proposed draft tokens) gets a 95% Wilson interval
(:func:`~specparity.replay.acceptance.wilson_interval`), mapped to acceptance length as 1 + rate x draft tokens per
step; each position's rate Δaccepted_at_position / Δdrafts gets its own. Draft tokens of one verify step are not
independent trials, so the interval is narrower than the truth; the band's floor (``band.py``) sits far enough
below the reference that sampling noise alone does not reach it. A gauge (SGLang before 0.5.14) carries no counts:
its window is the engine's own (``decode_log_interval`` decode steps), it gets no interval, and the window says so.

**Idle** is its own state: a window in which no draft was verified (no Δdrafts; for a gauge, no Δgeneration_tokens)
has no acceptance at all, never acceptance 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specparity.intervals import wilson_interval
from specparity.serving.live.metrics import Scrape
from specparity.watch.engines import MetricSet

POOLED = "pooled over draft tokens (vLLM's and SGLang's counters)"
PER_REQUEST = "mean of per-request means (SpecForge's bench_eagle3)"


def sample_names(text: str, *, declared: bool = True) -> set[str]:
    """Every metric name a Prometheus text exposition carries a sample of, and (``declared``) every name it declares
    with ``# TYPE`` (a labelled family with no label set written yet has no sample)."""
    out: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE ") and declared:
            parts = line.split()
            if len(parts) >= 3:
                out.add(parts[2])
        elif line and not line.startswith("#"):
            out.add(line.split("{", 1)[0].split(" ", 1)[0])
    return out


def select(text: str, names: Iterable[str]) -> Scrape:
    """Only the sample lines of ``names``, parsed with Prometheus' own parser (``serving/live/metrics.py``): a vLLM
    ``/metrics`` is ~100 KB of histograms, of which the watcher needs a dozen lines."""
    wanted = set(names)
    kept = [line for line in text.splitlines()
            if line and not line.startswith("#") and line.split("{", 1)[0].split(" ", 1)[0] in wanted]
    return Scrape.parse("\n".join(kept) + "\n") if kept else Scrape({})


def _mean(scrape: Scrape, name: str | None) -> float | None:
    rows = scrape.samples.get(name or "")
    return None if not rows else sum(v for _, v in rows) / len(rows)


@dataclass(frozen=True)
class Reading:
    """Cumulative counters (and the gauges' current values) at time ``t`` (monotonic seconds)."""

    t: float
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted: float | None = None
    per_position: tuple[float, ...] = ()
    verify_calls: float | None = None
    generation_tokens: float | None = None
    gauge_length: float | None = None
    gauge_rate: float | None = None
    num_steps: float | None = None

    @classmethod
    def of(cls, scrape: Scrape, metrics: MetricSet, t: float) -> Reading:
        per_pos: tuple[float, ...] = ()
        if metrics.accepted_per_pos:
            by_pos = scrape.by_label(metrics.accepted_per_pos, "position")
            per_pos = tuple(by_pos[k] for k in sorted(by_pos, key=int))
        return cls(t=t, drafts=scrape.total(metrics.drafts or ""), draft_tokens=scrape.total(metrics.draft_tokens or ""),
                   accepted=scrape.total(metrics.accepted or ""), per_position=per_pos,
                   verify_calls=scrape.total(metrics.verify_calls or ""),
                   generation_tokens=scrape.total(metrics.generation_tokens or ""),
                   gauge_length=_mean(scrape, metrics.accept_length_gauge),
                   gauge_rate=_mean(scrape, metrics.accept_rate_gauge),
                   num_steps=_mean(scrape, metrics.num_steps_gauge))


def _delta(new: float | None, old: float | None) -> float:
    """A counter's increase; a counter that went down was reset (the server restarted): its new value is the increase,
    as Prometheus' ``increase()`` reads a reset."""
    n, o = new or 0.0, old or 0.0
    return n - o if n >= o else n


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def to_list(self) -> list[float]:
        return [round(self.low, 6), round(self.high, 6)]


@dataclass(frozen=True)
class WindowAcceptance:
    """Acceptance over one window, pooled (the verdict's) and, when single requests' figures are at hand, the mean
    of per-request means."""

    seconds: float
    source: str  # "counters" | "gauge"
    drafts: float = 0.0  # verify steps with a draft
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position_accepted: tuple[float, ...] = ()
    generated_tokens: float = 0.0
    gauge_length: float | None = None
    gauge_rate: float | None = None
    steps_per_draft: float | None = None  # draft tokens per verify step (k)
    per_request: tuple[float, ...] = field(default=())  # acceptance lengths of single requests finished in the window

    @property
    def idle(self) -> bool:
        if self.source == "gauge":
            return self.generated_tokens <= 0 or self.gauge_length is None
        return self.drafts <= 0

    @property
    def k(self) -> float:
        if self.steps_per_draft:
            return self.steps_per_draft
        return self.draft_tokens / self.drafts if self.drafts > 0 else 0.0

    @property
    def length(self) -> float | None:
        """Acceptance length, pooled: 1 + Σaccepted / Σdrafts (the gauge's value for a gauge)."""
        if self.idle:
            return None
        if self.source == "gauge":
            return self.gauge_length
        return 1.0 + self.accepted / self.drafts

    @property
    def rate(self) -> float | None:
        """Pooled acceptance rate: Σaccepted / Σproposed draft tokens."""
        if self.idle:
            return None
        if self.source == "gauge":
            if self.gauge_rate is not None:
                return self.gauge_rate
            return (self.gauge_length - 1.0) / self.k if self.gauge_length is not None and self.k else None
        return self.accepted / self.draft_tokens if self.draft_tokens > 0 else None

    @property
    def rate_interval(self) -> Interval | None:
        if self.idle or self.source == "gauge" or self.draft_tokens <= 0:
            return None
        lo, hi = wilson_interval(round(self.accepted), round(self.draft_tokens))
        return Interval(lo, hi)

    @property
    def length_interval(self) -> Interval | None:
        ri = self.rate_interval
        return None if ri is None else Interval(1.0 + ri.low * self.k, 1.0 + ri.high * self.k)

    @property
    def per_position(self) -> tuple[float, ...]:
        """Pooled acceptance at each draft position (accepted there and at every earlier one), vLLM only."""
        if self.idle or not self.per_position_accepted:
            return ()
        return tuple(a / self.drafts for a in self.per_position_accepted)

    @property
    def per_position_interval(self) -> tuple[Interval, ...]:
        if self.idle:
            return ()
        return tuple(Interval(*wilson_interval(round(a), round(self.drafts))) for a in self.per_position_accepted)

    @property
    def per_request_mean(self) -> float | None:
        return sum(self.per_request) / len(self.per_request) if self.per_request else None

    def to_dict(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 6)

        li, ri = self.length_interval, self.rate_interval
        return {
            "seconds": round(self.seconds, 3), "source": self.source, "idle": self.idle,
            "drafts": round(self.drafts), "draft_tokens": round(self.draft_tokens), "accepted": round(self.accepted),
            "generated_tokens": round(self.generated_tokens),
            "pooled": {"definition": POOLED, "acceptance_length": r(self.length),
                       "acceptance_length_interval95": li.to_list() if li else None,
                       "acceptance_rate": r(self.rate), "acceptance_rate_interval95": ri.to_list() if ri else None,
                       "per_position": [r(a) for a in self.per_position],
                       "per_position_interval95": [i.to_list() for i in self.per_position_interval]},
            "per_request_mean": {"definition": PER_REQUEST, "acceptance_length": r(self.per_request_mean),
                                 "requests": len(self.per_request)},
        }


def window(new: Reading, old: Reading, metrics: MetricSet, *, per_request: Sequence[float] = (),
           num_steps: int | None = None) -> WindowAcceptance:
    """The acceptance between two readings of the same server. ``num_steps`` (the contract's) gives SGLang's draft
    tokens per verify step where its ``spec_num_steps`` gauge is absent."""
    seconds = max(0.0, new.t - old.t)
    gen = _delta(new.generation_tokens, old.generation_tokens)
    if metrics.source == "gauge":
        k = new.num_steps or num_steps
        return WindowAcceptance(seconds, "gauge", generated_tokens=gen, gauge_length=new.gauge_length,
                                gauge_rate=new.gauge_rate, steps_per_draft=float(k) if k else None,
                                per_request=tuple(per_request))
    if metrics.engine == "vllm":
        n = len(new.per_position)
        old_pp = old.per_position if len(old.per_position) == n else (0.0,) * n
        reset = (new.drafts or 0.0) < (old.drafts or 0.0)
        pp = tuple(a if reset else _delta(a, b) for a, b in zip(new.per_position, old_pp, strict=True))
        return WindowAcceptance(seconds, "counters", drafts=_delta(new.drafts, old.drafts),
                                draft_tokens=_delta(new.draft_tokens, old.draft_tokens),
                                accepted=_delta(new.accepted, old.accepted), per_position_accepted=pp,
                                generated_tokens=gen, per_request=tuple(per_request))
    # SGLang's counters: Δgeneration_tokens / Δverify_calls is the pooled acceptance length of the requests that
    # finished in the window; each verify step proposes k draft tokens (spec_num_steps, or the contract's)
    verify = _delta(new.verify_calls, old.verify_calls)
    k = float(new.num_steps or num_steps or 0) or None
    accepted = max(0.0, gen - verify)
    return WindowAcceptance(seconds, "counters", drafts=verify, draft_tokens=verify * (k or 0.0), accepted=accepted,
                            generated_tokens=gen, steps_per_draft=k, per_request=tuple(per_request))


def reading_counts(r: Reading) -> Mapping[str, Any]:
    """A reading's counters, for a baseline file's record of what it was taken from."""
    return {"drafts": r.drafts, "draft_tokens": r.draft_tokens, "accepted": r.accepted,
            "per_position": list(r.per_position), "verify_calls": r.verify_calls,
            "generation_tokens": r.generation_tokens}
