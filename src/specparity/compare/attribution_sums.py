"""The helpers of :func:`specparity.compare.attribution.attribute`: its input checks, the float64 sums it
accumulates over samples, the exact per-token relative error of chosen (chunk, boundary) pairs and the ranking
of boundaries.

Each sample's statistics come from one pass over the atlas (compare/scan.py); :func:`_accumulate` adds them
to :class:`_Sums`, :func:`_exact_rel` recomputes chosen pairs from the difference itself, and :func:`_rank`
picks a chunk's best and runner-up boundary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from specparity.compare.scan import Backend, Pairs, TokenStats, scan
from specparity.errors import InputError
from specparity.sources import is_source, order_key


class _Sums:
    """float64 accumulators over samples."""

    def __init__(self, chunks: int, boundaries: int, pairs: int) -> None:
        shape = (chunks, boundaries)
        self.cos = torch.zeros(shape, dtype=torch.float64)
        self.count = torch.zeros(shape, dtype=torch.float64)
        self.diff2 = torch.zeros(shape, dtype=torch.float64)
        self.ref2 = torch.zeros(shape, dtype=torch.float64)
        self.rel = torch.zeros(shape, dtype=torch.float64)  # sum over tokens of per-token relative error
        self.atlas_nonfinite = torch.zeros(boundaries, dtype=torch.int64)
        # exact (chunk row, boundary col) pairs: sum |d|^2, sum |ref|^2, max |d|, max(|d| - rtol |ref|)
        self.pair_diff2 = torch.zeros(pairs, dtype=torch.float64)
        self.pair_ref2 = torch.zeros(pairs, dtype=torch.float64)
        self.pair_rel = torch.zeros(pairs, dtype=torch.float64)
        self.pair_count = torch.zeros(pairs, dtype=torch.float64)
        self.pair_max = torch.zeros(pairs, dtype=torch.float64)
        self.pair_excess = torch.full((pairs,), -math.inf, dtype=torch.float64)


def _check_2d(t: torch.Tensor, what: str, tokens: int | None) -> None:
    if t.ndim != 2:
        raise InputError(f"must be a [tokens, features] tensor, got shape {tuple(t.shape)}", field=what)
    if tokens is not None and t.shape[0] != tokens:
        raise InputError(f"has {t.shape[0]} tokens, the served fc input has {tokens}", field=what)
    if not t.is_floating_point():
        raise InputError(f"must be floating point, got {t.dtype}", field=what)


def _boundary_names(atlas: Mapping[str, torch.Tensor]) -> list[str]:
    bad = [n for n in atlas if not is_source(n)]
    if bad:
        raise InputError(f"names {bad} are not canonical sources (embedding, layer:<i>, final_norm)", field="atlas")
    if not atlas:
        raise InputError("is empty: nothing to attribute chunks to", field="atlas")
    return sorted(atlas, key=order_key)


def _accumulate(sums: _Sums, st: TokenStats, valid: torch.Tensor, pairs: Pairs) -> None:
    """Add one sample's statistics (compare/scan.py): Gram sums as they are, exact pairs per token."""
    g = st.gram
    assert g is not None
    sums.atlas_nonfinite += g.nonfinite
    sums.cos += g.cos
    sums.count += g.count
    sums.diff2 += g.diff2
    # per-token relative error: each token judged at its own scale (residual streams grow with depth)
    sums.rel += g.rel
    sums.ref2 += g.ref2
    fin_a = torch.isfinite(st.na2)
    if len(pairs):
        p_d2, p_r2 = st.pair_d2.double(), st.pair_b2.double()
        # sums over rows where both sides are finite; the maxima of any other valid row are NaN, so
        # such a pair never passes (a kernel's maximum is not trusted on a non-finite row)
        fin = torch.isfinite(p_d2) & torch.isfinite(p_r2) & fin_a[:, list(pairs.rows)]
        v = (valid[:, None] & fin).double()
        sums.pair_diff2 += (torch.where(fin, p_d2, 0.0) * v).sum(0)
        sums.pair_ref2 += (torch.where(fin, p_r2, 0.0) * v).sum(0)
        tok = torch.sqrt(torch.where(fin, p_d2, 0.0)) / torch.sqrt(torch.where(fin, p_r2, 0.0)).clamp_min(1e-300)
        sums.pair_rel += (tok * v).sum(0)
        sums.pair_count += v.sum(0)
        vm = valid[:, None]
        peak = torch.where(fin, st.pair_max.double(), math.nan)
        excess = torch.where(fin, st.pair_excess.double(), math.nan)
        sums.pair_max = torch.maximum(sums.pair_max, torch.where(vm, peak, -math.inf).amax(0))
        sums.pair_excess = torch.maximum(sums.pair_excess, torch.where(vm, excess, -math.inf).amax(0))


def _exact_rel(served: Sequence[torch.Tensor], recorded: Sequence[torch.Tensor],
               atlas: Sequence[Mapping[str, torch.Tensor]], valids: Sequence[torch.Tensor],
               wanted: Sequence[tuple[int, int]], names: Sequence[str], *, hidden: int,
               backend: Backend) -> dict[tuple[int, int], float]:
    """Mean per-token relative error of each (chunk row, boundary column) in ``wanted``, from the difference
    itself (one scan of just those boundaries per sample)."""
    used = sorted({j for _, j in wanted})
    local = {j: i for i, j in enumerate(used)}
    pairs = Pairs(rows=tuple(r for r, _ in wanted), cols=tuple(local[j] for _, j in wanted),
                  rtol=tuple(0.0 for _ in wanted), full=tuple(False for _ in wanted))
    total = torch.zeros(len(wanted), dtype=torch.float64)
    count = torch.zeros(len(wanted), dtype=torch.float64)
    ref2 = torch.zeros(len(wanted), dtype=torch.float64)
    for i in range(len(served)):
        if not int(valids[i].shape[0]):
            continue
        st = scan(served[i], recorded[i], [atlas[i][names[j]] for j in used], valids[i], hidden=hidden, pairs=pairs,
                  evidence_rtol=(), gram=False, backend=backend)
        d2, b2 = st.pair_d2.double(), st.pair_b2.double()
        ok = torch.isfinite(d2) & torch.isfinite(b2) & torch.isfinite(st.na2[:, list(pairs.rows)]) & valids[i][:, None]
        tok = torch.sqrt(torch.where(ok, d2, 0.0)) / torch.sqrt(torch.where(ok, b2, 0.0)).clamp_min(1e-300)
        total += (tok * ok).sum(0)
        count += ok.sum(0)
        ref2 += torch.where(ok, b2, 0.0).sum(0)
    # like the Gram form: a boundary with no valid token or no energy matches nothing
    return {w: (float(total[p] / count[p]) if count[p] and ref2[p] > 0 else math.inf) for p, w in enumerate(wanted)}


def _rank(rel_row: torch.Tensor) -> tuple[int, int | None]:
    """The boundaries with the smallest and second-smallest relative error (NaN ranks last)."""
    ranked = torch.where(torch.isnan(rel_row), math.inf, rel_row)
    if ranked.numel() == 1:
        return 0, None
    top = torch.topk(ranked, 2, largest=False)
    return int(top.indices[0]), int(top.indices[1])
