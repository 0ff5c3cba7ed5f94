"""Target configs for the registry-wide static test: one per SGLang 0.5.23 architecture with an EAGLE-3 setter.

Where a public full-size config.json of the architecture was collected (configs/public, sources in its
SOURCES.json) the test uses it verbatim; otherwise the architecture's own transformers/SGLang config class with
its defaults (the real field names and the published model's sizes), plus the hub config.json fields SGLang's
model file reads that the class does not default. Remote-code architectures (Ling/Bailing, Sarvam) name their
config class through ``auto_map`` the way their hub checkpoints do; the module written here in place of the hub's
remote code provides SGLang's own class (sglang/srt/configs/bailing_moe_v2.py): a stand-in, named with the fields
it assumes by :func:`stand_ins` (the sweep and the tests report it). On the meta device size costs no memory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIGS = Path(__file__).resolve().parent / "configs"
PUBLIC_TARGETS = CONFIGS / "public" / "targets"

_DEEPSEEK_MOE = {"moe_layer_freq": 1, "first_k_dense_replace": 1, "n_group": 8, "topk_group": 4,
                 "topk_method": "noaux_tc", "scoring_func": "sigmoid", "n_shared_experts": 1,
                 "rope_scaling": None, "rope_theta": 10000.0}

# Qwen3.5 hub text_config: hybrid layers (3 linear-attention, then 1 full) and mrope parameters
_QWEN35_TEXT = {"full_attention_interval": 4, "rope_parameters": {
    "rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
    "mrope_section": [11, 11, 10], "mrope_interleaved": True}}

# MiniMax-M3 reads these beyond MiniMax-M2's config class (sglang 0.5.23 models/minimax_m3.py); no
# sparse_attention_config: every layer dense (minimax_m3.py:1702-1710)
_MINIMAX_M3 = {"scoring_func": "sigmoid", "use_routing_bias": True, "rotary_dim": 64, "use_qk_norm": True,
               "qk_norm_type": "per_layer", "num_mtp_modules": 0, "n_shared_experts": 0,
               "routed_scaling_factor": 1.0, "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
               "dense_intermediate_size": 1536}

# architecture -> (source, overrides on top of it). source: a model_type (the config class defaults),
# "public:<file>" (a collected hub config.json, configs/public/targets) or "remote:<model_type>" (remote code)
TARGETS: dict[str, tuple[str, dict[str, Any]]] = {
    "ApertusForCausalLM": ("apertus", {}),
    "DeepseekV3ForCausalLM": ("public:deepseek-ai--DeepSeek-V3.json", {}),
    # DeepSeek-V2: the V3 hub config's MLA/MoE field names with V2's sizes and softmax routing
    "DeepseekV2ForCausalLM": ("public:deepseek-ai--DeepSeek-V3.json", {
        "model_type": "deepseek_v2", "num_hidden_layers": 60, "hidden_size": 5120, "intermediate_size": 12288,
        "moe_intermediate_size": 1536, "n_routed_experts": 160, "n_shared_experts": 2, "num_experts_per_tok": 6,
        "first_k_dense_replace": 1, "topk_method": "group_limited_greedy", "scoring_func": "softmax",
        "routed_scaling_factor": 16.0, "vocab_size": 102400}),
    # Mistral-Large-3 is served by DeepseekV3ForCausalLM's subclass (models/mistral_large_3.py:12)
    "MistralLarge3ForCausalLM": ("public:deepseek-ai--DeepSeek-V3.json", {}),
    # Llama-architecture files whose hub configs name remote code; the fields are llama's
    "InternLM3ForCausalLM": ("llama", {}),
    "IQuestCoderForCausalLM": ("llama", {}),
    "TeleFLMForCausalLM": ("llama", {}),
    "KimiK25ForConditionalGeneration": ("public:moonshotai--Kimi-K2.5.json", {}),
    "Gemma3ForCausalLM": ("gemma3_text", {}),
    "Gemma3ForConditionalGeneration": ("gemma3", {}),
    "Gemma4UnifiedForConditionalGeneration": ("gemma4_unified", {}),
    "Glm4MoeForCausalLM": ("glm4_moe", {}),
    "Glm4MoeLiteForCausalLM": ("glm4_moe_lite", {**_DEEPSEEK_MOE, "n_routed_experts": 64}),
    "GptOssForCausalLM": ("gpt_oss", {}),
    "Llama4ForCausalLM": ("llama4", {}),
    "Llama4ForConditionalGeneration": ("llama4", {}),
    "LlamaForCausalLM": ("llama", {}),
    "MellumForCausalLM": ("mellum", {}),
    "MiniMaxM2ForCausalLM": ("minimax_m2", {"scoring_func": "sigmoid", "use_routing_bias": True,
                                            "rotary_dim": 64, "use_qk_norm": True, "qk_norm_type": "per_layer"}),
    "MiniMaxM3SparseForCausalLM": ("minimax_m2", _MINIMAX_M3),
    "MiniMaxM3SparseForConditionalGeneration": ("minimax_m3_vl", {
        "text_config": {"model_type": "minimax_m2", **_MINIMAX_M3},
        "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "intermediate_size": 4096,
                          "num_hidden_layers": 24, "num_attention_heads": 16, "num_channels": 3, "image_size": 336,
                          "patch_size": 14, "hidden_act": "gelu", "layer_norm_eps": 1e-05,
                          "attention_dropout": 0.0, "initializer_range": 0.02, "initializer_factor": 1.0,
                          "projection_dim": 768, "position_embedding_type": "rope", "rope_mode": "3d",
                          "rope_theta": 10000.0, "vision_segment_max_frames": None,
                          "img_token_compression_config": {"temporal_patch_size": 2, "spatial_merge_size": 2}}}),
    "Ministral3ForCausalLM": ("ministral3", {}),
    "MistralForCausalLM": ("mistral", {}),
    "Phi3ForCausalLM": ("phi3", {}),
    "Qwen2ForCausalLM": ("qwen2", {}),
    "Qwen2MoeForCausalLM": ("qwen2_moe", {}),
    "Qwen2_5_VLForConditionalGeneration": ("qwen2_5_vl", {}),
    "Qwen3ForCausalLM": ("qwen3", {}),
    "Qwen3MoeForCausalLM": ("qwen3_moe", {}),
    "Qwen3VLForConditionalGeneration": ("qwen3_vl", {}),
    "Qwen4ExpForConditionalGeneration": ("qwen4_exp", {"text_config": _QWEN35_TEXT}),
    "Cosmos3ForConditionalGeneration": ("cosmos3_omni", {}),
    "InternS2PreviewForConditionalGeneration": ("intern_s2_preview", {"text_config": _QWEN35_TEXT}),
    # EXAONE-MoE: the first layer dense, the rest MoE (models/exaone_moe.py:497-504 read is_moe_layer)
    "ExaoneMoeForCausalLM": ("exaone_moe", {
        "is_moe_layer": lambda c: [i > 0 for i in range(int(c["num_hidden_layers"]))]}),
    "ExaoneMoEForCausalLM": ("exaone_moe", {
        "is_moe_layer": lambda c: [i > 0 for i in range(int(c["num_hidden_layers"]))]}),

    "Qwen3_5ForConditionalGeneration": ("qwen3_5", {"text_config": _QWEN35_TEXT}),
    "Qwen3_5MoeForConditionalGeneration": ("qwen3_5_moe", {"text_config": _QWEN35_TEXT}),
    "Qwen3_5ForCausalLM": ("qwen3_5_text", _QWEN35_TEXT),
    "Qwen3_5MoeForCausalLM": ("qwen3_5_moe_text", _QWEN35_TEXT),
    "Qwen3VLMoeForConditionalGeneration": ("qwen3_vl_moe", {}),
    # Public hub configs, verbatim (configs/public/SOURCES.json)
    "DeepseekV32ForCausalLM": ("public:deepseek-ai--DeepSeek-V3.2.json", {}),
    "GlmMoeDsaForCausalLM": ("public:zai-org--GLM-5.json", {}),
    "Gemma4ForConditionalGeneration": ("public:google--gemma-4-26B-A4B.json", {}),
    "Gemma4ForCausalLM": ("gemma4_text", {}),
    # Intern-S1-Pro is Qwen3-VL-MoE's architecture (models/interns1pro.py:191) with its own router and rope fields
    "InternS1ProForConditionalGeneration": ("public:Qwen--Qwen3-VL-30B-A3B-Instruct.json", {}),
    "Qwen3NextForCausalLM": ("public:Qwen--Qwen3-Next-80B-A3B-Thinking.json", {}),
    "LongcatFlashForCausalLM": ("longcat_flash", {}),
    # transformers' own Glm5NextConfig defaults (AutoConfig validates config.json with it, strictly, before SGLang
    # re-parses it with sglang/srt/configs/glm5_next.py, whose None defaults it refuses), written flat: SGLang's
    # class lifts the text keys from the top level (configs/glm5_next.py:8-76) and loses architectures otherwise
    "Glm5NextForConditionalGeneration": ("hf-flat:glm5_next", {}),
    # InternS2-Mobius reads a per-layer schedule (models/interns2_mobius.py:708): Qwen3.5's hybrid pattern,
    # three linear-attention layers then one full-attention layer
    "InternS2MobiusForConditionalGeneration": ("interns2_mobius", {"text_config": lambda _: {
        "model_type": "interns2_mobius_text", **_QWEN35_TEXT, "layer_types": [
            "full_attention" if (i + 1) % 4 == 0 else "linear_attention"
            for i in range(int(_class_defaults("interns2_mobius_text")["num_hidden_layers"]))]}}),
    # Ling 2.0 (inclusionAI/Ling-flash-2.0's hub config: model_type bailing_moe, AutoConfig from its remote
    # module configuration_bailing_moe_v2.BailingMoeV2Config, as its Hub model card lists); all three names
    # are one class in sglang 0.5.23 (models/bailing_moe.py:1112-1120). Sarvam-MoE reuses it (sarvam_moe.py:1407)
    **{arch: ("remote:bailing_moe", {}) for arch in (
        "BailingMoEForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM", "SarvamMoEForCausalLM")},
}

# Remote code a hub checkpoint ships next to its config.json (auto_map), here providing SGLang's own class
BAILING_MODULE = "sglang.srt.configs.bailing_moe_v2"
REMOTE_CODE: dict[str, tuple[str, str, str]] = {  # model_type -> (module file, class, module source)
    "bailing_moe": ("configuration_bailing_moe_v2.py", "BailingMoeV2Config",
                    f"from {BAILING_MODULE} import BailingMoeV2Config  # noqa: F401\n"),
}


# Registry classes that are drafts (NextN/MTP/EAGLE heads), embedding models or other runtimes: no EAGLE-3 target.
NOT_TARGETS = frozenset({
    "DeepseekV3ForCausalLMNextN", "ExaoneMoEForCausalLMMTP", "Gemma4AssistantForCausalLM",
    "Gemma4UnifiedAssistantForCausalLM", "Glm4MoeForCausalLMNextN", "Glm4MoeLiteForCausalLMNextN",
    "Glm5NextForConditionalGenerationNextN", "GlmMoeDsaForCausalLMNextN", "LlamaForCausalLMEagle",
    "LlamaForCausalLMEagle3", "LongcatFlashForCausalLMNextN", "MistralForCausalLMEagle", "MistralLarge3ForCausalLMEagle",
    "Qwen2ForCausalLMEagle", "Qwen3MoeForCausalLMMTP", "Qwen3NextForCausalLMMTP", "EmbeddingGemmaModel",
    "MindSporeForCausalLM",
})
# Architectures whose resolution SGLang 0.5.23 cannot finish on a machine without a GPU: it asks torch.cuda
# (at the sglang file:line given) before the model exists. There the static level reports ``needs_hardware``
# (a note, exit 3), never a layout and never a crash; on a GPU machine they resolve like the rest.
NEEDS_GPU: dict[str, str] = {
    # DSA attention: arg_groups/model_hook.py:341 reads torch.cuda.get_device_capability() while resolving
    # ServerArgs, and SGLang's own process set-up (runtime_context.publish) resolves them before any model exists
    "DeepseekV32ForCausalLM": "arg_groups/model_hook.py:341",
    "GlmMoeDsaForCausalLM": "arg_groups/model_hook.py:341",
    "Glm5NextForConditionalGeneration": "arg_groups/model_hook.py:341",  # DSA indexer (index_topk) as GLM-5
    # constructs its gated RMSNorm on torch.get_device_module().current_device(): torch.cuda on a CUDA build
    "Qwen3NextForCausalLM": "models/qwen3_next.py:252",
}
# Architectures SGLang 0.5.23 itself cannot build from any config.json with the installed transformers: the
# static level reports SGLang's own exception (exit 1, quoting the sglang file:line), which the test pins.
SGLANG_REFUSES: dict[str, str] = {
    # LongcatFlashConfig (configs/longcat_flash.py) never sets rope_parameters; the model tests
    # `"rope_theta" in config.rope_parameters` on None
    "LongcatFlashForCausalLM": "models/longcat_flash.py:377",
    # Qwen3-VL-MoE's layer factory passes start_layer=, which InternS1ProTextDecoderLayer.__init__ does not take
    "InternS1ProForConditionalGeneration": "models/qwen2_moe.py:1134",
    # a gemma4_text config.json: SGLang's loader copies text attributes with hasattr(config, key), and
    # transformers raises AmbiguousGlobalPerLayerAttributeError (not AttributeError) for the per-layer ones
    "Gemma4ForCausalLM": "utils/hf_transformers/config.py:267",
}


def hardware_note_expected(architecture: str) -> bool:
    """Whether the static level should report ``needs_hardware`` for ``architecture`` on this machine."""
    import torch

    return architecture in NEEDS_GPU and not torch.cuda.is_available()


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def target_config(architecture: str) -> dict[str, Any]:
    """The config.json dict for ``architecture`` (imports transformers / sglang configs: call in the test)."""
    model_type, extra = TARGETS[architecture]
    base: dict[str, Any]
    if model_type.startswith("public:"):  # a collected hub config.json, verbatim (configs/public/SOURCES.json)
        base = json.loads((PUBLIC_TARGETS / model_type.removeprefix("public:")).read_text())
    elif model_type.startswith("remote:"):
        remote = model_type.removeprefix("remote:")
        module, cls, _ = REMOTE_CODE[remote]
        base = {**_remote_class_defaults(remote), "model_type": remote,
                "auto_map": {"AutoConfig": f"{module.removesuffix('.py')}.{cls}"}}
    elif model_type.startswith("hf-flat:"):  # the transformers class's defaults, text keys at the top level
        nested = _class_defaults(model_type.removeprefix("hf-flat:"), sglang_first=False)
        base = {**nested.pop("text_config"), **nested, "model_type": nested["model_type"]}
    else:
        base = _class_defaults(model_type)
    base["architectures"] = [architecture]
    out = _merge(base, {k: v(base) if callable(v) else v for k, v in extra.items()})
    text = out.get("text_config")
    if isinstance(text, dict) and "num_attention_heads" not in text and "model_type" in text:
        out["text_config"] = _merge(_class_defaults(str(text["model_type"])), text)  # the text model's own defaults
    return out


def target_files(architecture: str) -> dict[str, str]:
    """Files besides config.json that the target directory holds (a remote-code module), by name."""
    model_type = TARGETS[architecture][0]
    if not model_type.startswith("remote:"):
        return {}
    module, _, source = REMOTE_CODE[model_type.removeprefix("remote:")]
    return {module: source}


# Stand-ins written here. SGLang 0.5.23 ships BailingMoeV2Config but registers no AutoConfig for
# it: it is not in _CONFIG_REGISTRY (utils/hf_transformers/common.py:117-190, registered at :282-284), only
# BailingMM2Config's nested llm_config (configs/bailing_moe_v2.py:158), and transformers has no bailing_moe. So a Ling
# config.json reaches a config class only through its checkpoint's remote code, of which these tests have no copy:
# the module above stands in for it. Sarvam-MoE has no config class in SGLang at all (its model subclasses Bailing's,
# models/sarvam_moe.py:1407), so its config.json is Ling's under the Sarvam architecture.
REMOTE_STAND_IN = ("the hub checkpoint's remote code (auto_map AutoConfig), with model_type bailing_moe "
                   "(SGLang's class says bailing_moe_v2)")
SARVAM_STAND_IN = "a Sarvam-MoE checkpoint's own config.json (no Sarvam config class in SGLang or transformers)"


def stand_ins(architecture: str) -> list[dict[str, Any]]:
    """What the target directory of ``architecture`` holds in place of a published checkpoint's files: per stand-in
    the file, what it stands in for, what it provides, and the config fields whose values it assumes."""
    source = TARGETS[architecture][0]
    if not source.startswith("remote:"):
        return []
    module, cls, _ = REMOTE_CODE[source.removeprefix("remote:")]
    # config.json is written from the class's defaults: Ling-mini-2.0's published config.json gave none of these
    out = [{"file": module, "stands_in_for": REMOTE_STAND_IN, "provides": f"{BAILING_MODULE}.{cls}",
            "fields_assumed": _class_default_fields()}]
    if architecture == "SarvamMoEForCausalLM":
        out.append({"file": "config.json", "stands_in_for": SARVAM_STAND_IN,
                    "provides": "the Ling-mini-2.0 config above with architectures [SarvamMoEForCausalLM]",
                    "fields_assumed": sorted({*_LING_MINI_2, *_class_default_fields(), "model_type"})})
    return out


def server_args_for(architecture: str) -> dict[str, Any]:
    """The server args a deployment of ``architecture`` needs: remote code needs ``trust_remote_code``."""
    return {"trust_remote_code": True} if target_files(architecture) else {}


# inclusionAI/Ling-mini-2.0's architecture keys from its hub config.json (the class defaults, e.g.
# num_key_value_heads 0, describe no published model: models/bailing_moe.py:532 divides by it)
_LING_MINI_2 = {"num_hidden_layers": 20, "hidden_size": 2048, "intermediate_size": 5120, "first_k_dense_replace": 1,
                "moe_intermediate_size": 512, "moe_shared_expert_intermediate_size": 512, "num_shared_experts": 1,
                "num_experts": 256, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "norm_topk_prob": True,
                "routed_scaling_factor": 2.5, "score_function": "sigmoid", "moe_router_enable_expert_bias": True,
                "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128, "use_qk_norm": True,
                "partial_rotary_factor": 0.5, "rope_theta": 600000, "hidden_act": "silu", "rms_norm_eps": 1e-6,
                "tie_word_embeddings": False, "vocab_size": 157184, "max_position_embeddings": 32768}


def _bailing_class() -> Any:
    try:
        from sglang.srt.configs.bailing_moe_v2 import BailingMoeV2Config
    except ImportError as e:  # pinned per release: version_facts._NO_BAILING_CONFIG
        raise LookupError(f"this SGLang ships no Bailing config class ({e}); a Ling/Sarvam config.json is read only "
                          "by its hub checkpoint's remote code, which these tests have no copy of, and no stand-in "
                          "is written: the architecture is not checked on this release") from None
    return BailingMoeV2Config


def _class_default_fields() -> list[str]:
    """Bailing fields whose config.json values are SGLang's class defaults, not Ling-mini-2.0's published ones."""
    from transformers import PretrainedConfig

    cls = _bailing_class()
    return sorted(set(cls().to_dict()) - set(_LING_MINI_2) - set(PretrainedConfig().to_dict()))


def _remote_class_defaults(model_type: str) -> dict[str, Any]:
    assert model_type == "bailing_moe", model_type
    out: dict[str, Any] = {**_bailing_class()().to_dict(), **_LING_MINI_2}
    return out


def _class_defaults(model_type: str, *, sglang_first: bool = True) -> dict[str, Any]:
    import sglang.srt.configs as sglang_configs
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    own = {getattr(c, "model_type", None): c for c in vars(sglang_configs).values() if isinstance(c, type)}
    cls = (own.get(model_type) if sglang_first else None) or CONFIG_MAPPING[model_type]
    base: dict[str, Any] = cls().to_dict()
    base["model_type"] = model_type
    return base
