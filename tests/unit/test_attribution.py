"""Attribution: every chunk, served and recorded, named by the atlas boundary it carries."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specparity.compare.attribution import attribute
from specparity.compare.diagnosis import DeploymentFacts, ExpectedFacts, diagnose
from specparity.compare.findings import FindingKind, Severity
from specparity.compare.synthetic import bf16_noise, concat_sources, residual_stream
from specparity.compare.tolerances import default_tolerance
from specparity.errors import InputError
from specparity.sources import all_sources

FP32 = default_tolerance("float32")
BF16 = default_tolerance("bfloat16")
H = 48


@st.composite
def layouts(draw: st.DrawFn) -> tuple[int, int, list[str]]:
    num_layers = draw(st.integers(min_value=3, max_value=9))
    seed = draw(st.integers(min_value=0, max_value=2**16))
    names = all_sources(num_layers)
    k = draw(st.integers(min_value=1, max_value=4))
    sources = draw(st.lists(st.sampled_from(names), min_size=k, max_size=k, unique=True))  # any order
    return num_layers, seed, sources


@settings(max_examples=40, deadline=None)
@given(layouts())
def test_any_sources_in_any_order_are_recovered_exactly_fp32(layout: tuple[int, int, list[str]]) -> None:
    num_layers, seed, sources = layout
    states = residual_stream(num_layers, H, tokens=12, seed=seed)
    fc_input = concat_sources(states, sources)
    table = attribute([fc_input], [fc_input.clone()], [states], expected=sources, tolerance=FP32)
    assert table.served_sources() == sources
    assert table.recorded_sources() == sources
    for c in table.served:
        assert c.max_abs_err == 0.0 and c.rel_err == 0.0 and c.cosine == pytest.approx(1.0, abs=1e-6)
        assert c.margin >= FP32.min_margin
    exp = ExpectedFacts(name="t", sources=tuple(sources), hidden_size=H)
    assert diagnose(exp, DeploymentFacts(), table=table, tolerance=FP32) == []


@settings(max_examples=40, deadline=None)
@given(layouts())
def test_bf16_rounding_noise_still_exact_with_at_most_numeric_drift(layout: tuple[int, int, list[str]]) -> None:
    num_layers, seed, sources = layout
    # the serving target runs in bf16; training recorded the same states through other kernels
    atlas = {k: v.to(torch.bfloat16) for k, v in residual_stream(num_layers, H, tokens=12, seed=seed).items()}
    exact = concat_sources(atlas, sources)
    # served and recorded each carry their own kernel jitter against the atlas
    served = bf16_noise(exact, seed=seed + 1)
    recorded = bf16_noise(exact, seed=seed + 2)
    assert not torch.equal(served, recorded) and not torch.equal(served, exact)
    table = attribute([served], [recorded], [atlas], expected=sources, tolerance=BF16)
    assert table.served_sources() == sources
    assert table.recorded_sources() == sources
    exp = ExpectedFacts(name="t", sources=tuple(sources), hidden_size=H)
    findings = diagnose(exp, DeploymentFacts(), table=table, tolerance=BF16)
    assert {f.kind for f in findings} <= {FindingKind.NUMERIC_DRIFT}
    assert all(f.severity is Severity.INFO for f in findings)


def test_neighbouring_layers_are_correlated_like_real_ones() -> None:
    states = residual_stream(8, H, tokens=32, seed=3)
    cos = torch.nn.functional.cosine_similarity(states["layer:3"], states["layer:4"], dim=-1).mean()
    assert 0.85 < float(cos) < 0.999


def test_wrong_layers_are_named_and_match_nothing_else() -> None:
    states = residual_stream(8, H, tokens=16, seed=5)
    expected = ["layer:1", "layer:3", "layer:5"]
    served = concat_sources(states, ["embedding", "layer:1", "layer:3"])
    table = attribute([served], [concat_sources(states, expected)], [states], expected=expected, tolerance=FP32)
    assert table.served_sources() == ["embedding", "layer:1", "layer:3"]
    chunk0 = table.served[0]
    assert chunk0.expected == "layer:1" and chunk0.runner_up == "layer:0"
    # vs the recorded layer:1 chunk the embedding differs by far more than any tolerance
    assert chunk0.max_abs_err > 0.5 and chunk0.min_passing_atol > 0.5
    assert chunk0.expected_cosine < 0.99 and chunk0.expected_rel_err > 0.1


def test_pad_positions_are_excluded_by_the_mask() -> None:
    states = residual_stream(6, H, tokens=20, seed=7)
    sources = ["layer:0", "layer:2"]
    served = concat_sources(states, sources)
    recorded = served.clone()
    recorded[15:] = torch.randn(5, recorded.shape[1])  # pad rows: garbage, loss_mask 0
    mask = torch.ones(20, dtype=torch.bool)
    mask[15:] = False
    masked = attribute([served], [recorded], [states], expected=sources, tolerance=FP32, masks=[mask])
    assert masked.recorded_sources() == sources
    assert masked.valid_tokens == 15
    assert all(c.max_abs_err == 0.0 for c in masked.served)
    unmasked = attribute([served], [recorded], [states], expected=sources, tolerance=FP32)
    assert unmasked.recorded_sources() == [None, None]
    assert all(c.max_abs_err > 0.1 for c in unmasked.served)


def test_samples_of_different_lengths_are_pooled() -> None:
    samples = [residual_stream(5, H, tokens=t, seed=s) for t, s in ((7, 1), (13, 2), (4, 3))]
    sources = ["embedding", "layer:3"]
    fc = [concat_sources(s, sources) for s in samples]
    table = attribute(fc, [f.clone() for f in fc], samples, expected=sources, tolerance=FP32)
    assert table.samples == 3 and table.valid_tokens == 24
    assert table.served_sources() == sources


def test_identical_boundaries_are_ambiguous_not_guessed() -> None:
    states = residual_stream(6, H, tokens=16, seed=11)
    states["layer:3"] = states["layer:2"].clone()  # a layer that changed nothing
    sources = ["layer:2"]
    fc = concat_sources(states, sources)
    table = attribute([fc], [fc], [states], expected=sources, tolerance=FP32)
    chunk = table.served[0]
    assert chunk.attributed is None
    assert chunk.best in ("layer:2", "layer:3") and chunk.separation > FP32.max_separation


def test_a_rescaled_chunk_is_not_attributed_despite_cosine_one() -> None:
    states = residual_stream(6, H, tokens=16, seed=13)
    fc = concat_sources(states, ["layer:1"])
    table = attribute([2.0 * fc], [fc], [states], expected=["layer:1"], tolerance=FP32)
    chunk = table.served[0]
    assert chunk.expected_cosine == pytest.approx(1.0, abs=1e-6)
    assert chunk.expected_rel_err == pytest.approx(1.0, rel=1e-3)
    assert chunk.attributed is None


def test_nonfinite_token_is_counted_and_excluded() -> None:
    states = residual_stream(6, H, tokens=16, seed=17)
    sources = ["layer:1", "layer:4"]
    fc = concat_sources(states, sources)
    served = fc.clone()
    served[3, 5] = float("nan")
    table = attribute([served], [fc], [states], expected=sources, tolerance=FP32)
    assert table.served_sources() == sources  # the other 15 tokens still attribute
    assert table.evidence[0].nonfinite_served == 1 and table.evidence[1].nonfinite_served == 0
    assert math.isinf(table.served[0].max_abs_err) or math.isnan(table.served[0].max_abs_err)


def test_heatmap_and_json() -> None:
    states = residual_stream(4, H, tokens=8, seed=19)
    sources = ["layer:0", "layer:2"]
    fc = concat_sources(states, sources)
    table = attribute([fc], [fc], [states], expected=sources, tolerance=FP32)
    rows, cols, values = table.heatmap()
    assert rows == ["served 0", "served 1", "recorded 0", "recorded 1"]
    assert cols == all_sources(4)
    assert len(values) == 4 and all(len(r) == len(cols) for r in values)
    assert values[0][cols.index("layer:0")] == pytest.approx(1.0, abs=1e-6)
    json.dumps(table.to_dict())


def test_block_size_does_not_change_the_result() -> None:
    states = residual_stream(5, H, tokens=19, seed=23)
    sources = ["layer:1", "layer:3"]
    fc = bf16_noise(concat_sources(states, sources), seed=1).float()
    a = attribute([fc], [fc], [states], expected=sources, tolerance=BF16, block_tokens=1)
    b = attribute([fc], [fc], [states], expected=sources, tolerance=BF16, block_tokens=64)
    assert a.served_sources() == b.served_sources() == sources
    for ra, rb in zip(a.served_cosine, b.served_cosine, strict=True):
        assert ra == pytest.approx(rb, abs=1e-6)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("empty", "no valid token"),
        ("all_masked", "no valid token"),
        ("width", "not a multiple"),
        ("tokens", "tokens"),
        ("names", "not canonical"),
        ("expected", "names 2 sources"),
    ],
)
def test_bad_input_is_an_input_error(case: str, message: str) -> None:
    states = residual_stream(4, H, tokens=6, seed=29)
    sources = ["layer:0", "layer:1", "layer:2"]
    fc = concat_sources(states, sources)
    served, recorded, atlas, masks, expected = fc, fc, dict(states), None, sources
    if case == "empty":
        served = recorded = fc[:0]
        atlas = {k: v[:0] for k, v in states.items()}
    elif case == "all_masked":
        masks = [torch.zeros(6, dtype=torch.bool)]
    elif case == "width":
        served = fc[:, :-1]
    elif case == "tokens":
        recorded = fc[:5]
    elif case == "names":
        atlas["hs[3]"] = states["layer:2"]
    elif case == "expected":
        expected = sources[:2]
    with pytest.raises(InputError, match=message):
        attribute([served], [recorded], [atlas], expected=expected, tolerance=FP32, masks=masks)
