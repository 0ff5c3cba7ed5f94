"""What SGLang really does with a deployment: static resolution, the fc input, the layer atlas.

Two entry points, both run SGLang's own code in a child process (``serving/process.py``) and never
raise for a deployment problem; every problem is a typed :class:`ServingFailure`:

- :func:`resolve_deployment` - ServerArgs resolution, draft ids, capture list, fc shape; no forward.
- :func:`capture_deployment` - a real prefill of the probes; what the drafter's fc was fed, per
  sample, plus the target's residual stream at every boundary; with ``recorded_fc`` also SGLang's own
  drafter on the served and the recorded inputs, in the same child (``serving/drafter_replay.py``).

This room knows nothing of contracts, comparison or pytest.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from specparity.serving.process import run_child
from specparity.serving.results import (
    BAD_DEPLOYMENT,
    FAILURE_KINDS,
    FC_NOT_CALLED,
    CaptureResult,
    DrafterReplay,
    FcCapture,
    LayerAtlas,
    LoopAcceptance,
    OutcomeRequest,
    ResolvedDeployment,
    ServingFailure,
    SpecSettings,
)
from specparity.serving.sglang.adapter import WorkerRequest, supported_range

if TYPE_CHECKING:
    import torch

__all__ = [
    "FAILURE_KINDS",
    "CaptureResult",
    "DrafterReplay",
    "FcCapture",
    "LayerAtlas",
    "LoopAcceptance",
    "OutcomeRequest",
    "ResolvedDeployment",
    "ServingFailure",
    "SpecSettings",
    "capture_deployment",
    "make_request",
    "resolve_deployment",
    "supported_range",
]


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
    op: str,
    target: str | Path,
    draft: str | Path,
    *,
    server_args: Mapping[str, object] | None,
    device: str,
    probes: Sequence[Sequence[int]] = (),
    atlas: bool = True,
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


def _with_wall(dep: ResolvedDeployment | None, wall: float) -> ResolvedDeployment | None:
    if dep is None:
        return None
    return dataclasses.replace(dep, timings={**dep.timings, "child_wall_s": wall})


def resolve_deployment(
    target: str | Path,
    draft: str | Path,
    *,
    server_args: Mapping[str, object] | None = None,
    device: str = "cpu",
    timeout_s: float = 300,
    python: str | None = None,
) -> ResolvedDeployment | ServingFailure:
    """Resolve a deployment statically with SGLang's own code (no weights loaded, no forward).

    ``server_args`` are ServerArgs keywords as a user would pass them (e.g.
    ``{"speculative_num_steps": 1}``); on ``cpu`` specparity adds ``attention_backend="torch_native"``,
    ``dtype="float32"`` and ``disable_cuda_graph=True`` unless given. ``python`` runs the child with
    another interpreter (a deploy repo's venv with its own SGLang).
    """
    request = make_request("resolve", target, draft, server_args=server_args, device=device)
    if isinstance(request, ServingFailure):
        return request
    t0 = time.perf_counter()
    outcome = run_child(request, python=python, timeout_s=timeout_s)
    if isinstance(outcome, ServingFailure):
        return outcome
    if outcome.deployment is None:
        return outcome.failures[0]
    dep = _with_wall(outcome.deployment, time.perf_counter() - t0)
    assert dep is not None
    return dep


def capture_deployment(
    target: str | Path,
    draft: str | Path,
    *,
    probes: Sequence[Sequence[int]],
    server_args: Mapping[str, object] | None = None,
    device: str = "cpu",
    atlas: bool = True,
    timeout_s: float = 600,
    python: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    recorded_fc: Sequence[torch.Tensor] | None = None,
) -> CaptureResult:
    """Prefill ``probes`` (several requests in ONE batch) through SGLang's real EAGLE-3 workers.

    Returns what the drafter's fc was fed, split per sample (row ``t`` = token ``t``), and with
    ``atlas=True`` the target's residual stream at every boundary. On ``device="cuda"`` SGLang's
    default backends and CUDA graphs stay on. ``progress(done, total)`` reports start-up, fc capture
    and atlas stages. Failures (fc never called, fewer aux states than fc expects, SGLang raising,
    NaN/Inf, timeout) are in ``failures``; a result without ``fc`` always carries at least one.

    ``recorded_fc`` (probe ``i``'s recorded fc input ``[T_i, k*H_t]``) also runs SGLang's own drafter on
    the served and the recorded inputs in the same child: ``CaptureResult.replay`` is then a
    :class:`DrafterReplay`, or the :class:`ServingFailure` saying why there is none (never a capture failure).
    """
    from specparity.serving import drafter_replay

    if recorded_fc is not None:
        bad_rows = drafter_replay.check_recorded(recorded_fc, probes)
        if bad_rows is not None:
            return CaptureResult(None, None, None, (bad_rows,), replay=bad_rows)
        server_args = drafter_replay.sized_server_args(server_args, device=device, probes=probes)
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
    with tempfile.TemporaryDirectory(prefix="specparity-replay-") as work:
        if recorded_fc is not None:
            request = dataclasses.replace(request, replay=drafter_replay.write_inputs(Path(work), recorded_fc))
        t0 = time.perf_counter()
        outcome = run_child(request, python=python, timeout_s=timeout_s, progress=progress)
        if isinstance(outcome, ServingFailure):
            return CaptureResult(None, None, None, (outcome,), replay=outcome if recorded_fc is not None else None)
        replay = (drafter_replay.read_replay(Path(request.replay["out"]), len(request.probes),
                                             capture_failures=outcome.failures)
                  if request.replay is not None else None)
    return CaptureResult(
        deployment=_with_wall(outcome.deployment, time.perf_counter() - t0),
        fc=outcome.fc,
        atlas=outcome.atlas,
        failures=outcome.failures,
        replay=replay,
    )
