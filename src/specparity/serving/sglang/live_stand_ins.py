"""The CPU stand-ins inside SGLang's own server processes (``python -m sglang.launch_server`` on a machine without
a GPU), each the one the in-process capture already uses, each recorded in the evidence directory when it runs.

A live server is SGLang's code in SGLang's processes: the launcher spawns the scheduler (and detokenizer) as new
interpreters (multiprocessing ``spawn``), so nothing specparity does in its own process reaches them. What does
reach every one of them is the environment: :func:`specparity.serving.sglang.live.hook_switches` puts
``serving/sglang/live_site`` on ``PYTHONPATH``, whose ``sitecustomize.py`` calls :func:`install` at interpreter
start, before anything imports sglang, and only when :data:`ENV_STAND_INS` names the evidence directory.

The stand-ins, on ``cpu`` only (never on a GPU server), each taken only where the release needs it:

1. ``sgl_kernel`` import stand-in (``serving/sglang/kernel_stub``; sglang-cpu.md §3 deviation 1): put first on
   ``sys.path`` only when ``import sgl_kernel`` fails (``worker.install_kernel_stub_if_needed``). With
   ``SGLANG_USE_CPU_ENGINE=1`` SGLang imports it at module load (0.5.23
   ``sglang/kernels/ops/kvcache/cache_move.py:10``) and PyPI has no CPU build. Its calls are recorded in the
   stand-in's ``CALLED`` and reach every evidence record (``live_hooks``); only ``copy_all_layer_kv_cache_cpu``
   (the KV-pool warm-up of slot 0 onto itself) has a body, anything else raises in the server.
2. Draft attention (``stand_ins.DRAFT_ATTENTION_FALLBACK``; sglang-cpu.md §3 deviation 2): the scheduler's
   ``init_all_attention_backends`` (0.5.23 ``managers/scheduler.py:1117``) calls the spec worker's
   ``init_attention_backends`` (``speculative/base_spec_worker.py:371-373`` ->
   ``speculative/eagle_worker_v2.py:284`` -> ``:405``), which raises ``ValueError: EAGLE is not supported in
   decode attention backend torch_native`` (``speculative/draft_utils.py:55-64``: the EAGLE draft-decode backend
   map has no CPU entry). Exactly as ``since_0_5_11.run.init_draft_attention`` does in-process, that one
   ValueError falls back to the draft ModelRunner's own backend, which is what the prefill's draft extend runs on
   (``eagle_worker_v2.py:961-1047`` ``_draft_extend_for_prefill`` -> ``draft_runner.forward``). Draft *decode*
   has no backend then: a request that decodes with speculation fails in SGLang's scheduler (named by
   :func:`specparity.serving.sglang.live.cpu_refusals`).
3. Triton KV-copy launch (``run_common.TRITON_KV_COPY``; 0.5.14 only): ``mem_cache/memory_pool.py:1202``
   ``_init_kv_copy_and_warmup`` launches ``copy_all_layer_kv_cache_tiled`` through Triton, which has no CPU driver
   (``triton/runtime/driver.py:20``). ``run_common.install_kv_copy_stand_in`` routes that one launch to the
   ``sgl_kernel`` stand-in's warm-up copy, as in-process; releases that dispatch on CPU themselves (0.5.2x's
   ``copy_all_layer_kv_cache_func``) are left alone.
4. ``torch.cuda.empty_cache/synchronize`` as no-ops around ``set_embed`` (``stand_ins.CUDA_SYNC_NOOP``; 0.5.14):
   the drafter takes the target's embedding through ``set_embed``, which ends with
   ``torch.cuda.empty_cache(); torch.cuda.synchronize()`` (0.5.14 ``models/llama.py:800-807``, from
   ``speculative/eagle_worker_v2.py:230-231``); they only release CUDA memory, and a torch that sees no GPU raises
   on them. ``run_common._cuda_sync_noop_on_cpu`` (the in-process one) wraps llama's ``set_embed`` and
   ``set_embed_and_head``, only where ``torch.cuda.is_available()`` is false.

Each process that activates a stand-in writes ``<evidence>/stand_ins/<pid>.json`` (atomically): its argv, the
stand-ins, and the ``sgl_kernel`` stand-in's calls so far. This module imports no sglang at import time.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import tempfile
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# the evidence directory the stand-ins record into; unset -> the sitecustomize does nothing at all
ENV_STAND_INS = "SPECPARITY_SGLANG_LIVE_STAND_INS"
SITE_DIR = Path(__file__).resolve().parent / "live_site"
STAND_INS_DIR = "stand_ins"

# speculative/draft_utils.py:64 (templates at :115-118 and :150-153); the same text
# since_0_5_11.run.init_draft_attention falls back on
NO_EAGLE_BACKEND = "EAGLE is not supported in"

_ACTIVE: list[str] = []
_EVIDENCE: Path | None = None


def kernel_stub_calls() -> tuple[str, ...] | None:
    """The ``sgl_kernel`` stand-in's calls in this process; None when the real package (or none) is imported."""
    stub = sys.modules.get("sgl_kernel")
    if stub is None or not getattr(stub, "SPECPARITY_STUB", False):
        return None
    return tuple(getattr(stub, "CALLED", ()))


def active() -> tuple[str, ...]:
    """The stand-ins active in this process, in the order they activated."""
    return tuple(_ACTIVE)


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def record(name: str) -> None:
    """Note that stand-in ``name`` is active in this process and rewrite this process's record file."""
    if name not in _ACTIVE:
        _ACTIVE.append(name)
    flush()


def flush() -> None:
    """Write ``<evidence>/stand_ins/<pid>.json`` (nothing without an evidence directory; never raises)."""
    if _EVIDENCE is None:
        return
    try:
        folder = _EVIDENCE / STAND_INS_DIR
        folder.mkdir(mode=0o700, exist_ok=True)
        calls = kernel_stub_calls()
        _write_atomic(folder / f"{os.getpid()}.json", json.dumps({
            "pid": os.getpid(), "argv": list(sys.argv[:3]), "stand_ins": list(_ACTIVE),
            "kernel_stub_calls": None if calls is None else list(calls)}))
    except OSError:
        pass


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs ``patch(module)`` right after the named module executes (the real loader still loads it)."""

    def __init__(self, patches: dict[str, Callable[[types.ModuleType], None]]) -> None:
        self.patches = dict(patches)

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            original_exec(module)
            try:
                patch(module)
            except Exception as exc:  # a release without the shape the patch knows: no stand-in, SGLang decides
                sys.stderr.write(f"specparity: stand-in for {fullname} not applied: {type(exc).__name__}: {exc}\n")

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def patch_draft_attention(module: types.ModuleType) -> None:
    """``EAGLEWorkerV2.init_attention_backends`` with the in-process fallback (module docstring, 2.)."""
    cls = getattr(module, "EAGLEWorkerV2", None)
    if cls is None or getattr(cls, "_specparity_fallback", False) or not hasattr(cls, "init_attention_backends"):
        return  # before 0.5.11 the worker builds its draft backends in __init__: SGLang's refusal stands
    original = cls.init_attention_backends

    def init_attention_backends(self: Any) -> None:
        try:
            original(self)
        except ValueError as e:
            if NO_EAGLE_BACKEND not in str(e):
                raise
            from specparity.serving.stand_ins import DRAFT_ATTENTION_FALLBACK

            record(f"{DRAFT_ATTENTION_FALLBACK} ({e})")
            # EAGLEWorkerV2.draft_worker (EagleDraftWorker) .draft_worker (the draft TpModelWorker): its own
            # runner's backend, as since_0_5_11.run.init_draft_attention calls it
            self.draft_worker.draft_worker.init_attention_backends()

    cls.init_attention_backends = init_attention_backends
    cls._specparity_fallback = True


def patch_kv_copy(module: types.ModuleType) -> None:
    """The Triton KV-copy launch on CPU (module docstring, 3.): ``run_common.install_kv_copy_stand_in``, the in-process
    capture's own, once ``mem_cache/memory_pool`` has executed; a no-op where the release dispatches on CPU itself."""
    from specparity.serving.sglang.run_common import TRITON_KV_COPY, install_kv_copy_stand_in

    if install_kv_copy_stand_in("cpu"):
        record(TRITON_KV_COPY)


def patch_set_embed(module: types.ModuleType) -> None:
    """``set_embed``/``set_embed_and_head`` under ``run_common._cuda_sync_noop_on_cpu`` (module docstring, 4.), on a
    machine whose torch sees no GPU only."""
    import functools

    import torch

    cls = getattr(module, "LlamaForCausalLM", None)
    if cls is None or torch.cuda.is_available():
        return
    import inspect

    from specparity.serving.sglang.run_common import _cuda_sync_noop_on_cpu

    for name in ("set_embed", "set_embed_and_head"):
        original = cls.__dict__.get(name)
        if original is None or getattr(original, "_specparity_noop", False):
            continue
        try:
            source = inspect.getsource(original)
        except (OSError, TypeError):
            continue
        if "torch.cuda.synchronize" not in source and "torch.cuda.empty_cache" not in source:
            continue  # this release's set_embed asks no CUDA call (0.5.2x): nothing to stand in for

        @functools.wraps(original)
        def wrapped(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            from specparity.serving.stand_ins import CUDA_SYNC_NOOP

            record(CUDA_SYNC_NOOP)
            with _cuda_sync_noop_on_cpu():
                return _original(self, *args, **kwargs)

        wrapped._specparity_noop = True  # type: ignore[attr-defined]
        setattr(cls, name, wrapped)


def install(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """The stand-ins for this process (module docstring); what it activated. Idempotent; a no-op unless
    :data:`ENV_STAND_INS` names an existing directory."""
    global _EVIDENCE
    env = os.environ if environ is None else environ
    where = env.get(ENV_STAND_INS, "")
    if not where or not Path(where).is_dir():
        return ()
    _EVIDENCE = Path(where)
    from specparity.serving.sglang.worker import install_kernel_stub_if_needed
    from specparity.serving.stand_ins import SGL_KERNEL

    if "sgl_kernel" not in sys.modules and install_kernel_stub_if_needed("cpu"):
        _ACTIVE.append(SGL_KERNEL)
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport({"sglang.srt.speculative.eagle_worker_v2": patch_draft_attention,
                                                 "sglang.srt.mem_cache.memory_pool": patch_kv_copy,
                                                 "sglang.srt.models.llama": patch_set_embed}))
    flush()
    return active()
