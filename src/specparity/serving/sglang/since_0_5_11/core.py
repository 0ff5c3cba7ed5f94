"""SGLang 0.5.23 adapter (family E, domain.md §6): all version-specific glue for this release.

Runs only inside the child process (it imports sglang). Everything that decides what the drafter's
fc receives is SGLang's own code: ServerArgs resolution, ``resolve_spec_aux_hidden_state_config``,
the target class's ``set_eagle3_layers_to_capture``, TpModelWorker, EAGLEWorkerV2, the KV pools,
the attention backend, and the batch. The call sequence mirrors ``Scheduler.init_model_worker()``
(sglang-cpu.md §2); deviations are listed there in §3.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from specparity.drafters import DrafterFamily, family_of
from specparity.serving.child.worker_common import WorkerRequest
from specparity.serving.engine_values import decode_args
from specparity.serving.results import (
    SPEC_SERVER_ARGS,
    CaptureResult,
    ResolvedDeployment,
    ServingFailure,
    SpecSettings,
)
from specparity.serving.sglang.adapter import Progress
from specparity.serving.sglang.child_output import json_safe
from specparity.serving.sglang.child_setup import cpu_mem_fraction
from specparity.serving.sglang.drafter_facts import served_sources, with_applied_norms
from specparity.serving.sglang.engine_messages import collect_sglang_warnings, exception_failure
from specparity.serving.sglang.load_check import watch_target_load
from specparity.serving.sglang.run_common import capture_forward, fc_sizes
from specparity.serving.sglang.since_0_5_11 import run
from specparity.serving.sglang.since_0_5_11.static import max_reachable_boundary

SPEC_KEYS = SPEC_SERVER_ARGS
# JSON-safe subset of the resolved ServerArgs that bears on speculative decoding and capture.
# fmt: off
REPORTED_ARGS = (
    "model_path", "speculative_algorithm", "speculative_draft_model_path", *SPEC_KEYS,
    "speculative_attention_mode", "device", "dtype", "attention_backend", "prefill_attention_backend",
    "decode_attention_backend", "speculative_draft_attention_backend", "disable_cuda_graph",
    "disable_overlap_schedule", "page_size", "tp_size", "pp_size", "dp_size", "mem_fraction_static",
    "max_total_tokens", "max_running_requests", "kv_cache_dtype", "quantization",
    "enable_return_aux_hidden_states", "return_aux_hidden_state_layer_ids",
)
# fmt: on


def make_adapter(*, sglang_version: str, name: str) -> Adapter:
    """Registry hook (``adapter.load_adapter``)."""
    return Adapter(sglang_version=sglang_version, name=name)


def server_args_kwargs(request: WorkerRequest, *, extra_requests: int = 0) -> dict[str, Any]:
    """ServerArgs keywords: device defaults, then the user's args (the user wins), then the models."""
    kw: dict[str, Any] = {"device": request.device, "disable_overlap_schedule": True, "log_level": "warning"}
    if request.device == "cpu":
        # No CPU EAGLE attention/graphs; fp32 keeps the capture bit-exact vs HF (sglang-cpu.md §2, §10).
        total = sum(len(p) for p in request.probes)
        kw.update(
            attention_backend="torch_native",
            dtype="float32",
            disable_cuda_graph=True,
            mem_fraction_static=cpu_mem_fraction(request.target, request.draft),
            max_total_tokens=max(4096, 4 * total + 256),
        )
    if extra_requests:
        kw["max_running_requests"] = max(48, extra_requests + 8)
    kw.update(decode_args(request.server_args))  # as SGLang's parser made them (serving/engine_values.py)
    kw.update(
        model_path=request.target,
        speculative_draft_model_path=request.draft,
        speculative_algorithm=request.server_args.get("speculative_algorithm", "EAGLE3"),
    )
    return kw


def _fallback_reason(draft_hf_config: Any, ids: Any) -> str | None:
    """Why SGLang took its default ids (its own reader swallows every exception, domain.md D11)."""
    if ids is not None:
        return None
    eagle_config = getattr(draft_hf_config, "eagle_config", None)
    top = getattr(draft_hf_config, "eagle_aux_hidden_state_layer_ids", None)
    note = " (a top-level eagle_aux_hidden_state_layer_ids never reaches the target)" if top else ""
    if eagle_config is None:
        return "draft config has no eagle_config" + note
    if not isinstance(eagle_config, dict):
        return f"malformed eagle_config: expected a mapping, got {type(eagle_config).__name__}" + note
    if "eagle_aux_hidden_state_layer_ids" not in eagle_config:
        return "malformed eagle_config: no eagle_aux_hidden_state_layer_ids" + note
    return "malformed eagle_config: eagle_aux_hidden_state_layer_ids is null" + note


def _draft_vocab(draft_hf_config: Any, target_vocab: int) -> int | None:
    """The vocabulary the drafter drafts in: its ``draft_vocab_size`` (an EAGLE-3 head sets it to ``vocab_size`` when
    built, models/llama_eagle3.py:306-308); a DFlash drafter has none and drafts over the target's lm_head
    (sglang 0.5.23 models/dflash.py:92-127), and so has a DSpark drafter (models/dspark.py:539, 550-555: the target's
    lm_head attached), so its vocabulary is the target's."""
    value = getattr(draft_hf_config, "draft_vocab_size", None)
    if value is None and family_of(draft_hf_config.to_dict()) in (DrafterFamily.DFLASH, DrafterFamily.DSPARK):
        return target_vocab
    return int(value) if value is not None else None


def _draft_flags(draft_hf_config: Any) -> dict[str, bool]:
    # sglang 0.5.23 models/llama_eagle3.py:163-207 (bias, norm_before_fc, fc_norm/use_aux_norm, norm_output).
    ec = getattr(draft_hf_config, "eagle_config", None)
    ec = ec if isinstance(ec, dict) else {}
    return {
        "norm_before_fc": bool(ec.get("norm_before_fc", getattr(draft_hf_config, "norm_before_fc", False))),
        "fc_norm": bool(
            getattr(draft_hf_config, "fc_norm", None) or getattr(draft_hf_config, "use_aux_norm", False)
        ),
        "norm_output": bool(getattr(draft_hf_config, "norm_output", False)),
        "fc_bias_in_config": bool(getattr(draft_hf_config, "bias", False)),
    }


class Adapter:
    """The 0.5.23 adapter: :meth:`resolve` (static) and :meth:`capture` (real forward)."""

    # The capture glue module; families C/D (since_0_5_11/adapter.py) put their feature-detected glue here.
    run: Any = run

    def __init__(self, *, sglang_version: str, name: str) -> None:
        self.sglang_version = sglang_version
        self.name = name

    def warm(self, device: str) -> None:
        """A warm zygote's imports (serving/child/zygote.py); this adapter needs no set-up before them."""
        from specparity.serving.sglang.child_setup import preload_engine_modules

        preload_engine_modules()

    def _resolved_view(self, sa: Any) -> Any:
        """The resolved ServerArgs (0.5.19+ keeps the rewrite in a stash, domain.md §5)."""
        from sglang.srt.arg_groups.model_override_base import resolved_view

        return resolved_view(sa)

    def _runner_ids(self, model_runner: Any) -> Any:
        """The draft ids the target's runner read (``None``: SGLang's default path)."""
        return model_runner.spec_aux_config.eagle_aux_hidden_state_layer_ids

    # ---------------------------------------------------------------- shared start of both paths
    def _server_args(self, request: WorkerRequest, *, extra_requests: int = 0) -> tuple[Any, list[str]]:
        from sglang.srt.server_args import ServerArgs

        with collect_sglang_warnings() as warnings:
            sa = ServerArgs(**server_args_kwargs(request, extra_requests=extra_requests))
            sa.resolve_once()
        return sa, list(warnings)

    def _publish(self, sa: Any) -> None:
        from sglang.srt.runtime_context import SpawnRanks, publish, spawn_world_rank

        publish(
            sa,
            role="scheduler",
            ranks=SpawnRanks(world_rank=spawn_world_rank(sa, tp_rank=0, pp_rank=0), gpu_id=0),
        )

    def _deployment(
        self,
        request: WorkerRequest,
        sa: Any,
        warnings: list[str],
        *,
        model_config: Any,
        draft_hf_config: Any,
        ids: Any,
        layers_to_capture: list[int],
        fc: tuple[int, int, bool],
        k: int,
        model_class: str,
        timings: dict[str, float],
    ) -> ResolvedDeployment:
        view = self._resolved_view(sa)
        hf = model_config.hf_text_config
        num_layers = int(hf.num_hidden_layers)
        max_b = max_reachable_boundary(model_class, num_layers)
        sources, unreachable = served_sources(layers_to_capture, num_layers, max_reachable=max_b)
        h_t_draft = int(getattr(draft_hf_config, "target_hidden_size", None) or draft_hf_config.hidden_size)
        h_d = int(draft_hf_config.hidden_size)
        spec_lines = tuple(w for w in warnings if "speculative" in w)
        flags = _draft_flags(draft_hf_config)
        return ResolvedDeployment(
            engine_version=self.sglang_version,
            adapter=self.name,
            target_path=request.target,
            draft_path=request.draft,
            device=request.device,
            target_architecture=model_class,
            num_layers=num_layers,
            target_hidden_size=int(hf.hidden_size),
            target_vocab_size=int(model_config.vocab_size),
            target_dtype=str(model_config.dtype).removeprefix("torch."),
            draft_architecture=next(iter(getattr(draft_hf_config, "architectures", None) or ["?"])),
            draft_hidden_size=h_d,
            draft_vocab_size=_draft_vocab(draft_hf_config, int(model_config.vocab_size)),
            requested_spec=SpecSettings(*(request.server_args.get(key) for key in SPEC_KEYS)),
            resolved_spec=SpecSettings(*(getattr(view, key) for key in SPEC_KEYS)),
            spec_warnings=spec_lines,
            draft_config_ids=None if ids is None else tuple(int(x) for x in ids),
            ids_fallback_reason=_fallback_reason(draft_hf_config, ids),
            layers_to_capture=tuple(int(b) for b in layers_to_capture),
            served_sources=sources,
            unreachable_boundaries=unreachable,
            fc_in_features=fc[0],
            fc_out_features=fc[1],
            fc_bias=fc[2],
            num_aux_hidden_states=k,
            fc_applied=k * h_t_draft != h_d,
            norm_before_fc=flags["norm_before_fc"],
            fc_norm=flags["fc_norm"],
            norm_output=flags["norm_output"],
            fc_bias_in_config=flags["fc_bias_in_config"],
            server_args={
                key: json_safe(getattr(view, key, getattr(sa, key, None))) for key in REPORTED_ARGS
            },
            timings=timings,
        )

    # ---------------------------------------------------------------- static resolve
    def resolve(self, request: WorkerRequest) -> ResolvedDeployment | ServingFailure:
        """ServerArgs as deployed, then the real target and draft on the meta device and the real setter."""
        from specparity.serving.sglang.since_0_5_11.static import resolve_static

        return resolve_static(self, request)

    # ---------------------------------------------------------------- capture (real forward)
    def capture(self, request: WorkerRequest, *, progress: Progress) -> CaptureResult:
        """Prefill all probes in one batch through EAGLEWorkerV2; hook fc; then the layer atlas."""
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        try:
            sa, warnings = self._server_args(request, extra_requests=3 * len(request.probes))
            self._publish(sa)
            # the target's load measured against its checkpoint while SGLang loads it (load_check.py)
            with watch_target_load() as load:
                workers = self.run.start_workers(sa, device=request.device)
        except Exception as exc:
            return CaptureResult(None, None, None, (exception_failure(exc, prefix="during start-up: "),))
        timings["startup_s"] = time.perf_counter() - t0
        progress(1, 3 if request.atlas else 2)
        target, drafter = workers.target_model, workers.drafter_model
        fc_mod = drafter.model.fc
        deployment = self._deployment(
            request,
            sa,
            warnings,
            model_config=workers.tp_worker.model_runner.model_config,
            draft_hf_config=drafter.config,
            ids=self._runner_ids(workers.tp_worker.model_runner),
            layers_to_capture=list(target.model.layers_to_capture)
            if target.capture_aux_hidden_states
            else [],
            # an nn.Linear, or the MLA head's ColumnParallelLinear (sglang 0.5.23 models/kimi_k25_eagle3.py:212-219)
            fc=(*fc_sizes(fc_mod), fc_mod.bias is not None),
            k=int(drafter.model.num_aux_hidden_states),
            model_class=type(target).__name__,
            timings=timings,
        )
        # the norms the drafter SGLang built applies, read from its modules (not re-derived from the config)
        deployment = with_applied_norms(deployment, drafter.model, fc_source="sglang_module")
        if load.record is not None and load.model is target:
            deployment = dataclasses.replace(deployment, target_load=load.record)
        return capture_forward(
            request,
            deployment,
            target=target,
            drafter=drafter,
            tap_class=self.run.FcTap,
            prefill=lambda: self.run.spec_prefill(workers, request.probes),
            layer_atlas=lambda lengths: self.run.layer_atlas(workers, request.probes, lengths),
            stub_calls=self.run.kernel_stub_calls,
            stub_active=self.run.kernel_stub_active,
            timings=timings,
            t0=t0,
            progress=progress,
        )
