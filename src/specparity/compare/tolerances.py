"""Tolerances for every comparison the gate makes, set by the coarser side of each pair of dtypes.

Three comparisons, each between two tensors that may live in different dtypes:

- served chunk vs recorded chunk (numeric drift);
- recorded chunk vs the serving target's layer atlas (the contract's self-check);
- served chunk vs the atlas (identity: which source SGLang really fed ``fc``).

:func:`pair_tolerance` gives the :class:`Tolerance` for one such pair: it is the default of the
*coarser* dtype (larger unit roundoff ``u``), never of one side alone, so fp32 serving against a bf16
recording is judged as bf16.

**Identity** is scale-free. For each chunk, every atlas boundary gets the mean over tokens of the
per-token relative error ``||x_t - b_t|| / ||b_t||``. The best candidate is the boundary with the
smallest one; it may be named the chunk's source only when

- its relative error is at most ``max_rel_err`` (``IDENTITY_UNITS`` x ``u``, never below
  ``IDENTITY_FLOOR``): a chunk that matches nothing stays unknown, and
- its *separation*, its relative error over that of the nearest other boundary, is at most
  ``max_separation``: the expected source must be clearly ahead of every other boundary.

An absolute ``atol`` is never the pass rule; ``atol``/``rtol`` remain only for the "passes at atol >="
note (the rule of ``torch.testing.assert_close``, reported Polygraphy-style).

**Numeric drift** (served vs recorded, once identity holds) is judged on the per-token relative error
in units of ``u``: its 99th percentile against ``drift_p99`` and its maximum against ``drift_max``.
Outside is a warning (the wiring is right, the numerics are not), inside is context with the room left.

**Measured margins** (``scripts/measure_margins.py``: the bundled 8-layer target of fixtures/default,
the contract's 4 probes, 343 tokens, layer:1/3/5; each dtype a separate HF transformers run on CPU, one
thread; "one late" serves layer:2/4/6 instead):

================  =========================  ===============  ===============  ==================
served/recorded   recorded separation worst  drift p99        drift max        one late: p99
================  =========================  ===============  ===============  ==================
fp32 / fp32       0 (SGLang = HF exactly)    0                0                1.1e7 u
fp32 / bf16       0.047                      8.2 u            14.9 u           165 u
bf16 / fp32       0.047                      8.1 u            14.9 u           165 u
fp16 / bf16       0.047                      8.2 u            14.9 u           165 u
fp32 / fp16       0.0055                     7.6 u            10.6 u           1320 u
fp16 / fp32       0.0055                     7.7 u            10.5 u           1320 u
================  =========================  ===============  ===============  ==================

(u is the coarser dtype's unit roundoff: bf16 2^-8, fp16 2^-11, fp32 2^-24. Same-dtype pairs from
one HF run are exact here; across engines they look like the cross-dtype rows.) Through SGLang
0.5.23 itself (tests/catalog/test_catalog_bf16.py, the bf16 SpecForge-format recording of
fixtures/bf16): see the figures in that test's module docstring.

Adjacent boundaries of that target differ by 0.41 .. 0.71 per-token relative error; a real 7-70B
target's late layers differ by much less (~0.05-0.15, an estimate, not measured here: residual streams
grow with depth and each layer adds a smaller share), so the limits leave room for both:

- ``max_separation`` 0.5: 10x above the worst measured bf16 separation (0.047), and a real late-layer
  neighbour at 0.1 still leaves a bf16 chunk (0.016 mean rel err) at 0.16, 3x inside.
- ``drift_p99`` 24 u and ``drift_max`` 64 u: 2.9x and 4.3x above the worst measured drift (8.2 u,
  14.9 u); a layer one off is 165 u at p99 in bf16, 6.9x outside (identity fails it first).
- ``max_rel_err`` 32 u (bf16 0.125, fp16 0.016) with a floor of 1e-2 so fp32 kernels that differ
  (GPU reductions, TF32) are not unknown; the property tests in tests/unit/test_dtype_property.py
  check every correct layout passes and every wrong one fails for each pair of fp32/bf16/fp16.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from specparity.errors import InputError

UNIT_ROUNDOFF: dict[str, float] = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
}
MAX_SEPARATION = 0.5
IDENTITY_UNITS = 32.0
IDENTITY_FLOOR = 1e-2
DRIFT_P99_UNITS = 24.0
DRIFT_MAX_UNITS = 64.0
DRIFT_PERCENTILE = 0.99


@dataclass(frozen=True)
class Tolerance:
    """Thresholds for one comparison. All fields are non-negative; cosines are in [-1, 1].

    Identity: ``max_rel_err`` (best candidate's mean per-token relative error) and ``max_separation``
    (best over runner-up relative error). Drift: ``drift_p99`` / ``drift_max`` (per-token relative
    error, absolute, i.e. already multiplied by ``unit_roundoff``). ``cosine_floor`` and ``min_margin``
    explain unknown chunks (token shifts); ``atol``/``rtol`` feed the "passes at atol >=" note only.
    """

    atol: float
    rtol: float
    cosine_floor: float
    min_margin: float
    max_rel_err: float = 5e-2
    max_separation: float = MAX_SEPARATION
    drift_p99: float = math.inf
    drift_max: float = math.inf
    unit_roundoff: float = 0.0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in ("atol", "rtol", "min_margin", "max_rel_err", "max_separation", "drift_p99", "drift_max",
                     "unit_roundoff"):
            value = getattr(self, name)
            if not (value >= 0.0 and (math.isfinite(value) or name.startswith("drift"))):
                raise InputError(f"must be a finite number >= 0, got {value!r}", field=f"tolerance.{name}")
        if not -1.0 <= self.cosine_floor <= 1.0:
            raise InputError(f"must lie in [-1, 1], got {self.cosine_floor!r}", field="tolerance.cosine_floor")

    def units(self, rel_err: float) -> float:
        """``rel_err`` in units of this comparison's unit roundoff (inf when ``u`` is 0)."""
        if self.unit_roundoff <= 0:
            return 0.0 if rel_err == 0 else math.inf
        return rel_err / self.unit_roundoff

    def to_dict(self) -> dict[str, float | str]:
        """Plain-JSON view."""
        return {
            "atol": self.atol,
            "rtol": self.rtol,
            "cosine_floor": self.cosine_floor,
            "min_margin": self.min_margin,
            "max_rel_err": self.max_rel_err,
            "max_separation": self.max_separation,
            "drift_p99": self.drift_p99,
            "drift_max": self.drift_max,
            "unit_roundoff": self.unit_roundoff,
            "dtype": self.dtype,
        }


def _default(dtype: str, *, atol: float, rtol: float, cosine_floor: float, min_margin: float) -> Tolerance:
    u = UNIT_ROUNDOFF[dtype]
    return Tolerance(atol=atol, rtol=rtol, cosine_floor=cosine_floor, min_margin=min_margin,
                     max_rel_err=max(IDENTITY_UNITS * u, IDENTITY_FLOOR), max_separation=MAX_SEPARATION,
                     drift_p99=DRIFT_P99_UNITS * u, drift_max=DRIFT_MAX_UNITS * u, unit_roundoff=u, dtype=dtype)


# atol/rtol: torch.testing's defaults per dtype (bf16's atol the top of the same-layer range measured
# with SpecForge, domain.md §4); 1 - cos ~= rel_err**2 / 2 for noise orthogonal to the signal.
_DEFAULTS: dict[str, Tolerance] = {
    "float64": _default("float64", atol=1e-7, rtol=1e-7, cosine_floor=0.999999, min_margin=1e-6),
    "float32": _default("float32", atol=1e-5, rtol=1.3e-6, cosine_floor=0.99999, min_margin=1e-5),
    "float16": _default("float16", atol=5e-3, rtol=1e-3, cosine_floor=0.99995, min_margin=5e-5),
    "bfloat16": _default("bfloat16", atol=3e-2, rtol=1.6e-2, cosine_floor=0.999, min_margin=1e-4),
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
    """Whether a chunk whose smallest passing atol is ``passing_atol`` meets ``tolerance``'s atol (a note only)."""
    return math.isfinite(max_abs_err) and passing_atol <= tolerance.atol


def separation(best_rel_err: float, runner_up_rel_err: float) -> float:
    """Best over runner-up relative error: 0 is a perfect, unambiguous match, 1 a tie (NaN-safe: inf)."""
    if not (math.isfinite(best_rel_err) and best_rel_err >= 0) or math.isnan(runner_up_rel_err):
        return math.inf
    if runner_up_rel_err <= 0:
        return 1.0  # two boundaries equal the chunk: a tie
    if math.isinf(runner_up_rel_err):
        return 0.0
    return best_rel_err / runner_up_rel_err


def identity_holds(*, rel_err: float, separation: float, tolerance: Tolerance) -> bool:
    """Whether a best candidate with this relative error and separation may be named as the chunk's source."""
    return (math.isfinite(rel_err) and rel_err <= tolerance.max_rel_err
            and math.isfinite(separation) and separation <= tolerance.max_separation)


def drift_within(p99: float, peak: float, tolerance: Tolerance) -> bool:
    """Whether per-token relative errors with this 99th percentile and maximum are within the drift limits."""
    return math.isfinite(peak) and p99 <= tolerance.drift_p99 and peak <= tolerance.drift_max


def coarser(a: str | torch.dtype, b: str | torch.dtype | None) -> str:
    """The dtype with the larger unit roundoff (``b`` None: ``a``): the side that sets a tolerance."""
    da = canonical_dtype(a)
    if b is None:
        return da
    db = canonical_dtype(b)
    return da if UNIT_ROUNDOFF[da] >= UNIT_ROUNDOFF[db] else db


def pair_tolerance(a: str | torch.dtype, b: str | torch.dtype) -> Tolerance:
    """The default :class:`Tolerance` for comparing a ``a`` tensor with a ``b`` tensor (the coarser one's)."""
    return _DEFAULTS[coarser(a, b)]


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
    values: dict[str, object] = dict(base.to_dict())
    for name, value in _as_mapping(override).items():
        if name not in _FIELDS:
            raise InputError(f"unknown tolerance field {name!r} (known: {', '.join(_FIELDS)})", field="tolerances")
        if value is not None:
            if not isinstance(value, int | float):
                raise InputError(f"must be a number, got {value!r}", field=f"tolerances.{name}")
            values[name] = float(value)
    return Tolerance(**values)  # type: ignore[arg-type]


def tolerances_from_contract(
    tolerances: Mapping[str, object] | object | None, *, dtype: str | torch.dtype,
    other: str | torch.dtype | None = None,
) -> tuple[Tolerance, dict[int | str, Tolerance]]:
    """The default tolerance and per-chunk overrides for comparing ``dtype`` with ``other`` tensors.

    The dtype that counts is the coarser of the two (:func:`coarser`; ``other`` None: ``dtype``).

    ``tolerances`` is the contract's ``tolerances`` section (model or dict: ``default``, ``per_dtype``,
    ``per_chunk``). Precedence, weakest first: :func:`default_tolerance` of ``dtype``, the contract's
    ``default``, its ``per_dtype[dtype]``, then ``per_chunk[i]`` for chunk ``i``.
    """
    section = _as_mapping(tolerances)
    name = coarser(dtype, other)
    base = merge_tolerance(default_tolerance(name), section.get("default"))
    per_dtype = _as_mapping(section.get("per_dtype"))
    base = merge_tolerance(base, per_dtype.get(name))
    overrides: dict[int | str, Tolerance] = {}
    for chunk, override in _as_mapping(section.get("per_chunk")).items():
        overrides[int(chunk)] = merge_tolerance(base, override)
    return base, overrides
