"""Drafters of a family specparity does not model yet (deployed.unmodelled_family) are refused by name, exit 3,
before any engine starts: never explained or gated as a Llama-style EAGLE-3 head (a DFlash drafter reading five layers
was explained as an EAGLE-3 head on SGLang's default three, exit 0)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specparity.deployed import unmodelled_family

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data" / "drafter_families"
DEFAULT = ROOT / "fixtures" / "default"
DFLASH = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16,
          "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
          "hidden_size": 2560, "num_hidden_layers": 5, "num_target_layers": 36, "vocab_size": 151936}


def _draft(tmp: Path, cfg: dict[str, object]) -> Path:
    d = tmp / "draft"
    shutil.copytree(DEFAULT / "draft", d)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize(("cfg", "family"), [
    (json.loads((DATA / "qwen3_8b_eagle3_mla.json").read_text()), "MLA EAGLE-3 head"),
    (DFLASH, "DFlash"),
    ({"architectures": ["DSparkDraftModel"], "dflash_config": {"projector_type": "dspark"}}, "DFlash"),
])
def test_unmodelled_families_are_named(tmp_path: Path, cfg: dict[str, object], family: str) -> None:
    found = unmodelled_family(_draft(tmp_path, cfg))
    assert found is not None and found.startswith(family), found


def test_the_eagle3_heads_specparity_models_are_not_caught() -> None:
    for draft in (DEFAULT / "draft", ROOT / "fixtures" / "vllm" / "draft"):
        assert unmodelled_family(draft) is None, draft


def test_explain_and_gate_refuse_a_dflash_drafter_by_name_exit_3(tmp_path: Path) -> None:
    draft = _draft(tmp_path, DFLASH)
    for words in (["explain"], ["gate", "--contract", str(ROOT / "contracts" / "tiny-llama-eagle3.json")]):
        run = subprocess.run([sys.executable, "-m", "specparity.cli", *words, "--target", str(DEFAULT / "target"),
                              "--draft", str(draft)], capture_output=True, text=True, timeout=120)
        assert run.returncode == 3, run.stdout + run.stderr
        assert "DFlash" in run.stderr and "[1, 9, 17, 25, 33]" in run.stderr and "Traceback" not in run.stderr
