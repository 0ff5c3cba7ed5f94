"""The capture level's shared SGLang pieces, used by both families' runs (``since_0_4_4``, ``since_0_5_11``): the
CUDA-sync no-op for a CPU torch, the benchmark's tree-cache stand-in, the embedding tap on decoder layer 0 and the
Triton KV-copy stand-in (each a documented stand-in: :mod:`specparity.serving.stand_ins` records every use); the
fc tap's common part and what every capture does once its engine is up (:func:`capture_forward`).
Runs only inside the child process.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from specparity.serving import stand_ins
from specparity.serving.child.worker_common import WorkerRequest, nonfinite_failures
from specparity.serving.results import (
    FC_NOT_CALLED,
    CaptureResult,
    FcCapture,
    LayerAtlas,
    ResolvedDeployment,
    ServingFailure,
)
from specparity.serving.sglang.adapter import Progress
from specparity.serving.sglang.child_output import judge_fc_capture, split_rows
from specparity.serving.sglang.engine_messages import exception_failure
from specparity.testpoints import pause


def fc_sizes(fc: Any) -> tuple[int, int]:
    """fc's (in, out) widths: ``torch.nn.Linear``'s ``in_features``/``out_features``, or SGLang's parallel linear
    layers' whole ``input_size``/``output_size`` (``layers/linear.py`` ``LinearBase``), which the MLA EAGLE-3 head
    builds its fc as (sglang 0.5.23 ``models/kimi_k25_eagle3.py:212-219``, a ``ColumnParallelLinear``)."""
    width = getattr(fc, "in_features", None)
    out = getattr(fc, "out_features", None)
    return (int(width if width is not None else fc.input_size), int(out if out is not None else fc.output_size))


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


class FcTapBase:
    """Forward pre-hook on the drafter's fc plus a forward hook on the target's decoder stack.

    Each family's ``FcTap`` says in ``_on_target`` which target call's aux hidden states it keeps
    (:meth:`_keep_aux`); the fc inputs are every call's.
    """

    def __init__(self, fc: torch.nn.Module, target_inner: torch.nn.Module) -> None:
        self.fc_inputs: list[torch.Tensor] = []
        self.aux_count = 0
        self.aux_packed: torch.Tensor | None = None
        self.target_calls = 0
        self._handles = [fc.register_forward_pre_hook(self._on_fc),
                         target_inner.register_forward_hook(self._on_target)]

    def _on_fc(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        self.fc_inputs.append(args[0].detach().clone())

    def _on_target(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        raise NotImplementedError

    def _keep_aux(self, aux_states: Any) -> None:
        """The aux hidden states the target returned beside its hidden states, concatenated as fc sees them."""
        aux = list(aux_states)
        self.aux_count = len(aux)
        if aux:
            self.aux_packed = torch.cat([t.detach() for t in aux], dim=-1).clone()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def capture_forward(request: WorkerRequest, deployment: ResolvedDeployment, *, target: Any, drafter: Any,
                    tap_class: Callable[[torch.nn.Module, torch.nn.Module], FcTapBase],
                    prefill: Callable[[], object], layer_atlas: Callable[[list[int]], LayerAtlas],
                    stub_calls: Callable[[], tuple[str, ...]], stub_active: Callable[[], bool],
                    timings: dict[str, float], t0: float, progress: Progress,
                    found: Sequence[ServingFailure] = ()) -> CaptureResult:
    """A capture once the engine is up and ``deployment`` read from it: the spec prefill of every probe in one
    batch (``prefill``) with fc tapped, judged; then the layer atlas and, where asked, the drafter replay.

    ``found``: what the family found wrong at start-up, listed after the fc judgement. ``timings`` is the
    deployment's own; ``t0`` the start of the capture (``total_s``).
    """
    steps = 3 if request.atlas else 2
    lengths = [len(p) for p in request.probes]
    failures = list(found)
    fc_mod = drafter.model.fc
    t1 = time.perf_counter()
    tap = tap_class(fc_mod, target.model)
    raised: ServingFailure | None = None
    pause("capture")  # test-only (specparity/testpoints.py): inert unless SPECPARITY_TEST_PAUSE names it
    try:
        if sum(lengths) > 0:
            prefill()
    except Exception as exc:
        raised = exception_failure(exc, prefix="during the prefill forward: ")
    finally:
        tap.remove()
    timings["fc_forward_s"] = time.perf_counter() - t1
    first = tap.fc_inputs[0] if tap.fc_inputs else None
    judged = judge_fc_capture(
        hook_calls=len(tap.fc_inputs), rows=None if first is None else int(first.shape[0]),
        width=None if first is None else int(first.shape[-1]), expected_rows=sum(lengths),
        expected_width=fc_sizes(fc_mod)[0], aux_captured=tap.aux_count,
        aux_expected=deployment.num_aux_hidden_states, fc_applied=deployment.fc_applied,
        target_ran=tap.target_calls > 0)
    # SGLang's own exception comes first; "fc never called" would only restate a forward that died before the
    # drafter (e.g. boundary 0 on llama before 0.5.22, D9); what the hooks did see, e.g. a short count, is kept.
    failures[:0] = judged if raised is None else [raised, *(f for f in judged if f.kind != FC_NOT_CALLED)]
    fc: FcCapture | None = None
    if first is not None and int(first.shape[0]) == sum(lengths):
        per_sample = split_rows(first, lengths)
        aux = split_rows(tap.aux_packed, lengths) if tap.aux_packed is not None else []
        fc = FcCapture(per_sample=per_sample, dtype=str(first.dtype).removeprefix("torch."),
                       engine_version=deployment.engine_version, hook_calls=len(tap.fc_inputs),
                       aux_states_captured=tap.aux_count, aux_states_expected=deployment.num_aux_hidden_states,
                       kernel_stub_calls=stub_calls(), aux_per_sample=aux, kernel_stub_active=stub_active())
        failures.extend(nonfinite_failures(per_sample, what="fc input"))
    progress(2, steps)
    atlas: LayerAtlas | None = None
    if request.atlas and sum(lengths) > 0:
        t2 = time.perf_counter()
        try:
            atlas = layer_atlas(lengths)
            failures.extend(nonfinite_failures(
                [torch.stack(list(s.values())) for s in atlas.per_sample], what="layer atlas"))
        except Exception as exc:
            failures.append(exception_failure(exc, prefix="during the atlas forward: "))
        timings["atlas_forward_s"] = time.perf_counter() - t2
        progress(3, steps)
    if request.replay and sum(lengths) > 0:  # specparity.replay (outcome): drafter on recorded vs served fc
        if raised is None:
            from specparity.serving.sglang.replay_hooks import run_replay

            run_replay(drafter, request.replay, probes=request.probes, prefill=prefill)
        else:  # the same prefill would raise again; say so in replay_hooks' status protocol
            Path(str(request.replay["out"]) + ".json").write_text(json.dumps(
                {"ok": False, "passes": {}, "error": f"not run: the capture prefill failed ({raised.message})"}))
    if fc is not None:  # the stub list is final only after every forward
        fc.kernel_stub_calls = stub_calls()
    timings["total_s"] = time.perf_counter() - t0
    return CaptureResult(deployment=deployment, fc=fc, atlas=atlas, failures=tuple(failures))


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
