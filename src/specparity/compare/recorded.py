"""Findings on matched chunks' numerics and on the recording itself, with the margins they were judged by.

- ``numeric_drift``: a served chunk whose source is right, judged on its per-token relative error to
  the recorded chunk in units of the coarser dtype's unit roundoff (compare/tolerances.py): 99th
  percentile and maximum against their limits. Within is ``info`` (the margins, printed); outside is a
  ``warning``: the wiring is right, the numerics are not what training saw.
- The recording against the serving target's atlas (the contract's self-check): a recorded chunk that
  is another boundary than the contract says is ``contract_self_inconsistent``; a recording none of whose
  chunks matches any boundary of the deployed target is ``target_mismatch`` (other weights than the
  ones training recorded), not a contract fault.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from specparity.compare.attribution import AttributionTable, ChunkAttribution
from specparity.compare.findings import Finding, FindingKind, Severity
from specparity.compare.tolerances import Tolerance, drift_within


def fmt(x: float) -> str:
    """Three significant digits; small numbers in exponent form."""
    if not math.isfinite(x):
        return str(x)
    return f"{x:.3g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"


def room(limit: float, value: float) -> float:
    """How many times ``value`` fits under ``limit`` (inf for an exact 0)."""
    if not math.isfinite(value):
        return 0.0
    return math.inf if value == 0 else limit / value


def room_text(limit: float, value: float) -> str:
    """``limit 24 u, 1.5x inside`` / ``2x over``: a margin a reader can act on; an exact 0 says so, never "infx"."""
    if not math.isfinite(value):
        return "n/a: the value is not finite"
    if value == 0:
        return "exact"
    r = limit / value
    return f"{fmt(r)}x inside" if r >= 1 else f"{fmt(1 / r)}x over"


def _units(tol: Tolerance, x: float) -> str:
    return f"{fmt(tol.units(x))} u"


def separation_text(att: ChunkAttribution, tol: Tolerance) -> str:
    """How far the best boundary is ahead of the nearest other one, in units of the compared dtype's roundoff:
    ``separation 0.05: rel err 0.016 = 4.1 u to layer:3, 0.31 = 79 u to the nearest other boundary layer:2
    (limit 0.5, 10x inside)``. Undefined (one boundary, no neighbour; a non-finite error) is ``n/a`` with why."""
    best, other = att.rel_err, att.runner_up_rel_err
    if att.runner_up is None or math.isnan(other):
        return "separation n/a: no other boundary to tell it from"
    if not math.isfinite(best):
        return "separation n/a: the chunk's relative error is not finite"
    limit = tol.max_separation
    return (f"separation {fmt(att.separation)}: rel err {fmt(best)} = {_units(tol, best)} ({tol.dtype}) to "
            f"{att.best}, {fmt(other)} = {_units(tol, other)} to the nearest other boundary {att.runner_up} "
            f"(limit {fmt(limit)}, {room_text(limit, att.separation)})")


def drift_findings(sources: Sequence[str], table: AttributionTable, matched: Sequence[int],
                   drift_tols: Sequence[Tolerance], identity_tols: Sequence[Tolerance]) -> list[Finding]:
    """One ``numeric_drift`` finding (info or warning) per served chunk whose source is right."""
    out: list[Finding] = []
    evidence = {e.index: e for e in table.evidence}
    served = {c.index: c for c in table.served}
    for c in matched:
        ev, att = evidence.get(c), served.get(c)
        if ev is None or att is None:
            continue
        tol = drift_tols[c]
        p99, peak = ev.token_rel_err_p99, ev.token_rel_err_max
        if not math.isfinite(peak) or ev.max_abs_err == 0.0:
            continue  # non-finite values are their own finding; an exact chunk has no drift to judge
        ok = drift_within(p99, peak, tol)
        word = "within" if ok else "outside"
        u = tol.unit_roundoff
        out.append(Finding(
            FindingKind.NUMERIC_DRIFT, Severity.INFO if ok else Severity.WARNING,
            f"chunk {c}: {sources[c]} {word} drift limits ({tol.dtype}, u = {fmt(u)}): per-token rel err vs "
            f"recorded p99 {fmt(p99)} = {_units(tol, p99)} (limit {_units(tol, tol.drift_p99)}, "
            f"{room_text(tol.drift_p99, p99)}), max {fmt(peak)} = {_units(tol, peak)} (limit "
            f"{_units(tol, tol.drift_max)}, {room_text(tol.drift_max, peak)}); identity "
            f"{separation_text(att, identity_tols[c])}",
            chunk=c,
            details={"rel_err_p99": p99, "rel_err_max": peak, "rel_err_mean": ev.token_rel_err_mean,
                     "p99_units": tol.units(p99), "max_units": tol.units(peak),
                     "limit_p99_units": tol.units(tol.drift_p99), "limit_max_units": tol.units(tol.drift_max),
                     "unit_roundoff": u, "dtype": tol.dtype, "separation": att.separation,
                     "max_separation": identity_tols[c].max_separation, "max_abs_err": ev.max_abs_err,
                     "min_passing_atol": ev.min_passing_atol, "cosine": ev.cosine_at(0)}))
    return out


def recording_findings(table: AttributionTable, tols: Sequence[Tolerance]) -> list[Finding]:
    """The recording against the deployed target's atlas: self-consistency, or other weights."""
    rec = list(table.recorded)
    if table.atlas_nonfinite_tokens:
        return []  # a target that computes NaN/Inf matches nothing; the nonfinite finding says why
    if rec and all(a.attributed is None for a in rec):
        worst = min(rec, key=lambda a: a.expected_rel_err if math.isfinite(a.expected_rel_err) else math.inf)
        return [Finding(
            FindingKind.TARGET_MISMATCH, Severity.ERROR,
            f"no recorded chunk matches any boundary of the deployed target (closest: recorded chunk "
            f"{worst.index} vs {worst.best}, rel err {fmt(worst.rel_err)}, {separation_text(worst, tols[worst.index])}; "
            f"its own source {worst.expected} at rel err {fmt(worst.expected_rel_err)}): the deployed target has "
            f"other weights than the one training recorded",
            details={"reason": "weights", "recorded": [a.to_dict() for a in rec]},
            fix="deploy the target the drafter was trained against (the same checkpoint and revision)")]
    out: list[Finding] = []
    for att in rec:
        if att.attributed == att.expected:
            continue
        got = att.attributed or (f"no boundary (best {att.best} at rel err {fmt(att.rel_err)}, "
                                 f"{separation_text(att, tols[att.index])})")
        out.append(Finding(
            FindingKind.CONTRACT_SELF_INCONSISTENT, Severity.ERROR,
            f"recorded chunk {att.index} is {got}, the contract says {att.expected} "
            f"(rel err to {att.expected} {fmt(att.expected_rel_err)}, cosine {fmt(att.expected_cosine)}): "
            f"the contract does not describe its recording",
            chunk=att.index,
            details={"recorded": att.attributed, "expected": att.expected, "best": att.best,
                     "cosine": att.cosine, "expected_cosine": att.expected_cosine, "rel_err": att.rel_err,
                     "separation": att.separation}))
    return out
