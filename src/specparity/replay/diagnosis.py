"""Outcome verdict: is low acceptance the wiring (served fc input) or the model (the drafter itself)?

The decisive comparison (incidents.md I0): the same drafter on (a) the recorded training fc input and
(b) the fc input SGLang really serves, both against the same target's greedy tokens.

- ``model_quality``: (a) is already low (below the contract's expectation minus a margin, or below a floor
  when the contract has none): the drafter does not reach its promise even on its own inputs. An error
  either way (``acceptance_below_contract`` / ``model_quality``): a weak drafter never passes;
- ``wiring``: (b) collapses: even the top of its 95% Wilson interval (over the scored tokens) is at least
  ``collapse`` (default 15 points) below (a) at the first draft position;
- ``inconclusive``: (b) is neither cleared nor collapsed: its interval reaches ``collapse`` below (a), so too
  few tokens were scored to tell; an error (never a pass on weak evidence) that asks for more probes;
- ``healthy``: otherwise: even the bottom of (b)'s interval is less than ``collapse`` below (a).

No pytest, no CLI: the gate renders the returned :class:`~specparity.verdict.OutcomeSummary` and findings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from specparity.compare.findings import Finding, FindingKind, Severity
from specparity.contract.model import TrainingOutcome
from specparity.replay.acceptance import AcceptanceResult, wilson_interval
from specparity.verdict import OutcomeSummary

_EPS = 1e-9  # fractions of whole rows: keep 0.70 - 0.55 on the collapsing side of 0.15

Diagnosis = Literal["healthy", "wiring", "model_quality", "inconclusive"]


@dataclass(frozen=True)
class OutcomeThresholds:
    """Where the verdict draws its lines (first draft position, fractions in 0..1)."""

    floor: float = 0.5  # first-draft acceptance a usable drafter reaches when the contract states none
    collapse: float = 0.15  # served this far below recorded = the wiring lost the drafter's inputs
    contract_margin: float = 0.10  # recorded this far below the contract's figure = below contract


def expected_from_contract(outcome: TrainingOutcome | None) -> list[float] | None:
    """The contract's per-position acceptance; for the first position only, its top-1 accuracy when no
    acceptance is recorded (under greedy verification the two coincide at the first draft)."""
    if outcome is None:
        return None
    if outcome.acceptance_per_position:
        return list(outcome.acceptance_per_position)
    if outcome.accuracy_per_position:
        return list(outcome.accuracy_per_position[:1])
    return None


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _ci(lo_hi: tuple[float, float]) -> str:
    return f"[{100 * lo_hi[0]:.1f}, {100 * lo_hi[1]:.1f}]%"


def diagnose(recorded: AcceptanceResult, served: AcceptanceResult, *, expected: Sequence[float] | None = None,
             thresholds: OutcomeThresholds | None = None, engine: str = "the engine") -> tuple[OutcomeSummary, list[Finding]]:
    """The outcome summary and its findings (``acceptance_collapse``, ``acceptance_below_contract``); ``engine``
    names the serving engine in them (its label: ``SGLang``, ``vLLM``)."""
    th = thresholds or OutcomeThresholds()
    r_pos, s_pos = recorded.per_position, served.per_position
    if not r_pos or r_pos[0] is None or not s_pos or s_pos[0] is None:
        raise ValueError("no probe row was evaluated; acceptance is undefined (empty probes?)")
    r0, s0 = r_pos[0], s_pos[0]
    r_ci = wilson_interval(recorded.accepted[0], recorded.rows)
    s_ci = wilson_interval(served.accepted[0], served.rows)
    exp0 = expected[0] if expected else None
    bar = exp0 - th.contract_margin if exp0 is not None else th.floor
    against = f"the contract's {_pct(exp0)}" if exp0 is not None else f"the floor {_pct(th.floor)}"
    numbers = {
        "recorded_first": r0, "served_first": s0, "expected_first": exp0, "bar": bar,
        "recorded_interval": r_ci, "served_interval": s_ci, "scored_tokens": served.rows,
        "recorded_acceptance_length": recorded.acceptance_length,
        "served_acceptance_length": served.acceptance_length,
        "rows": recorded.rows, "num_steps": recorded.num_steps,
    }
    recorded_low = r0 < bar - _EPS
    collapsed = r0 - s_ci[1] >= th.collapse - _EPS  # even served's optimistic end is a collapse
    cleared = r0 - s_ci[0] < th.collapse - _EPS  # even served's pessimistic end is not
    findings: list[Finding] = []
    if collapsed:
        findings.append(Finding(
            FindingKind.ACCEPTANCE_COLLAPSE, Severity.ERROR,
            f"drafter acceptance collapses on the fc input {engine} serves: first draft {_pct(s0)} {_ci(s_ci)} served "
            f"vs {_pct(r0)} {_ci(r_ci)} on the recorded training input ({100 * (s0 - r0):+.1f} points over "
            f"{served.rows} scored tokens); acceptance length {served.acceptance_length:.2f} vs "
            f"{recorded.acceptance_length:.2f}",
            details=numbers,
            fix="the served fc input differs from what the drafter was trained on; fix the layout named by "
                "the capture findings"))
    elif not cleared:
        findings.append(Finding(
            FindingKind.ACCEPTANCE_INCONCLUSIVE, Severity.ERROR,
            f"served first-draft acceptance {_pct(s0)} {_ci(s_ci)} vs {_pct(r0)} recorded: over {served.rows} scored "
            f"tokens the 95% interval neither excludes nor confirms a collapse of {_pct(th.collapse)}",
            details=numbers, fix="add probe samples (more scored assistant tokens) to the contract's probe pack"))
    if recorded_low:
        kind = FindingKind.ACCEPTANCE_BELOW_CONTRACT if exp0 is not None else FindingKind.MODEL_QUALITY
        findings.append(Finding(
            kind, Severity.ERROR,
            f"drafter acceptance is low on its own recorded training input: first draft {_pct(r0)} {_ci(r_ci)}, "
            f"below {against} (bar {_pct(bar)}); acceptance length {recorded.acceptance_length:.2f}. The wiring "
            "cannot explain this: the drafter (weights, vocab map, config) is the suspect",
            details=numbers,
            fix="check the drafter checkpoint against the one training evaluated (weights, d2t, config)"))
    elif not collapsed and s0 < bar - _EPS:
        findings.append(Finding(
            FindingKind.ACCEPTANCE_BELOW_CONTRACT, Severity.WARNING,
            f"served first-draft acceptance {_pct(s0)} {_ci(s_ci)} is below {against} (bar {_pct(bar)}) while the "
            f"recorded input gives {_pct(r0)}", details=numbers))
    diagnosis: Diagnosis = ("model_quality" if recorded_low else "wiring" if collapsed
                            else "healthy" if cleared else "inconclusive")
    summary = OutcomeSummary(
        recorded_acceptance=list(recorded.defined), served_acceptance=list(served.defined),
        recorded_acceptance_length=recorded.acceptance_length, served_acceptance_length=served.acceptance_length,
        expected_acceptance=list(expected) if expected else None, diagnosis=diagnosis,
        recorded_interval=r_ci, served_interval=s_ci, scored_tokens=served.rows)
    return summary, findings
