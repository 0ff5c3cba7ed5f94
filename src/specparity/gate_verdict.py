"""The gate's judgement of one run: what :func:`specparity.gate.run_gate` gathered (:class:`GateRun`) becomes one
:class:`~specparity.verdict.Verdict`: every finding (the engine's failures, the attribution's diagnosis, the deployed
files, the convention and layout rules, the outcome), each tagged with the check (pytest item) it fails, the chunks,
the fix, the status and the layout. Pure: no engine is started here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specparity.compare.agreement import static_capture_findings
from specparity.compare.attribution import AttributionTable
from specparity.compare.diagnosis import DeploymentFacts, ExpectedFacts, diagnose, layout_findings
from specparity.compare.findings import (
    Finding,
    FindingKind,
    Severity,
    adapter_findings,
    engine_label,
)
from specparity.compare.target import explained_by_partial_load, partial_load_findings
from specparity.compare.tolerances import Tolerance, tolerances_from_contract
from specparity.contract import Contract
from specparity.deployed import config_findings as _config_findings
from specparity.deployed import draft_facts as _draft_facts
from specparity.deployed import target_findings as _target_findings
from specparity.gate_live import launch_findings
from specparity.serving.command.parse import LaunchSpec
from specparity.serving.engine import convention_findings, get_engine
from specparity.serving.layout import served_layout as layout_of
from specparity.serving.results import ResolvedDeployment, ServingFailure
from specparity.verdict import ChunkReport, FixSuggestion, Heatmap, Level, OutcomeSummary, Verdict, rules


@dataclass
class GateRun:
    """What one gate run gathered, before it becomes a Verdict."""

    contract: Contract
    draft: Path
    deployment: ResolvedDeployment | None = None
    failures: tuple[ServingFailure, ...] = ()
    table: AttributionTable | None = None
    outcome: OutcomeSummary | None = None
    outcome_findings: tuple[Finding, ...] = ()
    # the layout the engine resolved for a capture that failed before any rank reported (vLLM), else empty
    requested_layout: dict[str, Any] = field(default_factory=dict)
    probes: tuple[Mapping[str, Any], ...] = ()
    fc_dtype: str | None = None  # served fc input (and the atlas, taken in the same forward)
    recorded_dtype: str | None = None
    atlas_dtype: str | None = None
    target: Path | None = None
    engine: str = "sglang"
    launch: LaunchSpec | None = None  # the deploy command the deployment came from (--launch)
    live: dict[str, Any] | None = None  # where the evidence came from: a server launched or attached (serving/live/capture.py)


def pair_tolerances(run: GateRun) -> tuple[tuple[Tolerance, dict[int | str, Tolerance]], ...]:
    """(served vs atlas, recorded vs atlas, served vs recorded): each the coarser dtype's (compare/tolerances.py)."""
    c = run.contract
    served = run.fc_dtype or c.fc_input.dtype
    recorded = run.recorded_dtype or c.fc_input.dtype
    atlas = run.atlas_dtype or served
    return (tolerances_from_contract(c.tolerances, dtype=served, other=atlas),
            tolerances_from_contract(c.tolerances, dtype=recorded, other=atlas),
            tolerances_from_contract(c.tolerances, dtype=served, other=recorded))


def _expected(contract: Contract) -> ExpectedFacts:
    d = contract.drafter
    return ExpectedFacts(
        name=contract.name, sources=tuple(contract.fc_input.sources), hidden_size=contract.target.hidden_size,
        norm_flags={"norm_before_fc": d.norm_before_fc, "fc_norm": d.fc_norm, "norm_output": d.norm_output},
        vocab_map_hash=d.vocab_map.d2t_sha256 if d.vocab_map else None,
    )


def _explain_unsupported_norms(findings: list[Finding], dep: ResolvedDeployment | None) -> list[Finding]:
    """A norm the contract needs but this SGLang's drafter cannot apply at all (D5: 0.4.10/0.5.3 build no
    norm modules) is said as such, with the version that can, instead of as a flag to flip."""
    if dep is None or not dep.unsupported_norms:
        return findings
    out = []
    for f in findings:
        flag = f.details.get("flag")
        if f.kind is FindingKind.NORM_MISMATCH and flag in dep.unsupported_norms and f.details.get("expected"):
            since = "0.5.17" if flag == "norm_before_fc" else "0.5.12"
            f = Finding(f.kind, f.severity,
                        f"the contract needs {flag}, which sglang {dep.engine_version} cannot apply: its drafter "
                        f"builds no such norm and ignores the key (domain.md D5), so fc gets an un-normed input",
                        f.chunk, {**f.details, "unsupported_by_version": dep.engine_version},
                        fix=f"serve with sglang >= {since}, where {flag} is built from the draft config")
        out.append(f)
    return out


def _chunks(contract: Contract, run: GateRun) -> list[ChunkReport]:
    expected = list(contract.fc_input.sources)
    if run.table is None:
        # a layout SGLang resolved but crashed on was never served: leave those chunks unknown
        served = list(run.deployment.served_sources) if run.deployment and not run.failures else []
        return [ChunkReport(i, expected[i] if i < len(expected) else None, served[i] if i < len(served) else None)
                for i in range(max(len(expected), len(served)))]
    t = run.table
    drift = pair_tolerances(run)[2][0]  # served vs recorded: the unit the drift is measured in
    ev = {e.index: e for e in t.evidence}
    rec = {c.index: c for c in t.recorded}
    out = []
    for c in t.served:
        e = ev.get(c.index)
        out.append(ChunkReport(
            index=c.index, expected=c.expected, served=c.attributed,
            cosine=e.cosine_at(0) if e else None, max_abs_err=e.max_abs_err if e else None,
            recorded=rec[c.index].attributed if c.index in rec else None,
            min_passing_atol=e.min_passing_atol if e else None,
            separation=c.separation, runner_up=c.runner_up,
            rel_err_p99=e.token_rel_err_p99 if e else None, rel_err_max=e.token_rel_err_max if e else None,
            unit_roundoff=drift.unit_roundoff,
            recorded_separation=rec[c.index].separation if c.index in rec else None))
    out += [ChunkReport(i, expected[i], None, recorded=rec[i].attributed if i in rec else None)
            for i in range(len(t.served), len(expected))]
    return out


def _engine_version(run: GateRun) -> str | None:
    """The engine release that served (or failed to): the deployment's, else the one a failure was stamped with."""
    if run.deployment is not None:
        return run.deployment.engine_version
    return next((f.engine_version for f in run.failures if f.engine_version), None)


def _missing_evidence(run: GateRun, level: str) -> list[Finding]:
    """A level that produced no evidence is never a pass, even when nothing reported a failure."""
    if run.failures:
        return []
    out = []
    named = {"engine": run.engine, "version": _engine_version(run)}
    if level != "static" and run.table is None:
        out.append(Finding(FindingKind.ENGINE_ERROR, Severity.ERROR,
                           f"the capture on {engine_label(run.engine)} returned no fc input or layer atlas to compare",
                           details={"check": "capture", **named}))
    if level in ("outcome", "all") and run.outcome is None and not any(f.is_failure for f in run.outcome_findings):
        out.append(Finding(FindingKind.ENGINE_ERROR, Severity.ERROR,
                           "the outcome check produced no acceptance figures", details={"check": "outcome", **named}))
    return out


def verdict_of(run: GateRun, *, level: Level, timings: Mapping[str, float]) -> Verdict:
    c, dep = run.contract, run.deployment
    cfg, d2t, observed, keys, skipped = _draft_facts(run.draft)
    findings = rules.serving_findings(run.failures, engine=run.engine, version=_engine_version(run)) + skipped
    fix: FixSuggestion | None = None
    layout_fix_text = None
    if dep is not None:
        eng = get_engine(run.engine)
        lf = eng.layout_fix(c.fc_input.sources, cfg, num_layers=dep.num_layers, architecture=dep.target_architecture,
                            version=dep.engine_version, draft_path=str(run.draft))
        if lf.json_patch or not lf.feasible:
            layout_fix_text = lf.summary
            fix = FixSuggestion(lf.summary, lf.file, lf.json_patch)
        findings += convention_findings(eng, c, dep, cfg, fix_summary=layout_fix_text)
    facts = DeploymentFacts(
        engine_version=_engine_version(run), architecture=dep.target_architecture if dep else None,
        fc_calls=0 if dep is not None and not dep.fc_applied and not run.failures else None,
        served_width=dep.fc_in_features if dep else None, ids_fallback_reason=dep.ids_fallback_reason if dep else None,
        requested_spec=dep.requested_spec.to_dict() if dep else {}, resolved_spec=dep.resolved_spec.to_dict() if dep else {},
        norm_flags={"norm_before_fc": dep.norm_before_fc, "fc_norm": dep.fc_norm, "norm_output": dep.norm_output}
        if dep else None,
        vocab_map_hash=d2t, vocab_map_observed=observed, engine=run.engine)
    (base, overrides), (rec, _), (drift, _) = pair_tolerances(run)
    findings += _explain_unsupported_norms(
        diagnose(_expected(c), facts, table=run.table, tolerance=base, overrides=overrides,
                 layout_fix=layout_fix_text, drift_tolerance=drift, recorded_tolerance=rec), dep)
    findings += _target_findings(c, run.target)
    findings += launch_findings(run.launch, c, cfg)
    # without tensors the layout comes from SGLang's resolved capture list, unless SGLang failed: a config
    # it crashes on is reported as that crash (with the fix), not as a layout it would never serve
    static_layout = run.table is None and dep is not None and not run.failures
    if static_layout and dep is not None:
        findings += layout_findings(c.fc_input.sources, dep.served_sources, layout_fix=layout_fix_text,
                                    engine=run.engine)
    if run.table is not None and dep is not None and not run.failures:
        findings += static_capture_findings(dep.served_sources, run.table.served_sources(), engine=run.engine,
                                            version=dep.engine_version, architecture=dep.target_architecture)
    if dep is not None:
        findings += _config_findings(c, dep, d2t, keys)
        findings += adapter_findings(dep)
        findings += partial_load_findings(dep.target_load, engine=dep.engine, version=dep.engine_version)
    findings += run.outcome_findings
    findings += _missing_evidence(run, level)
    if c.layout_assumed is not None:
        a = c.layout_assumed
        findings.append(Finding(FindingKind.LAYOUT_ASSUMED, Severity.INFO,
                                f"the contract's layout is assumed, not recorded: {a.reason}",
                                details={"check": "static", "trainer": a.trainer,
                                         "trainer_sglang_version": a.trainer_sglang_version,
                                         "trainer_sglang_version_assumed": a.trainer_sglang_version_assumed}))
    findings = rules.tag_checks(explained_by_partial_load(findings), level, static_layout, engine=run.engine,
                                version=_engine_version(run))
    if fix is None:
        spec_fix = next((f.fix for f in findings if f.kind is FindingKind.SPEC_CONFIG_REWRITTEN and f.fix), None)
        fix = FixSuggestion(spec_fix) if spec_fix else None
    if dep is None and not any(f.severity is Severity.ERROR for f in findings):
        # never a pass without the engine having resolved the deployment
        findings.append(Finding(FindingKind.ENGINE_ERROR, Severity.ERROR,
                                f"{engine_label(run.engine)} never resolved the deployment",
                                details={"check": rules.ALL_CHECKS, "cause": "environment", "engine": run.engine,
                                         "version": _engine_version(run)}))
    ran = {"static": dep is not None, "capture": run.table is not None, "outcome": run.outcome is not None}
    findings += rules.blocked_checks(findings, level, ran)
    status = rules.status_of(findings)
    probes = [{**p, "status": rules.probe_status(findings, int(p["index"]))} for p in run.probes]
    served_layout: list[str | None] | None = (
        run.table.served_sources() if run.table is not None
        else (list(dep.served_sources) if dep and not run.failures else None))
    heat = None
    if run.table is not None:
        rows, cols, values = run.table.heatmap()
        heat = Heatmap(rows, cols, values)
    spec: dict[str, Any] | None = None
    if dep is not None:
        spec = {"requested": dep.requested_spec.to_dict(), "resolved": dep.resolved_spec.to_dict(),
                "warnings": list(dep.spec_warnings), "engine_label": get_engine(run.engine).label}
    return Verdict(
        contract_name=c.name, contract_hash=c.content_hash, level=level, status=status,  # type: ignore[arg-type]
        engine_version=_engine_version(run),
        target_architecture=dep.target_architecture if dep else c.target.architecture, draft_path=str(run.draft),
        expected_layout=list(c.fc_input.sources), served_layout=served_layout, chunks=_chunks(c, run),
        findings=findings, fix=fix, resolved_spec_config=spec, outcome=run.outcome, heatmap=heat,
        probes=probes, timings=dict(timings),
        environment=dict(dep.environment) if dep else {}, stand_ins=tuple(dep.stand_ins) if dep else (),
        engine=run.engine,
        layout=layout_of(run.engine, dep, captured=run.table is not None) or dict(run.requested_layout),
        launch=run.launch.to_dict() if run.launch is not None else None, live=run.live,
    )


