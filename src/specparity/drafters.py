"""The drafter families specparity knows, read from a draft's ``config.json`` (docs/engines.md, drafter families).

A family decides which engine path serves the drafter, and so which of the engine's code resolves it:

- ``eagle3``: a Llama-style EAGLE-3 head (SpecForge ``LlamaForCausalLMEagle3``, vLLM ``Eagle3LlamaForCausalLM``,
  speculators ``Eagle3Speculator``): SGLang ``--speculative-algorithm EAGLE3``, vLLM ``method: eagle3``.
- ``eagle3-mla``: an EAGLE-3 head with DeepSeek multi-latent attention (Kimi's ``eagle3-mla`` drafters, TorchSpec's MLA
  heads): the same EAGLE-3 path and id reader, another drafter class (sglang 0.5.23 ``models/kimi_k25_eagle3.py``,
  vllm 0.32 ``model_executor/models/deepseek_eagle3.py``).
- ``dflash``: a block-diffusion drafter reading ``dflash_config.target_layer_ids``: SGLang ``--speculative-algorithm
  DFLASH`` (sglang 0.5.23 ``models/dflash.py``), vLLM ``method: dflash`` (vllm 0.32 ``models/qwen3_dflash.py``).
- ``dspark``: DSpark drafters (a top-level ``target_layer_ids``, ``dspark_target_layer_ids`` or ``dflash_config``'s):
  SGLang ``--speculative-algorithm DSPARK`` (sglang 0.5.23 ``models/dspark.py``), vLLM ``method: dspark`` (vllm 0.32
  ``models/qwen3_dspark.py``): the static level and ``explain``.

Pure: reads a dict, imports nothing of specparity.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any


class DrafterFamily(str, enum.Enum):
    EAGLE3 = "eagle3"
    EAGLE3_MLA = "eagle3-mla"
    DFLASH = "dflash"
    DSPARK = "dspark"

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {
    DrafterFamily.EAGLE3: "Llama-style EAGLE-3 head",
    DrafterFamily.EAGLE3_MLA: "MLA EAGLE-3 head (DeepSeek-style attention)",
    DrafterFamily.DFLASH: "DFlash (block-diffusion drafter)",
    DrafterFamily.DSPARK: "DSpark",
}

# The speculative algorithm each family is served with: SGLang's --speculative-algorithm, vLLM's
# speculative_config.method. The deployment's own choice wins wherever it names one.
SGLANG_ALGORITHM = {DrafterFamily.EAGLE3: "EAGLE3", DrafterFamily.EAGLE3_MLA: "EAGLE3",
                    DrafterFamily.DFLASH: "DFLASH", DrafterFamily.DSPARK: "DSPARK"}
VLLM_METHOD = {DrafterFamily.EAGLE3: "eagle3", DrafterFamily.EAGLE3_MLA: "eagle3",
               DrafterFamily.DFLASH: "dflash", DrafterFamily.DSPARK: "dspark"}


def _architectures(cfg: Mapping[str, Any]) -> str:
    archs = cfg.get("architectures")
    return " ".join(a for a in archs if isinstance(a, str)) if isinstance(archs, list) else ""


def family_of(cfg: Mapping[str, Any]) -> DrafterFamily:
    """The family of a draft config (a Llama-style EAGLE-3 head unless something in it says otherwise).

    DSpark first: a DSpark draft may carry a ``dflash_config`` (vLLM's Qwen3 DSpark loader reads one, vllm 0.32
    ``config/speculative.py:1424-1431``), yet it is served through another path than DFlash's.
    """
    arch = _architectures(cfg).lower()
    if "dspark" in arch or cfg.get("speculators_model_type") == "dspark":
        return DrafterFamily.DSPARK
    if "dflash" in arch or "dflash_config" in cfg:
        return DrafterFamily.DFLASH
    if "eagle3" in arch and ("deepseek" in arch or "kv_lora_rank" in cfg):
        return DrafterFamily.EAGLE3_MLA
    return DrafterFamily.EAGLE3


def family_words(cfg: Mapping[str, Any]) -> str:
    """The family and what in the config says so, for messages."""
    family = family_of(cfg)
    arch = _architectures(cfg)
    dflash = cfg.get("dflash_config")
    ids = f", dflash_config.target_layer_ids {dflash.get('target_layer_ids')}" if isinstance(dflash, dict) else ""
    for key in ("dspark_target_layer_ids", "target_layer_ids"):
        if family is DrafterFamily.DSPARK and key in cfg:
            ids += f", {key} {cfg[key]}"
    return f"{family.label}: architectures {arch or 'none'}{ids}"
