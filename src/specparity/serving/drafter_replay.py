"""SGLang's own drafter on recorded vs served fc inputs, in the same child run as the capture (parent side).

With an :class:`~specparity.serving.results.OutcomeRequest` the capture child runs two more drafter passes
(``serving/sglang/replay_hooks.py``): one on what SGLang's target served, one with fc's input replaced by the
recorded training rows. Both give SGLang's own first-draft logits for every probe row, so one child start
(about 10 s on CPU) serves the capture and the outcome levels. This module sizes the server for those
passes, hands the recorded rows to the child and reads its answer back as a typed
:class:`~specparity.serving.results.DrafterReplay` or :class:`~specparity.serving.results.ServingFailure`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from specparity.serving.results import (
    BAD_DEPLOYMENT,
    NONFINITE,
    SGLANG_EXCEPTION,
    UNSUPPORTED_VERSION,
    DrafterReplay,
    ServingFailure,
)

if TYPE_CHECKING:
    import torch

INPUTS_FILE, OUT_FILE = "recorded.safetensors", "replay.safetensors"


def sized_server_args(server_args: Mapping[str, object] | None, *, device: str,
                      probes: Sequence[Sequence[int]]) -> dict[str, object]:
    """Room for two more prefills of the probes (requests are never freed in the harness); user values win."""
    out = dict(server_args or {})
    total = sum(len(p) for p in probes)
    out.setdefault("max_running_requests", max(48, 5 * len(probes) + 8))
    if device == "cpu":
        out.setdefault("max_total_tokens", max(4096, 6 * total + 256))
    return out


def check_recorded(recorded_fc: Sequence[torch.Tensor], probes: Sequence[Sequence[int]]) -> ServingFailure | None:
    """The recorded fc inputs must match the probes row for row, or the replay means nothing."""
    if len(recorded_fc) != len(probes) or any(int(f.shape[0]) != len(p)
                                              for f, p in zip(recorded_fc, probes, strict=False)):
        return ServingFailure(BAD_DEPLOYMENT, "recorded fc inputs do not match the probes row for row")
    return None


def write_inputs(work: Path, recorded_fc: Sequence[torch.Tensor]) -> dict[str, str]:
    """The recorded rows for the child; returns the request's ``replay`` field (``{"inputs", "out"}``)."""
    from safetensors.torch import save_file

    inputs, out = work / INPUTS_FILE, work / OUT_FILE
    save_file({f"fc/{i}": f.detach().to("cpu").contiguous() for i, f in enumerate(recorded_fc)}, str(inputs))
    return {"inputs": str(inputs), "out": str(out)}


def read_replay(out: Path, n: int, *, capture_failures: Sequence[ServingFailure] = ()) -> DrafterReplay | ServingFailure:
    """What the child's replay wrote (replay_hooks' status protocol: ``<out>.json`` + the logits).

    No status at all: where the capture itself failed before any forward (family A refuses the capture level),
    that failure is why there is no replay, so it is returned as is rather than a second, vaguer one.
    """
    from safetensors.torch import load_file

    status_path = Path(str(out) + ".json")
    if not status_path.is_file():
        if capture_failures:
            return capture_failures[0]
        return ServingFailure(UNSUPPORTED_VERSION, "this SGLang adapter ran no drafter replay, so the engine's own "
                                                   "acceptance figures are missing")
    status = json.loads(status_path.read_text())
    if not status.get("ok"):
        return ServingFailure(SGLANG_EXCEPTION, f"drafter replay failed: {status.get('error')}\n"
                                                f"{status.get('traceback', '')}")
    tensors = load_file(str(out))
    bad = sorted(k for k, t in tensors.items() if t.is_floating_point() and not bool(t.isfinite().all()))
    if bad:
        return ServingFailure(NONFINITE, f"SGLang's drafter produced NaN/Inf logits ({', '.join(bad[:4])}"
                                         f"{', ...' if len(bad) > 4 else ''}): its acceptance cannot be measured")
    return DrafterReplay(
        served_logits=[tensors[f"served/{i}"] for i in range(n)],
        recorded_logits=[tensors[f"recorded/{i}"] for i in range(n)],
        hot_token_id=tensors.get("hot_token_id"), passes=dict(status.get("passes", {})))
