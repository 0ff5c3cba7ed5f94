"""From attribution and deployment facts to every finding at once.

Inputs are plain: what the contract promises (:class:`ExpectedFacts`), what the deployment resolved
(:class:`DeploymentFacts`, filled by the caller from the serving adapter's records) and the
:class:`~specparity.compare.attribution.AttributionTable`. :func:`diagnose` applies every rule and
returns all findings, never only the first. It knows nothing of SGLang; the SGLang behaviour a
message explains is cited where the rule depends on it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from specparity.compare.attribution import AttributionTable, ChunkAttribution
from specparity.compare.evidence import ChunkEvidence
from specparity.compare.findings import Finding, FindingKind, Severity, engine_label
from specparity.compare.fix import spec_fix
from specparity.compare.recorded import drift_findings, recording_findings
from specparity.compare.tolerances import Tolerance, resolve_tolerance
from specparity.sources import EMBEDDING, layer_index, order_key

SPEC_KEYS = ("num_steps", "eagle_topk", "num_draft_tokens")
NORM_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")
# A served chunk that points the same way as the recorded one (cosine >= this) but has a different
# scale is the recorded state after a norm: RMSNorm keeps each token's direction up to its weight.
NORM_COSINE = 0.98


@dataclass(frozen=True)
class ExpectedFacts:
    """What the contract promises. ``sources`` are canonical, in fc-chunk order."""

    name: str
    sources: tuple[str, ...]
    hidden_size: int
    norm_flags: Mapping[str, bool] = field(default_factory=dict)
    vocab_map_hash: str | None = None


@dataclass(frozen=True)
class DeploymentFacts:
    """What the deployment did. ``None`` means "not observed" and disables the rule that needs it.

    ``fc_calls``: times the drafter's fc ran (forward pre-hook firings). ``captured_states``: aux
    states the target captured. ``served_width``: fc in-features / captured width.
    ``ids_fallback_reason``: set when SGLang served its default ids (sglang 0.5.23
    model_runner_components/spec_aux_hidden_state.py:187-196 swallows any exception into the default).
    ``requested_spec`` / ``resolved_spec``: keys ``num_steps``, ``eagle_topk``, ``num_draft_tokens``.
    ``engine_error`` / ``timeout_s``: the engine could not complete the check.
    """

    engine_version: str | None = None  # the release of ``engine`` that served
    architecture: str | None = None
    fc_calls: int | None = None
    captured_states: int | None = None
    served_width: int | None = None
    ids_fallback_reason: str | None = None
    requested_spec: Mapping[str, int | None] = field(default_factory=dict)
    resolved_spec: Mapping[str, int | None] = field(default_factory=dict)
    norm_flags: Mapping[str, bool] | None = None
    vocab_map_hash: str | None = None
    vocab_map_observed: bool = False
    engine_error: str | None = None
    timeout_s: float | None = None
    engine: str = "sglang"  # whose id rule a layout message quotes (EMBEDDING_CAUSE)


# How each engine comes to serve the token embedding where training used none: the rule a message quotes is the
# serving engine's own (SGLang's +1 rule; vLLM's boundary index, vllm_conventions.py item 3).
# A DFlash drafter's ids go through a +1 on both engines (contract/conventions.py dflash_ids_to_sources), so there
# an id of -1 is the one that reaches boundary 0.
EMBEDDING_CAUSE = {
    "sglang": "an id of -1 under SGLang's +1 rule, sglang 0.5.23 models/llama.py:929-941 (a DFlash drafter's ids: "
              "set_dflash_layers_to_capture, models/qwen3.py:793-805)",
    "vllm": "an id vLLM reads as boundary 0, the embedding: an EAGLE-3 id of 0 (vLLM reads id k as hidden_states[k], "
            "vllm model_executor/models/llama.py:428-441) or a DFlash id of -1 (vLLM adds 1 to DFlash ids, "
            "v1/worker/gpu_model_runner.py:5270-5277)",
}


# Where each engine reads a draft config's ids (SGLang: the nested key, domain.md D11; vLLM: the top-level key first
# in every release that reads ids, 0.11.1-, while its nested key is read only 0.22-0.33: idrules/vllm_releases.py)
IDS_FIX = {"sglang": "write eagle_config.eagle_aux_hidden_state_layer_ids (nested) into the draft config.json",
           "vllm": "write the ids as the top-level eagle_aux_hidden_state_layer_ids in the draft config.json (the key "
                   "every vLLM release from 0.11.1 reads first; vLLM reads id k as hidden_states[k])"}
# Why an engine never ran the drafter's fc, and where it applies the norm flags: each engine's own code.
FC_SKIPPED = {
    "sglang": "SGLang applies fc only when the hidden-state width differs from the draft hidden size (sglang 0.5.23 "
              "models/llama_eagle3.py:238); {k} x {h} may equal it",
    "vllm": "vLLM runs fc only in its EAGLE-3 proposer's combine_hidden_states, and only when the drafter uses aux "
            "hidden states (vllm 0.32 v1/spec_decode/llm_base_proposer.py:550, models/llama_eagle3.py:401-402): "
            "check that speculative_config names the drafter with method eagle3",
}
NORM_CITE = {"sglang": "sglang 0.5.23 models/llama_eagle3.py:169-207",
             "vllm": "vllm 0.32 models/llama_eagle3.py:405-415"}


def _fmt(x: float) -> str:
    if not math.isfinite(x):
        return str(x)
    return f"{x:.3g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"


def _where(d: DeploymentFacts) -> str:
    parts = [p for p in (f"{d.engine} {d.engine_version}" if d.engine_version else None, d.architecture) if p]
    return f" ({', '.join(parts)})" if parts else ""


def _environment(exp: ExpectedFacts, dep: DeploymentFacts) -> list[Finding]:
    out: list[Finding] = []
    label = engine_label(dep.engine)
    named = {"engine": dep.engine, "version": dep.engine_version}
    if dep.engine_error is not None:
        out.append(Finding(FindingKind.ENGINE_ERROR, Severity.ERROR,
                           f"{label} failed before the fc input could be checked{_where(dep)}: {dep.engine_error}",
                           details={"error": dep.engine_error, **named}))
    if dep.timeout_s is not None:
        out.append(Finding(FindingKind.TIMEOUT, Severity.ERROR,
                           f"{label} did not finish within {_fmt(dep.timeout_s)} s{_where(dep)}",
                           details={"timeout_s": dep.timeout_s, **named}))
    return out


def _static(exp: ExpectedFacts, dep: DeploymentFacts) -> list[Finding]:
    out: list[Finding] = []
    k = len(exp.sources)
    if dep.fc_calls == 0:
        out.append(Finding(
            FindingKind.FC_NOT_CALLED, Severity.ERROR,
            f"the drafter's fc never ran{_where(dep)}: "
            + FC_SKIPPED.get(dep.engine, FC_SKIPPED["sglang"]).format(k=k, h=exp.hidden_size),
            details={"fc_calls": 0, "expected_width": k * exp.hidden_size}))
    if dep.captured_states is not None and dep.captured_states < k:
        out.append(Finding(
            FindingKind.CAPTURE_COUNT_SHORT, Severity.ERROR,
            f"the target captured {dep.captured_states} of {k} aux hidden states ({', '.join(exp.sources)} "
            f"expected); a boundary past the last layer is never reached (sglang 0.5.23 models/llama.py:485-493)",
            details={"captured": dep.captured_states, "expected": k}))
    if dep.served_width is not None and dep.served_width != k * exp.hidden_size:
        out.append(Finding(
            FindingKind.WIDTH_MISMATCH, Severity.ERROR,
            f"fc input is {dep.served_width} wide, the contract's is {k} x {exp.hidden_size} = "
            f"{k * exp.hidden_size}",
            details={"served_width": dep.served_width, "expected_width": k * exp.hidden_size,
                     "hidden_size": exp.hidden_size}))
    if dep.ids_fallback_reason is not None:
        out.append(Finding(
            FindingKind.DEFAULT_IDS_FALLBACK, Severity.ERROR,
            f"{engine_label(dep.engine)} served its default aux layer ids{_where(dep)}: {dep.ids_fallback_reason}; "
            f"a default is "
            f"never a pass, even when it happens to match",
            details={"reason": dep.ids_fallback_reason},
            fix=IDS_FIX.get(dep.engine or "sglang", IDS_FIX["sglang"])))
    for key in SPEC_KEYS:
        req, got = dep.requested_spec.get(key), dep.resolved_spec.get(key)
        if req is not None and got is not None and req != got:
            out.append(Finding(
                FindingKind.SPEC_CONFIG_REWRITTEN, Severity.ERROR,
                f"{engine_label(dep.engine)} rewrote speculative {key} from {req} to {got}{_where(dep)}",
                details={"setting": key, "requested": req, "resolved": got},
                fix=spec_fix(dep.requested_spec, dep.resolved_spec)))
    if exp.vocab_map_hash is not None and dep.vocab_map_observed and dep.vocab_map_hash != exp.vocab_map_hash:
        got_hash = dep.vocab_map_hash or "none (draft ids taken as target ids)"
        out.append(Finding(
            FindingKind.VOCAB_MAP_MISMATCH, Severity.ERROR,
            f"the served draft-to-target vocab map is {got_hash}, training used {exp.vocab_map_hash}",
            details={"expected": exp.vocab_map_hash, "served": dep.vocab_map_hash}))
    if dep.norm_flags is not None:
        for flag in NORM_FLAGS:
            want, got_flag = bool(exp.norm_flags.get(flag, False)), bool(dep.norm_flags.get(flag, False))
            if want != got_flag:
                out.append(Finding(
                    FindingKind.NORM_MISMATCH, Severity.ERROR,
                    f"the served drafter has {flag}={got_flag}, training used {flag}={want} "
                    f"({NORM_CITE.get(dep.engine, NORM_CITE['sglang'])})",
                    details={"flag": flag, "expected": want, "served": got_flag}))
    return out


def _is_off_by_one(served: str, expected: str) -> bool:
    i, j = layer_index(served), layer_index(expected)
    return i is not None and j is not None and abs(i - j) == 1


def _line(c: int, served: str | None, expected: str | None, att: ChunkAttribution | None) -> str:
    got = served or (f"unknown (best {att.best} rel err {_fmt(att.rel_err)}, separation {_fmt(att.separation)} "
                     f"from {att.runner_up})" if att else "unknown")
    return f"chunk {c}: served {got}, expected {expected}"


def _numbers(att: ChunkAttribution | None) -> str:
    if att is None:
        return ""
    what = att.attributed or att.best or "its best match"
    return f" (cosine {_fmt(att.cosine)} with {what}, max|d| vs recorded {_fmt(att.max_abs_err)})"


def _unknown_chunk(c: ChunkAttribution, ev: ChunkEvidence | None, tol: Tolerance,
                   layout_fix: str | None) -> Finding:
    """A served chunk that matches no boundary: explain it from the served-vs-recorded evidence."""

    def explained(kind: FindingKind, why: str, details: Mapping[str, object]) -> Finding:
        return Finding(kind, Severity.ERROR, f"chunk {c.index}: {why}", chunk=c.index, details=details)

    if ev is not None:
        best_shift = max((-1, 1), key=ev.cosine_at)
        shifted = ev.cosine_at(best_shift)
        if shifted >= tol.cosine_floor and shifted - ev.cosine_at(0) >= tol.min_margin:
            where = "the next" if best_shift > 0 else "the previous"
            return explained(
                FindingKind.POSITION_SHIFT,
                f"served row t equals recorded {c.expected} at {where} token (cosine {_fmt(shifted)} at shift "
                f"{best_shift:+d}, {_fmt(ev.cosine_at(0))} unshifted); row t of the fc input must be the state "
                f"of token t (domain.md §1)",
                {"shift": best_shift, "cosine_shifted": shifted, "cosine_unshifted": ev.cosine_at(0)})
        if ev.cosine_at(0) >= NORM_COSINE and ev.rel_err > tol.max_rel_err:
            return explained(
                FindingKind.NORM_MISMATCH,
                f"served {c.expected} after a norm: cosine {_fmt(ev.cosine_at(0))} to the recorded chunk but "
                f"rel err {_fmt(ev.rel_err)} (per-token scale x{_fmt(ev.scale_ratio)}, norm CV "
                f"{_fmt(ev.served_norm_cv)} served vs {_fmt(ev.recorded_norm_cv)} recorded)",
                {"cosine": ev.cosine_at(0), "rel_err": ev.rel_err, "scale_ratio": ev.scale_ratio,
                 "served_norm_cv": ev.served_norm_cv, "recorded_norm_cv": ev.recorded_norm_cv})
    return Finding(
        FindingKind.LAYOUT_MISMATCH, Severity.ERROR,
        f"{_line(c.index, None, c.expected, c)}: matches no boundary (rel err limit {_fmt(tol.max_rel_err)}, "
        f"separation limit {_fmt(tol.max_separation)}; runner-up {c.runner_up} rel err {_fmt(c.runner_up_rel_err)})",
        chunk=c.index,
        details={"best": c.best, "cosine": c.cosine, "rel_err": c.rel_err, "margin": c.margin,
                 "separation": c.separation},
        fix=layout_fix)


def _layout(
    expected: Sequence[str],
    served: Sequence[str | None],
    *,
    atts: Sequence[ChunkAttribution | None],
    evidence: Mapping[int, ChunkEvidence],
    tols: Sequence[Tolerance] | None,
    layout_fix: str | None,
    engine: str = "sglang",
) -> list[Finding]:
    """Layout findings for served chunk sources against the contract's (attributions optional)."""
    expected, served = list(expected), list(served)
    out: list[Finding] = []
    if served != expected and None not in served and Counter(served) == Counter(expected):
        out.append(Finding(
            FindingKind.ORDER_MISMATCH, Severity.ERROR,
            f"served {', '.join(str(s) for s in served)} where the contract has {', '.join(expected)}: same sources, "
            f"other order; SGLang concatenates in ascending layer order (sglang 0.5.23 models/llama.py:485-493)",
            details={"served": served, "expected": expected},
            fix="train with the sources in ascending order (or permute fc.weight's input blocks to "
                + ", ".join(sorted(expected, key=order_key)) + ")"))
        return out
    covered: set[str] = set()
    displaced: list[tuple[int, str, str, ChunkAttribution | None]] = []
    for c, s in enumerate(served):
        att = atts[c]
        e = expected[c] if c < len(expected) else None
        if s == e:
            continue
        ev = evidence.get(c)
        if ev is not None and ev.nonfinite_served:
            if e is not None:
                covered.add(e)
            continue  # reported as nonfinite
        if e is None:
            out.append(Finding(
                FindingKind.LAYOUT_MISMATCH, Severity.ERROR,
                f"chunk {c}: served {s or 'unknown'} beyond the contract's {len(expected)} chunks",
                chunk=c, details={"served": s}, fix=layout_fix))
            continue
        covered.add(e)
        if s == EMBEDDING and EMBEDDING not in expected:
            out.append(Finding(
                FindingKind.EXTRA_EMBEDDING, Severity.ERROR,
                f"{_line(c, s, e, att)}{_numbers(att)}: the token embedding is served where training used no "
                f"embedding ({EMBEDDING_CAUSE.get(engine, EMBEDDING_CAUSE['sglang'])})",
                chunk=c, details={"served": s, "expected": e}, fix=layout_fix))
        elif s is not None and _is_off_by_one(s, e):
            out.append(Finding(
                FindingKind.OFF_BY_ONE, Severity.ERROR,
                f"{_line(c, s, e, att)}: one layer {'early' if order_key(s) < order_key(e) else 'late'}{_numbers(att)}",
                chunk=c, details={"served": s, "expected": e}, fix=layout_fix))
        elif s is None and att is not None and tols is not None:
            out.append(_unknown_chunk(att, ev, tols[c], layout_fix))
        elif s is not None and s in expected:
            covered.discard(e)
            displaced.append((c, s, e, att))
        else:
            out.append(Finding(
                FindingKind.LAYOUT_MISMATCH, Severity.ERROR, f"{_line(c, s, e, att)}{_numbers(att)}",
                chunk=c, details={"served": s, "expected": e}, fix=layout_fix))
    present = {s for s in served if s is not None}
    missing = [e for e in expected if e not in present and e not in covered]
    for e in missing:
        out.append(Finding(
            FindingKind.MISSING_SOURCE, Severity.ERROR,
            f"{e} is in the contract but in no served chunk ({_served_words(served)})",
            details={"source": e, "served": served}, fix=layout_fix))
    if displaced and not missing and not any(f.kind is FindingKind.EXTRA_EMBEDDING for f in out):
        for c, s, e, att in displaced:
            out.append(Finding(
                FindingKind.LAYOUT_MISMATCH, Severity.ERROR,
                f"{_line(c, s, e, att)}: a contract source at the wrong chunk",
                chunk=c, details={"served": s, "expected": e}, fix=layout_fix))
    return out


def _served_words(served: Sequence[str | None]) -> str:
    """``served embedding, layer:1``; ``nothing served`` for an empty layout (never ``served `` and a blank)."""
    if not served:
        return "nothing served"
    return "served " + ", ".join(s if s is not None else "an unattributed chunk" for s in served)


def layout_findings(
    expected: Sequence[str], served: Sequence[str], *, layout_fix: str | None = None, engine: str = "sglang"
) -> list[Finding]:
    """The layout rules on source lists alone (the static check R1: the capture list SGLang resolved).

    Same kinds and messages as the tensor path, without the numbers: ``extra_embedding``,
    ``off_by_one``, ``order_mismatch``, ``missing_source``, ``layout_mismatch``.
    """
    return _layout(expected, served, atts=[None] * len(served), evidence={}, tols=None, layout_fix=layout_fix,
                   engine=engine)


def _tensors(exp: ExpectedFacts, table: AttributionTable, tols: Sequence[Tolerance],
             layout_fix: str | None, *, drift_tols: Sequence[Tolerance],
             rec_tols: Sequence[Tolerance], engine: str = "sglang") -> list[Finding]:
    out: list[Finding] = []
    for nf in table.evidence:
        if nf.nonfinite_served or nf.nonfinite_recorded:
            out.append(Finding(
                FindingKind.NONFINITE, Severity.ERROR,
                f"chunk {nf.index}: {nf.nonfinite_served} NaN/Inf values in the served fc input, "
                f"{nf.nonfinite_recorded} in the recorded chunk",
                chunk=nf.index,
                details={"served": nf.nonfinite_served, "recorded": nf.nonfinite_recorded}))
    for name, tokens in table.atlas_nonfinite_tokens:
        out.append(Finding(FindingKind.NONFINITE, Severity.ERROR,
                           f"{name} of the serving target has NaN/Inf on {tokens} tokens",
                           details={"source": name, "tokens": tokens}))
    served = table.served_sources()
    expected = list(exp.sources)
    out.extend(_layout(expected, served, atts=list(table.served), evidence={e.index: e for e in table.evidence},
                       tols=tols, layout_fix=layout_fix, engine=engine))
    matched = sorted(c for c, s in enumerate(served) if c < len(expected) and s == expected[c])
    out.extend(drift_findings(exp.sources, table, matched, drift_tols, tols))
    out.extend(recording_findings(table, rec_tols))
    return out


def diagnose(
    expected: ExpectedFacts,
    deployment: DeploymentFacts,
    *,
    table: AttributionTable | None,
    tolerance: Tolerance,
    overrides: Mapping[int | str, Tolerance] | None = None,
    layout_fix: str | None = None,
    drift_tolerance: Tolerance | None = None,
    recorded_tolerance: Tolerance | None = None,
) -> list[Finding]:
    """Every finding for one deployment, in the order: environment, static, tensors, training side.

    ``table`` is None when no tensors were captured (static level, or SGLang failed). ``layout_fix``
    (from :func:`specparity.compare.fix.layout_fix`) is attached to every layout finding.
    ``tolerance`` judges served chunks against the atlas, ``drift_tolerance`` served against recorded
    chunks and ``recorded_tolerance`` recorded chunks against the atlas (each defaults to ``tolerance``;
    the gate passes the coarser dtype's of each pair, compare/tolerances.py).
    """
    findings = _environment(expected, deployment) + _static(expected, deployment)
    if table is not None:
        k = max(len(table.served), len(expected.sources))
        def per_chunk(base: Tolerance | None) -> list[Tolerance]:
            return [resolve_tolerance(base or tolerance, overrides, chunk=c,
                                      source=expected.sources[c] if c < len(expected.sources) else None)
                    for c in range(k)]

        tols = per_chunk(tolerance)
        if len(table.served) != len(expected.sources) and not any(
                f.kind is FindingKind.WIDTH_MISMATCH for f in findings):
            width = len(table.served) * table.hidden_size
            findings.append(Finding(
                FindingKind.WIDTH_MISMATCH, Severity.ERROR,
                f"fc input has {len(table.served)} chunks ({width} wide), the contract has "
                f"{len(expected.sources)} x {expected.hidden_size}",
                details={"served_chunks": len(table.served), "expected_chunks": len(expected.sources)}))
        findings.extend(_tensors(expected, table, tols, layout_fix, drift_tols=per_chunk(drift_tolerance),
                                 rec_tols=per_chunk(recorded_tolerance), engine=deployment.engine))
    return findings
