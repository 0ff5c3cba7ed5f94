"""Sharded draft checkpoints are read whole, trainer state is ignored, and a draft that
cannot be read turns its checks into a `check_skipped` warning instead of silently off."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from specparity import gate_verdict
from specparity.checkpoint_files import checkpoint_shapes, fc_shape_from_checkpoint, weight_files
from specparity.compare.findings import FindingKind, Severity
from specparity.errors import InputError
from specparity.training.drafts import read_specforge_draft

H = 8
D2T = torch.zeros(16, dtype=torch.int64)
T2D = torch.ones(32, dtype=torch.bool)


def _draft_dir(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": H, "draft_vocab_size": 16,
           "vocab_size": 32, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5]}}
    (root / "config.json").write_text(json.dumps(cfg))
    return root


def _shard_1() -> dict[str, torch.Tensor]:
    return {"fc.weight": torch.zeros(H, 3 * H), "norm.weight": torch.ones(H)}


def _shard_2() -> dict[str, torch.Tensor]:
    return {"d2t": D2T, "t2d": T2D, "lm_head.weight": torch.zeros(16, H)}


def _index(root: Path, shards: dict[str, dict[str, torch.Tensor]], name: str) -> None:
    weight_map = {k: file for file, tensors in shards.items() for k in tensors}
    (root / name).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_sharded_safetensors_are_read_whole_and_a_stray_file_is_left_out(tmp_path: Path) -> None:
    d = _draft_dir(tmp_path / "draft")
    shards = {"model-00001-of-00002.safetensors": _shard_1(), "model-00002-of-00002.safetensors": _shard_2()}
    for name, tensors in shards.items():
        save_file(tensors, str(d / name))
    _index(d, shards, "model.safetensors.index.json")
    save_file({"fc.weight": torch.zeros(H, 2 * H)}, str(d / "consolidated.safetensors"))  # not in the index
    found = weight_files(d)
    assert [p.name for p in found.files] == sorted(shards)
    assert found.ignored == (("consolidated.safetensors", "not named in model.safetensors.index.json"),)
    info = read_specforge_draft(d)
    assert info.fc_weight_shape == (H, 3 * H) and info.vocab_map is not None
    assert info.checkpoint_keys == ["d2t", "fc.weight", "lm_head.weight", "norm.weight", "t2d"]
    fc = fc_shape_from_checkpoint(d)
    assert fc is not None and fc.in_features == 3 * H


def test_sharded_bin_checkpoint_keeps_its_vocab_map(tmp_path: Path) -> None:
    """Before: only pytorch_model.bin / model.bin / model.pt were known, so shards read as 'no weights'
    and the vocab-map check went off without a word."""
    d = _draft_dir(tmp_path / "draft")
    torch.save(_shard_1(), d / "pytorch_model-00001-of-00002.bin")
    torch.save(_shard_2(), d / "pytorch_model-00002-of-00002.bin")
    info = read_specforge_draft(d)
    assert info.vocab_map is not None and info.vocab_map.draft_vocab_size == 16
    assert info.fc_weight_shape == (H, 3 * H)
    assert checkpoint_shapes(d)["d2t"] == (16,)


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_training_args_bin_beside_the_weights_is_ignored(tmp_path: Path, weights: str) -> None:
    """HF Trainer writes training_args.bin (a pickled object, not tensors) beside the weights; SGLang skips it
    (sglang 0.5.23 model_loader/weight_utils.py:875) and so must the fc-shape reader, which used to
    torch.load every *.bin and failed on it."""
    d = _draft_dir(tmp_path / "draft")
    tensors = {**_shard_1(), **_shard_2()}
    if weights.endswith(".safetensors"):
        save_file(tensors, str(d / weights))
    else:
        torch.save(tensors, d / weights)
    torch.save(argparse.Namespace(learning_rate=1e-4), d / "training_args.bin")
    assert [p.name for p in weight_files(d).files] == [weights]
    assert checkpoint_shapes(d)["fc.weight"] == (H, 3 * H)
    assert read_specforge_draft(d).vocab_map is not None


def test_an_index_naming_a_missing_shard_is_bad_input(tmp_path: Path) -> None:
    d = _draft_dir(tmp_path / "draft")
    save_file(_shard_1(), str(d / "model-00001-of-00002.safetensors"))
    _index(d, {"model-00001-of-00002.safetensors": _shard_1(), "model-00002-of-00002.safetensors": _shard_2()},
           "model.safetensors.index.json")
    with pytest.raises(InputError) as e:
        weight_files(d)
    assert e.value.field == "weight_map" and "model-00002-of-00002.safetensors" in str(e.value)


def test_an_unreadable_draft_is_a_check_skipped_warning(tmp_path: Path) -> None:
    d = _draft_dir(tmp_path / "draft")
    (d / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    cfg, d2t, observed, keys, skipped = gate_verdict._draft_facts(d)
    assert cfg["hidden_size"] == H and (d2t, observed, keys) == (None, False, None)
    [f] = skipped
    assert f.kind is FindingKind.CHECK_SKIPPED and f.severity is Severity.WARNING
    assert f.details["skipped"] == ["vocab_map", "checkpoint_keys"]
    assert "model.safetensors" in f.message and "vocab-map" in f.message
    save_file({**_shard_1(), **_shard_2()}, str(d / "model.safetensors"))
    assert gate_verdict._draft_facts(d)[4] == []  # readable: nothing skipped
