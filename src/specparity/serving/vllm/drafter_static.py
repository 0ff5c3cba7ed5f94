"""vLLM's static facts for drafters other than the Llama-style EAGLE-3 head, from vLLM's own resolved
``VllmConfig`` and its own functions, in the gate's child: the MLA EAGLE-3 head (vllm 0.32
``model_executor/models/deepseek_eagle3.py``) and the DFlash drafter (``model_executor/models/qwen3_dflash.py``,
``v1/spec_decode/dflash.py``). Imported only where vLLM is."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from specparity.drafters import VLLM_METHOD, DrafterFamily, family_of
from specparity.serving.aux_env import read_aux_env
from specparity.serving.results import ResolvedDeployment

# vllm 0.32: where the DFlash path reads its ids (+1 on dflash_config.target_layer_ids, then the target's default) and
# sizes its fc (the ids' count, else the draft's num_hidden_layers)
READER = "v1/worker/gpu_model_runner.py:5251-5285 (_get_eagle3_aux_layers_from_config: dflash ids + 1)"
FC_WIDTH = "model_executor/models/qwen3_dflash.py:108-117 (_get_dflash_fc_input_size)"
DEFAULT = "v1/worker/gpu_model_runner.py:5230-5249 (get_eagle3_default_aux_hidden_state_layers)"
# the MLA head sizes fc as idrules.vllm.drafter_aux_count reads it (model_executor/models/deepseek_eagle3.py:189-199)


def draft_family(draft: str) -> DrafterFamily:
    try:
        cfg = json.loads((Path(draft) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return DrafterFamily.EAGLE3
    return family_of(cfg) if isinstance(cfg, dict) else DrafterFamily.EAGLE3


def method_for(draft: str) -> str:
    """The ``speculative_config.method`` the drafter's family is served with (the deployment's own wins)."""
    return VLLM_METHOD[draft_family(draft)]


def with_family(dep: ResolvedDeployment, vllm_config: Any, *, request: Any, method_assumed: bool) -> ResolvedDeployment:
    """``dep`` with the drafter's family, the method vLLM resolved, the aux-stream switches as vLLM reads them, and for a
    DFlash drafter the fc width vLLM's own function gives and the default it falls back to."""
    from specparity.serving.vllm.deployment import text_config_of

    sc = vllm_config.speculative_config
    family = draft_family(request.draft)
    env = read_aux_env("vllm", target_architecture=dep.target_architecture,
                       text_config=text_config_of(vllm_config.model_config))
    dep = replace(dep, drafter_family=family.value, speculative_algorithm=str(getattr(sc, "method", "") or ""),
                  aux_env=env)
    notes: list[tuple[str, str, str, str]] = []
    if method_assumed and family is not DrafterFamily.EAGLE3:
        notes.append(("speculative_algorithm_assumed", "warning",
                      f"the deployment names no speculative_config.method; a {family.label} is served with "
                      f"{dep.speculative_algorithm}, which specparity assumed from the draft config", "drafters.py"))
    for name, sw in env.items():
        if sw["applies"]:
            notes.append(("resolution_note", "info",
                          f"{name}={sw['value']} (default {sw['default']}) chooses the stream this target hands the "
                          f"drafter: {sw['effect']}; a drafter trained on the other stream is served it with no error",
                          f"vllm {dep.engine_version} {sw['cite']}"))
    if family is DrafterFamily.DSPARK:  # gamma draft tokens per block (config/speculative.py:1424-1470)
        dep = replace(dep, block_size=int(getattr(sc, "num_speculative_tokens", 0) or 0) or None)
    if family in (DrafterFamily.DFLASH, DrafterFamily.DSPARK):
        # Qwen3DSparkModel is a DFlashQwen3Model (vllm 0.32 models/qwen3_dspark.py:192): the same fc width function
        from vllm.model_executor.models.qwen3_dflash import _get_dflash_fc_input_size

        fc_in = int(_get_dflash_fc_input_size(vllm_config))
        dep = replace(dep, num_aux_hidden_states=fc_in // max(1, dep.target_hidden_size), fc_applied=True)
        if dep.fc_source != "checkpoint":  # no fc.weight to read: the width vLLM's own function builds
            dep = replace(dep, fc_in_features=fc_in, fc_source=f"config: vllm {FC_WIDTH}")
        if dep.draft_config_ids is None:
            why = (f"dflash_config.target_layer_ids is not set: vLLM's reader finds no ids ({READER}) and the target "
                   f"serves its EAGLE-3 default {', '.join(dep.served_sources)} ({DEFAULT}), while the drafter's fc "
                   f"is sized from its {fc_in // max(1, dep.target_hidden_size)} layers ({FC_WIDTH})")
            dep = replace(dep, ids_fallback_reason=why)
            key = "target_layer_ids" if family is DrafterFamily.DSPARK else "dflash_config.target_layer_ids"
            notes.append(("default_ids_fallback", "warning", why + "; write the ids the drafter was trained on as "
                          + key, f"vllm {dep.engine_version} {READER}"))
    return replace(dep, adapter_notes=(*dep.adapter_notes, *notes))
