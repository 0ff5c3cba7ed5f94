"""The static level's shared SGLang pieces: meta-device model builds for the releases before the 0.5.23 layout
(families A-D, 0.4.4.post2-0.5.21), and what every family's static level uses: reading back what the real setter
stored (:func:`read_capture`), the one-rank world of the build, the hardware fallbacks of the server args.

The static level of these families builds the target and the draft the way SGLang's own ``ModelRunner`` does
before it loads weights, on the meta device (no memory, no weights), then runs the real
``set_eagle3_layers_to_capture`` on the real object (:func:`read_capture`). Every step is one of
SGLang's own functions; what differs between releases is found by feature detection (signatures and module
contents), never by version number:

- the process-global server args the model files read: ``global_server_args_dict`` updated as ``ModelRunner``
  updates it (0.4.8 ``model_executor/model_runner.py:200-207``, 0.4.10.post2 ``:214-225``, 0.5.3 ``:271-279``),
  or ``set_global_server_args_for_scheduler`` where it exists (0.5.10 ``model_runner.py:389-393``);
- a one-rank gloo world: ``init_distributed_environment``, ``initialize_model_parallel`` and
  ``initialize_dp_attention`` as ``ModelRunner.init_torch_distributed`` calls them (0.4.8 ``:473-494``, keyword
  form; 0.5.3+ ``initialize_dp_attention(server_args=, model_config=)``);
- ``_initialize_model``: with its quantization config computed first where it takes one (0.5.10
  ``model_loader/loader.py:257-260``), else computing it itself (0.4.8 ``:143-156``);
- on CPU, ``adjust_config_with_unaligned_cpu_tp`` before the build where the release has it (0.4.10.post2+
  ``model_runner.py:630-633``).

This module imports sglang: use it only inside the serving child process.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from specparity.serving.results import UNSUPPORTED_VERSION, ServingFailure
from specparity.serving.sglang.child_setup import nccl_port
from specparity.serving.sglang.engine_messages import (
    exception_failure,
    gpu_query_failure,
    unknown_architecture_failure,
)

_WORLD_READY = False


def publish_server_args(sa: Any, model_config: Any) -> None:
    """Make ``sa`` the process's server args, as ``ModelRunner.__init__`` does before it loads the model."""
    import sglang.srt.server_args as server_args_module
    from sglang.srt.configs.model_config import AttentionArch

    use_mla_backend = model_config.attention_arch == AttentionArch.MLA  # model_runner.py (0.4.8 :188, 0.5.10 :344)
    setter = getattr(server_args_module, "set_global_server_args_for_scheduler", None)
    if setter is not None:  # 0.5.10 model_runner.py:389-393
        setter(sa)
        server_args_module.get_global_server_args().use_mla_backend = use_mla_backend
        return
    from sglang.srt.managers import schedule_batch
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    extra: dict[str, Any] = {"use_mla_backend": use_mla_backend,
                             "speculative_algorithm": SpeculativeAlgorithm.from_string(sa.speculative_algorithm)}
    if "moe_a2a_backend" in schedule_batch.GLOBAL_SERVER_ARGS_KEYS:
        # 0.4.10.post2 model_runner.py:221-224 publishes the MoE enums, which its model files compare against
        from sglang.srt.layers.moe.utils import DeepEPMode, MoeA2ABackend

        extra.update(moe_a2a_backend=MoeA2ABackend(sa.moe_a2a_backend), deepep_mode=DeepEPMode(sa.deepep_mode))
    schedule_batch.global_server_args_dict.update(
        {k: getattr(sa, k) for k in schedule_batch.GLOBAL_SERVER_ARGS_KEYS} | extra)


def init_scheduler_globals(sa: Any, model_config: Any) -> None:
    """The process-global MoE config the scheduler sets for an MoE model before its worker builds it, where the
    release has it (0.5.3 ``managers/scheduler.py:934-936``; 0.5.10 ``:565-569``). The GEMM configs 0.5.10 also
    sets there (``:572-573``) only choose FP8/FP4 kernels, which no meta build runs."""
    try:
        from sglang.srt.layers.moe import initialize_moe_config
    except ImportError:  # 0.4.x: MoE settings travel in global_server_args_dict (publish_server_args)
        return
    hf = getattr(model_config.hf_config, "text_config", model_config.hf_config)
    if hasattr(hf, "num_experts_per_tok"):
        initialize_moe_config(sa)


def init_single_rank(sa: Any, model_config: Any) -> None:
    """Rank 0 of a one-rank gloo world with SGLang's own functions (the groups once per process), then its
    dp-attention state for this model, as ``ModelRunner.init_torch_distributed`` sets them up (0.5.14
    ``model_runner.py:1212-1240``)."""
    global _WORLD_READY
    from sglang.srt.layers.dp_attention import initialize_dp_attention

    if not _WORLD_READY:
        from sglang.srt.distributed.parallel_state import (
            init_distributed_environment,
            initialize_model_parallel,
            model_parallel_is_initialized,
        )
        if not model_parallel_is_initialized():
            port = nccl_port(sa)
            init_distributed_environment(backend="gloo", world_size=1, rank=0, local_rank=0,
                                         distributed_init_method=f"tcp://127.0.0.1:{port}")
            initialize_model_parallel(tensor_model_parallel_size=1)
        _WORLD_READY = True
    if "server_args" in inspect.signature(initialize_dp_attention).parameters:
        initialize_dp_attention(server_args=sa, model_config=model_config)
    else:  # 0.4.8 model_runner.py:487-494; 0.4.10.post2 the same keywords
        initialize_dp_attention(enable_dp_attention=sa.enable_dp_attention, tp_rank=0, tp_size=1, dp_size=1,
                                moe_dense_tp_size=sa.moe_dense_tp_size, pp_size=1)


def build_meta_model(model_config: Any, sa: Any) -> Any:
    """The class SGLang's loader picks, constructed by its ``_initialize_model`` on the meta device.

    The model module is imported (and, where ``_initialize_model`` takes it, the quantization config computed)
    BEFORE entering the meta device: model modules imported under ``torch.device("meta")`` fail their own
    import-time set-up.
    """
    import torch
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader import loader
    from sglang.srt.model_loader.utils import get_model_architecture, set_default_torch_dtype

    load_config = LoadConfig(load_format=sa.load_format)  # ModelRunner.load_model (no remote loaders)
    if getattr(sa, "device", None) == "cpu":
        try:
            from sglang.srt.configs.update_config import adjust_config_with_unaligned_cpu_tp
        except ImportError:  # 0.4.8: the CPU path has no head-count adjustment
            pass
        else:
            # The build runs on this CPU because the machine has no GPU; a deployment on CUDA never calls this
            # (0.5.20 update_config.py:344 fails on MiniMax-M3's nested text config). Then build unadjusted: a model
            # file that needs the *_cpu counts fails in SGLang's own code, and says so.
            with contextlib.suppress(Exception):
                model_config = adjust_config_with_unaligned_cpu_tp(model_config, load_config, 1)
    get_model_architecture(model_config)  # imports the model module outside the meta device
    if "quant_config" in inspect.signature(loader._initialize_model).parameters:
        quant_config = loader._get_quantization_config(model_config, load_config)
        with set_default_torch_dtype(model_config.dtype), torch.device("meta"):
            return loader._initialize_model(model_config, load_config, quant_config)
    with set_default_torch_dtype(model_config.dtype), torch.device("meta"):
        return loader._initialize_model(model_config, load_config)


def build_meta_models(sa: Any, model_config: Any, draft_config: Any) -> tuple[Any, Any]:
    """The target and the draft model objects SGLang's runners would build for ``sa``, on the meta device, after
    the process state their runners set up first; the draft as :func:`draft_shape` reads it."""

    publish_server_args(sa, model_config)
    init_scheduler_globals(sa, model_config)
    init_single_rank(sa, model_config)
    target = build_meta_model(model_config, sa)
    return target, draft_shape(build_meta_model(draft_config, sa))


def meta_gap_failure(exc: BaseException, *, sglang_version: str, prefix: str = "") -> ServingFailure | None:
    """A model constructor that reads a tensor's value while it builds (0.5.3 ``layers/activation.py:205``, xIELU's
    ``.item()`` for Apertus) cannot run on the meta device, which holds no data. That says nothing about the
    deployment: SGLang builds it on the GPU. ``unsupported_version`` (the check could not run here, exit 3), naming
    SGLang's line; None for any other exception."""
    if not (isinstance(exc, NotImplementedError) and "meta tensor" in str(exc)):
        return None
    from specparity.serving.sglang.engine_messages import exception_failure

    quoted = exception_failure(exc).message
    return ServingFailure(UNSUPPORTED_VERSION, (
        f"{prefix}the static level builds the models on the meta device (no weights), and sglang {sglang_version}'s "
        f"constructor reads a tensor's value there ({quoted}): a gap in specparity's static level for this "
        "architecture on this release, not a verdict on the deployment; run `specparity gate --level capture` "
        "with the weights"))


_UNSET = object()


@dataclass(frozen=True)
class CaptureSetting:
    """What the real ``set_eagle3_layers_to_capture`` stored on the real object.

    ``owner`` is the dotted module path that holds ``layers_to_capture`` (``"model"`` for Llama,
    ``"language_model.model"`` for Kimi-K2.5 and Llama-4); ``flag_owners`` the modules whose
    ``capture_aux_hidden_states`` the setter turned on.
    """

    layers_to_capture: tuple[int, ...]
    owner: str
    flag_owners: tuple[str, ...]
    layer_flags: tuple[int, ...] = ()  # MiniMax-M3: decoder layers flagged `_is_layer_to_capture`


def read_capture(model: torch.nn.Module, configure: Callable[[torch.nn.Module], None]) -> CaptureSetting:
    """Run ``configure(model)`` (which calls the model's own ``set_eagle3_layers_to_capture``) and read
    back what it stored.

    Every module's ``layers_to_capture`` / ``capture_aux_hidden_states`` is set to a sentinel first, so
    what comes back is what the setter wrote, wherever it delegated to; untouched attributes are put
    back. ``layers_to_capture`` is empty when nothing was stored (aux capture off).
    """
    saved: dict[tuple[str, str], Any] = {}
    modules = dict(model.named_modules())
    for name, mod in modules.items():
        for attr in ("layers_to_capture", "capture_aux_hidden_states"):
            if attr in vars(mod):
                saved[(name, attr)] = vars(mod)[attr]
                setattr(mod, attr, _UNSET)
    try:
        configure(model)
    finally:
        stored: list[tuple[str, list[int]]] = []
        flags: list[str] = []
        for name, mod in modules.items():
            value = vars(mod).get("layers_to_capture", _UNSET)
            if value is not _UNSET:
                stored.append((name, [int(b) for b in value]))
            if vars(mod).get("capture_aux_hidden_states", _UNSET) is True:
                flags.append(name or "<model>")
        for (name, attr), value in saved.items():  # what the setter did not touch goes back as it was
            if vars(modules[name]).get(attr, _UNSET) is _UNSET:
                setattr(modules[name], attr, value)
    if not stored:
        return CaptureSetting((), "", tuple(flags))
    owner, layers = stored[0]
    layer_flags = tuple(
        i for i, lyr in enumerate(getattr(modules[owner], "layers", ()) or ())
        if getattr(lyr, "_is_layer_to_capture", False) is True
    )
    return CaptureSetting(tuple(layers), owner or "<model>", tuple(flags), layer_flags)


# ServerArgs keywords that shape the parallel world; the meta build runs as rank 0 of a one-rank world
# (the capture list does not depend on them: every rank's setter stores the same list, and only the
# last PP rank captures, models/llama.py:929-931).
SINGLE_RANK_ARGS = {"tp_size": 1, "pp_size": 1, "dp_size": 1, "ep_size": 1}


def one_rank_build_kw(sa: Any, kw: dict[str, Any], notes: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The keywords of rank 0 of a one-rank world for ``kw``, and the parallel args of the deployment that differ
    from it (``wide``), noted in ``notes`` when there are any."""
    wide = {k: getattr(sa, k, v) for k, v in SINGLE_RANK_ARGS.items() if getattr(sa, k, v) not in (v, None)}
    if wide:
        notes.append("models built as rank 0 of a one-rank world (deployment: "
                     + ", ".join(f"{k}={v}" for k, v in wide.items())
                     + "); every rank's setter stores the same capture list")
    return {**kw, **SINGLE_RANK_ARGS}, wide


# What a CPU-only machine can resolve when a validation needs the deployment's GPU: this platform, then
# also no overlap scheduling, which SGLang itself turns off for speculative decoding on CPU.
HARDWARE_FALLBACKS: tuple[dict[str, Any], ...] = (
    {"device": "cpu"},
    {"device": "cpu", "disable_overlap_schedule": True},
)


# SGLang picks the attention backend from the GPU it runs on (None on a machine without one), and some
# architectures assert theirs while resolving (0.5.10 server_args.py:1887, ExaoneMoE: fa3/triton/trtllm_mha); triton
# is in every such list and runs on every CUDA GPU, so the last fallback resolves with it, and says so
GPU_BACKEND = {"attention_backend": "triton"}


def static_server_args(construct: Any, kw: dict[str, Any], user_args: dict[str, Any],
                       sglang_version: str) -> tuple[Any, list[str], Any, list[str]] | ServingFailure:
    """``(sa, warnings, build_sa, notes)``: the deployment's ServerArgs and those the meta build runs under.

    ``construct(kw)`` returns ``(ServerArgs, warnings)`` (the family's shims installed first); ``kw`` are the
    deployment's keywords without the capture-level CPU overrides, ``user_args`` what the user passed.
    """
    kw = {**kw, "device": user_args.get("device", "cuda")}
    notes: list[str] = []
    try:
        sa, warnings = construct(kw)
    except Exception as exc:
        refusal = (unknown_architecture_failure(exc, target=kw["model_path"], sglang_version=sglang_version,
                                                prefix="while resolving the server args: ")
                   or exception_failure(exc, prefix="SGLang refuses the deployment's server args: "))
        if kw["device"] != "cuda" or torch.cuda.is_available():
            return gpu_query_failure(exc, stage="while resolving the server args") or refusal
        for fallback in (*HARDWARE_FALLBACKS, *([GPU_BACKEND] if "attention_backend" not in user_args else [])):
            try:
                sa, warnings = construct({**kw, **fallback})
            except Exception:
                continue
            notes.append(f"hardware check skipped: with device=cuda SGLang raised '{exception_failure(exc).message}', "
                         "which needs a GPU this machine lacks; server args were resolved with "
                         + ", ".join(f"{k}={v}" for k, v in fallback.items()))
            kw = {**kw, **fallback}
            break
        else:
            return gpu_query_failure(exc, stage="while resolving the server args") or refusal
    build_kw, wide = one_rank_build_kw(sa, kw, notes)
    if kw["device"] == "cuda" and not torch.cuda.is_available():
        # the meta build runs on this machine's platform, with the backend SGLang resolved for the deployment
        build_kw.update(device="cpu", attention_backend=getattr(sa, "attention_backend", None))
    build_sa = sa if not wide and build_kw["device"] == kw["device"] else construct(build_kw)[0]
    return sa, warnings, build_sa, notes


@dataclass(frozen=True)
class DraftShape:
    """The draft model as SGLang constructs it: its class and the ``fc`` module it would load into."""

    architecture: str
    fc_in_features: int | None
    fc_out_features: int | None
    fc_bias: bool | None
    num_aux_hidden_states: int | None


def _linear_size(fc: Any, plain: str, parallel: str) -> int | None:
    """One of fc's sizes: ``torch.nn.Linear``'s ``in_features``/``out_features``, or SGLang's parallel linear layers'
    ``input_size``/``output_size`` (``layers/linear.py`` ``LinearBase``: the whole width, not one rank's shard), which
    the MLA EAGLE-3 head builds its fc as (sglang 0.5.23 ``models/kimi_k25_eagle3.py:212-219``, a
    ``ColumnParallelLinear``)."""
    value = getattr(fc, plain, None)
    if value is None:
        value = getattr(fc, parallel, None)
    return int(value) if value is not None else None


def draft_shape(model: torch.nn.Module) -> DraftShape:
    """The draft's ``fc`` as constructed; None where it has none. The EAGLE-3 heads keep it on their inner model
    (``models/llama_eagle3.py:155-167``, ``models/kimi_k25_eagle3.py:208-219``), the DFlash drafter on itself with its
    feature count as ``num_context_features`` (0.5.23 ``models/dflash.py:750-775``)."""
    inner = getattr(model, "model", None)
    holder = inner if getattr(inner, "fc", None) is not None else model
    fc = getattr(holder, "fc", None)
    k = getattr(holder, "num_aux_hidden_states", None)
    if k is None:
        k = getattr(holder, "num_context_features", None)
    return DraftShape(
        architecture=type(model).__name__,
        fc_in_features=_linear_size(fc, "in_features", "input_size") if fc is not None else None,
        fc_out_features=_linear_size(fc, "out_features", "output_size") if fc is not None else None,
        fc_bias=(getattr(fc, "bias", None) is not None) if fc is not None else None,
        num_aux_hidden_states=int(k) if k is not None else None,
    )
