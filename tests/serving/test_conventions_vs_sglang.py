"""Pin the SGLang capture model of specparity.idrules.sglang against the installed SGLang's own setters.

Each case runs SGLang's real ``set_eagle3_layers_to_capture`` (unbound, on a stand-in ``self`` that carries
exactly the attributes the setter reads: ``pp_group.is_last_rank``, ``config.num_hidden_layers`` or
``config.text_config.num_hidden_layers``, ``model.layers_to_capture``, ``model.layers``,
``capture_aux_hidden_states``; Kimi-K2.5 reads ``language_model``). Building the real model classes would need
SGLang's process-global parallel/runtime setup; the setter body itself is SGLang's, unmodified. A stand-in
lacking an attribute the setter reads raises AttributeError, so a drifted setter fails here instead of passing.
"""

from __future__ import annotations

import importlib.metadata
import os
import types
from typing import Any

import pytest
from version_facts import SGLANG_VERSION as _INSTALLED

from specparity.idrules import sglang
from specparity.serving.sglang.adapter import AdapterEntry, select_adapter
from specparity.serving.sglang.worker import install_kernel_stub_if_needed

# Guarded BEFORE any sglang import: this module imports model classes only 0.5.23 has (kimi_k25, minimax_m3,
# glm4_moe_lite) and runs SGLang in the pytest process without the old versions' CPU shims. The older
# families' own llama/qwen setters are pinned against the conventions model by
# tests/serving/test_versions.py::test_conventions_equal_this_versions_real_setters (a child with the shims).
_ENTRY = select_adapter(_INSTALLED) if _INSTALLED is not None else None
if isinstance(_ENTRY, AdapterEntry) and _INSTALLED != "0.5.23":
    pytest.skip(f"sglang {_INSTALLED} ({_ENTRY.name}) lacks the 0.5.23 model classes this module imports; its own "
                "setters are covered by tests/serving/test_versions.py::test_conventions_equal_this_versions_real_"
                "setters", allow_module_level=True)

os.environ["SGLANG_USE_CPU_ENGINE"] = "1"  # before the first sglang import: is_cpu() is lru_cached
install_kernel_stub_if_needed("cpu")  # the product's own sgl_kernel stand-in, as the serving child uses it

try:
    from sglang.srt.models import (
        deepseek_v2,
        glm4_moe_lite,
        gpt_oss,
        kimi_k25,
        llama,
        minimax_m3,
        minimax_m3_vl,
        qwen2,
        qwen3,
    )
except ImportError as e:  # a missing sglang is an environment failure, never a skip
    pytest.fail(
        f"tests/serving needs SGLang importable (pip install the constraints/ pins): {e}", pytrace=False
    )

pytestmark = pytest.mark.sglang

SGLANG_VERSION = importlib.metadata.version("sglang")
_UNSET = ["unset"]

# architecture name -> the real class whose setter runs
SETTERS: dict[str, Any] = {
    "LlamaForCausalLM": llama.LlamaForCausalLM,
    "Qwen2ForCausalLM": qwen2.Qwen2ForCausalLM,
    "Qwen3ForCausalLM": qwen3.Qwen3ForCausalLM,
    "DeepseekV2ForCausalLM": deepseek_v2.DeepseekV2ForCausalLM,
    "DeepseekV3ForCausalLM": deepseek_v2.DeepseekV3ForCausalLM,
    "Glm4MoeLiteForCausalLM": glm4_moe_lite.Glm4MoeLiteForCausalLM,
    "GptOssForCausalLM": gpt_oss.GptOssForCausalLM,
    "MiniMaxM3SparseForCausalLM": minimax_m3.MiniMaxM3SparseForCausalLM,
    "MiniMaxM3SparseForConditionalGeneration": minimax_m3_vl.MiniMaxM3SparseForConditionalGeneration,
}

ID_SETS: list[list[int] | None] = [None, [-1, 1, 3], [1, 3, 5], [0, 1, 2], [2, 4, 7], [1, 1, 0], [2, 4, 8], []]


class _Layer:
    """A decoder-layer stand-in: MiniMax-M3 setters set ``_is_layer_to_capture`` on it."""


def _stand_in(architecture: str, num_layers: int) -> types.SimpleNamespace:
    layers = [_Layer() for _ in range(num_layers)]
    config: Any = types.SimpleNamespace(num_hidden_layers=num_layers)
    if architecture == "MiniMaxM3SparseForConditionalGeneration":
        config = types.SimpleNamespace(text_config=config)  # minimax_m3_vl.py:261 reads text_config
    return types.SimpleNamespace(
        pp_group=types.SimpleNamespace(is_last_rank=True),
        config=config,
        model=types.SimpleNamespace(layers_to_capture=list(_UNSET), layers=layers),
        capture_aux_hidden_states=False,
    )


def _run_real_setter(architecture: str, num_layers: int, ids: list[int] | None) -> types.SimpleNamespace:
    fake = _stand_in(architecture, num_layers)
    SETTERS[architecture].set_eagle3_layers_to_capture(fake, None if ids is None else list(ids))
    assert fake.capture_aux_hidden_states is True, "SGLang's setter did not run to completion"
    assert fake.model.layers_to_capture != _UNSET, "SGLang's setter never stored layers_to_capture"
    return fake


@pytest.mark.parametrize("num_layers", [8, 61])
@pytest.mark.parametrize("ids", ID_SETS, ids=lambda v: "none" if v is None else str(v))
@pytest.mark.parametrize("architecture", sorted(SETTERS))
def test_layers_to_capture_matches_real_setter(architecture: str, ids: list[int] | None, num_layers: int) -> None:
    fake = _run_real_setter(architecture, num_layers, ids)
    plan = sglang.capture_plan(ids, num_layers=num_layers, architecture=architecture, version=SGLANG_VERSION)
    assert tuple(fake.model.layers_to_capture) == plan.layers_to_capture
    assert plan.used_default is (ids is None)


@pytest.mark.parametrize("ids", ID_SETS, ids=lambda v: "none" if v is None else str(v))
@pytest.mark.parametrize("architecture", ["MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration"])
def test_minimax_layer_flags_match_reachable_boundaries(architecture: str, ids: list[int] | None) -> None:
    """MiniMax-M3's loop reads per-layer flags (minimax_m3.py:1946-1950), plus boundary L at the final norm."""
    fake = _run_real_setter(architecture, 8, ids)
    flagged = {i for i, lyr in enumerate(fake.model.layers) if getattr(lyr, "_is_layer_to_capture", False)}
    plan = sglang.capture_plan(ids, num_layers=8, architecture=architecture, version=SGLANG_VERSION)
    in_loop = {b for b in plan.layers_to_capture if 0 <= b < 8}
    assert flagged == in_loop


@pytest.mark.parametrize("ids", ID_SETS, ids=lambda v: "none" if v is None else str(v))
def test_kimi_k25_delegates_to_deepseek_v3(ids: list[int] | None) -> None:
    inner = _stand_in("DeepseekV3ForCausalLM", 61)
    inner.set_eagle3_layers_to_capture = types.MethodType(
        deepseek_v2.DeepseekV3ForCausalLM.set_eagle3_layers_to_capture, inner
    )
    kimi = types.SimpleNamespace(language_model=inner)
    kimi_k25.KimiK25ForConditionalGeneration.set_eagle3_layers_to_capture(kimi, ids)
    assert inner.capture_aux_hidden_states is True
    plan = sglang.capture_plan(
        ids, num_layers=61, architecture="KimiK25ForConditionalGeneration", version=SGLANG_VERSION
    )
    assert tuple(inner.model.layers_to_capture) == plan.layers_to_capture


def test_non_last_pp_rank_stores_nothing() -> None:
    """All setters return early on non-last PP ranks (llama.py:930-931): the plan models rank pp_size-1 only."""
    fake = _stand_in("LlamaForCausalLM", 8)
    fake.pp_group.is_last_rank = False
    llama.LlamaForCausalLM.set_eagle3_layers_to_capture(fake, [1, 3, 5])
    assert fake.model.layers_to_capture == _UNSET
    assert fake.capture_aux_hidden_states is False
