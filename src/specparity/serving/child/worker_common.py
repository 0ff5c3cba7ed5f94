"""What both engines' children share: the job they are given, their progress lines, and a reading of what they
produced (non-finite tensors); the draft checkpoint's ``fc`` shape is :mod:`specparity.checkpoint_files`'.

Engine-neutral: no engine is imported here, and neither engine's room imports the other's; each worker
(``serving/sglang/worker.py``, ``serving/vllm/worker.py``) and the parent side (``process.py``, ``run.py``)
take these from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specparity.serving.results import NONFINITE, ServingFailure

# a progress line on the child's stdout: "@@specparity-progress DONE TOTAL" (process.py reads it)
PROGRESS_PREFIX = "@@specparity-progress"


def report_progress(done: int, total: int) -> None:
    """One progress line for the parent (:data:`PROGRESS_PREFIX`)."""
    print(f"{PROGRESS_PREFIX} {done} {total}", flush=True)


@dataclass(frozen=True)
class WorkerRequest:
    """One job for the child process (travels as JSON). ``server_args`` are the engine's own keywords
    (SGLang's server arguments, vLLM's engine arguments)."""

    op: str  # "resolve" | "capture"
    target: str
    draft: str
    server_args: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    probes: tuple[tuple[int, ...], ...] = ()
    atlas: bool = True
    replay: dict[str, str] | None = None  # specparity.replay: {"inputs", "out"} (sglang/replay_hooks.py)
    # vLLM's reduced evidence: {"recorded": <safetensors with fc/<i>>, "expected", "rtol"} (vllm/tap_reduce.py)
    reduce: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "target": self.target, "draft": self.draft,
                "server_args": dict(self.server_args), "device": self.device,
                "probes": [list(p) for p in self.probes], "atlas": self.atlas, "replay": self.replay,
                "reduce": self.reduce}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WorkerRequest:
        return cls(op=str(d["op"]), target=str(d["target"]), draft=str(d["draft"]),
                   server_args=dict(d.get("server_args") or {}), device=str(d.get("device", "cpu")),
                   probes=tuple(tuple(int(x) for x in p) for p in d.get("probes", [])),
                   atlas=bool(d.get("atlas", True)), replay=d.get("replay"), reduce=d.get("reduce"))


def nonfinite_failures(per_sample: Sequence[Any], *, what: str) -> list[ServingFailure]:
    """One ``nonfinite`` failure per sample whose tensor holds NaN or Inf."""
    import torch

    out: list[ServingFailure] = []
    for i, t in enumerate(per_sample):
        bad = ~torch.isfinite(t)
        if bool(bad.any()):
            n = int(bad.sum())
            row = int(bad.any(dim=-1).nonzero()[0, 0]) if t.dim() > 1 else 0
            out.append(
                ServingFailure(NONFINITE, f"{what} has {n} NaN/Inf value(s), first at row {row}", sample=i)
            )
    return out
