"""speculators eagle3 configs: top-level ids in vLLM's boundary convention (no +1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from sf_builders import write_target

from specparity.errors import InputError
from specparity.training.drafts import read_speculators_draft
from specparity.training.speculators import contract_from_speculators


def _draft(d: Path, ids: list[int] | None, *, hidden: int = 8, k: int = 3, extra: dict | None = None) -> Path:  # type: ignore[type-arg]
    d.mkdir(parents=True)
    cfg = {
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": {"hidden_size": 16, "model_type": "llama"},
        "draft_vocab_size": 32,
        "norm_before_fc": False,
        "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": "t", "architectures": ["LlamaForCausalLM"]}},
        **(extra or {}),
    }
    if ids is not None:
        cfg["eagle_aux_hidden_state_layer_ids"] = ids
    (d / "config.json").write_text(json.dumps(cfg))
    save_file({"fc.weight": torch.zeros(16, k * hidden)}, str(d / "model.safetensors"))
    return d


def _data(d: Path, *, n_layers: int, hidden: int = 8, samples: int = 2) -> Path:
    d.mkdir(parents=True)
    for i in range(samples):
        save_file({"token_ids": torch.arange(6), "hidden_states": torch.randn(6, n_layers, hidden)}, str(d / f"hs_{i}.safetensors"))
    return d


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        ([2, 4, 5], ["layer:1", "layer:3", "layer:4"]),  # boundary ids, no +1
        ([0, 1, 2], ["embedding", "layer:0", "layer:1"]),
        (None, ["layer:1", "layer:3", "layer:4"]),  # default (2, L//2, L-3) for L=8
    ],
)
def test_vllm_boundary_ids_become_canonical_sources(tmp_path, ids, expected):
    target = write_target(tmp_path / "t", num_layers=8, hidden=8)
    c, _ = contract_from_speculators(
        _data(tmp_path / "hs", n_layers=4), _draft(tmp_path / "d", ids), target, out=tmp_path / "c.json"
    )
    assert c.fc_input.sources == expected
    assert c.layer_ids.convention.value == "vllm_speculators" and c.layer_ids.ids == ids


def test_probe_pack_drops_the_verifier_last_hidden_state(tmp_path):
    target = write_target(tmp_path / "t", num_layers=8, hidden=8)
    hs = _data(tmp_path / "hs", n_layers=4)
    c, path = contract_from_speculators(hs, _draft(tmp_path / "d", [2, 4, 5]), target, out=tmp_path / "c.json")
    from safetensors.torch import load_file

    from specparity.contract import probe_pack_path, read_probe_pack

    pack = read_probe_pack(probe_pack_path(c, path))
    raw = load_file(str(hs / "hs_0.safetensors"))["hidden_states"]
    assert torch.equal(pack.samples[0].fc_input, raw[:, :3].reshape(6, 24))


def test_mutually_exclusive_norm_flags_rejected(tmp_path):
    d = _draft(tmp_path / "d", [2, 4, 5], extra={"norm_before_fc": True, "fc_norm": True})
    with pytest.raises(InputError, match="mutually exclusive") as ei:
        read_speculators_draft(d)
    assert ei.value.field == "fc_norm"


def test_verifier_architecture_must_match_target(tmp_path):
    target = write_target(tmp_path / "t", num_layers=8, hidden=8, arch="Qwen3ForCausalLM")
    with pytest.raises(InputError) as ei:
        contract_from_speculators(_data(tmp_path / "hs", n_layers=4), _draft(tmp_path / "d", [2, 4, 5]), target,
                                  out=tmp_path / "c.json")
    assert ei.value.field == "speculators_config.verifier.architectures"
