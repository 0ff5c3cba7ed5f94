"""Paths and small builders shared by the real-vLLM tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "fixtures" / "vllm"
CONTRACT = BUNDLE / "contract" / "tiny-llama-eagle3-hd32.json"
SPECULATORS_CONTRACT = BUNDLE / "contract-speculators" / "tiny-llama-eagle3-hd32-speculators.json"

def copy_draft(tmp: Path, name: str, *, edit: dict[str, object] | None = None, src: Path | None = None) -> Path:
    """A copy of the bundled SpecForge-style draft (or ``src``) with top-level config keys replaced."""
    out = tmp / name
    shutil.copytree(src or BUNDLE / "draft", out)
    if edit:
        cfg = json.loads((out / "config.json").read_text())
        cfg.update(edit)
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out
