"""The scan of :func:`specparity.compare.attribution.attribute`: every chunk against every atlas boundary, over
all samples.

One pass over each sample's atlas (compare/scan.py) gives every chunk-by-boundary dot product and the per-token
norms; they complete cosine and the (Gram) per-token relative error ``||x_t - b_t|| / ||b_t||``, averaged over
valid tokens, which *ranks* the boundaries. The numbers that are reported and judged are exact, from the
difference itself: the pairs a chunk is *expected* to match get it in the same pass, and every chunk's best and
runner-up (and any boundary the Gram form cannot tell from them) in a second, small scan of just those
boundaries; so a near-exact match is never judged on Gram round-off.

:func:`scan_samples` takes the checked inputs (:class:`Samples`) and gives :class:`AtlasScan`: the mean cosine
and relative-error matrices (rows: served chunks, then recorded; columns: boundaries in source order), each
row's best and runner-up, the maxima of each row against its expected source, and each sample's per-token
served-vs-recorded statistics, which drift is computed from.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from specparity.compare.reduced import ReducedSample
from specparity.compare.scan import Backend, Pairs, TokenPairStats, TokenStats, expected_pairs, scan

# Below this Gram relative error a boundary is recomputed exactly: the Gram form's float32 round-off
# (~1e-6 of ||a||^2 + ||b||^2 per token) is then no longer small next to ||a - b||^2.
GRAM_FLOOR = 1e-2
# A boundary whose Gram relative error is within this factor of the exact runner-up's is recomputed
# exactly too, so the float32 round-off of the Gram form can never pick the wrong runner-up.
GRAM_SLACK = 1.02


@dataclass(frozen=True)
class Samples:
    """What attribution compares, checked: per sample ``i`` the served fc input ``served[i]`` ``[T, k_s*H]``, the
    recorded ``recorded[i]`` ``[T, k_r*H]``, the atlas ``atlas[i]`` ``{boundary: [T, H]}`` and ``valids[i]``, bool
    ``[T]`` on the CPU (True = compare this token). ``names`` are the boundaries in source order."""

    served: Sequence[torch.Tensor]
    recorded: Sequence[torch.Tensor]
    atlas: Sequence[Mapping[str, torch.Tensor]]
    valids: tuple[torch.Tensor, ...]
    names: tuple[str, ...]
    hidden: int
    k_s: int
    k_r: int
    # the atlas reduced where it was (compare/reduced.py): the per-sample statistics of the scan, atlas unused
    reduced: Sequence[ReducedSample] | None = None


@dataclass(frozen=True)
class AtlasScan:
    """Every chunk row (served ``0..k_s-1``, then recorded) against every boundary, over valid tokens of all samples.

    ``cos`` and ``rel`` ``[R, C]`` (float64) are the mean per-token cosine (NaN: no valid token) and relative error
    (inf: no valid token or no energy), ``rel`` exact wherever a row's best and runner-up could be; ``ranks[row]``
    is that row's best and runner-up column (None: one boundary only). ``expected_maxima[row]`` is ``max |a-b|``
    and the smallest passing atol of the row against its expected source (rows whose source is in the atlas).
    ``token_stats`` holds, for each sample with tokens, served chunk ``c`` against recorded chunk ``c``.
    """

    cos: torch.Tensor
    rel: torch.Tensor
    ranks: tuple[tuple[int, int | None], ...]
    expected_maxima: Mapping[int, tuple[float, float]]
    token_stats: tuple[tuple[int, tuple[TokenPairStats, ...]], ...]
    atlas_nonfinite: tuple[tuple[str, int], ...]


class _Sums:
    """float64 accumulators over samples."""

    def __init__(self, chunks: int, boundaries: int, pairs: int) -> None:
        shape = (chunks, boundaries)
        self.cos = torch.zeros(shape, dtype=torch.float64)
        self.count = torch.zeros(shape, dtype=torch.float64)
        self.ref2 = torch.zeros(shape, dtype=torch.float64)
        self.rel = torch.zeros(shape, dtype=torch.float64)  # sum over tokens of per-token relative error
        self.atlas_nonfinite = torch.zeros(boundaries, dtype=torch.int64)
        # exact (chunk row, boundary col) pairs: sum |ref|^2, sum of per-token rel err, max |d|, max(|d| - rtol |ref|)
        self.pair_ref2 = torch.zeros(pairs, dtype=torch.float64)
        self.pair_rel = torch.zeros(pairs, dtype=torch.float64)
        self.pair_count = torch.zeros(pairs, dtype=torch.float64)
        self.pair_max = torch.zeros(pairs, dtype=torch.float64)
        self.pair_excess = torch.full((pairs,), -math.inf, dtype=torch.float64)


def scan_samples(samples: Samples, *, expected: Sequence[str], rtol: Sequence[float], block_tokens: int,
                 backend: Backend) -> AtlasScan:
    """One pass over every sample's atlas, then the exact second look at each row's candidates.

    ``expected[c]`` is recorded chunk ``c``'s source (served chunk ``c`` should carry it too) and ``rtol[c]`` chunk
    ``c``'s rtol, for the smallest passing atol against the expected source and against the recorded chunk.
    """
    pairs = expected_pairs(samples.names, samples.k_s, samples.k_r, expected, rtol)
    sums = _Sums(samples.k_s + samples.k_r, len(samples.names), len(pairs))
    evidence_rtol = list(rtol[:min(samples.k_s, samples.k_r)])
    token_stats = []
    for i, st in _each_sample(samples, pairs, columns=range(len(samples.names)), evidence_rtol=evidence_rtol,
                              gram=True, block_tokens=block_tokens, backend=backend):
        _accumulate(sums, st, samples.valids[i], pairs)
        token_stats.append((i, st.evidence))
    cos = torch.where(sums.count > 0, sums.cos / sums.count.clamp_min(1.0), math.nan)
    rel = sums.rel / sums.count.clamp_min(1.0)
    rel = torch.where((sums.count > 0) & (sums.ref2 > 0), rel, math.inf)
    maxima: dict[int, tuple[float, float]] = {}
    for p, (row, j, full) in enumerate(zip(pairs.rows, pairs.cols, pairs.wants_maxima(), strict=True)):
        ref2, npair = float(sums.pair_ref2[p]), float(sums.pair_count[p])
        rel[row, j] = float(sums.pair_rel[p]) / npair if ref2 > 0 and npair > 0 else math.inf
        if full:
            peak = float(sums.pair_max[p])
            maxima[row] = (peak, max(float(sums.pair_excess[p]), 0.0) if math.isfinite(peak) else math.inf)
    # The Gram form ranks; what is reported and judged is exact: until the best two of every row are exact (one
    # round, as a rule)
    exact = set(zip(pairs.rows, pairs.cols, strict=True))
    for _ in range(len(samples.names) + 1):
        wanted = _unresolved(rel, exact)
        if not wanted:
            break
        for (row, j), value in _exact_rel(samples, wanted, block_tokens=block_tokens, backend=backend).items():
            rel[row, j] = value
        exact |= set(wanted)
    return AtlasScan(cos=cos, rel=rel, ranks=tuple(_rank(r) for r in rel), expected_maxima=maxima,
                     token_stats=tuple(token_stats),
                     atlas_nonfinite=tuple((samples.names[j], int(n))
                                           for j, n in enumerate(sums.atlas_nonfinite.tolist()) if n))


def _each_sample(samples: Samples, pairs: Pairs, *, columns: Sequence[int], evidence_rtol: Sequence[float],
                 gram: bool, block_tokens: int, backend: Backend) -> Iterator[tuple[int, TokenStats]]:
    """Each sample's one pass (compare/scan.py) over the boundaries ``columns``; a sample with no token gives none."""
    for i, (served, recorded, atlas) in enumerate(zip(samples.served, samples.recorded, samples.atlas, strict=True)):
        if int(served.shape[0]) == 0:
            continue
        if samples.reduced is not None:
            yield i, samples.reduced[i].stats(pairs, columns, evidence_rtol=evidence_rtol, gram=gram)
            continue
        yield i, scan(served, recorded, [atlas[samples.names[j]] for j in columns], samples.valids[i],
                      hidden=samples.hidden, pairs=pairs, evidence_rtol=evidence_rtol, gram=gram,
                      block_tokens=block_tokens, backend=backend)


def _accumulate(sums: _Sums, st: TokenStats, valid: torch.Tensor, pairs: Pairs) -> None:
    """Add one sample's statistics (compare/scan.py): Gram sums as they are, exact pairs per token."""
    g = st.gram
    assert g is not None
    sums.atlas_nonfinite += g.nonfinite
    sums.cos += g.cos
    sums.count += g.count
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
        sums.pair_ref2 += (torch.where(fin, p_r2, 0.0) * v).sum(0)
        tok = torch.sqrt(torch.where(fin, p_d2, 0.0)) / torch.sqrt(torch.where(fin, p_r2, 0.0)).clamp_min(1e-300)
        sums.pair_rel += (tok * v).sum(0)
        sums.pair_count += v.sum(0)
        vm = valid[:, None]
        peak = torch.where(fin, st.pair_max.double(), math.nan)
        excess = torch.where(fin, st.pair_excess.double(), math.nan)
        sums.pair_max = torch.maximum(sums.pair_max, torch.where(vm, peak, -math.inf).amax(0))
        sums.pair_excess = torch.maximum(sums.pair_excess, torch.where(vm, excess, -math.inf).amax(0))


def _unresolved(rel: torch.Tensor, exact: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (row, column) pairs not yet exact that could be a row's best or runner-up: the current best two, any the
    Gram form cannot resolve (below GRAM_FLOOR: a near-duplicate of the expected one, so a tie is seen as a tie) and
    any within GRAM_SLACK of the runner-up."""
    wanted: set[tuple[int, int]] = set()
    for row in range(rel.shape[0]):
        best, second = _rank(rel[row])
        limit = GRAM_FLOOR
        if second is not None and math.isfinite(float(rel[row, second])):
            limit = max(limit, float(rel[row, second]) * GRAM_SLACK)
        near = {int(j) for j in (rel[row] <= limit).nonzero().flatten().tolist()}
        wanted |= {(row, j) for j in near | {best} | ({second} if second is not None else set())
                   if (row, j) not in exact}
    return sorted(wanted)


def _exact_rel(samples: Samples, wanted: Sequence[tuple[int, int]], *, block_tokens: int,
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
    for i, st in _each_sample(samples, pairs, columns=used, evidence_rtol=(), gram=False, block_tokens=block_tokens,
                              backend=backend):
        valid = samples.valids[i]
        d2, b2 = st.pair_d2.double(), st.pair_b2.double()
        ok = torch.isfinite(d2) & torch.isfinite(b2) & torch.isfinite(st.na2[:, list(pairs.rows)]) & valid[:, None]
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


def checked_reduced(served: Sequence[torch.Tensor], recorded: Sequence[torch.Tensor],
                    reduced: Sequence[ReducedSample], *, masks: Sequence[torch.Tensor | None] | None,
                    expected: Sequence[str]) -> Samples:
    """The inputs as :class:`Samples` with the reduced statistics (compare/reduced.py) standing for the atlas, or
    :class:`InputError` naming the first thing that does not fit them."""
    from specparity.errors import InputError

    if not (len(served) == len(recorded) == len(reduced)) or not served:
        raise InputError(f"need the same non-zero number of samples, got served {len(served)}, recorded "
                         f"{len(recorded)}, reduced {len(reduced)}", field="samples")
    first = reduced[0]
    names, hidden = first.names, int(first.meta["hidden"])
    k_s, k_r = int(first.meta["k_s"]), int(first.meta["k_r"])
    for i, (s, r, red) in enumerate(zip(served, recorded, reduced, strict=True)):
        shape = (red.names, int(red.meta["hidden"]), int(red.meta["k_s"]), int(red.meta["k_r"]), red.tokens)
        if shape != (names, hidden, k_s, k_r, int(s.shape[0])) or tuple(s.shape) != (red.tokens, k_s * hidden) \
                or tuple(r.shape) != (red.tokens, k_r * hidden):
            raise InputError(f"sample {i}: the reduced evidence ({red.tokens} tokens, {k_s} served and {k_r} recorded "
                             f"chunks of {hidden}, boundaries {list(red.names)}) does not fit served "
                             f"{tuple(s.shape)} and recorded {tuple(r.shape)}", field="reduced")
        if list(red.meta["expected"]) != list(expected):
            raise InputError(f"sample {i} was reduced against sources {red.meta['expected']}, the contract names "
                             f"{list(expected)}", field="reduced")
    if masks is not None and not all(m is None or bool(m.to(torch.bool).all()) for m in masks):
        raise InputError("the reduced evidence compares every token; masked tokens need the full atlas",
                         field="masks")
    if sum(red.tokens for red in reduced) == 0:
        raise InputError("no valid token to compare (the capture is empty)", field="masks")
    valids = tuple(torch.ones(int(s.shape[0]), dtype=torch.bool) for s in served)
    return Samples(served=served, recorded=recorded, atlas=[{} for _ in served], valids=valids, names=names,
                   hidden=hidden, k_s=k_s, k_r=k_r, reduced=tuple(reduced))
