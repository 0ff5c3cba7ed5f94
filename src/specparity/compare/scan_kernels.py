"""numba kernels of the attribution scan on CPU (compare/scan.py decides when they run).

Why not torch: on a CPU the torch formulation (stack every boundary of a block into a float32 buffer,
one batched matmul, then norms) writes and re-reads each atlas element several times, and its bf16 ->
fp32 copy alone costs more than a plain read of the atlas (benchmarks/bench_attribution.py). Here each
atlas element is loaded once, widened to float32 in a register, and feeds the chunk dot products and its
own square from that one load; nothing of the atlas is copied.

The dtype travels in the numpy array type, so numba compiles (and caches on disk) one kernel per
combination actually used: bfloat16 arrives as its bits in a uint16 array, float16 as its bits in an
int16 array (numba has no bfloat16, and its float16 support varies by version), float32 as is.

All sums are float32 with reassociation (vectorised partial sums), like the float32 ``bmm`` of the torch
path. The fast-math flags are only those that reorder arithmetic (``reassoc``, ``contract``, ``nsz``,
``arcp``), never "no NaN / no inf": a NaN or inf in any input propagates to the squared norms, by which
the caller judges a token (compare/attribution.py), and the finiteness tests made here are integer tests
on the bits (:func:`_finite`).

_MAXIMA: a float maximum does not vectorise without "no NaN" (measured ~10x slower), but the bits of a
non-negative float32 order like the float, so ``max |d|`` is an integer maximum of ``|d|``'s bits (a NaN,
whose bits are above inf's, wins it); and the excess ``max(|d| - rtol |b|)`` only matters from 0 up (the
smallest passing atol), so it is a signed maximum of the bits starting at 0 (negative floats are negative
integers).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

TILE = 3  # chunk rows and boundaries per register tile (see _gram_norm)
_JIT = {"fastmath": {"reassoc", "contract", "nsz", "arcp"}, "nogil": True, "cache": True}


@intrinsic
def _from_bf16(typingctx, word):
    """bfloat16 bits -> float32: the bits are the top half of the float32 (exact)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        wide = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(wide, ir.FloatType())

    return sig, codegen


@intrinsic
def _from_f16(typingctx, word):
    """float16 bits -> float32 (exact)."""
    sig = types.float32(types.int16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


def _bitcast(src, dst):  # the intrinsic reinterpreting a ``src`` value as ``dst`` (same width)
    @intrinsic
    def cast(typingctx, x):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(dst))

        return dst(src), codegen

    return cast


_ubits = _bitcast(types.float32, types.uint32)
_sbits = _bitcast(types.float32, types.int32)
_from_ubits = _bitcast(types.uint32, types.float32)
_from_sbits = _bitcast(types.int32, types.float32)


@intrinsic
def _ptr_like(typingctx, addr, proto):
    """The address ``addr`` as a pointer to ``proto``'s element type (for ``numba.carray``)."""
    sig = types.CPointer(proto.dtype)(addr, proto)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return sig, codegen


@numba.njit(**_JIT)
def _boundary(addrs, j, proto, tokens, hidden):
    """Boundary ``j`` of the atlas as a ``[tokens, hidden]`` array, from its address: a list of arrays
    would cost a second of numba compiling its list type in every process (typed lists are not cached)."""
    return numba.carray(_ptr_like(addrs[j], proto), (tokens, hidden))


BF16, F16, F32 = 0, 1, 2  # kinds of the chunk tensors (compare/scan.py ``_kind``)
_PROTO_BF16 = np.zeros(1, np.uint16)
_PROTO_F16 = np.zeros(1, np.int16)
_PROTO_F32 = np.zeros(1, np.float32)


@numba.njit(**_JIT)
def _widen_at(addr, kind, start, hidden, dst):
    """Elements ``start .. start+hidden`` of the chunk tensor at ``addr`` into float32 ``dst``; returns the
    squared norm. The kind is a runtime branch here, once per row, so the chunk dtypes do not multiply
    the compiled kernels (the atlas dtype does: it is in the hot loop)."""
    if kind == BF16:
        return _widen(numba.carray(_ptr_like(addr, _PROTO_BF16), (start + hidden,))[start:], dst)
    if kind == F16:
        return _widen(numba.carray(_ptr_like(addr, _PROTO_F16), (start + hidden,))[start:], dst)
    return _widen(numba.carray(_ptr_like(addr, _PROTO_F32), (start + hidden,))[start:], dst)


def _load(word):  # pragma: no cover - typed by the overload below, never called from Python
    raise NotImplementedError


@overload(_load, jit_options={"fastmath": {"reassoc", "contract", "nsz", "arcp"}})
def _load_typed(word):
    """One element as float32, chosen by the array's element type (resolved at compile time)."""
    if word == types.uint16:
        return lambda word: _from_bf16(word)
    if word == types.int16:
        return lambda word: _from_f16(word)
    if word == types.float32:
        return lambda word: word
    return None


@numba.njit(**_JIT)
def _widen(src, dst):
    """``src`` (any supported dtype) into float32 ``dst``; returns its squared norm."""
    s = np.float32(0.0)
    for h in range(dst.shape[0]):
        v = _load(src[h])
        dst[h] = v
        s += v * v
    return s


@numba.njit(**_JIT)
def _madd3(p, u, v, w, su, sv, sw):
    """``p`` times each of ``u, v, w`` added to the sums ``su, sv, sw``."""
    return su + p * u, sv + p * v, sw + p * w


def _gram_kernel(norms):
    """The 3x3 tile kernel: chunk rows ``a0..a2`` (float32) against boundary rows ``x, y, z``, returned per
    boundary (``(x.a0, x.a1, x.a2), (y.a0, ...), (z.a0, ...)``), led by the boundaries' squared norms when
    ``norms``. ``norms`` is a constant of the compiled kernel (numba prunes the branches on it), so each
    variant's loop holds only its own sums. Each loaded chunk value feeds three products: 6 rows against 1
    boundary was measured ~25% slower (the chunk rows come from L2, and this halves those loads); 12
    accumulators fit the 16 AVX2 registers."""

    @numba.njit(**_JIT)
    def tile(x, y, z, a0, a1, a2):
        nx = ny = nz = np.float32(0.0)
        x0 = y0 = z0 = x1 = y1 = z1 = x2 = y2 = z2 = np.float32(0.0)
        for h in range(a0.shape[0]):
            u = _load(x[h])
            v = _load(y[h])
            w = _load(z[h])
            if norms:
                nx, ny, nz = nx + u * u, ny + v * v, nz + w * w
            x0, y0, z0 = _madd3(a0[h], u, v, w, x0, y0, z0)
            x1, y1, z1 = _madd3(a1[h], u, v, w, x1, y1, z1)
            x2, y2, z2 = _madd3(a2[h], u, v, w, x2, y2, z2)
        if norms:
            return (nx, ny, nz), (x0, x1, x2), (y0, y1, y2), (z0, z1, z2)
        return (x0, x1, x2), (y0, y1, y2), (z0, z1, z2)

    return tile


_gram_norm = _gram_kernel(norms=True)  # a token's rows 0..2: the first tile also gives the norms
_gram = _gram_kernel(norms=False)  # its rows 3..: the norms are known by then


@numba.njit(**_JIT)
def _maxima(peak, excess, d, ref, rtol):
    """``peak`` and ``excess`` updated with a difference ``d`` against reference value ``ref``: ``max |d|`` and
    ``max(|d| - rtol |ref|)``, as maxima on the bits (see _MAXIMA)."""
    return max(peak, _ubits(abs(d))), max(excess, _sbits(abs(d) - rtol * abs(ref)))


def _diff_kernel(maxima):
    """Chunk row ``a`` (float32) against boundary row ``src``, from the difference itself (no Gram
    cancellation): ``||b||^2``, ``||a-b||^2`` and, when ``maxima`` (a constant of the compiled kernel, as in
    :func:`_gram_kernel`), ``max |a-b|`` and ``max(0, max(|a-b| - rtol |b|))``."""

    @numba.njit(**_JIT)
    def diff(src, a, rtol):
        b2 = d2 = np.float32(0.0)
        peak = np.uint32(0)
        excess = np.int32(0)
        for h in range(a.shape[0]):
            v = _load(src[h])
            d = a[h] - v
            b2 += v * v
            d2 += d * d
            if maxima:
                peak, excess = _maxima(peak, excess, d, v, rtol)
        if maxima:
            return b2, d2, _from_ubits(peak), _from_sbits(excess)
        return b2, d2

    return diff


_diff = _diff_kernel(maxima=True)
_diff_norms = _diff_kernel(maxima=False)  # for pairs that only rank (``rtol`` is not read)


@numba.njit(**_JIT)
def _pair(s, r, rtol):
    """Served row ``s`` against recorded row ``r`` (both float32): dot, ||s-r||^2, max |s-r| and the excess
    ``max(0, max(|s-r| - rtol |r|))``."""
    dot = d2 = np.float32(0.0)
    peak = np.uint32(0)
    excess = np.int32(0)
    for h in range(s.shape[0]):
        d = s[h] - r[h]
        dot += s[h] * r[h]
        d2 += d * d
        peak, excess = _maxima(peak, excess, d, r[h], rtol)
    return dot, d2, _from_ubits(peak), _from_sbits(excess)


@numba.njit(**_JIT)
def _dot(a, b):
    s = np.float32(0.0)
    for h in range(a.shape[0]):
        s += a[h] * b[h]
    return s


@numba.njit(**_JIT)
def _finite(x):
    """Whether float32 ``x`` is finite, from its exponent bits: an integer test, which no fast-math flag
    can fold to True (with numba's full ``fastmath`` it folded ``np.isfinite``, even in a callee compiled
    without it once inlined: measured)."""
    return (_ubits(x) & np.uint32(0x7F800000)) != np.uint32(0x7F800000)


@numba.njit(**_JIT)
def _gram_token(na2_t, dots_t, nb2_t, b2, nb, fin_b, g_cos, g_count, g_diff2, g_rel, g_ref2, g_nonfinite):
    """Add one token's Gram terms (``dots_t`` ``[rows, cols]``, squared norms ``na2_t`` / ``nb2_t``) to the
    float64 sums, with the formulas of compare/scan.py ``gram_sums``; a non-finite term adds nothing.
    Done once per token over contiguous rows, so it vectorises (per tile it cost ~20% of the scan)."""
    rows, cols = dots_t.shape
    for j in range(cols):
        fin_b[j] = _finite(nb2_t[j])
        b2[j] = np.float64(nb2_t[j]) if fin_b[j] else 0.0
        nb[j] = np.sqrt(b2[j])
        if not fin_b[j]:
            g_nonfinite[j] += 1
    for r in range(rows):
        if not _finite(na2_t[r]):
            continue
        a2 = np.float64(na2_t[r])
        na = np.sqrt(a2)
        for j in range(cols):
            ok = fin_b[j] and _finite(dots_t[r, j])
            dd = np.float64(dots_t[r, j]) if ok else 0.0
            bb = b2[j] if ok else 0.0
            d2 = max(a2 + bb - 2.0 * dd, 0.0) if ok else 0.0
            g_cos[r, j] += dd / max(na * nb[j], 1e-300)
            g_count[r, j] += 1.0 if ok else 0.0
            g_diff2[r, j] += d2
            g_rel[r, j] += np.sqrt(d2) / max(nb[j], 1e-300)
            g_ref2[r, j] += bb


@numba.njit(**_JIT)
def scan(s_addr, s_kind, k_s, r_addr, r_kind, k_r, addrs, proto, hidden, valid, gram, rows_needed,
         col_ptr, col_pairs, pair_row, pair_rtol, pair_full, ev_rtol,
         g_cos, g_count, g_diff2, g_rel, g_ref2, g_nonfinite,
         na2, p_b2, p_d2, p_max, p_exc, e_dot, e_d2, e_max, e_exc):
    """One pass over the tokens of one sample (see compare/scan.py ``TokenStats`` for the outputs).

    Rows (chunks) are the ``k_s`` served chunks then the ``k_r`` recorded ones (C-contiguous ``[tokens,
    k*hidden]`` tensors at ``s_addr``/``r_addr`` of kinds ``s_kind``/``r_kind``); only ``rows_needed`` are
    read. The atlas: boundary ``j`` is the C-contiguous ``[tokens, hidden]`` array at address ``addrs[j]``,
    of ``proto``'s dtype (the caller keeps the tensors alive). ``gram``: every row against every atlas boundary, summed over valid tokens into ``g_*``
    ``[rows, cols]`` (float64) and ``g_nonfinite`` ``[cols]``; otherwise only the pairs. Pairs: for atlas
    column ``j``, ``col_pairs[col_ptr[j]:col_ptr[j+1]]`` are the pairs compared exactly with it, per token
    (their maxima only where ``pair_full``).
    Evidence: served chunk ``c`` against recorded chunk ``c`` for ``c < len(ev_rtol)``, per token, at
    shifts -1, 0, +1. Tokens with ``valid`` False are skipped (their per-token outputs stay 0).
    """
    tokens = valid.shape[0]
    rows = k_s + k_r
    groups = (rows + TILE - 1) // TILE
    # One token at a time: blocks of 2-8 tokens per visit of a boundary, and software prefetch of the next
    # boundary, were measured slower. This token's widened rows and the previous one's (evidence at
    # shift -1) alternate in two buffers; padding rows stay 0.
    buf = np.zeros((2, groups * TILE, hidden), np.float32)
    cols = addrs.shape[0]
    evid = ev_rtol.shape[0]
    # one token's Gram terms, reduced into the sums once the token is done (_gram_token)
    dots_t = np.zeros((rows, cols), np.float32)
    nb2_t = np.zeros(cols, np.float32)
    b2_t, nb_t, fin_t = np.zeros(cols), np.zeros(cols), np.zeros(cols, np.bool_)
    for t in range(tokens):
        if not valid[t]:
            continue
        cur = buf[t & 1]
        for c in range(k_s):
            if rows_needed[c]:
                na2[t, c] = _widen_at(s_addr, s_kind, (t * k_s + c) * hidden, hidden, cur[c])
        for c in range(k_r):
            if rows_needed[k_s + c]:
                na2[t, k_s + c] = _widen_at(r_addr, r_kind, (t * k_r + c) * hidden, hidden, cur[k_s + c])
        for c in range(evid):
            dot, d2, peak, excess = _pair(cur[c], cur[k_s + c], ev_rtol[c])
            e_dot[t, c, 1] = dot
            e_d2[t, c] = d2
            e_max[t, c] = peak
            e_exc[t, c] = excess
            if t > 0 and valid[t - 1]:
                prev = buf[(t - 1) & 1]
                e_dot[t, c, 0] = _dot(cur[c], prev[k_s + c])  # served t . recorded t-1
                e_dot[t - 1, c, 2] = _dot(prev[c], cur[k_s + c])  # served t-1 . recorded t
        for j0 in range(0, cols, TILE):
            # a tile of up to three boundaries (the last one repeated to fill it; repeats are not added)
            width = min(TILE, cols - j0)
            if gram:
                x = _boundary(addrs, j0, proto, tokens, hidden)[t]
                y = _boundary(addrs, min(j0 + 1, cols - 1), proto, tokens, hidden)[t]
                z = _boundary(addrs, min(j0 + 2, cols - 1), proto, tokens, hidden)[t]
                for g in range(groups):
                    o = g * TILE
                    if g == 0:
                        norms, sx, sy, sz = _gram_norm(x, y, z, cur[o], cur[o + 1], cur[o + 2])
                        for i in range(width):
                            nb2_t[j0 + i] = norms[i]
                    else:
                        sx, sy, sz = _gram(x, y, z, cur[o], cur[o + 1], cur[o + 2])
                    for i in range(min(TILE, rows - o)):
                        dots_t[o + i, j0] = sx[i]
                        if width > 1:
                            dots_t[o + i, j0 + 1] = sy[i]
                        if width > 2:
                            dots_t[o + i, j0 + 2] = sz[i]
            for j in range(j0, j0 + width):
                for q in range(col_ptr[j], col_ptr[j + 1]):
                    p = col_pairs[q]
                    row = _boundary(addrs, j, proto, tokens, hidden)[t]
                    if pair_full[p]:
                        b2, d2, peak, excess = _diff(row, cur[pair_row[p]], pair_rtol[p])
                        p_max[t, p] = peak
                        p_exc[t, p] = excess
                    else:
                        b2, d2 = _diff_norms(row, cur[pair_row[p]], pair_rtol[p])
                    p_b2[t, p] = b2
                    p_d2[t, p] = d2
        if gram:
            _gram_token(na2[t], dots_t, nb2_t, b2_t, nb_t, fin_t, g_cos, g_count, g_diff2, g_rel, g_ref2,
                        g_nonfinite)
