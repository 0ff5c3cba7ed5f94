"""Static against capture: the layers the engine resolved for fc, and the layers its captured fc input really is.

At the capture level the engine's own setter resolves the capture list on the live objects
(``ResolvedDeployment.served_sources``: the answer ``specparity explain`` and ``--level static`` give, from the same
setter), and the captured fc input is attributed chunk by chunk to the boundary it equals
(:mod:`specparity.compare.attribution`). The two must name the same layers. Where they do not, the static answer
is wrong for this deployment (a layer loop that captures by another rule than its capture list, a release the
conventions misread), and that is a finding of its own: never a silent pass, even when the capture
matches the contract.

Compared only where both are complete: every served chunk attributed within tolerance and as many chunks as the
static list names. A chunk that matches no boundary, or a count that differs, is already its own finding
(``layout_mismatch``, ``capture_count_short``, ``width_mismatch``) with its own evidence.
"""

from __future__ import annotations

from collections.abc import Sequence

from specparity.compare.findings import Finding, FindingKind, Severity, engine_label


def static_capture_findings(static: Sequence[str], captured: Sequence[str | None], *, engine: str,
                            version: str | None, architecture: str | None) -> list[Finding]:
    """A ``static_capture_disagreement`` error where the resolved layers differ from the captured ones."""
    if len(static) != len(captured) or any(c is None for c in captured) or list(static) == list(captured):
        return []
    differ = [i for i, (s, c) in enumerate(zip(static, captured, strict=True)) if s != c]
    label = f"{engine_label(engine)} {version}" if version else engine_label(engine)
    return [Finding(
        FindingKind.STATIC_CAPTURE_DISAGREEMENT, Severity.ERROR,
        f"{label} resolved fc's input as {list(static)} (its setter's capture list), but the fc input captured "
        f"from the same engine is {list(captured)} (chunks {differ} differ): `specparity explain` and the static "
        f"level name the wrong layers for this deployment ({architecture or 'this target'}); the capture is what "
        "is served",
        details={"check": "static", "static": list(static), "captured": list(captured), "chunks": differ,
                 "engine": engine, "version": version},
        fix="trust the capture level for this deployment, and report the static answer as a specparity bug")]
