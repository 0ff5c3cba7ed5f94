"""Worker-v2 start-up and batches for SGLang families C and D (0.5.11-0.5.21), by feature detection.

Same sequence as the 0.5.23 glue (:mod:`.since_0_5_11.run`, ``Scheduler.init_model_worker``): target
``TpModelWorker``, ``EAGLEWorkerV2``, KV pools, attention backends, graphs; the difference is what the
installed SGLang has, detected here, never its version number:

- process set-up: ``runtime_context.publish`` + ``bootstrap`` (0.5.2x) or nothing (0.5.14: ``ModelRunner``
  initialises torch.distributed itself and calls ``set_global_server_args_for_scheduler``,
  ``model_executor/model_runner.py:526``) -- :func:`.since_0_5_11.adapter.publish_style`;
- constructor keywords of ``TpModelWorker`` / ``EAGLEWorkerV2`` (0.5.14 ``managers/tp_worker.py:228-244``
  needs the rank keywords): :func:`call_with_accepted`; 0.5.20 takes one ``ParallelState`` instead
  (``managers/tp_worker.py:315-320``, ``ps``), built as SGLang's one-rank state: :func:`parallel_state_kwargs`;
- the KV pools: 0.5.20's ``Scheduler.init_memory_pools`` first accounts the preloaded weights, then lands the
  retraction backend before the draft's HiCache plan (``managers/scheduler.py:1056-1084``):
  :func:`alloc_memory_pools` runs each step this SGLang has;
- where the runner keeps the ids it read: ``spec_aux_config`` (0.5.16+) or the ``ModelRunner`` attribute
  (0.5.14 ``model_executor/model_runner.py:458-472``) -- :func:`runner_ids`;
- FULL capture for a target extend: a ``capture_hidden_mode`` argument (0.5.2x) or the batch's attribute
  (0.5.14 ``speculative/eagle_worker_v2.py:1072-1079``); a request's extend length: ``extend_end`` (0.5.23),
  ``set_extend_range`` (0.5.20 ``managers/schedule_batch.py:1484``) or ``fill_len`` + ``set_extend_input_len``
  (0.5.14 ``managers/schedule_batch.py:1525``);
- ``TreeCacheNamespace``: ``sglang.benchmark.one_batch`` or ``sglang.bench_one_batch`` (0.5.14 ``:439``);
- the KV-copy kernel: 0.5.2x dispatches to ``sgl_kernel.copy_all_layer_kv_cache_cpu`` on CPU
  (``kernels/ops/kvcache/cache_move.py:190``); 0.5.14 launches the Triton kernel
  ``copy_all_layer_kv_cache_tiled`` unconditionally (``mem_cache/memory_pool.py:1202, :1584``), which has no CPU
  driver. On CPU only, :func:`install_kv_copy_stand_in` routes that one name to the ``sgl_kernel`` stand-in's
  ``copy_all_layer_kv_cache_cpu`` (recorded in its ``CALLED`` list; it refuses any real move) and records the
  stand-in (``serving/stand_ins.py``). Its only call on our path is the pool warm-up, copying slot 0 onto
  itself (``memory_pool.py:1200-1211``) before any forward, so it never touches a hidden state.

Runs only inside the child process.
"""

from __future__ import annotations

import inspect
from array import array
from collections.abc import Callable
from typing import Any

import torch

from specparity.serving.results import LayerAtlas
from specparity.serving.sglang.capture_marks import aux_capture
from specparity.serving.sglang.child_output import split_rows
from specparity.serving.sglang.child_setup import nccl_port
from specparity.serving.sglang.run_common import (
    _cuda_sync_noop_on_cpu,
    install_kv_copy_stand_in,
    tree_cache_namespace,
)
from specparity.serving.sglang.since_0_5_11.run import Workers, init_draft_attention
from specparity.sources import EMBEDDING, FINAL_NORM, layer

RANK_KWARGS = {"tp_rank": 0, "moe_ep_rank": 0, "pp_rank": 0, "attn_cp_rank": 0, "moe_dp_rank": 0, "dp_rank": None}


def call_with_accepted(fn: Callable[..., Any], **kwargs: Any) -> Any:
    """Call ``fn`` with the keywords its signature names (the others are this release's additions/removals)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(**kwargs)
    return fn(**{k: v for k, v in kwargs.items() if k in params})


def parallel_state_kwargs(worker_cls: Any) -> dict[str, Any]:
    """``{"ps": ParallelState}`` where the worker takes one (0.5.20 ``managers/tp_worker.py:315-320``), else {}.

    Rank 0 of a one-rank world, as ``sglang.benchmark.one_batch.load_model`` builds it for tp_size 1 (0.5.20
    ``benchmark/one_batch.py:329-349``: every rank 0 and size 1, ``dp_rank``/``moe_dp_rank`` None), through
    SGLang's own ``ParallelState.trivial`` (``distributed/parallel_state_wrapper.py:28-50``).
    """
    if "ps" not in inspect.signature(worker_cls).parameters:
        return {}
    from sglang.srt.distributed.parallel_state_wrapper import ParallelState

    return {"ps": ParallelState.trivial(dp_rank=None, moe_dp_rank=None)}


def _retraction_backup() -> Callable[..., Any] | None:
    """``kv_cache_builder.resolve_decode_retraction_backup`` where this SGLang has it (0.5.20), else None."""
    try:
        from sglang.srt.mem_cache import kv_cache_builder
    except ImportError:
        return None
    fn: Callable[..., Any] | None = getattr(kv_cache_builder, "resolve_decode_retraction_backup", None)
    return fn


def alloc_memory_pools(tp_worker: Any, spec_worker: Any) -> None:
    """``Scheduler.init_memory_pools`` for a target and an EAGLE worker, each step where this SGLang has it."""
    layout = getattr(spec_worker, "draft_parallel_layout", None)
    if layout is not None:  # 0.5.23 managers/scheduler.py: the draft's layout sizes the target pool
        tp_worker.alloc_memory_pool(draft_parallel_layout=layout)
    else:
        runner = tp_worker.model_runner
        if hasattr(runner, "account_preloaded_weights"):  # 0.5.20 managers/scheduler.py:1065-1069
            runner.account_preloaded_weights(int(getattr(tp_worker, "preloaded_weights_bytes", 0))
                                             + int(getattr(spec_worker, "preloaded_weights_bytes", 0)))
        tp_worker.alloc_memory_pool()
    pool, allocator = tp_worker.get_memory_pool()
    land_retraction_backend = _retraction_backup()
    if land_retraction_backend is not None:  # 0.5.20 managers/scheduler.py:1076
        land_retraction_backend(tp_worker=tp_worker)
    spec_worker.alloc_memory_pool(memory_pool_config=tp_worker.model_runner.memory_pool_config,
                                  req_to_token_pool=pool, token_to_kv_pool_allocator=allocator)
    if hasattr(spec_worker, "init_hicache_draft_plan"):  # 0.5.20 managers/scheduler.py:1084
        spec_worker.init_hicache_draft_plan()


def runner_ids(model_runner: Any) -> Any:
    """The draft ids the target's runner read (``None``: SGLang took its default path)."""
    spec = getattr(model_runner, "spec_aux_config", None)
    if spec is not None:
        return spec.eagle_aux_hidden_state_layer_ids
    return getattr(model_runner, "eagle_aux_hidden_state_layer_ids", None)


def _tree_cache_namespace() -> Any:
    namespace = tree_cache_namespace()
    if namespace is not None:
        return namespace
    raise ImportError("no TreeCacheNamespace in sglang.benchmark.one_batch or sglang.bench_one_batch")


def start_workers(sa: Any, *, device: str) -> Workers:
    """:func:`_start_workers`; without a GPU, ``torch.cuda.empty_cache/synchronize`` are no-ops meanwhile.

    EagleDraftWorker.alloc_memory_pool -> init_lm_head hands the drafter the target's embedding through
    ``set_embed``, which ends with ``torch.cuda.empty_cache(); torch.cuda.synchronize()`` (0.5.14
    ``speculative/eagle_worker_v2.py:230-231``, ``models/llama.py:800-807``); they only release CUDA memory,
    as for the pre-worker-v2 families (``since_0_4_4.run._cuda_sync_noop_on_cpu``).
    """
    if device != "cpu":
        return _start_workers(sa, device=device)
    with _cuda_sync_noop_on_cpu():
        return _start_workers(sa, device=device)


def _start_workers(sa: Any, *, device: str) -> Workers:
    """Target TpModelWorker + EAGLEWorkerV2 + pools + attention backends + graphs (0.5.14 ``managers/
    scheduler.py:859-872``: init_tp_model_worker, maybe_init_draft_worker, init_memory_pools,
    init_all_attention_backends, init_all_cuda_graphs)."""
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    install_kv_copy_stand_in(device)
    port = nccl_port(sa)
    common = {"server_args": sa, "gpu_id": 0, "nccl_port": port, **RANK_KWARGS,
              **parallel_state_kwargs(TpModelWorker)}
    tp_worker = call_with_accepted(TpModelWorker, **common)
    algo = SpeculativeAlgorithm.from_string(sa.speculative_algorithm)
    spec_worker = call_with_accepted(algo.create_worker(sa), target_worker=tp_worker, **common)
    alloc_memory_pools(tp_worker, spec_worker)
    tp_worker.init_attention_backends()  # the target's aux capture was set in ModelRunner init (ids first)
    if device == "cpu":
        init_draft_attention(spec_worker)  # the recorded fallback of since_0_5_11.run (same message in 0.5.14)
    else:
        spec_worker.init_attention_backends()
    tp_worker.init_cuda_graphs()
    spec_worker.init_cuda_graphs()
    return Workers(server_args=sa, tp_worker=tp_worker, spec_worker=spec_worker, algorithm=algo)


def _batch(workers: Workers, probes: tuple[tuple[int, ...], ...], *, tag: str, spec: bool) -> Any:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    pool, allocator = workers.tp_worker.get_memory_pool()
    reqs = []
    for i, ids in enumerate(probes):
        req = Req(rid=f"specparity-{tag}-{i}", origin_input_text="", origin_input_ids=array("q", ids),
                  sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
        req.full_untruncated_fill_ids = req.origin_input_ids
        req.logprob_start_len = -1
        if hasattr(req, "set_extend_range"):  # 0.5.20 benchmark/one_batch.py:428-430, schedule_batch.py:1484
            req.set_extend_range(len(req.prefix_indices), len(req.origin_input_ids))
        elif hasattr(req, "set_extend_input_len"):  # 0.5.14 bench_one_batch.py:428-431
            req.fill_len = len(req.full_untruncated_fill_ids)
            req.set_extend_input_len(req.fill_len - len(req.prefix_indices))
        else:
            req.extend_end = len(req.origin_input_ids)
        reqs.append(req)
    model_runner = workers.tp_worker.model_runner
    tree_cache = _tree_cache_namespace()(page_size=workers.server_args.page_size or 1, device=model_runner.device,
                                         token_to_kv_pool_allocator=allocator)
    batch = ScheduleBatch.init_new(reqs=reqs, req_to_token_pool=pool, token_to_kv_pool_allocator=allocator,
                                   tree_cache=tree_cache, model_config=model_runner.model_config,
                                   enable_overlap=False,
                                   spec_algorithm=workers.algorithm if spec else SpeculativeAlgorithm.NONE)
    batch.prepare_for_extend()
    if batch.input_ids is None and getattr(batch, "prefill_input_ids_cpu", None) is not None:
        batch.input_ids = batch.prefill_input_ids_cpu.to(batch.device)  # bench_one_batch.py:474-480
        batch.prefill_input_ids_cpu = None
    return batch


def spec_prefill(workers: Workers, probes: tuple[tuple[int, ...], ...]) -> Any:
    """All probes in ONE prefill batch through EAGLEWorkerV2: target extend (FULL), then the draft extend."""
    batch = _batch(workers, probes, tag="fc", spec=True)
    with torch.no_grad():
        return workers.spec_worker.forward_batch_generation(batch)


def target_extend(workers: Workers, probes: tuple[tuple[int, ...], ...]) -> torch.Tensor:
    """One FULL-mode target extend, as EAGLEWorkerV2's prefill runs it; the stored hidden states."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    batch = _batch(workers, probes, tag="atlas", spec=False)
    fwd = workers.tp_worker.forward_batch_generation
    with torch.no_grad():
        if "capture_hidden_mode" in inspect.signature(fwd).parameters:
            out = fwd(batch, capture_hidden_mode=CaptureHiddenMode.FULL)
        else:
            batch.capture_hidden_mode = CaptureHiddenMode.FULL
            out = fwd(batch)
    hidden = out.logits_output.hidden_states
    if hidden is None:
        raise RuntimeError("the target extend returned no hidden states in CaptureHiddenMode.FULL")
    return hidden.detach().clone()


def layer_atlas(workers: Workers, probes: tuple[tuple[int, ...], ...], lengths: list[int], *,
                embedding_capturable: bool) -> LayerAtlas:
    """Residual stream at every boundary via SGLang's own capture (as :func:`.since_0_5_11.run.layer_atlas`).

    Boundary 0 (``embedding``) crashes llama-style loops before 0.5.22 (D9), so there it is read by a
    pre-hook on decoder layer 0 in the same forward (:class:`.since_0_4_4.run.EmbeddingTap`).
    """
    from specparity.serving.sglang.run_common import EmbeddingTap

    target = workers.target_model
    num_layers = int(workers.tp_worker.model_runner.model_config.hf_text_config.num_hidden_layers)
    first = 0 if embedding_capturable else 1
    emb = None if embedding_capturable else EmbeddingTap(target.model.layers[0])
    try:
        with aux_capture(target) as capture:
            capture(range(first, num_layers), True)
            stream = target_extend(workers, probes)
            capture([], False)
            normed = target_extend(workers, probes)
    finally:
        if emb is not None:
            emb.remove()
    h = int(normed.shape[-1])
    if stream.shape[-1] != (num_layers - first) * h:
        raise RuntimeError(f"atlas capture is {stream.shape[-1]} wide, expected {num_layers - first}*{h}")
    names = [layer(i) for i in range(num_layers - 1)]
    if embedding_capturable:
        names = [EMBEDDING, *names]
    elif emb is None or len(emb.inputs) != 2 or emb.inputs[0].shape[0] != sum(lengths):
        raise RuntimeError("layer 0's input was not seen once per atlas forward")
    per_sample: list[dict[str, torch.Tensor]] = []
    emb_rows = split_rows(emb.inputs[0], lengths) if emb is not None else [None] * len(lengths)
    for e_rows, s_rows, n_rows in zip(emb_rows, split_rows(stream, lengths), split_rows(normed, lengths),
                                      strict=True):
        entry = {} if e_rows is None else {EMBEDDING: e_rows}
        entry.update({name: s_rows[:, j * h:(j + 1) * h].clone() for j, name in enumerate(names)})
        entry[FINAL_NORM] = n_rows
        per_sample.append(entry)
    return LayerAtlas(per_sample=per_sample, num_layers=num_layers)
