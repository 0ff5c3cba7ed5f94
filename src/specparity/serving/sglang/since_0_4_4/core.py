"""Adapter for SGLang before the worker-v2 API (family B: 0.4.10.post2 and 0.5.3; domain.md §6).

Shared by every release of the range, each of which only supplies a :class:`~.since_0_4_4.run.LegacyGlue` (``glue.py``).
Same public behaviour as the 0.5.23 adapter (resolve, fc capture, layer atlas), with the differences
of these releases made explicit:

- ServerArgs: the constructor itself resolves the speculative triple and REWRITES the attribute
  (0.5.3 ``server_args.py:1109-1116``: topk 1 -> ``num_draft_tokens = steps + 1``); there is no
  ``resolved_view``. ``skip_tokenizer_init=True`` because transformers 4.x cannot load a tokenizer saved
  by transformers 5.x (sglang-cpu.md §4); the harness feeds token ids, so no tokenizer is needed.
- Draft ids: the target's ``ModelRunner`` reads them itself during init with a bare ``except`` -> ``None``
  and passes them to the setter; :func:`~.since_0_4_4.run.record_setter_calls` records that argument.
- fc is ``Linear(3*H_t, H_d)`` whatever the config says (``num_aux_hidden_states`` is unknown before
  0.5.12, D5), bias iff ``config.bias``; no ``norm_before_fc``/``fc_norm``/``norm_output`` (ignored keys).
- Boundary 0 (id -1) crashes llama targets (D9); the crash comes back as ``sglang_exception`` quoting
  SGLang's own exception and file:line.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from specparity.serving.child.worker_common import WorkerRequest
from specparity.serving.results import (
    SGLANG_EXCEPTION,
    SPEC_SERVER_ARGS,
    CaptureResult,
    LayerAtlas,
    ResolvedDeployment,
    ServingFailure,
    SpecSettings,
)
from specparity.serving.sglang import run_common
from specparity.serving.sglang.adapter import Progress
from specparity.serving.sglang.capture_marks import aux_capture
from specparity.serving.sglang.child_output import json_safe, split_rows
from specparity.serving.sglang.drafter_facts import NORM_FLAGS, served_sources, with_applied_norms
from specparity.serving.sglang.engine_messages import collect_sglang_warnings, exception_failure
from specparity.serving.sglang.since_0_4_4 import run, shims
from specparity.serving.sglang.since_0_4_4.common import FC_WIDTH_K as FC_WIDTH_K
from specparity.serving.sglang.since_0_4_4.common import read_draft_ids as read_draft_ids
from specparity.serving.sglang.since_0_4_4.common import server_args_kwargs as server_args_kwargs
from specparity.sources import EMBEDDING, FINAL_NORM, layer

SPEC_KEYS = SPEC_SERVER_ARGS
REPORTED_ARGS = (
    "model_path", "speculative_algorithm", "speculative_draft_model_path", *SPEC_KEYS, "device", "dtype",
    "attention_backend", "disable_cuda_graph", "disable_overlap_schedule", "page_size", "tp_size", "pp_size",
    "dp_size", "mem_fraction_static", "max_total_tokens", "max_running_requests", "kv_cache_dtype",
    "quantization", "skip_tokenizer_init",
)
def ids_fallback_reason(draft_hf_config: Any, ids: Any, *, cite: str) -> str | None:
    """Why the runner's reader produced ``None`` (it swallows every exception, domain.md D11)."""
    if ids is not None:
        return None
    where = f" (sglang reads only eagle_config['eagle_aux_hidden_state_layer_ids'], bare except -> None, {cite})"
    eagle_config = getattr(draft_hf_config, "eagle_config", None)
    top = getattr(draft_hf_config, "eagle_aux_hidden_state_layer_ids", None)
    note = "; a top-level eagle_aux_hidden_state_layer_ids never reaches the target" if top else ""
    if eagle_config is None:
        return "draft config has no eagle_config" + note + where
    if not isinstance(eagle_config, dict):
        return f"malformed eagle_config: expected a mapping, got {type(eagle_config).__name__}" + note + where
    if "eagle_aux_hidden_state_layer_ids" not in eagle_config:
        return "malformed eagle_config: no eagle_aux_hidden_state_layer_ids" + note + where
    return "eagle_config.eagle_aux_hidden_state_layer_ids is null" + note + where


class LegacyAdapter:
    """Adapter for one pre-worker-v2 SGLang version: :meth:`resolve` (static) and :meth:`capture`."""

    def __init__(self, *, sglang_version: str, name: str, glue: run.LegacyGlue) -> None:
        self.sglang_version = sglang_version
        self.name = name
        self.glue = glue

    def _server_args(self, request: WorkerRequest, *, extra_requests: int = 0,
                     static: bool = False) -> tuple[Any, list[str]]:
        return self._construct(request, server_args_kwargs(request, extra_requests=extra_requests, static=static))

    def _construct(self, request: WorkerRequest, kw: dict[str, Any]) -> tuple[Any, list[str]]:
        shims.install(device=request.device, torch_drift=self.glue.torch_drift)
        from sglang.srt.server_args import ServerArgs

        with collect_sglang_warnings() as warnings:
            # The constructor's __post_init__ resolves (and rewrites) the speculative triple in place.
            sa = ServerArgs(**kw)
        return sa, list(warnings)

    def _deployment(self, request: WorkerRequest, sa: Any, warnings: list[str], *, model_config: Any,
                    draft_hf_config: Any, ids: tuple[int, ...] | None, layers_to_capture: list[int],
                    fc: tuple[int, int, bool], model_class: str, timings: dict[str, float]) -> ResolvedDeployment:
        hf = model_config.hf_text_config if hasattr(model_config, "hf_text_config") else model_config.hf_config
        num_layers = int(hf.num_hidden_layers)
        sources, unreachable = served_sources(layers_to_capture, num_layers, max_reachable=num_layers - 1)
        h_d = int(draft_hf_config.hidden_size)
        ec = getattr(draft_hf_config, "eagle_config", None)
        ec = ec if isinstance(ec, dict) else {}
        return ResolvedDeployment(
            engine_version=self.sglang_version, adapter=self.name,
            target_path=request.target, draft_path=request.draft, device=request.device,
            target_architecture=model_class, num_layers=num_layers,
            target_hidden_size=int(hf.hidden_size), target_vocab_size=int(model_config.vocab_size),
            target_dtype=str(model_config.dtype).removeprefix("torch."),
            draft_architecture=next(iter(getattr(draft_hf_config, "architectures", None) or ["?"])),
            draft_hidden_size=h_d, draft_vocab_size=getattr(draft_hf_config, "draft_vocab_size", None),
            requested_spec=SpecSettings(*(request.server_args.get(key) for key in SPEC_KEYS)),
            # No resolution stash before 0.5.19: the attribute IS the resolved value (domain.md §5).
            resolved_spec=SpecSettings(*(getattr(sa, key) for key in SPEC_KEYS)),
            spec_warnings=tuple(w for w in warnings if "speculative" in w),
            draft_config_ids=ids,
            ids_fallback_reason=ids_fallback_reason(draft_hf_config, ids, cite=self.glue.ids_reader_cite),
            layers_to_capture=tuple(int(b) for b in layers_to_capture), served_sources=sources,
            unreachable_boundaries=unreachable,
            fc_in_features=fc[0], fc_out_features=fc[1], fc_bias=fc[2], num_aux_hidden_states=FC_WIDTH_K,
            # 0.5.3 models/llama_eagle3.py:161-162: fc runs only if the CAPTURED width (states actually
            # served x the target's hidden size) differs from the embedding's
            fc_applied=len(sources) * int(hf.hidden_size) != h_d,
            # Keys these versions ignore (D5): the drafter builds no norm module (0.5.3
            # models/llama_eagle3.py:120-142), so none is applied whatever the config says; the capture
            # path re-reads them from the drafter SGLang built (drafter_facts.applied_norm_flags).
            norm_before_fc=False, fc_norm=False, norm_output=False,
            unsupported_norms=NORM_FLAGS,
            ignored_norm_config=tuple(flag for flag, on in (
                ("norm_before_fc", ec.get("norm_before_fc", getattr(draft_hf_config, "norm_before_fc", False))),
                ("fc_norm", getattr(draft_hf_config, "fc_norm", None) or getattr(draft_hf_config, "use_aux_norm",
                                                                                 False)),
                ("norm_output", getattr(draft_hf_config, "norm_output", False))) if on),
            fc_bias_in_config=bool(getattr(draft_hf_config, "bias", False)),
            server_args={key: json_safe(getattr(sa, key, None)) for key in REPORTED_ARGS},
            timings=timings,
        )

    # ---------------------------------------------------------------- static resolve
    def resolve(self, request: WorkerRequest) -> ResolvedDeployment | ServingFailure:
        """The static level (:func:`~.since_0_4_4.static.resolve_legacy`): no weights, no forward."""
        from specparity.serving.sglang.since_0_4_4.static import resolve_legacy

        return resolve_legacy(self, request)

    def _boundary0_crash(self, ids: tuple[int, ...] | None, layers: list[int], *, model_config: Any,
                         model_class: str) -> ServingFailure | None:
        """The static path cannot run the forward; a capture list holding the embedding boundary is
        known to crash these versions' llama-style layer loops (D9), so resolving must not claim it is
        served. The rule comes from :func:`~specparity.idrules.sglang.capture_plan`,
        which the version tests pin against this SGLang's real forward.
        """
        if 0 not in layers:
            return None
        from specparity.idrules import sglang

        num_layers = int(model_config.hf_config.num_hidden_layers)
        plan = sglang.capture_plan(ids, num_layers=num_layers, architecture=model_class,
                                   version=self.sglang_version)
        if plan.crash is None or not plan.crash.startswith("TypeError"):
            return None
        where = self.glue.boundary0_crash_cite if model_class == "LlamaForCausalLM" else f"{model_class}'s model file"
        return ServingFailure(SGLANG_EXCEPTION, (
            f"predicted without a forward: {plan.crash} at {where}: layers_to_capture {layers} holds the "
            f"{EMBEDDING} boundary, and layer 0 computes hidden_states + residual with residual None on "
            f"sglang {self.sglang_version} (the embedding is served from 0.5.22 on); a capture run raises it"))

    # ---------------------------------------------------------------- capture (real forward)
    def capture(self, request: WorkerRequest, *, progress: Progress) -> CaptureResult:
        """Prefill all probes in one batch through both ModelRunners; hook fc; then the layer atlas."""
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        try:
            sa, warnings = self._server_args(request, extra_requests=3 * len(request.probes))
            runners = run.start_runners(sa)
        except Exception as exc:
            return CaptureResult(None, None, None, (exception_failure(exc, prefix="during start-up: "),))
        timings["startup_s"] = time.perf_counter() - t0
        steps = 3 if request.atlas else 2
        progress(1, steps)
        target, drafter = runners.target_model, runners.drafter_model
        fc_mod = drafter.model.fc
        ids = runners.setter_calls[-1] if runners.setter_calls else None
        deployment = self._deployment(
            request, sa, warnings, model_config=runners.target_runner.model_config, draft_hf_config=drafter.config,
            ids=ids, layers_to_capture=list(target.model.layers_to_capture) if target.capture_aux_hidden_states
            else [], fc=(fc_mod.in_features, fc_mod.out_features, fc_mod.bias is not None),
            model_class=type(target).__name__, timings=timings)
        deployment = with_applied_norms(deployment, drafter.model, fc_source="sglang_module")
        found = () if runners.setter_calls else (ServingFailure(
            SGLANG_EXCEPTION, "the target's ModelRunner never called set_eagle3_layers_to_capture; the capture "
            "list is not SGLang's"),)
        return run_common.capture_forward(
            request, deployment, target=target, drafter=drafter, tap_class=run.FcTap,
            prefill=lambda: run.spec_prefill(runners, request.probes, self.glue),
            layer_atlas=lambda lengths: self._atlas(runners, request.probes, lengths),
            stub_calls=_stub_calls, stub_active=_stub_active, timings=timings, t0=t0, progress=progress,
            found=found)

    def _atlas(self, runners: run.Runners, probes: tuple[tuple[int, ...], ...], lengths: list[int]) -> LayerAtlas:
        """Residual stream at every boundary via SGLang's own capture, after the fc capture.

        Boundaries 1..L-1 go into ``layers_to_capture`` (the loop tests membership, 0.5.3
        ``models/llama.py:338-340``) for one FULL-mode extend; boundary 0 (``embedding``) is layer 0's
        input, read by a pre-hook in the same forward (:class:`~.since_0_4_4.run.EmbeddingTap`, it cannot be
        captured on these versions); ``final_norm`` is what a FULL-mode extend without aux capture stores
        (0.5.3 ``layers/logits_processor.py:360``). The original capture list is restored afterwards.
        """
        target = runners.target_model
        num_layers = int(runners.target_runner.model_config.hf_config.num_hidden_layers)
        emb = run_common.EmbeddingTap(target.model.layers[0])
        try:
            with aux_capture(target) as capture:
                capture(range(1, num_layers), True)
                stream = run.target_extend(runners, probes, self.glue)
                capture([], False)
                normed = run.target_extend(runners, probes, self.glue)
        finally:
            emb.remove()
        h = int(normed.shape[-1])
        if stream.shape[-1] != (num_layers - 1) * h:
            raise RuntimeError(f"atlas capture is {stream.shape[-1]} wide, expected {num_layers - 1}*{h}")
        if len(emb.inputs) != 2 or emb.inputs[0].shape[0] != sum(lengths):
            raise RuntimeError(f"layer 0 saw {len(emb.inputs)} forward(s); expected 2 of {sum(lengths)} rows")
        names = [layer(i) for i in range(num_layers - 1)]
        per_sample: list[dict[str, torch.Tensor]] = []
        for e_rows, s_rows, n_rows in zip(split_rows(emb.inputs[0], lengths), split_rows(stream, lengths),
                                          split_rows(normed, lengths), strict=True):
            entry = {EMBEDDING: e_rows}
            entry.update({name: s_rows[:, j * h:(j + 1) * h].clone() for j, name in enumerate(names)})
            entry[FINAL_NORM] = n_rows
            per_sample.append(entry)
        return LayerAtlas(per_sample=per_sample, num_layers=num_layers)


def _stub_active() -> bool:
    import sys

    return bool(getattr(sys.modules.get("sgl_kernel"), "SPECPARITY_STUB", False))


def _stub_calls() -> tuple[str, ...]:
    """Calls into the sgl_kernel stand-in plus any (raising) call into the vllm shim's custom ops."""
    import sys

    stub = tuple(getattr(sys.modules.get("sgl_kernel"), "CALLED", ())) if _stub_active() else ()
    return stub + tuple(f"vllm._custom_ops.{n}" for n in shims.vllm_shim_calls())
