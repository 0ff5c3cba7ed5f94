"""SGLang families C, D and E, 0.5.11-0.5.23 (domain.md §6): the worker-v2 adapter, differences by feature detection.

These releases share the shape the 0.5.23 adapter drives (``TpModelWorker`` + ``EAGLEWorkerV2``, ids set
before CUDA graphs). Where the installed SGLang has the 0.5.23 layout (``runtime_context.publish``,
``arg_groups.model_override_base.resolved_view``, ``model_runner_components``), :mod:`.since_0_5_11.core` runs
unchanged. Otherwise :class:`FamilyEAdapter` swaps in what this SGLang has, each found by detection:

- ServerArgs: ``resolve_once()`` where it exists; before, the constructor's ``__post_init__`` resolves and
  rewrites the speculative attributes in place (0.5.14 ``server_args.py:2456``);
- the resolved view: ``arg_groups.model_override_base`` (0.5.19+), ``arg_groups.overrides`` (0.5.15, 0.5.18),
  else the attribute itself (it is rewritten, domain.md §5);
- process set-up: ``runtime_context.publish`` or, before it, ``set_global_server_args_for_scheduler``;
- where the target reads the ids: ``model_runner_components.spec_aux_hidden_state`` (0.5.16+) or
  ``ModelRunner.__init__`` itself (0.5.11-0.5.15, 0.5.14 ``model_executor/model_runner.py:458-472``);
- worker keywords, the draft worker, FULL capture and request fields: :mod:`.since_0_5_11.run_compat`;
- boundary 0 (``embedding``): capturable on llama-style loops only with ``layers.layer_boundary`` (0.5.22+).
  Family D (0.5.17-0.5.21) has the whole 0.5.23 module layout but not ``layer_boundary``: there the atlas
  reads the embedding by a pre-hook on layer 0 (:func:`.run_compat.layer_atlas`) and the static level
  reports a capture list holding boundary 0 as the crash it is (0.5.20 ``models/llama.py:442`` computes
  ``hidden_states + residual`` with ``residual`` None at layer 0, D9), as families B/C do.

Runs only inside the child process.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from functools import partial
from types import SimpleNamespace
from typing import Any

from specparity.serving.child.worker_common import WorkerRequest
from specparity.serving.results import CaptureResult, ResolvedDeployment, ServingFailure
from specparity.serving.sglang.engine_messages import collect_sglang_warnings
from specparity.serving.sglang.since_0_5_11 import run, run_compat
from specparity.serving.sglang.since_0_5_11.core import Adapter, server_args_kwargs


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def has_0523_layout() -> bool:
    """The installed SGLang has every module the unchanged 0.5.23 adapter imports, and its process set-up:
    ``runtime_context.publish(..., ranks=SpawnRanks)`` (0.5.20 has the modules but ``publish(server_args, *,
    role, hf_config)``, ``runtime_context.py:1571``, and no ``bootstrap.init_parallel_runtime``)."""
    return all(_has_module(m) for m in (
        "sglang.srt.arg_groups.model_override_base", "sglang.srt.distributed.bootstrap",
        "sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state", "sglang.benchmark.one_batch",
    )) and publish_style() == "ranks"


def publish_style() -> str:
    """How this SGLang publishes its process context: ``ranks`` (0.5.23 ``publish(sa, role=, ranks=)``),
    ``role`` (0.5.20 ``publish(sa, *, role, hf_config=None)``, as ``benchmark/one_batch.py:700`` calls it) or
    ``global`` (0.5.14: ``set_global_server_args_for_scheduler``, no ``runtime_context.publish``)."""
    import inspect

    try:
        publish = getattr(importlib.import_module("sglang.srt.runtime_context"), "publish", None)
    except ImportError:
        publish = None
    if publish is None:
        return "global"
    return "ranks" if "ranks" in inspect.signature(publish).parameters else "role"


def embedding_capturable() -> bool:
    """Boundary 0 reaches llama-style capture only after the 0.5.22 ``layer_boundary`` refactor (D9)."""
    return _has_module("sglang.srt.layers.layer_boundary")


def norm_before_fc_supported() -> bool:
    """Whether this SGLang's EAGLE-3 drafter can build ``norm_before_fc`` (0.5.17+, D5): its ``LlamaModel``
    constructor assigns ``input_norm`` (0.5.23 ``models/llama_eagle3.py:169-182``); 0.5.14's never does."""
    from sglang.srt.models.llama_eagle3 import LlamaModel

    return "input_norm" in LlamaModel.__init__.__code__.co_names


def with_norm_support(dep: ResolvedDeployment, draft_dir: str) -> ResolvedDeployment:
    """Mark ``norm_before_fc`` unsupported where the drafter cannot build it, and whether the config asks for it."""
    if norm_before_fc_supported():
        return dep
    import json
    from pathlib import Path

    try:
        cfg = json.loads((Path(draft_dir) / "config.json").read_text())
    except (OSError, ValueError):
        cfg = {}
    ec = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else {}
    asked = bool(ec.get("norm_before_fc", cfg.get("norm_before_fc", False)))
    return dataclasses.replace(dep, norm_before_fc=False, unsupported_norms=("norm_before_fc",),
                               ignored_norm_config=("norm_before_fc",) if asked else ())


def resolved_view_function() -> Any:
    """SGLang's ``resolved_view`` where it has one, else the identity (the attribute is the resolved value)."""
    for name in ("sglang.srt.arg_groups.model_override_base", "sglang.srt.arg_groups.overrides"):
        try:
            fn = getattr(importlib.import_module(name), "resolved_view", None)
        except ImportError:
            continue
        if fn is not None:
            return fn
    return lambda sa: sa


def boundary0_crash(dep: ResolvedDeployment) -> ServingFailure | None:
    """Before ``layer_boundary`` (0.5.22), a capture list holding boundary 0 crashes llama-style loops (D9):
    the static level must say so, never claim the embedding is served (the capture level raises it)."""
    from specparity.serving.sglang.since_0_5_11.static_compat import _boundary0_crash

    return _boundary0_crash(dep.engine_version, dep.draft_config_ids, dep.layers_to_capture,
                            num_layers=dep.num_layers, model_class=dep.target_architecture)


class FamilyEAdapter(Adapter):
    """:class:`~.since_0_5_11.core.Adapter` with the feature-detected glue of families C/D where 0.5.23's is missing."""

    def __init__(self, *, sglang_version: str, name: str) -> None:
        super().__init__(sglang_version=sglang_version, name=name)
        self.layout_0523 = has_0523_layout()
        self.embedding_capturable = embedding_capturable()
        if self.layout_0523 and not self.embedding_capturable:  # family D: 0.5.23's glue, no boundary 0
            self.run = SimpleNamespace(
                start_workers=run.start_workers, spec_prefill=run.spec_prefill,
                layer_atlas=partial(run_compat.layer_atlas, embedding_capturable=False), FcTap=run.FcTap,
                kernel_stub_calls=run.kernel_stub_calls, kernel_stub_active=run.kernel_stub_active)
        elif not self.layout_0523:
            atlas = partial(run_compat.layer_atlas, embedding_capturable=self.embedding_capturable)
            self.run = SimpleNamespace(
                start_workers=run_compat.start_workers, spec_prefill=run_compat.spec_prefill,
                layer_atlas=atlas, FcTap=run.FcTap, kernel_stub_calls=run.kernel_stub_calls,
                kernel_stub_active=run.kernel_stub_active)

    def _server_args(self, request: WorkerRequest, *, extra_requests: int = 0) -> tuple[Any, list[str]]:
        if self.layout_0523:
            return super()._server_args(request, extra_requests=extra_requests)
        from sglang.srt.server_args import ServerArgs

        with collect_sglang_warnings() as warnings:
            sa = ServerArgs(**server_args_kwargs(request, extra_requests=extra_requests))
            if hasattr(sa, "resolve_once"):
                sa.resolve_once()
        return sa, list(warnings)

    def _publish(self, sa: Any) -> None:
        style = publish_style()
        if style == "ranks":
            super()._publish(sa)
            return
        if style == "role":
            from sglang.srt.runtime_context import publish

            publish(sa, role="scheduler")
            return
        from sglang.srt.server_args import set_global_server_args_for_scheduler

        set_global_server_args_for_scheduler(sa)

    def _resolved_view(self, sa: Any) -> Any:
        return super()._resolved_view(sa) if self.layout_0523 else resolved_view_function()(sa)

    def _runner_ids(self, model_runner: Any) -> Any:
        return run_compat.runner_ids(model_runner)

    def resolve(self, request: WorkerRequest) -> ResolvedDeployment | ServingFailure:
        if self.layout_0523:
            result = super().resolve(request)
            if self.embedding_capturable or not isinstance(result, ResolvedDeployment):
                return result
            return boundary0_crash(result) or result
        from specparity.serving.sglang.since_0_5_11.static_compat import resolve_static_c

        result = resolve_static_c(self, request)
        return with_norm_support(result, request.draft) if isinstance(result, ResolvedDeployment) else result

    def capture(self, request: WorkerRequest, *, progress: Any) -> CaptureResult:
        result = super().capture(request, progress=progress)
        if self.layout_0523 or result.deployment is None:
            return result
        return dataclasses.replace(result, deployment=with_norm_support(result.deployment, request.draft))


def make_adapter(*, sglang_version: str, name: str) -> FamilyEAdapter:
    """Registry hook (``adapter.load_adapter``)."""
    return FamilyEAdapter(sglang_version=sglang_version, name=name)
