"""Attribute every fc-input chunk, served and recorded, to a canonical source.

Inputs per sample: the served fc input ``[T, k_s*H]`` (what SGLang fed ``fc``), the recorded
``aux_hidden_state`` ``[T, k_r*H]`` (what training fed ``fc``; chunk order = the contract's
sources), and a layer atlas ``{canonical source: [T, H]}`` from the serving target. Chunks are
``H``-wide slices in fc order (sglang 0.5.23 layers/aux_hidden_states.py:97-102 concatenates on the
feature dim). Row ``t`` of every tensor belongs to token ``t`` (domain.md §1 "Alignment").

One pass over the atlas: per block of tokens, all boundaries are stacked into a float32 buffer and
one batched matmul gives every chunk-by-boundary dot product; per-token norms complete cosine and
(Gram) per-token relative error ``||x_t - b_t|| / ||b_t||``, averaged over tokens. The pairs a chunk
is *expected* to match also get their exact difference in the same pass, so a correct near-exact match
is never judged on Gram round-off.

Identity is scale-free (compare/tolerances.py): the best candidate is the boundary with the smallest
mean relative error, and its *separation* (that error over the runner-up's) must be small.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from specparity.compare.evidence import ChunkEvidence, EvidenceAccumulator
from specparity.compare.tolerances import Tolerance, identity_holds, resolve_tolerance, separation
from specparity.errors import InputError
from specparity.sources import is_source, order_key

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


def _accumulate_sample(
    sums: _Sums,
    chunks: list[torch.Tensor],
    names: list[str],
    atlas: Mapping[str, torch.Tensor],
    valid: torch.Tensor,
    *,
    hidden: int,
    pairs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    block_tokens: int,
) -> None:
    """Add one sample. ``chunks`` are ``[T, c_i*H]`` tensors (served, then recorded)."""
    tokens = int(valid.shape[0])
    if tokens == 0:
        return
    per = [c.shape[1] // hidden for c in chunks]
    rows, cols = sum(per), len(names)
    tb_max = min(block_tokens, tokens)
    # everything runs where the atlas lives (CPU or an accelerator); only [T, rows, cols] results come back
    dev = atlas[names[0]].device
    chunks = [c.to(dev) for c in chunks]
    buf = torch.empty(tb_max, cols, hidden, dtype=torch.float32, device=dev)
    abuf = torch.empty(tb_max, rows, hidden, dtype=torch.float32, device=dev)
    dots = torch.zeros(tokens, rows, cols, dtype=torch.float32, device=dev)
    na = torch.zeros(tokens, rows, dtype=torch.float32, device=dev)
    nb = torch.zeros(tokens, cols, dtype=torch.float32, device=dev)
    pair_rows, pair_cols, pair_rtol = (p.to(dev) for p in pairs)
    npairs = int(pair_rows.numel())
    p_d = torch.zeros(tokens, npairs, dtype=torch.float32, device=dev)
    p_r = torch.zeros(tokens, npairs, dtype=torch.float32, device=dev)
    p_max = torch.zeros(tokens, npairs, dtype=torch.float32, device=dev)
    p_exc = torch.zeros(tokens, npairs, dtype=torch.float32, device=dev)
    # work buffers are allocated once: fresh allocations per block cost more in page faults than the math
    rbuf = torch.empty(tb_max, npairs, hidden, dtype=torch.float32, device=dev)
    dbuf = torch.empty(tb_max, npairs, hidden, dtype=torch.float32, device=dev)
    rtol = pair_rtol[None, :, None]
    for t0 in range(0, tokens, block_tokens):
        t1 = min(t0 + block_tokens, tokens)
        tb = t1 - t0
        if not bool(valid[t0:t1].any()):
            continue  # a block of pad positions only
        b = buf[:tb]
        a = abuf[:tb]
        # the one read of every boundary's rows, cast to float32 while copying
        torch.stack([atlas[n][t0:t1] for n in names], dim=1, out=b)
        torch.cat([c[t0:t1].reshape(tb, k, hidden) for c, k in zip(chunks, per, strict=True)], dim=1, out=a)
        torch.bmm(a, b.transpose(1, 2), out=dots[t0:t1])
        torch.linalg.vector_norm(a, dim=-1, out=na[t0:t1])
        torch.linalg.vector_norm(b, dim=-1, out=nb[t0:t1])
        if npairs:
            ref = rbuf[:tb]
            d = dbuf[:tb]
            torch.index_select(b, 1, pair_cols, out=ref)
            torch.index_select(a, 1, pair_rows, out=d)
            d.sub_(ref)
            torch.linalg.vector_norm(d, dim=-1, out=p_d[t0:t1])
            torch.linalg.vector_norm(ref, dim=-1, out=p_r[t0:t1])
            d.abs_()
            torch.amax(d, dim=-1, out=p_max[t0:t1])
            ref.abs_().mul_(rtol)
            torch.amax(d.sub_(ref), dim=-1, out=p_exc[t0:t1])
    dots, na2, nb2, p_d2, p_r2 = (x.cpu() for x in (dots, na.square(), nb.square(), p_d.square(), p_r.square()))
    p_max, p_exc = p_max.cpu(), p_exc.cpu()
    # everything below is on [T, rows, cols]: small next to the atlas
    fin_a = torch.isfinite(na2)
    fin_b = torch.isfinite(nb2)
    sums.atlas_nonfinite += (~fin_b & valid[:, None]).sum(0)
    ok = torch.isfinite(dots) & fin_a[:, :, None] & fin_b[:, None, :] & valid[:, None, None]
    w = ok.double()
    dd = torch.where(ok, dots, 0.0).double()
    a2 = torch.where(fin_a, na2, 0.0).double()[:, :, None]
    b2 = torch.where(fin_b, nb2, 0.0).double()[:, None, :]
    sums.cos += (dd / torch.sqrt(a2 * b2).clamp_min(1e-300) * w).sum(0)
    sums.count += w.sum(0)
    d2 = (a2 + b2 - 2.0 * dd).clamp_min(0.0)
    sums.diff2 += (d2 * w).sum(0)
    # per-token relative error: each token judged at its own scale (residual streams grow with depth)
    sums.rel += (torch.sqrt(d2) / torch.sqrt(b2).clamp_min(1e-300) * w).sum(0)
    sums.ref2 += (b2 * w).sum(0)
    if npairs:
        # sums over rows where both sides are finite; the maxima keep NaN so such a pair never passes
        v = (valid[:, None] & torch.isfinite(p_d2) & torch.isfinite(p_r2)).double()
        sums.pair_diff2 += (torch.nan_to_num(p_d2.double(), nan=0.0, posinf=0.0) * v).sum(0)
        sums.pair_ref2 += (torch.nan_to_num(p_r2.double(), nan=0.0, posinf=0.0) * v).sum(0)
        tok = torch.sqrt(torch.nan_to_num(p_d2.double(), nan=0.0, posinf=0.0)) / torch.sqrt(
            torch.nan_to_num(p_r2.double(), nan=0.0, posinf=0.0)).clamp_min(1e-300)
        sums.pair_rel += (tok * v).sum(0)
        sums.pair_count += v.sum(0)
        vm = valid[:, None]
        sums.pair_max = torch.maximum(sums.pair_max, torch.where(vm, p_max.double(), -math.inf).amax(0))
        sums.pair_excess = torch.maximum(sums.pair_excess, torch.where(vm, p_exc.double(), -math.inf).amax(0))


GRAM_FLOOR = 1e-2


def _exact_rel(served: Sequence[torch.Tensor], recorded: Sequence[torch.Tensor],
               atlas: Sequence[Mapping[str, torch.Tensor]], masks: Sequence[torch.Tensor | None] | None, *,
               row: int, name: str, k_s: int, hidden: int) -> float:
    """Mean per-token relative error of chunk ``row`` (served rows first) against boundary ``name``, exactly."""
    total, count = 0.0, 0.0
    for i in range(len(served)):
        src, c = (served[i], row) if row < k_s else (recorded[i], row - k_s)
        a = src[:, c * hidden:(c + 1) * hidden].float()
        b = atlas[i][name].to(a.device).float()
        tok = torch.linalg.vector_norm(a - b, dim=-1).double() / torch.linalg.vector_norm(b, dim=-1).double().clamp_min(1e-300)
        m = masks[i] if masks is not None else None
        ok = torch.isfinite(tok) & (m.to(torch.bool).to(tok.device) if m is not None else True)
        total += float(tok[ok].sum())
        count += float(ok.sum())
    return total / count if count else math.inf


def _rank(rel_row: torch.Tensor) -> tuple[int, int | None]:
    """The boundaries with the smallest and second-smallest relative error (NaN ranks last)."""
    ranked = torch.where(torch.isnan(rel_row), math.inf, rel_row)
    if ranked.numel() == 1:
        return 0, None
    top = torch.topk(ranked, 2, largest=False)
    return int(top.indices[0]), int(top.indices[1])


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
    pairs = (
        torch.tensor([p[0] for p in pair_list], dtype=torch.long),
        torch.tensor([p[1] for p in pair_list], dtype=torch.long),
        torch.tensor([p[2] for p in pair_list], dtype=torch.float32),
    )
    sums = _Sums(k_s + k_r, len(names), len(pair_list))
    evidence = [EvidenceAccumulator(c, rtol=tols[c].rtol) for c in range(min(k_s, k_r))]
    valid_tokens = 0
    for i in range(len(served)):
        tokens = int(served[i].shape[0])
        mask = masks[i] if masks is not None else None
        if mask is None:
            valid = torch.ones(tokens, dtype=torch.bool)
        else:
            if mask.shape != (tokens,):
                raise InputError(f"has shape {tuple(mask.shape)}, expected ({tokens},)", field=f"masks[{i}]")
            valid = mask.to(torch.bool)
        valid_tokens += int(valid.sum())
        _accumulate_sample(sums, [served[i], recorded[i]], names, atlas[i], valid, hidden=hidden,
                           pairs=pairs, block_tokens=max(1, block_tokens))
        dev = served[i].device
        for ev in evidence:
            c = ev.index
            ev.add(served[i][:, c * hidden:(c + 1) * hidden],
                   recorded[i][:, c * hidden:(c + 1) * hidden].to(dev), valid.to(dev))
    if valid_tokens == 0:
        raise InputError("no valid token to compare (every position is masked out or the capture is empty)",
                         field="masks")
    cos = sums.cos / sums.count.clamp_min(1.0)
    cos = torch.where(sums.count > 0, cos, math.nan)
    rel = sums.rel / sums.count.clamp_min(1.0)
    rel = torch.where((sums.count > 0) & (sums.ref2 > 0), rel, math.inf)
    exact_stats: dict[int, tuple[float, float]] = {}
    for p, (row, j, _) in enumerate(pair_list):
        ref2, npair = float(sums.pair_ref2[p]), float(sums.pair_count[p])
        if ref2 > 0 and npair > 0:
            rel[row, j] = float(sums.pair_rel[p]) / npair
        peak = float(sums.pair_max[p])
        exact_stats[row] = (peak, max(float(sums.pair_excess[p]), 0.0) if math.isfinite(peak) else math.inf)
    served_ev = [ev.result() for ev in evidence]
    # the Gram form cannot resolve a relative error below ~sqrt(float32 eps); a boundary that close to a
    # chunk (a near-duplicate of the expected one) gets its exact difference, so a tie is seen as a tie
    exact_pairs = {(row, j) for row, j, _ in pair_list}
    close = [(int(r), int(j)) for r, j in (rel < GRAM_FLOOR).nonzero().tolist() if (int(r), int(j)) not in exact_pairs]
    for row, j in close:
        rel[row, j] = _exact_rel(served, recorded, atlas, masks, row=row, name=names[j], k_s=k_s, hidden=hidden)

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
