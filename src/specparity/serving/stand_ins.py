"""The stand-ins a child may activate, recorded so that every report lists them (docs/development.md "Stand-ins").

A stand-in replaces or bypasses a piece of SGLang's environment (never its model code) where the CPU child
cannot run the real one. Each is documented in docs/development.md with a test, and each that activates calls
:func:`record`; the worker puts the list on the deployment (``ResolvedDeployment.stand_ins``), and the
gate on the verdict. The ``sgl_kernel`` import stand-in (serving/sglang/kernel_stub) may only be *called*
for the ops in :data:`KERNEL_STUB_ALLOWED`: any other recorded call fails the run as an environment error.
"""

from __future__ import annotations

from collections.abc import Iterable

# sgl_kernel ops the stand-in may execute: the KV-pool warm-up copy of slot 0 onto itself (sglang 0.5.23
# mem_cache/memory_pool.py:2304-2307 -> kernels/ops/kvcache/cache_move.py:191), which the stand-in
# refuses for any other slots
KERNEL_STUB_ALLOWED = frozenset({"copy_all_layer_kv_cache_cpu"})

SGL_KERNEL = "sgl_kernel import stand-in (no CPU sgl_kernel build; serving/sglang/kernel_stub)"
CUDA_SYNC_NOOP = ("torch.cuda.empty_cache/synchronize as no-ops around set_embed (CPU-only torch; "
                  "run_common._cuda_sync_noop_on_cpu)")
DRAFT_ATTENTION_FALLBACK = ("draft attention: SGLang has no CPU EAGLE draft-decode backend; the draft "
                            "ModelRunner's own backend serves the prefill (since_0_5_11.run.init_draft_attention)")

_ACTIVE: list[str] = []


def record(name: str) -> None:
    """Note that stand-in ``name`` was active in this process (once per name)."""
    if name not in _ACTIVE:
        _ACTIVE.append(name)


def active() -> tuple[str, ...]:
    """The stand-ins recorded in this process, in the order they first activated."""
    return tuple(_ACTIVE)


def kernel_stub_violations(calls: Iterable[str]) -> list[str]:
    """Recorded ``sgl_kernel`` stand-in calls outside :data:`KERNEL_STUB_ALLOWED`, sorted and unique."""
    return sorted({c for c in calls if c not in KERNEL_STUB_ALLOWED})
