"""The static level of families A and B (0.4.4.post2-0.5.10): server args as deployed, models built here.

As the 0.5.23 static level does (:func:`~.since_0_5_11.static.resolve_static`): the deployment's own server args with
``device`` defaulting to ``cuda``, where SGLang deployments run (SGLang's own auto-detection would describe this
machine, and per-architecture validations depend on the device and backend: 0.5.3 ``server_args.py:733-747``
asserts gpt-oss's attention backend, 0.5.10 ``:1588`` asks the GPU for DSA models). A validation that needs the
absent GPU is retried on this machine's platform and said in a note. The models are then built on the meta device
as rank 0 of a one-rank world on this CPU, with the attention backend resolved for the deployment. No capture-level
override (torch_native, float32, no CUDA graphs) applies. Runs only inside the child process.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from pathlib import Path
from typing import Any

from specparity.checkpoint_files import fc_shape_from_checkpoint
from specparity.serving.results import SGLANG_EXCEPTION, ResolvedDeployment, ServingFailure
from specparity.serving.sglang import meta_build
from specparity.serving.sglang.engine_messages import (
    exception_failure,
    gpu_query_failure,
    harness_gap_failure,
    unknown_architecture_failure,
)
from specparity.serving.sglang.meta_build import (
    build_meta_models,
    meta_gap_failure,
    read_capture,
    static_server_args,
)
from specparity.serving.sglang.setter_source import SetterTrace
from specparity.serving.sglang.since_0_4_4.common import FC_WIDTH_K, read_draft_ids, server_args_kwargs


def resolve_legacy(adapter: Any, request: Any) -> ResolvedDeployment | ServingFailure:
    """ServerArgs as deployed, the runner's id reader, the real target and draft built on the meta device
    (:mod:`.meta_build`), and the real setter on that target; no weights, no forward.

    ``adapter`` is the family's :class:`~.since_0_4_4.core.LegacyAdapter` (its ``_construct``, ``_deployment``,
    ``_boundary0_crash`` and glue).
    """
    t0 = time.perf_counter()
    try:
        resolved = static_server_args(lambda kw: adapter._construct(request, kw),
                                      server_args_kwargs(request, static=True), request.server_args,
                                      adapter.sglang_version)
        if isinstance(resolved, ServingFailure):
            return resolved
        sa, warnings, build_sa, notes = resolved
        t1 = time.perf_counter()
        from sglang.srt.configs.model_config import ModelConfig

        def configs(args: Any) -> tuple[Any, Any]:  # as ModelRunner.initialize loads them (0.5.3 :451-456)
            return (ModelConfig.from_server_args(args),
                    ModelConfig.from_server_args(args, model_path=args.speculative_draft_model_path,
                                                 is_draft_model=True))

        model_config, draft_config = configs(sa)
        ids = read_draft_ids(draft_config.hf_config)
        target, draft = build_meta_models(build_sa, *(configs(build_sa) if build_sa is not sa
                                                      else (model_config, draft_config)))
        cls = type(target)
        # Family A (<= 0.4.8) setters take no ids at all (0.4.8 models/llama.py:700): detected by signature.
        takes_ids = len(inspect.signature(cls.set_eagle3_layers_to_capture).parameters) > 1
        args = [None if ids is None else list(ids)] if takes_ids else []
        # As ModelRunner.initialize calls it (0.5.3 model_runner.py:458-470; 0.4.8 :307, no ids); the setters that
        # ran are cited from this release (setter_source.py)
        rule = SetterTrace(lambda model: getattr(model, "set_eagle3_layers_to_capture")(*args))  # noqa: B009
        setting = read_capture(target, rule)
        layers = list(setting.layers_to_capture) if setting.flag_owners else []
        crash = adapter._boundary0_crash(ids, layers, model_config=model_config, model_class=cls.__name__)
        if crash is not None:
            return crash
        draft_hf = draft_config.hf_config
        fc = fc_shape_from_checkpoint(Path(request.draft))
        h_t = int(getattr(draft_hf, "target_hidden_size", None) or draft_hf.hidden_size)
        if fc is not None and fc.in_features != FC_WIDTH_K * h_t:
            return ServingFailure(SGLANG_EXCEPTION, (
                f"predicted without loading weights: sglang {adapter.sglang_version} builds fc as "
                f"Linear({FC_WIDTH_K}*{h_t}, {draft_hf.hidden_size}) whatever the config says "
                f"({adapter.glue.fc_build_cite}; fc width fixed before 0.5.12), but the checkpoint's "
                f"{fc.weight_key} is [{fc.out_features}, {fc.in_features}]: SGLang's weight loader "
                "fails at start-up (AssertionError: Attempted to load weight ... into parameter ...)"))
        fc_t = ((fc.in_features, fc.out_features, fc.bias) if fc is not None
                else (FC_WIDTH_K * h_t, int(draft_hf.hidden_size), False))
        t2 = time.perf_counter()
        dep: ResolvedDeployment = adapter._deployment(
            request, sa, warnings, model_config=model_config, draft_hf_config=draft_hf, ids=ids,
            layers_to_capture=layers, fc=fc_t, model_class=cls.__name__,
            timings={"server_args_s": t1 - t0, "resolve_s": t2 - t1, "total_s": t2 - t0})
        dep = dataclasses.replace(
            dep, capture_owner=setting.owner, draft_model_class=draft.architecture, notes=(*dep.notes, *notes),
            capture_rule_source=rule.citations,
            draft_fc_module=(draft.fc_in_features, draft.fc_out_features, draft.fc_bias)
            if draft.fc_in_features is not None else None)
        # no fc.weight: the loader leaves fc randomly initialised; the shape is the config's
        return dep if fc is not None else dataclasses.replace(dep, fc_source="config: no fc.weight in checkpoint")
    except Exception as exc:  # SGLang raising during resolution is a typed result, not a crash
        version = adapter.sglang_version
        return (gpu_query_failure(exc, stage="while building the models on the meta device")
                or unknown_architecture_failure(exc, target=request.target, sglang_version=version,
                                                prefix="while resolving: ")
                or meta_gap_failure(exc, sglang_version=version, prefix="while resolving: ")
                or harness_gap_failure(exc, module_file=(__file__, meta_build.__file__), sglang_version=version,
                                       prefix="while resolving: ")
                or exception_failure(exc, prefix="while resolving: "))
