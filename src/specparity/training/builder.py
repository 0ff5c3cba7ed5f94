"""Assemble a contract and its probe pack from what a training tool recorded (shared by importers)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import torch

import specparity
from specparity.contract.io import save_contract
from specparity.contract.model import (
    Contract,
    DrafterSpec,
    FcInputLayout,
    ProbePackRef,
    Provenance,
    RawLayerIds,
    SpecConfig,
    TargetSpec,
    TrainingOutcome,
    VocabMap,
)
from specparity.contract.probes import ProbePack, ProbeSample, write_probe_pack
from specparity.drafters import DrafterFamily, family_of, family_words
from specparity.errors import EnvironmentProblem, InputError
from specparity.training.drafts import DraftInfo
from specparity.training.hfdir import FINGERPRINT_FIELDS, TargetInfo


def draft_family_for_contract(draft: Path) -> DrafterFamily:
    """The drafter's family, for the contract to record; an :class:`EnvironmentProblem` (exit 3) for a drafter whose
    contract specparity cannot write: a DSpark drafter (no DSpark contract yet: the static level and explain only), and a DFlash drafter whose config names no
    ``dflash_config.target_layer_ids``: then the layers are the serving engine's own choice, and the engines differ
    (sglang 0.5.23 speculative/dflash_utils.py:348-385 picks build_target_layer_ids(L, draft layers); vllm 0.32 serves
    its EAGLE-3 default, v1/worker/gpu_model_runner.py:5251-5285), which a contract written without an engine must not
    guess. SpecForge's DFlash training writes the ids it trained on into the draft config
    (SF specforge/algorithms/model_providers.py:329-345), so its exports name them."""
    try:
        cfg = json.loads((draft / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return DrafterFamily.EAGLE3
    family = family_of(cfg) if isinstance(cfg, dict) else DrafterFamily.EAGLE3
    if family is DrafterFamily.DSPARK:
        raise EnvironmentProblem(f"{draft} is a {family.label} ({family_words(cfg)}): specparity does not write "
                                 "contracts for it yet; `specparity explain` resolves it on each engine")
    if family is DrafterFamily.DFLASH:
        dflash = cfg.get("dflash_config")
        if not isinstance(dflash, dict) or dflash.get("target_layer_ids") is None:
            raise EnvironmentProblem(
                f"{draft} is a {family.label} ({family_words(cfg)}) whose config names no target layers: each engine "
                "then picks its own (sglang 0.5.23 speculative/dflash_utils.py:348-385, build_target_layer_ids; vllm "
                "0.32 its EAGLE-3 default, v1/worker/gpu_model_runner.py:5251-5285), so no contract can say what "
                "training used. Set dflash_config.target_layer_ids to the ids the drafter was trained on (SpecForge "
                "writes them into the config it trains with); `specparity explain` resolves it on each engine")
    return family


def check_fc_width(draft: DraftInfo, sources: Sequence[str], hidden: int) -> int:
    """fc in_features in the checkpoint must be ``len(sources) * hidden``; returns that width."""
    width = len(sources) * hidden
    if draft.fc_weight_shape is not None and draft.fc_weight_shape[-1] != width:
        raise InputError(
            f"fc.weight is {list(draft.fc_weight_shape)}: in_features {draft.fc_weight_shape[-1]} != "
            f"{len(sources)} sources ({', '.join(sources)}) x {hidden} = {width}",
            path=draft.config_path.parent,
            field="fc.weight",
        )
    return width


def dtype_name(dtype: torch.dtype, *, path: str | Path, field: str) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in ("float32", "bfloat16", "float16"):
        raise InputError(f"unsupported dtype {name}", path=path, field=field)
    return name


def write_contract(
    *,
    target: TargetInfo,
    draft: DraftInfo,
    sources: Sequence[str],
    raw_ids: RawLayerIds,
    samples: list[ProbeSample],
    dtype: str,
    vocab_map: VocabMap | None,
    out: Path,
    name: str | None,
    tool: str,
    data_location: str,
    created_at: datetime | None,
    run_id: str | None,
    serving: SpecConfig | None = None,
    training_outcome: TrainingOutcome | None = None,
) -> tuple[Contract, Path]:
    """Write the probe pack beside ``out``, then the contract at ``out``. Returns both."""
    if not samples:
        raise InputError("no samples to make probes from", path=data_location)
    hidden = target.hidden_size
    width = len(sources) * hidden
    contract_name = name or out.name.removesuffix(".json").removesuffix(".contract")
    pack_name = f"{contract_name}.probes.safetensors"
    pack = ProbePack(samples=samples, sources=list(sources), hidden_size=hidden)
    sha = write_probe_pack(pack, out.parent / pack_name)
    fc_out = draft.fc_weight_shape[0] if draft.fc_weight_shape is not None else draft.hidden_size
    contract = Contract(
        name=contract_name,
        target=TargetSpec(
            architecture=target.architecture,
            num_hidden_layers=target.num_layers,
            hidden_size=hidden,
            vocab_size=target.vocab_size,
            dtype=target.dtype,
            name_or_path=target.config.get("_name_or_path") or None,
            config_fingerprint=target.config_fingerprint,
            fingerprint_fields=list(FINGERPRINT_FIELDS),
            tokenizer_fingerprint=target.tokenizer_fingerprint,
            chat_template_fingerprint=target.chat_template_fingerprint,
        ),
        fc_input=FcInputLayout(
            sources=list(sources), chunk_widths=[hidden] * len(sources), total_width=width, dtype=dtype
        ),
        layer_ids=raw_ids,
        drafter=DrafterSpec(
            architecture=draft.architecture,
            hidden_size=draft.hidden_size,
            fc_in_features=width,
            fc_out_features=fc_out,
            fc_bias=draft.fc_bias_present,
            norm_before_fc=draft.norm_before_fc,
            fc_norm=draft.fc_norm,
            norm_output=draft.norm_output,
            draft_vocab_size=vocab_map.draft_vocab_size if vocab_map else (draft.draft_vocab_size or target.vocab_size),
            vocab_map=vocab_map,
            checkpoint_keys=draft.checkpoint_keys,
            family=draft_family_for_contract(draft.config_path.parent).value,
        ),
        serving=serving or SpecConfig(),
        training_outcome=training_outcome,
        probes=ProbePackRef(file=pack_name, sha256=sha, num_samples=len(samples), num_tokens=pack.num_tokens),
        provenance=Provenance(
            run_id=run_id,
            tool=tool,
            data_location=data_location,
            created_at=created_at or datetime.now(timezone.utc).replace(microsecond=0),
            specparity_version=specparity.__version__,
        ),
    )
    save_contract(contract, out)
    return contract, out
