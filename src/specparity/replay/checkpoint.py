"""Safe tensor reads from model directories: safetensors only (never pickle), one tensor at a time.

A sharded checkpoint is read through its ``model.safetensors.index.json``, so reading the target's
``lm_head.weight`` or embedding touches only the shard that holds it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import safe_open

from specparity.errors import InputError

TARGET_EMBED = "model.embed_tokens.weight"
TARGET_LM_HEAD = "lm_head.weight"


class SafetensorsDir:
    """Reads single tensors from a model directory's safetensors files (sharded via the index or not)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        index = self.root / "model.safetensors.index.json"
        self.where: dict[str, Path] = {}
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError) as e:
                raise InputError(f"unreadable safetensors index: {e}", path=index, field="weight_map") from None
            self.where = {str(n): self.root / str(f) for n, f in weight_map.items()}
        else:
            files = sorted(self.root.glob("*.safetensors"))
            if not files:
                raise InputError("no *.safetensors file (only safetensors are read, never pickle)", path=self.root)
            for f in files:
                with safe_open(str(f), framework="pt") as fh:
                    self.where.update({str(n): f for n in fh.keys()})  # noqa: SIM118 (safe_open has no __iter__)

    def names(self) -> set[str]:
        return set(self.where)

    def find(self, *candidates: str) -> str | None:
        return next((c for c in candidates if c in self.where), None)

    def read(self, name: str) -> torch.Tensor:
        if name not in self.where:
            raise InputError(f"tensor {name!r} not found", path=self.root)
        with safe_open(str(self.where[name]), framework="pt") as fh:
            tensor: torch.Tensor = fh.get_tensor(name)
        return tensor


def read_target_tensor(target_dir: str | Path, names: Sequence[str]) -> torch.Tensor:
    """The first of ``names`` found in the target's safetensors (reads only that tensor)."""
    st = SafetensorsDir(target_dir)
    found = st.find(*names)
    if found is None:
        raise InputError(f"none of {list(names)} in the target checkpoint", path=target_dir)
    return st.read(found)


def read_target_lm_head(target_dir: str | Path) -> torch.Tensor:
    """The target's ``lm_head.weight`` ``[V, H]`` (its embedding when the target ties them)."""
    cfg = json.loads((Path(target_dir) / "config.json").read_text())
    names = [TARGET_LM_HEAD] if not cfg.get("tie_word_embeddings") else [TARGET_EMBED]
    return read_target_tensor(target_dir, names).to(torch.float32)
