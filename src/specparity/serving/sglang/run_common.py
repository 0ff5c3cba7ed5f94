"""The capture level's shared SGLang pieces, used by both families' runs (``since_0_4_4``, ``since_0_5_11``): the
CUDA-sync no-op for a CPU torch, the benchmark's tree-cache stand-in, the embedding tap on decoder layer 0 and the
Triton KV-copy stand-in. Each is a documented stand-in (:mod:`specparity.serving.stand_ins` records every use).
Runs only inside the child process.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from specparity.serving import stand_ins


@contextmanager
def _cuda_sync_noop_on_cpu() -> Iterator[None]:
    """``set_embed``/``set_embed_and_head`` end with ``torch.cuda.empty_cache(); torch.cuda.synchronize()``
    (0.5.3 ``models/llama.py:709-710, :724-725``; 0.4.10.post2 ``:722-723, :737-738``), which a CPU torch
    rejects; they only release CUDA memory, so on a CPU-only torch they become no-ops for the call."""
    if torch.cuda.is_available():
        yield
        return
    stand_ins.record(stand_ins.CUDA_SYNC_NOOP)
    saved = (torch.cuda.empty_cache, torch.cuda.synchronize)
    setattr(torch.cuda, "empty_cache", lambda: None)  # noqa: B010 (module attribute, restored below)
    setattr(torch.cuda, "synchronize", lambda device=None: None)  # noqa: B010
    try:
        yield
    finally:
        setattr(torch.cuda, "empty_cache", saved[0])  # noqa: B010
        setattr(torch.cuda, "synchronize", saved[1])  # noqa: B010


def tree_cache_namespace() -> Any | None:
    """The benchmark's stand-in tree cache class where this SGLang's bench has one (0.5.10
    ``bench_one_batch.py:396``, 0.5.14 ``:439``, 0.5.23 ``benchmark/one_batch``), else None: 0.5.3 and 0.4.10.post2
    build their batches with ``tree_cache=None`` (``bench_one_batch.py:266``, ``:244``); 0.5.10's
    ``ScheduleBatch.maybe_evict_swa`` calls ``tree_cache.supports_swa()`` (``managers/schedule_batch.py:2425``)."""
    for name in ("sglang.benchmark.one_batch", "sglang.bench_one_batch"):
        try:
            return importlib.import_module(name).TreeCacheNamespace
        except (ImportError, AttributeError):
            continue
    return None


class EmbeddingTap:
    """Forward pre-hook on decoder layer 0: its ``hidden_states`` input is the ``embedding`` boundary.

    Boundary 0 cannot go through ``layers_to_capture`` on these versions: layer 0 computes
    ``hidden_states + residual`` with ``residual = None`` (0.5.3 ``models/llama.py:340``; 0.4.10.post2
    ``:332``), so the atlas reads the same tensor where SGLang hands it to layer 0
    (``LlamaDecoderLayer.forward(positions, hidden_states, forward_batch, residual)``).
    """

    def __init__(self, layer0: torch.nn.Module) -> None:
        self.inputs: list[torch.Tensor] = []
        self._handle = layer0.register_forward_pre_hook(self._on_call)

    def _on_call(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        self.inputs.append(args[1].detach().clone())

    def remove(self) -> None:
        self._handle.remove()


TRITON_KV_COPY = ("Triton KV-copy launch on CPU: memory_pool.copy_all_layer_kv_cache_tiled runs the sgl_kernel "
                  "stand-in's copy_all_layer_kv_cache_cpu (warm-up only; run_common.install_kv_copy_stand_in)")


class _TiledKvCopyOnCpu:
    """``copy_all_layer_kv_cache_tiled[grid](data_ptrs, strides, tgt, src, n, upper, ...)`` on CPU."""

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(data_ptrs: Any, strides: Any, tgt_loc: Any, src_loc: Any, num_locs: int, *_: Any,
                   **__: Any) -> None:
            import sys

            stub = sys.modules.get("sgl_kernel")
            if not getattr(stub, "SPECPARITY_STUB", False):
                raise RuntimeError("the CPU KV-copy stand-in needs specparity's sgl_kernel stand-in")
            n = int(num_locs)
            # the stand-in's own op: records itself, and refuses any real move (only the warm-up may run)
            stub.copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc[:n], src_loc[:n])  # type: ignore[union-attr]

        return launch


def install_kv_copy_stand_in(device: str) -> bool:
    """On CPU, where ``memory_pool`` launches the Triton KV-copy kernel directly (0.5.14), swap in the CPU copy."""
    if device != "cpu":
        return False
    from sglang.srt.mem_cache import memory_pool

    if hasattr(memory_pool, "copy_all_layer_kv_cache_func") or not hasattr(memory_pool,
                                                                             "copy_all_layer_kv_cache_tiled"):
        return False  # 0.5.2x: SGLang's own CPU dispatch
    memory_pool.copy_all_layer_kv_cache_tiled = _TiledKvCopyOnCpu()
    stand_ins.record(TRITON_KV_COPY)
    return True
