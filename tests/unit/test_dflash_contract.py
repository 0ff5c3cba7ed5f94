"""A DFlash drafter's contract from what SpecForge's DFlash training writes.

SpecForge's DFlash path writes the target layers it trained on into the draft config it trains with
(``dflash_config.target_layer_ids``, SF ``specforge/algorithms/model_providers.py:329-345``), and its offline records
as ``input_ids``, ``loss_mask`` and ``hidden_states`` (those layers side by side, no final-norm state: SF
``specforge/algorithms/dflash/providers.py:134-160, 193-205``). Id k is ``layer:k`` for every reader
(``conventions.dflash_ids_to_sources``). A DFlash config that names no ids is refused by name (exit 3): its layers
would be the serving engine's own choice, and the engines choose differently.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from specparity.contract import load_contract, probe_pack_path, read_probe_pack
from specparity.contract.conventions import (
    IdConvention,
    dflash_ids_to_sources,
    ids_to_sources,
    sources_to_ids,
)
from specparity.errors import EnvironmentProblem, InputError
from specparity.training.fromconfig import contract_from_config
from specparity.training.specforge import contract_from_specforge

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data" / "drafter_families"
PUBLIC = ROOT / "tests" / "serving" / "configs" / "public" / "targets"
VLLM = ROOT / "fixtures" / "vllm"  # an 8-layer Llama target (hidden 64) and SpecForge records at layer:1, 3, 5
SPECFORGE_DFLASH = DATA / "specforge_qwen3_8b_dflash.json"  # SpecForge's own DFlash draft config, verbatim


def _config_dir(tmp: Path, cfg: dict[str, object]) -> Path:
    d = tmp / "draft"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_dflash_ids_name_layer_outputs_and_round_trip() -> None:
    assert dflash_ids_to_sources([1, 9, 17, 25, 33], num_layers=36) == [
        "layer:1", "layer:9", "layer:17", "layer:25", "layer:33"]
    for ids in ([0, 3, 7], [2], [1, 9, 17, 25, 33]):
        sources = ids_to_sources(ids, IdConvention.DFLASH, num_layers=36)
        assert sources_to_ids(sources, IdConvention.DFLASH, num_layers=36) == ids
    for bad, why in (([3, 1], "strictly ascending"), ([1, 1], "strictly ascending"), ([-1, 2], "not a layer"),
                     ([36], "not a layer"), (None, "not set")):
        with pytest.raises(ValueError, match=why):
            dflash_ids_to_sources(bad, num_layers=36)
    with pytest.raises(ValueError, match="no DFlash target layer id"):
        sources_to_ids(["embedding", "layer:1"], IdConvention.DFLASH, num_layers=36)


def test_from_config_records_specforges_dflash_output(tmp_path: Path) -> None:
    cfg = json.loads(SPECFORGE_DFLASH.read_text())
    assert cfg["dflash_config"]["target_layer_ids"] == [1, 9, 17, 25, 33]  # what SpecForge wrote, verbatim
    c, path = contract_from_config(_config_dir(tmp_path, cfg), PUBLIC / "Qwen--Qwen3-8B.json", trainer="specforge",
                                   out=tmp_path / "d.json")
    assert (c.drafter.family, c.drafter.architecture) == ("dflash", "DFlashDraftModel")
    assert c.fc_input.sources == ["layer:1", "layer:9", "layer:17", "layer:25", "layer:33"]
    assert c.fc_input.total_width == c.drafter.fc_in_features == 5 * 4096
    assert c.layer_ids.convention is IdConvention.DFLASH and c.layer_ids.ids == [1, 9, 17, 25, 33]
    assert c.drafter.vocab_map is None and c.drafter.draft_vocab_size == 151936
    assert c.layout_assumed is not None and "id k = layer:k" in c.layout_assumed.reason
    assert c.layout_assumed.trainer_sglang_version is None  # DFlash ids do not depend on the trainer's SGLang
    again = load_contract(path)
    assert again.drafter.family == "dflash" and again.layer_ids.convention is IdConvention.DFLASH


def test_from_config_refuses_a_dflash_config_without_ids_by_name(tmp_path: Path) -> None:
    # TorchSpec's Qwen3-8B DFlash config (README.md in DATA): target_layer_ids null
    cfg = json.loads((DATA / "qwen3_8b_dflash.json").read_text())
    with pytest.raises(EnvironmentProblem, match="names no target layers") as e:
        contract_from_config(_config_dir(tmp_path, cfg), PUBLIC / "Qwen--Qwen3-8B.json", trainer="specforge",
                             out=tmp_path / "d.json")
    assert "dflash_utils.py:348-385" in str(e.value) and "gpu_model_runner.py:5251-5285" in str(e.value)
    assert e.value.exit_code == 3


def test_from_config_names_a_bad_dflash_id_by_field(tmp_path: Path) -> None:
    cfg = json.loads(SPECFORGE_DFLASH.read_text())
    cfg["dflash_config"]["target_layer_ids"] = [1, 9, 36]  # Qwen3-8B has layers 0..35
    with pytest.raises(InputError, match="not a layer of a 36-layer target") as e:
        contract_from_config(_config_dir(tmp_path, cfg), PUBLIC / "Qwen--Qwen3-8B.json", trainer="specforge",
                             out=tmp_path / "d.json")
    assert e.value.field == "dflash_config.target_layer_ids"


def _dflash_run(tmp: Path, ids: list[int]) -> tuple[Path, Path]:
    """A DFlash run on the vLLM bundle's target, shaped as SpecForge writes one: the draft (SpecForge's DFlash config
    with the sizes of the 8-layer target, seeded random weights) and its records (``hidden_states`` = the target
    layers of ``ids``, taken from the bundle's records of layer:1, 3, 5)."""
    cfg = json.loads(SPECFORGE_DFLASH.read_text())
    cfg.update(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
               num_hidden_layers=1, layer_types=["full_attention"], num_target_layers=8, vocab_size=512,
               max_position_embeddings=512, bos_token_id=256, eos_token_id=257)
    cfg["dflash_config"] = {"mask_token_id": 5, "target_layer_ids": ids}
    draft = _config_dir(tmp, cfg)
    g = torch.Generator().manual_seed(0)
    save_file({"fc.weight": torch.randn(64, 64 * len(ids), generator=g), "hidden_norm.weight": torch.ones(64),
               "norm.weight": torch.ones(64)}, str(draft / "model.safetensors"))
    chunk = {1: 0, 3: 1, 5: 2}  # the bundle's records hold layer:1, 3, 5 side by side
    records = tmp / "hidden_states"
    for src in sorted((VLLM / "hidden_states").rglob("data_*.ckpt")):
        rec = torch.load(src, map_location="cpu", weights_only=True)
        aux = rec["aux_hidden_state"].reshape(rec["aux_hidden_state"].shape[-2], 3, 64)
        dest = records / src.relative_to(VLLM / "hidden_states")
        dest.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"input_ids": rec["input_ids"], "loss_mask": rec["loss_mask"],
                    "hidden_states": aux[:, [chunk[i] for i in ids]].reshape(1, -1, 64 * len(ids)).contiguous()},
                   dest)
    return draft, records


def test_from_specforge_reads_a_dflash_run(tmp_path: Path) -> None:
    draft, records = _dflash_run(tmp_path, [1, 3, 5])
    c, path = contract_from_specforge(records, draft, VLLM / "target", out=tmp_path / "c.json", probes=2)
    assert c.drafter.family == "dflash" and c.fc_input.sources == ["layer:1", "layer:3", "layer:5"]
    assert c.layer_ids.convention is IdConvention.DFLASH and c.layer_ids.origin == "draft_config"
    assert c.drafter.vocab_map is None and c.fc_input.total_width == 192
    assert c.probes is not None
    pack = read_probe_pack(probe_pack_path(c, path), expected_sha256=c.probes.sha256)
    first = torch.load(sorted(records.rglob("data_*.ckpt"))[0], weights_only=True)
    n = pack.samples[0].num_tokens
    assert torch.equal(pack.samples[0].fc_input, first["hidden_states"][0, :n])
    assert pack.samples[0].final_norm is None  # a DFlash run records no final-norm state


def test_from_specforge_names_what_a_dflash_run_gets_wrong(tmp_path: Path) -> None:
    draft, records = _dflash_run(tmp_path / "a", [1, 3])
    shutil.copy(VLLM / "draft" / "model.safetensors", draft / "model.safetensors")  # fc of an EAGLE-3 head: 3 x 64
    with pytest.raises(InputError, match="in_features 192 != 2 sources") as e:
        contract_from_specforge(records, draft, VLLM / "target", out=tmp_path / "a.json")
    assert e.value.field == "fc.weight"
    draft, records = _dflash_run(tmp_path / "b", [1, 3, 5])
    with pytest.raises(InputError, match="target's vocabulary"):
        contract_from_specforge(records, draft, VLLM / "target", out=tmp_path / "b.json",
                                vocab_mapping=VLLM / "vocab_mapping" / "vocab_mapping.pt")
    # the EAGLE-3 records of the bundle carry no hidden_states key: named by file and field
    with pytest.raises(InputError, match="missing key hidden_states"):
        contract_from_specforge(VLLM / "hidden_states", draft, VLLM / "target", out=tmp_path / "c.json")
    cfg = json.loads((draft / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = [1, 3, 7]  # layer 7 is the last: SpecForge's capture never reaches it
    (draft / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="never reaches"):
        contract_from_specforge(records, draft, VLLM / "target", out=tmp_path / "d.json")
