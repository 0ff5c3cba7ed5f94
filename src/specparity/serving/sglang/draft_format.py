"""Draft configs SGLang cannot read at all, caught before SGLang is asked (no sglang import here).

SGLang reads the draft's ``config.json`` through transformers' ``AutoConfig`` (sglang 0.5.23
``configs/model_config.py`` via ``utils/hf_transformers_utils.py`` ``get_config``), which needs a
``model_type``; its EAGLE-3 draft class is picked from ``architectures`` (``LlamaForCausalLMEagle3``,
``models/llama_eagle3.py``), and the target reads the ids only from the nested
``eagle_config.eagle_aux_hidden_state_layer_ids`` (domain.md D11). A speculators-format config
(``speculators_model_type: eagle3``, ids top level, layer settings in ``transformer_layer_config``)
has none of these, so SGLang fails deep inside transformers with a message that does not say why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specparity.serving.results import DRAFT_UNREADABLE, ServingFailure


def _speculators_fix(cfg: dict[str, Any]) -> str:
    layer = cfg.get("transformer_layer_config") or {}
    model_type = layer.get("model_type", "llama") if isinstance(layer, dict) else "llama"
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    ids_text = (
        f"; speculators ids {ids} are vLLM boundary indices, so the SGLang ids for the same layers are "
        f"{[i - 1 for i in ids]} on a llama-style target"
        if isinstance(ids, list) and all(isinstance(i, int) for i in ids)
        else ""
    )
    return (
        "convert it to SGLang's EAGLE-3 format: take transformer_layer_config's fields to the top level "
        f'(model_type "{model_type}"), set "architectures": ["LlamaForCausalLMEagle3"], keep '
        'draft_vocab_size and target_hidden_size, and move the ids into "eagle_config": '
        '{"eagle_aux_hidden_state_layer_ids": [...], "use_aux_hidden_state": true}' + ids_text
        + " (domain.md §3.1, §8); the weights keep their names"
    )


def unreadable_draft(draft_dir: Path) -> ServingFailure | None:
    """``draft_unreadable`` naming the file, the field and the conversion; None when SGLang can read it."""
    path = draft_dir / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return ServingFailure(DRAFT_UNREADABLE, f"{path}: not readable JSON ({e})")
    if not isinstance(cfg, dict):
        return ServingFailure(DRAFT_UNREADABLE, f"{path}: expected a JSON object, got {type(cfg).__name__}")
    if cfg.get("model_type"):
        return None
    if cfg.get("speculators_model_type"):
        return ServingFailure(
            DRAFT_UNREADABLE,
            f"{path}: model_type is missing: this is a speculators-format config "
            f"(speculators_model_type {cfg['speculators_model_type']!r}), which vLLM reads but SGLang does not; "
            "SGLang needs a transformers config with model_type and an EAGLE-3 draft class in architectures. "
            + _speculators_fix(cfg),
        )
    return ServingFailure(
        DRAFT_UNREADABLE,
        f"{path}: model_type is missing; SGLang reads the draft with transformers' AutoConfig, which needs "
        'model_type (e.g. "llama") and "architectures": ["LlamaForCausalLMEagle3"] for an EAGLE-3 draft',
    )
