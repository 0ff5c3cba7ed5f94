"""Dtype-aware tolerances and the minimum tolerance that would have passed."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specparity.compare.tolerances import (
    Tolerance,
    canonical_dtype,
    default_tolerance,
    identity_holds,
    min_passing_atol,
    resolve_tolerance,
    within,
)
from specparity.errors import InputError


@pytest.mark.parametrize(
    ("alias", "name"),
    [("bf16", "bfloat16"), ("torch.bfloat16", "bfloat16"), (torch.bfloat16, "bfloat16"), ("fp32", "float32"),
     ("float", "float32"), ("half", "float16"), ("FP16", "float16"), ("float64", "float64")],
)
def test_dtype_aliases(alias: str | torch.dtype, name: str) -> None:
    assert canonical_dtype(alias) == name
    assert default_tolerance(alias) == default_tolerance(name)


def test_unknown_dtype_is_an_input_error() -> None:
    with pytest.raises(InputError, match="no default tolerance for dtype 'int8'"):
        default_tolerance("int8")


def test_lower_precision_is_never_stricter() -> None:
    order = ["float64", "float32", "float16", "bfloat16"]
    tols = [default_tolerance(d) for d in order]
    for tight, loose in itertools.pairwise(tols):
        assert loose.atol >= tight.atol and loose.rtol >= tight.rtol and loose.max_rel_err >= tight.max_rel_err
        assert loose.cosine_floor <= tight.cosine_floor and loose.min_margin >= tight.min_margin


def test_bf16_default_separates_the_measured_ranges() -> None:
    # domain.md §4: same-layer bf16 differences 5e-4 .. 3e-2 (must pass), wrong-layer >= 0.06 (must fail)
    tol = default_tolerance("bfloat16")
    assert 3e-2 <= tol.atol < 0.06
    # the cosine floor admits a relative error of about sqrt(2 * (1 - floor)) and no more than max_rel_err
    assert math.sqrt(2 * (1 - tol.cosine_floor)) <= tol.max_rel_err


def test_fp32_default_is_near_exact() -> None:
    tol = default_tolerance("float32")
    assert tol.atol <= 1e-5 and tol.cosine_floor >= 0.9999


def test_tolerance_validates_its_fields() -> None:
    with pytest.raises(InputError, match=r"tolerance\.atol"):
        Tolerance(atol=-1.0, rtol=0.0, cosine_floor=0.9, min_margin=0.0)
    with pytest.raises(InputError, match=r"tolerance\.cosine_floor"):
        Tolerance(atol=0.0, rtol=0.0, cosine_floor=1.5, min_margin=0.0)
    with pytest.raises(InputError, match=r"tolerance\.max_rel_err"):
        Tolerance(atol=0.0, rtol=0.0, cosine_floor=0.9, min_margin=0.0, max_rel_err=math.nan)


def test_overrides_by_chunk_win_over_by_source() -> None:
    base = default_tolerance("bf16")
    by_chunk = Tolerance(atol=1.0, rtol=0.0, cosine_floor=0.5, min_margin=0.0)
    by_source = Tolerance(atol=2.0, rtol=0.0, cosine_floor=0.5, min_margin=0.0)
    overrides: dict[int | str, Tolerance] = {1: by_chunk, "layer:3": by_source}
    assert resolve_tolerance(base, overrides, chunk=1, source="layer:3") == by_chunk
    assert resolve_tolerance(base, overrides, chunk=0, source="layer:3") == by_source
    assert resolve_tolerance(base, overrides, chunk=0, source="layer:1") == base
    assert resolve_tolerance(base, None, chunk=1, source="layer:3") == base


finite = st.floats(min_value=-100, max_value=100, allow_nan=False, width=32)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(finite, finite), min_size=1, max_size=40),
    st.sampled_from([0.0, 1.3e-6, 1e-3, 1.6e-2]),
)
def test_min_passing_atol_is_the_boundary_of_assert_close(pairs: list[tuple[float, float]], rtol: float) -> None:
    actual = torch.tensor([p[0] for p in pairs]).reshape(1, -1)
    expected = torch.tensor([p[1] for p in pairs]).reshape(1, -1)
    atol = min_passing_atol(actual, expected, rtol=rtol)
    assert atol >= 0.0
    # passes at the reported atol (plus float32 rounding slack) ...
    torch.testing.assert_close(actual, expected, atol=atol * (1 + 1e-5) + 1e-6, rtol=rtol)
    # ... and fails clearly below it, unless it is exact
    if atol > 1e-3:
        with pytest.raises(AssertionError):
            torch.testing.assert_close(actual, expected, atol=atol * 0.99, rtol=rtol)


def test_min_passing_atol_nonfinite_and_shape() -> None:
    a = torch.zeros(2, 3)
    b = a.clone()
    b[1, 2] = float("nan")
    assert min_passing_atol(a, b, rtol=0.0) == math.inf
    assert min_passing_atol(a, torch.zeros(3, 2), rtol=0.0) == math.inf
    assert min_passing_atol(a, a, rtol=0.0) == 0.0


def test_within_and_identity() -> None:
    tol = default_tolerance("bf16")
    assert within(0.01, 0.01, tol) and not within(0.1, 0.07, tol) and not within(math.inf, 0.0, tol)
    assert identity_holds(rel_err=0.01, separation=0.05, tolerance=tol)
    assert not identity_holds(rel_err=0.2, separation=0.05, tolerance=tol)  # matches nothing closely
    assert not identity_holds(rel_err=0.01, separation=0.9, tolerance=tol)  # ambiguous
    assert not identity_holds(rel_err=math.nan, separation=0.0, tolerance=tol)
    assert not identity_holds(rel_err=0.0, separation=math.inf, tolerance=tol)


def test_contract_tolerances_layer_over_the_dtype_default() -> None:
    from specparity.compare.tolerances import merge_tolerance, tolerances_from_contract

    section = {
        "default": {"atol": None, "cosine_floor": 0.99},
        "per_dtype": {"bfloat16": {"atol": 0.05}, "float32": {"atol": 1e-4}},
        "per_chunk": {"2": {"rtol": 0.1}},
    }
    base, overrides = tolerances_from_contract(section, dtype="bf16")
    bf16 = default_tolerance("bfloat16")
    assert base == dataclasses.replace(bf16, atol=0.05, cosine_floor=0.99)
    assert overrides == {2: merge_tolerance(base, {"rtol": 0.1})}
    assert tolerances_from_contract(None, dtype="float32") == (default_tolerance("float32"), {})
    with pytest.raises(InputError, match="unknown tolerance field 'atoll'"):
        merge_tolerance(base, {"atoll": 1.0})


def test_contract_model_tolerances_are_accepted() -> None:
    from specparity.compare.tolerances import tolerances_from_contract
    from specparity.contract.model import Tolerances

    model = Tolerances.model_validate({"default": {"min_margin": 0.01}, "per_chunk": {0: {"atol": 0.5}}})
    base, overrides = tolerances_from_contract(model, dtype="float16")
    assert base.min_margin == 0.01 and overrides[0].atol == 0.5 and overrides[0].min_margin == 0.01
