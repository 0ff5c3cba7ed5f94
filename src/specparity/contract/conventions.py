"""Layer-id conventions: each tool's layer ids to and from canonical sources (domain.md §2-3, §6-7).

Four conventions are in use (:class:`IdConvention`):

- SpecForge eagle ids (run config / draft ``eagle_config``): SpecForge hands them unchanged to the target's
  own SGLang ``set_eagle3_layers_to_capture`` (SF ``specforge/offline_capture/sglang_backend/capture.py:89-113``),
  so their meaning is whatever that SGLang version does on that architecture; on llama-style targets id ``v``
  is ``layer:v``.
- SGLang draft-config ids: version- and architecture-dependent, see :mod:`specparity.idrules.sglang`.
- vLLM / speculators ids: boundary indices, no ``+1`` (``vllm/model_executor/models/llama.py:426-441``).
- HF ``output_hidden_states`` indices: boundary indices except that ``L`` is ``final_norm``.
- DFlash ``dflash_config.target_layer_ids``: id ``k`` names the output of target layer ``k`` (``layer:k``) for every
  reader: SpecForge's DFlash capture, SGLang's ``set_dflash_layers_to_capture`` and vLLM's reader each add 1 to reach
  the boundary (:func:`dflash_ids_to_sources`).

Every function returns canonical sources (``embedding``, ``layer:<i>``, ``final_norm``) in fc-chunk order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from specparity.idrules import sglang
from specparity.idrules.vllm import sources_to_vllm_ids, vllm_ids_to_sources
from specparity.sources import (
    EMBEDDING,
    FINAL_NORM,
    check_in_range,
    layer,
    layer_index,
)

__all__ = [
    "SPECFORGE_SGLANG_VERSION",
    "IdConvention",
    "dflash_ids_to_sources",
    "hf_index_to_source",
    "ids_to_sources",
    "source_to_hf_index",
    "sources_to_dflash_ids",
    "sources_to_ids",
    "sources_to_specforge_ids",
    "specforge_default_ids",
    "specforge_ids_to_sources",
]

# One enum for the whole package: the contract's RawLayerIds.convention field (contract/model.py) uses this class,
# so `is` comparisons hold for values read from a contract. Members: SPECFORGE = "specforge_eagle" (SpecForge run
# config / draft eagle_config ids), SGLANG = "sglang_draft_config" (SGLang draft config.json
# eagle_config.eagle_aux_hidden_state_layer_ids), VLLM = "vllm_speculators" (boundary ids, no +1),
# HF = "hf_hidden_states" (transformers output_hidden_states index).


class IdConvention(str, Enum):
    """How a tool's integer layer ids are to be read (domain.md §3.1)."""

    SPECFORGE = "specforge_eagle"
    SGLANG = "sglang_draft_config"
    VLLM = "vllm_speculators"
    HF = "hf_hidden_states"
    DFLASH = "dflash_target_layer_ids"


# specforge 0.2.0 pins sglang 0.5.14 (domain.md §3.1), whose setters SpecForge's capture calls.
SPECFORGE_SGLANG_VERSION = "0.5.14"


# --- SpecForge ------------------------------------------------------------------------------------------


def specforge_default_ids(num_layers: int) -> list[int]:
    """SpecForge's ids when neither the run nor the draft config names any: ``[1, L//2 - 1, L - 4]``.

    SF ``specforge/algorithms/model_providers.py:188-211`` (a6b6b02). For ``L = 4`` this is ``[1, 1, 0]``,
    which SpecForge accepts although it yields only two distinct states (domain.md §3.3).
    """
    return [1, num_layers // 2 - 1, num_layers - 4]


def _validate_specforge_ids(ids: Sequence[int]) -> list[int]:
    # SF model_providers.py:201-206 rejects anything but non-negative ints. It also demands exactly three;
    # we do not, because drafters with k != 3 exist (SGLang >= 0.5.12 sizes fc from num_aux_hidden_states).
    out: list[int] = []
    for pos, i in enumerate(ids):
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise ValueError(
                f"SpecForge layer id {i!r} (position {pos}) is invalid: SpecForge accepts only non-negative "
                "integers (specforge/algorithms/model_providers.py:201-206)"
            )
        out.append(i)
    return out


def specforge_ids_to_sources(
    ids: Sequence[int] | None,
    *,
    num_layers: int,
    architecture: str = "LlamaForCausalLM",
    sglang_version: str = SPECFORGE_SGLANG_VERSION,
) -> list[str]:
    """The sources SpecForge recorded for ``ids`` (None -> :func:`specforge_default_ids`).

    SpecForge passes the ids explicitly (defaults included) to the target's SGLang setter, so this is the
    served layout of :func:`sglang.capture_plan` for ``sglang_version``/``architecture``. Raises ValueError
    naming the bad id for a negative or non-integer id, and ValueError when that SGLang capture crashes.
    """
    resolved = specforge_default_ids(num_layers) if ids is None else _validate_specforge_ids(ids)
    plan = sglang.capture_plan(
        resolved, num_layers=num_layers, architecture=architecture, version=sglang_version
    )
    if plan.crash is not None:
        raise ValueError(
            f"SpecForge capture with ids {resolved} on {architecture} (sglang {sglang_version}) "
            f"does not complete: {plan.crash}"
        )
    return list(plan.served_sources)


def sources_to_specforge_ids(
    sources: Sequence[str],
    *,
    num_layers: int,
    architecture: str = "LlamaForCausalLM",
    sglang_version: str = SPECFORGE_SGLANG_VERSION,
) -> list[int]:
    """The SpecForge ids that record exactly ``sources`` (strictly ascending), or ValueError if none do.

    Inverse of :func:`specforge_ids_to_sources`. ``embedding`` is only expressible where the target's
    setter reads a raw 0 (DeepSeek family, first id not 1, sglang >= 0.5.13), since SpecForge rejects -1.
    """
    ids = sglang.ids_for_sources(
        sources, num_layers=num_layers, architecture=architecture, version=sglang_version
    )
    if ids is None or any(i < 0 for i in ids):
        raise ValueError(
            f"no SpecForge layer ids record {list(sources)} on {architecture} with sglang {sglang_version}"
            + ("" if ids is None else f" (it would need {ids}, and SpecForge rejects negative ids)")
        )
    return ids


# --- DFlash -----------------------------------------------------------------------------------------------


def dflash_ids_to_sources(ids: Sequence[int] | None, *, num_layers: int) -> list[str]:
    """DFlash ``target_layer_ids`` as sources: id ``k`` is ``layer:k``, the output of target layer ``k``.

    Every reader agrees: SpecForge's DFlash training captures through the target's SGLang
    ``set_dflash_layers_to_capture`` (SF ``specforge/offline_capture/sglang_backend/capture.py:93-106``), which adds 1
    to reach the boundary (sglang 0.5.23 ``models/qwen3.py:793-805``, ``models/llama.py:943-953``); its HF path reads
    ``hidden_states[k + 1]`` (SF ``specforge/modeling/draft/dflash.py:284-293``); vLLM 0.32's reader adds 1
    (``v1/worker/gpu_model_runner.py:5270-5277``). No ids is an error: the engines' defaults differ (SGLang
    ``build_target_layer_ids(L, draft layers)``, vLLM its EAGLE-3 default), and SpecForge writes the ids it trained
    on into the draft config it trains with (SF ``specforge/algorithms/model_providers.py:329-345``). The ids must be strictly
    ascending (engines capture in ascending order, domain.md section 2 rule 2) and name a layer of the target."""
    if ids is None:
        raise ValueError("DFlash target_layer_ids are not set: the engines pick different defaults (SGLang "
                         "build_target_layer_ids(L, draft layers), vLLM its EAGLE-3 default), so no layout follows")
    out: list[str] = []
    for pos, k in enumerate(ids):
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < num_layers:
            raise ValueError(f"DFlash target layer id {k!r} (position {pos}) is not a layer of a {num_layers}-layer "
                             f"target (0..{num_layers - 1})")
        if pos and k <= ids[pos - 1]:
            raise ValueError(f"DFlash target_layer_ids {list(ids)} are not strictly ascending: every engine captures "
                             "in ascending layer order and collapses duplicates, so fc would get another layout")
        out.append(layer(k))
    return out


def sources_to_dflash_ids(sources: Sequence[str], *, num_layers: int) -> list[int]:
    """Inverse of :func:`dflash_ids_to_sources`: ValueError for ``embedding``, ``final_norm`` or a non-ascending list."""
    ids: list[int] = []
    for s in sources:
        check_in_range(s, num_layers)
        i = layer_index(s)
        if i is None:
            raise ValueError(f"{s} has no DFlash target layer id (ids name layer outputs)")
        ids.append(i)
    dflash_ids_to_sources(ids, num_layers=num_layers)
    return ids


# --- HF output_hidden_states ----------------------------------------------------------------------------


def hf_index_to_source(index: int, *, num_layers: int) -> str:
    """transformers ``output_hidden_states[index]`` as a source: ``0`` -> ``embedding``,
    ``i`` -> ``layer:i-1`` for ``1 <= i < L``, ``L`` -> ``final_norm`` (HF's last entry is post-norm)."""
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index <= num_layers:
        raise ValueError(f"HF hidden-state index {index!r} is outside 0..{num_layers}")
    if index == num_layers:
        return FINAL_NORM
    return EMBEDDING if index == 0 else layer(index - 1)


def source_to_hf_index(source: str, *, num_layers: int) -> int:
    """The ``output_hidden_states`` index of a source. ``layer:L-1`` (pre-norm) has none: ValueError."""
    if source == FINAL_NORM:
        return num_layers
    check_in_range(source, num_layers)
    i = layer_index(source)
    if i is None:
        return 0
    if i == num_layers - 1:
        raise ValueError(
            f"{source} has no HF hidden-state index: HF's entry {num_layers} is final_norm (post-norm)"
        )
    return i + 1


# --- dispatch -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Reading:
    """Who reads the ids and on what: the target's layer count and architecture, and for SpecForge's and SGLang's
    own ids the SGLang version that reads them (SpecForge's default to the version SpecForge captured with;
    SGLang draft-config ids have none)."""

    convention: IdConvention
    num_layers: int
    architecture: str
    version: str | None

    @property
    def sglang_version(self) -> str:
        if self.convention is IdConvention.SPECFORGE:
            return self.version or SPECFORGE_SGLANG_VERSION
        if self.version is None:
            raise ValueError("SGLang draft-config ids need the SGLang version that reads them")
        return self.version


def _hf_ids_to_sources(ids: Sequence[int] | None, r: _Reading) -> list[str]:
    if ids is None:
        raise ValueError("HF hidden-state indices have no default")
    return [hf_index_to_source(i, num_layers=r.num_layers) for i in ids]


# IdConvention.SGLANG's reader and its inverse: that convention is SGLang's own, like each sibling's of _RULES
def _sglang_ids_to_sources(ids: Sequence[int] | None, r: _Reading) -> list[str]:
    plan = sglang.capture_plan(ids, num_layers=r.num_layers, architecture=r.architecture, version=r.sglang_version)
    if plan.crash is not None:
        raise ValueError(f"sglang {r.version} on {r.architecture} does not serve ids {ids}: {plan.crash}")
    return list(plan.served_sources)


def _sources_to_sglang_ids(sources: Sequence[str], r: _Reading) -> list[int]:
    ids = sglang.ids_for_sources(sources, num_layers=r.num_layers, architecture=r.architecture,
                                 version=r.sglang_version)
    if ids is None:
        raise ValueError(f"no draft-config ids make sglang {r.version} on {r.architecture} serve {list(sources)}")
    return ids


# Each convention's reader and its inverse, side by side: (ids -> sources, sources -> ids).
_RULES: dict[IdConvention, tuple[Callable[[Sequence[int] | None, _Reading], list[str]],
                                 Callable[[Sequence[str], _Reading], list[int]]]] = {
    IdConvention.SPECFORGE: (
        lambda ids, r: specforge_ids_to_sources(ids, num_layers=r.num_layers, architecture=r.architecture,
                                                sglang_version=r.sglang_version),
        lambda sources, r: sources_to_specforge_ids(sources, num_layers=r.num_layers, architecture=r.architecture,
                                                    sglang_version=r.sglang_version)),
    IdConvention.SGLANG: (_sglang_ids_to_sources, _sources_to_sglang_ids),
    IdConvention.VLLM: (lambda ids, r: vllm_ids_to_sources(ids, num_layers=r.num_layers),
                        lambda sources, r: sources_to_vllm_ids(sources, num_layers=r.num_layers)),
    IdConvention.DFLASH: (lambda ids, r: dflash_ids_to_sources(ids, num_layers=r.num_layers),
                          lambda sources, r: sources_to_dflash_ids(sources, num_layers=r.num_layers)),
    IdConvention.HF: (_hf_ids_to_sources,
                      lambda sources, r: [source_to_hf_index(s, num_layers=r.num_layers) for s in sources]),
}


def ids_to_sources(
    ids: Sequence[int] | None,
    convention: IdConvention,
    *,
    num_layers: int,
    architecture: str = "LlamaForCausalLM",
    version: str | None = None,
) -> list[str]:
    """Raw ids in ``convention`` to canonical sources in fc-chunk order.

    ``version`` is the SGLang version: required for :attr:`IdConvention.SGLANG`; for SpecForge it is the
    SGLang version SpecForge captured with (default 0.5.14); ignored otherwise. HF indices keep their
    given order (HF-based training concatenates in list order); None is an error there (HF has no default).
    """
    reading = _Reading(IdConvention(convention), num_layers, architecture, version)  # also accepts the plain value
    return _RULES[reading.convention][0](ids, reading)


def sources_to_ids(
    sources: Sequence[str],
    convention: IdConvention,
    *,
    num_layers: int,
    architecture: str = "LlamaForCausalLM",
    version: str | None = None,
) -> list[int]:
    """Inverse of :func:`ids_to_sources`: ids in ``convention`` that yield ``sources``; ValueError if none."""
    reading = _Reading(IdConvention(convention), num_layers, architecture, version)  # also accepts the plain value
    return _RULES[reading.convention][1](sources, reading)
