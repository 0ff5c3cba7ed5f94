"""speculators (vLLM) eagle3 artifacts -> contract + probe pack.

The draft config is a ``speculators_model_type: eagle3`` config with top-level
``eagle_aux_hidden_state_layer_ids`` in vLLM's boundary convention (no +1; domain.md §3.1, §8).
Data generation writes ``hs_{i}.safetensors`` with ``token_ids [S]`` and ``hidden_states [S, n, H]``:
the first ``n-1`` layers are the aux states and the last is ``layer:L-1`` (pre-norm), which
training uses as ``verifier_last_hidden_states`` (speculators ``train/data.py:324-332``).
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file

from specparity.contract.model import Contract, IdConvention, RawLayerIds
from specparity.contract.probes import ProbeSample
from specparity.errors import InputError
from specparity.idrules.vllm import vllm_ids_to_sources
from specparity.training.builder import check_fc_width, dtype_name, write_contract
from specparity.training.drafts import read_speculators_draft, verifier_of
from specparity.training.hfdir import read_target

_NAME = re.compile(r"^hs_(\d+)\.safetensors$")


def contract_from_speculators(
    hidden_states: str | Path,
    draft: str | Path,
    target: str | Path,
    *,
    out: str | Path,
    name: str | None = None,
    probes: int = 4,
    max_probe_tokens: int = 128,
    created_at: datetime | None = None,
    run_id: str | None = None,
) -> tuple[Contract, Path]:
    tgt = read_target(target)
    dft = read_speculators_draft(draft)
    archs = verifier_of(dft.config).get("architectures") or []
    if archs and archs[0] != tgt.architecture:
        raise InputError(
            f"verifier architecture {archs[0]} differs from the target's {tgt.architecture}",
            path=dft.config_path, field="speculators_config.verifier.architectures",
        )
    try:
        sources = vllm_ids_to_sources(dft.ids, num_layers=tgt.num_layers)
    except ValueError as e:
        raise InputError(str(e), path=dft.config_path, field="eagle_aux_hidden_state_layer_ids") from None
    raw = RawLayerIds(
        ids=dft.ids, convention=IdConvention.VLLM, origin="draft_config" if dft.ids is not None else "tool_default",
        tool="speculators", architecture=tgt.architecture,
    )
    h = tgt.hidden_size
    check_fc_width(dft, sources, h)
    d = Path(hidden_states)
    files = sorted((int(m.group(1)), p) for p in d.glob("*.safetensors") if (m := _NAME.match(p.name)))
    if not files:
        raise InputError("no speculators hidden-state files (hs_N.safetensors)", path=d)
    samples: list[ProbeSample] = []
    dtype = None
    k = len(sources)
    for _, f in files[:probes]:
        try:
            data = load_file(str(f))
        except (SafetensorError, OSError) as e:
            raise InputError(f"unreadable safetensors file: {e}", path=f) from None
        ids, hs = data.get("token_ids", data.get("input_ids")), data.get("hidden_states")
        if ids is None or hs is None:
            raise InputError("missing token_ids or hidden_states", path=f, field="token_ids" if ids is None else "hidden_states")
        if hs.dim() != 3 or hs.shape[0] != ids.shape[0] or hs.shape[2] != h or hs.shape[1] not in (k, k + 1):
            raise InputError(
                f"shape {tuple(hs.shape)}, expected [{ids.shape[0]}, {k} or {k + 1}, {h}]", path=f, field="hidden_states"
            )
        n = min(int(ids.shape[0]), max_probe_tokens)
        samples.append(ProbeSample(input_ids=ids[:n].long().clone(), fc_input=hs[:n, :k].reshape(n, k * h).clone()))
        dtype = dtype or hs.dtype
    assert dtype is not None
    return write_contract(
        target=tgt, draft=dft, sources=sources, raw_ids=raw, samples=samples,
        dtype=dtype_name(dtype, path=d, field="hidden_states"), vocab_map=dft.vocab_map, out=Path(out), name=name,
        tool="speculators", data_location=str(d), created_at=created_at, run_id=run_id,
    )
