"""The one interface the gate, explain and the plugin see of a serving engine, and what they ask through it.

``get_engine("sglang" | "vllm")`` returns the engine's adapter, an :class:`Engine`
(:mod:`specparity.serving.engine_base`, which holds the interface and the base both implementations extend);
each engine's room implements it side by side (``serving/sglang/engine.py``, ``serving/vllm/engine.py``), and
nothing above ``serving/`` names an engine's modules. Every method returns typed results in canonical source names,
so compare/ and replay/ never learn which engine served.

Beside the registry, the engine-neutral part of what the gate asks of any engine: :func:`engine_args_for`,
:func:`outcome_request` and :func:`convention_findings`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from specparity.compare.findings import Finding, FindingKind, Severity
from specparity.serving.engine_base import Engine
from specparity.serving.results import ENGINES, Explanation, IdReading, OutcomeRequest, ResolvedDeployment

if TYPE_CHECKING:
    from specparity.contract import Contract, ProbePack


__all__ = ["Engine", "Explanation", "IdReading", "convention_findings", "engine_args_for", "get_engine",
           "outcome_request"]


def get_engine(name: str) -> Engine:
    """The adapter for ``name``; ValueError naming the known engines otherwise."""
    if name == "sglang":
        from specparity.serving.sglang.engine import SglangEngine

        return SglangEngine()
    if name == "vllm":
        from specparity.serving.vllm.engine import VllmEngine

        return VllmEngine()
    raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")


def engine_args_for(engine: Engine, contract: Contract, user: Mapping[str, object]) -> dict[str, object]:
    """The contract's speculative settings in the engine's spelling, overridden by the user's arguments."""
    s = contract.serving
    out = engine.spec_args(s.num_steps, s.eagle_topk, s.num_draft_tokens)
    out.update(user)
    return out


def outcome_request(pack: ProbePack) -> OutcomeRequest:
    """What the outcome level asks of the engine run: the recorded fc rows (for the engine's own drafter) and each
    probe's prompt, the rows before its first ``loss_mask`` 1 (the assistant's first token), so a real serving
    loop generates the answer the drafter was trained to predict (None for a probe without a loss mask)."""
    return OutcomeRequest(recorded_fc=tuple(s.fc_input for s in pack.samples),
                          prompt_lengths=tuple(_prompt_length(s.input_ids.numel(), s.loss_mask) for s in pack.samples))


def _prompt_length(n: int, loss_mask: Any) -> int | None:
    """Rows before the first loss-mask 1; None without a mask (e.g. speculators' hs files carry none), where
    the assistant's start is unknown and a loop on the whole probe would measure text the drafter never saw."""
    if loss_mask is None:
        return None
    hits = (loss_mask != 0).nonzero()
    return int(hits[0, 0]) if hits.numel() and int(hits[0, 0]) > 0 else n


def convention_findings(engine: Engine, contract: Contract, dep: ResolvedDeployment, draft_config: Mapping[str, Any],
                        *, fix_summary: str | None) -> list[Finding]:
    """``engine_convention_mismatch``: the draft config carries the training tool's ids, and this engine
    reads those same numbers as other layers than the tool meant (e.g. SpecForge [1, 3, 5] = layer:1, 3, 5;
    vLLM serves hidden_states[1, 3, 5] = layer:0, 2, 4)."""
    raw = contract.layer_ids
    reading = engine.reading(draft_config, num_layers=dep.num_layers, architecture=dep.target_architecture,
                             version=dep.engine_version)
    if reading is None or raw.ids is None or reading.ids is None or list(reading.ids) != list(raw.ids):
        return []
    expected = tuple(contract.fc_input.sources)
    if tuple(reading.sources) == expected:
        return []
    msg = (f"{engine.label} {dep.engine_version} reads {reading.key} {list(reading.ids)} as "
           f"{', '.join(reading.sources)}; under {raw.tool}'s convention ({raw.convention.value}) the same ids mean "
           f"{', '.join(expected)}. {reading.rule}")
    return [Finding(FindingKind.ENGINE_CONVENTION_MISMATCH, Severity.ERROR, msg,
                    details={"check": "static", "engine": engine.name, "engine_version": dep.engine_version,
                             "key": reading.key, "ids": list(reading.ids), "served": list(reading.sources),
                             "expected": list(expected), "training_convention": raw.convention.value},
                    fix=fix_summary)]
