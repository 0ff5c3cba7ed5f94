"""The gate: static resolution + capture with attribution + outcome -> one :class:`Verdict`.

Data flows one way (docs/house-style.md): the contract says what training promised; the engine
adapter (:mod:`specparity.serving.engine`, SGLang or vLLM) says what the engine really does, started once
per gate run in a child process with the engine's own code; compare/ and replay/ turn the two into
findings; this module only orchestrates and never renders.

Levels:
- ``static``  the engine resolves the deployment (ids, capture list, fc width, speculative settings).
- ``capture`` also a real run of the contract's probes; every fc chunk attributed to a source.
- ``outcome`` also the drafter's acceptance on recorded vs served fc inputs (wiring vs model), held against
  the engine's own figures from the same run (its drafter replay, its serving loop's counters).
- ``all``     everything.

A check that could not run is an ``error`` verdict, never a pass.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specparity import decision
from specparity.compare.agreement import static_capture_findings
from specparity.compare.attribution import AttributionTable, attribute
from specparity.compare.diagnosis import DeploymentFacts, ExpectedFacts, diagnose, layout_findings
from specparity.compare.findings import (
    ENVIRONMENT_KINDS,
    Finding,
    FindingKind,
    Severity,
    adapter_findings,
    engine_label,
)
from specparity.compare.tolerances import Tolerance, tolerances_from_contract
from specparity.contract import Contract, ProbePack, load_contract, read_contract_probes
from specparity.deployed import check_deployed_files
from specparity.deployed import config_findings as _config_findings
from specparity.deployed import draft_facts as _draft_facts
from specparity.deployed import target_findings as _target_findings
from specparity.errors import InputError
from specparity.gate_launch import apply_launch, attach, capture_launched, launch_findings, resolve_launched
from specparity.replay.outcome import check_outcome
from specparity.serving.engine import convention_findings, engine_args_for, get_engine, outcome_request
from specparity.serving.launch import LaunchSpec
from specparity.serving.layout import served_layout as layout_of
from specparity.serving.live import StartedServer, capture_attached
from specparity.serving.results import CaptureResult, ResolvedDeployment, ServingFailure
from specparity.verdict import ChunkReport, FixSuggestion, Heatmap, Level, OutcomeSummary, Verdict

LEVELS: tuple[Level, ...] = ("static", "capture", "outcome", "all")
# findings the static check owns; everything else found with tensors belongs to the capture check
_STATIC_KINDS = frozenset({FindingKind.ENGINE_CONVENTION_MISMATCH, FindingKind.LAYOUT_ASSUMED,
                           FindingKind.RESOLUTION_NOTE, FindingKind.DEFAULT_IDS_FALLBACK,
                           FindingKind.SPEC_CONFIG_REWRITTEN, FindingKind.VOCAB_MAP_MISMATCH,
                           FindingKind.CONFIG_MISMATCH, FindingKind.NORM_MISMATCH,
                           FindingKind.UNTESTED_VERSION, FindingKind.DRAFT_IDS_IGNORED,
                           FindingKind.CUDA_GRAPH_IDS_HAZARD, FindingKind.TOKENIZER_MISMATCH,
                           FindingKind.CHAT_TEMPLATE_MISMATCH})
_OUTCOME_KINDS = frozenset({FindingKind.ACCEPTANCE_COLLAPSE, FindingKind.ACCEPTANCE_BELOW_CONTRACT,
                            FindingKind.MODEL_QUALITY, FindingKind.ACCEPTANCE_INCONCLUSIVE})


def server_args_for(contract: Contract, user: Mapping[str, object]) -> dict[str, object]:
    """The contract's speculative settings as SGLang ServerArgs keywords, overridden by the user's arguments."""
    return engine_args_for(get_engine("sglang"), contract, user)


@dataclass
class _Run:
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
    live: dict[str, Any] | None = None  # where the evidence came from: a server launched or attached (serving/live.py)


def run_gate(
    contract_path: str | Path,
    target: str | Path | None = None,
    draft: str | Path | None = None,
    *,
    sglang_args: Mapping[str, object] | None = None,
    level: str = "all",
    device: str = "cpu",
    python: str | None = None,
    timeout_s: float = 900,
    progress: Callable[[int, int], None] | None = None,
    engine: str = "sglang",
    engine_args: Mapping[str, object] | None = None,
    launch: LaunchSpec | None = None,
    server: str | None = None,
    api_key: str | None = None,
    allow_dev_endpoints: bool = False,
    started: StartedServer | None = None,
) -> Verdict:
    """Check the deployment (``target``, ``draft``, engine arguments) against the contract.

    ``engine`` is ``sglang`` or ``vllm`` (:mod:`specparity.serving.engine`); ``engine_args`` are its
    arguments (ServerArgs keywords / ``vllm.LLM`` keywords), merged over ``sglang_args``. ``launch`` is the deploy
    command as its engine parsed it (serving/launch.py): its engine, target, draft and arguments are the deployment's
    (``target``/``draft`` given too must agree; ``engine_args`` override the command's), served by the interpreter
    that parsed it unless ``python`` says otherwise (gate_launch.py); at the capture, outcome and ``all`` levels the
    gate starts that server itself, with the engine's hook switches added (serving/live.py). ``server`` is the URL of
    a running server (``api_key`` its key): the deployment is what the server reports, and the evidence comes through
    its hooks; ``started``, that server already started from the command while it was parsed (cli.py). Raises
    :class:`InputError` for bad input (contract, probe pack, arguments); everything the engine does,
    including crashing, ends up in the returned verdict.
    """
    if launch is not None:
        target, draft, engine, engine_args = apply_launch(launch, target=target or None, draft=draft or None,
                                                          engine=None, engine_args=engine_args)
        python = python or (launch.python if launch.python and launch.python != sys.executable else None)
    try:
        eng = get_engine(engine)
    except ValueError as e:
        raise InputError(str(e), field="--engine") from None
    attached = attach(eng, server, api_key=api_key, target=target, draft=draft, python=python,
                      timeout_s=timeout_s) if server is not None else None
    if attached is not None:
        target, draft = attached.target, attached.draft
    if not target or not draft:
        raise InputError("give --target and --draft, the deploy command (--launch), or a running server (--server)",
                         field="--target")
    if level not in LEVELS:
        raise InputError(f"unknown level {level!r}; choose one of {', '.join(LEVELS)}", field="--level")
    t0 = time.perf_counter()
    contract = load_contract(contract_path)
    if contract.probes is None and level != "static":
        why = contract.layout_assumed.reason if contract.layout_assumed else "no recordings"
        raise InputError(
            f"contract {contract.name!r} has no probe pack: its layout is assumed ({why}). Only --level static can "
            f"check it; the {level} level compares served tensors with recorded ones, so it needs a contract written "
            "from recordings (specparity contract from-specforge / from-speculators)", path=contract_path,
            field="probes")
    pack = read_contract_probes(contract, contract_path) if contract.probes is not None else None
    if pack is not None and pack.sources != list(contract.fc_input.sources):
        raise InputError(f"probe pack sources {pack.sources} differ from the contract's", path=contract_path,
                         field="fc_input.sources")
    if attached is None or attached.local:  # a remote server's files are the server's to read
        check_deployed_files(Path(target), Path(draft))  # swapped dirs, a broken weight file: exit 2 before the engine
    user = {**(sglang_args or {}), **(engine_args or {})}
    args = engine_args_for(eng, contract, user)
    run = _Run(contract=contract, draft=Path(draft), target=Path(target), engine=eng.name, launch=launch,
               recorded_dtype=str(pack.samples[0].fc_input.dtype).removeprefix("torch.") if pack and pack.samples else None)
    timings: dict[str, float] = {}
    if level == "static":
        dep = (attached.deployment if attached is not None
               else resolve_launched(eng, launch, target, draft, args=args, device=device, python=python,
                                     timeout_s=timeout_s) if launch is not None
               else eng.resolve(target, draft, args=args, device=device, python=python, timeout_s=timeout_s))
        if attached is not None:
            run.live = attached.live
        run.deployment, run.failures = (dep, ()) if isinstance(dep, ResolvedDeployment) else (None, (dep,))
        timings["static"] = time.perf_counter() - t0
    else:
        assert pack is not None  # refused above for a contract without probes
        # one engine start per gate run: the capture, and at the outcome levels the outcome's evidence too
        request = outcome_request(pack) if level in ("outcome", "all") else None
        probes = [s.input_ids.tolist() for s in pack.samples]
        if attached is not None:  # the running server's own hooks and counters (serving/live.py)
            capture = capture_attached(eng, attached.url, api_key=api_key, probes=probes, outcome=request,
                                       timeout_s=timeout_s, progress=progress)
        elif launch is not None:  # the user's own server, launched from their command (gate_launch.capture_launched)
            capture = capture_launched(eng, launch, probes=probes, timeout_s=timeout_s, python=python,
                                       progress=progress, outcome=request, allow_dev_endpoints=allow_dev_endpoints,
                                       started=started)
        else:
            capture = eng.capture(target, draft, probes=probes, args=args, device=device, timeout_s=timeout_s,
                                  python=python, progress=progress, outcome=request)
        run.deployment, run.failures = capture.deployment, tuple(capture.failures)
        run.requested_layout = dict((capture.loop or {}).get("layout") or {})
        run.live = (capture.loop or {}).get("live") or run.live
        timings["capture"] = time.perf_counter() - t0
        if capture.fc is not None and capture.atlas is not None:
            t1 = time.perf_counter()
            _attribute(run, pack, capture)
            timings["compare"] = time.perf_counter() - t1
        if request is not None:
            t1 = time.perf_counter()
            out = check_outcome(contract, pack, capture, target=target, draft=draft, engine=eng.label)
            run.outcome, run.outcome_findings = out.summary, out.findings
            timings["outcome"] = time.perf_counter() - t1
    timings["total"] = time.perf_counter() - t0
    return _verdict(run, level=level, timings=timings)


def _attribute(run: _Run, pack: ProbePack, capture: CaptureResult) -> None:
    assert capture.fc is not None and capture.atlas is not None
    run.fc_dtype = capture.fc.dtype
    first = next(iter(capture.atlas.per_sample[0].values()), None) if capture.atlas.per_sample else None
    run.atlas_dtype = str(first.dtype).removeprefix("torch.") if first is not None else capture.fc.dtype
    (base, overrides), (rec, rec_over), _ = _pair_tolerances(run)
    d = run.contract.drafter
    # with norm_before_fc / fc_norm the fc hook sees the normed tensor; the recording is the raw aux
    # states (domain.md §1 "Where to tap"), so compare what the target produced
    served = capture.fc.aux_per_sample if (d.norm_before_fc or d.fc_norm) and capture.fc.aux_per_sample \
        else capture.fc.per_sample
    # the recording is compared in the served dtype: bf16 -> fp32 is exact, and fp32 -> bf16 loses only what
    # the coarser side's tolerance already allows
    run.table = attribute(
        served, [s.fc_input.to(capture.fc.per_sample[0].dtype) for s in pack.samples],
        capture.atlas.per_sample, expected=list(run.contract.fc_input.sources), tolerance=base, overrides=overrides,
        recorded_tolerance=rec, recorded_overrides=rec_over,
    )
    h = pack.hidden_size
    probes = []
    for i, (got, sample) in enumerate(zip(served, pack.samples, strict=True)):
        same = got.shape == sample.fc_input.shape and got.numel() > 0
        finite = bool(got.isfinite().all())
        a, b = got.float(), sample.fc_input.float()
        err = float((a - b).abs().max()) if same else math.inf
        tok = ((a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-30)) if same else None
        # the status is filled in from the verdict's findings (decision.probe_status): one rule for every face
        probes.append({"index": i, "tokens": int(got.shape[0]), "status": "pending",
                       "max_abs_err": err if finite else math.nan, "chunks": int(got.shape[-1] // h),
                       "rel_err_max": float(tok.max()) if tok is not None and finite else math.nan})
    run.probes = tuple(probes)


def _pair_tolerances(run: _Run) -> tuple[tuple[Tolerance, dict[int | str, Tolerance]], ...]:
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


def _check_of(f: Finding) -> str:
    if f.kind in _OUTCOME_KINDS:
        return "outcome"
    if f.kind in ENVIRONMENT_KINDS:
        return str(f.details.get("check", decision.ALL_CHECKS))
    if f.kind in _STATIC_KINDS:
        return "static"
    return str(f.details.get("check", "capture"))


def _tag(findings: Sequence[Finding], level: str, static_layout: bool, run: _Run) -> list[Finding]:
    """Each finding with the check (pytest item) it fails; an engine error also names the engine and release."""
    out = []
    named = {"engine": run.engine, "version": _engine_version(run)}
    for f in findings:
        check = "static" if (level == "static" or (static_layout and f.chunk is None and
                                                   f.kind not in _OUTCOME_KINDS)) else _check_of(f)
        details = {**f.details}
        if f.kind in ENVIRONMENT_KINDS:
            details = {**named, **details}
            if "check" not in f.details:
                check = decision.ALL_CHECKS
        out.append(Finding(f.kind, f.severity, f.message, f.chunk, {**details, "check": check}, f.fix))
    return out


def _chunks(contract: Contract, run: _Run) -> list[ChunkReport]:
    expected = list(contract.fc_input.sources)
    if run.table is None:
        # a layout SGLang resolved but crashed on was never served: leave those chunks unknown
        served = list(run.deployment.served_sources) if run.deployment and not run.failures else []
        return [ChunkReport(i, expected[i] if i < len(expected) else None, served[i] if i < len(served) else None)
                for i in range(max(len(expected), len(served)))]
    t = run.table
    drift = _pair_tolerances(run)[2][0]  # served vs recorded: the unit the drift is measured in
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


def _engine_version(run: _Run) -> str | None:
    """The engine release that served (or failed to): the deployment's, else the one a failure was stamped with."""
    if run.deployment is not None:
        return run.deployment.engine_version
    return next((f.engine_version for f in run.failures if f.engine_version), None)


def _missing_evidence(run: _Run, level: str) -> list[Finding]:
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


def _verdict(run: _Run, *, level: Level, timings: Mapping[str, float]) -> Verdict:
    c, dep = run.contract, run.deployment
    cfg, d2t, observed, keys, skipped = _draft_facts(run.draft)
    findings = decision.serving_findings(run.failures, engine=run.engine, version=_engine_version(run)) + skipped
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
    (base, overrides), (rec, _), (drift, _) = _pair_tolerances(run)
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
    findings += run.outcome_findings
    findings += _missing_evidence(run, level)
    if c.layout_assumed is not None:
        a = c.layout_assumed
        findings.append(Finding(FindingKind.LAYOUT_ASSUMED, Severity.INFO,
                                f"the contract's layout is assumed, not recorded: {a.reason}",
                                details={"check": "static", "trainer": a.trainer,
                                         "trainer_sglang_version": a.trainer_sglang_version,
                                         "trainer_sglang_version_assumed": a.trainer_sglang_version_assumed}))
    findings = _tag(findings, level, static_layout, run)
    if fix is None:
        spec_fix = next((f.fix for f in findings if f.kind is FindingKind.SPEC_CONFIG_REWRITTEN and f.fix), None)
        fix = FixSuggestion(spec_fix) if spec_fix else None
    if dep is None and not any(f.severity is Severity.ERROR for f in findings):
        # never a pass without the engine having resolved the deployment
        findings.append(Finding(FindingKind.ENGINE_ERROR, Severity.ERROR,
                                f"{engine_label(run.engine)} never resolved the deployment",
                                details={"check": decision.ALL_CHECKS, "cause": "environment", "engine": run.engine,
                                         "version": _engine_version(run)}))
    ran = {"static": dep is not None, "capture": run.table is not None, "outcome": run.outcome is not None}
    findings += decision.blocked_checks(findings, level, ran)
    status = decision.status_of(findings)
    probes = [{**p, "status": decision.probe_status(findings, int(p["index"]))} for p in run.probes]
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


def check_failures(verdict: Verdict, check: str, *, probe: int | None = None) -> str | None:
    """The report text for one pytest item (``static``, ``capture``, ``outcome``), or None when it passes."""
    return decision.item_report(verdict, check, probe=probe)
