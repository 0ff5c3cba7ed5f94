"""SGLang's parent side: what SGLang really does with a deployment: static resolution, the fc input, the atlas.

Two entry points, both run SGLang's own code in a child process (``serving/child/process.py``) and never
raise for a deployment problem; every problem is a typed :class:`ServingFailure`:

- :func:`resolve_deployment` - ServerArgs resolution, draft ids, capture list, fc shape; no forward.
- :func:`capture_deployment` - a real prefill of the probes; what the drafter's fc was fed, per
  sample, plus the target's residual stream at every boundary; with ``recorded_fc`` also SGLang's own
  drafter on the served and the recorded inputs, in the same child (``serving/drafter_replay.py``).

This room knows nothing of contracts, comparison or pytest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from specparity.serving.child import reaper
from specparity.serving.child.run import (
    CaptureExtras,
    capture_in_child,
    capture_request,
    resolve_in_child,
)
from specparity.serving.results import CaptureResult, ResolvedDeployment, ServingFailure

if TYPE_CHECKING:
    import torch

    from specparity.serving.child.transport import ChildOutcome

__all__ = ["capture_deployment", "resolve_deployment"]


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
    return resolve_in_child(
        target, draft, server_args=server_args, device=device, python=python, timeout_s=timeout_s
    )


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
    request = capture_request(
        target, draft, probes=probes, server_args=server_args, device=device, atlas=atlas
    )
    if isinstance(request, CaptureResult):
        return request
    with reaper.temp_dir("specparity-replay-") as work:
        if recorded_fc is not None:
            request = dataclasses.replace(request, replay=drafter_replay.write_inputs(work, recorded_fc))
        replay_out = None if request.replay is None else Path(request.replay["out"])
        samples = len(request.probes)

        def replay(outcome: ChildOutcome | ServingFailure) -> CaptureExtras:
            if replay_out is None:
                return {}
            if isinstance(outcome, ServingFailure):
                return {"replay": outcome}
            read = drafter_replay.read_replay(replay_out, samples, capture_failures=outcome.failures)
            return {"replay": read}

        return capture_in_child(request, extras=replay, python=python, timeout_s=timeout_s, progress=progress)
