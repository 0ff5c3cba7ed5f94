"""Reduced real-class targets: a public config with only depth, width and expert count reduced.

Each target starts from a verbatim public config.json in configs/public/targets (SOURCES.json names where each
came from) and changes only the size fields below; every structural field (q/k norms, MoE routing and
normalisation, sparse step, dense-only layers, shared experts, rope) is the public model's. The weights are a
seeded random init of transformers' own class, written by its own ``save_pretrained`` (the hub layout, one
tensor per expert: transformers 5 keeps experts fused in memory, and SGLang 0.5.23 silently ignores fused
expert tensors on load, leaving those weights uninitialised). Vocabulary, tokenizer and special ids are the
bundled examples' (fixtures/default for SGLang, fixtures/vllm for vLLM: the same byte-level tokenizer), so each
engine's bundled drafter (hidden 64, vocab 512) fits every target. Two heads of 32 (vLLM's CPU attention takes
head sizes in multiples of 32; SGLang's takes any). Nothing here is committed: the targets are generated into
the test's temporary directory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

PUBLIC = Path(__file__).resolve().parent / "configs" / "public" / "targets"
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
BUNDLE = FIXTURES / "default"  # SGLang's bundle; fixtures/vllm is vLLM's
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
AUX_IDS = (1, 3, 5)  # the bundled drafter's ids (SpecForge's convention: layer:1, layer:3, layer:5)

# Size fields only: depth, width, heads, experts, vocabulary (the bundled tokenizer's), positions.
COMMON = {
    "num_hidden_layers": 8, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 512, "max_position_embeddings": 512,
    "bos_token_id": 256, "eos_token_id": 257, "torch_dtype": "float32",
    # the bundle's scale (fixtures/bundle_target.py): at HF's 0.02 the residual stream barely moves between layers
    "initializer_range": 0.12,
}
REDUCED: dict[str, dict[str, Any]] = {
    # Qwen3-MoE: 48 layers, hidden 2048, 128 experts top-8 -> 8 layers, hidden 64, 8 experts top-2
    "Qwen--Qwen3-30B-A3B": {**COMMON, "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2,
                            "max_window_layers": 8},
    # Qwen3 dense: 36 layers, hidden 4096 -> 8 layers, hidden 64
    "Qwen--Qwen3-8B": {**COMMON, "max_window_layers": 8},
}
# Classes whose reduced target one engine or both refuse on CPU (tests name the refusal): the same reduction rule
# (sizes only), plus the checkpoint's quantisation dropped (random weights are not fp8 / mxfp4 blocks) and remote code (transformers has the class).
REDUCED_CPU_LIMITED: dict[str, dict[str, Any]] = {
    # DeepSeek-V3 / Kimi-K2.5's class: MLA (q/kv LoRA ranks and head dims kept), 3 dense layers first, 1 shared
    # expert, sigmoid noaux_tc routing in groups, yarn rope; 61 layers, 256 experts top-8 in 8 groups -> 8 layers,
    # 8 experts top-2 in 4 groups (2 a group: the group score sums each group's top two)
    "deepseek-ai--DeepSeek-V3": {**{k: v for k, v in COMMON.items() if k not in ("head_dim",)},
                                 "num_key_value_heads": 2, "moe_intermediate_size": 32, "n_routed_experts": 8,
                                 "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2},
    # GPT-OSS: sliding/full attention alternating, sinks, 24 layers, 32 experts top-4 -> 8 layers, 8 experts top-2
    "openai--gpt-oss-20b": {**COMMON, "pad_token_id": 0, "num_local_experts": 8, "num_experts_per_tok": 2, "experts_per_token": 2,
                            "layer_types": ["sliding_attention", "full_attention"] * 4},
}
# Llama 4 (Scout): the text backbone of the public multimodal config (text_config), served as the text-only class
# both engines register (vLLM model_executor/models/registry.py "Llama4ForCausalLM"): every layer MoE (interleave step
# 1), 16 experts top-1 plus the shared expert, chunked attention, qk norm, NoPE every 4th layer, llama3 rope; 48 layers,
# hidden 5120 -> 8 layers, hidden 64, 8 experts (top-1 kept)
TEXT_BACKBONE: dict[str, str] = {"meta-llama--Llama-4-Scout-17B-16E-Instruct": "Llama4ForCausalLM"}
REDUCED_TEXT: dict[str, dict[str, Any]] = {
    # positions 512 like every target here (the bundled drafter's; SGLang refuses a target longer than its drafter,
    # model_config.py:1314): transformers then warns that the llama3 rope's original 8192 exceeds it, which changes
    # nothing below 512 positions
    "meta-llama--Llama-4-Scout-17B-16E-Instruct": {**COMMON, "intermediate_size": 32, "intermediate_size_mlp": 128,
                                                    "num_local_experts": 8},
}
# Structural variants: a reduced target with one structural field changed, each for the engine behaviour it exposes
# (no public checkpoint of the class has it): name -> (reduced target, changes).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    # Qwen3-MoE with a dense first layer: transformers builds layer 0 as Qwen3MoeMLP (modeling_qwen3_moe.py:308-313);
    # SGLang 0.5.23 builds every layer sparse (models/qwen3_moe.py:877, "all layers are sparse") and so loads this
    # checkpoint only partly (test_real_class_capture.py)
    "Qwen3-MoE-dense-first-layer": ("Qwen--Qwen3-30B-A3B", {"mlp_only_layers": [0]}),
}
DROPPED = ("quantization_config", "auto_map")
SEED = 0


def reduced_config(name: str) -> dict[str, Any]:
    """The public config of ``name`` with only the size fields of :data:`REDUCED` replaced (a :data:`VARIANTS` name: its
    reduced target with the variant's fields changed, each one the public config has)."""
    if name in VARIANTS:
        base, changes = VARIANTS[name]
        cfg = reduced_config(base)
        assert set(changes) <= set(cfg), f"{name}: {sorted(set(changes) - set(cfg))} not in {base}'s public config"
        return {**cfg, **changes}
    cfg: dict[str, Any] = json.loads((PUBLIC / f"{name}.json").read_text())
    if name in TEXT_BACKBONE:
        cfg = {**cfg["text_config"], "architectures": [TEXT_BACKBONE[name]]}
    reduction = REDUCED.get(name) or REDUCED_CPU_LIMITED.get(name) or REDUCED_TEXT[name]
    # the bundled tokenizer's special ids are not structure: a text backbone's config may not carry them
    missing = sorted(k for k in reduction if k not in cfg and k not in ("torch_dtype", "initializer_range",
                                                                        "bos_token_id", "eos_token_id"))
    assert not missing, f"{name}: the public config has no {missing}; a reduction may only change existing fields"
    cfg.update(reduction)
    for key in DROPPED:
        cfg.pop(key, None)
    cfg.pop("dtype", None)  # transformers 5 spells it dtype; torch_dtype above is read by 4.x and 5.x
    return cfg


def write_target(name: str, out: Path, bundle: Path = BUNDLE) -> Any:
    """Write the reduced ``name`` target into ``out`` (config, safetensors, bundled tokenizer); return the HF model
    reloaded from disk, as a user's training-time capture would load it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = reduced_config(name)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(out)), torch_dtype=torch.float32)
    model.save_pretrained(str(out))
    (out / "config.json").write_text(json.dumps(cfg, indent=1))  # the public spelling, not the re-serialised one
    for f in TOKENIZER_FILES:
        shutil.copy(bundle / "target" / f, out / f)
    try:
        loaded = AutoModelForCausalLM.from_pretrained(str(out), torch_dtype=torch.float32, attn_implementation="sdpa")
    except ValueError:  # GPT-OSS (its sinks): transformers has no sdpa path for the class, only eager
        loaded = AutoModelForCausalLM.from_pretrained(str(out), torch_dtype=torch.float32, attn_implementation="eager")
    return loaded.eval()


def hidden_states(model: Any, ids: list[int]) -> tuple[torch.Tensor, ...]:
    """HF's residual stream of one sample: entry b is boundary b (0 = embedding), the last one final-normed."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    return tuple(h[0] for h in out)


def write_specforge_records(model: Any, out: Path, bundle: Path = BUNDLE) -> Path:
    """SpecForge offline records of ``bundle``'s conversations, recomputed on ``model`` at :data:`AUX_IDS`.

    Same files and keys as SpecForge's offline generation (domain.md section 4): ``input_ids``, ``loss_mask``,
    ``aux_hidden_state`` (layer:1, 3, 5 side by side) and ``hidden_state`` (final-normed)."""
    layers = int(model.config.num_hidden_layers)
    src = bundle / "hidden_states"
    for path in sorted(src.rglob("data_*.ckpt")):
        rec = torch.load(path, map_location="cpu", weights_only=True)
        hs = hidden_states(model, rec["input_ids"].tolist())
        dest = out / path.relative_to(src)
        dest.parent.mkdir(parents=True, exist_ok=True)
        torch.save({
            "input_ids": rec["input_ids"], "loss_mask": rec["loss_mask"],
            "hidden_state": hs[layers][None].contiguous(),
            "aux_hidden_state": torch.cat([hs[j + 1] for j in AUX_IDS], dim=-1)[None].contiguous(),
        }, dest)
    return out


def write_deployment(name: str, root: Path, drafts: dict[str, list[int]], *, bundle: Path = BUNDLE,
                     probes: int = 3, max_probe_tokens: int = 64) -> dict[str, Any]:
    """The reduced ``name`` target, its SpecForge records and the contract ``contract_from_specforge`` writes from
    them, and one copy of ``bundle``'s drafter per ``drafts`` label with those ids: keys ``target``, ``model``,
    ``contract``, ``drafts``, ``arch``."""
    from specparity.training.specforge import contract_from_specforge

    model = write_target(name, root / "target", bundle=bundle)
    records = write_specforge_records(model, root / "hidden_states", bundle=bundle)
    _, contract = contract_from_specforge(
        records, bundle / "draft", root / "target", out=root / "contract.json",
        vocab_mapping=bundle / "vocab_mapping" / "vocab_mapping.pt", probes=probes, max_probe_tokens=max_probe_tokens)
    out = {}
    for label, ids in drafts.items():
        d = root / f"draft-{label}"
        shutil.copytree(bundle / "draft", d)
        cfg = json.loads((d / "config.json").read_text())
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
        (d / "config.json").write_text(json.dumps(cfg, indent=1))
        out[label] = d
    arch = json.loads((root / "target" / "config.json").read_text())["architectures"][0]
    return {"target": root / "target", "model": model, "contract": contract, "drafts": out, "arch": arch}
