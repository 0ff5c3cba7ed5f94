"""Per-position acceptance (censored product-limit) and the outcome verdict."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from replay_builders import tiny_drafter

from specparity.compare.findings import FindingKind, Severity
from specparity.contract.model import TrainingOutcome
from specparity.replay.acceptance import (
    AcceptanceResult,
    ReplaySample,
    count_acceptance,
    draft_next_ids,
    greedy_from_final_norm,
    measure,
)
from specparity.replay.diagnosis import OutcomeThresholds, diagnose, expected_from_contract

V = 4  # a small vocab so that random drafts hit often enough to exercise every branch


def _seq(draw: st.DrawFn, *, follow: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    t_len = draw(st.integers(2, 14))
    n = draw(st.integers(1, 4))
    g = torch.tensor(draw(st.lists(st.integers(0, V - 1), min_size=t_len, max_size=t_len)))
    if follow:  # probe text IS the target's greedy continuation: x_{t+1} = G_t
        x = torch.cat([torch.tensor([draw(st.integers(0, V - 1))]), g[:-1]])
    else:
        x = torch.tensor(draw(st.lists(st.integers(0, V - 1), min_size=t_len, max_size=t_len)))
    drafts = torch.tensor(draw(st.lists(st.lists(st.integers(0, V - 1), min_size=n, max_size=n),
                                        min_size=t_len, max_size=t_len)))
    return x, g, drafts, n


@st.composite
def greedy_text(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    return _seq(draw, follow=True)


@st.composite
def any_text(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    return _seq(draw, follow=draw(st.booleans()))


@settings(max_examples=200, deadline=None)
@given(greedy_text())
def test_on_greedy_text_acceptance_is_the_plain_fraction(case: tuple[torch.Tensor, ...]) -> None:
    """With no censoring by text, a_j = fraction of rows whose drafts d_1..d_j all match G_{t+1..t+j}."""
    x, g, drafts, n = case  # type: ignore[misc]
    t_len = x.shape[0]
    full = torch.arange(t_len) <= t_len - 1 - n  # rows whose whole chain lies inside the sample
    res = count_acceptance(drafts, x, g, rows=full)
    rows = [t for t in range(t_len) if full[t]]
    for j in range(1, n + 1):
        if not rows:
            assert res.per_position[j - 1] is None
            continue
        want = sum(all(int(drafts[t, i - 1]) == int(g[t + i]) for i in range(1, j + 1)) for t in rows) / len(rows)
        got = res.per_position[j - 1]
        assert got is not None and got == pytest.approx(want)


@settings(max_examples=200, deadline=None)
@given(any_text())
def test_acceptance_rules_hold_for_any_text(case: tuple[torch.Tensor, ...]) -> None:
    x, g, drafts, _n = case  # type: ignore[misc]
    t_len = x.shape[0]
    res = count_acceptance(drafts, x, g)
    # the first position is exact: plain accuracy of d_1 against G_{t+1} over rows 0..T-2
    assert res.rows == t_len - 1
    assert res.accepted[0] == sum(int(drafts[t, 0]) == int(g[t + 1]) for t in range(t_len - 1))
    defined = res.defined
    assert all(0.0 <= a <= 1.0 for a in defined)
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(defined))
    assert all(b <= a for a, b in itertools.pairwise(res.at_risk))
    assert res.acceptance_length == pytest.approx(1.0 + sum(defined))
    assert all(a is None for a in res.per_position[res.horizon :])


def test_censoring_uses_only_exactly_known_rows() -> None:
    # G = target greedy per row; x_{t+1} == G_t only at t = 0 (x_1 = G_0 = 5)
    g = torch.tensor([5, 6, 7, 8])
    x = torch.tensor([1, 5, 9, 9])
    drafts = torch.tensor([[6, 7], [7, 1], [0, 0], [0, 0]])
    res = count_acceptance(drafts, x, g)
    # step 1: rows 0,1,2 evaluable; row 0 (6==G_1) and row 1 (7==G_2) hit, row 2 misses G_3=8
    assert (res.at_risk[0], res.accepted[0]) == (3, 2)
    # step 2: row 0 is exact (x_2=9 != G_1=6 -> censored!), row 1 censored too (x_3=9 != G_2=7): nobody at risk
    assert res.at_risk[1] == 0
    assert res.per_position == (pytest.approx(2 / 3), None)
    assert res.horizon == 1 and res.acceptance_length == pytest.approx(1 + 2 / 3)


def test_zero_acceptance_stays_defined_past_the_horizon() -> None:
    res = AcceptanceResult(3, (10, 0, 0), (0, 0, 0))
    assert res.per_position == (0.0, 0.0, 0.0)
    assert res.acceptance_length == 1.0


def test_next_ids_shift_like_sglang_and_greedy_from_final_norm() -> None:
    ids = torch.tensor([3, 4, 5])
    assert draft_next_ids(ids, torch.tensor([0, 0, 9])).tolist() == [4, 5, 9]
    head = torch.eye(3)
    assert greedy_from_final_norm(torch.tensor([[0.0, 2.0, 1.0], [5.0, 0.0, 0.0]]), head).tolist() == [1, 0]


def test_measure_with_first_drafts_from_elsewhere() -> None:
    d = tiny_drafter(seed=2)
    gen = torch.Generator().manual_seed(0)
    fc = torch.randn(8, d.shape.fc_in_features, generator=gen)
    ids = torch.randint(0, 40, (8,), generator=gen)
    greedy = torch.randint(0, 40, (8,), generator=gen)
    sample = ReplaySample(input_ids=ids, fc_input=fc, target_greedy=greedy)
    own = d.draft_chain(fc, draft_next_ids(ids, greedy), num_steps=2)
    forced = greedy.roll(-1)  # d_1 = G_{t+1} on every row: a perfect first draft
    res = measure(d, [sample], num_steps=2, first_drafts=[forced])
    assert res.per_position[0] == pytest.approx(1.0)
    assert measure(d, [sample], num_steps=2).accepted[0] == int((own[:-1, 0] == greedy[1:]).sum())


def _res(first: float, rows: int = 100) -> AcceptanceResult:
    hits = round(first * rows)
    return AcceptanceResult(2, (rows, hits), (hits, hits // 2))


def _wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:  # two-sided 95%
    """Textbook Wilson score interval (restated here, not imported from the code under test)."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = (z / (1 + z * z / n)) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def test_wilson_interval_matches_the_textbook_values() -> None:
    from specparity.replay.acceptance import wilson_interval

    # 81 of 263 (Newcombe 1998, example 1 rounded): [0.2553, 0.3662]; 0 of 10: [0, 0.2775]
    assert wilson_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


B, M, C, INC = (FindingKind.ACCEPTANCE_BELOW_CONTRACT, FindingKind.MODEL_QUALITY, FindingKind.ACCEPTANCE_COLLAPSE,
              FindingKind.ACCEPTANCE_INCONCLUSIVE)


@pytest.mark.parametrize(("rec", "srv", "expected", "rows", "diag", "kinds"), [
    (0.70, 0.69, None, 100, "healthy", []),
    (0.70, 0.19, None, 100, "wiring", [C]),
    (0.70, 0.19, [0.72, 0.5], 100, "wiring", [C]),
    # no expectation in the contract: below the floor on its own inputs is an error, not a warning
    (0.10, 0.09, None, 100, "model_quality", [M]),
    (0.45, 0.44, None, 100, "model_quality", [M]),
    (0.55, 0.54, [0.80], 100, "model_quality", [B]),
    # 12 points down: over 2000 tokens that cannot be a 15-point collapse; over 100 it could be
    (0.70, 0.58, [0.72], 2000, "healthy", [B]),
    (0.70, 0.58, [0.72], 100, "inconclusive", [INC, B]),
    # weak evidence: 20 tokens neither confirm a 20-point drop nor clear a 10-point one
    (0.70, 0.50, None, 20, "inconclusive", [INC]),
    (0.70, 0.60, None, 20, "inconclusive", [INC]),
])
def test_verdict_table(rec: float, srv: float, expected: list[float] | None, rows: int, diag: str,
                       kinds: list[FindingKind]) -> None:
    summary, findings = diagnose(_res(rec, rows), _res(srv, rows), expected=expected)
    assert summary.diagnosis == diag
    assert [f.kind for f in findings] == kinds
    assert summary.recorded_acceptance[0] == pytest.approx(rec)
    assert summary.served_acceptance[0] == pytest.approx(srv)
    assert summary.scored_tokens == rows
    assert summary.served_interval == pytest.approx(_wilson(round(srv * rows), rows))
    for f in findings:
        assert f"{100 * srv:.1f}%" in f.message or f"{100 * rec:.1f}%" in f.message
    severities = {f.kind: f.severity for f in findings}
    for kind in (C, M, INC):
        if kind in severities:
            assert severities[kind] is Severity.ERROR
    if diag == "model_quality":
        assert severities[B if expected else M] is Severity.ERROR


@settings(max_examples=300, deadline=None)
@given(rec=st.integers(0, 100), srv=st.integers(0, 100), exp=st.one_of(st.none(), st.integers(10, 100)),
       rows=st.sampled_from([20, 100, 1000]))
def test_verdict_rule_for_all_inputs(rec: int, srv: int, exp: int | None, rows: int) -> None:
    th = OutcomeThresholds()
    expected = None if exp is None else [exp / 100]
    summary, findings = diagnose(_res(rec / 100, rows), _res(srv / 100, rows), expected=expected, thresholds=th)
    r0, s0 = round(rec / 100 * rows) / rows, round(srv / 100 * rows) / rows
    lo, hi = _wilson(round(srv / 100 * rows), rows)
    bar = th.floor if expected is None else expected[0] - th.contract_margin
    low = r0 < bar - 1e-9
    collapsed = r0 - hi >= th.collapse - 1e-9
    cleared = r0 - lo < th.collapse - 1e-9
    assert summary.diagnosis == ("model_quality" if low else "wiring" if collapsed else
                                 "healthy" if cleared else "inconclusive")
    kinds = [f.kind for f in findings]
    assert (C in kinds) == collapsed and (INC in kinds) == (not collapsed and not cleared)
    # the outcome never passes on weak evidence: healthy only when the interval clears a collapse
    errors = [f for f in findings if f.severity is Severity.ERROR]
    assert (summary.diagnosis == "healthy") == (not errors)
    assert s0 == pytest.approx(summary.served_acceptance[0])


def test_expected_from_contract() -> None:
    assert expected_from_contract(None) is None
    assert expected_from_contract(TrainingOutcome(acceptance_per_position=[0.7, 0.5])) == [0.7, 0.5]
    assert expected_from_contract(TrainingOutcome(accuracy_per_position=[0.8, 0.6])) == [0.8]
    assert expected_from_contract(TrainingOutcome(expected_acceptance_length=2.1)) is None


def test_no_rows_is_an_error_not_a_pass() -> None:
    with pytest.raises(ValueError, match="no probe row"):
        diagnose(AcceptanceResult(1, (0,), (0,)), AcceptanceResult(1, (0,), (0,)))


def test_rows_follow_the_loss_mask_of_the_next_token() -> None:
    from specparity.replay.acceptance import rows_from_loss_mask

    rows = rows_from_loss_mask(torch.tensor([0, 0, 1, 1, 0, 0]))  # prompt, 2 assistant tokens, padding
    assert rows is not None and rows.tolist() == [False, True, True, False, False, False]
    assert rows_from_loss_mask(None) is None
    assert rows_from_loss_mask(torch.zeros(5, dtype=torch.int64)) is None


def test_reports_carry_the_interval_and_the_scored_tokens() -> None:
    from specparity.report.terminal import outcome_lines

    summary, _ = diagnose(_res(0.8, 250), _res(0.8, 250))
    d = summary.to_dict()
    assert d["scored_tokens"] == 250
    assert d["served_interval"] == pytest.approx(list(_wilson(200, 250)))
    assert d["recorded_interval"] == d["served_interval"]
    line = outcome_lines(summary)[-1]
    lo, hi = _wilson(200, 250)
    assert "250 scored tokens" in line and f"served [{lo:.3f}, {hi:.3f}]" in line
