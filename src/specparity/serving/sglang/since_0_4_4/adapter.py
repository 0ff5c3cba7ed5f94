"""SGLang family B adapter, 0.4.9-0.5.10 (domain.md §6): the pre-worker-v2 glue, chosen by feature detection.

All behaviour lives in :mod:`.since_0_4_4.core` / :mod:`.since_0_4_4.run`; this module decides the :class:`~.since_0_4_4.run.LegacyGlue`
from what the installed SGLang has, never from its version number (:func:`detect_glue`):

- ``EagleDraftInput`` lives in ``speculative.eagle_info`` from 0.5.3 and in ``speculative.eagle_utils``
  before (:func:`draft_input_module`);
- ``ScheduleBatch.init_new`` takes ``enable_custom_logit_processor`` in 0.4.x (0.4.10.post2
  ``managers/schedule_batch.py:913``) and not in 0.5.3 (``:974-984``): passed iff its signature has it;
- the torch-drift shim (``compat_stubs/torch_drift``) is installed on CPU whenever torch lacks
  ``torch._C._cpu._is_amx_tile_supported`` (0.4.10.post2 ``srt/utils.py:217`` reads it at import); it never
  replaces an attribute torch has, so it is a no-op elsewhere;
- where the runner reads the ids / builds fc / crashes on boundary 0: the file:line of the nearest release we
  read (0.4.10.post2 for the ``eagle_utils`` layout, 0.5.3 for ``eagle_info``), for messages only;
- the KV pool's warm-up: the late family B (0.5.10 ``mem_cache/memory_pool.py:833``) launches the Triton kernel
  ``copy_all_layer_kv_cache_tiled`` at pool creation, as 0.5.14 does, which has no CPU driver ("0 active
  drivers"); on CPU the capture routes it to the recorded ``sgl_kernel`` stand-in
  (:func:`.run_common.install_kv_copy_stand_in`, which detects the launch itself; a no-op on 0.5.3/0.4.10).

Family-wide facts: ids read by ``ModelRunner.initialize`` AFTER the CUDA graphs were captured with no-arg
setter calls (D3, predicted by :func:`cuda_graph_hazard`); fc is ``Linear(3*H_t, H_d)`` whatever the config
says (D5). Runs only inside the child process.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
from typing import Any

from specparity.serving.results import ResolvedDeployment
from specparity.serving.sglang.since_0_4_4 import glue, shims
from specparity.serving.sglang.since_0_4_4.core import LegacyAdapter
from specparity.serving.sglang.since_0_4_4.run import LegacyGlue

EAGLE_INFO = "sglang.srt.speculative.eagle_info"
EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"
# domain.md §7 D3 (sglang #22836): in 0.4.9-0.5.10, CudaGraphRunner.__init__ and _dummy_run call the
# target's set_eagle3_layers_to_capture() with NO ids before ModelRunner.initialize reads the draft's ids
# (0.5.3 model_executor/model_runner.py:450-470, after init_device_graphs); fixed in 0.5.11 by
# init_aux_hidden_state_capture. Inferred from the call order, not executed (no GPU).
D3_CITE = ("sglang 0.5.3 model_executor/model_runner.py:450-470 reads the ids after CudaGraphRunner captured "
           "with set_eagle3_layers_to_capture() (domain.md D3, sglang #22836; fixed in 0.5.11)")


def draft_input_module(find_spec: Any = importlib.util.find_spec) -> str:
    """Where this SGLang keeps ``EagleDraftInput``: ``eagle_info`` (>= 0.5.3) if it exists, else ``eagle_utils``."""
    try:
        return EAGLE_INFO if find_spec(EAGLE_INFO) is not None else EAGLE_UTILS
    except ModuleNotFoundError:
        return EAGLE_UTILS


def batch_extra_kwargs(init_new: Any) -> dict[str, Any]:
    """Keywords ``ScheduleBatch.init_new`` requires beyond the common ones, read from its signature."""
    params = inspect.signature(init_new).parameters
    return {"enable_custom_logit_processor": False} if "enable_custom_logit_processor" in params else {}


def detect_glue(version: str) -> LegacyGlue:
    """The glue for the installed family-B SGLang, by what it has (import of ``schedule_batch`` is cheap)."""
    module = draft_input_module()
    nearest = glue.GLUE_0_5_3 if module == EAGLE_INFO else glue.GLUE_0_4_10
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    def read_in(cite: str) -> str:
        return cite if nearest.version_label == version else f"{cite} (read in {nearest.version_label})"

    return LegacyGlue(
        version_label=version, draft_input_module=module,
        batch_extra_kwargs=batch_extra_kwargs(ScheduleBatch.init_new), torch_drift=True,
        ids_reader_cite=read_in(nearest.ids_reader_cite),
        boundary0_crash_cite=read_in(nearest.boundary0_crash_cite),
        fc_build_cite=read_in(nearest.fc_build_cite))


def cuda_graph_hazard(*, device: str, cuda_graphs: bool, ids: tuple[int, ...] | None, num_layers: int) -> str | None:
    """D3 predicted statically: graph-replayed batches capture the DEFAULT boundaries, eager extend the ids.

    It bites a CUDA deployment with graphs on whose ids differ from the default ``[1, N//2-1, N-4]``
    (``b = [2, N//2, N-3]``); None when it cannot apply.
    """
    default = (1, num_layers // 2 - 1, num_layers - 4)
    if device != "cuda" or not cuda_graphs or ids is None or tuple(ids) == default:
        return None
    return (f"CUDA-graph ordering hazard: on this SGLang the CUDA graphs (decode/verify) capture the default "
            f"ids {list(default)} while the eager extend captures the configured {list(ids)}, so graph-replayed "
            f"batches feed fc other layers than the ones trained; {D3_CITE}. Fix: upgrade to sglang >= 0.5.11, "
            "or serve with --disable-cuda-graph, or train on the default ids")


class FamilyBAdapter(LegacyAdapter):
    """:class:`~.since_0_4_4.core.LegacyAdapter` whose glue is detected on first use, after the CPU shims are in."""

    reads_ids_after_graphs = True  # D3; family A reads no ids at all

    def __init__(self, *, sglang_version: str, name: str) -> None:
        # Until detection: only torch_drift matters (it is read before the first sglang import).
        super().__init__(sglang_version=sglang_version, name=name,
                         glue=LegacyGlue(version_label=sglang_version, draft_input_module="", torch_drift=True))
        self._detected = False

    def _detect(self, device: str) -> None:
        if not self._detected:
            shims.install(device=device, torch_drift=True)
            self.glue = detect_glue(self.sglang_version)
            self._detected = True

    def warm(self, device: str) -> None:
        """A warm zygote's imports (serving/child/zygote.py), after what resolve/capture do first: the CPU shims and
        the glue detection (old SGLang takes its vllm fallback, and builds its model registry, at import)."""
        from specparity.serving.sglang.child_setup import preload_engine_modules

        self._detect(device)
        preload_engine_modules()

    def _server_args(self, request: Any, *, extra_requests: int = 0, static: bool = False) -> tuple[Any, list[str]]:
        self._detect(request.device)
        return super()._server_args(request, extra_requests=extra_requests, static=static)

    def capture(self, request: Any, *, progress: Any) -> Any:
        self._detect(request.device)
        from specparity.serving.sglang.run_common import install_kv_copy_stand_in

        install_kv_copy_stand_in(request.device)  # only where the pool launches the Triton copy (0.5.10)
        return super().capture(request, progress=progress)

    def _deployment(self, request: Any, sa: Any, warnings: list[str], **kw: Any) -> ResolvedDeployment:
        dep = super()._deployment(request, sa, warnings, **kw)
        hazard = None if not self.reads_ids_after_graphs else cuda_graph_hazard(
            # the device the server args resolved for: the deployment's at the static level (cuda unless given,
            # since_0_4_4/static.py), this machine's CPU at the capture level
            device=str(getattr(sa, "device", None) or request.device),
            cuda_graphs=not bool(getattr(sa, "disable_cuda_graph", False)),
            ids=dep.draft_config_ids, num_layers=dep.num_layers)
        if hazard is None:
            return dep
        return dataclasses.replace(dep, adapter_notes=(
            *dep.adapter_notes, ("cuda_graph_ids_hazard", "error", hazard, D3_CITE)))


def make_adapter(*, sglang_version: str, name: str) -> FamilyBAdapter:
    """Registry hook (``adapter.load_adapter``)."""
    return FamilyBAdapter(sglang_version=sglang_version, name=name)
