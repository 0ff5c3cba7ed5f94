"""Attribute every fc-input chunk, served and recorded, to a canonical source.

Inputs per sample: the served fc input ``[T, k_s*H]`` (what SGLang fed ``fc``), the recorded
``aux_hidden_state`` ``[T, k_r*H]`` (what training fed ``fc``; chunk order = the contract's
sources), and a layer atlas ``{canonical source: [T, H]}`` from the serving target. Chunks are
``H``-wide slices in fc order (sglang 0.5.23 layers/aux_hidden_states.py:97-102 concatenates on the
feature dim). Row ``t`` of every tensor belongs to token ``t`` (domain.md §1 "Alignment").

One pass over the atlas (compare/scan.py) gives every chunk-by-boundary dot product and the per-token
norms; they complete cosine and the (Gram) per-token relative error ``||x_t - b_t|| / ||b_t||``,
averaged over tokens, which *ranks* the boundaries. The numbers that are reported and judged are exact,
from the difference itself: the pairs a chunk is *expected* to match get it in the same pass, and every
chunk's best and runner-up (and any boundary the Gram form cannot tell from them) in a second, small
scan of just those boundaries; so a near-exact match is never judged on Gram round-off.

Identity is scale-free (compare/tolerances.py): the best candidate is the boundary with the smallest
mean relative error, and its *separation* (that error over the runner-up's) must be small.

The input checks, the sums over samples, the exact second scan and the ranking are in
:mod:`specparity.compare.attribution_sums`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from specparity.compare.attribution_sums import (
    _accumulate,
    _boundary_names,
    _check_2d,
    _exact_rel,
    _rank,
    _Sums,
)
from specparity.compare.evidence import ChunkEvidence, EvidenceAccumulator
from specparity.compare.scan import Backend, Pairs, scan
from specparity.compare.tolerances import Tolerance, identity_holds, resolve_tolerance, separation
from specparity.errors import InputError
from specparity.sources import order_key

Side = Literal["served", "recorded"]


@dataclass(frozen=True)
class ChunkAttribution:
    """Which source one chunk carries.

    ``best`` is the boundary with the smallest mean per-token relative error ``rel_err``; ``attributed``
    is ``best``, or None ("unknown") when ``rel_err`` exceeds the identity limit or ``separation``
    (``rel_err`` over the runner-up's ``runner_up_rel_err``) is not small enough. ``cosine`` is against
    ``best``; ``margin`` is best minus runner-up cosine (context). ``max_abs_err`` and ``min_passing_atol`` compare the chunk with
    what it should equal: for a served chunk the recorded chunk of the same index, for a recorded
    chunk the atlas state of its expected source (NaN when there is no counterpart).
    """

    index: int
    side: Side
    expected: str | None
    attributed: str | None
    cosine: float
    rel_err: float
    runner_up: str | None
    runner_up_cosine: float
    margin: float
    max_abs_err: float
    min_passing_atol: float
    best: str | None = None
    expected_cosine: float = math.nan
    expected_rel_err: float = math.nan
    separation: float = math.nan
    runner_up_rel_err: float = math.nan

    def to_dict(self) -> dict[str, object]:
        """Plain-JSON view."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class AttributionTable:
    """Both sides' attributions plus the full chunk-by-boundary matrices (rows: chunks, cols: boundaries)."""

    boundaries: tuple[str, ...]
    served: tuple[ChunkAttribution, ...]
    recorded: tuple[ChunkAttribution, ...]
    served_cosine: tuple[tuple[float, ...], ...]
    recorded_cosine: tuple[tuple[float, ...], ...]
    served_rel_err: tuple[tuple[float, ...], ...]
    recorded_rel_err: tuple[tuple[float, ...], ...]
    evidence: tuple[ChunkEvidence, ...]
    hidden_size: int
    valid_tokens: int
    samples: int
    atlas_nonfinite_tokens: tuple[tuple[str, int], ...] = ()

    def served_sources(self) -> list[str | None]:
        """The attributed source of each served chunk, in fc order."""
        return [c.attributed for c in self.served]

    def recorded_sources(self) -> list[str | None]:
        """The attributed source of each recorded chunk, in fc order."""
        return [c.attributed for c in self.recorded]

    def heatmap(self) -> tuple[list[str], list[str], list[list[float]]]:
        """Row labels, column labels and cosine values for a heatmap (served rows, then recorded)."""
        rows = [f"served {c.index}" for c in self.served] + [f"recorded {c.index}" for c in self.recorded]
        values = [list(r) for r in self.served_cosine] + [list(r) for r in self.recorded_cosine]
        return rows, list(self.boundaries), values

    def to_dict(self) -> dict[str, object]:
        """Plain-JSON view."""
        return {
            "boundaries": list(self.boundaries),
            "served": [c.to_dict() for c in self.served],
            "recorded": [c.to_dict() for c in self.recorded],
            "served_cosine": [list(r) for r in self.served_cosine],
            "recorded_cosine": [list(r) for r in self.recorded_cosine],
            "served_rel_err": [list(r) for r in self.served_rel_err],
            "recorded_rel_err": [list(r) for r in self.recorded_rel_err],
            "evidence": [e.to_dict() for e in self.evidence],
            "hidden_size": self.hidden_size,
            "valid_tokens": self.valid_tokens,
            "samples": self.samples,
            "atlas_nonfinite_tokens": dict(self.atlas_nonfinite_tokens),
        }


# Below this Gram relative error a boundary is recomputed exactly: the Gram form's float32 round-off
# (~1e-6 of ||a||^2 + ||b||^2 per token) is then no longer small next to ||a - b||^2.
GRAM_FLOOR = 1e-2
# A boundary whose Gram relative error is within this factor of the exact runner-up's is recomputed
# exactly too, so the float32 round-off of the Gram form can never pick the wrong runner-up.
GRAM_SLACK = 1.02


def attribute(
    served: Sequence[torch.Tensor],
    recorded: Sequence[torch.Tensor],
    atlas: Sequence[Mapping[str, torch.Tensor]],
    *,
    expected: Sequence[str],
    tolerance: Tolerance,
    overrides: Mapping[int | str, Tolerance] | None = None,
    masks: Sequence[torch.Tensor | None] | None = None,
    block_tokens: int = 8,
    recorded_tolerance: Tolerance | None = None,
    recorded_overrides: Mapping[int | str, Tolerance] | None = None,
    backend: Backend = "auto",
) -> AttributionTable:
    """Attribute every served and recorded chunk of every sample to an atlas boundary.

    ``served[i]``, ``recorded[i]``, ``atlas[i]`` (and ``masks[i]``, bool ``[T]``, True = compare this
    token; pad positions are False, domain.md §4) describe sample ``i``. ``expected`` are the
    contract's sources in fc-chunk order; recorded chunk ``c`` is expected to be ``expected[c]``.
    Similarities are averaged over valid tokens of all samples. ``tolerance`` (and ``overrides``)
    judge served chunks against the atlas; ``recorded_tolerance`` (default: ``tolerance``) and
    ``recorded_overrides`` judge recorded chunks against it: each the coarser dtype's of its pair.
    Raises :class:`InputError` on malformed input or when no token is valid.
    """
    if not (len(served) == len(recorded) == len(atlas)) or not served:
        raise InputError(
            f"need the same non-zero number of samples, got served {len(served)}, recorded {len(recorded)}, "
            f"atlas {len(atlas)}",
            field="samples",
        )
    if masks is not None and len(masks) != len(served):
        raise InputError(f"{len(masks)} masks for {len(served)} samples", field="masks")
    names = _boundary_names(atlas[0])
    col = {n: j for j, n in enumerate(names)}
    first = atlas[0][names[0]]
    hidden = int(first.shape[-1])
    k_s, k_r = served[0].shape[-1] // hidden, recorded[0].shape[-1] // hidden
    for i, (s, r, a) in enumerate(zip(served, recorded, atlas, strict=True)):
        _check_2d(s, f"served[{i}]", None)
        tokens = int(s.shape[0])
        _check_2d(r, f"recorded[{i}]", tokens)
        if _boundary_names(a) != names:
            raise InputError(f"sample {i} has boundaries {sorted(a, key=order_key)}, sample 0 has {names}", field="atlas")
        for n in names:
            _check_2d(a[n], f"atlas[{i}][{n}]", tokens)
            if a[n].shape[1] != hidden:
                raise InputError(f"is {a[n].shape[1]} wide, other boundaries are {hidden}", field=f"atlas[{i}][{n}]")
        for what, t, k in (("served", s, k_s), ("recorded", r, k_r)):
            if t.shape[1] % hidden or t.shape[1] == 0:
                raise InputError(
                    f"is {t.shape[1]} wide: not a multiple of the atlas hidden size {hidden}", field=f"{what}[{i}]"
                )
            if t.shape[1] // hidden != k:
                raise InputError(f"has {t.shape[1] // hidden} chunks, sample 0 has {k}", field=f"{what}[{i}]")
    if len(expected) != k_r:
        raise InputError(f"the contract names {len(expected)} sources, the recording has {k_r} chunks", field="expected")
    tols = [resolve_tolerance(tolerance, overrides, chunk=c, source=expected[c] if c < k_r else None)
            for c in range(max(k_s, k_r))]
    rec_base = recorded_tolerance if recorded_tolerance is not None else tolerance
    rec_over = recorded_overrides if recorded_tolerance is not None else overrides
    rec_tols = [resolve_tolerance(rec_base, rec_over, chunk=c, source=expected[c]) for c in range(k_r)]
    # exact pairs: every chunk (served rows 0..k_s-1, recorded rows k_s..) against its expected source
    pair_list: list[tuple[int, int, float]] = []
    for c in range(k_r):
        if expected[c] in col:
            if c < k_s:
                pair_list.append((c, col[expected[c]], tols[c].rtol))
            pair_list.append((k_s + c, col[expected[c]], tols[c].rtol))
    n_expected = len(pair_list)
    # and, in the same pass, the two boundaries next to each expected source: for a correct chunk they are
    # the runner-up candidates (a residual stream changes gradually with depth), so as a rule the exact
    # best and runner-up need no second scan (measured: a second scan costs ~10% of the first)
    for row, j, rtol in pair_list[:n_expected]:
        pair_list.extend((row, n, rtol) for n in (j - 1, j + 1) if 0 <= n < len(names))
    pairs = Pairs(rows=tuple(p[0] for p in pair_list), cols=tuple(p[1] for p in pair_list),
                  rtol=tuple(p[2] for p in pair_list), full=tuple(p < n_expected for p in range(len(pair_list))))
    sums = _Sums(k_s + k_r, len(names), len(pair_list))
    evidence = [EvidenceAccumulator(c, rtol=tols[c].rtol) for c in range(min(k_s, k_r))]
    valids: list[torch.Tensor] = []
    for i in range(len(served)):
        tokens = int(served[i].shape[0])
        mask = masks[i] if masks is not None else None
        if mask is None:
            valid = torch.ones(tokens, dtype=torch.bool)
        else:
            if mask.shape != (tokens,):
                raise InputError(f"has shape {tuple(mask.shape)}, expected ({tokens},)", field=f"masks[{i}]")
            valid = mask.to(torch.bool).cpu()
        valids.append(valid)
        if tokens == 0:
            continue
        st = scan(served[i], recorded[i], [atlas[i][n] for n in names], valid, hidden=hidden, pairs=pairs,
                  evidence_rtol=[ev.rtol for ev in evidence], gram=True, block_tokens=max(1, block_tokens),
                  backend=backend)
        _accumulate(sums, st, valid, pairs)
        for ev, ev_stats in zip(evidence, st.evidence, strict=True):
            c = ev.index
            ev.add_stats(ev_stats, valid, served=served[i][:, c * hidden:(c + 1) * hidden],
                         recorded=recorded[i][:, c * hidden:(c + 1) * hidden])
    valid_tokens = sum(int(v.sum()) for v in valids)
    if valid_tokens == 0:
        raise InputError("no valid token to compare (every position is masked out or the capture is empty)",
                         field="masks")
    cos = sums.cos / sums.count.clamp_min(1.0)
    cos = torch.where(sums.count > 0, cos, math.nan)
    rel = sums.rel / sums.count.clamp_min(1.0)
    rel = torch.where((sums.count > 0) & (sums.ref2 > 0), rel, math.inf)
    exact_stats: dict[int, tuple[float, float]] = {}
    exact: set[tuple[int, int]] = set()
    for p, (row, j, _) in enumerate(pair_list):
        ref2, npair = float(sums.pair_ref2[p]), float(sums.pair_count[p])
        rel[row, j] = float(sums.pair_rel[p]) / npair if ref2 > 0 and npair > 0 else math.inf
        exact.add((row, j))
        if p < n_expected:
            peak = float(sums.pair_max[p])
            exact_stats[row] = (peak, max(float(sums.pair_excess[p]), 0.0) if math.isfinite(peak) else math.inf)
    served_ev = [ev.result() for ev in evidence]
    # The Gram form ranks; what is reported and judged is exact. Every boundary that could be a chunk's best
    # or runner-up gets its exact difference: the current best two, any the Gram form cannot resolve
    # (below GRAM_FLOOR: a near-duplicate of the expected one, so a tie is seen as a tie) and any within
    # GRAM_SLACK of the runner-up; until the best two of every chunk are exact (one round, as a rule).
    for _ in range(len(names) + 1):
        wanted: set[tuple[int, int]] = set()
        for row in range(k_s + k_r):
            best, second = _rank(rel[row])
            limit = GRAM_FLOOR
            if second is not None and math.isfinite(float(rel[row, second])):
                limit = max(limit, float(rel[row, second]) * GRAM_SLACK)
            near = {int(j) for j in (rel[row] <= limit).nonzero().flatten().tolist()}
            wanted |= {(row, j) for j in near | {best} | ({second} if second is not None else set())
                       if (row, j) not in exact}
        if not wanted:
            break
        found = _exact_rel(served, recorded, atlas, valids, sorted(wanted), names, hidden=hidden, backend=backend)
        for (row, j), value in found.items():
            rel[row, j] = value
        exact |= wanted

    def build(row: int, side: Side, c: int) -> ChunkAttribution:
        exp = expected[c] if c < k_r else None
        best, second = _rank(rel[row])
        best_cos = float(cos[row, best])
        second_cos = float(cos[row, second]) if second is not None else -1.0
        margin = best_cos - second_cos if math.isfinite(best_cos) else math.nan
        best_rel = float(rel[row, best])
        second_rel = float(rel[row, second]) if second is not None else math.inf
        sep = separation(best_rel, second_rel)
        tol = tols[c] if side == "served" else rec_tols[c]
        ok = identity_holds(rel_err=best_rel, separation=sep, tolerance=tol)
        if side == "served":
            ev = served_ev[c] if c < len(served_ev) else None
            max_abs = ev.max_abs_err if ev else math.nan
            passing = ev.min_passing_atol if ev else math.nan
        else:
            max_abs, passing = exact_stats.get(row, (math.nan, math.nan))
        return ChunkAttribution(
            index=c, side=side, expected=exp, attributed=names[best] if ok else None,
            cosine=best_cos, rel_err=best_rel,
            runner_up=names[second] if second is not None else None, runner_up_cosine=second_cos,
            margin=margin, max_abs_err=max_abs, min_passing_atol=passing, best=names[best],
            expected_cosine=float(cos[row, col[exp]]) if exp in col else math.nan,
            expected_rel_err=float(rel[row, col[exp]]) if exp in col else math.nan,
            separation=sep, runner_up_rel_err=second_rel,
        )

    def matrix(t: torch.Tensor) -> tuple[tuple[float, ...], ...]:
        return tuple(tuple(float(x) for x in r) for r in t.tolist())

    return AttributionTable(
        boundaries=tuple(names),
        served=tuple(build(c, "served", c) for c in range(k_s)),
        recorded=tuple(build(k_s + c, "recorded", c) for c in range(k_r)),
        served_cosine=matrix(cos[:k_s]),
        recorded_cosine=matrix(cos[k_s:]),
        served_rel_err=matrix(rel[:k_s]),
        recorded_rel_err=matrix(rel[k_s:]),
        evidence=tuple(served_ev),
        hidden_size=hidden,
        valid_tokens=valid_tokens,
        samples=len(served),
        atlas_nonfinite_tokens=tuple((names[j], int(n)) for j, n in enumerate(sums.atlas_nonfinite.tolist()) if n),
    )
