"""SGLang's real drafter on recorded vs served fc inputs, in the same child run as the capture.

:func:`capture_with_replay` is :func:`specparity.serving.capture_deployment` plus two drafter passes in
the child (``serving/sglang/replay_hooks.py``): one on what SGLang's target served, one with fc's input
replaced by the recorded training rows. Both give SGLang's own first-draft logits for every probe row, so
one child start (about 10 s on CPU) serves the capture level and the outcome level.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import load_file, save_file

from specparity import serving
from specparity.serving.process import run_child
from specparity.serving.results import (
    BAD_DEPLOYMENT,
    NONFINITE,
    SGLANG_EXCEPTION,
    UNSUPPORTED_VERSION,
    CaptureResult,
    ServingFailure,
)

Side = Literal["served", "recorded"]


@dataclass(frozen=True)
class SglangReplay:
    """First-draft logits (draft vocab, float32) of SGLang's real drafter, per probe sample ``[T, V_d]``."""

    served_logits: list[torch.Tensor]
    recorded_logits: list[torch.Tensor]
    hot_token_id: torch.Tensor | None  # SGLang's draft -> target map (``d2t + arange``); None = identity
    passes: Mapping[str, Any]  # hook counts per pass, as the child saw them

    def first_drafts(self, side: Side) -> list[torch.Tensor]:
        """SGLang's ``d_1`` per row, in target ids (`# sglang 0.5.23 speculative/eagle_worker_v2.py:757-758`)."""
        logits = self.served_logits if side == "served" else self.recorded_logits
        ids = [x.argmax(dim=-1) for x in logits]
        return ids if self.hot_token_id is None else [self.hot_token_id[i] for i in ids]


def _sized_server_args(server_args: Mapping[str, object] | None, *, device: str,
                       probes: Sequence[Sequence[int]]) -> dict[str, object]:
    """Room for two more prefills of the probes (requests are never freed in the harness); user values win."""
    out = dict(server_args or {})
    total = sum(len(p) for p in probes)
    out.setdefault("max_running_requests", max(48, 5 * len(probes) + 8))
    if device == "cpu":
        out.setdefault("max_total_tokens", max(4096, 6 * total + 256))
    return out


def _read_replay(out: Path, n: int) -> SglangReplay | ServingFailure:
    status_path = Path(str(out) + ".json")
    if not status_path.is_file():
        return ServingFailure(UNSUPPORTED_VERSION, "this SGLang adapter ran no drafter replay (the outcome level "
                                                   "supports sglang 0.5.23)")
    status = json.loads(status_path.read_text())
    if not status.get("ok"):
        return ServingFailure(SGLANG_EXCEPTION, f"drafter replay failed: {status.get('error')}\n"
                                                f"{status.get('traceback', '')}")
    tensors = load_file(str(out))
    bad = sorted(k for k, t in tensors.items() if t.is_floating_point() and not bool(t.isfinite().all()))
    if bad:
        return ServingFailure(NONFINITE, f"SGLang's drafter produced NaN/Inf logits ({', '.join(bad[:4])}"
                                         f"{', ...' if len(bad) > 4 else ''}): its acceptance cannot be measured")
    return SglangReplay(
        served_logits=[tensors[f"served/{i}"] for i in range(n)],
        recorded_logits=[tensors[f"recorded/{i}"] for i in range(n)],
        hot_token_id=tensors.get("hot_token_id"), passes=dict(status.get("passes", {})))


def capture_with_replay(
    target: str | Path, draft: str | Path, *, probes: Sequence[Sequence[int]], recorded_fc: Sequence[torch.Tensor],
    server_args: Mapping[str, object] | None = None, device: str = "cpu", atlas: bool = True,
    timeout_s: float = 600, python: str | None = None, progress: Callable[[int, int], None] | None = None,
) -> tuple[CaptureResult, SglangReplay | ServingFailure]:
    """One SGLang child: the capture (fc input + atlas) and SGLang's drafter on served and recorded inputs.

    ``recorded_fc[i]`` is sample ``i``'s recorded fc input ``[T_i, k*H_t]`` (row t = token t).
    ``server_args`` get room for the two extra prefills unless the caller sized them.
    """
    if len(recorded_fc) != len(probes) or any(int(f.shape[0]) != len(p) for f, p in zip(recorded_fc, probes, strict=False)):
        bad = ServingFailure(BAD_DEPLOYMENT, "recorded fc inputs do not match the probes row for row")
        return CaptureResult(None, None, None, (bad,)), bad
    sized = _sized_server_args(server_args, device=device, probes=probes)
    request = serving.make_request("capture", target, draft, server_args=sized, device=device, probes=probes,
                               atlas=atlas)
    if isinstance(request, ServingFailure):
        return CaptureResult(None, None, None, (request,)), request
    work = Path(tempfile.mkdtemp(prefix="specparity-replay-"))
    try:
        inputs, out = work / "recorded.safetensors", work / "replay.safetensors"
        save_file({f"fc/{i}": f.detach().to("cpu").contiguous() for i, f in enumerate(recorded_fc)}, str(inputs))
        request = dataclasses.replace(request, replay={"inputs": str(inputs), "out": str(out)})
        t0 = time.perf_counter()
        outcome = run_child(request, python=python, timeout_s=timeout_s, progress=progress)
        if isinstance(outcome, ServingFailure):
            return CaptureResult(None, None, None, (outcome,)), outcome
        dep = outcome.deployment
        if dep is not None:
            dep = dataclasses.replace(dep, timings={**dep.timings, "child_wall_s": time.perf_counter() - t0})
        capture = CaptureResult(deployment=dep, fc=outcome.fc, atlas=outcome.atlas, failures=outcome.failures)
        return capture, _read_replay(out, len(probes))
    finally:
        shutil.rmtree(work, ignore_errors=True)
