"""The one pass over the layer atlas that attribution needs: per-token statistics of one sample.

:func:`scan` returns, for every token of one sample, all that attribution (compare/attribution.py) and
the served-vs-recorded evidence (compare/evidence.py) are computed from, as ``[T, ...]`` tensors, small
next to the atlas:

- Gram terms, for ranking: every chunk row against every boundary, dot product and squared norms;
- exact pairs, for the numbers that are reported and judged: for chosen (chunk row, boundary) pairs,
  ``||a-b||^2``, ``||b||^2``, ``max |a-b|`` and ``max(|a-b| - rtol |b|)`` from the difference itself, so a
  near-exact match is never judged on Gram cancellation (``||a||^2 + ||b||^2 - 2 a.b`` loses the digits
  that matter when ``a`` is nearly ``b``);
- evidence: served chunk ``c`` against recorded chunk ``c`` (:class:`TokenPairStats`).

Two backends compute the same numbers (tests/unit/test_scan.py holds them to a direct computation):
numba kernels on CPU (compare/scan_kernels.py: each atlas element is read once and never copied), and
torch blocks of tokens (any device, and wherever numba is not installed).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

Backend = Literal["auto", "numba", "torch"]


@dataclass(frozen=True)
class Pairs:
    """Chunk rows (served rows first, then recorded) compared exactly with atlas columns, and each pair's rtol."""

    rows: tuple[int, ...] = ()
    cols: tuple[int, ...] = ()
    rtol: tuple[float, ...] = ()
    # whether a pair's maxima (max |a-b|, the excess) are wanted; None: every pair's. Without them a pair
    # gives its squared norms only (for ranking), and its maxima are 0
    full: tuple[bool, ...] | None = None

    def wants_maxima(self) -> tuple[bool, ...]:
        return self.full if self.full is not None else tuple(True for _ in self.rows)

    def __len__(self) -> int:
        return len(self.rows)


@dataclass(frozen=True)
class TokenPairStats:
    """Per-token statistics of served chunk rows against recorded ones (float32 ``[T]`` / ``[T, 3]``, CPU).

    ``dots[t, 0]`` is served ``t`` . recorded ``t-1`` (t >= 1), ``dots[t, 1]`` served ``t`` . recorded ``t``,
    ``dots[t, 2]`` served ``t`` . recorded ``t+1`` (t <= T-2); the rest come from the difference
    ``d = served_t - recorded_t`` itself: ``||d||^2``, ``max |d|`` and ``max(0, max(|d| - rtol |recorded_t|))``.
    Only valid tokens whose two norms are finite are read.
    """

    served_norm2: torch.Tensor
    recorded_norm2: torch.Tensor
    dots: torch.Tensor
    diff_norm2: torch.Tensor
    max_abs: torch.Tensor
    max_excess: torch.Tensor


def _rowdot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Row-wise dot products as a batched matmul: no ``[T, H]`` temporary (``(x * y).sum(-1)`` makes one)."""
    return torch.bmm(x.unsqueeze(1), y.unsqueeze(2)).view(-1)


def token_stats(served: torch.Tensor, recorded: torch.Tensor, *, rtol: float) -> TokenPairStats:
    """:class:`TokenPairStats` of two ``[T, H]`` tensors with torch (any device; the results on CPU)."""
    a = served.to(torch.float32, copy=True)  # a copy: it is reused in place below
    b = recorded.to(torch.float32, copy=True)
    dots = torch.zeros(a.shape[0], 3, dtype=torch.float32, device=a.device)
    dots[1:, 0] = _rowdot(a[1:], b[:-1])
    dots[:, 1] = _rowdot(a, b)
    dots[:-1, 2] = _rowdot(a[:-1], b[1:])
    na2, nb2 = _rowdot(a, a), _rowdot(b, b)
    d = a.sub_(b)
    d2 = _rowdot(d, d)
    d.abs_()
    peak = d.amax(-1) if d.shape[-1] else torch.zeros_like(d2)
    excess = d.sub_(b.abs_().mul_(rtol)).amax(-1).clamp_min(0.0) if d.shape[-1] else torch.zeros_like(d2)
    return TokenPairStats(served_norm2=na2.cpu(), recorded_norm2=nb2.cpu(), dots=dots.cpu(), diff_norm2=d2.cpu(),
                          max_abs=peak.cpu(), max_excess=excess.cpu())


@dataclass(frozen=True)
class GramSums:
    """Gram terms of every chunk row against every boundary, summed over valid tokens (float64, CPU).

    For token ``t`` with finite ``a2 = ||a_t||^2``, ``b2 = ||b_t||^2`` and ``ab = a_t . b_t`` (float32 sums),
    in float64: ``cos`` adds ``ab / sqrt(a2 b2)``, ``count`` 1, ``diff2`` ``d2 = max(a2 + b2 - 2 ab, 0)``,
    ``rel`` ``sqrt(d2 / b2)``, ``ref2`` ``b2`` (each ``[R, C]``); ``nonfinite`` ``[C]`` counts valid tokens
    whose boundary norm is not finite.
    """

    cos: torch.Tensor
    count: torch.Tensor
    diff2: torch.Tensor
    rel: torch.Tensor
    ref2: torch.Tensor
    nonfinite: torch.Tensor


@dataclass(frozen=True)
class TokenStats:
    """What one scan of one sample gives.

    ``gram`` (only with ``gram=True``); per token (float32, CPU; tokens that are not valid may hold
    anything): ``na2`` ``[T, R]`` chunk rows' squared norms, ``pair_b2``, ``pair_d2``, ``pair_max``,
    ``pair_excess`` ``[T, P]``, and ``evidence``, one per served/recorded chunk pair. A maximum is
    meaningful only where the token's squared norms are finite; an excess ``max(|a-b| - rtol |b|)`` is
    reported from 0 up (all that the smallest passing atol needs).
    """

    gram: GramSums | None
    na2: torch.Tensor
    pair_b2: torch.Tensor
    pair_d2: torch.Tensor
    pair_max: torch.Tensor
    pair_excess: torch.Tensor
    evidence: tuple[TokenPairStats, ...]


def gram_sums(dots: torch.Tensor, na2: torch.Tensor, nb2: torch.Tensor, valid: torch.Tensor) -> GramSums:
    """:class:`GramSums` from per-token ``dots`` ``[T, R, C]``, ``na2`` ``[T, R]``, ``nb2`` ``[T, C]``."""
    fin_a = torch.isfinite(na2)
    fin_b = torch.isfinite(nb2)
    ok = torch.isfinite(dots) & fin_a[:, :, None] & fin_b[:, None, :] & valid[:, None, None]
    w = ok.double()
    dd = torch.where(ok, dots, 0.0).double()
    a2 = torch.where(fin_a, na2, 0.0).double()[:, :, None]
    b2 = torch.where(fin_b, nb2, 0.0).double()[:, None, :]
    d2 = (a2 + b2 - 2.0 * dd).clamp_min(0.0)
    return GramSums(cos=(dd / torch.sqrt(a2 * b2).clamp_min(1e-300) * w).sum(0), count=w.sum(0),
                    diff2=(d2 * w).sum(0), rel=(torch.sqrt(d2) / torch.sqrt(b2).clamp_min(1e-300) * w).sum(0),
                    ref2=(b2 * w).sum(0), nonfinite=(~fin_b & valid[:, None]).sum(0))


@functools.cache
def numba_available() -> bool:
    """Whether the numba kernels can be used here (numba importable)."""
    try:
        import specparity.compare.scan_kernels  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(backend: Backend, tensors: Sequence[torch.Tensor]) -> Literal["numba", "torch"]:
    """``auto``: numba when it is installed and every tensor is on the CPU, else torch."""
    on_cpu = all(t.device.type == "cpu" for t in tensors)
    if backend == "numba":
        if not on_cpu:
            raise ValueError("the numba backend needs CPU tensors")
        if not numba_available():
            raise ImportError("the numba backend needs numba (pip install numba)")
        return "numba"
    if backend == "torch":
        return "torch"
    return "numba" if on_cpu and numba_available() else "torch"



def expected_pairs(names: Sequence[str], k_s: int, k_r: int, expected: Sequence[str], rtol: Sequence[float]) -> Pairs:
    """The first pass's pairs, from the shapes alone: every chunk (served rows ``0..k_s-1``, recorded rows ``k_s..``)
    against its expected source, with maxima; and, in the same pass, the two boundaries next to each expected source,
    without. The gate's scan (compare/attribution_scan.py) and a worker's reduction (compare/reduced.py) both build
    them here, so the two can never pick different pairs."""
    col = {n: j for j, n in enumerate(names)}
    chosen: list[tuple[int, int, float]] = []
    for c in range(k_r):
        if expected[c] in col:
            if c < k_s:
                chosen.append((c, col[expected[c]], rtol[c]))
            chosen.append((k_s + c, col[expected[c]], rtol[c]))
    n_expected = len(chosen)
    # for a correct chunk these are the runner-up candidates (a residual stream changes gradually with depth), so
    # as a rule the exact best and runner-up need no second scan (measured: a second scan costs ~10% of the first)
    for row, j, r in chosen[:n_expected]:
        chosen.extend((row, n, r) for n in (j - 1, j + 1) if 0 <= n < len(names))
    return Pairs(rows=tuple(p[0] for p in chosen), cols=tuple(p[1] for p in chosen), rtol=tuple(p[2] for p in chosen),
                 full=tuple(p < n_expected for p in range(len(chosen))))

def scan(served: torch.Tensor, recorded: torch.Tensor, atlas: Sequence[torch.Tensor], valid: torch.Tensor, *,
         hidden: int, pairs: Pairs, evidence_rtol: Sequence[float], gram: bool, block_tokens: int = 8,
         backend: Backend = "auto") -> TokenStats:
    """Per-token statistics of one sample: ``served`` ``[T, k_s*H]``, ``recorded`` ``[T, k_r*H]``, the atlas
    columns ``[T, H]`` in order, ``valid`` ``[T]`` bool. Inputs are assumed validated (attribution does)."""
    chosen = resolve_backend(backend, [served, recorded, *atlas])
    if chosen == "numba":
        return _scan_numba(served, recorded, atlas, valid, hidden=hidden, pairs=pairs, evidence_rtol=evidence_rtol,
                           gram=gram)
    return _scan_torch(served, recorded, atlas, valid, hidden=hidden, pairs=pairs, evidence_rtol=evidence_rtol,
                       gram=gram, block_tokens=block_tokens)


def _array(t: torch.Tensor) -> Any:
    """``t`` as the kernels read it, a numpy view (no copy of a contiguous tensor): bfloat16 as its bits in
    uint16, float16 as its bits in int16, float32 as is, anything else through float32 (float64 from
    tests and fixtures; the torch path's buffers are float32 too)."""
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.uint16).numpy()
    if t.dtype == torch.float16:
        return t.contiguous().view(torch.int16).numpy()
    return t.to(torch.float32).contiguous().numpy()


def _kind(array: Any) -> int:
    """The kernels' code for an :func:`_array`'s element type."""
    from specparity.compare import scan_kernels as k

    return {"uint16": k.BF16, "int16": k.F16}.get(str(array.dtype), k.F32)


def _scan_numba(served: torch.Tensor, recorded: torch.Tensor, atlas: Sequence[torch.Tensor], valid: torch.Tensor, *,
                hidden: int, pairs: Pairs, evidence_rtol: Sequence[float], gram: bool) -> TokenStats:
    import numpy as np

    from specparity.compare import scan_kernels as k

    tokens = int(valid.shape[0])
    k_s, k_r = served.shape[1] // hidden, recorded.shape[1] // hidden
    rows, cols, npairs, nev = k_s + k_r, len(atlas), len(pairs), len(evidence_rtol)
    if len({a.dtype for a in atlas}) > 1:  # boundaries of mixed dtypes (never from one engine): all in float32
        atlas = [a.to(torch.float32) for a in atlas]
    # pairs grouped by atlas column (CSR), so each boundary row is compared while it is in cache
    order = sorted(range(npairs), key=lambda p: pairs.cols[p])
    col_ptr = np.zeros(cols + 1, dtype=np.int64)
    for p in order:
        col_ptr[pairs.cols[p] + 1] += 1
    col_ptr = np.cumsum(col_ptr)
    needed = np.ones(rows, dtype=np.bool_)
    if not gram:  # only the rows some pair or the evidence compares
        needed[:] = False
        needed[list(pairs.rows)] = True
        needed[:nev] = True
        needed[k_s:k_s + nev] = True
    f32, f64 = np.float32, np.float64
    g_shape = (rows, cols) if gram else (0, 0)
    g_cos, g_count, g_diff2, g_rel, g_ref2 = (np.zeros(g_shape, f64) for _ in range(5))
    g_nonfinite = np.zeros(cols if gram else 0, np.int64)
    na2 = np.zeros((tokens, rows), f32)
    p_b2, p_d2, p_max, p_exc = (np.zeros((tokens, npairs), f32) for _ in range(4))
    e_dot = np.zeros((tokens, nev, 3), f32)
    e_d2, e_max, e_exc = (np.zeros((tokens, nev), f32) for _ in range(3))
    # the kernel reads every tensor at its address: these arrays keep the (contiguous) tensors alive
    arrays = [_array(a) for a in atlas]
    addrs = np.asarray([a.ctypes.data for a in arrays], dtype=np.int64)
    s_arr, r_arr = _array(served), _array(recorded)
    k.scan(s_arr.ctypes.data, _kind(s_arr), k_s, r_arr.ctypes.data, _kind(r_arr), k_r, addrs,
           arrays[0][:1, :1].ravel(), hidden, valid.to(torch.bool).cpu().numpy(), gram, needed, col_ptr,
           np.asarray(order, dtype=np.int64), np.asarray(pairs.rows, dtype=np.int64),
           np.asarray(pairs.rtol, dtype=f32), np.asarray(pairs.wants_maxima(), dtype=np.bool_),
           np.asarray(evidence_rtol, dtype=f32), g_cos, g_count, g_diff2, g_rel, g_ref2, g_nonfinite,
           na2, p_b2, p_d2, p_max, p_exc, e_dot, e_d2, e_max, e_exc)
    t = torch.from_numpy
    na2_t = t(na2)
    evidence = tuple(TokenPairStats(served_norm2=na2_t[:, c], recorded_norm2=na2_t[:, k_s + c], dots=t(e_dot[:, c]),
                                    diff_norm2=t(e_d2[:, c]), max_abs=t(e_max[:, c]), max_excess=t(e_exc[:, c]))
                     for c in range(nev))
    sums = GramSums(cos=t(g_cos), count=t(g_count), diff2=t(g_diff2), rel=t(g_rel), ref2=t(g_ref2),
                    nonfinite=t(g_nonfinite)) if gram else None
    return TokenStats(gram=sums, na2=na2_t, pair_b2=t(p_b2), pair_d2=t(p_d2), pair_max=t(p_max),
                      pair_excess=t(p_exc), evidence=evidence)


def _scan_torch(served: torch.Tensor, recorded: torch.Tensor, atlas: Sequence[torch.Tensor], valid: torch.Tensor, *,
                hidden: int, pairs: Pairs, evidence_rtol: Sequence[float], gram: bool, block_tokens: int) -> TokenStats:
    """Blocks of tokens, everything on the atlas's device: per block, the boundaries are stacked into a
    float32 buffer and one batched matmul gives every chunk-by-boundary dot product."""
    tokens = int(valid.shape[0])
    k_s, k_r = served.shape[1] // hidden, recorded.shape[1] // hidden
    rows, cols, npairs = k_s + k_r, len(atlas), len(pairs)
    dev = atlas[0].device
    served, recorded = served.to(dev), recorded.to(dev)
    tb_max = max(1, min(block_tokens, tokens))
    f32 = torch.float32
    dots = torch.zeros((tokens, rows, cols) if gram else (0, 0, 0), dtype=f32, device=dev)
    nb2 = torch.zeros((tokens, cols) if gram else (0, 0), dtype=f32, device=dev)
    na2 = torch.zeros(tokens, rows, dtype=f32, device=dev)
    p_b2, p_d2, p_max, p_exc = (torch.zeros(tokens, npairs, dtype=f32, device=dev) for _ in range(4))
    # work buffers are allocated once: fresh allocations per block cost more in page faults than the math
    buf = torch.empty(tb_max, cols if gram else 0, hidden, dtype=f32, device=dev)
    abuf = torch.empty(tb_max, rows, hidden, dtype=f32, device=dev)
    rbuf = torch.empty(tb_max, npairs, hidden, dtype=f32, device=dev)
    dbuf = torch.empty(tb_max, npairs, hidden, dtype=f32, device=dev)
    pair_rows = torch.tensor(pairs.rows, dtype=torch.long, device=dev)
    rtol = torch.tensor(pairs.rtol, dtype=f32, device=dev)[None, :, None]
    valid_cpu = valid.to(torch.bool).cpu()
    for t0 in range(0, tokens, tb_max):
        t1 = min(t0 + tb_max, tokens)
        tb = t1 - t0
        if not bool(valid_cpu[t0:t1].any()):
            continue  # a block of pad positions only
        a = abuf[:tb]
        torch.cat([served[t0:t1].reshape(tb, k_s, hidden), recorded[t0:t1].reshape(tb, k_r, hidden)], dim=1, out=a)
        na2[t0:t1] = torch.linalg.vector_norm(a, dim=-1).square()
        if gram:
            b = buf[:tb]
            # the one read of every boundary's rows, cast to float32 while copying
            torch.stack([x[t0:t1] for x in atlas], dim=1, out=b)
            torch.bmm(a, b.transpose(1, 2), out=dots[t0:t1])
            nb2[t0:t1] = torch.linalg.vector_norm(b, dim=-1).square()
        if npairs:
            ref = rbuf[:tb]
            d = dbuf[:tb]
            torch.stack([atlas[c][t0:t1] for c in pairs.cols], dim=1, out=ref)
            torch.index_select(a, 1, pair_rows, out=d)
            d.sub_(ref)
            p_d2[t0:t1] = torch.linalg.vector_norm(d, dim=-1).square()
            p_b2[t0:t1] = torch.linalg.vector_norm(ref, dim=-1).square()
            d.abs_()
            torch.amax(d, dim=-1, out=p_max[t0:t1])
            ref.abs_().mul_(rtol)
            torch.amax(d.sub_(ref), dim=-1, out=p_exc[t0:t1])
            p_exc[t0:t1].clamp_min_(0.0)  # only from 0 up matters (the smallest passing atol), as in the kernels
    evidence = tuple(token_stats(served[:, c * hidden:(c + 1) * hidden], recorded[:, c * hidden:(c + 1) * hidden],
                                 rtol=float(evidence_rtol[c])) for c in range(len(evidence_rtol)))
    sums = gram_sums(dots.cpu(), na2.cpu(), nb2.cpu(), valid_cpu) if gram else None
    return TokenStats(gram=sums, na2=na2.cpu(), pair_b2=p_b2.cpu(), pair_d2=p_d2.cpu(), pair_max=p_max.cpu(),
                      pair_excess=p_exc.cpu(), evidence=evidence)
