"""Runner start-up and batch driving for SGLang before the worker-v2 API (0.4.10.post2, 0.5.3).

These versions have no TpModelWorker/EAGLEWorkerV2/runtime-context API of the 0.5.23 shape, so the
harness builds two real ``ModelRunner`` objects (target, then the draft sharing the target's KV pools)
and mirrors ``EAGLEWorker.forward_target_extend`` / ``forward_draft_extend`` by hand (sglang 0.5.3
``speculative/eagle_worker.py:500-527, :975-1005``; 0.4.10.post2 the same methods). The ModelRunners,
models, aux capture, concatenation and the drafter are SGLang's own code; only the two short worker
methods are re-typed here (sglang-cpu.md §9, the fourth deviation). Runs only in the child process.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from specparity.serving.sglang.run_common import FcTapBase, _cuda_sync_noop_on_cpu, tree_cache_namespace


@dataclass(frozen=True)
class LegacyGlue:
    """What differs between the pre-worker-v2 versions this module drives."""

    version_label: str
    # EagleDraftInput: speculative.eagle_utils (<= 0.5.1), speculative.eagle_info (>= 0.5.3), domain.md §6
    draft_input_module: str
    # ScheduleBatch.init_new keywords beyond the common ones (0.4.10.post2 managers/schedule_batch.py:913)
    batch_extra_kwargs: dict[str, Any] = field(default_factory=dict)
    # sglang 0.4.10.post2 srt/utils.py:217 reads a torch attribute removed in torch 2.13
    torch_drift: bool = False
    # where the target's ModelRunner reads the draft ids (bare except -> None), for messages
    ids_reader_cite: str = ""
    # where layer 0 computes hidden_states + residual with residual None (boundary 0), for messages
    boundary0_crash_cite: str = ""
    # where the drafter builds fc = Linear(3*H_t, H_d) regardless of the config (D5), for messages
    fc_build_cite: str = ""


@dataclass
class Runners:
    """The live SGLang objects of one deployment."""

    server_args: Any
    target_runner: Any
    draft_runner: Any
    setter_calls: list[tuple[int, ...] | None]

    @property
    def target_model(self) -> Any:
        return self.target_runner.model

    @property
    def drafter_model(self) -> Any:
        return self.draft_runner.model


@contextmanager
def record_setter_calls(cls: type[Any]) -> Iterator[list[tuple[int, ...] | None]]:
    """Record the argument of every ``cls.set_eagle3_layers_to_capture`` call, then call SGLang's own.

    In these versions the target's ``ModelRunner.initialize`` reads the draft ids itself and passes them
    straight to the setter (0.5.3 ``model_executor/model_runner.py:450-470``; 0.4.10.post2 ``:346-366``),
    keeping them nowhere else; the argument is the only record of "the ids SGLang read".
    """
    calls: list[tuple[int, ...] | None] = []
    had_own = "set_eagle3_layers_to_capture" in cls.__dict__
    original = cls.set_eagle3_layers_to_capture

    def recording(self: Any, layer_ids: Any = None) -> Any:
        calls.append(None if layer_ids is None else tuple(int(x) for x in layer_ids))
        return original(self, layer_ids)

    cls.set_eagle3_layers_to_capture = recording
    try:
        yield calls
    finally:
        if had_own:
            cls.set_eagle3_layers_to_capture = original
        else:
            delattr(cls, "set_eagle3_layers_to_capture")


def target_class(model_config: Any) -> type[Any]:
    """The class SGLang instantiates for ``model_config`` (``model_loader/utils.py:82``, both versions)."""
    from sglang.srt.model_loader.utils import get_model_architecture

    cls, _ = get_model_architecture(model_config)
    return cls


def start_runners(sa: Any) -> Runners:
    """Target ModelRunner, then the draft ModelRunner on the target's pools (sglang-cpu.md §9 steps 3-5)."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.server_args import PortArgs

    port_args = PortArgs.init_new(sa)
    common = {"mem_fraction_static": sa.mem_fraction_static, "gpu_id": 0, "tp_rank": 0, "tp_size": 1,
              "moe_ep_rank": 0, "moe_ep_size": 1, "pp_rank": 0, "pp_size": 1,
              "nccl_port": port_args.nccl_port, "server_args": sa}
    target_config = ModelConfig.from_server_args(sa)
    with record_setter_calls(target_class(target_config)) as calls:
        target_runner = ModelRunner(model_config=target_config, **common)
    draft_config = ModelConfig.from_server_args(sa, model_path=sa.speculative_draft_model_path,
                                                is_draft_model=True)
    # The late family B sizes the draft's pools from the target's (0.5.10 speculative/eagle_worker.py:155 passes
    # memory_pool_config=target_worker.model_runner.memory_pool_config; model_runner_kv_cache_mixin.py:894-897
    # asserts it for a draft worker); passed iff the installed ModelRunner takes it.
    pool_config = ({"memory_pool_config": target_runner.memory_pool_config}
                   if "memory_pool_config" in inspect.signature(ModelRunner.__init__).parameters else {})
    draft_runner = ModelRunner(model_config=draft_config, is_draft_worker=True,
                               req_to_token_pool=target_runner.req_to_token_pool,
                               token_to_kv_pool_allocator=target_runner.token_to_kv_pool_allocator, **common,
                               **pool_config)
    # == EAGLEWorker.__init__ (0.5.3 speculative/eagle_worker.py:143-154; 0.4.10.post2 :139-142): the EAGLE-3
    # drafter's embed_tokens is the target's (SpecForge checkpoints carry none); without this step the
    # drafter embeds its inputs with whatever torch.empty left in the parameter (NaN draft logits seen on
    # 0.4.10.post2). fc sits before the embedding is used, so the fc capture never depended on it.
    embed, head = target_runner.model.get_embed_and_head()
    drafter = draft_runner.model
    with _cuda_sync_noop_on_cpu():
        if getattr(drafter, "load_lm_head_from_target", False):  # 0.5.3 only: a draft without draft_vocab_size
            drafter.set_embed_and_head(embed, head)
        else:
            drafter.set_embed(embed)
    return Runners(server_args=sa, target_runner=target_runner, draft_runner=draft_runner, setter_calls=calls)


def _batch(runners: Runners, probes: tuple[tuple[int, ...], ...], glue: LegacyGlue, *, spec: bool) -> Any:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    reqs = []
    for i, ids in enumerate(probes):
        req = Req(rid=f"specparity-{i}", origin_input_text="", origin_input_ids=list(ids),
                  sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
        # What Scheduler.get_new_batch_prefill sets through init_next_round_input (no prefix cache).
        req.fill_ids = req.origin_input_ids
        req.logprob_start_len = len(req.origin_input_ids) - 1
        if hasattr(req, "set_extend_input_len"):  # 0.5.10: Req starts with an empty prefix tensor
            req.set_extend_input_len(len(req.fill_ids) - len(req.prefix_indices))  # bench_one_batch.py:388-390
        else:  # 0.5.3 / 0.4.10.post2: plain fields (schedule_batch.py:811 / :741 reset prefix_indices to [])
            req.prefix_indices = []
            req.extend_input_len = len(req.fill_ids)
        reqs.append(req)
    tr = runners.target_runner
    namespace = tree_cache_namespace()  # as the installed bench_one_batch builds its batches
    tree_cache = (None if namespace is None else
                  namespace(page_size=runners.server_args.page_size or 1, device=tr.device,
                            token_to_kv_pool_allocator=tr.token_to_kv_pool_allocator))
    batch = ScheduleBatch.init_new(
        reqs=reqs, req_to_token_pool=tr.req_to_token_pool, token_to_kv_pool_allocator=tr.token_to_kv_pool_allocator,
        tree_cache=tree_cache, model_config=tr.model_config, enable_overlap=False,
        spec_algorithm=SpeculativeAlgorithm.EAGLE3 if spec else SpeculativeAlgorithm.NONE,
        **glue.batch_extra_kwargs)
    batch.prepare_for_extend()
    return batch


def _logits_output(out: Any) -> Any:
    # ModelRunner.forward returns (LogitsProcessorOutput | PPProxyTensors, can_run_graph) in 0.4.10.post2/0.5.3,
    # a ModelRunnerOutput dataclass holding them in 0.5.10 (model_executor/model_runner.py:280-283).
    if hasattr(out, "logits_output"):
        return out.logits_output
    return out[0] if isinstance(out, tuple) else out


def spec_prefill(runners: Runners, probes: tuple[tuple[int, ...], ...], glue: LegacyGlue) -> None:
    """All probes in ONE prefill batch: target extend (FULL capture), then the draft extend that calls fc."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch

    draft_input_cls = importlib.import_module(glue.draft_input_module).EagleDraftInput
    batch = _batch(runners, probes, glue, spec=True)
    tr, dr = runners.target_runner, runners.draft_runner
    with torch.no_grad():
        # == EAGLEWorker.forward_target_extend (0.5.3 speculative/eagle_worker.py:514-526)
        mwb = batch.get_model_worker_batch()
        mwb.capture_hidden_mode = CaptureHiddenMode.FULL
        fb = ForwardBatch.init_new(mwb, tr)
        logits_output = _logits_output(tr.forward(fb))
        next_ids = tr.sample(logits_output, fb)
        # == EAGLEWorker.forward_draft_extend (0.5.3 speculative/eagle_worker.py:989-1005)
        # the per-request token counts are *_per_batch in 0.5.3/0.4.10.post2, *_per_req in 0.5.10
        # (speculative/eagle_worker.py:896-901): named as the installed EagleDraftInput names them
        per = "req" if "num_tokens_per_req" in inspect.signature(draft_input_cls).parameters else "batch"
        batch.spec_info = draft_input_cls(hidden_states=logits_output.hidden_states, verified_id=next_ids,
                                          **{f"num_tokens_per_{per}": 1, f"num_tokens_for_logprob_per_{per}": 1})
        batch.return_hidden_states = False
        batch.spec_info.prepare_for_extend(batch)
        batch.spec_info.capture_hidden_mode = CaptureHiddenMode.LAST
        mwb = batch.get_model_worker_batch(seq_lens_cpu_cache=mwb.seq_lens_cpu)
        fb = ForwardBatch.init_new(mwb, dr)
        fb.return_logprob = False
        dr.forward(fb)


def target_extend(runners: Runners, probes: tuple[tuple[int, ...], ...], glue: LegacyGlue) -> torch.Tensor:
    """One FULL-mode target extend (the call forward_target_extend makes); the stored hidden states."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch

    batch = _batch(runners, probes, glue, spec=False)
    tr = runners.target_runner
    with torch.no_grad():
        mwb = batch.get_model_worker_batch()
        mwb.capture_hidden_mode = CaptureHiddenMode.FULL
        fb = ForwardBatch.init_new(mwb, tr)
        hidden = _logits_output(tr.forward(fb)).hidden_states
    if hidden is None:
        raise RuntimeError("the target extend returned no hidden states in CaptureHiddenMode.FULL")
    return hidden.detach().clone()


class FcTap(FcTapBase):
    """Forward pre-hook on the drafter's fc plus a forward hook on the target's decoder stack.

    The target hook sees ``(hidden, aux_hidden_states)`` from ``LlamaModel.forward`` when something was
    captured (0.5.3 ``models/llama.py:359-362``), the list the logits processor concatenates in FULL mode
    (0.5.3 ``layers/logits_processor.py:355-359``).
    """

    def _on_target(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        self.target_calls += 1
        if self.aux_packed is not None:
            return
        if isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], list | tuple):
            self._keep_aux(output[1])
