"""One interface for a serving engine: resolve, capture with the atlas, the engine's own id rules and fix.

The gate talks to an engine only through :class:`Engine` (``get_engine("sglang" | "vllm")``); the engine
rooms (``serving/sglang/``, ``serving/vllm/``) sit side by side behind it. Every method returns typed
results (:class:`ResolvedDeployment`, :class:`CaptureResult`, :class:`ServingFailure`) in canonical source
names, so compare/ and replay/ never learn which engine served.

- ``spec_args``: the contract's speculative settings in the engine's own spelling.
- ``resolve``: static resolution with the engine's own code, no forward.
- ``capture``: one engine start per gate run: the fc input per probe and the target's residual stream at every
  boundary; given an :class:`OutcomeRequest`, also the outcome evidence of that same run, typed on the
  :class:`CaptureResult`: the engine's own drafter on served and recorded inputs (SGLang, ``replay``) and the
  acceptance its real serving loop counted (vLLM, ``acceptance``).
- ``reading``: which ids the engine reads from a draft config, from which key, and what they mean there.
- ``layout_fix``: the draft-config patch that makes this engine serve the contract's sources.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from specparity.serving.results import (
    ENGINES,
    CaptureResult,
    OutcomeRequest,
    ResolvedDeployment,
    ServingFailure,
)

if TYPE_CHECKING:
    from specparity.compare.fix import DraftConfigFix

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class IdReading:
    """What an engine makes of a draft config's aux ids: the ids, their key, and the sources they serve."""

    ids: tuple[int, ...] | None
    key: str | None
    sources: tuple[str, ...]
    rule: str  # one line, with the engine file:line it follows


class Engine(Protocol):
    """A serving engine adapter (module docstring)."""

    name: str
    label: str  # as reports spell it: "SGLang", "vLLM"

    def spec_args(self, num_steps: int | None, eagle_topk: int | None,
                  num_draft_tokens: int | None) -> dict[str, object]: ...

    def resolve(self, target: str | Path, draft: str | Path, *, args: Mapping[str, object], device: str,
                timeout_s: float, python: str | None) -> ResolvedDeployment | ServingFailure: ...

    def capture(self, target: str | Path, draft: str | Path, *, probes: Sequence[Sequence[int]],
                args: Mapping[str, object], device: str, timeout_s: float, python: str | None,
                progress: Progress | None, outcome: OutcomeRequest | None = None) -> CaptureResult: ...

    def reading(self, draft_config: Mapping[str, Any], *, num_layers: int, architecture: str,
                version: str) -> IdReading | None: ...

    def layout_fix(self, sources: Sequence[str], draft_config: Mapping[str, Any], *, num_layers: int,
                   architecture: str, version: str, draft_path: str) -> DraftConfigFix: ...


class SglangEngine:
    """SGLang through :mod:`specparity.serving` (its adapters per version live in ``serving/sglang/``)."""

    name, label = "sglang", "SGLang"

    def spec_args(self, num_steps: int | None, eagle_topk: int | None,
                  num_draft_tokens: int | None) -> dict[str, object]:
        from specparity.serving.results import SPEC_SERVER_ARGS

        values = (num_steps, eagle_topk, num_draft_tokens)
        return {k: v for k, v in zip(SPEC_SERVER_ARGS, values, strict=True) if v is not None}

    def resolve(self, target: str | Path, draft: str | Path, *, args: Mapping[str, object], device: str,
                timeout_s: float, python: str | None) -> ResolvedDeployment | ServingFailure:
        from specparity.serving import resolve_deployment

        dep = resolve_deployment(target, draft, server_args=args, device=device, timeout_s=timeout_s, python=python)
        if isinstance(dep, ResolvedDeployment):
            return dep
        return _why_sglang_cannot_read((dep,), Path(draft))[0]

    def capture(self, target: str | Path, draft: str | Path, *, probes: Sequence[Sequence[int]],
                args: Mapping[str, object], device: str, timeout_s: float, python: str | None,
                progress: Progress | None, outcome: OutcomeRequest | None = None) -> CaptureResult:
        from specparity.serving import capture_deployment

        # the outcome: SGLang's own drafter replayed on served and recorded inputs in the capture's child (its
        # draft-decode loop has no CPU kernels, sglang-cpu.md §5 item 6, so there are no loop counters)
        result = capture_deployment(target, draft, probes=probes, server_args=args, device=device, atlas=True,
                                    timeout_s=timeout_s, python=python, progress=progress,
                                    recorded_fc=outcome.recorded_fc if outcome is not None else None)
        if result.deployment is not None:
            return result
        return dataclasses.replace(result, failures=_why_sglang_cannot_read(result.failures, Path(draft)))

    def reading(self, draft_config: Mapping[str, Any], *, num_layers: int, architecture: str,
                version: str) -> IdReading | None:
        return None  # SGLang's reading is judged from its own resolution (ResolvedDeployment)

    def layout_fix(self, sources: Sequence[str], draft_config: Mapping[str, Any], *, num_layers: int,
                   architecture: str, version: str, draft_path: str) -> DraftConfigFix:
        from specparity.compare.fix import layout_fix

        return layout_fix(sources, draft_config, num_layers=num_layers, architecture=architecture, version=version,
                          draft_path=draft_path)


def _why_sglang_cannot_read(failures: Sequence[ServingFailure], draft: Path) -> tuple[ServingFailure, ...]:
    """SGLang's own start-up failure on a draft config it cannot read (a speculators-format draft: transformers'
    AutoConfig wants a model_type), told as ``draft_unreadable`` with the conversion and SGLang's own message kept;
    other failures unchanged. SGLang is always asked first: a release that learns the format is never refused here."""
    from specparity.serving.results import DRAFT_UNREADABLE, SGLANG_EXCEPTION
    from specparity.serving.sglang.draft_format import unreadable_draft

    why = unreadable_draft(draft) if any(f.kind == SGLANG_EXCEPTION for f in failures) else None
    if why is None:
        return tuple(failures)
    raised = "; ".join(f.message for f in failures)
    version = next((f.engine_version for f in failures if f.engine_version), None)
    vllm = (". To gate this draft as it is, serve it with vLLM (--engine vllm), which reads the speculators "
            "format: capture and outcome levels both" if "speculators" in why.message else "")
    return (ServingFailure(DRAFT_UNREADABLE, f"{why.message}{vllm} (SGLang {version or 'at start-up'} raised: {raised})",
                           engine_version=version),)


class VllmEngine:
    """vLLM's real engine (``serving/vllm/``); the id rules of :mod:`specparity.contract.vllm_conventions`."""

    name, label = "vllm", "vLLM"

    def spec_args(self, num_steps: int | None, eagle_topk: int | None,
                  num_draft_tokens: int | None) -> dict[str, object]:
        # vLLM's EAGLE proposer drafts one chain: num_speculative_tokens is the chain length
        return {} if num_steps is None else {"num_speculative_tokens": num_steps}

    def resolve(self, target: str | Path, draft: str | Path, *, args: Mapping[str, object], device: str,
                timeout_s: float, python: str | None) -> ResolvedDeployment | ServingFailure:
        from specparity.serving.vllm import resolve_deployment

        return resolve_deployment(target, draft, engine_args=args, device=device, timeout_s=timeout_s, python=python)

    def capture(self, target: str | Path, draft: str | Path, *, probes: Sequence[Sequence[int]],
                args: Mapping[str, object], device: str, timeout_s: float, python: str | None,
                progress: Progress | None, outcome: OutcomeRequest | None = None) -> CaptureResult:
        from specparity.serving.vllm import capture_deployment

        # the outcome: vLLM's real loop counts its own acceptance, on the probes' prompts where every probe says
        # where its assistant turn starts; otherwise on what it generates after each probe (loop "prompts" says)
        lengths = outcome.prompt_lengths if outcome is not None else ()
        known = [n for n in lengths if n is not None]
        return capture_deployment(target, draft, probes=probes, engine_args=args, device=device, atlas=True,
                                  timeout_s=timeout_s, python=python, progress=progress,
                                  loop_prompt_lengths=known if lengths and len(known) == len(lengths) else None)

    def reading(self, draft_config: Mapping[str, Any], *, num_layers: int, architecture: str,
                version: str) -> IdReading | None:
        from specparity.contract.vllm_conventions import read_ids

        try:
            r = read_ids(draft_config, num_layers=num_layers, version=version)
        except ValueError:
            return None
        return IdReading(r.ids, r.key, r.sources,
                         "vLLM reads id k as hidden_states[k], no +1 (vllm/model_executor/models/interfaces.py:"
                         "1601-1611, models/llama.py:428-441)")

    def layout_fix(self, sources: Sequence[str], draft_config: Mapping[str, Any], *, num_layers: int,
                   architecture: str, version: str, draft_path: str) -> DraftConfigFix:
        from specparity.compare.fix import DraftConfigFix
        from specparity.contract.vllm_conventions import fix_ops

        file = f"{draft_path.rstrip('/')}/config.json"
        try:
            ids, key, ops = fix_ops(sources, draft_config, num_layers=num_layers, version=version)
        except ValueError as e:
            return DraftConfigFix(summary=f"no draft config serves {', '.join(sources)} on vllm {version}: {e}",
                                  file=file, ids=None)
        summary = (f"{file} already sets {key} = {ids}" if not ops
                   else f"set {key} = {ids} in {file} (vLLM reads id k as hidden_states[k])")
        return DraftConfigFix(summary=summary, file=file, ids=tuple(ids), json_patch=tuple(ops))


def get_engine(name: str) -> Engine:
    """The adapter for ``name``; ValueError naming the known engines otherwise."""
    if name == "sglang":
        return SglangEngine()
    if name == "vllm":
        return VllmEngine()
    raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")
