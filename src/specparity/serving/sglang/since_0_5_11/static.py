"""SGLang 0.5.23 static resolution on real model objects, on the meta device (no weights, no memory).

The target and the draft are built the way SGLang's own loader builds them: ``ModelConfig`` from the
resolved ``ServerArgs``, the class from SGLang's model registry (``model_loader/utils.py:198-240``),
constructed by ``model_loader/loader.py:285-313`` ``_initialize_model`` under
``set_default_torch_dtype`` and ``torch.device("meta")``, which is exactly what SGLang itself does to
build its structural signature (``model_loader/loader.py:1880-1915``). Then the real
``set_eagle3_layers_to_capture`` runs on the real object, through whatever delegation the class has
(Kimi-K2.5 ``models/kimi_k25.py:928-939``, Llama-4 ``models/mllama4.py:971-973``, ...), and we read
back what it stored. No fake ``self``, no source grepping.

Interface for other version families: :func:`init_single_rank`, :func:`build_meta_model`
and :func:`read_capture` take SGLang objects and return plain data; only the import paths inside them
are 0.5.23-specific. This module imports sglang: use it only inside the serving child process.
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from specparity.checkpoint_files import fc_shape_from_checkpoint
from specparity.drafters import SGLANG_ALGORITHM, DrafterFamily, family_of
from specparity.serving.engine_values import decode_args
from specparity.serving.results import UNSUPPORTED_VERSION, ResolvedDeployment, ServingFailure
from specparity.serving.sglang import model_modules
from specparity.serving.sglang.child_setup import nccl_port
from specparity.serving.sglang.drafter_facts import with_applied_norms
from specparity.serving.sglang.engine_messages import (
    collect_sglang_warnings,
    exception_failure,
    gpu_query_failure,
    unknown_architecture_failure,
)
from specparity.serving.sglang.meta_build import (
    HARDWARE_FALLBACKS,
    draft_shape,
    one_rank_build_kw,
    read_capture,
)
from specparity.serving.sglang.setter_source import SetterTrace
from specparity.serving.sglang.since_0_5_11.static_families import (
    build_server_args,
    dflash_facts,
    family_notes,
)

# The layer loop reaches boundary L (the entry of the final norm) only in these classes:
# sglang 0.5.23 models/gpt_oss.py:730-737 and models/minimax_m3.py:1955-1963 capture when end_layer is
# listed; every other loop tests `i in layers_to_capture` for i < end_layer (models/llama.py:485-493).
BOUNDARY_L_REACHABLE = frozenset(
    {"GptOssForCausalLM", "MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration"}
)


_PARALLEL_READY = False


def init_single_rank(server_args: Any, *, model_config: Any) -> None:
    """SGLang's own process set-up for rank 0 of a one-rank world, as its CPU path runs it.

    Same calls as ``Scheduler.init_model_worker()`` up to the model load (sglang-cpu.md §2 steps 3-6):
    ``runtime_context.publish``, the process-global MoE and GEMM configs, ``PortArgs.init_new``,
    ``bootstrap.init_parallel_runtime`` (gloo, CPU) and ``bootstrap.init_layer_runtime``. The parallel
    groups can be built once per process (``distributed/bootstrap.py:102-112``); later calls in the
    same process re-publish and keep the groups (all one-rank worlds are alike).
    """
    global _PARALLEL_READY
    from sglang.srt.distributed import bootstrap
    from sglang.srt.layers.moe import initialize_moe_config
    from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
    from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
    from sglang.srt.layers.quantization.unquant import initialize_bf16_gemm_config
    from sglang.srt.runtime_context import SpawnRanks, publish
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, gpu_id=0))
    # The four functions benchmark/one_batch.py:119-128 (_init_process_global_configs) and the scheduler
    # (managers/scheduler.py:1008-1013) call, imported from their own modules: one_batch's module imports the
    # whole run-time stack (ModelRunner, the engine entrypoint, schedule_batch), which no meta build needs
    initialize_moe_config()
    initialize_fp8_gemm_config()
    initialize_bf16_gemm_config()
    initialize_fp4_gemm_config()
    if not _PARALLEL_READY:
        bootstrap.init_parallel_runtime(server_args=server_args, device="cpu", dist_port=nccl_port(server_args))
        _PARALLEL_READY = True
    bootstrap.init_layer_runtime(model_config=model_config)


def _load_config(server_args: Any) -> Any:
    # model_runner.py:1286-1296 builds it with build_load_config (load_model_utils.py:200-240).
    from sglang.srt.model_executor.model_runner_components.load_model_utils import build_load_config
    from sglang.srt.runtime_context import get_model

    return build_load_config(
        server_args=server_args,
        tp_rank=0,
        remote_instance_weight_transporter_engine=None,
        remote_instance_weight_transporter_session_id="",
        draft_model_idx=None,
        weight_cache_mode=get_model().weight_cache_mode,
        weight_cache_socket=None,
    )


def build_meta_model(model_config: Any, *, server_args: Any) -> torch.nn.Module:
    """The model class SGLang's loader picks for ``model_config``, constructed on the meta device.

    As ``model_loader/loader.py:1890-1896``: quantization config, default dtype, ``torch.device("meta")``,
    ``_initialize_model``. Rotary caches SGLang memoised on meta are dropped afterwards, as its own
    signature code does (``loader.py:1880-1888``), so a later real load in this process is unaffected.
    """
    from sglang.srt.layers.rotary_embedding.factory import _ROPE_DICT
    from sglang.srt.model_loader.loader import _get_quantization_config, _initialize_model
    from sglang.srt.model_loader.utils import set_default_torch_dtype

    load_config = _load_config(server_args)
    if getattr(server_args, "device", None) == "cpu":
        # model_runner.py:1301-1304: on CPU the runner adds the *_cpu head counts some files read
        # (models/qwen3_5.py:377) before it loads
        from sglang.srt.configs.update_config import adjust_config_with_unaligned_cpu_tp

        model_config = adjust_config_with_unaligned_cpu_tp(model_config, load_config, 1)
    try:
        quant_config = _get_quantization_config(model_config, load_config)
        with set_default_torch_dtype(model_config.dtype), torch.device("meta"):
            model: torch.nn.Module = _initialize_model(model_config, load_config, quant_config)
    finally:
        for key in [k for k, v in _ROPE_DICT.items()
                    if any(t.device.type == "meta" for t in (*v.parameters(), *v.buffers()))]:
            del _ROPE_DICT[key]
    return model


def setter_call(ids: list[int] | None) -> Callable[[torch.nn.Module], None]:
    """``configure`` for :func:`read_capture`: the plain ``model.set_eagle3_layers_to_capture(ids)``."""

    def call(model: torch.nn.Module) -> None:
        model.set_eagle3_layers_to_capture(None if ids is None else list(ids))  # type: ignore[operator]

    return call


def max_reachable_boundary(model_class: str, num_layers: int) -> int:
    """The largest boundary the class's layer loop can capture (see :data:`BOUNDARY_L_REACHABLE`)."""
    return num_layers if model_class in BOUNDARY_L_REACHABLE else num_layers - 1


def static_server_args_kwargs(request: Any) -> dict[str, Any]:
    """ServerArgs keywords for the static level: the deployment's own args, nothing for this CPU.

    The capture level's CPU overrides (torch_native, float32, no CUDA graphs) do not apply here: the
    speculative auto-parameters and per-architecture validations (``arg_groups/model_hook.py:515-543``
    for gpt-oss) depend on device, backend and dtype. ``device`` defaults to ``cuda``, where SGLang
    deployments run; SGLang's own auto-detection would describe this machine instead.
    """
    # the user's values as SGLang's parser made them (serving/engine_values.py)
    kw: dict[str, Any] = {"log_level": "warning", "device": "cuda", **decode_args(request.server_args)}
    kw.update(model_path=request.target, speculative_draft_model_path=request.draft,
              speculative_algorithm=request.server_args.get("speculative_algorithm")
              or SGLANG_ALGORITHM[draft_family(request.draft)])
    return kw


def draft_family(draft: str) -> DrafterFamily:
    """The drafter family of the draft's config.json (specparity.drafters), which picks the algorithm SGLang serves
    it with when the deployment names none."""
    try:
        cfg = json.loads((Path(draft) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return DrafterFamily.EAGLE3
    return family_of(cfg) if isinstance(cfg, dict) else DrafterFamily.EAGLE3


def _server_args(kw: dict[str, Any]) -> tuple[Any, list[str]]:
    from sglang.srt.server_args import ServerArgs

    with collect_sglang_warnings() as warnings:
        sa = ServerArgs(**kw)
        sa.resolve_once()
    return sa, list(warnings)


def resolve_static(adapter: Any, request: Any) -> ResolvedDeployment | ServingFailure:
    """The static level on 0.5.23: resolved ServerArgs, real meta-device target and draft, real setter.

    ``adapter`` is the 0.5.23 :class:`~specparity.serving.sglang.since_0_5_11.core.Adapter` (its ``_deployment``
    assembles the record shared with the capture level).
    """
    from specparity.serving.sglang.draft_format import unreadable_draft

    bad = unreadable_draft(Path(request.draft))
    if bad is not None:
        return bad
    t0 = time.perf_counter()
    model_modules.limit_registry(model_modules.architectures(request.target, request.draft))
    try:
        import sglang.srt.server_args  # noqa: F401  (timed apart: the import dominates on 2 cores)
    except Exception as exc:
        return exception_failure(exc, prefix="importing sglang: ")
    ti = time.perf_counter()
    notes: list[str] = []
    resolved = _resolved_server_args(static_server_args_kwargs(request), notes)
    if isinstance(resolved, ServingFailure):
        return resolved
    sa, warnings, kw = resolved
    t1 = time.perf_counter()
    try:
        built = _meta_build(sa, kw, notes)
    except OwnDSparkSetter as exc:
        return exc.failure()
    except Exception as exc:  # SGLang raising while building is a typed result, not a crash
        return (gpu_query_failure(exc, stage="while building the models on the meta device")
                or unknown_architecture_failure(exc, target=request.target, sglang_version=adapter.sglang_version,
                                                prefix="while resolving: ")
                or exception_failure(exc, prefix="while resolving: "))
    t2 = time.perf_counter()
    timings = {"sglang_import_s": ti - t0, "server_args_s": t1 - ti, "resolve_s": t2 - t1, "total_s": t2 - t0,
               "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               "registry_limited": float(model_modules.subset_in_use())}
    return _record(adapter, request, sa, warnings, built, notes, timings)


class OwnDSparkSetter(Exception):
    """A DSpark drafter over a target with a DSpark setter of its own: refused by name (exit 3). SGLang calls the
    target's ``set_dspark_layers_to_capture`` instead of its DFlash setter (sglang 0.5.23
    model_executor/model_runner_components/attention_backend_setup.py:63-64); those setters (models/kimi_k3.py,
    models/deepseek_v4.py, models/kimi_linear.py, models/minimax_m3_vl.py, models/bailing_moe_v3.py) store the ids
    in places and conventions the read-back here does not model, so an answer read as for the DFlash setter could be
    a confident wrong one."""

    def __init__(self, target_class: str) -> None:
        super().__init__(target_class)
        self.target_class = target_class

    def failure(self) -> ServingFailure:
        return ServingFailure(UNSUPPORTED_VERSION, (
            f"the target {self.target_class} has its own set_dspark_layers_to_capture, which SGLang calls for a "
            "DSpark drafter (sglang 0.5.23 model_executor/model_runner_components/attention_backend_setup.py:63-64); "
            "specparity models DSpark only over targets that take DFlash's setter, so nothing was checked "
            "(docs/engines.md, drafter families)"))


def _resolved_server_args(kw: dict[str, Any], notes: list[str]) -> tuple[Any, list[str], dict[str, Any]] | \
        ServingFailure:
    """SGLang's ``ServerArgs`` for the deployment, resolved (with its warnings and the keywords that built it), or
    its refusal. A validation that reads the platform cannot pass for ``device=cuda`` on a machine without the GPU:
    there the args are resolved with the first of :data:`HARDWARE_FALLBACKS` SGLang takes, and a note says so."""
    try:
        sa, warnings = _server_args(kw)
        return sa, warnings, kw
    except Exception as exc:
        refusal = exception_failure(exc, prefix="SGLang refuses the deployment's server args: ")
        if kw.get("device") != "cuda" or torch.cuda.is_available():
            return gpu_query_failure(exc, stage="while resolving the server args") or refusal
        # A validation that reads the platform (e.g. arg_groups/mamba_hook.py:113-121 asks whether this
        # machine snapshots Mamba state) cannot pass on a machine without the deployment's GPU: say so,
        # and resolve what can be resolved on this machine's platform, as SGLang's CPU path would.
        for fallback in HARDWARE_FALLBACKS:
            try:
                sa, warnings = _server_args({**kw, **fallback})
            except Exception:
                continue
            shown = ", ".join(f"{k}={v}" for k, v in fallback.items())
            raised = exception_failure(exc).message
            notes.append(f"hardware check skipped: with device=cuda SGLang raised '{raised}', which "
                         f"needs a GPU this machine lacks; server args were resolved with {shown}, so the "
                         "speculative settings shown follow SGLang's defaults for that")
            return sa, warnings, {**kw, **fallback}
        return gpu_query_failure(exc, stage="while resolving the server args") or refusal


@dataclass(frozen=True)
class _Built:
    """What the meta-device build gives: SGLang's aux-state config, the deployed model config, the target and its
    setter's reading, the draft's config, module and shape."""

    spec: Any
    deployed_config: Any
    target: Any
    setting: Any
    rule: Any
    draft_mc: Any
    draft_model: Any
    draft: Any


def _meta_build(sa: Any, kw: dict[str, Any], notes: list[str]) -> _Built:
    """Target and draft built on the meta device as SGLang builds them for one rank, and SGLang's own setter run on
    the target (as TpModelWorker.init_attention_backends calls it, attention_backend_setup.py:40-61). Raises what
    SGLang raises."""
    from sglang.srt.arg_groups.model_override_base import resolved_view
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_executor.model_runner_components.attention_backend_setup import (
        configure_aux_hidden_state_capture,
    )
    from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (
        resolve_spec_aux_hidden_state_config,
    )
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    build_sa = sa
    build_kw, wide = one_rank_build_kw(sa, kw, notes)
    if kw.get("device") == "cuda" and not torch.cuda.is_available():
        # Model constructors may create CUDA streams (runtime_context.py:990-1004): the meta build
        # publishes this machine's device, with the attention backend SGLang resolved for the deployment
        view = resolved_view(sa)
        build_kw.update(device="cpu", attention_backend=view.attention_backend)
    if wide or build_kw.get("device") != kw.get("device"):
        build_sa = build_server_args(sa, build_kw, _server_args, notes)
    deployed_config = ModelConfig.from_server_args(sa)
    model_config = deployed_config if build_sa is sa else ModelConfig.from_server_args(build_sa)
    init_single_rank(build_sa, model_config=model_config)
    spec = resolve_spec_aux_hidden_state_config(
        server_args=build_sa,
        model_config=model_config,
        is_draft_worker=False,
        spec_algorithm=SpeculativeAlgorithm.from_string(build_sa.speculative_algorithm),
    )
    target = model_modules.build_as_full_registry(build_meta_model, model_config, server_args=build_sa)
    if spec.is_dspark and hasattr(target, "set_dspark_layers_to_capture"):  # the condition of :63
        raise OwnDSparkSetter(type(target).__name__)
    setting = read_capture(target, rule := SetterTrace(lambda m: configure_aux_hidden_state_capture(
        model=m,
        eagle_use_aux_hidden_state=spec.eagle_use_aux_hidden_state,
        eagle_aux_hidden_state_layer_ids=spec.eagle_aux_hidden_state_layer_ids,
        dflash_use_aux_hidden_state=spec.dflash_use_aux_hidden_state,
        dflash_target_layer_ids=spec.dflash_target_layer_ids,
        is_dspark=spec.is_dspark,
    )))
    draft_mc = spec.draft_model_config
    draft_model = model_modules.build_as_full_registry(build_meta_model, draft_mc, server_args=build_sa)
    return _Built(spec=spec, deployed_config=deployed_config, target=target, setting=setting, rule=rule,
                  draft_mc=draft_mc, draft_model=draft_model, draft=draft_shape(draft_model))


def _record(adapter: Any, request: Any, sa: Any, warnings: list[str], built: _Built, notes: list[str],
            timings: dict[str, float]) -> ResolvedDeployment:
    """The deployment record from what was resolved and built: fc as built, the drafter's family (DFlash's own
    reading of the ids), the norms the built drafter applies, and the setters that ran, cited."""
    draft, spec = built.draft, built.spec
    draft_hf = built.draft_mc.hf_config
    k = draft.num_aux_hidden_states or 3
    ckpt = fc_shape_from_checkpoint(Path(request.draft))
    fc = fc_as_built(ckpt, draft, draft_hf, k)
    family = draft_family(request.draft)
    block = dflash_facts(spec, draft_hf, sa) if spec.dflash_use_aux_hidden_state else None
    dep = adapter._deployment(
        request, sa, warnings, model_config=built.deployed_config, draft_hf_config=draft_hf,
        ids=(block.config_ids if block is not None else spec.eagle_aux_hidden_state_layer_ids),
        layers_to_capture=list(built.setting.layers_to_capture),
        fc=fc, k=k, model_class=type(built.target).__name__, timings=timings,
    )
    if block is not None:  # the DFlash path's own reading of the ids (its fallback, its offset), not EAGLE-3's
        dep = replace(dep, ids_fallback_reason=block.fallback_reason, block_size=block.block_size,
                      num_aux_hidden_states=k, fc_applied=True)
    dep = replace(dep, drafter_family=family.value, speculative_algorithm=str(sa.speculative_algorithm))
    dep = replace(dep, adapter_notes=(*dep.adapter_notes, *family_notes(request, family, dep, block)))
    # the norms the drafter SGLang built applies, read from its modules, not the config
    return with_applied_norms(
        dep, getattr(built.draft_model, "model", None),
        # No fc.weight: SGLang's loader has nothing to put into fc, which keeps its random init
        # (models/llama_eagle3.py:338-353); the shape is then the constructed module's.
        fc_source="checkpoint" if ckpt is not None else "config: no fc.weight in checkpoint",
        capture_owner=built.setting.owner, capture_rule_source=built.rule.citations,  # the setters that ran, cited
        draft_fc_module=(draft.fc_in_features, draft.fc_out_features, draft.fc_bias)
        if draft.fc_in_features is not None else None,
        draft_model_class=draft.architecture,
        notes=tuple(notes),
        # the same notes for every report (compare/findings.py adapter_findings renders adapter_notes as findings)
        adapter_notes=(*dep.adapter_notes,
                       *(("resolution_note", "info", n, "serving/sglang/since_0_5_11/static.py") for n in notes)),
    )


def fc_as_built(ckpt: Any, draft: Any, draft_hf: Any, k: int) -> tuple[int, int, bool]:
    """fc's (in, out, bias): the checkpoint's shape, else the meta-built module's, else k x H_t -> H_d."""
    if ckpt is not None:
        return (ckpt.in_features, ckpt.out_features, ckpt.bias)
    if draft.fc_in_features is not None and draft.fc_out_features is not None:
        return (draft.fc_in_features, draft.fc_out_features, bool(draft.fc_bias))
    h_t = int(getattr(draft_hf, "target_hidden_size", None) or draft_hf.hidden_size)
    return (k * h_t, int(draft_hf.hidden_size), False)
