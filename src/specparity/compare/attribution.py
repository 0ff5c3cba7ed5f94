"""Attribute every fc-input chunk, served and recorded, to a canonical source.

Inputs per sample: the served fc input ``[T, k_s*H]`` (what the engine fed ``fc``), the recorded
``aux_hidden_state`` ``[T, k_r*H]`` (what training fed ``fc``; chunk order = the contract's
sources), and a layer atlas ``{canonical source: [T, H]}`` from the serving target. Chunks are
``H``-wide slices in fc order (sglang 0.5.23 layers/aux_hidden_states.py:97-102 concatenates on the
feature dim). Row ``t`` of every tensor belongs to token ``t`` (domain.md §1 "Alignment").

:func:`attribute` checks its inputs and takes each chunk's tolerance, then runs four steps; each takes what
the one before gave, so the data passes through compare/ one way:

1. **the scan** (:func:`specparity.compare.attribution_scan.scan_samples`): every chunk against every boundary,
   averaged over valid tokens of all samples, in one pass over each sample's atlas; the Gram form ranks the
   boundaries, and the numbers that are reported and judged are exact, from the difference itself;
2. **drift** (:func:`specparity.compare.evidence.drift`): served chunk ``c`` against recorded chunk ``c``, from
   the token statistics of the same pass;
3. **identity and separation per chunk** (:func:`_identify`): identity is scale-free (compare/tolerances.py):
   the best candidate is the boundary with the smallest mean relative error, and its *separation* (that error
   over the runner-up's) must be small;
4. **the table** (:func:`_table`): both sides' chunks, each with its distance from what it should equal, and
   the full chunk-by-boundary matrices.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from specparity.compare.attribution_scan import AtlasScan, Samples, checked_reduced, scan_samples
from specparity.compare.evidence import ChunkEvidence, drift
from specparity.compare.reduced import ReducedSample, check_reduced_rtol
from specparity.compare.scan import Backend
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
    reduced: Sequence[ReducedSample] | None = None,
) -> AttributionTable:
    """Attribute every served and recorded chunk of every sample to an atlas boundary.

    ``served[i]``, ``recorded[i]``, ``atlas[i]`` (and ``masks[i]``, bool ``[T]``, True = compare this
    token; pad positions are False, domain.md §4) describe sample ``i``. ``expected`` are the
    contract's sources in fc-chunk order; recorded chunk ``c`` is expected to be ``expected[c]``.
    Similarities are averaged over valid tokens of all samples. ``tolerance`` (and ``overrides``)
    judge served chunks against the atlas; ``recorded_tolerance`` (default: ``tolerance``) and
    ``recorded_overrides`` judge recorded chunks against it: each the coarser dtype's of its pair.
    ``reduced`` (compare/reduced.py), where given, stands for the atlas: each sample's scan statistics, reduced
    where the atlas was (``atlas`` is then not read); it must have been reduced with the sources and rtol used here.
    Raises :class:`InputError` on malformed input or when no token is valid.
    """
    samples = (_checked(served, recorded, atlas, masks=masks, expected=expected) if reduced is None
               else checked_reduced(served, recorded, reduced, masks=masks, expected=expected))
    # what each chunk is held to: served chunks (and the rtol of every exact pair) by ``tolerance``, recorded ones
    # by ``recorded_tolerance``; a served chunk past the recording's has no expected source
    sources: list[str | None] = [*expected, *[None] * (samples.k_s - samples.k_r)]
    tols = [resolve_tolerance(tolerance, overrides, chunk=c, source=src) for c, src in enumerate(sources)]
    rec_base, rec_over = ((recorded_tolerance, recorded_overrides) if recorded_tolerance is not None
                          else (tolerance, overrides))
    rec_tols = [resolve_tolerance(rec_base, rec_over, chunk=c, source=expected[c]) for c in range(samples.k_r)]
    rtol = [t.rtol for t in tols]
    if reduced is not None:
        check_reduced_rtol(reduced, rtol)
    scanned = scan_samples(samples, expected=expected, rtol=rtol, block_tokens=max(1, block_tokens), backend=backend)
    evidence = drift(samples, scanned, rtol=rtol)
    served_ids = [_identify(scanned, c, samples.names, expected=sources[c], tolerance=tols[c])
                  for c in range(samples.k_s)]
    recorded_ids = [_identify(scanned, samples.k_s + c, samples.names, expected=expected[c], tolerance=rec_tols[c])
                    for c in range(samples.k_r)]
    return _table(samples, scanned, served=served_ids, recorded=recorded_ids, evidence=evidence, sources=sources)


def _checked(served: Sequence[torch.Tensor], recorded: Sequence[torch.Tensor],
             atlas: Sequence[Mapping[str, torch.Tensor]], *, masks: Sequence[torch.Tensor | None] | None,
             expected: Sequence[str]) -> Samples:
    """The inputs as :class:`Samples`, or :class:`InputError` naming the first thing wrong with them."""
    if not (len(served) == len(recorded) == len(atlas)) or not served:
        raise InputError(
            f"need the same non-zero number of samples, got served {len(served)}, recorded {len(recorded)}, "
            f"atlas {len(atlas)}",
            field="samples",
        )
    if masks is not None and len(masks) != len(served):
        raise InputError(f"{len(masks)} masks for {len(served)} samples", field="masks")
    names = _boundary_names(atlas[0])
    hidden = int(atlas[0][names[0]].shape[-1])
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
    valids = []
    for i, s in enumerate(served):
        mask = masks[i] if masks is not None else None
        if mask is not None and mask.shape != (int(s.shape[0]),):
            raise InputError(f"has shape {tuple(mask.shape)}, expected ({int(s.shape[0])},)", field=f"masks[{i}]")
        valids.append(torch.ones(int(s.shape[0]), dtype=torch.bool) if mask is None else mask.to(torch.bool).cpu())
    if sum(int(v.sum()) for v in valids) == 0:
        raise InputError("no valid token to compare (every position is masked out or the capture is empty)",
                         field="masks")
    return Samples(served=served, recorded=recorded, atlas=atlas, valids=tuple(valids), names=tuple(names),
                   hidden=hidden, k_s=k_s, k_r=k_r)


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


@dataclass(frozen=True)
class _Identity:
    """One chunk's best and runner-up boundary, and whether the best may be named its source (``attributed``)."""

    best: str
    attributed: str | None
    cosine: float
    rel_err: float
    runner_up: str | None
    runner_up_cosine: float
    runner_up_rel_err: float
    margin: float
    separation: float
    expected_cosine: float
    expected_rel_err: float


def _identify(scanned: AtlasScan, row: int, names: Sequence[str], *, expected: str | None,
              tolerance: Tolerance) -> _Identity:
    """Identity and separation of chunk row ``row``: its best boundary is named when the relative error is within
    the identity limit and the runner-up is clearly behind (compare/tolerances.py)."""
    best, second = scanned.ranks[row]
    cos, rel = scanned.cos[row], scanned.rel[row]
    best_cos, best_rel = float(cos[best]), float(rel[best])
    second_cos = float(cos[second]) if second is not None else -1.0
    second_rel = float(rel[second]) if second is not None else math.inf
    sep = separation(best_rel, second_rel)
    exp = names.index(expected) if expected in names else None
    return _Identity(
        best=names[best],
        attributed=names[best] if identity_holds(rel_err=best_rel, separation=sep, tolerance=tolerance) else None,
        cosine=best_cos, rel_err=best_rel,
        runner_up=names[second] if second is not None else None, runner_up_cosine=second_cos,
        runner_up_rel_err=second_rel,
        margin=best_cos - second_cos if math.isfinite(best_cos) else math.nan, separation=sep,
        expected_cosine=float(cos[exp]) if exp is not None else math.nan,
        expected_rel_err=float(rel[exp]) if exp is not None else math.nan,
    )


def _table(samples: Samples, scanned: AtlasScan, *, served: Sequence[_Identity], recorded: Sequence[_Identity],
           evidence: Sequence[ChunkEvidence], sources: Sequence[str | None]) -> AttributionTable:
    """Both sides' chunks, each with its distance from what it should equal (a served chunk: the recorded chunk of
    its index; a recorded chunk: the atlas state of its expected source), and the full matrices."""
    k_s = samples.k_s

    def chunk(side: Side, c: int, identity: _Identity, against: tuple[float, float]) -> ChunkAttribution:
        return ChunkAttribution(index=c, side=side, expected=sources[c], max_abs_err=against[0],
                                min_passing_atol=against[1], **vars(identity))

    def matrix(t: torch.Tensor) -> tuple[tuple[float, ...], ...]:
        return tuple(tuple(float(x) for x in r) for r in t.tolist())

    nan = (math.nan, math.nan)
    return AttributionTable(
        boundaries=samples.names,
        served=tuple(chunk("served", c, ident, (evidence[c].max_abs_err, evidence[c].min_passing_atol)
                                              if c < len(evidence) else nan) for c, ident in enumerate(served)),
        recorded=tuple(chunk("recorded", c, ident, scanned.expected_maxima.get(k_s + c, nan))
                       for c, ident in enumerate(recorded)),
        served_cosine=matrix(scanned.cos[:k_s]),
        recorded_cosine=matrix(scanned.cos[k_s:]),
        served_rel_err=matrix(scanned.rel[:k_s]),
        recorded_rel_err=matrix(scanned.rel[k_s:]),
        evidence=tuple(evidence),
        hidden_size=samples.hidden,
        valid_tokens=sum(int(v.sum()) for v in samples.valids),
        samples=len(samples.served),
        atlas_nonfinite_tokens=scanned.atlas_nonfinite,
    )
