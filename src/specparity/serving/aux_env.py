"""Engine environment switches that choose which residual stream the aux hidden states come from.

The environment is part of the deployment: the same draft config and target serve other tensors to fc when one of
these is set otherwise. Each switch is read in the engine's child through the engine's own environment module (its
parser, its default), never parsed here; a release without the switch reports nothing for it.

Found by reading the installed releases' model files:

- vLLM 0.32 ``VLLM_KIMI_K3_AUX_ATTN_RES_STREAM`` (``envs.py:1674-1680``): on a Kimi-K3 target with attention residuals
  (``attn_res_block_size`` set, ``models/kimi_k3/nvidia/model.py:1124-1125``), 1 hands the drafter the pre-norm
  AttnRes mixture its next layer would read, 0 (the default) the prefix sum (``_capture_aux_hidden_stream``,
  ``models/kimi_k3/nvidia/model.py:1243-1276``). A drafter trained on one stream is served the other with no error.
- SGLang 0.5.23 has no such switch: its Kimi-K3 capture on the attention-residual path always takes the mixture
  (``models/kimi_k3.py:2955-2981``, ``_dspark_capture_stream``); ``SGLANG_K3_SP_ATTN_RES`` only decides whether the
  rows can be captured at all, and is off under speculative decoding (``models/kimi_k3.py:2408-2430``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AuxEnvSwitch:
    name: str
    module: str  # the engine's environment module, whose attribute of the same name is the engine's own reading
    default: str
    consumers: tuple[str, ...]  # target architectures whose aux capture reads it
    config_key: str  # the target text-config key that must be set for the consumer to read it
    cite: str
    effect: str


SWITCHES: dict[str, tuple[AuxEnvSwitch, ...]] = {
    "vllm": (
        AuxEnvSwitch(
            name="VLLM_KIMI_K3_AUX_ATTN_RES_STREAM", module="vllm.envs", default="0",
            consumers=("KimiK3ForConditionalGeneration",), config_key="attn_res_block_size",
            cite="vllm envs.py VLLM_KIMI_K3_AUX_ATTN_RES_STREAM (0.32: envs.py:1674-1680); "
                 "models/kimi_k3/nvidia/model.py:1243-1276 _capture_aux_hidden_stream",
            effect="1: the pre-norm AttnRes mixture the next layer reads; 0: the prefix sum (the default)"),
    ),
    "sglang": (),
}


def read_aux_env(engine: str, *, target_architecture: str, text_config: Any) -> dict[str, Any]:
    """The switches of ``engine`` the installed release has, as the engine reads them here: name -> value (as the
    engine parsed it), the release's default, whether this target's capture reads it, the citation and its effect."""
    out: dict[str, Any] = {}
    for sw in SWITCHES.get(engine, ()):
        try:
            module = importlib.import_module(sw.module)
        except ImportError:
            continue
        if sw.name not in getattr(module, "environment_variables", {}) and not hasattr(module, sw.name):
            continue  # this release has no such switch
        value = getattr(module, sw.name)
        applies = (target_architecture in sw.consumers
                   and getattr(text_config, sw.config_key, None) is not None)
        out[sw.name] = {"value": str(int(value)) if isinstance(value, bool) else str(value), "default": sw.default,
                        "applies": applies, "cite": sw.cite, "effect": sw.effect}
    return out
