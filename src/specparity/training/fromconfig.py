"""``contract from-config``: a contract from the draft and target configs alone, for drafters whose
recordings are not at hand. No probe pack; the layout is recorded as assumed, with the reason.

The layout follows the declared ids under the trainer's convention, or the trainer's default when none
are declared (domain.md §3.1):

- ``specforge``: SpecForge hands its ids (default ``[1, L//2-1, L-4]``, SF
  ``specforge/algorithms/model_providers.py:188-211``) to the target's SGLang setter
  (SF ``offline_capture/sglang_backend/capture.py:89-113``), so their meaning is that SGLang version's
  rule on that architecture; the DeepSeek/Kimi rule changed in 0.5.13. ``--trainer-sglang-version``
  names the version; without it specforge 0.2.0's pin (0.5.14) is assumed and the contract says so.
- ``speculators``: vLLM boundary ids, no +1 (``speculators/models/utils.py:99-140``), default
  ``[2, L//2, L-3]``.
- ``eagle``: EAGLE's own trainer reads HF ``output_hidden_states`` indices, default ``[2, L//2, L-3]``
  [inferred: the same default boundaries every other tool uses; EAGLE's trainer was not run here].

A DFlash drafter's ``dflash_config.target_layer_ids`` read the same for every trainer: id k is ``layer:k``
(``conventions.dflash_ids_to_sources``); a DFlash config that names none is refused (exit 3,
``builder.draft_family_for_contract``): its layers would be the serving engine's own choice.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import specparity
from specparity.contract import conventions
from specparity.contract.io import save_contract
from specparity.contract.model import (
    AssumedLayout,
    Contract,
    DrafterSpec,
    FcInputLayout,
    IdConvention,
    Provenance,
    RawLayerIds,
    SpecConfig,
    TargetSpec,
)
from specparity.errors import InputError
from specparity.idrules import sglang
from specparity.idrules import vllm as vllm_rules
from specparity.training.builder import draft_family_for_contract
from specparity.training.drafts import DraftInfo, read_specforge_draft, read_speculators_draft
from specparity.training.hfdir import FINGERPRINT_FIELDS, TargetInfo, read_target

Trainer = Literal["specforge", "speculators", "eagle"]
TRAINERS: tuple[Trainer, ...] = ("specforge", "speculators", "eagle")


def _read_target(target: Path) -> TargetInfo:
    """A target directory, or a bare config JSON file (read as that directory's config.json)."""
    if target.is_dir():
        return read_target(target)
    if not target.is_file():
        raise InputError("no such target directory or config file", path=target)
    with tempfile.TemporaryDirectory(prefix="specparity-target-") as tmp:
        shutil.copy(target, Path(tmp) / "config.json")
        try:
            return read_target(Path(tmp))
        except InputError as e:
            raise InputError(e.detail, path=target, field=e.field) from None


def _sources(trainer: Trainer, draft: DraftInfo, tgt: TargetInfo,
             sglang_version: str) -> tuple[list[str], list[int], IdConvention, str]:
    n = tgt.num_layers
    ids = draft.ids
    if draft.convention is IdConvention.DFLASH:  # every trainer and engine reads DFlash ids alike: id k = layer:k
        rule = (f"DFlash target_layer_ids {ids}, id k = layer:k (SpecForge's capture, SGLang's and vLLM's readers add "
                "1 to reach the boundary: contract/conventions.py dflash_ids_to_sources)")
        return conventions.dflash_ids_to_sources(ids, num_layers=n), list(ids or []), IdConvention.DFLASH, rule
    if trainer == "specforge":
        used = ids if ids is not None else conventions.specforge_default_ids(n)
        rule = (f"SpecForge ids {used} through the target's SGLang {sglang_version} setter on {tgt.architecture} "
                "(specforge/offline_capture/sglang_backend/capture.py:89-113)")
        sources = conventions.specforge_ids_to_sources(ids, num_layers=n, architecture=tgt.architecture,
                                                       sglang_version=sglang_version)
        return sources, used, IdConvention.SPECFORGE, rule
    if trainer == "speculators":
        used = ids if ids is not None else vllm_rules.vllm_default_ids(n)
        rule = f"speculators/vLLM boundary ids {used}, no +1 (speculators/models/utils.py:99-140)"
        return vllm_rules.vllm_ids_to_sources(ids, num_layers=n), used, IdConvention.VLLM, rule
    used = ids if ids is not None else vllm_rules.vllm_default_ids(n)
    rule = f"EAGLE HF hidden-state indices {used} [inferred default: boundaries 2, L//2, L-3]"
    return ([conventions.hf_index_to_source(i, num_layers=n) for i in used], used, IdConvention.HF, rule)


def contract_from_config(
    draft: str | Path,
    target: str | Path,
    *,
    trainer: Trainer,
    out: str | Path,
    trainer_sglang_version: str | None = None,
    name: str | None = None,
    created_at: datetime | None = None,
    serving: SpecConfig | None = None,
) -> tuple[Contract, Path]:
    """Write a probe-less contract at ``out`` whose layout is derived from the configs; returns it."""
    if trainer not in TRAINERS:
        raise InputError(f"unknown trainer {trainer!r}; choose one of {', '.join(TRAINERS)}", field="--trainer")
    family = draft_family_for_contract(Path(draft))
    tgt = _read_target(Path(target))
    dft = read_speculators_draft(draft) if trainer == "speculators" else read_specforge_draft(draft)
    dflash = dft.convention is IdConvention.DFLASH
    version_assumed = trainer == "specforge" and trainer_sglang_version is None and not dflash
    sglang_version = trainer_sglang_version or conventions.SPECFORGE_SGLANG_VERSION
    try:
        sglang.parse_version(sglang_version)
        sources, used, convention, rule = _sources(trainer, dft, tgt, sglang_version)
    except ValueError as e:
        field = "--trainer-sglang-version" if "version" in str(e) else (
            dft.ids_field or ("dflash_config.target_layer_ids" if dflash else "eagle_config"))
        raise InputError(str(e), path=dft.config_path, field=field) from None
    reason = (f"no recordings: {'declared' if dft.ids is not None else 'default'} ids read as {rule}"
              + (f"; trainer SGLang version assumed {sglang_version} (specforge 0.2.0's pin), pass "
                 "--trainer-sglang-version for the version that captured" if version_assumed else ""))
    hidden = tgt.hidden_size
    width = len(sources) * hidden
    if dft.fc_weight_shape is not None and dft.fc_weight_shape[-1] != width:
        raise InputError(f"fc.weight is {list(dft.fc_weight_shape)}: in_features {dft.fc_weight_shape[-1]} != "
                         f"{len(sources)} sources ({', '.join(sources)}) x {hidden}", path=dft.config_path.parent,
                         field="fc.weight")
    out_path = Path(out)
    contract = Contract(
        name=name or out_path.name.removesuffix(".json").removesuffix(".contract"),
        target=TargetSpec(architecture=tgt.architecture, num_hidden_layers=tgt.num_layers, hidden_size=hidden,
                          vocab_size=tgt.vocab_size, dtype=tgt.dtype,
                          name_or_path=tgt.config.get("_name_or_path") or None,
                          config_fingerprint=tgt.config_fingerprint, fingerprint_fields=list(FINGERPRINT_FIELDS),
                          tokenizer_fingerprint=tgt.tokenizer_fingerprint,
                          chat_template_fingerprint=tgt.chat_template_fingerprint),
        fc_input=FcInputLayout(sources=sources, chunk_widths=[hidden] * len(sources), total_width=width,
                               dtype=tgt.dtype),
        layer_ids=RawLayerIds(ids=dft.ids if dft.ids is not None else (used if convention is IdConvention.HF
                                                                         else None),
                              convention=convention, origin="draft_config" if dft.ids is not None else "tool_default",
                              tool=trainer, architecture=tgt.architecture,
                              resolver_version=sglang_version if trainer == "specforge" and not dflash else None),
        drafter=DrafterSpec(architecture=dft.architecture, hidden_size=dft.hidden_size, fc_in_features=width,
                            fc_out_features=dft.fc_weight_shape[0] if dft.fc_weight_shape else dft.hidden_size,
                            fc_bias=dft.fc_bias_present, norm_before_fc=dft.norm_before_fc, fc_norm=dft.fc_norm,
                            norm_output=dft.norm_output,
                            draft_vocab_size=dft.draft_vocab_size or tgt.vocab_size, vocab_map=dft.vocab_map,
                            checkpoint_keys=dft.checkpoint_keys, family=family.value),
        serving=serving or SpecConfig(),
        probes=None,
        layout_assumed=AssumedLayout(reason=reason, trainer=trainer,
                                     trainer_sglang_version=(sglang_version if trainer == "specforge" and not dflash
                                                             else None),
                                     trainer_sglang_version_assumed=version_assumed),
        provenance=Provenance(tool=f"specparity contract from-config ({trainer})",
                              data_location=json.dumps({"draft": str(draft), "target": str(target)}),
                              created_at=created_at or datetime.now(timezone.utc).replace(microsecond=0),
                              specparity_version=specparity.__version__),
    )
    save_contract(contract, out_path)
    return contract, out_path
