"""A SpecForge-style drafter config for a public target (tests/serving/configs/public/README.md, row 11): the sweep of
SGLang's static level (tests/serving/test_static_public_configs.py) and vLLM's (tests/vllm_engine/public_pairs.py)
pair each public target with the same one."""

from __future__ import annotations

from typing import Any


def specforge_style_draft(hidden: int, vocab: int, ids: list[int] | None) -> dict[str, Any]:
    """A one-layer LlamaForCausalLMEagle3 with SpecForge's configs/*-eagle3.json field names."""
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": hidden, "intermediate_size": 4 * hidden, "max_position_embeddings": 4096,
        "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 1, "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": vocab, "draft_vocab_size": 32000,
    }
    if ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
    return cfg
