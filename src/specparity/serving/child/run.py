"""The child run both engines share: the worker's request checked and written, the child started
(:func:`specparity.serving.child.process.run_child`), its result read and its failures mapped.

What is an engine's own stays with it: its worker module and how its stderr is read (``run_child``'s
keywords), SGLang's drafter replay (:mod:`specparity.serving`), vLLM's loop counters
(:mod:`specparity.serving.vllm`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

from specparity.serving.child import process
from specparity.serving.child.transport import ChildOutcome
from specparity.serving.child.worker_common import WorkerRequest
from specparity.serving.results import (
    BAD_DEPLOYMENT,
    FC_NOT_CALLED,
    CaptureResult,
    DrafterReplay,
    LoopAcceptance,
    ResolvedDeployment,
    ServingFailure,
)


class CaptureExtras(TypedDict, total=False):
    """An engine's own part of a :class:`CaptureResult`, beside what every capture carries."""

    loop: dict[str, Any] | None
    replay: DrafterReplay | ServingFailure | None
    acceptance: LoopAcceptance | None


def _check_model_dir(path: Path, role: str) -> ServingFailure | None:
    if not path.is_dir():
        return ServingFailure(BAD_DEPLOYMENT, f"{role} path {path} is not a directory")
    if not (path / "config.json").is_file():
        return ServingFailure(BAD_DEPLOYMENT, f"{role} directory {path} has no config.json")
    return None


def _check_probes(probes: Sequence[Sequence[int]]) -> ServingFailure | None:
    for i, p in enumerate(probes):
        if len(p) == 0:
            return ServingFailure(BAD_DEPLOYMENT, "probe sample has no tokens", sample=i)
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in p):
            return ServingFailure(BAD_DEPLOYMENT, "probe token ids must be non-negative ints", sample=i)
    return None


def make_request(
    op: str, target: str | Path, draft: str | Path, *, server_args: Mapping[str, object] | None, device: str,
    probes: Sequence[Sequence[int]] = (), atlas: bool = True,
) -> WorkerRequest | ServingFailure:
    """Check the deployment's directories, probes and args; the child's request or why there is none."""
    t, d = Path(target), Path(draft)
    bad = _check_model_dir(t, "target") or _check_model_dir(d, "draft") or _check_probes(probes)
    if bad is not None:
        return bad
    for key, value in (server_args or {}).items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            return ServingFailure(BAD_DEPLOYMENT, f"server_args[{key!r}] is not a JSON value: {value!r}")
    return WorkerRequest(
        op=op,
        target=str(t.resolve()),
        draft=str(d.resolve()),
        server_args=dict(server_args or {}),
        device=device,
        probes=tuple(tuple(p) for p in probes),
        atlas=atlas,
    )


def with_wall(dep: ResolvedDeployment | None, wall: float) -> ResolvedDeployment | None:
    """``dep`` with the child's wall time in its timings (``child_wall_s``)."""
    return None if dep is None else dataclasses.replace(dep, timings={**dep.timings, "child_wall_s": wall})


def resolve_in_child(
    target: str | Path, draft: str | Path, *, server_args: Mapping[str, object] | None, device: str,
    **run: Any,
) -> ResolvedDeployment | ServingFailure:
    """A static resolution in a child: the deployment, or the first failure that kept it from resolving.

    ``run`` goes to :func:`~specparity.serving.child.process.run_child` (``python``, ``timeout_s``, the engine's
    ``module``, ``engine``)."""
    request = make_request("resolve", target, draft, server_args=server_args, device=device)
    if isinstance(request, ServingFailure):
        return request
    t0 = time.perf_counter()
    outcome = process.run_child(request, **run)
    if isinstance(outcome, ServingFailure):
        return outcome
    if outcome.deployment is None:
        return outcome.failures[0]
    dep = with_wall(outcome.deployment, time.perf_counter() - t0)
    assert dep is not None
    return dep


def capture_request(
    target: str | Path, draft: str | Path, *, probes: Sequence[Sequence[int]],
    server_args: Mapping[str, object] | None, device: str, atlas: bool,
) -> WorkerRequest | CaptureResult:
    """The capture child's request, or the failed :class:`CaptureResult` that starts no child."""
    request = make_request(
        "capture", target, draft, server_args=server_args, device=device, probes=probes, atlas=atlas
    )
    if isinstance(request, ServingFailure):
        return CaptureResult(None, None, None, (request,))
    if not request.probes:
        # Nothing to prefill, so nothing can reach fc: a failure, never an empty pass. (A forward
        # that runs but skips fc is caught in the child: FcTap saw no call -> fc_not_called.)
        return CaptureResult(
            None,
            None,
            None,
            (
                ServingFailure(
                    FC_NOT_CALLED, "no probe samples were given, so no forward reached the drafter's fc"
                ),
            ),
        )
    return request


def _no_extras(outcome: ChildOutcome | ServingFailure) -> CaptureExtras:
    return {}


def capture_in_child(
    request: WorkerRequest, *, extras: Callable[[ChildOutcome | ServingFailure], CaptureExtras] = _no_extras,
    **run: Any,
) -> CaptureResult:
    """Run a capture ``request`` in a child; what it wrote, or the failure that kept it from writing.

    ``extras(outcome)`` (the child's outcome, or the failure) gives the engine's own fields of the result;
    ``run`` goes to :func:`~specparity.serving.child.process.run_child`."""
    t0 = time.perf_counter()
    outcome = process.run_child(request, **run)
    if isinstance(outcome, ServingFailure):
        return CaptureResult(None, None, None, (outcome,), **extras(outcome))
    more = extras(outcome)
    return CaptureResult(
        deployment=with_wall(outcome.deployment, time.perf_counter() - t0),
        fc=outcome.fc,
        atlas=outcome.atlas,
        failures=outcome.failures,
        **more,
    )
