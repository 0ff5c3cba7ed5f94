"""The gate's result: one object that every face renders (terminal, JSON, HTML, JUnit, pytest).

A :class:`Verdict` is true when the deployment passes. Its JSON form (``to_dict``) is the
documented report format; keys are stable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from specparity.compare.findings import Finding, Severity
from specparity.errors import EXIT_ENVIRONMENT, EXIT_PARITY_FAILURE, EXIT_PASS

Status = Literal["pass", "fail", "error"]
Level = Literal["static", "capture", "outcome", "all"]


# ChunkReport's JSON keys, in report order: every field, by its own name (verdict_from_dict reads them back)
_CHUNK_REPORT_KEYS = ("index", "expected", "served", "recorded", "cosine", "max_abs_err", "min_passing_atol",
                      "separation", "runner_up", "rel_err_p99", "rel_err_max", "unit_roundoff",
                      "recorded_separation")


@dataclass(frozen=True)
class ChunkReport:
    """One fc-input chunk: what the contract expects there and what SGLang really served."""

    index: int
    expected: str | None
    served: str | None  # attributed source; None = unknown (no atlas boundary matched)
    cosine: float | None = None  # served vs recorded chunk, mean per-token cosine
    max_abs_err: float | None = None  # served vs recorded chunk
    recorded: str | None = None  # what the recorded training chunk attributes to
    min_passing_atol: float | None = None
    # identity and drift margins (compare/tolerances.py): served chunk's relative error to its best boundary
    # over the runner-up's, and per-token relative error to the recorded chunk (p99, max; multiply out of
    # ``unit_roundoff`` of the coarser dtype for units)
    separation: float | None = None
    runner_up: str | None = None
    rel_err_p99: float | None = None
    rel_err_max: float | None = None
    unit_roundoff: float | None = None
    recorded_separation: float | None = None

    @property
    def captured(self) -> bool:
        """Whether this chunk was captured and compared (it carries measurements), not only expected or resolved."""
        return any(v is not None for v in (self.cosine, self.max_abs_err, self.separation, self.rel_err_p99))

    def to_dict(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in _CHUNK_REPORT_KEYS}


@dataclass(frozen=True)
class FixSuggestion:
    """The change that makes SGLang serve the contract's layout (or settings)."""

    summary: str  # one line, e.g. "set eagle_config.eagle_aux_hidden_state_layer_ids = [1, 3, 5] in d/config.json"
    file: str | None = None
    json_patch: Sequence[Mapping[str, Any]] = ()  # RFC 6902 ops on ``file``

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary, "file": self.file, "json_patch": [dict(op) for op in self.json_patch]}


@dataclass(frozen=True)
class Heatmap:
    """Mean cosine of each chunk (rows) against each atlas boundary (columns)."""

    rows: Sequence[str]  # e.g. "served 0", "recorded 0"
    columns: Sequence[str]  # canonical sources
    values: Sequence[Sequence[float]]

    def to_dict(self) -> dict[str, Any]:
        return {"rows": list(self.rows), "columns": list(self.columns), "values": [list(r) for r in self.values]}


@dataclass(frozen=True)
class OutcomeSummary:
    """Drafter acceptance on recorded vs captured fc inputs (filled by the outcome level)."""

    recorded_acceptance: Sequence[float]  # per draft position
    served_acceptance: Sequence[float]
    recorded_acceptance_length: float
    served_acceptance_length: float
    expected_acceptance: Sequence[float] | None
    diagnosis: Literal["healthy", "wiring", "model_quality", "inconclusive"]
    # first draft position: 95% Wilson interval over the scored tokens (replay.acceptance.wilson_interval)
    recorded_interval: tuple[float, float] | None = None
    served_interval: tuple[float, float] | None = None
    scored_tokens: int | None = None
    # the engine's own serving loop (vLLM's spec-decode counters): drafts, per_position, intervals (95% Wilson),
    # acceptance_length, engine, tensor_parallel_size; None where the engine reports none (SGLang)
    engine_loop: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "recorded_acceptance": list(self.recorded_acceptance),
            "served_acceptance": list(self.served_acceptance),
            "recorded_acceptance_length": self.recorded_acceptance_length,
            "served_acceptance_length": self.served_acceptance_length,
            "expected_acceptance": list(self.expected_acceptance) if self.expected_acceptance is not None else None,
            "diagnosis": self.diagnosis,
            "recorded_interval": list(self.recorded_interval) if self.recorded_interval is not None else None,
            "served_interval": list(self.served_interval) if self.served_interval is not None else None,
            "scored_tokens": self.scored_tokens,
            "engine_loop": dict(self.engine_loop) if self.engine_loop is not None else None,
        }


@dataclass(frozen=True)
class Verdict:
    contract_name: str
    contract_hash: str | None
    level: Level
    status: Status
    engine_version: str | None  # the release of ``engine`` that was checked
    target_architecture: str | None
    draft_path: str | None
    expected_layout: Sequence[str]
    served_layout: Sequence[str | None] | None
    chunks: Sequence[ChunkReport] = ()
    findings: Sequence[Finding] = ()
    fix: FixSuggestion | None = None
    resolved_spec_config: Mapping[str, Any] | None = None
    outcome: OutcomeSummary | None = None
    heatmap: Heatmap | None = None
    probes: Sequence[Mapping[str, Any]] = ()  # per probe sample: {"index", "tokens", "status", "max_abs_err"}
    timings: Mapping[str, float] = field(default_factory=dict)
    # what the SGLang child really ran on: python, sglang (+ path), torch, transformers, device
    environment: Mapping[str, str] = field(default_factory=dict)
    # stand-ins that were active in the child (docs/development.md "Stand-ins"), e.g. "sgl_kernel: copy_all_layer_kv_cache_cpu x3"
    stand_ins: Sequence[str] = ()
    engine: str = "sglang"  # the serving engine ("sglang" | "vllm")
    # the served layout (ResolvedDeployment.layout): engine, executor, TP/PP/DP/EP sizes, ranks expected and reported
    layout: Mapping[str, Any] = field(default_factory=dict)
    # the deploy command as given (redacted) and its engine's parse of it (serving/command/parse.py LaunchSpec.to_dict);
    # None when the deployment was given as --target/--draft/--engine-arg
    launch: Mapping[str, Any] | None = None
    # where the evidence came from when the gate checked a server (serving/live/capture.py LiveRun.to_dict): "launched" (the
    # user's command started by the gate, with what it added) or "attached" (--server URL); None: the gate's own child
    live: Mapping[str, Any] | None = None

    def __bool__(self) -> bool:
        return self.status == "pass"

    @property
    def exit_code(self) -> int:
        return {"pass": EXIT_PASS, "fail": EXIT_PARITY_FAILURE, "error": EXIT_ENVIRONMENT}[self.status]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.ERROR]

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.status,
            "contract": self.contract_name,
            "contract_hash": self.contract_hash,
            "level": self.level,
            "sglang_version": self.engine_version,  # engine_version's deprecated alias, removed in 0.2.0
            "engine": self.engine,
            "engine_version": self.engine_version,
            "target_architecture": self.target_architecture,
            "draft_path": self.draft_path,
            "expected_layout": list(self.expected_layout),
            "served_layout": list(self.served_layout) if self.served_layout is not None else None,
            "chunks": [c.to_dict() for c in self.chunks],
            "findings": [f.to_dict() for f in self.findings],
            "fix": self.fix.to_dict() if self.fix else None,
            "resolved_spec_config": dict(self.resolved_spec_config) if self.resolved_spec_config is not None else None,
            "outcome": self.outcome.to_dict() if self.outcome else None,
            "heatmap": self.heatmap.to_dict() if self.heatmap else None,
            "probes": [dict(p) for p in self.probes],
            "timings": dict(self.timings),
            "environment": dict(self.environment),
            "stand_ins": list(self.stand_ins),
            "layout": dict(self.layout),
            "launch": dict(self.launch) if self.launch is not None else None,
            "live": dict(self.live) if self.live is not None else None,
        }


def _finding_from_dict(d: Mapping[str, Any]) -> Finding:
    from specparity.compare.findings import FindingKind

    return Finding(
        kind=FindingKind(d["kind"]),
        severity=Severity(d["severity"]),
        message=str(d["message"]),
        chunk=d.get("chunk"),
        details=dict(d.get("details") or {}),
        fix=d.get("fix"),
    )


def verdict_from_dict(d: Mapping[str, Any]) -> Verdict:
    """Inverse of :meth:`Verdict.to_dict` (used to share one gate run between pytest-xdist workers)."""
    fix = d.get("fix")
    out = d.get("outcome")
    hm = d.get("heatmap")
    return Verdict(
        contract_name=d["contract"],
        contract_hash=d.get("contract_hash"),
        level=d["level"],
        status=d["verdict"],
        engine_version=d["engine_version"] if "engine_version" in d else d.get("sglang_version"),  # an older report
        target_architecture=d.get("target_architecture"),
        draft_path=d.get("draft_path"),
        expected_layout=list(d["expected_layout"]),
        served_layout=d.get("served_layout"),
        chunks=[ChunkReport(**c) for c in d.get("chunks", [])],
        findings=[_finding_from_dict(f) for f in d.get("findings", [])],
        fix=FixSuggestion(fix["summary"], fix.get("file"), fix.get("json_patch") or ()) if fix else None,
        resolved_spec_config=d.get("resolved_spec_config"),
        outcome=OutcomeSummary(**out) if out else None,
        heatmap=Heatmap(hm["rows"], hm["columns"], hm["values"]) if hm else None,
        probes=list(d.get("probes", [])),
        timings=dict(d.get("timings", {})),
        environment=dict(d.get("environment", {})),
        stand_ins=list(d.get("stand_ins", [])),
        engine=str(d.get("engine") or "sglang"),
        layout=dict(d.get("layout") or {}),
        launch=d.get("launch"), live=d.get("live"),
    )
