"""What vLLM really does with a deployment: its own config resolution, the fc input per rank, the atlas, and
its serving loop's acceptance counters.

Both entry points run vLLM's real engine in a child process (``serving/vllm/worker.py``, through
``serving/process.py``) and never raise for a deployment problem; every problem is a typed
:class:`~specparity.serving.results.ServingFailure`. ``python`` points at the interpreter whose vLLM serves
(e.g. ``.tox/vllm-0.32/bin/python``); specparity itself needs not be installed there (its source goes on the
child's ``PYTHONPATH``), but for ``tensor_parallel_size > 1`` its ``vllm.general_plugins`` entry point must be
(``pip install -e .`` / ``pip install specparity``), because vLLM's worker processes load the tap only that way.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from specparity.serving.process import run_child
from specparity.serving.results import FC_NOT_CALLED, CaptureResult, ResolvedDeployment, ServingFailure

WORKER_MODULE = "specparity.serving.vllm.worker"

__all__ = ["WORKER_MODULE", "capture_deployment", "resolve_deployment"]


def _with_wall(dep: ResolvedDeployment | None, wall: float) -> ResolvedDeployment | None:
    return None if dep is None else dataclasses.replace(dep, timings={**dep.timings, "child_wall_s": wall})


def resolve_deployment(
    target: str | Path, draft: str | Path, *, engine_args: Mapping[str, object] | None = None, device: str = "cpu",
    timeout_s: float = 300, python: str | None = None,
) -> ResolvedDeployment | ServingFailure:
    """vLLM's own ``EngineArgs.create_engine_config`` and aux-layer reader on the deployment; no weights."""
    from specparity.serving import make_request

    request = make_request("resolve", target, draft, server_args=engine_args, device=device)
    if isinstance(request, ServingFailure):
        return request
    t0 = time.perf_counter()
    outcome = run_child(request, python=python, timeout_s=timeout_s, module=WORKER_MODULE, engine="vLLM")
    if isinstance(outcome, ServingFailure):
        return outcome
    if outcome.deployment is None:
        return outcome.failures[0]
    dep = _with_wall(outcome.deployment, time.perf_counter() - t0)
    assert dep is not None
    return dep


def capture_deployment(
    target: str | Path, draft: str | Path, *, probes: Sequence[Sequence[int]],
    engine_args: Mapping[str, object] | None = None, device: str = "cpu", atlas: bool = True, timeout_s: float = 600,
    python: str | None = None, progress: Callable[[int, int], None] | None = None,
) -> CaptureResult:
    """Greedy generation of ``probes`` through vLLM's real engine with speculation on, the tap in every worker.

    ``engine_args`` are ``vllm.LLM`` keywords (``tensor_parallel_size=2``, ...) plus ``num_speculative_tokens``
    and ``generate_tokens``. The result's ``loop`` holds vLLM's spec-decode counters and per-rank facts.
    """
    from specparity.serving import make_request

    request = make_request("capture", target, draft, server_args=engine_args, device=device, probes=probes,
                           atlas=atlas)
    if isinstance(request, ServingFailure):
        return CaptureResult(None, None, None, (request,))
    if not request.probes:
        return CaptureResult(None, None, None, (ServingFailure(
            FC_NOT_CALLED, "no probe samples were given, so no forward reached the drafter's fc"),))
    t0 = time.perf_counter()
    outcome = run_child(request, python=python, timeout_s=timeout_s, progress=progress, module=WORKER_MODULE,
                        engine="vLLM")
    if isinstance(outcome, ServingFailure):
        return CaptureResult(None, None, None, (outcome,))
    return CaptureResult(deployment=_with_wall(outcome.deployment, time.perf_counter() - t0), fc=outcome.fc,
                         atlas=outcome.atlas, failures=outcome.failures, loop=outcome.loop)
