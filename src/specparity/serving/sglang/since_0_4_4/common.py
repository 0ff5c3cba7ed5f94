"""What the pre-worker-v2 adapter (:mod:`.since_0_4_4.core`) and its static level (:mod:`.since_0_4_4.static`) share for
families A and B: the ServerArgs keywords, the fixed fc width, and the runner's own draft-id reader."""

from __future__ import annotations

from typing import Any

from specparity.serving.child.worker_common import WorkerRequest
from specparity.serving.engine_values import decode_args
from specparity.serving.sglang.child_setup import cpu_mem_fraction

FC_WIDTH_K = 3  # fc = Linear(hidden_size_in * 3, ...) before 0.5.12 (0.5.3 models/llama_eagle3.py:134-138)


def server_args_kwargs(request: WorkerRequest, *, extra_requests: int = 0, static: bool = False) -> dict[str, Any]:
    """ServerArgs keywords: harness defaults, then the user's args (the user wins), then the models.

    ``static``: the deployment's own args only. The CPU overrides exist to run a forward here; the static level
    runs none, and per-architecture validations depend on them (0.5.3 ``server_args.py:733-747`` asserts
    gpt-oss's attention backend)."""
    kw: dict[str, Any] = {"device": request.device, "log_level": "warning", "skip_tokenizer_init": True}
    if request.device == "cpu" and not static:
        # No CPU EAGLE attention/graphs; fp32 keeps the capture bit-exact vs HF (sglang-cpu.md §9, §10).
        total = sum(len(p) for p in request.probes)
        kw.update(attention_backend="torch_native", dtype="float32", disable_cuda_graph=True,
                  disable_overlap_schedule=True,
                  mem_fraction_static=cpu_mem_fraction(request.target, request.draft),
                  max_total_tokens=max(4096, 4 * total + 256))
    if extra_requests:
        kw["max_running_requests"] = max(48, extra_requests + 8)
    kw.update(decode_args(request.server_args))  # as SGLang's parser made them (serving/engine_values.py)
    kw.update(model_path=request.target, speculative_draft_model_path=request.draft,
              speculative_algorithm=request.server_args.get("speculative_algorithm", "EAGLE3"))
    return kw


def read_draft_ids(draft_hf_config: Any) -> tuple[int, ...] | None:
    """The runner's own reader, re-typed for the static path (0.5.3 ``model_runner.py:458-466``).

    The capture path never uses this: there the argument SGLang passed to the setter is recorded.
    """
    try:
        eagle_config = getattr(draft_hf_config, "eagle_config", None)
        ids = eagle_config["eagle_aux_hidden_state_layer_ids"]  # type: ignore[index]
    except Exception:  # SGLang uses a bare except here; so must a faithful copy
        ids = None
    return None if ids is None else tuple(int(x) for x in ids)
