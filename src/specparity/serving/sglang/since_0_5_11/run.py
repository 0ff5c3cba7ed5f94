"""SGLang 0.5.23 worker start-up and batch driving (the second half of the 0.5.23 glue).

In-process replica of ``Scheduler.init_model_worker()`` (sglang-cpu.md §2 steps 3-16). Two helpers
come from SGLang's own benchmark module (sglang 0.5.23 ``sglang/benchmark/one_batch.py:119, :479``).
"""

from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass
from typing import Any

import torch

from specparity.serving import stand_ins
from specparity.serving.results import LayerAtlas
from specparity.serving.sglang.capture_marks import aux_capture
from specparity.serving.sglang.child_output import split_rows
from specparity.serving.sglang.child_setup import nccl_port
from specparity.serving.sglang.run_common import FcTapBase
from specparity.sources import EMBEDDING, FINAL_NORM, layer
from specparity.testpoints import pause


@dataclass
class Workers:
    """The live SGLang objects of one deployment."""

    server_args: Any
    tp_worker: Any
    spec_worker: Any
    algorithm: Any

    @property
    def target_model(self) -> Any:
        return self.tp_worker.model_runner.model

    @property
    def drafter_model(self) -> Any:
        return self.spec_worker.draft_worker.draft_runner.model


# speculative/draft_utils.py:64 raises this (templates at :115-118 and :150-153) when SGLang has no EAGLE
# backend for the configured attention backend: on CPU, for multi-step draft decode
_NO_EAGLE_BACKEND = "EAGLE is not supported in"


def init_draft_attention(spec_worker: Any) -> None:
    """The spec worker's attention backends; on CPU, where SGLang has none for EAGLE draft decode, the draft
    ModelRunner's own torch_native backend, which is what ``_draft_extend_for_prefill`` runs on (sglang-cpu.md
    §3 deviation 2; draft decode is never reached by a prefill). Only that one ValueError is a fallback, and
    it is recorded as a stand-in; any other error propagates."""
    try:
        spec_worker.init_attention_backends()
    except ValueError as e:
        if _NO_EAGLE_BACKEND not in str(e):
            raise
        stand_ins.record(f"{stand_ins.DRAFT_ATTENTION_FALLBACK} ({e})")
        spec_worker.draft_worker.draft_worker.init_attention_backends()


def start_workers(sa: Any, *, device: str) -> Workers:
    """Target TpModelWorker + EAGLEWorkerV2 + KV pools + attention backends + (eager or CUDA) graphs.

    ``device="cuda"`` (designed, never run here): SGLang's default backends, CUDA graphs on, no
    kernel stand-in, no draft-backend fallback. Should a graph ever replay the prefill draft-extend,
    the fc pre-hook cannot fire inside it, which surfaces as ``fc_not_called``, never as a pass; the
    atlas checks its own width, so a graph captured with the old capture list raises instead of lying.
    """
    from sglang.benchmark.one_batch import _init_process_global_configs
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed import bootstrap
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.runtime_context import get_device
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    port = nccl_port(sa)
    _init_process_global_configs()
    model_config = ModelConfig.from_server_args(sa)
    bootstrap.init_parallel_runtime(server_args=sa, device=get_device().device, dist_port=port)
    bootstrap.init_layer_runtime(model_config=model_config)
    pause("model_load")  # test-only (specparity/testpoints.py): inert unless SPECPARITY_TEST_PAUSE names it
    tp_worker = TpModelWorker(server_args=sa, gpu_id=0, nccl_port=port)
    algo = SpeculativeAlgorithm.from_string(sa.speculative_algorithm)
    spec_worker = algo.create_worker(sa)(
        server_args=sa, gpu_id=0, nccl_port=port, target_worker=tp_worker
    )
    tp_worker.alloc_memory_pool(draft_parallel_layout=spec_worker.draft_parallel_layout)
    pool, allocator = tp_worker.get_memory_pool()
    spec_worker.alloc_memory_pool(
        memory_pool_config=tp_worker.model_runner.memory_pool_config,
        req_to_token_pool=pool,
        token_to_kv_pool_allocator=allocator,
    )
    # The target's set_eagle3_layers_to_capture(ids) runs here (attention_backend_setup.py:40-61).
    tp_worker.init_attention_backends()
    if device == "cpu":
        init_draft_attention(spec_worker)
    else:
        spec_worker.init_attention_backends()
    # Scheduler.init_all_cuda_graphs(): captures graphs on CUDA; installs the eager runners otherwise.
    tp_worker.init_cuda_graphs()
    spec_worker.init_cuda_graphs()
    return Workers(server_args=sa, tp_worker=tp_worker, spec_worker=spec_worker, algorithm=algo)


class FcTap(FcTapBase):
    """Forward pre-hook on the drafter's fc plus a forward hook on the target's decoder stack."""

    def _on_target(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        # models/llama.py:502-505: (hidden, AuxHiddenStateList) when something was captured.
        self.target_calls += 1
        if self.target_calls > 1:
            return
        if isinstance(output, tuple) and len(output) == 2:
            self._keep_aux(output[1])


def _batch(workers: Workers, probes: tuple[tuple[int, ...], ...], *, tag: str, spec: bool) -> Any:
    from sglang.benchmark.one_batch import TreeCacheNamespace
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    pool, allocator = workers.tp_worker.get_memory_pool()
    reqs = []
    for i, ids in enumerate(probes):
        req = Req(
            rid=f"specparity-{tag}-{i}",
            origin_input_text="",
            origin_input_ids=array("q", ids),
            sampling_params=SamplingParams(temperature=0, max_new_tokens=1),
        )
        req.full_untruncated_fill_ids = req.origin_input_ids
        req.logprob_start_len = -1
        req.extend_end = len(req.origin_input_ids)
        reqs.append(req)
    model_runner = workers.tp_worker.model_runner
    tree_cache = TreeCacheNamespace(
        page_size=workers.server_args.page_size or 1,
        device=model_runner.device,
        token_to_kv_pool_allocator=allocator,
    )
    batch = ScheduleBatch.init_new(
        reqs=reqs,
        req_to_token_pool=pool,
        token_to_kv_pool_allocator=allocator,
        tree_cache=tree_cache,
        model_config=model_runner.model_config,
        enable_overlap=False,
        spec_algorithm=workers.algorithm if spec else SpeculativeAlgorithm.NONE,
    )
    batch.prepare_for_extend()
    if batch.input_ids is None and getattr(batch, "prefill_input_ids_cpu", None) is not None:
        # The scheduler's run loop does this move (sglang/benchmark/one_batch.py:516-523 mirrors it).
        batch.input_ids = batch.prefill_input_ids_cpu.to(batch.device)
        batch.prefill_input_ids_cpu = None
    return batch


def spec_prefill(workers: Workers, probes: tuple[tuple[int, ...], ...]) -> Any:
    """All probes as requests of ONE prefill batch through EAGLEWorkerV2 (teacher forcing).

    speculative/eagle_worker_v2.py:1548-1602: target extend with CaptureHiddenMode.FULL, then
    _draft_extend_for_prefill, which runs the drafter and so fc over every prompt token.
    """
    batch = _batch(workers, probes, tag="fc", spec=True)
    with torch.no_grad():
        return workers.spec_worker.forward_batch_generation(batch)


def target_extend(workers: Workers, probes: tuple[tuple[int, ...], ...]) -> torch.Tensor:
    """One FULL-mode target extend (the call EAGLEWorkerV2 makes, eagle_worker_v2.py:1557); hidden states."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    batch = _batch(workers, probes, tag="atlas", spec=False)
    with torch.no_grad():
        out = workers.tp_worker.forward_batch_generation(batch, capture_hidden_mode=CaptureHiddenMode.FULL)
    hidden = out.logits_output.hidden_states
    if hidden is None:
        raise RuntimeError("the target extend returned no hidden states in CaptureHiddenMode.FULL")
    return hidden.detach().clone()


def kernel_stub_active() -> bool:
    """True when the imported ``sgl_kernel`` is specparity's stand-in."""
    mod = sys.modules.get("sgl_kernel")
    return bool(getattr(mod, "SPECPARITY_STUB", False))


def kernel_stub_calls() -> tuple[str, ...]:
    """Every call recorded by the ``sgl_kernel`` stand-in (empty when the real package is used)."""
    mod = sys.modules.get("sgl_kernel")
    return tuple(getattr(mod, "CALLED", ())) if kernel_stub_active() else ()


def layer_atlas(workers: Workers, probes: tuple[tuple[int, ...], ...], lengths: list[int]) -> LayerAtlas:
    """Residual stream at every boundary via SGLang's own capture, after the fc capture.

    Boundaries 0..L-1 go into the target's ``layers_to_capture`` (the loop tests membership,
    models/llama.py:485-493) for one FULL-mode target extend, and boundary L (``layer:L-1``, the final
    pre-norm state) too where the class's loop can capture it (gpt_oss from 0.5.17, models/gpt_oss.py:730-737;
    since_0_5_11.static.BOUNDARY_L_REACHABLE); ``final_norm`` is what the logits processor returns from a
    FULL-mode extend without aux capture (layers/logits_processor.py:865-869). The original capture list is
    restored afterwards.
    """
    from specparity.serving.sglang.since_0_5_11.static import max_reachable_boundary

    target = workers.target_model
    num_layers = int(workers.tp_worker.model_runner.model_config.hf_text_config.num_hidden_layers)
    reach = max_reachable_boundary(type(target).__name__, num_layers)
    with aux_capture(target) as capture:
        capture(range(reach + 1), True)
        stream = target_extend(workers, probes)
        capture([], False)
        normed = target_extend(workers, probes)
    h = int(normed.shape[-1])
    if stream.shape[-1] != (reach + 1) * h:
        raise RuntimeError(f"atlas capture is {stream.shape[-1]} wide, expected {reach + 1}*{h}")
    names = [EMBEDDING, *(layer(i) for i in range(reach))]  # boundary b is layer:b-1 (domain.md §1)
    per_sample: list[dict[str, torch.Tensor]] = []
    for s_rows, n_rows in zip(split_rows(stream, lengths), split_rows(normed, lengths), strict=True):
        entry = {name: s_rows[:, j * h : (j + 1) * h].clone() for j, name in enumerate(names)}
        entry[FINAL_NORM] = n_rows
        per_sample.append(entry)
    return LayerAtlas(per_sample=per_sample, num_layers=num_layers)
