"""Tiny drafters of the families beyond the Llama-style EAGLE-3 head, generated for the capture tests.

Each starts from a public config in tests/unit/data/drafter_families (its provenance in the README there) and changes
only sizes, so that it fits the fixtures' 8-layer targets (hidden 64, vocabulary 512, the bundled tokenizer); every
structural field (MLA ranks and head dims, yarn rope, DFlash's dflash_config and block size) is the public one's. The
weights are a seeded random init in the names each trainer writes (``midlayer.*`` for the MLA head, as its engines map
them: vllm 0.32 models/deepseek_eagle3.py:258-268; ``layers.<i>.*``, ``fc``, ``hidden_norm``, ``norm`` for DFlash, SF
specforge/modeling/draft/dflash.py:340-378, embedding and lm_head shared from the target). Nothing here is committed:
the drafters are generated into the test's temporary directory.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

DATA = Path(__file__).resolve().parents[1] / "unit" / "data" / "drafter_families"
HIDDEN, VOCAB, INTERMEDIATE = 64, 512, 128
SPECIAL = {"bos_token_id": 256, "eos_token_id": 257}  # the bundled tokenizer's
RECORDED_IDS = (1, 3, 5)  # the layers the bundles' SpecForge records hold side by side (real_class_targets.AUX_IDS)


def _randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return (torch.randn(*shape, generator=g) * 0.05).contiguous()


def write_mla_draft(out: Path, ids: Sequence[int], *, hidden: int = HIDDEN, target_hidden: int = HIDDEN,
                    seed: int = 0) -> Path:
    """Kimi's MLA EAGLE-3 head (``Eagle3DeepseekV2ForCausalLM``, ``model_type: kimi_k2``, TorchSpec's
    kimi_k25_eagle3_moe.json) at ``hidden`` over a target of ``target_hidden``, with EAGLE-3 ``ids``."""
    cfg = json.loads((DATA / "kimi_k25_eagle3_moe.json").read_text())
    heads, q_rank, kv_rank, nope, rope, v_dim = 2, 32, 32, 16, 16, 16
    cfg.update(hidden_size=hidden, intermediate_size=INTERMEDIATE, num_attention_heads=heads,
               num_key_value_heads=heads, q_lora_rank=q_rank, kv_lora_rank=kv_rank, qk_nope_head_dim=nope,
               qk_rope_head_dim=rope, v_head_dim=v_dim, vocab_size=VOCAB, draft_vocab_size=VOCAB,
               torch_dtype="float32", n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
               max_position_embeddings=512, **SPECIAL)
    if target_hidden != hidden:
        cfg["target_hidden_size"] = target_hidden
    cfg["eagle_config"] = {**cfg["eagle_config"], "eagle_aux_hidden_state_layer_ids": list(ids)}
    g = torch.Generator().manual_seed(seed)
    m = "midlayer."
    weights = {
        "fc.weight": _randn(g, hidden, len(ids) * target_hidden), "norm.weight": torch.ones(hidden),
        "embed_tokens.weight": _randn(g, VOCAB, hidden), "lm_head.weight": _randn(g, VOCAB, hidden),
        m + "input_layernorm.weight": torch.ones(hidden), m + "hidden_norm.weight": torch.ones(hidden),
        m + "post_attention_layernorm.weight": torch.ones(hidden),
        m + "self_attn.q_a_proj.weight": _randn(g, q_rank, 2 * hidden),
        m + "self_attn.q_a_layernorm.weight": torch.ones(q_rank),
        m + "self_attn.q_b_proj.weight": _randn(g, heads * (nope + rope), q_rank),
        m + "self_attn.kv_a_proj_with_mqa.weight": _randn(g, kv_rank + rope, 2 * hidden),
        m + "self_attn.kv_a_layernorm.weight": torch.ones(kv_rank),
        m + "self_attn.kv_b_proj.weight": _randn(g, heads * (nope + v_dim), kv_rank),
        m + "self_attn.o_proj.weight": _randn(g, hidden, heads * v_dim),
        m + "mlp.gate_proj.weight": _randn(g, INTERMEDIATE, hidden), m + "mlp.up_proj.weight": _randn(g, INTERMEDIATE, hidden),
        m + "mlp.down_proj.weight": _randn(g, hidden, INTERMEDIATE),
    }
    return _write(out, cfg, weights)


def write_dflash_draft(out: Path, ids: Sequence[int], *, num_target_layers: int = 8, seed: int = 0) -> Path:
    """SpecForge's DFlash drafter (its configs/qwen3-8b-dflash.json) with one layer of ``HIDDEN``, block size kept,
    ``dflash_config.target_layer_ids = ids`` (what SpecForge's training writes there)."""
    cfg = json.loads((DATA / "specforge_qwen3_8b_dflash.json").read_text())
    heads, kv_heads, head_dim, layers = 2, 1, 32, 1
    cfg.update(hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_attention_heads=heads,
               num_key_value_heads=kv_heads, head_dim=head_dim, num_hidden_layers=layers, max_window_layers=layers,
               layer_types=["full_attention"] * layers, num_target_layers=num_target_layers, vocab_size=VOCAB,
               max_position_embeddings=512, dtype="float32", **SPECIAL)
    # a mask token inside the tiny vocabulary (SpecForge resolves it from the tokenizer, model_providers.py:244-252)
    cfg["dflash_config"] = {**cfg["dflash_config"], "mask_token_id": 5, "target_layer_ids": list(ids)}
    g = torch.Generator().manual_seed(seed)
    weights = {"fc.weight": _randn(g, HIDDEN, len(ids) * HIDDEN), "hidden_norm.weight": torch.ones(HIDDEN),
               "norm.weight": torch.ones(HIDDEN)}
    for i in range(layers):
        p = f"layers.{i}."
        weights.update({
            p + "self_attn.q_proj.weight": _randn(g, heads * head_dim, HIDDEN),
            p + "self_attn.k_proj.weight": _randn(g, kv_heads * head_dim, HIDDEN),
            p + "self_attn.v_proj.weight": _randn(g, kv_heads * head_dim, HIDDEN),
            p + "self_attn.o_proj.weight": _randn(g, HIDDEN, heads * head_dim),
            p + "self_attn.q_norm.weight": torch.ones(head_dim), p + "self_attn.k_norm.weight": torch.ones(head_dim),
            p + "input_layernorm.weight": torch.ones(HIDDEN), p + "post_attention_layernorm.weight": torch.ones(HIDDEN),
            p + "mlp.gate_proj.weight": _randn(g, INTERMEDIATE, HIDDEN),
            p + "mlp.up_proj.weight": _randn(g, INTERMEDIATE, HIDDEN),
            p + "mlp.down_proj.weight": _randn(g, HIDDEN, INTERMEDIATE),
        })
    return _write(out, cfg, weights)


def write_dflash_records(eagle_records: Path, out: Path, ids: Sequence[int]) -> Path:
    """SpecForge DFlash records (``input_ids``, ``loss_mask``, ``hidden_states``: SF specforge/algorithms/dflash/
    providers.py:134-160, 193-205) of the layers ``ids`` (a subset of :data:`RECORDED_IDS`), taken from SpecForge
    EAGLE-3 records that hold layer:1, 3, 5 side by side (the same target forward, another file layout)."""
    for src in sorted(eagle_records.rglob("data_*.ckpt")):
        rec = torch.load(src, map_location="cpu", weights_only=True)
        aux = rec["aux_hidden_state"]
        chunks = aux.reshape(aux.shape[-2], len(RECORDED_IDS), aux.shape[-1] // len(RECORDED_IDS))
        picked = chunks[:, [RECORDED_IDS.index(i) for i in ids]].reshape(1, aux.shape[-2], -1).contiguous()
        dest = out / src.relative_to(eagle_records)
        dest.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"input_ids": rec["input_ids"], "loss_mask": rec["loss_mask"], "hidden_states": picked}, dest)
    return out


def _write(out: Path, cfg: dict[str, object], weights: dict[str, torch.Tensor]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    save_file(weights, str(out / "model.safetensors"))
    return out
