"""The outcome level: drafter acceptance on recorded vs served fc inputs, and what it says.

A consumer of the engine's evidence, like compare/: :func:`check_outcome` takes the
:class:`~specparity.serving.results.CaptureResult` of the gate's one engine run (asked for with an
:class:`~specparity.serving.results.OutcomeRequest`) and never starts an engine itself.
:func:`outcome_from_capture` replays the training-side drafter on both sides:

- side (a) *recorded*: the probe pack's recorded fc rows, against the target's greedy tokens from the
  recorded ``final_norm`` (the atlas's when the pack has none);
- side (b) *served*: the fc rows the engine really fed the drafter, against the greedy tokens from the atlas's
  ``final_norm`` (the pack's when there is no atlas).

The engine's own figures decide whether the outcome may pass (never on the training-side
replay alone): its drafter's first drafts on both inputs (``CaptureResult.replay``; they then drive the first
draft position, and ``engine_agreement`` reports how often both implementations drafted the same token, 1.0 in
fp32) and/or the acceptance its real serving loop counted (``CaptureResult.acceptance``, per position with
95% Wilson intervals). Later positions of the replay always continue on the training side, because an
engine's draft-decode path may have no CPU kernels (SGLang: sglang-cpu.md §5 item 6).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specparity.compare.findings import Finding, FindingKind, Severity
from specparity.contract.model import Contract
from specparity.contract.probes import ProbePack
from specparity.errors import InputError
from specparity.replay.acceptance import (
    AcceptanceResult,
    ReplaySample,
    draft_next_ids,
    greedy_from_final_norm,
    measure,
    rows_from_loss_mask,
    wilson_interval,
)
from specparity.replay.checkpoint import read_target_lm_head
from specparity.replay.diagnosis import OutcomeThresholds, diagnose, expected_from_contract
from specparity.replay.drafter import Eagle3Drafter
from specparity.serving.results import NONFINITE, CaptureResult, DrafterReplay, LoopAcceptance, ServingFailure
from specparity.sources import FINAL_NORM
from specparity.verdict import OutcomeSummary

DEFAULT_NUM_STEPS = 3  # when neither the contract nor the deployment names speculative_num_steps


@dataclass(frozen=True)
class OutcomeReport:
    """What the outcome level found: the summary for the verdict, findings, and the raw counts."""

    summary: OutcomeSummary
    findings: list[Finding]
    recorded: AcceptanceResult
    served: AcceptanceResult
    num_steps: int
    first_draft_source: str  # "engine" (the engine's own drafter) or "training_side"
    engine_agreement: dict[str, float] | None  # side -> fraction of rows where the engine's d_1 == training side's

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary.to_dict(), "findings": [f.to_dict() for f in self.findings],
                "recorded": self.recorded.to_dict(), "served": self.served.to_dict(), "num_steps": self.num_steps,
                "first_draft_source": self.first_draft_source, "engine_agreement": self.engine_agreement}


@dataclass(frozen=True)
class OutcomeCheck:
    """What the outcome level made of one engine run: the summary for the verdict (None when the training-side
    replay could not run), every finding, and the report with the raw counts."""

    summary: OutcomeSummary | None
    findings: tuple[Finding, ...]
    report: OutcomeReport | None = None


def _greedy(final_norm: torch.Tensor | None, fallback: torch.Tensor | None, lm_head: torch.Tensor) -> torch.Tensor:
    source = final_norm if final_norm is not None else fallback
    if source is None:
        raise ValueError("neither the probe pack nor the atlas holds final_norm; the target's greedy tokens are unknown")
    return greedy_from_final_norm(source, lm_head)


def _agreement(drafter: Eagle3Drafter, samples: Sequence[ReplaySample], engine: Sequence[torch.Tensor]) -> float:
    same = total = 0
    for s, ids in zip(samples, engine, strict=True):
        own = drafter.to_target(drafter.extend(s.fc_input, draft_next_ids(s.input_ids, s.target_greedy))
                                .logits.argmax(dim=-1))
        same += int((own == ids).sum())
        total += int(own.shape[0])
    return same / total if total else 0.0


def outcome_from_capture(
    *, drafter: Eagle3Drafter, target_lm_head: torch.Tensor, probes: ProbePack, capture: CaptureResult,
    engine_replay: DrafterReplay | None, num_steps: int, expected: Sequence[float] | None = None,
    thresholds: OutcomeThresholds | None = None, engine: str = "the engine",
) -> OutcomeReport:
    """Acceptance on both sides and the verdict; raises ValueError when the capture has no fc input.

    ``engine_replay`` (the engine's own drafter on both inputs) gives the first draft position when present;
    ``engine`` names the serving engine in the findings."""
    if capture.fc is None:
        raise ValueError("the capture holds no fc input; the outcome level needs a successful capture")
    width = drafter.shape.fc_in_features
    bad = [i for i, f in enumerate(capture.fc.per_sample) if int(f.shape[-1]) != width]
    if bad:
        raise ValueError(f"the engine fed fc {int(capture.fc.per_sample[bad[0]].shape[-1])}-wide rows; the "
                         f"drafter's fc takes {width}")
    atlas = capture.atlas.per_sample if capture.atlas is not None else [{} for _ in probes.samples]
    recorded: list[ReplaySample] = []
    served: list[ReplaySample] = []
    for i, p in enumerate(probes.samples):
        ids = p.input_ids.to(torch.int64)
        atlas_norm = atlas[i].get(FINAL_NORM)
        rows = rows_from_loss_mask(p.loss_mask)
        recorded.append(ReplaySample(ids, p.fc_input, _greedy(p.final_norm, atlas_norm, target_lm_head), rows))
        served.append(ReplaySample(ids, capture.fc.per_sample[i], _greedy(atlas_norm, p.final_norm, target_lm_head),
                                   rows))
    firsts = {"recorded": None, "served": None} if engine_replay is None else {
        "recorded": engine_replay.first_drafts("recorded"), "served": engine_replay.first_drafts("served")}
    agreement = None
    if engine_replay is not None:
        agreement = {"recorded": _agreement(drafter, recorded, engine_replay.first_drafts("recorded")),
                     "served": _agreement(drafter, served, engine_replay.first_drafts("served"))}
    rec = measure(drafter, recorded, num_steps=num_steps, first_drafts=firsts["recorded"])
    srv = measure(drafter, served, num_steps=num_steps, first_drafts=firsts["served"])
    summary, findings = diagnose(rec, srv, expected=expected, thresholds=thresholds, engine=engine)
    return OutcomeReport(summary=summary, findings=findings, recorded=rec, served=srv, num_steps=num_steps,
                         first_draft_source="engine" if engine_replay is not None else "training_side",
                         engine_agreement=agreement)


def loop_summary(acceptance: LoopAcceptance | None) -> dict[str, Any] | None:
    """Per-position acceptance of the engine's own serving loop, with 95% Wilson intervals.

    ``accepted_per_position[j] / drafts`` is the rate at which draft position ``j`` was accepted; the acceptance
    length is ``1 + accepted / drafts`` (the bonus token included). None when the engine reported no drafts.
    """
    if acceptance is None or acceptance.drafts <= 0 or not acceptance.accepted_per_position:
        return None
    drafts = acceptance.drafts
    return {
        "engine": acceptance.engine, "drafts": drafts, "draft_tokens": acceptance.draft_tokens,
        "per_position": [a / drafts for a in acceptance.accepted_per_position],
        "intervals": [list(wilson_interval(a, drafts)) for a in acceptance.accepted_per_position],
        "acceptance_length": 1.0 + acceptance.accepted / drafts,
        "tensor_parallel_size": acceptance.tensor_parallel_size,
        "prompts": acceptance.prompts,  # "assistant_start": the probes' prompts; else after the probe
    }


def _error(message: str, kind: FindingKind = FindingKind.ENGINE_ERROR) -> Finding:
    return Finding(kind, Severity.ERROR, message, details={"check": "outcome"})


def _engine_figures(capture: CaptureResult, engine: str) -> tuple[DrafterReplay | None, list[Finding]]:
    """The engine's own drafter replay (when it ran), and an error for every way the engine's own figures are
    missing: the outcome never passes on the training-side replay alone."""
    replay = capture.replay
    if isinstance(replay, DrafterReplay):
        return replay, []
    if isinstance(replay, ServingFailure):
        if replay.kind == NONFINITE:  # NaN/Inf logits of the engine's own drafter are a failure of the deployment
            return None, [_error(replay.message, FindingKind.NONFINITE)]
        if capture.acceptance is None:
            return None, [_error(f"{engine} drafter replay unavailable, so the outcome cannot pass on the "
                                 f"training-side replay alone: {replay.message}")]
    if capture.acceptance is None:
        return None, [_error(f"{engine} reported no acceptance of its own (no drafter replay, and its serving loop "
                             "reported no speculative drafts), so there is no real acceptance to judge and the "
                             "outcome cannot pass on the training-side replay alone")]
    return None, []


def _server_judgement(capture: CaptureResult, report: OutcomeReport, expected: Sequence[float] | None, *,
                      capture_matches: bool, engine: str) -> tuple[dict[str, Any] | None, list[Finding]]:
    """A live server's own acceptance against the contract's band (replay/server_acceptance.py); (None, []) where the
    figures are not a server's (the in-process loops are judged by the replay)."""
    from specparity.replay.server_acceptance import judge

    loop = capture.loop or {}
    if loop.get("source") != "server_metrics":
        return None, []
    acc = capture.acceptance
    if acc is None:  # no drafts at all: _engine_figures already names it (exit 3), once is enough
        return {"state": "unmeasured", "source": loop.get("acceptance_source"), "drafts": 0}, []
    figures = {**(loop_summary(acc) or {}), "drafts": acc.drafts,
               "accepted_per_position": list(acc.accepted_per_position),
               "source": loop.get("acceptance_source"), "other_requests": loop.get("other_requests")}
    reference, reference_from = (expected, "contract") if expected else (report.recorded.defined, "replay")
    return judge(figures, reference=reference, reference_from=reference_from, capture_matches=capture_matches,
                 replay_diagnosis=report.summary.diagnosis, engine=engine)


def check_outcome(
    contract: Contract, probes: ProbePack, capture: CaptureResult, *, target: str | Path, draft: str | Path,
    engine: str = "the engine", num_steps: int | None = None, thresholds: OutcomeThresholds | None = None,
    capture_matches: bool = True,
) -> OutcomeCheck:
    """The outcome of one engine run: the training-side drafter on recorded vs served inputs, held against the
    engine's own figures (module docstring). Never raises for the deployment: what could not be judged is an
    error finding, never a pass.

    ``engine`` names the engine in messages (the adapter's label). ``num_steps``: the chain length; default the
    contract's ``serving.num_steps``, else the deployment's resolved one, else 3. A capture without fc input
    gives no outcome and no finding (the capture's own failures say why). On a live server its own acceptance is
    judged beside the replay (:func:`_server_judgement`); ``capture_matches`` says whether the capture found the
    contract's layout, which decides what a collapse of the server's figure means.
    """
    if capture.fc is None:
        return OutcomeCheck(None, ())
    dep = capture.deployment
    engine_replay, findings = _engine_figures(capture, engine)
    try:
        drafter = Eagle3Drafter.load(draft, target_dir=target)
        lm_head = read_target_lm_head(target)
    except InputError as e:  # a limit of specparity's own replay, named as ours: never the engine's
        return OutcomeCheck(None, (*findings, Finding(
            FindingKind.ENGINE_ERROR, Severity.ERROR,
            f"specparity's training-side replay cannot run this drafter, so wiring cannot be told from model quality "
            f"(a limit of specparity, not of {engine} or the deployment): {e}",
            details={"check": "outcome", "cause": "specparity", "limit": "training-side replay"},
            fix="--level capture checks the fc input without the replay; for the outcome level, give the replay what "
                "it reads (the draft's and the target's weights as safetensors)")))
    steps = (num_steps or contract.serving.num_steps or (dep.resolved_spec.num_steps if dep else None)
             or DEFAULT_NUM_STEPS)
    try:
        report = outcome_from_capture(
            drafter=drafter, target_lm_head=lm_head, probes=probes, capture=capture, engine_replay=engine_replay,
            num_steps=steps, expected=expected_from_contract(contract.training_outcome), thresholds=thresholds,
            engine=engine)
    except ValueError as e:
        return OutcomeCheck(None, (*findings, _error(f"the outcome level cannot replay these inputs: {e}")))
    expected = expected_from_contract(contract.training_outcome)
    judged, server_findings = _server_judgement(capture, report, expected, capture_matches=capture_matches,
                                                engine=engine)
    engine_loop = loop_summary(capture.acceptance)
    if judged is not None:
        engine_loop = {**(engine_loop or {}), "server_acceptance": judged}
    summary = dataclasses.replace(report.summary, engine_loop=engine_loop)
    return OutcomeCheck(summary, (*report.findings, *findings, *server_findings), report)


def recorded_acceptance(probes: ProbePack, *, draft: str | Path, target: str | Path, num_steps: int) -> AcceptanceResult:
    """Acceptance on the recorded fc inputs alone (no engine): the training-time expectation a contract carries.

    The same rows, greedy tokens and chain as side (a) of :func:`outcome_from_capture`, so the figure
    the gate later compares against is measured the same way.
    """
    drafter = Eagle3Drafter.load(draft, target_dir=target)
    lm_head = read_target_lm_head(target)
    samples = []
    for i, p in enumerate(probes.samples):
        if p.final_norm is None:
            raise InputError("the probe pack holds no final_norm; acceptance needs the target's greedy tokens",
                             field=f"sample_{i}.final_norm")
        samples.append(ReplaySample(p.input_ids.to(torch.int64), p.fc_input, greedy_from_final_norm(p.final_norm, lm_head),
                                    rows_from_loss_mask(p.loss_mask)))
    return measure(drafter, samples, num_steps=num_steps)
