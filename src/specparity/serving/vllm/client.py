"""What vLLM really does with a deployment: its own config resolution, the fc input per rank, the atlas, and
its serving loop's acceptance counters.

Both entry points run vLLM's real engine in a child process (``serving/vllm/worker.py``, through
``serving/child/process.py``) and never raise for a deployment problem; every problem is a typed
:class:`~specparity.serving.results.ServingFailure`. ``python`` points at the interpreter whose vLLM serves
(e.g. ``.tox/vllm-0.32/bin/python``); specparity itself needs not be installed there (its source goes on the
child's ``PYTHONPATH``), but for ``tensor_parallel_size > 1`` its ``vllm.general_plugins`` entry point must be
(``pip install -e .`` / ``pip install specparity``), because vLLM's worker processes load the tap only that way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specparity.serving.child import reaper
from specparity.serving.child.run import CaptureExtras, capture_in_child, capture_request, resolve_in_child
from specparity.serving.results import CaptureResult, LoopAcceptance, ResolvedDeployment, ServingFailure
from specparity.serving.vllm.root_cause import with_worker_root_cause

if TYPE_CHECKING:
    from specparity.compare.reduced import Reduction
    from specparity.serving.child.transport import ChildOutcome

WORKER_MODULE = "specparity.serving.vllm.worker"

__all__ = ["WORKER_MODULE", "capture_deployment", "loop_acceptance", "resolve_deployment"]


def resolve_deployment(
    target: str | Path, draft: str | Path, *, engine_args: Mapping[str, object] | None = None, device: str = "cpu",
    timeout_s: float = 300, python: str | None = None,
) -> ResolvedDeployment | ServingFailure:
    """vLLM's own ``EngineArgs.create_engine_config`` and aux-layer reader on the deployment; no weights."""
    return resolve_in_child(target, draft, server_args=engine_args, device=device, python=python,
                            timeout_s=timeout_s, module=WORKER_MODULE, engine="vLLM")


def capture_deployment(
    target: str | Path, draft: str | Path, *, probes: Sequence[Sequence[int]],
    engine_args: Mapping[str, object] | None = None, device: str = "cpu", atlas: bool = True, timeout_s: float = 600,
    python: str | None = None, progress: Callable[[int, int], None] | None = None,
    loop_prompt_lengths: Sequence[int] | None = None, reduction: Reduction | None = None,
) -> CaptureResult:
    """Greedy generation of ``probes`` through vLLM's real engine with speculation on, the tap in every worker.

    ``engine_args`` are ``vllm.LLM`` keywords (``tensor_parallel_size=2``, ...) plus ``num_speculative_tokens``
    and ``generate_tokens``. The result's ``loop`` holds vLLM's spec-decode counters and per-rank facts, and
    ``acceptance`` the same counters as :class:`LoopAcceptance`. ``loop_prompt_lengths[i]`` (the rows before the
    assistant's first token) makes the loop also generate from each probe's prompt, and count only that.
    ``reduction`` (compare/reduced.py) has the tap reduce the atlas in the workers (serving/vllm/tap_reduce.py).
    """
    if loop_prompt_lengths is not None:
        engine_args = {**(engine_args or {}), "loop_prompt_lengths": [int(n) for n in loop_prompt_lengths]}
    request = capture_request(target, draft, probes=probes, server_args=engine_args, device=device, atlas=atlas)
    if isinstance(request, CaptureResult):
        return request
    if reduction is None:
        return capture_in_child(request, extras=_loop, python=python, timeout_s=timeout_s, progress=progress,
                                module=WORKER_MODULE, engine="vLLM", annotate=with_worker_root_cause)
    from safetensors.torch import save_file

    with reaper.temp_dir("specparity-reduce-") as work:
        # the recorded fc inputs go to the child as a file beside the request (as SGLang's drafter replay's do)
        path = work / "recorded.safetensors"
        save_file({f"fc/{i}": r.detach().to("cpu").contiguous() for i, r in enumerate(reduction.recorded)},
                  str(path))
        request = dataclasses.replace(request, reduce={"recorded": str(path), "expected": list(reduction.expected),
                                                       "rtol": reduction.rtol})
        return capture_in_child(request, extras=_loop, python=python, timeout_s=timeout_s, progress=progress,
                                module=WORKER_MODULE, engine="vLLM", annotate=with_worker_root_cause)


def _loop(outcome: ChildOutcome | ServingFailure) -> CaptureExtras:
    if isinstance(outcome, ServingFailure):
        return {}
    return {"loop": outcome.loop, "acceptance": loop_acceptance(outcome.loop)}


def loop_acceptance(loop: Mapping[str, Any] | None) -> LoopAcceptance | None:
    """vLLM's spec-decode counters as :class:`LoopAcceptance`; None when the loop reported no drafts.

    ``spec_decode_num_accepted_tokens_per_pos[j]`` counts the drafts whose position ``j`` was accepted, out of
    ``spec_decode_num_drafts`` (vLLM ``v1/spec_decode/metrics.py``; read by ``worker._metrics``).
    """
    counters = (loop or {}).get("counters") or {}
    drafts = int(counters.get("spec_decode_num_drafts") or 0)
    per_pos = tuple(int(a) for a in counters.get("spec_decode_num_accepted_tokens_per_pos") or [])
    if loop is None or drafts <= 0 or not per_pos:
        return None
    tokens = counters.get("spec_decode_num_draft_tokens")
    tp = loop.get("tensor_parallel_size")
    return LoopAcceptance(
        engine=str(loop.get("engine") or "vllm"), drafts=drafts, accepted_per_position=per_pos,
        accepted=int(counters.get("spec_decode_num_accepted_tokens") or sum(per_pos)),
        draft_tokens=int(tokens) if tokens is not None else None, tensor_parallel_size=int(tp) if tp else None,
        prompts=loop.get("loop_prompts"))
