"""Builders of small, synthetic training artifacts in SpecForge's on-disk format (domain.md §4)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file


@dataclass
class SpecForgeRun:
    root: Path
    target: Path
    draft: Path
    hidden_states: Path
    vocab_mapping: Path
    num_layers: int
    hidden: int


def write_target(d: Path, *, num_layers: int, hidden: int, vocab: int = 64, arch: str = "LlamaForCausalLM") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": [arch],
        "model_type": "llama",
        "num_hidden_layers": num_layers,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": vocab,
        "torch_dtype": "float32",
        "pad_token_id": 0,
    }
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    return d


def write_draft(
    d: Path, *, ids: Sequence[int] | None, target_hidden: int, k: int, hidden: int = 16, vocab: int = 32
) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    cfg: dict[str, object] = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": hidden,
        "draft_vocab_size": vocab,
        "vocab_size": 64,
    }
    if ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(ids), "use_aux_hidden_state": True}
    (d / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    save_file(
        {
            "fc.weight": torch.randn(hidden, k * target_hidden, generator=g),
            "d2t": torch.zeros(vocab, dtype=torch.int64),
            "t2d": torch.ones(64, dtype=torch.bool),
        },
        str(d / "model.safetensors"),
    )
    return d


def write_record(path: Path, *, seq: int, width: int, hidden: int, seed: int, pad: int = 0,
                 drop: str | None = None, dtype: torch.dtype = torch.float32) -> None:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 60, (seq,), generator=g)
    mask = torch.ones(seq, dtype=torch.int64)
    if pad:
        ids[-pad:] = 0
        mask[-pad:] = 0
    rec = {
        "input_ids": ids,
        "loss_mask": mask,
        "aux_hidden_state": torch.randn(1, seq, width, generator=g).to(dtype),
        "hidden_state": torch.randn(1, seq, hidden, generator=g).to(dtype),
    }
    if drop:
        del rec[drop]
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(rec, path)


