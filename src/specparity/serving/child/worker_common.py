"""What both engines' children share: the job they are given, their progress lines, and two readings of what
they were handed or produced (the draft checkpoint's ``fc``, non-finite tensors).

Engine-neutral: no engine is imported here, and neither engine's room imports the other's; each worker
(``serving/sglang/worker.py``, ``serving/vllm/worker.py``) and the parent side (``process.py``, ``run.py``)
take these from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
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


@dataclass(frozen=True)
class FcShape:
    """``fc`` as stored in the draft checkpoint."""

    in_features: int
    out_features: int
    bias: bool
    weight_key: str


def _safetensors_keys(path: Path) -> dict[str, Any]:
    """The header of a safetensors file (no tensor data read); a broken file is an InputError naming it."""
    from specparity.checkpoint_files import read_safetensors_header

    return read_safetensors_header(path, field="draft weights")


def checkpoint_shapes(draft_dir: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape for every weight file of a draft checkpoint, reading headers only.

    The files are the ones SGLang loads (specparity.checkpoint_files: shards named by an index, no
    ``training_args.bin`` or other trainer state, which ``weights_only`` could not unpickle anyway). A file that
    cannot be read that way (empty, truncated, a directory, a symlink loop, a pickle of more than tensors) is an
    :class:`~specparity.errors.InputError` naming it (the gate refuses those before the engine starts:
    ``checkpoint_files.check_weight_files``).
    """
    from specparity.checkpoint_files import weight_files

    shapes: dict[str, tuple[int, ...]] = {}
    for f in weight_files(draft_dir).files:
        if f.suffix == ".safetensors":
            for k, v in _safetensors_keys(f).items():
                shapes[k] = tuple(int(x) for x in v["shape"])
            continue
        import torch

        from specparity.checkpoint_files import check_pickled_weights

        state = check_pickled_weights(f, field="draft weights")
        for k, t in state.items():
            if isinstance(t, torch.Tensor):
                shapes[k] = tuple(int(x) for x in t.shape)
    return shapes


def fc_shape_from_checkpoint(draft_dir: Path) -> FcShape | None:
    """``fc`` in/out features and bias from the checkpoint; ``None`` when there is no ``fc.weight``.

    Name rule as SGLang's loader sees it (sglang 0.5.23 models/llama_eagle3.py:338-353): the key is
    ``fc.weight`` with an optional module prefix (``model.fc.weight``); ``fc_norm.*`` is a different module.
    """
    shapes = checkpoint_shapes(draft_dir)
    candidates = sorted(k for k in shapes if k == "fc.weight" or k.endswith(".fc.weight"))
    if not candidates:
        return None
    key = min(candidates, key=len)
    out_f, in_f = shapes[key][0], shapes[key][1]
    return FcShape(
        in_features=in_f, out_features=out_f, bias=key[: -len("weight")] + "bias" in shapes, weight_key=key
    )


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
