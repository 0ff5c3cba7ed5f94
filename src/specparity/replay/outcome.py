"""The outcome level: drafter acceptance on recorded vs served fc inputs, and what it says.

:func:`check_outcome` runs one SGLang child (capture + replay, :mod:`specparity.replay.served`) and
:func:`outcome_from_capture` turns its results into an :class:`OutcomeReport`:

- side (a) *recorded*: the probe pack's recorded fc rows, against the target's greedy tokens from the
  recorded ``final_norm`` (the atlas's when the pack has none);
- side (b) *served*: the fc rows SGLang really fed the drafter, against the greedy tokens from the atlas's
  ``final_norm`` (the pack's when there is no atlas).

The first draft position comes from SGLang's real drafter when a replay is given (else from the
training-side drafter); later positions always continue on the training side, because SGLang's
draft-decode path has no CPU kernels (sglang-cpu.md §5 item 6). ``sglang_agreement`` reports how often
both implementations drafted the same first token (1.0 in fp32: they compute the same function).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specparity.compare.findings import Finding
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
)
from specparity.replay.checkpoint import read_target_lm_head
from specparity.replay.diagnosis import OutcomeThresholds, diagnose, expected_from_contract
from specparity.replay.drafter import Eagle3Drafter
from specparity.replay.served import SglangReplay, capture_with_replay
from specparity.serving import capture_deployment
from specparity.serving.results import BAD_DEPLOYMENT, UNSUPPORTED_VERSION, CaptureResult, ServingFailure
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
    first_draft_source: str  # "sglang" or "training_side"
    sglang_agreement: dict[str, float] | None  # side -> fraction of rows where SGLang's d_1 == training side's

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary.to_dict(), "findings": [f.to_dict() for f in self.findings],
                "recorded": self.recorded.to_dict(), "served": self.served.to_dict(), "num_steps": self.num_steps,
                "first_draft_source": self.first_draft_source, "sglang_agreement": self.sglang_agreement}


@dataclass(frozen=True)
class OutcomeRun:
    """One child run's capture (reusable by the capture level) and the outcome, or why there is none."""

    capture: CaptureResult
    report: OutcomeReport | None
    failures: tuple[ServingFailure, ...]
    replay: SglangReplay | None = None  # SGLang's first-draft logits (None when the replay failed)


def _greedy(final_norm: torch.Tensor | None, fallback: torch.Tensor | None, lm_head: torch.Tensor) -> torch.Tensor:
    source = final_norm if final_norm is not None else fallback
    if source is None:
        raise ValueError("neither the probe pack nor the atlas holds final_norm; the target's greedy tokens are unknown")
    return greedy_from_final_norm(source, lm_head)


def _agreement(drafter: Eagle3Drafter, samples: Sequence[ReplaySample], sglang: Sequence[torch.Tensor]) -> float:
    same = total = 0
    for s, ids in zip(samples, sglang, strict=True):
        own = drafter.to_target(drafter.extend(s.fc_input, draft_next_ids(s.input_ids, s.target_greedy))
                                .logits.argmax(dim=-1))
        same += int((own == ids).sum())
        total += int(own.shape[0])
    return same / total if total else 0.0


def outcome_from_capture(
    *, drafter: Eagle3Drafter, target_lm_head: torch.Tensor, probes: ProbePack, capture: CaptureResult,
    sglang: SglangReplay | None, num_steps: int, expected: Sequence[float] | None = None,
    thresholds: OutcomeThresholds | None = None,
) -> OutcomeReport:
    """Acceptance on both sides and the verdict; raises ValueError when the capture has no fc input."""
    if capture.fc is None:
        raise ValueError("the capture holds no fc input; the outcome level needs a successful capture")
    width = drafter.shape.fc_in_features
    bad = [i for i, f in enumerate(capture.fc.per_sample) if int(f.shape[-1]) != width]
    if bad:
        raise ValueError(f"SGLang fed fc {int(capture.fc.per_sample[bad[0]].shape[-1])}-wide rows; the drafter's fc "
                         f"takes {width}")
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
    firsts = {"recorded": None, "served": None} if sglang is None else {
        "recorded": sglang.first_drafts("recorded"), "served": sglang.first_drafts("served")}
    agreement = None
    if sglang is not None:
        agreement = {"recorded": _agreement(drafter, recorded, sglang.first_drafts("recorded")),
                     "served": _agreement(drafter, served, sglang.first_drafts("served"))}
    rec = measure(drafter, recorded, num_steps=num_steps, first_drafts=firsts["recorded"])
    srv = measure(drafter, served, num_steps=num_steps, first_drafts=firsts["served"])
    summary, findings = diagnose(rec, srv, expected=expected, thresholds=thresholds)
    return OutcomeReport(summary=summary, findings=findings, recorded=rec, served=srv, num_steps=num_steps,
                         first_draft_source="sglang" if sglang is not None else "training_side",
                         sglang_agreement=agreement)


def check_outcome(
    contract: Contract, probes: ProbePack, *, target: str | Path, draft: str | Path,
    server_args: dict[str, object] | None = None, device: str = "cpu", num_steps: int | None = None,
    thresholds: OutcomeThresholds | None = None, timeout_s: float = 600, python: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> OutcomeRun:
    """Capture + replay in one SGLang child, then :func:`outcome_from_capture`.

    ``num_steps``: the chain length; default the contract's ``serving.num_steps``, else the deployment's
    resolved ``speculative_num_steps``, else 3. The capture is always returned (the capture level reuses
    it). When the outcome cannot be computed (a drafter the training side does not implement, inputs it
    cannot replay) ``report`` is None and ``failures`` says why; this never raises for those.
    """
    ids = [s.input_ids.tolist() for s in probes.samples]
    try:
        drafter = Eagle3Drafter.load(draft, target_dir=target)
        lm_head = read_target_lm_head(target)
    except InputError as e:
        capture = capture_deployment(target, draft, probes=ids, server_args=server_args, device=device, atlas=True,
                                     timeout_s=timeout_s, python=python, progress=progress)
        why = ServingFailure(UNSUPPORTED_VERSION, f"the outcome level cannot replay this drafter: {e}")
        return OutcomeRun(capture=capture, report=None, failures=(*capture.failures, why))
    capture, replay = capture_with_replay(
        target, draft, probes=ids, recorded_fc=[s.fc_input for s in probes.samples], server_args=server_args,
        device=device, timeout_s=timeout_s, python=python, progress=progress)
    failures = tuple(capture.failures) + ((replay,) if isinstance(replay, ServingFailure) else ())
    sglang = replay if isinstance(replay, SglangReplay) else None
    if capture.fc is None:
        return OutcomeRun(capture=capture, report=None, failures=failures, replay=sglang)
    steps = num_steps or contract.serving.num_steps
    if steps is None and capture.deployment is not None:
        steps = capture.deployment.resolved_spec.num_steps
    try:
        report = outcome_from_capture(
            drafter=drafter, target_lm_head=lm_head, probes=probes, capture=capture, sglang=sglang,
            num_steps=steps or DEFAULT_NUM_STEPS, expected=expected_from_contract(contract.training_outcome),
            thresholds=thresholds)
    except ValueError as e:
        why = ServingFailure(BAD_DEPLOYMENT, f"the outcome level cannot replay these inputs: {e}")
        return OutcomeRun(capture=capture, report=None, failures=(*failures, why), replay=sglang)
    return OutcomeRun(capture=capture, report=report, failures=failures, replay=sglang)


def recorded_acceptance(probes: ProbePack, *, draft: str | Path, target: str | Path, num_steps: int) -> AcceptanceResult:
    """Acceptance on the recorded fc inputs alone (no SGLang): the training-time expectation a contract carries.

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
