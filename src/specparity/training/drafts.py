"""Readers for drafter checkpoints as training tools export them (SpecForge's EAGLE-3 and DFlash, speculators).

What is read here is what training *produced*; how SGLang will interpret it is the serving room's
business. Each reader returns a :class:`DraftInfo` with the raw ids exactly as written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specparity.contract.model import IdConvention, VocabMap
from specparity.drafters import DrafterFamily, family_of
from specparity.errors import InputError
from specparity.training.hfdir import read_json, read_weights, safe_torch_load, tensor_sha256


@dataclass(frozen=True)
class DraftInfo:
    config_path: Path
    config: dict[str, Any]
    architecture: str
    ids: list[int] | None
    ids_field: str | None  # where the ids were found, for messages
    convention: IdConvention
    hidden_size: int
    target_hidden_size: int | None
    norm_before_fc: bool
    fc_norm: bool
    norm_output: bool
    bias: bool
    draft_vocab_size: int | None
    fc_weight_shape: tuple[int, ...] | None
    fc_bias_present: bool
    vocab_map: VocabMap | None
    checkpoint_keys: list[str] | None


def _ids(value: Any, path: Path, field: str) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise InputError(f"must be a list of integers, got {value!r}", path=path, field=field)
    return list(value)


def _locate(draft: str | Path) -> tuple[Path, Path | None]:
    p = Path(draft)
    if p.is_dir():
        return p / "config.json", p
    if p.is_file():
        return p, None
    raise InputError("no such draft directory or config file", path=p)


def vocab_map_from(d2t: torch.Tensor | None, t2d: torch.Tensor | None, *, path: Path) -> VocabMap | None:
    if d2t is None:
        return None
    if d2t.dim() != 1 or d2t.dtype not in (torch.int64, torch.int32):
        raise InputError(f"d2t must be a 1-D integer tensor, got {d2t.dtype} {tuple(d2t.shape)}", path=path, field="d2t")
    return VocabMap(
        draft_vocab_size=int(d2t.shape[0]),
        d2t_sha256=tensor_sha256(d2t.to(torch.int64)),
        t2d_sha256=tensor_sha256(t2d.to(torch.bool)) if t2d is not None else None,
    )


def read_vocab_mapping(path: str | Path) -> VocabMap:
    """SpecForge's ``vocab_mapping/vocab_mapping.pt``: ``{"t2d": bool[V_t], "d2t": int64[V_d]}``."""
    p = Path(path)
    data = safe_torch_load(p)
    if not isinstance(data, dict) or "d2t" not in data:
        raise InputError("expected a dict with 'd2t' and 't2d' tensors", path=p, field="d2t")
    vm = vocab_map_from(data.get("d2t"), data.get("t2d"), path=p)
    assert vm is not None
    return vm


def _weights_facts(
    directory: Path | None,
) -> tuple[tuple[int, ...] | None, bool, VocabMap | None, list[str] | None]:
    if directory is None:
        return None, False, None, None
    from specparity.checkpoint_files import weight_files

    if not weight_files(directory).files:
        return None, False, None, None
    w = read_weights(directory)
    fc = w.get("fc.weight", w.get("model.fc.weight"))
    bias = "fc.bias" in w or "model.fc.bias" in w
    vm = vocab_map_from(w.get("d2t"), w.get("t2d"), path=directory)
    return (tuple(fc.shape) if fc is not None else None), bias, vm, sorted(w)


def read_specforge_draft(draft: str | Path) -> DraftInfo:
    """A SpecForge/SGLang-format draft: ids under ``eagle_config.eagle_aux_hidden_state_layer_ids``; a DFlash draft
    (:func:`_read_dflash_draft`) under ``dflash_config.target_layer_ids``."""
    cfg_path, directory = _locate(draft)
    cfg = read_json(cfg_path)
    if family_of(cfg) is DrafterFamily.DFLASH:
        return _read_dflash_draft(cfg, cfg_path, directory)
    archs = cfg.get("architectures") or ["LlamaForCausalLMEagle3"]
    ec = cfg.get("eagle_config")
    if ec is not None and not isinstance(ec, dict):
        raise InputError("eagle_config must be an object", path=cfg_path, field="eagle_config")
    ids = _ids((ec or {}).get("eagle_aux_hidden_state_layer_ids"), cfg_path, "eagle_config.eagle_aux_hidden_state_layer_ids")
    if ids is not None and any(v < 0 for v in ids):
        bad = [v for v in ids if v < 0]
        raise InputError(
            f"SpecForge eagle ids must be non-negative (SpecForge rejects {bad})",
            path=cfg_path,
            field="eagle_config.eagle_aux_hidden_state_layer_ids",
        )
    hidden = cfg.get("hidden_size")
    if not isinstance(hidden, int) or hidden < 1:
        raise InputError(f"missing or invalid ({hidden!r})", path=cfg_path, field="hidden_size")
    nbf = (ec or {}).get("norm_before_fc", cfg.get("norm_before_fc", False))
    fc_shape, bias_present, vm, keys = _weights_facts(directory)
    return DraftInfo(
        config_path=cfg_path,
        config=cfg,
        architecture=str(archs[0]),
        ids=ids,
        ids_field="eagle_config.eagle_aux_hidden_state_layer_ids" if ids is not None else None,
        convention=IdConvention.SPECFORGE,
        hidden_size=hidden,
        target_hidden_size=cfg.get("target_hidden_size"),
        norm_before_fc=bool(nbf),
        fc_norm=bool(cfg.get("fc_norm", cfg.get("use_aux_norm", False))),
        norm_output=bool(cfg.get("norm_output", False)),
        bias=bool(cfg.get("bias", False)),
        draft_vocab_size=cfg.get("draft_vocab_size") or cfg.get("vocab_size"),
        fc_weight_shape=fc_shape,
        fc_bias_present=bias_present,
        vocab_map=vm,
        checkpoint_keys=keys,
    )


def _read_dflash_draft(cfg: dict[str, Any], cfg_path: Path, directory: Path | None) -> DraftInfo:
    """A DFlash draft as SpecForge saves it (SF ``configs/qwen3-8b-dflash.json``): ids under
    ``dflash_config.target_layer_ids``, which SpecForge writes into the config it trains with
    (SF ``specforge/algorithms/model_providers.py:329-345``, ``_build_dflash_family_model``); fc is ``Linear(len(ids) * hidden_size, hidden_size)``, no
    bias and no norm before it (SF ``specforge/modeling/draft/dflash.py:360-368``); embedding and lm_head are the
    target's, so there is no draft vocabulary and no ``d2t``."""
    dc = cfg.get("dflash_config")
    if dc is not None and not isinstance(dc, dict):
        raise InputError("dflash_config must be an object", path=cfg_path, field="dflash_config")
    field = "dflash_config.target_layer_ids"
    ids = _ids((dc or {}).get("target_layer_ids"), cfg_path, field)
    hidden = cfg.get("hidden_size")
    if not isinstance(hidden, int) or hidden < 1:
        raise InputError(f"missing or invalid ({hidden!r})", path=cfg_path, field="hidden_size")
    fc_shape, bias_present, vm, keys = _weights_facts(directory)
    return DraftInfo(
        config_path=cfg_path, config=cfg, architecture=str((cfg.get("architectures") or ["DFlashDraftModel"])[0]),
        ids=ids, ids_field=field if ids is not None else None, convention=IdConvention.DFLASH, hidden_size=hidden,
        target_hidden_size=cfg.get("target_hidden_size"), norm_before_fc=False, fc_norm=False, norm_output=False,
        bias=False, draft_vocab_size=cfg.get("vocab_size"), fc_weight_shape=fc_shape, fc_bias_present=bias_present,
        vocab_map=vm, checkpoint_keys=keys,
    )


def read_speculators_draft(draft: str | Path) -> DraftInfo:
    """A speculators ``eagle3`` config: top-level ids in vLLM boundary convention (domain.md §8)."""
    cfg_path, directory = _locate(draft)
    cfg = read_json(cfg_path)
    kind = cfg.get("speculators_model_type")
    if kind != "eagle3":
        raise InputError(f"speculators_model_type is {kind!r}, expected 'eagle3'", path=cfg_path, field="speculators_model_type")
    ids = _ids(cfg.get("eagle_aux_hidden_state_layer_ids"), cfg_path, "eagle_aux_hidden_state_layer_ids")
    layer_cfg = cfg.get("transformer_layer_config") or {}
    hidden = layer_cfg.get("hidden_size") if isinstance(layer_cfg, dict) else None
    if not isinstance(hidden, int):
        raise InputError("missing hidden_size", path=cfg_path, field="transformer_layer_config.hidden_size")
    if cfg.get("norm_before_fc") and cfg.get("fc_norm"):
        raise InputError("norm_before_fc and fc_norm are mutually exclusive", path=cfg_path, field="fc_norm")
    fc_shape, bias_present, vm, keys = _weights_facts(directory)
    return DraftInfo(
        config_path=cfg_path,
        config=cfg,
        architecture=str((cfg.get("architectures") or ["Eagle3Speculator"])[0]),
        ids=ids,
        ids_field="eagle_aux_hidden_state_layer_ids" if ids is not None else None,
        convention=IdConvention.VLLM,
        hidden_size=hidden,
        target_hidden_size=cfg.get("target_hidden_size"),
        norm_before_fc=bool(cfg.get("norm_before_fc", False)),
        fc_norm=bool(cfg.get("fc_norm", False)),
        norm_output=bool(cfg.get("norm_output", False)),
        bias=bool(layer_cfg.get("mlp_bias", False)) if isinstance(layer_cfg, dict) else False,
        draft_vocab_size=cfg.get("draft_vocab_size", 32000),
        fc_weight_shape=fc_shape,
        fc_bias_present=bias_present,
        vocab_map=vm,
        checkpoint_keys=keys,
    )


def verifier_of(cfg: dict[str, Any]) -> dict[str, Any]:
    sc = cfg.get("speculators_config") or {}
    v = sc.get("verifier") if isinstance(sc, dict) else None
    return v if isinstance(v, dict) else {}

