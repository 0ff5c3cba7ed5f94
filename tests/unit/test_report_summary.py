"""The demos' summary table (report/summary.py): one row per gate run, built from hand-made Verdicts."""

from __future__ import annotations

import io

from specparity.compare.findings import Finding, FindingKind, Severity
from specparity.report.summary import SummaryRow, print_summary, verdict_row
from specparity.verdict import OutcomeSummary, Verdict

EXPECTED = ("layer:1", "layer:3", "layer:5")


def verdict(status: str, *kinds: FindingKind, loop: list[float] | None = None) -> Verdict:
    served = [0.805, 0.05] if status == "pass" else [0.351, 0.05]
    outcome = OutcomeSummary(recorded_acceptance=[0.805, 0.05], served_acceptance=served,
                             recorded_acceptance_length=1.87, served_acceptance_length=1.4, expected_acceptance=None,
                             diagnosis="healthy" if status == "pass" else "wiring",
                             engine_loop={"engine": "vllm", "per_position": loop} if loop else None)
    return Verdict(contract_name="tiny-llama-eagle3", contract_hash=None, level="all", status=status,  # type: ignore[arg-type]
                   engine_version="0.5.23", target_architecture="LlamaForCausalLM", draft_path="d",
                   expected_layout=EXPECTED, served_layout=EXPECTED, outcome=outcome,
                   findings=tuple(Finding(k, Severity.ERROR, "m") for k in kinds))


def test_a_row_names_the_expected_finding_first_and_counts_the_rest() -> None:
    v = verdict("fail", FindingKind.MISSING_SOURCE, FindingKind.EXTRA_EMBEDDING, FindingKind.ACCEPTANCE_COLLAPSE)
    row = verdict_row("seed", v, expect_status="fail", expect_kinds=("extra_embedding",), tok_s=21.8)
    assert row == SummaryRow(scenario="seed", expected="FAIL: extra_embedding", verdict="FAIL", exit_code=1,
                             finding="extra_embedding (+2 more)", acceptance="80.5% / 35.1%", cause="wiring",
                             tok_s=21.8, as_expected=True)


def test_a_row_that_misses_its_finding_is_not_as_expected() -> None:
    row = verdict_row("late", verdict("fail", FindingKind.MISSING_SOURCE), expect_status="fail",
                      expect_kinds=("off_by_one",))
    assert (row.finding, row.as_expected) == ("missing_source", False)
    assert verdict_row("ok", verdict("pass"), expect_status="fail").as_expected is False


def test_the_table_golden_plain() -> None:
    rows = [verdict_row("healthy", verdict("pass", loop=[0.5, 0.29]), expect_status="pass", tok_s=30.8),
            verdict_row("the seed's wiring", verdict("fail", FindingKind.EXTRA_EMBEDDING, loop=[0.2, 0.09]),
                        expect_status="fail", expect_kinds=("extra_embedding",), tok_s=21.8),
            SummaryRow(scenario="no speculation", tok_s=19.6)]
    out = io.StringIO()
    print_summary(rows, title="demo", stream=out)
    assert out.getvalue().splitlines() == [
        "demo",
        "┏━━━┳━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━┳━━━━━━┳━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━┳"
        "━━━━━━━━━━━━━━┳━━━━━━━━━┳━━━━━━━┳━━━━━━━━━━┓",
        "┃   ┃                   ┃                       ┃         ┃      ┃                 ┃ acceptance        ┃"
        " engine loop  ┃         ┃       ┃ as       ┃",
        "┃ # ┃ scenario          ┃ expected              ┃ verdict ┃ exit ┃ finding         ┃ recorded / served ┃"
        " per position ┃ cause   ┃ tok/s ┃ expected ┃",
        "┡━━━╇━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━╇━━━━━━╇━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━╇"
        "━━━━━━━━━━━━━━╇━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━┩",
        "│ 1 │ healthy           │ PASS                  │ PASS    │    0 │ -               │ 80.5% / 80.5%     │"
        " 50% 29%      │ healthy │  30.8 │ yes      │",
        "│ 2 │ the seed's wiring │ FAIL: extra_embedding │ FAIL    │    1 │ extra_embedding │ 80.5% / 35.1%     │"
        " 20% 9%       │ wiring  │  21.8 │ yes      │",
        "│ 3 │ no speculation    │ -                     │ -       │    - │ -               │ -                 │"
        " -            │ -       │  19.6 │ -        │",
        "└───┴───────────────────┴───────────────────────┴─────────┴──────┴─────────────────┴───────────────────┴"
        "──────────────┴─────────┴───────┴──────────┘",
        "cause: wiring = the engine feeds fc other inputs than training recorded (the serving path, not the model); "
        "model = the drafter accepts little even on its recorded inputs (the model, not the wiring)",
    ]


def test_columns_nobody_measured_are_left_out() -> None:
    out = io.StringIO()
    print_summary([verdict_row("healthy", verdict("pass"), expect_status="pass")], title="demo", stream=out)
    assert "tok/s" not in out.getvalue() and "engine loop" not in out.getvalue()
    assert "80.5% / 80.5%" in out.getvalue()


def test_the_cause_column_says_wiring_or_model_and_a_healthy_table_needs_no_legend() -> None:
    import dataclasses

    model = verdict("fail", FindingKind.ACCEPTANCE_COLLAPSE)
    assert model.outcome is not None
    model = dataclasses.replace(model, outcome=dataclasses.replace(model.outcome, diagnosis="model_quality"))
    assert verdict_row("weak drafter", model, expect_status="fail").cause == "model"
    assert verdict_row("seed", verdict("fail"), expect_status="fail").cause == "wiring"
    out = io.StringIO()
    print_summary([verdict_row("healthy", verdict("pass"), expect_status="pass")], title="demo", stream=out)
    row = out.getvalue().splitlines()[5]
    assert row.split("│")[-3].strip() == "healthy" and "cause:" not in out.getvalue()


def test_a_live_servers_own_acceptance_shows_its_band() -> None:
    import dataclasses

    v = verdict("fail", FindingKind.EXTRA_EMBEDDING, loop=[0.2, 0.09])
    assert v.outcome is not None and v.outcome.engine_loop is not None
    judged = {"state": "below", "floor": [0.36, 0.22], "reference": [0.6, 0.37], "reference_from": "contract"}
    v = dataclasses.replace(v, outcome=dataclasses.replace(
        v.outcome, engine_loop={**v.outcome.engine_loop, "server_acceptance": judged}))
    row = verdict_row("the seed's wiring", v, expect_status="fail")
    assert row.engine_loop == "20% 9% (below: floor 36% of the contract's 60%)"
