"""Miswired deployments of the bundled example, built once per session from copies (never in place).

Each builder returns ``(contract, target, draft)`` paths. Draft and target variants change one thing
of the bundled deployment; contract variants change what training claims (and its probe pack).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from specparity.contract import (
    dump_contract,
    load_contract,
    parse_contract,
    probe_pack_path,
    read_probe_pack,
    write_probe_pack,
)
from specparity.contract.probes import ProbePack, ProbeSample

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "contracts" / "tiny-llama-eagle3.json"
BUNDLE = ROOT / "fixtures" / "default"
# the same probes recorded in bf16, in SpecForge's format (fixtures/make_bf16.py); same target and drafter
CONTRACT_BF16 = ROOT / "fixtures" / "bf16" / "contract" / "tiny-llama-eagle3-bf16.json"

Deployment = tuple[Path, Path, Path]


def edit_draft(root: Path, name: str, *, config: Callable[[dict[str, Any]], None] | None = None,
               weights: Callable[[dict[str, torch.Tensor]], None] | None = None) -> Path:
    out = root / name
    shutil.copytree(BUNDLE / "draft", out)
    if config is not None:
        cfg = json.loads((out / "config.json").read_text())
        config(cfg)
        (out / "config.json").write_text(json.dumps(cfg, indent=1))
    if weights is not None:
        for f in out.glob("*.safetensors"):
            w = load_file(str(f))
            weights(w)
            save_file(w, str(f), metadata={"format": "pt"})
    return out


def set_ids(ids: list[int] | None) -> Callable[[dict[str, Any]], None]:
    def edit(cfg: dict[str, Any]) -> None:
        if ids is None:
            cfg.pop("eagle_config", None)
        else:
            cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids

    return edit


def edit_contract(root: Path, name: str, *, layer_ids: dict[str, Any], sources: list[str],
                  permute: list[int] | None = None, base: Path = CONTRACT,
                  drafter: dict[str, Any] | None = None) -> Path:
    """A copy of the bundled contract claiming ``sources`` (from ``layer_ids``); ``permute`` reorders the
    recorded chunks, otherwise the recording stays what training really recorded (layer:1, 3, 5)."""
    c = load_contract(base)
    pack = read_probe_pack(probe_pack_path(c, base))
    h = pack.hidden_size
    samples = []
    for s in pack.samples:
        fc = s.fc_input
        if permute is not None:
            fc = torch.cat([fc[:, i * h:(i + 1) * h] for i in permute], dim=-1)
        samples.append(ProbeSample(s.input_ids, fc, s.loss_mask, s.final_norm))
    d = root / name
    d.mkdir()
    sha = write_probe_pack(ProbePack(samples, sources, h), d / c.probes.file)
    data = c.model_dump(mode="json")
    data.update(content_hash=None, name=name)
    data["layer_ids"].update(layer_ids)
    data["drafter"].update(drafter or {})
    data["fc_input"]["sources"] = sources
    data["probes"]["sha256"] = sha
    out = d / f"{name}.json"
    out.write_text(dump_contract(parse_contract(data)))
    return out


@pytest.fixture(scope="session")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Deployment]:
    return build_catalog(tmp_path_factory.mktemp("catalog"), CONTRACT)


@pytest.fixture(scope="session")
def catalog_bf16(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Deployment]:
    """The same miswirings, against the contract whose recording is bf16."""
    return build_catalog(tmp_path_factory.mktemp("catalog-bf16"), CONTRACT_BF16)


def build_catalog(root: Path, contract: Path) -> dict[str, Deployment]:
    """Every scenario of the catalog under ``contract`` (the default bundle's, or the bf16 set's)."""
    target, draft = BUNDLE / "target", BUNDLE / "draft"

    def drop_cols(w: dict[str, torch.Tensor]) -> None:  # k=1, H_t == H_d: fc is 64 -> 64
        w["fc.weight"] = w["fc.weight"][:, :64].contiguous()

    def other_d2t(w: dict[str, torch.Tensor]) -> None:
        w["d2t"] = torch.roll(w["d2t"], 1)

    def norm_before_fc(cfg: dict[str, Any]) -> None:
        cfg["norm_before_fc"] = True

    nan_target = root / "nan-target"
    shutil.copytree(target, nan_target)
    for f in nan_target.glob("*.safetensors"):
        w = load_file(str(f))
        key = next(k for k in w if k.endswith("layers.2.mlp.down_proj.weight"))
        w[key] = w[key].clone()
        w[key][0, 0] = float("nan")
        save_file(w, str(f), metadata={"format": "pt"})

    # the deployed target is not the one training recorded: other weights (same config), another tokenizer,
    # another chat template; each a copy of the bundled target with that one change
    other_weights = root / "other-weights"
    shutil.copytree(target, other_weights)
    gen = torch.Generator().manual_seed(1234)
    for f in other_weights.glob("*.safetensors"):
        w = load_file(str(f))
        for key in [k for k in w if ".layers." in k and w[k].ndim == 2]:
            w[key] = torch.randn(w[key].shape, generator=gen, dtype=w[key].dtype) * w[key].std()
        save_file(w, str(f), metadata={"format": "pt"})
    tokenizer = root / "other-tokenizer"
    shutil.copytree(target, tokenizer)
    tok = json.loads((tokenizer / "tokenizer.json").read_text())
    tok["added_tokens"].append({"id": 259, "content": "<pad>", "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": True})
    (tokenizer / "tokenizer.json").write_text(json.dumps(tok))
    template = root / "other-template"
    shutil.copytree(target, template)
    cfg = json.loads((template / "tokenizer_config.json").read_text())
    cfg["chat_template"] = cfg["chat_template"].replace("'\\n'", "'\\n\\n'")
    (template / "tokenizer_config.json").write_text(json.dumps(cfg))

    def four_ids(cfg: dict[str, Any]) -> None:  # fc.weight stays 3 x 64 wide: SGLang cannot load it
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 3, 5, 6]

    return {
        "healthy": (contract, target, draft),
        "other_weights": (contract, other_weights, draft),
        "other_tokenizer": (contract, tokenizer, draft),
        "other_chat_template": (contract, template, draft),
        "embedding_plus_layers": (contract, target, edit_draft(root, "kimi", config=set_ids([-1, 1, 3]))),
        "no_eagle_config": (contract, target, edit_draft(root, "noids", config=set_ids(None))),
        "ids_plus_one": (contract, target, edit_draft(root, "plus1", config=set_ids([2, 4, 6]))),
        "far_layers": (contract, target, edit_draft(root, "far", config=set_ids([3, 4, 6]))),
        "last_layer_id": (contract, target, edit_draft(root, "last", config=set_ids([1, 3, 7]))),
        "fc_skipped": (contract, target, edit_draft(root, "fcskip", config=set_ids([3]), weights=drop_cols)),
        "nan_target": (contract, nan_target, draft),
        "norm_before_fc": (contract, target, edit_draft(root, "nbf", config=norm_before_fc)),
        # the reverse: training used norm_before_fc, and the draft config says so
        "norm_before_fc_contract": (
            edit_contract(root, "trained-with-nbf", layer_ids={}, sources=["layer:1", "layer:3", "layer:5"],
                          base=contract, drafter={"norm_before_fc": True}),
            target, edit_draft(root, "nbf-as-trained", config=norm_before_fc)),
        "vocab_map": (contract, target, edit_draft(root, "d2t", weights=other_d2t)),
        "unloadable_draft": (contract, target, edit_draft(root, "four", config=four_ids)),
        "self_inconsistent": (
            edit_contract(root, "claims-2-4-6", layer_ids={"ids": [2, 4, 6]}, sources=["layer:2", "layer:4", "layer:6"],
                          base=contract),
            target, edit_draft(root, "serves246", config=set_ids([2, 4, 6]))),
        "order": (
            edit_contract(root, "hf-order", layer_ids={"ids": [6, 2, 4], "convention": "hf_hidden_states"},
                          sources=["layer:5", "layer:1", "layer:3"], permute=[2, 0, 1],
                          base=contract),
            target, draft),
    }
