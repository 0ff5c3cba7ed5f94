"""SpecForge offline hidden states -> contract + probe pack.

SpecForge's ``scripts/prepare_hidden_states.py`` (SF a6b6b02, ``HiddenStatesGenerator``) writes one
``torch.save(dict)`` per sample at ``{out}/rows_{g}-{g+G}/data_{idx}.ckpt`` (``.ckpt.gz`` with
``--compress``; some forks write ``data_{idx}.pt``) with keys ``input_ids [S]``, ``loss_mask [S]``,
``aux_hidden_state [1, S, k*H]`` and ``hidden_state [1, S, H]`` (final norm). Row t belongs to
token t: no shift on disk (domain.md §4). Files are streamed one at a time and safe-loaded.

A DFlash run writes the same files with ``input_ids``, ``loss_mask`` and ``hidden_states [1, S, k*H]`` (the target
layers of ``dflash_config.target_layer_ids`` side by side) and no final-norm state: SF
``specforge/algorithms/dflash/providers.py:134-160`` (storage ``specforge_hidden_states_v1``, required tensors) and
``:193-205`` (``OfflineCaptureLayout(capture_method="dflash", aux_feature="hidden_states", last_hidden_feature=None)``).

Contract creation is O(probes), not O(dataset): it lists the files (names only), loads the probe samples,
and checks width and dtype on them plus a bounded spread of the other files (:data:`CHECK_SAMPLE`, always
including the last). A 100K-sample run no longer loads terabytes to write a contract of 4 probes.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import torch

from specparity.contract import conventions
from specparity.contract.model import Contract, IdConvention, RawLayerIds, SpecConfig, TrainingOutcome
from specparity.contract.probes import ProbeSample
from specparity.errors import InputError
from specparity.idrules import sglang
from specparity.training.builder import check_fc_width, draft_family_for_contract, dtype_name, write_contract
from specparity.training.drafts import DraftInfo, read_specforge_draft, read_vocab_mapping
from specparity.training.hfdir import TargetInfo, read_target, safe_torch_load

REQUIRED_KEYS = ("input_ids", "loss_mask", "aux_hidden_state", "hidden_state")
DFLASH_KEYS = ("input_ids", "loss_mask", "hidden_states")  # a DFlash run's files (module docstring)
CHECK_SAMPLE = 4  # files beyond the probes whose width and dtype are checked (evenly spread, last included)
_NAME = re.compile(r"^data_(\d+)\.(ckpt|ckpt\.gz|pt)$")


@dataclass(frozen=True)
class SpecForgeRecord:
    index: int
    path: Path
    input_ids: torch.Tensor  # int64 [S]
    loss_mask: torch.Tensor  # int64 [S]
    aux_hidden_state: torch.Tensor  # [S, k*H] (a DFlash file's hidden_states)
    hidden_state: torch.Tensor | None  # [S, H]; None in a DFlash file


def list_hidden_state_files(directory: str | Path) -> list[tuple[int, str]]:
    """Every SpecForge sample file under ``directory`` (``rows_*/`` or flat), sorted by sample index.

    Paths stay strings: only the few files the importer reads become ``Path`` objects (a run holds up to 10^5
    files, and building a Path per name was most of the listing's cost, benchmarks/bench_import.py)."""
    d = Path(directory)
    if not d.is_dir():
        raise InputError("hidden-states directory not found", path=d)
    found: list[tuple[int, str]] = []
    # os.scandir: names and d_type only, no stat per file (a run holds up to 10^5 files)
    with os.scandir(d) as top:
        entries = list(top)
    groups = [e.path for e in entries if e.name.startswith("rows_") and e.is_dir()]
    for group in groups:
        with os.scandir(group) as inner:
            entries += list(inner)
    for e in entries:
        m = _NAME.match(e.name)
        if m and e.is_file():
            found.append((int(m.group(1)), e.path))
    if not found:
        raise InputError("no SpecForge hidden-state files (rows_*/data_N.ckpt, .ckpt.gz or data_N.pt)", path=d)
    found.sort()
    dup = [i for (i, _), (j, _) in itertools.pairwise(found) if i == j]
    if dup:
        raise InputError(f"sample index {dup[0]} appears in more than one file", path=d)
    return found


def load_record(path: Path, index: int, *, hidden_size: int | None = None, dflash: bool = False) -> SpecForgeRecord:
    """One sample file; ``dflash``: a DFlash run's keys (:data:`DFLASH_KEYS`), its ``hidden_states`` read as the aux."""
    data = safe_torch_load(path)
    if not isinstance(data, dict):
        raise InputError(f"expected a dict of tensors, got {type(data).__name__}", path=path)
    keys = DFLASH_KEYS if dflash else REQUIRED_KEYS
    missing = [k for k in keys if k not in data]
    if missing:
        raise InputError(f"missing key{'s' if len(missing) > 1 else ''} {', '.join(missing)}", path=path, field=missing[0])
    for k in keys:
        if not isinstance(data[k], torch.Tensor):
            raise InputError(f"expected a tensor, got {type(data[k]).__name__}", path=path, field=k)
    aux_key = "hidden_states" if dflash else "aux_hidden_state"
    ids, mask = data["input_ids"].reshape(-1), data["loss_mask"].reshape(-1)
    aux, hid = data[aux_key], (None if dflash else data["hidden_state"])
    if aux.dim() == 3 and aux.shape[0] == 1:
        aux = aux[0]
    if hid is not None and hid.dim() == 3 and hid.shape[0] == 1:
        hid = hid[0]
    s = ids.shape[0]
    if mask.shape[0] != s:
        raise InputError(f"length {mask.shape[0]} != input_ids length {s}", path=path, field="loss_mask")
    if aux.dim() != 2 or aux.shape[0] != s:
        raise InputError(f"shape {tuple(data[aux_key].shape)}, expected [1, {s}, k*H]", path=path, field=aux_key)
    if hid is not None and (hid.dim() != 2 or hid.shape[0] != s):
        raise InputError(f"shape {tuple(data['hidden_state'].shape)}, expected [1, {s}, H]", path=path, field="hidden_state")
    if hidden_size is not None:
        if hid is not None and hid.shape[1] != hidden_size:
            raise InputError(f"width {hid.shape[1]} != target hidden_size {hidden_size}", path=path, field="hidden_state")
        if aux.shape[1] % hidden_size:
            raise InputError(
                f"width {aux.shape[1]} is not a multiple of target hidden_size {hidden_size}", path=path, field=aux_key
            )
    for k, t in ((aux_key, aux), ("hidden_state", hid)):
        if t is not None and not torch.isfinite(t.float()).all():
            raise InputError("holds NaN or Inf", path=path, field=k)
    return SpecForgeRecord(index, path, ids.to(torch.int64), mask.to(torch.int64), aux, hid)


def iter_records(directory: str | Path, *, hidden_size: int | None = None) -> Iterator[SpecForgeRecord]:
    """Stream the records, one file in memory at a time."""
    for index, path in list_hidden_state_files(directory):
        yield load_record(Path(path), index, hidden_size=hidden_size)


def checked_files(files: list[tuple[int, str]], probes: int, *, sample: int = CHECK_SAMPLE) -> list[tuple[int, str]]:
    """The probe files (the first ``probes``) plus at most ``sample`` of the rest, evenly spread, last included."""
    head, rest = files[:probes], files[probes:]
    if len(rest) <= sample:
        return head + rest
    picks = sorted({round(i * (len(rest) - 1) / (sample - 1)) for i in range(sample)}) if sample > 1 else [len(rest) - 1]
    return head + [rest[i] for i in picks]


def strip_padding(rec: SpecForgeRecord, pad_token_id: int | None) -> int:
    """Length without SpecForge's trailing batch padding (pad tokens with loss_mask 0)."""
    n = rec.input_ids.shape[0]
    if pad_token_id is None:
        return n
    while n > 1 and int(rec.input_ids[n - 1]) == pad_token_id and int(rec.loss_mask[n - 1]) == 0:
        n -= 1
    return n


def _sources_for(draft: DraftInfo, target: TargetInfo) -> tuple[list[str], RawLayerIds]:
    if draft.convention is IdConvention.DFLASH:
        return _dflash_sources_for(draft, target)
    origin = "draft_config" if draft.ids is not None else "tool_default"
    field = draft.ids_field or "eagle_config"
    if draft.ids is not None:
        # SpecForge hands the ids to its SGLang's setter; a boundary the layer loop never reaches is
        # silently not captured there, so it can only be a mistake here.
        plan = sglang.capture_plan(
            draft.ids, num_layers=target.num_layers, architecture=target.architecture,
            version=conventions.SPECFORGE_SGLANG_VERSION,
        )
        if plan.unreachable:
            raise InputError(
                f"ids {draft.ids} reach boundaries {list(plan.unreachable)} that a {target.num_layers}-layer "
                f"{target.architecture} never captures (one state fewer than fc expects)",
                path=draft.config_path, field=field,
            )
    try:
        sources = conventions.specforge_ids_to_sources(
            draft.ids, num_layers=target.num_layers, architecture=target.architecture, sglang_version=conventions.SPECFORGE_SGLANG_VERSION
        )
    except ValueError as e:
        raise InputError(str(e), path=draft.config_path, field=field) from None
    raw = RawLayerIds(
        ids=draft.ids,
        convention=IdConvention.SPECFORGE,
        origin=origin,
        tool="specforge",
        resolver_version=conventions.SPECFORGE_SGLANG_VERSION,
        architecture=target.architecture,
    )
    return sources, raw


def _dflash_sources_for(draft: DraftInfo, target: TargetInfo) -> tuple[list[str], RawLayerIds]:
    """A DFlash drafter's sources: id k is layer:k (conventions.dflash_ids_to_sources). SpecForge captured them through
    the target's SGLang ``set_dflash_layers_to_capture`` (+1, sglang 0.5.23 ``models/qwen3.py:793-805``): id ``L-1``
    asks for boundary ``L``, which that capture's layer loop never reaches [inferred from the EAGLE-3 rule of the same
    loop, domain.md section 3.1], so it cannot have been recorded."""
    field = draft.ids_field or "dflash_config.target_layer_ids"
    try:
        sources = conventions.dflash_ids_to_sources(draft.ids, num_layers=target.num_layers)
    except ValueError as e:
        raise InputError(str(e), path=draft.config_path, field=field) from None
    if draft.ids is not None and target.num_layers - 1 in draft.ids:
        raise InputError(f"id {target.num_layers - 1} is the last layer of a {target.num_layers}-layer target: "
                         "SpecForge's capture through SGLang asks for boundary "
                         f"{target.num_layers}, which its layer loop never reaches", path=draft.config_path,
                         field=field)
    raw = RawLayerIds(ids=draft.ids, convention=IdConvention.DFLASH, origin="draft_config", tool="specforge",
                      resolver_version=conventions.SPECFORGE_SGLANG_VERSION, architecture=target.architecture)
    return sources, raw


def contract_from_specforge(
    hidden_states: str | Path,
    draft: str | Path,
    target: str | Path,
    *,
    out: str | Path,
    vocab_mapping: str | Path | None = None,
    name: str | None = None,
    probes: int = 4,
    max_probe_tokens: int = 128,
    created_at: datetime | None = None,
    run_id: str | None = None,
    serving: SpecConfig | None = None,
    training_outcome: TrainingOutcome | None = None,
) -> tuple[Contract, Path]:
    """Build a contract from SpecForge artifacts; write it to ``out`` and its probe pack beside it.

    Returns the contract and the path written. Raises :class:`InputError` on any inconsistency
    (widths that disagree with ``fc.weight``, malformed files, ids out of range, no samples).
    """
    if probes < 1:
        raise InputError("must be at least 1", field="--probes")
    tgt = read_target(target)
    dft = read_specforge_draft(draft)
    draft_family_for_contract(dft.config_path.parent)  # DSpark, or DFlash without ids: exit 3 before reading records
    dflash = dft.convention is IdConvention.DFLASH
    aux_field = "hidden_states" if dflash else "aux_hidden_state"
    sources, raw = _sources_for(dft, tgt)
    h_t = dft.target_hidden_size or tgt.hidden_size
    if h_t != tgt.hidden_size:
        raise InputError(
            f"target_hidden_size {h_t} != target hidden_size {tgt.hidden_size}", path=dft.config_path, field="target_hidden_size"
        )
    width = check_fc_width(dft, sources, h_t)
    pad = tgt.pad_token_id
    samples: list[ProbeSample] = []
    dtype: torch.dtype | None = None
    files = list_hidden_state_files(hidden_states)
    for index, path in checked_files(files, probes):
        rec = load_record(Path(path), index, hidden_size=tgt.hidden_size, dflash=dflash)
        if rec.aux_hidden_state.shape[1] != width:
            raise InputError(
                f"width {rec.aux_hidden_state.shape[1]} != {len(sources)} sources x {h_t} = {width} "
                f"(layout {', '.join(sources)} from {dft.config_path})",
                path=rec.path,
                field=aux_field,
            )
        if dtype is not None and rec.aux_hidden_state.dtype != dtype:
            raise InputError(f"dtype {rec.aux_hidden_state.dtype} differs from the {dtype} of the files before it",
                             path=rec.path, field=aux_field)
        dtype = dtype or rec.aux_hidden_state.dtype
        if len(samples) < probes:
            n = min(strip_padding(rec, pad), max_probe_tokens)
            samples.append(
                ProbeSample(
                    input_ids=rec.input_ids[:n].clone(),
                    fc_input=rec.aux_hidden_state[:n].clone(),
                    loss_mask=rec.loss_mask[:n].clone(),
                    final_norm=rec.hidden_state[:n].clone() if rec.hidden_state is not None else None,
                )
            )
    assert dtype is not None  # list_hidden_state_files raised if there were no records
    if dflash and vocab_mapping is not None:
        raise InputError("a DFlash drafter drafts in the target's vocabulary (no d2t; SF specforge/modeling/draft/"
                         "dflash.py uses the target's lm_head): leave the vocab mapping out", path=vocab_mapping,
                         field="--vocab-mapping")
    vm = read_vocab_mapping(vocab_mapping) if vocab_mapping is not None else dft.vocab_map
    return write_contract(
        target=tgt, draft=dft, sources=sources, raw_ids=raw, samples=samples, dtype=dtype_name(dtype, path=hidden_states, field=aux_field), vocab_map=vm,
        out=Path(out), name=name, tool="specforge", data_location=str(hidden_states), created_at=created_at,
        run_id=run_id, serving=serving, training_outcome=training_outcome,
    )

