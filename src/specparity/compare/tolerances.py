"""Dtype-aware tolerances for comparing a served fc chunk against a recorded one.

A :class:`Tolerance` has two jobs:

- *identity* (attribution): is this chunk the tensor of that source? Decided on the per-token cosine
  (``cosine_floor``), on the whole-chunk relative error (``max_rel_err``, which catches a rescaled
  tensor that cosine cannot see) and on how far the best candidate is ahead of the runner-up
  (``min_margin``, in cosine).
- *numeric parity*: elementwise ``|a - b| <= atol + rtol * |b|`` against the recorded chunk, the rule
  of ``torch.testing.assert_close``. Like Polygraphy, we also report the smallest ``atol`` (at the
  configured ``rtol``) that would have passed, so a near miss reads as a number, not a verdict.

Defaults (domain.md §4 "Numeric notes", measured with SpecForge on CPU, 4-layer bf16 target):
same-layer bf16 differences between HF and SGLang kernels were 5e-4 .. 3e-2 (max abs), wrong-layer
differences were >= 0.06. The bf16 ``atol`` is the top of the same-layer range, half the smallest
wrong-layer difference; ``rtol`` is ``torch.testing``'s bf16 default. In fp32 the measured served fc
input equalled the HF hidden states exactly (sglang-cpu.md §2), so fp32 is near exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from specparity.errors import InputError


@dataclass(frozen=True)
class Tolerance:
    """Thresholds for one chunk. All fields are non-negative; cosines are in [-1, 1]."""

    atol: float
    rtol: float
    cosine_floor: float
    min_margin: float
    max_rel_err: float = 5e-2

    def __post_init__(self) -> None:
        for name in ("atol", "rtol", "min_margin", "max_rel_err"):
            value = getattr(self, name)
            if not (value >= 0.0 and math.isfinite(value)):
                raise InputError(f"must be a finite number >= 0, got {value!r}", field=f"tolerance.{name}")
        if not -1.0 <= self.cosine_floor <= 1.0:
            raise InputError(f"must lie in [-1, 1], got {self.cosine_floor!r}", field="tolerance.cosine_floor")

    def to_dict(self) -> dict[str, float]:
        """Plain-JSON view."""
        return {
            "atol": self.atol,
            "rtol": self.rtol,
            "cosine_floor": self.cosine_floor,
            "min_margin": self.min_margin,
            "max_rel_err": self.max_rel_err,
        }


# 1 - cos ~= rel_err**2 / 2 for noise orthogonal to the signal, so each cosine floor below admits a
# relative error of about sqrt(2 * (1 - floor)): fp32 4.5e-3, fp16 1e-2, bf16 4.5e-2.
_DEFAULTS: dict[str, Tolerance] = {
    "float64": Tolerance(atol=1e-7, rtol=1e-7, cosine_floor=0.999999, min_margin=1e-6, max_rel_err=1e-3),
    "float32": Tolerance(atol=1e-5, rtol=1.3e-6, cosine_floor=0.99999, min_margin=1e-5, max_rel_err=1e-2),
    "float16": Tolerance(atol=5e-3, rtol=1e-3, cosine_floor=0.99995, min_margin=5e-5, max_rel_err=2e-2),
    "bfloat16": Tolerance(atol=3e-2, rtol=1.6e-2, cosine_floor=0.999, min_margin=1e-4, max_rel_err=5e-2),
}

_ALIASES: dict[str, str] = {
    "fp64": "float64",
    "double": "float64",
    "fp32": "float32",
    "float": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
}


def canonical_dtype(dtype: str | torch.dtype) -> str:
    """``'bf16'``, ``'torch.bfloat16'`` and ``torch.bfloat16`` all become ``'bfloat16'``."""
    name = str(dtype).strip().lower().removeprefix("torch.")
    name = _ALIASES.get(name, name)
    if name not in _DEFAULTS:
        known = ", ".join(sorted(_DEFAULTS))
        raise InputError(f"no default tolerance for dtype {dtype!r} (known: {known})", field="dtype")
    return name


def default_tolerance(dtype: str | torch.dtype) -> Tolerance:
    """The default :class:`Tolerance` for tensors stored in ``dtype`` (e.g. ``"bfloat16"``)."""
    return _DEFAULTS[canonical_dtype(dtype)]


def resolve_tolerance(
    default: Tolerance,
    overrides: Mapping[int | str, Tolerance] | None,
    *,
    chunk: int,
    source: str | None,
) -> Tolerance:
    """The tolerance for one chunk: an override keyed by chunk index wins, then one keyed by source."""
    if not overrides:
        return default
    if chunk in overrides:
        return overrides[chunk]
    if source is not None and source in overrides:
        return overrides[source]
    return default


def min_passing_atol(actual: torch.Tensor, expected: torch.Tensor, *, rtol: float) -> float:
    """Smallest ``atol`` for which ``|actual - expected| <= atol + rtol * |expected|`` holds everywhere.

    ``inf`` when either side has a NaN/Inf or the shapes differ. Computed in float32 blocks of rows.
    """
    if actual.shape != expected.shape:
        return math.inf
    worst = 0.0
    rows_a = actual.reshape(-1, actual.shape[-1]) if actual.ndim else actual.reshape(1, 1)
    rows_e = expected.reshape(-1, expected.shape[-1]) if expected.ndim else expected.reshape(1, 1)
    for start in range(0, rows_a.shape[0], 256):
        a = rows_a[start : start + 256].float()
        e = rows_e[start : start + 256].float()
        excess = (a - e).abs() - rtol * e.abs()
        if excess.numel() == 0:
            continue
        peak = float(excess.max())
        if not math.isfinite(peak) or bool((~torch.isfinite(excess)).any()):
            return math.inf
        worst = max(worst, peak)
    return worst


def within(max_abs_err: float, passing_atol: float, tolerance: Tolerance) -> bool:
    """Whether a chunk whose smallest passing atol is ``passing_atol`` meets ``tolerance``."""
    return math.isfinite(max_abs_err) and passing_atol <= tolerance.atol


def identity_holds(*, cosine: float, rel_err: float, margin: float, tolerance: Tolerance) -> bool:
    """Whether a best candidate with these similarities may be named as the chunk's source."""
    return (
        math.isfinite(cosine)
        and cosine >= tolerance.cosine_floor
        and math.isfinite(rel_err)
        and rel_err <= tolerance.max_rel_err
        and margin >= tolerance.min_margin
    )


_FIELDS = ("atol", "rtol", "cosine_floor", "min_margin", "max_rel_err")


def _as_mapping(obj: object) -> Mapping[str, object]:
    if obj is None:
        return {}
    if isinstance(obj, Mapping):
        return obj
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        out = dump()
        if isinstance(out, Mapping):
            return out
    raise InputError(f"expected a mapping of tolerance fields, got {type(obj).__name__}", field="tolerances")


def merge_tolerance(base: Tolerance, override: Mapping[str, object] | object | None) -> Tolerance:
    """``base`` with every field ``override`` sets (None or absent fields keep ``base``'s value)."""
    values = dict(base.to_dict())
    for name, value in _as_mapping(override).items():
        if name not in _FIELDS:
            raise InputError(f"unknown tolerance field {name!r} (known: {', '.join(_FIELDS)})", field="tolerances")
        if value is not None:
            if not isinstance(value, int | float):
                raise InputError(f"must be a number, got {value!r}", field=f"tolerances.{name}")
            values[name] = float(value)
    return Tolerance(**values)


def tolerances_from_contract(
    tolerances: Mapping[str, object] | object | None, *, dtype: str | torch.dtype
) -> tuple[Tolerance, dict[int | str, Tolerance]]:
    """The default tolerance and per-chunk overrides for comparing ``dtype`` tensors under a contract.

    ``tolerances`` is the contract's ``tolerances`` section (model or dict: ``default``, ``per_dtype``,
    ``per_chunk``). Precedence, weakest first: :func:`default_tolerance` of ``dtype``, the contract's
    ``default``, its ``per_dtype[dtype]``, then ``per_chunk[i]`` for chunk ``i``.
    """
    section = _as_mapping(tolerances)
    name = canonical_dtype(dtype)
    base = merge_tolerance(default_tolerance(name), section.get("default"))
    per_dtype = _as_mapping(section.get("per_dtype"))
    base = merge_tolerance(base, per_dtype.get(name))
    overrides: dict[int | str, Tolerance] = {}
    for chunk, override in _as_mapping(section.get("per_chunk")).items():
        overrides[int(chunk)] = merge_tolerance(base, override)
    return base, overrides
