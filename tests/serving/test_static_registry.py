"""Every SGLang 0.5.23 registry class with an EAGLE-3 setter, resolved on the meta device by the product's path.

In-process (the static path keeps one one-rank world per process, since_0_5_11.static.init_single_rank): for each
architecture, a target config (tests/serving/static_configs.py) with a draft whose ids distinguish the rules,
through ``resolve_static`` — SGLang's ServerArgs, ModelConfig, registry, ``_initialize_model`` on meta, and the
real ``set_eagle3_layers_to_capture`` — and the result must equal the conventions module.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from meta_static import SKIP, make_0523_adapter
from static_configs import (
    NEEDS_GPU,
    NOT_TARGETS,
    SGLANG_REFUSES,
    TARGETS,
    hardware_note_expected,
    server_args_for,
    stand_ins,
    target_config,
    target_files,
)

if SKIP:
    pytest.skip(SKIP, allow_module_level=True)

from static_checks import assert_resolved_as_planned, text_config

from specparity.serving import ServingFailure
from specparity.serving.results import NEEDS_HARDWARE, SGLANG_EXCEPTION
from specparity.serving.sglang.adapter import WorkerRequest
from specparity.serving.sglang.since_0_5_11.static import resolve_static

pytestmark = pytest.mark.sglang
ADAPTER = make_0523_adapter()


def _draft(root: Path, ids: list[int] | None) -> Path:
    d = root / "draft"
    d.mkdir()
    cfg: dict[str, object] = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64,
                              "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
                              "num_key_value_heads": 2, "vocab_size": 512, "draft_vocab_size": 256,
                              "max_position_embeddings": 512, "torch_dtype": "bfloat16"}
    if ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_every_registry_class_with_a_setter_is_accounted_for() -> None:
    from sglang.srt.models.registry import ModelRegistry

    with_setter = {name for name, cls in ModelRegistry.models.items() if hasattr(cls, "set_eagle3_layers_to_capture")}
    unaccounted = with_setter - set(TARGETS) - NOT_TARGETS
    assert not unaccounted, f"registry classes with an EAGLE-3 setter and no config: {sorted(unaccounted)}"
    assert set(NEEDS_GPU) | set(SGLANG_REFUSES) <= set(TARGETS), "every special case has a config and is run"
    assert not set(NEEDS_GPU) & set(SGLANG_REFUSES)


@pytest.mark.parametrize("ids_kind", ["first_not_1", "first_1", "default"])
@pytest.mark.parametrize("architecture", sorted(TARGETS))
def test_real_setter_on_meta_equals_conventions(architecture: str, ids_kind: str, tmp_path: Path,
                                               record_property: Callable[[str, object], None]) -> None:
    cfg = target_config(architecture)
    record_property("stand_ins", json.dumps(stand_ins(architecture)))  # in --junitxml: what this result rests on
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text(json.dumps(cfg))
    for name, text in target_files(architecture).items():
        (tmp_path / "target" / name).write_text(text)
    num_layers = int(text_config(cfg)["num_hidden_layers"])
    ids = {"first_not_1": [2, num_layers // 2, num_layers - 3], "first_1": [1, num_layers // 2 - 1, num_layers - 4],
           "default": None}[ids_kind]
    r = resolve_static(ADAPTER, WorkerRequest(op="resolve", target=str(tmp_path / "target"),
                                              draft=str(_draft(tmp_path, ids)),
                                              server_args=server_args_for(architecture)))
    if hardware_note_expected(architecture):
        # SGLang asks torch.cuda at NEEDS_GPU[architecture] before the model exists: a note, never a layout
        assert isinstance(r, ServingFailure) and r.kind == NEEDS_HARDWARE, r
        assert NEEDS_GPU[architecture] in r.message and "GPU" in r.message, r.message
        return
    if architecture in SGLANG_REFUSES:  # SGLang's own exception, quoted with its file:line (exit 1 in explain)
        assert isinstance(r, ServingFailure) and r.kind == SGLANG_EXCEPTION, r
        assert SGLANG_REFUSES[architecture] in r.message, r.message
        return
    r, _ = assert_resolved_as_planned(r, architecture=architecture, num_layers=num_layers, ids=ids)
    assert (r.draft_config_ids is None) is (ids is None)


# SGLang 0.5.23's config.json fields that Ling-mini-2.0's published config does not give, so the
# table takes them from SGLang's class defaults (static_configs.stand_ins)
BAILING_DEFAULT_FIELDS = [
    "attention_dropout", "embedding_dropout", "initializer_range", "max_window_layers", "norm_head", "output_dropout",
    "output_router_logits", "pad_token_id", "rope_parameters", "router_type", "sliding_window", "use_bias", "use_cache",
    "use_interleaved_frame_timestamp", "use_qkv_bias", "use_sliding_window"]
REMOTE = {"BailingMoEForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM", "SarvamMoEForCausalLM"}


def test_the_stand_ins_written_here_are_needed_and_named() -> None:
    import importlib

    from sglang.srt.utils.hf_transformers.common import _CONFIG_REGISTRY
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    # still needed: neither SGLang nor transformers maps a Ling config.json (model_type bailing_moe) to a class, and
    # SGLang's own BailingMoeV2Config (the class the stand-in provides) is registered under no model_type
    cls = importlib.import_module("sglang.srt.configs.bailing_moe_v2").BailingMoeV2Config
    assert "bailing_moe" not in _CONFIG_REGISTRY and "bailing_moe" not in CONFIG_MAPPING
    assert cls not in _CONFIG_REGISTRY.values() and not any("sarvam" in k for k in (*_CONFIG_REGISTRY, *CONFIG_MAPPING))
    assert {a for a in TARGETS if stand_ins(a)} == REMOTE  # every other target uses the release's own classes
    for arch in sorted(REMOTE):
        cfg, named = target_config(arch), stand_ins(arch)
        module = named[0]
        namespace: dict[str, object] = {}
        exec(target_files(arch)[module["file"]], namespace)  # the written module provides exactly the named class
        where, name = module["provides"].rsplit(".", 1)
        assert namespace[name] is cls is getattr(importlib.import_module(where), name)
        assert module["fields_assumed"] == BAILING_DEFAULT_FIELDS, module
        defaults = cls().to_dict()
        assert all(cfg[f] == defaults[f] for f in module["fields_assumed"])  # the class's defaults, as named
        if arch == "SarvamMoEForCausalLM":  # no Sarvam config class anywhere: every field is Ling's
            assert [n["file"] for n in named] == [module["file"], "config.json"]
            assert {"model_type", "num_hidden_layers", "hidden_size", "num_experts"} <= set(named[1]["fields_assumed"])
        else:
            assert len(named) == 1
