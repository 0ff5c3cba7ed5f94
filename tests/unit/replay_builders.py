"""Tiny random EAGLE-3 drafters (and their target tensors) for the replay unit tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from fixtures.eagle3_draft import weights_from
from safetensors.torch import save_file

from specparity.replay.drafter import MIDLAYER_NAMES, DraftShape, Eagle3Drafter

VOCAB = 40


def tiny_shape(**kw: Any) -> DraftShape:
    base: dict[str, Any] = dict(hidden=16, intermediate=24, heads=4, kv_heads=2, num_aux=3, draft_vocab=24,
                                rms_eps=1e-6, rope_theta=10000.0)
    base.update(kw)
    return DraftShape(**base)


def tiny_weights(shape: DraftShape, *, seed: int) -> dict[str, torch.Tensor]:
    """Random drafter weights in the bundled drafter's layout (fixtures/eagle3_draft.weights_from); unlike the
    bundle's, the norm weights are random around 1."""
    gen = torch.Generator().manual_seed(seed)

    def mat(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen) / cols**0.5

    def vec(n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=gen)

    return weights_from(shape, fc_in=shape.fc_in_features, mat=mat, norm=vec)


def tiny_drafter(*, seed: int = 0, **kw: Any) -> Eagle3Drafter:
    shape = tiny_shape(**kw)
    w = tiny_weights(shape, seed=seed)
    w["embed_tokens.weight"] = torch.randn(VOCAB, shape.hidden, generator=torch.Generator().manual_seed(seed + 1))
    d2t = torch.arange(shape.draft_vocab) % 3  # offsets: target = draft + d2t[draft]
    return Eagle3Drafter(shape=shape, weights=w, hot_token_id=d2t + torch.arange(shape.draft_vocab), source="mem")


def draft_config(shape: DraftShape, **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate, "num_hidden_layers": 1, "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads, "hidden_act": "silu", "rms_norm_eps": shape.rms_eps,
        "rope_theta": shape.rope_theta, "rope_scaling": None, "vocab_size": VOCAB,
        "draft_vocab_size": shape.draft_vocab, "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5], "use_aux_hidden_state": True},
    }
    cfg.update(extra)
    return cfg


def write_dirs(root: Path, *, seed: int = 0, cfg_extra: dict[str, Any] | None = None,
               rename: dict[str, str] | None = None, shard_target: bool = False) -> tuple[Path, Path, Eagle3Drafter]:
    """Write ``root/draft`` (SGLang export) and ``root/target`` (embed + lm_head); returns the in-memory twin."""
    ref = tiny_drafter(seed=seed)
    shape = ref.shape
    draft, target = root / "draft", root / "target"
    draft.mkdir(parents=True)
    target.mkdir(parents=True)
    (draft / "config.json").write_text(json.dumps(draft_config(shape, **(cfg_extra or {}))))
    tensors = {n: t.contiguous() for n, t in ref.weights.items() if n != "embed_tokens.weight"}
    assert ref.hot_token_id is not None
    tensors["d2t"] = ref.hot_token_id - torch.arange(shape.draft_vocab)
    tensors["t2d"] = torch.ones(VOCAB, dtype=torch.bool)
    for old, new in (rename or {}).items():
        tensors[new] = tensors.pop(old)
    save_file(tensors, str(draft / "model.safetensors"))
    (target / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                     "tie_word_embeddings": False}))
    embed = ref.weights["embed_tokens.weight"].contiguous()
    head = torch.randn(VOCAB, shape.hidden, generator=torch.Generator().manual_seed(seed + 2))
    if shard_target:
        save_file({"model.embed_tokens.weight": embed}, str(target / "model-00001-of-00002.safetensors"))
        save_file({"lm_head.weight": head}, str(target / "model-00002-of-00002.safetensors"))
        (target / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "lm_head.weight": "model-00002-of-00002.safetensors"}}))
    else:
        save_file({"model.embed_tokens.weight": embed, "lm_head.weight": head}, str(target / "model.safetensors"))
    assert MIDLAYER_NAMES[0] in ref.weights
    return draft, target, ref
