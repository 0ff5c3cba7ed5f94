"""The attribution scan (compare/scan.py): both backends against a direct float64 computation.

The numba kernels (compare/scan_kernels.py) are the fast path on CPU; the torch blocks are the path on
an accelerator and wherever numba is missing. Every number either one gives is held to a direct
computation from the same dtype-rounded values, with tolerances stated per quantity:

- exact differences (what the verdict judges): float32 sums of at most H terms, so 1e-5 relative;
- Gram terms (what only ranks): ``||a||^2 + ||b||^2 - 2 a.b`` with float32 dot products, so its error is
  1e-5 of ``||a||^2 + ||b||^2``, and a relative error near 0 is resolved only to the square root of that:
  which is why attribution recomputes every best and runner-up exactly.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specparity.compare.attribution import attribute
from specparity.compare.scan import Pairs, TokenStats, numba_available, scan
from specparity.compare.synthetic import concat_sources, residual_stream
from specparity.compare.tolerances import DRIFT_PERCENTILE, default_tolerance, separation
from specparity.sources import all_sources

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BACKENDS = ("numba", "torch")
EXACT = 1e-5  # relative: a float32 sum of at most a few hundred terms
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_numba_backend_is_installed() -> None:
    # the fast path is what the benchmark's goal is measured on: an env without it must not pass quietly
    assert numba_available(), "numba is missing: scripts/venv.sh installs constraints/fast.txt"


@st.composite
def samples(draw: st.DrawFn) -> dict[str, object]:
    tokens = draw(st.integers(1, 9))
    hidden = draw(st.integers(1, 37))  # not a multiple of the vector width, on purpose
    k_s, k_r = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    cols = draw(st.integers(1, 8))  # not a multiple of the 3-boundary tile, on purpose
    seed = draw(st.integers(0, 2**16))
    dtypes = [draw(st.sampled_from(DTYPES)) for _ in range(3)]
    gen = torch.Generator().manual_seed(seed)
    atlas = [(torch.randn(tokens, hidden, generator=gen) * (1 + j)).to(dtypes[2]) for j in range(cols)]

    def chunks(k: int, dtype: torch.dtype) -> torch.Tensor:
        # some chunks are a boundary (exact, or with small noise), others are unrelated
        out = []
        for _ in range(k):
            j = int(torch.randint(0, cols, (1,), generator=gen))
            kind = int(torch.randint(0, 3, (1,), generator=gen))
            base = atlas[j].double()
            if kind == 1:
                base = base * (1 + 1e-2 * torch.randn(base.shape, generator=gen, dtype=torch.float64))
            elif kind == 2:
                base = torch.randn(base.shape, generator=gen, dtype=torch.float64)
            out.append(base)
        return torch.cat(out, dim=-1).to(dtype)

    valid = torch.rand(tokens, generator=gen) < 0.8
    npairs = draw(st.integers(0, 5))
    rows = [int(r) for r in torch.randint(0, k_s + k_r, (npairs,), generator=gen)]
    pcols = [int(c) for c in torch.randint(0, cols, (npairs,), generator=gen)]
    return {"served": chunks(k_s, dtypes[0]), "recorded": chunks(k_r, dtypes[1]), "atlas": atlas, "valid": valid,
            "hidden": hidden, "pairs": Pairs(tuple(rows), tuple(pcols), tuple(0.01 for _ in rows)),
            "evidence": tuple(0.02 for _ in range(min(k_s, k_r)))}


def _rows(s: dict[str, object]) -> torch.Tensor:
    """[T, R, H] float64 chunk rows, served then recorded, from the dtype-rounded values."""
    h = s["hidden"]
    served, recorded = s["served"], s["recorded"]
    assert isinstance(h, int) and isinstance(served, torch.Tensor) and isinstance(recorded, torch.Tensor)
    t = served.shape[0]
    return torch.cat([served.double().reshape(t, -1, h), recorded.double().reshape(t, -1, h)], dim=1)


def _close(got: torch.Tensor, want: torch.Tensor, tol: torch.Tensor | float, what: str) -> None:
    bad = (got.double() - want).abs() > tol
    assert not bool(bad.any()), f"{what}: got {got[bad].tolist()} want {want[bad].tolist()}"


def _check(st_: TokenStats, s: dict[str, object]) -> None:
    a = _rows(s)
    atlas = s["atlas"]
    valid = s["valid"]
    pairs = s["pairs"]
    assert isinstance(atlas, list) and isinstance(valid, torch.Tensor) and isinstance(pairs, Pairs)
    b = torch.stack([x.double() for x in atlas], dim=1)  # [T, C, H]
    v = valid
    a2 = (a * a).sum(-1)
    _close(st_.na2[v], a2[v], EXACT * a2[v] + 1e-30, "chunk norms")
    # Gram sums, over valid tokens
    g = st_.gram
    assert g is not None
    b2 = (b * b).sum(-1)
    dots = torch.einsum("trh,tch->trc", a, b)
    w = v[:, None, None].double()
    scale = a2[:, :, None] + b2[:, None, :]
    d2 = (a2[:, :, None] + b2[:, None, :] - 2 * dots).clamp_min(0)
    assert torch.equal(g.count, w.expand_as(d2).sum(0)), "count"
    _close(g.ref2, (b2[:, None, :] * w).sum(0), EXACT * (b2[:, None, :] * w).sum(0) + 1e-30, "ref2")
    _close(g.diff2, (d2 * w).sum(0), (EXACT * scale * w).sum(0) + 1e-30, "diff2 (Gram)")
    cos = dots / (a2[:, :, None] * b2[:, None, :]).sqrt().clamp_min(1e-300)
    _close(g.cos, (cos * w).sum(0), (EXACT * scale / (a2[:, :, None] * b2[:, None, :]).sqrt().clamp_min(1e-300)
                                     * w).sum(0) + 1e-12, "cosine (Gram)")
    rel = d2.sqrt() / b2[:, None, :].sqrt().clamp_min(1e-300)
    rel_tol = ((EXACT * scale).sqrt() / b2[:, None, :].sqrt().clamp_min(1e-300) * w).sum(0) + 1e-12
    _close(g.rel, (rel * w).sum(0), rel_tol, "relative error (Gram)")
    assert not bool(g.nonfinite.any())
    # exact pairs, per valid token
    for p, (r, c) in enumerate(zip(pairs.rows, pairs.cols, strict=True)):
        d = a[:, r] - b[:, c]
        want_d2 = (d * d).sum(-1)
        _close(st_.pair_d2[v, p], want_d2[v], EXACT * want_d2[v] + 1e-30, "pair ||a-b||^2")
        _close(st_.pair_b2[v, p], b2[v, c], EXACT * b2[v, c] + 1e-30, "pair ||b||^2")
        peak = d.abs().amax(-1)
        _close(st_.pair_max[v, p], peak[v], 1e-6 * peak[v], "pair max |a-b|")
        excess = (d.abs() - pairs.rtol[p] * b[:, c].abs()).amax(-1).clamp_min(0)  # from 0 up
        _close(st_.pair_excess[v, p], excess[v], 1e-6 * (peak[v] + b[:, c].abs().amax(-1)[v]), "pair excess")
    # served chunk c against recorded chunk c
    k_s = a.shape[1] - _k_r(s)
    for c, ev in enumerate(st_.evidence):
        s_, r_ = a[:, c], a[:, k_s + c]
        mags = s_.abs() @ r_.abs().T  # bound of the float32 dot product error
        for shift, slot, (lo, hi) in ((-1, 0, (1, None)), (0, 1, (0, None)), (1, 2, (0, -1))):
            t_idx = torch.arange(a.shape[0])[lo:hi]
            ok = v[t_idx] & v[t_idx + shift]
            want = (s_[t_idx] * r_[t_idx + shift]).sum(-1)
            tol = EXACT * mags[t_idx, t_idx + shift] + 1e-30
            _close(ev.dots[t_idx, slot][ok], want[ok], tol[ok], f"evidence dot at shift {shift}")
        d = s_ - r_
        _close(ev.diff_norm2[v], (d * d).sum(-1)[v], EXACT * (d * d).sum(-1)[v] + 1e-30, "evidence ||s-r||^2")
        _close(ev.max_abs[v], d.abs().amax(-1)[v], 1e-6 * d.abs().amax(-1)[v], "evidence max |s-r|")


def _k_r(s: dict[str, object]) -> int:
    recorded, h = s["recorded"], s["hidden"]
    assert isinstance(recorded, torch.Tensor) and isinstance(h, int)
    return recorded.shape[1] // h


@pytest.mark.parametrize("backend", BACKENDS)
@SETTINGS
@given(samples())
def test_scan_equals_a_direct_computation(backend: str, s: dict[str, object]) -> None:
    st_ = scan(s["served"], s["recorded"], s["atlas"], s["valid"], hidden=s["hidden"], pairs=s["pairs"],  # type: ignore[arg-type]
               evidence_rtol=s["evidence"], gram=True, block_tokens=3, backend=backend)  # type: ignore[arg-type]
    _check(st_, s)


# attribution as reported: every number the verdict uses equals a direct float64 computation


@st.composite
def deployments(draw: st.DrawFn) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, list[str], torch.Tensor]:
    layers = draw(st.integers(2, 7))
    names = all_sources(layers)
    dtype = draw(st.sampled_from(DTYPES))
    seed = draw(st.integers(0, 2**16))
    hidden = draw(st.integers(4, 40))
    tokens = draw(st.integers(2, 10))
    atlas = {k: v.to(dtype) for k, v in residual_stream(layers, hidden, tokens=tokens, seed=seed).items()}
    if draw(st.booleans()):  # a duplicated boundary: best and runner-up tie
        atlas[names[1]] = atlas[names[0]].clone()
    k = draw(st.integers(1, 3))
    expected = draw(st.lists(st.sampled_from(names), min_size=k, max_size=k, unique=True))
    wired = draw(st.lists(st.sampled_from(names), min_size=k, max_size=k))  # right, wrong or permuted
    gen = torch.Generator().manual_seed(seed + 1)
    recorded = concat_sources(atlas, expected).double()
    recorded = (recorded * (1 + 3e-3 * torch.randn(recorded.shape, generator=gen, dtype=torch.float64))).to(dtype)
    served = concat_sources(atlas, wired).double()
    served = (served * (1 + 3e-3 * torch.randn(served.shape, generator=gen, dtype=torch.float64))).to(dtype)
    mask = torch.rand(tokens, generator=gen) < 0.85
    mask[0] = True
    return atlas, served, recorded, expected, mask


def _direct_rel(x: torch.Tensor, atlas: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, float]:
    """Mean over valid tokens of ||x_t - b_t|| / ||b_t||, in float64 (inf for a boundary with no energy)."""
    out = {}
    for name, b in atlas.items():
        bd = b.double()[mask]
        tok = (x.double()[mask] - bd).norm(dim=-1) / bd.norm(dim=-1).clamp_min(1e-300)
        out[name] = float(tok.mean()) if float((bd * bd).sum()) > 0 else math.inf
    return out


def _approx(got: float, want: float) -> bool:
    return (math.isinf(got) and math.isinf(want)) or abs(got - want) <= EXACT * abs(want) + 1e-9


@pytest.mark.parametrize("backend", BACKENDS)
@SETTINGS
@given(deployments())
def test_reported_errors_and_separation_equal_a_direct_computation(
        backend: str, d: tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, list[str], torch.Tensor]) -> None:
    atlas, served, recorded, expected, mask = d
    h = next(iter(atlas.values())).shape[-1]
    tol = default_tolerance(served.dtype)
    table = attribute([served], [recorded], [atlas], expected=expected, tolerance=tol, masks=[mask],
                      backend=backend)  # type: ignore[arg-type]
    for side, src in (("served", served), ("recorded", recorded)):
        for chunk in getattr(table, side):
            x = src[:, chunk.index * h:(chunk.index + 1) * h]
            direct = _direct_rel(x, atlas, mask)
            ranked = sorted(direct.values())
            assert chunk.best is not None and chunk.runner_up is not None
            # the reported numbers are the exact errors of the named boundaries ...
            assert _approx(chunk.rel_err, direct[chunk.best]), (side, chunk.index, chunk.rel_err, direct)
            assert _approx(chunk.runner_up_rel_err, direct[chunk.runner_up]), (side, chunk.index, direct)
            if chunk.expected is not None:
                assert _approx(chunk.expected_rel_err, direct[chunk.expected])
            # ... and those boundaries are the best and the runner-up
            assert _approx(chunk.rel_err, ranked[0]), (side, chunk.index, chunk.best, direct)
            assert _approx(chunk.runner_up_rel_err, ranked[1]), (side, chunk.index, chunk.runner_up, direct)
            want = separation(direct[chunk.best], direct[chunk.runner_up])
            assert _approx(chunk.separation, want) or (math.isinf(want) and math.isinf(chunk.separation))
    # drift: served chunk c against recorded chunk c, per valid token
    for ev in table.evidence:
        s_ = served[:, ev.index * h:(ev.index + 1) * h].double()[mask]
        r_ = recorded[:, ev.index * h:(ev.index + 1) * h].double()[mask]
        tok = (s_ - r_).norm(dim=-1) / r_.norm(dim=-1).clamp_min(1e-300)
        assert _approx(ev.token_rel_err_max, float(tok.max()))
        assert _approx(ev.token_rel_err_p99, float(torch.quantile(tok, DRIFT_PERCENTILE)))


def test_backends_agree_on_every_field_with_pads_nonfinite_and_several_samples() -> None:
    samples_ = []
    for i, tokens in enumerate((7, 12)):
        states = residual_stream(5, 40, tokens=tokens, seed=40 + i, dtype=torch.bfloat16)
        fc = concat_sources(states, ["layer:1", "layer:3"])
        samples_.append((states, fc.clone(), fc))
    served = [s[1] for s in samples_]
    served[1][4, 3] = float("nan")
    masks = [torch.tensor([True] * 5 + [False] * 2), None]
    tables = [attribute(served, [s[2] for s in samples_], [s[0] for s in samples_], expected=["layer:1", "layer:3"],
                        tolerance=default_tolerance("bfloat16"), masks=masks, backend=b) for b in BACKENDS]  # type: ignore[arg-type]
    a, b = (t.to_dict() for t in tables)
    assert a.keys() == b.keys()

    def same(x: object, y: object, path: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict):
            assert x.keys() == y.keys(), path
            for k in x:
                same(x[k], y[k], f"{path}.{k}")
        elif isinstance(x, list | tuple) and isinstance(y, list | tuple):
            assert len(x) == len(y), path
            for i, (u, w) in enumerate(zip(x, y, strict=True)):
                same(u, w, f"{path}[{i}]")
        elif isinstance(x, float) and isinstance(y, float):
            assert (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, rel=1e-4, abs=1e-6), (path, x, y)
        else:
            assert x == y, (path, x, y)

    same(a, b, "table")
    assert tables[0].served_sources() == ["layer:1", "layer:3"]
    assert tables[0].evidence[0].nonfinite_served == 1
