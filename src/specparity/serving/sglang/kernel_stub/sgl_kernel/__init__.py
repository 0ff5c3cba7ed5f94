"""Import-only stand-in for the CPU build of ``sgl_kernel`` (sglang-cpu.md §3, deviation 1).

Why it exists: with ``SGLANG_USE_CPU_ENGINE=1`` SGLang imports ``sgl_kernel`` at module load
(e.g. sglang 0.5.23 ``sglang/kernels/ops/kvcache/cache_move.py:10``), and the CPU build of that
package is not on PyPI (it is compiled from the sglang repo for AVX-512/AMX). On a CPU without AMX
every layer on the fc-input path takes its pure-torch ``forward_native`` path, so most symbols only
have to exist.

Rules:
- specparity puts this directory on the child's ``sys.path`` ONLY when ``import sgl_kernel`` fails and
  the device is ``cpu``; never on GPU.
- Every call is recorded in :data:`CALLED`; the adapter reports it as ``FcCapture.kernel_stub_calls``.
- Only ``copy_all_layer_kv_cache_cpu`` has a body: the KV-pool warm-up copy SGLang runs before any
  forward (0.5.23 ``mem_cache/memory_pool.py:2304-2307 -> :2420 ->
  sglang/kernels/ops/kvcache/cache_move.py:191``). It copies slot 0 onto itself, a no-op; any call whose
  source and destination slots differ raises (a real KV move would need the real kernel). The
  parent allows no other call (``specparity.serving.stand_ins.KERNEL_STUB_ALLOWED``): the worker turns
  any other recorded call into an environment error.
- Any other op raises ``NotImplementedError`` naming it, so a new kernel on the fc-input path can never
  be silently faked: a test asserts the capture path recorded nothing but the warm-up copy.
- The real package also registers ops under ``torch.ops.sgl_kernel``. A few model files bind some of
  them at import time when ``is_cpu()`` (:data:`IMPORT_TIME_OPS`, e.g. sglang 0.5.23
  ``models/qwen3_5.py:283-297``), so without them the module (and its EAGLE-3 class) cannot even be
  imported. Only those names resolve, to the same raising, recorded stand-in; every other
  ``torch.ops.sgl_kernel`` name stays missing, so ``hasattr`` probes that pick a code path
  (``models/qwen3_moe.py:98``, ``models/utils.py:456``) keep answering False.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

__version__ = "0.0.0+specparity-import-stub"
SPECPARITY_STUB = True
CALLED: list[str] = []


def copy_all_layer_kv_cache_cpu(data_ptrs: Any, strides: Any, tgt_loc: Any, src_loc: Any) -> None:
    """The warm-up copy of KV slots onto themselves: a recorded no-op. Raises unless every destination slot
    equals its source slot, so a real KV move can never run on a stand-in."""
    CALLED.append("copy_all_layer_kv_cache_cpu")
    tgt, src = list(tgt_loc.tolist()), list(src_loc.tolist())
    if tgt != src:
        moved = [(s, t) for t, s in zip(tgt, src, strict=True) if t != s][:4]
        raise NotImplementedError(
            f"sgl_kernel.copy_all_layer_kv_cache_cpu would move KV slots {moved} (source -> destination), but "
            "only specparity's stand-in of sgl_kernel is installed; it only accepts the warm-up copy of slots "
            "onto themselves")


class _Unavailable:
    """A symbol that may be imported and attribute-chained, but raises when called."""

    def __init__(self, name: str) -> None:
        self.__name__ = name

    def __getattr__(self, attr: str) -> _Unavailable:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self.__name__}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        CALLED.append(self.__name__)
        raise NotImplementedError(
            f"sgl_kernel.{self.__name__} was called, but only specparity's import stub of sgl_kernel "
            "is installed (no CPU sgl_kernel build); this op is on the traced path and cannot be faked"
        )


def __getattr__(name: str) -> _Unavailable:
    if name.startswith("__"):
        raise AttributeError(name)
    return _Unavailable(name)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Submodules (``from sgl_kernel.kvcacheio import ...``) import with the same behaviour."""

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = __getattr__  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


sys.meta_path.append(_StubFinder())

# torch.ops.sgl_kernel.<name> read at module import under SGLANG_USE_CPU_ENGINE=1 (sglang 0.5.23):
# models/qwen3_5.py:283-297 (also imported by qwen3_5_mtp, qwen3_5_text, qwen4_exp, minicpm*,
# interns2*, muse_glimmer), models/grok.py:71-73.
IMPORT_TIME_OPS = frozenset({
    "fused_sigmoid_mul_cpu", "fused_qk_gemma_rmsnorm_cpu", "fused_qk_gemma_rmsnorm_with_gate_cpu",
    "fused_qkvzba_split_reshape_cat_contiguous_cpu",
    "fused_moe_router_cpu", "rmsnorm_cpu", "fused_dual_residual_rmsnorm_cpu",
})


def _install_torch_ops_namespace() -> None:
    import torch

    base = type(torch.ops.sgl_kernel)

    class _StubOpNamespace(base):  # type: ignore[misc, valid-type]
        def __getattr__(self, op_name: str) -> Any:
            try:
                return super().__getattr__(op_name)
            except AttributeError:
                if op_name in IMPORT_TIME_OPS:
                    return _Unavailable(f"ops.{op_name}")
                raise

    torch.ops.sgl_kernel = _StubOpNamespace("sgl_kernel")  # type: ignore[attr-defined]


_install_torch_ops_namespace()
