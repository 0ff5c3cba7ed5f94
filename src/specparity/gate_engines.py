"""The gate's steps that go through the engine interface (:mod:`specparity.serving.engine`), for any engine
other than the SGLang path gate.py has always had: one engine start for capture and outcome, the real
serving loop's acceptance, and the finding for a config whose ids mean other layers on this engine.

Engine-agnostic like gate.py: it sees only :class:`~specparity.serving.engine.Engine`, typed serving
results and canonical source names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from specparity.compare.findings import Finding, FindingKind, Severity
from specparity.contract import Contract, ProbePack
from specparity.errors import InputError
from specparity.serving.engine import Engine
from specparity.serving.results import CaptureResult, ResolvedDeployment
from specparity.verdict import OutcomeSummary


def engine_args_for(engine: Engine, contract: Contract, user: Mapping[str, object]) -> dict[str, object]:
    """The contract's speculative settings in the engine's spelling, overridden by the user's arguments."""
    s = contract.serving
    out = engine.spec_args(s.num_steps, s.eagle_topk, s.num_draft_tokens)
    out.update(user)
    return out


def loop_summary(loop: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Per-position acceptance of the engine's own serving loop, with 95% Wilson intervals.

    From vLLM's counters: ``spec_decode_num_accepted_tokens_per_pos[j] / spec_decode_num_drafts`` is the
    rate at which draft position ``j`` was accepted (vLLM ``v1/spec_decode/metrics.py``); the acceptance
    length is ``1 + accepted / drafts`` (the bonus token included). None when the engine reported no drafts.
    """
    from specparity.replay.acceptance import wilson_interval

    counters = (loop or {}).get("counters") or {}
    drafts = int(counters.get("spec_decode_num_drafts") or 0)
    per_pos = [int(a) for a in counters.get("spec_decode_num_accepted_tokens_per_pos") or []]
    if drafts <= 0 or not per_pos:
        return None
    accepted = int(counters.get("spec_decode_num_accepted_tokens") or sum(per_pos))
    return {
        "engine": (loop or {}).get("engine"), "drafts": drafts, "draft_tokens": counters.get("spec_decode_num_draft_tokens"),
        "per_position": [a / drafts for a in per_pos],
        "intervals": [list(wilson_interval(a, drafts)) for a in per_pos],
        "acceptance_length": 1.0 + accepted / drafts,
        "tensor_parallel_size": (loop or {}).get("tensor_parallel_size"),
        "prompts": (loop or {}).get("loop_prompts"),  # "assistant_start": the probes' prompts; else after the probe
    }


def engine_outcome(contract: Contract, pack: ProbePack, capture: CaptureResult, *, target: str | Path,
                   draft: str | Path) -> tuple[OutcomeSummary | None, tuple[Finding, ...]]:
    """Acceptance on recorded vs served fc inputs (training-side replay of what the engine fed fc) plus the
    engine's own loop; an outcome that cannot rest on the engine's own figures is an error, never a pass."""
    from specparity.replay.checkpoint import read_target_lm_head
    from specparity.replay.diagnosis import expected_from_contract
    from specparity.replay.drafter import Eagle3Drafter
    from specparity.replay.outcome import DEFAULT_NUM_STEPS, outcome_from_capture

    loop = loop_summary(capture.loop)
    details = {"check": "outcome"}
    if loop is None:
        return None, (Finding(FindingKind.SGLANG_ERROR, Severity.ERROR, "the engine's serving loop reported no "
                              "speculative drafts, so there is no real acceptance to judge", details=details),)
    try:
        drafter = Eagle3Drafter.load(draft, target_dir=target)
        lm_head = read_target_lm_head(target)
    except InputError as e:
        return None, (Finding(FindingKind.SGLANG_ERROR, Severity.ERROR, f"the training-side replay cannot run this "
                              f"drafter, so wiring cannot be told from model quality: {e}", details=details),)
    dep = capture.deployment
    steps = contract.serving.num_steps or (dep.resolved_spec.num_steps if dep else None) or DEFAULT_NUM_STEPS
    try:
        report = outcome_from_capture(drafter=drafter, target_lm_head=lm_head, probes=pack, capture=capture,
                                      sglang=None, num_steps=steps,
                                      expected=expected_from_contract(contract.training_outcome))
    except ValueError as e:
        return None, (Finding(FindingKind.SGLANG_ERROR, Severity.ERROR, f"the outcome level cannot replay these "
                              f"inputs: {e}", details=details),)
    return dataclasses.replace(report.summary, engine_loop=loop), tuple(report.findings)


def _prompt_length(n: int, loss_mask: Any) -> int:
    if loss_mask is None:
        return n
    hits = (loss_mask != 0).nonzero()
    return int(hits[0, 0]) if hits.numel() and int(hits[0, 0]) > 0 else n


def run_engine(engine: Engine, contract: Contract, pack: ProbePack, target: str | Path, draft: str | Path,
               args: Mapping[str, object], *, level: str, device: str, python: str | None, timeout_s: float,
               progress: Callable[[int, int], None] | None
               ) -> tuple[CaptureResult, OutcomeSummary | None, tuple[Finding, ...]]:
    """One engine start: the capture, and at ``outcome``/``all`` the outcome from the same run.

    The real loop runs on each probe's prompt (the rows before its first ``loss_mask`` 1, the assistant's
    first token), so the target writes the answer the drafter was trained to predict."""
    if level in ("outcome", "all") and engine.name == "vllm":
        args = {**args, "loop_prompt_lengths": [_prompt_length(s.input_ids.numel(), s.loss_mask) for s in pack.samples]}
    capture = engine.capture(target, draft, probes=[s.input_ids.tolist() for s in pack.samples], args=args,
                             device=device, timeout_s=timeout_s, python=python, progress=progress)
    if level not in ("outcome", "all") or capture.fc is None:
        return capture, None, ()
    outcome, findings = engine_outcome(contract, pack, capture, target=target, draft=draft)
    return capture, outcome, findings


def convention_findings(engine: Engine, contract: Contract, dep: ResolvedDeployment, draft_config: Mapping[str, Any],
                        *, fix_summary: str | None) -> list[Finding]:
    """``engine_convention_mismatch``: the draft config carries the training tool's ids, and this engine
    reads those same numbers as other layers than the tool meant (e.g. SpecForge [1, 3, 5] = layer:1, 3, 5;
    vLLM serves hidden_states[1, 3, 5] = layer:0, 2, 4)."""
    raw = contract.layer_ids
    reading = engine.reading(draft_config, num_layers=dep.num_layers, architecture=dep.target_architecture,
                             version=dep.sglang_version)
    if reading is None or raw.ids is None or reading.ids is None or list(reading.ids) != list(raw.ids):
        return []
    expected = tuple(contract.fc_input.sources)
    if tuple(reading.sources) == expected:
        return []
    msg = (f"{engine.label} {dep.sglang_version} reads {reading.key} {list(reading.ids)} as "
           f"{', '.join(reading.sources)}; under {raw.tool}'s convention ({raw.convention.value}) the same ids mean "
           f"{', '.join(expected)}. {reading.rule}")
    return [Finding(FindingKind.ENGINE_CONVENTION_MISMATCH, Severity.ERROR, msg,
                    details={"check": "static", "engine": engine.name, "engine_version": dep.sglang_version,
                             "key": reading.key, "ids": list(reading.ids), "served": list(reading.sources),
                             "expected": list(expected), "training_convention": raw.convention.value},
                    fix=fix_summary)]
