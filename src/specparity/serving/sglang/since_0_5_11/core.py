"""SGLang 0.5.23 adapter (family E, domain.md §6): all version-specific glue for this release.

Runs only inside the child process (it imports sglang). Everything that decides what the drafter's
fc receives is SGLang's own code: ServerArgs resolution, ``resolve_spec_aux_hidden_state_config``,
the target class's ``set_eagle3_layers_to_capture``, TpModelWorker, EAGLEWorkerV2, the KV pools,
the attention backend, and the batch. The call sequence mirrors ``Scheduler.init_model_worker()``
(sglang-cpu.md §2); deviations are listed there in §3.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from specparity.serving.results import (
    FC_NOT_CALLED,
    SPEC_SERVER_ARGS,
    CaptureResult,
    FcCapture,
    LayerAtlas,
    ResolvedDeployment,
    ServingFailure,
    SpecSettings,
)
from specparity.serving.sglang.adapter import Progress, WorkerRequest
from specparity.serving.sglang.common import (
    collect_sglang_warnings,
    cpu_mem_fraction,
    exception_failure,
    json_safe,
    judge_fc_capture,
    nonfinite_failures,
    served_sources,
    split_rows,
    with_applied_norms,
)
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
    kw.update(request.server_args)
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
        """A warm zygote's imports (serving/zygote.py); this adapter needs no set-up before them."""
        from specparity.serving.sglang.common import preload_engine_modules

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
            sglang_version=self.sglang_version,
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
            draft_vocab_size=getattr(draft_hf_config, "draft_vocab_size", None),
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
            fc=(fc_mod.in_features, fc_mod.out_features, fc_mod.bias is not None),
            k=int(drafter.model.num_aux_hidden_states),
            model_class=type(target).__name__,
            timings=timings,
        )
        # the norms the drafter SGLang built applies, read from its modules (not re-derived from the config)
        deployment = with_applied_norms(deployment, drafter.model, fc_source="sglang_module")
        lengths = [len(p) for p in request.probes]
        failures: list[ServingFailure] = []
        t1 = time.perf_counter()
        tap = self.run.FcTap(fc_mod, target.model)
        raised: ServingFailure | None = None
        try:
            if sum(lengths) > 0:
                self.run.spec_prefill(workers, request.probes)
        except Exception as exc:
            raised = exception_failure(exc, prefix="during the prefill forward: ")
        finally:
            tap.remove()
        timings["fc_forward_s"] = time.perf_counter() - t1
        first = tap.fc_inputs[0] if tap.fc_inputs else None
        judged = judge_fc_capture(
            hook_calls=len(tap.fc_inputs),
            rows=None if first is None else int(first.shape[0]),
            width=None if first is None else int(first.shape[-1]),
            expected_rows=sum(lengths),
            expected_width=fc_mod.in_features,
            aux_captured=tap.aux_count,
            aux_expected=deployment.num_aux_hidden_states,
            fc_applied=deployment.fc_applied,
            target_ran=tap.target_calls > 0,
        )
        # SGLang's own exception comes first; "fc never called" would only restate a forward that died
        # before the drafter (e.g. boundary 0 on llama before 0.5.22, D9); as the pre-worker-v2 adapter does.
        failures[:0] = judged if raised is None else [raised, *(f for f in judged if f.kind != FC_NOT_CALLED)]
        fc: FcCapture | None = None
        if first is not None and int(first.shape[0]) == sum(lengths):
            per_sample = split_rows(first, lengths)
            aux = split_rows(tap.aux_packed, lengths) if tap.aux_packed is not None else []
            fc = FcCapture(
                per_sample=per_sample,
                dtype=str(first.dtype).removeprefix("torch."),
                sglang_version=self.sglang_version,
                hook_calls=len(tap.fc_inputs),
                aux_states_captured=tap.aux_count,
                aux_states_expected=deployment.num_aux_hidden_states,
                kernel_stub_calls=self.run.kernel_stub_calls(),
                aux_per_sample=aux,
                kernel_stub_active=self.run.kernel_stub_active(),
            )
            failures.extend(nonfinite_failures(per_sample, what="fc input"))
        progress(2, 3 if request.atlas else 2)
        atlas: LayerAtlas | None = None
        if request.atlas and sum(lengths) > 0:
            t2 = time.perf_counter()
            try:
                atlas = self.run.layer_atlas(workers, request.probes, lengths)
                failures.extend(
                    f
                    for f in nonfinite_failures(
                        [torch.stack(list(s.values())) for s in atlas.per_sample], what="layer atlas"
                    )
                )
            except Exception as exc:
                failures.append(exception_failure(exc, prefix="during the atlas forward: "))
            timings["atlas_forward_s"] = time.perf_counter() - t2
            progress(3, 3)
        if (
            request.replay and sum(lengths) > 0
        ):  # specparity.replay (outcome): drafter on recorded vs served fc
            from specparity.serving.sglang.replay_hooks import run_replay

            if raised is None:
                run_replay(
                    drafter,
                    request.replay,
                    probes=request.probes,
                    prefill=lambda: self.run.spec_prefill(workers, request.probes),
                )
            else:  # the same prefill would raise again; say so in replay_hooks' status protocol
                Path(str(request.replay["out"]) + ".json").write_text(json.dumps(
                    {"ok": False, "passes": {},
                     "error": f"not run: the capture prefill failed ({raised.message})"}))
        if fc is not None:  # the stub list is final only after every forward
            fc.kernel_stub_calls = self.run.kernel_stub_calls()
        timings["total_s"] = time.perf_counter() - t0
        return CaptureResult(deployment=deployment, fc=fc, atlas=atlas, failures=tuple(failures))
