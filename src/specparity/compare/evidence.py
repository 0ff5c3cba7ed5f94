"""Direct served-vs-recorded evidence per chunk: exact errors, token shifts, scale, non-finite values.

These compare each served chunk with the recorded chunk of the same index only (``k`` pairs, no
atlas), so they are cheap next to attribution; :func:`drift` gathers them from the per-token statistics that
attribution's one pass over the atlas already made (compare/scan.py). They feed the rules of :mod:`diagnosis`:
``position_shift`` (row ``t`` of the served chunk equals recorded row ``t±1``), ``norm_mismatch``
(same direction, different per-token scale) and ``nonfinite``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specparity.compare.attribution_scan import AtlasScan, Samples
from specparity.compare.scan import TokenPairStats, token_stats
from specparity.compare.tolerances import DRIFT_PERCENTILE


@dataclass(frozen=True)
class ChunkEvidence:
    """Served chunk ``index`` against recorded chunk ``index``, over valid tokens of all samples.

    ``cosine_by_shift[s]`` for ``s`` in (-1, 0, 1) is the mean per-token cosine of served row ``t``
    with recorded row ``t + s``. ``scale_ratio`` is the mean of ``||served_t|| / ||recorded_t||``
    and ``scale_ratio_cv`` its coefficient of variation over tokens; ``served_norm_cv`` and
    ``recorded_norm_cv`` are the coefficients of variation of the per-token norms (an RMSNorm output
    has a nearly constant per-token norm, a residual stream does not).
    """

    index: int
    cosine_by_shift: tuple[float, float, float]
    rel_err: float
    max_abs_err: float
    min_passing_atol: float
    scale_ratio: float
    scale_ratio_cv: float
    served_norm_cv: float
    recorded_norm_cv: float
    nonfinite_served: int
    nonfinite_recorded: int
    token_rel_err_p99: float = math.nan  # per-token ||served_t - recorded_t|| / ||recorded_t||, 99th percentile
    token_rel_err_max: float = math.nan
    token_rel_err_mean: float = math.nan

    def cosine_at(self, shift: int) -> float:
        """Mean cosine of served row ``t`` with recorded row ``t + shift`` (shift in -1, 0, 1)."""
        return self.cosine_by_shift[shift + 1]

    def to_dict(self) -> dict[str, object]:
        """Plain-JSON view."""
        return {
            "index": self.index,
            "cosine_by_shift": {"-1": self.cosine_by_shift[0], "0": self.cosine_by_shift[1],
                                "1": self.cosine_by_shift[2]},
            "rel_err": self.rel_err,
            "max_abs_err": self.max_abs_err,
            "min_passing_atol": self.min_passing_atol,
            "scale_ratio": self.scale_ratio,
            "scale_ratio_cv": self.scale_ratio_cv,
            "served_norm_cv": self.served_norm_cv,
            "recorded_norm_cv": self.recorded_norm_cv,
            "nonfinite_served": self.nonfinite_served,
            "nonfinite_recorded": self.nonfinite_recorded,
            "token_rel_err_p99": self.token_rel_err_p99,
            "token_rel_err_max": self.token_rel_err_max,
            "token_rel_err_mean": self.token_rel_err_mean,
        }


class _Moments:
    """Running count / sum / sum of squares of a per-token statistic."""

    def __init__(self) -> None:
        self.n = 0.0
        self.s = 0.0
        self.s2 = 0.0

    def add(self, values: torch.Tensor) -> None:
        v = values.double()
        self.n += float(v.numel())
        self.s += float(v.sum())
        self.s2 += float((v * v).sum())

    def mean(self) -> float:
        return self.s / self.n if self.n else math.nan

    def cv(self) -> float:
        if not self.n:
            return math.nan
        mean = self.mean()
        var = max(self.s2 / self.n - mean * mean, 0.0)
        return math.sqrt(var) / abs(mean) if mean else math.inf


class EvidenceAccumulator:
    """Accumulates :class:`ChunkEvidence` for one chunk index over samples."""

    def __init__(self, index: int, *, rtol: float) -> None:
        self.index = index
        self.rtol = rtol
        self.shift_sum = [0.0, 0.0, 0.0]
        self.shift_n = [0.0, 0.0, 0.0]
        self.diff2 = 0.0
        self.ref2 = 0.0
        self.max_abs = 0.0
        self.excess = 0.0
        self.ratio = _Moments()
        self.served_norm = _Moments()
        self.recorded_norm = _Moments()
        self.nonfinite_served = 0
        self.nonfinite_recorded = 0
        self.token_rel: list[torch.Tensor] = []

    def add(self, served: torch.Tensor, recorded: torch.Tensor, valid: torch.Tensor) -> None:
        """One sample: ``served`` and ``recorded`` are ``[T, H]`` (any float dtype), ``valid`` ``[T]`` bool."""
        self.add_stats(token_stats(served, recorded, rtol=self.rtol), valid, served=served, recorded=recorded)

    def add_stats(self, stats: TokenPairStats, valid: torch.Tensor, *, served: torch.Tensor,
                  recorded: torch.Tensor) -> None:
        """One sample from its per-token statistics (:func:`token_stats`, or the attribution scan's).

        ``served``/``recorded`` are read only to count non-finite elements, when a valid token has one.
        """
        valid = valid.to(torch.bool).cpu()
        na2, nb2 = stats.served_norm2, stats.recorded_norm2
        fin_a = torch.isfinite(na2)
        fin_b = torch.isfinite(nb2)
        if not bool((fin_a | ~valid).all()):
            self.nonfinite_served += int((~torch.isfinite(served[valid.to(served.device)])).sum())
        if not bool((fin_b | ~valid).all()):
            self.nonfinite_recorded += int((~torch.isfinite(recorded[valid.to(recorded.device)])).sum())
        row_ok = valid & fin_a & fin_b
        na = torch.where(row_ok, na2, 0.0).sqrt()
        nb = torch.where(row_ok, nb2, 0.0).sqrt()
        dots = stats.dots
        for slot, shift in enumerate((-1, 0, 1)):
            # served row t against recorded row t + shift
            if shift < 0:
                d, ok, norms = dots[1:, 0], row_ok[1:] & row_ok[:-1], na[1:] * nb[:-1]
            elif shift > 0:
                d, ok, norms = dots[:-1, 2], row_ok[:-1] & row_ok[1:], na[:-1] * nb[1:]
            else:
                d, ok, norms = dots[:, 1], row_ok, na * nb
            cos = d[ok].double() / norms[ok].double().clamp_min(1e-300)
            self.shift_sum[slot] += float(cos.sum())
            self.shift_n[slot] += float(ok.sum())
        if not bool(row_ok.any()):
            if bool(valid.any()):
                self.max_abs = self.excess = math.inf
            return
        d2 = stats.diff_norm2[row_ok].double()
        self.diff2 += float(d2.sum())
        self.token_rel.append(d2.sqrt() / nb[row_ok].double().clamp_min(1e-300))
        self.ref2 += float(nb2[row_ok].double().sum())
        self.max_abs = max(self.max_abs, float(stats.max_abs[row_ok].max()))
        self.excess = max(self.excess, float(stats.max_excess[row_ok].max()))
        self.ratio.add(na[row_ok] / nb[row_ok].clamp_min(1e-30))
        self.served_norm.add(na[row_ok])
        self.recorded_norm.add(nb[row_ok])
        if not bool((valid == row_ok).all()):
            # a non-finite value on a valid row makes the elementwise comparison fail
            self.max_abs = math.inf
            self.excess = math.inf

    def result(self) -> ChunkEvidence:
        """The accumulated evidence."""
        shifts = tuple(s / n if n else math.nan for s, n in zip(self.shift_sum, self.shift_n, strict=True))
        rel = math.sqrt(self.diff2 / self.ref2) if self.ref2 > 0 else math.inf
        tok = torch.cat(self.token_rel) if self.token_rel else torch.zeros(0, dtype=torch.float64)
        p99, peak, mean = ((float(torch.quantile(tok, DRIFT_PERCENTILE)), float(tok.max()), float(tok.mean()))
                           if tok.numel() else (math.inf, math.inf, math.inf))
        if not math.isfinite(self.max_abs):
            rel = p99 = peak = mean = math.inf
        return ChunkEvidence(
            index=self.index,
            cosine_by_shift=(shifts[0], shifts[1], shifts[2]),
            rel_err=rel,
            max_abs_err=self.max_abs,
            min_passing_atol=max(self.excess, 0.0),
            scale_ratio=self.ratio.mean(),
            scale_ratio_cv=self.ratio.cv(),
            served_norm_cv=self.served_norm.cv(),
            recorded_norm_cv=self.recorded_norm.cv(),
            nonfinite_served=self.nonfinite_served,
            nonfinite_recorded=self.nonfinite_recorded,
            token_rel_err_p99=p99,
            token_rel_err_max=peak,
            token_rel_err_mean=mean,
        )


def drift(samples: Samples, scanned: AtlasScan, *, rtol: Sequence[float]) -> tuple[ChunkEvidence, ...]:
    """Served chunk ``c`` against recorded chunk ``c`` for every chunk both sides have (what numeric drift is
    judged on), from the token statistics of attribution's scan; ``rtol[c]`` for the smallest passing atol."""
    evidence = [EvidenceAccumulator(c, rtol=rtol[c]) for c in range(min(samples.k_s, samples.k_r))]
    h = samples.hidden
    for i, stats in scanned.token_stats:
        for c, (ev, st) in enumerate(zip(evidence, stats, strict=True)):
            ev.add_stats(st, samples.valids[i], served=samples.served[i][:, c * h:(c + 1) * h],
                         recorded=samples.recorded[i][:, c * h:(c + 1) * h])
    return tuple(ev.result() for ev in evidence)
