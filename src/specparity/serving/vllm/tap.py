"""The ``vllm.general_plugins`` tap: what vLLM's own workers feed the drafter's ``fc``, per rank.

vLLM loads every ``vllm.general_plugins`` entry point in every process it starts, the engine core and
each tensor-parallel worker included (``vllm/plugins/__init__.py:77``). :func:`register` does nothing
unless :data:`ENV_DIR` names a directory, so the same plugin can sit in a production server's venv.
When enabled it wraps the model runner's ``load_model`` (``vllm/v1/worker/cpu_model_runner.py:62-78``,
``gpu_model_runner.py``), and once the target and the drafter are loaded installs, in that worker:

- a forward pre-hook on the drafter's ``fc`` (called from ``combine_hidden_states``,
  ``vllm/model_executor/models/llama_eagle3.py:397-418``): every call, prefill and every verify step,
  is written to ``<dir>/rank<r>/<n>.safetensors`` at once (a crash later keeps what was seen);
- with :data:`ENV_ATLAS` set, a wrapper on the target's ``_maybe_add_hidden_state``
  (``vllm/model_executor/models/interfaces.py:1601-1611``), the very function that picks the aux states,
  called at every boundary ``0..L`` of the layer loop (``models/llama.py:428-441``) with the values vLLM
  would capture (``hidden_states + residual``), plus a forward hook on the target's final ``norm``
  (``llama.py:452``). The boundaries of the target forward that preceded an fc call go into that call's file.

``<dir>/rank<r>/meta.json`` says what was installed (or that the worker built no drafter / no fc).
The tap never changes a tensor: hooks only clone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ENV_DIR = "SPECPARITY_VLLM_TAP"
ENV_ATLAS = "SPECPARITY_VLLM_TAP_ATLAS"
_MARK = "_specparity_tap_wrapped"


def _rank() -> int:
    import torch.distributed as dist

    return int(dist.get_rank()) if dist.is_available() and dist.is_initialized() else 0


def _inner_target(model: Any) -> Any:
    # the EagleModelMixin holder, unwrapped as set_aux_hidden_state_layers does (interfaces.py:1689-1710)
    parent = model.get_language_model() if hasattr(model, "get_language_model") else model
    return getattr(parent, "model", parent)


class _Tap:
    """Per-worker state: counters and the boundaries of the last target forward."""

    def __init__(self, out: Path, atlas: bool) -> None:
        self.out, self.atlas_on, self.calls = out, atlas, 0
        self.atlas: dict[str, Any] = {}

    def boundary(self, index: int, value: Any) -> None:
        if index == 0:
            self.atlas = {}
        self.atlas[f"b{index}"] = value.detach().to("cpu").clone()

    def final_norm(self, out: Any) -> None:
        t = out[0] if isinstance(out, tuple) else out
        self.atlas["final_norm"] = t.detach().to("cpu").clone()

    def fc_call(self, x: Any) -> None:
        from safetensors.torch import save_file

        tensors = {"fc": x.detach().to("cpu").contiguous().clone()}
        if self.atlas_on:
            tensors.update({f"atlas/{k}": v.contiguous() for k, v in self.atlas.items()})
        self.atlas = {}
        self.calls += 1
        tmp = self.out / f"{self.calls:06d}.tmp"
        save_file(tensors, str(tmp))
        tmp.replace(self.out / f"{self.calls:06d}.safetensors")


def install(runner: Any, directory: str, *, atlas: bool) -> dict[str, Any]:
    """Install the hooks on one loaded model runner; returns (and writes) what was installed."""
    rank = _rank()
    out = Path(directory) / f"rank{rank}"
    out.mkdir(parents=True, exist_ok=True)
    tap = _Tap(out, atlas)
    meta: dict[str, Any] = {"rank": rank, "pid": os.getpid(), "drafter": None, "fc": None, "aux_layers": None}
    target = _inner_target(runner.model)
    meta["aux_layers"] = [int(b) for b in getattr(target, "aux_hidden_state_layers", ())]
    meta["num_layers"] = len(getattr(target, "layers", ()))
    drafter = getattr(runner, "drafter", None)
    if drafter is not None:
        meta["drafter"] = type(drafter).__name__
        fc = getattr(getattr(getattr(drafter, "model", None), "model", None), "fc", None)
        if fc is not None:
            # vLLM's linear layers keep their logical sizes (model_executor/layers/linear.py, LinearBase)
            meta["fc"] = {"type": type(fc).__name__, "in_features": int(getattr(fc, "input_size", -1)),
                          "out_features": int(getattr(fc, "output_size", -1)),
                          "bias": getattr(fc, "bias", None) is not None}
            fc.register_forward_pre_hook(lambda _m, args: tap.fc_call(args[0]))
    if atlas and hasattr(target, "_maybe_add_hidden_state"):
        original = target._maybe_add_hidden_state

        def recording(aux: Any, layer_idx: int, hidden: Any, residual: Any) -> Any:
            tap.boundary(int(layer_idx), hidden + residual if residual is not None else hidden)
            return original(aux, layer_idx, hidden, residual)

        target._maybe_add_hidden_state = recording
        norm = getattr(target, "norm", None)
        if norm is not None:
            norm.register_forward_hook(lambda _m, _a, o: tap.final_norm(o))
    (out / "meta.json").write_text(json.dumps(meta))
    return meta


def _wrap(cls: type) -> None:
    original = cls.__dict__.get("load_model")
    if original is None or getattr(original, _MARK, False):
        return

    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        directory = os.environ.get(ENV_DIR)
        if directory:
            install(self, directory, atlas=bool(os.environ.get(ENV_ATLAS)))
        return result

    setattr(load_model, _MARK, True)
    load_model.__doc__ = original.__doc__
    cls.load_model = load_model  # type: ignore[attr-defined]


def register() -> None:
    """The entry point (``vllm.general_plugins``): inactive unless ``SPECPARITY_VLLM_TAP`` is set."""
    if not os.environ.get(ENV_DIR):
        return
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    _wrap(GPUModelRunner)
    try:
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    except ImportError:  # a GPU-only build
        return
    _wrap(CPUModelRunner)
