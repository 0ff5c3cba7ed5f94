"""Static resolution for SGLang families C/D releases without the 0.5.23 module layout (0.5.11-0.5.15).

What runs is SGLang's own: ``ServerArgs`` as deployed (its ``__post_init__`` resolves and rewrites the
speculative triple, 0.5.14 ``server_args.py:2456``), ``ModelConfig`` for target and draft, the model class
SGLang's loader picks, and that class's real ``set_eagle3_layers_to_capture``. Two steps differ from the 0.5.23 static level, and say so:

- the ids: these releases read them inside ``ModelRunner.__init__`` (0.5.14
  ``model_executor/model_runner.py:458-472``: ``use_aux_hidden_state`` and the nested ids, bare ``except`` ->
  ``None``), which cannot run without loading weights; :func:`read_ids` is that block, re-typed;
- the objects: target and draft are built on the meta device by SGLang's own ``_initialize_model`` after a
  one-rank world set up with SGLang's own functions (:mod:`.meta_build`, shared with families A and B), as
  ``ModelRunner.init_torch_distributed`` and ``load_model`` do (0.5.14 ``model_runner.py:1145-1240``).

The capture level (real forward, :mod:`.since_0_5_11.run_compat`) checks both against SGLang's own objects.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from specparity.checkpoint_files import fc_shape_from_checkpoint
from specparity.serving.results import SGLANG_EXCEPTION, ResolvedDeployment, ServingFailure
from specparity.serving.sglang.engine_messages import (
    collect_sglang_warnings,
    exception_failure,
    gpu_query_failure,
    unknown_architecture_failure,
)
from specparity.serving.sglang.meta_build import build_meta_model, init_single_rank, meta_gap_failure
from specparity.serving.sglang.setter_source import SetterTrace

IDS_CITE = "sglang 0.5.14 model_executor/model_runner.py:458-472 (re-typed: it runs inside ModelRunner.__init__)"
STATIC_NOTE = ("static level on a pre-0.5.16 layout: the draft ids were read by a re-typed copy of "
               f"{IDS_CITE}; the capture level runs SGLang's own reader")


def read_ids(draft_hf_config: Any) -> tuple[bool, Any]:
    """``(use_aux_hidden_state, ids)`` exactly as 0.5.14 ``model_runner.py:458-472`` computes them."""
    use_aux = True
    try:
        eagle_config = getattr(draft_hf_config, "eagle_config", None)
        use_aux = eagle_config.get("use_aux_hidden_state", True)  # type: ignore[union-attr]
        ids = eagle_config["eagle_aux_hidden_state_layer_ids"]  # type: ignore[index]
    except Exception:  # SGLang's bare except: no aux layer -> None
        ids = None
    return bool(use_aux), ids


def read_ids_with_sglang(sa: Any, model_config: Any) -> tuple[bool, Any] | None:
    """``(use_aux_hidden_state, ids)`` from SGLang's own reader where it is a function of its own (0.5.16+
    ``model_runner_components.spec_aux_hidden_state.resolve_spec_aux_hidden_state_config``, e.g. 0.5.20
    ``:49-72``, as ``ModelRunner`` calls it for the target); None before (read inside ``ModelRunner.__init__``)."""
    try:
        from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (
            resolve_spec_aux_hidden_state_config,
        )
    except ImportError:
        return None
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    spec = resolve_spec_aux_hidden_state_config(
        server_args=sa, model_config=model_config, is_draft_worker=False,
        spec_algorithm=SpeculativeAlgorithm.from_string(sa.speculative_algorithm))
    return bool(spec.eagle_use_aux_hidden_state), spec.eagle_aux_hidden_state_layer_ids


def _server_args(kw: dict[str, Any]) -> tuple[Any, list[str]]:
    from sglang.srt.server_args import ServerArgs

    with collect_sglang_warnings() as warnings:
        sa = ServerArgs(**kw)
        if hasattr(sa, "resolve_once"):
            sa.resolve_once()
    return sa, list(warnings)


def _boundary0_crash(version: str, ids: Any, layers: tuple[int, ...], *, num_layers: int,
                     model_class: str) -> ServingFailure | None:
    """Boundary 0 crashes llama-style loops before 0.5.22 (D9): never claim it is served."""
    if 0 not in layers:
        return None
    from specparity.idrules import sglang

    plan = sglang.capture_plan(None if ids is None else list(ids), num_layers=num_layers, architecture=model_class,
                               version=version)
    if plan.crash is None:
        return None
    return ServingFailure(SGLANG_EXCEPTION, (
        f"predicted without a forward: {plan.crash} at {model_class}'s model file: layers_to_capture "
        f"{list(layers)} holds the embedding boundary, and layer 0 computes hidden_states + residual with "
        f"residual None on sglang {version} (the embedding is served from 0.5.22 on); a capture run raises it"))


def resolve_static_c(adapter: Any, request: Any) -> ResolvedDeployment | ServingFailure:
    """The static level on 0.5.11-0.5.15 (see the module docstring for what differs from 0.5.23)."""
    from specparity.serving.sglang.draft_format import unreadable_draft
    from specparity.serving.sglang.drafter_facts import draft_k
    from specparity.serving.sglang.meta_build import draft_shape, read_capture, static_server_args
    from specparity.serving.sglang.since_0_5_11.static import (
        fc_as_built,
        setter_call,
        static_server_args_kwargs,
    )

    bad = unreadable_draft(Path(request.draft))
    if bad is not None:
        return bad
    t0 = time.perf_counter()
    kw = static_server_args_kwargs(request)
    notes = [STATIC_NOTE]
    try:
        resolved = static_server_args(_server_args, kw, request.server_args, adapter.sglang_version)
        if isinstance(resolved, ServingFailure):
            return resolved
        sa, warnings, build_sa, more_notes = resolved
        notes.extend(more_notes)
        t1 = time.perf_counter()
        adapter._publish(sa)
        from sglang.srt.configs.model_config import ModelConfig

        model_config = ModelConfig.from_server_args(sa)
        draft_mc = ModelConfig.from_server_args(sa, model_path=sa.speculative_draft_model_path, is_draft_model=True)
        real = read_ids_with_sglang(sa, model_config)  # family D (0.5.20): SGLang's own reader
        use_aux, ids = real if real is not None else read_ids(draft_mc.hf_config)
        if real is not None:
            notes.remove(STATIC_NOTE)
        if build_sa is not sa:  # rank 0 of a one-rank world on this machine's CPU (since_0_4_4.static.static_server_args)
            adapter._publish(build_sa)
        build_mc = ModelConfig.from_server_args(build_sa)
        init_single_rank(build_sa, build_mc)
        target = build_meta_model(build_mc, build_sa)
        # ModelRunner.init_aux_hidden_state_capture (0.5.14 model_runner.py:1002-1011)
        rule = SetterTrace(setter_call(None if ids is None else [int(x) for x in ids]))  # cited as it runs
        setting = read_capture(target, rule) if use_aux else None
        layers = setting.layers_to_capture if setting is not None else ()
        draft = draft_shape(build_meta_model(ModelConfig.from_server_args(
            build_sa, model_path=build_sa.speculative_draft_model_path, is_draft_model=True), build_sa))
        cls = type(target)
        num_layers = int(model_config.hf_text_config.num_hidden_layers)
        crash = _boundary0_crash(adapter.sglang_version, ids, layers, num_layers=num_layers, model_class=cls.__name__)
        if crash is not None:
            return crash
    except Exception as exc:  # SGLang raising during resolution is a typed result, not a crash
        return (gpu_query_failure(exc, stage="while building the models on the meta device")
                or meta_gap_failure(exc, sglang_version=adapter.sglang_version, prefix="while resolving: ")
                or unknown_architecture_failure(exc, target=request.target, sglang_version=adapter.sglang_version,
                                                prefix="while resolving: ")
                or exception_failure(exc, prefix="while resolving: "))
    t2 = time.perf_counter()
    draft_hf = draft_mc.hf_config
    k = draft.num_aux_hidden_states or draft_k(draft_hf)  # as constructed (0.5.12+ models/llama_eagle3.py)
    ckpt = fc_shape_from_checkpoint(Path(request.draft))
    fc = fc_as_built(ckpt, draft, draft_hf, k)
    dep = adapter._deployment(
        request, sa, warnings, model_config=model_config, draft_hf_config=draft_hf, ids=ids,
        layers_to_capture=list(layers), fc=fc, k=k, model_class=cls.__name__,
        timings={"server_args_s": t1 - t0, "resolve_s": t2 - t1, "total_s": t2 - t0})
    return dataclasses.replace(
        dep, fc_source="checkpoint" if ckpt is not None else "config: no fc.weight in checkpoint",
        capture_owner=setting.owner if setting is not None else "", draft_model_class=draft.architecture,
        draft_fc_module=(draft.fc_in_features, draft.fc_out_features, draft.fc_bias)
        if draft.fc_in_features is not None else None, notes=(*dep.notes, *notes),
        capture_rule_source=rule.citations)
