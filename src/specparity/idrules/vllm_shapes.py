"""What a user needs to hear about a draft config's ids before any contract exists: vLLM's silent default fallback,
named by the exact shape that caused it, and the cross-engine shift between SGLang's/SpecForge's ``+1`` and vLLM's
boundary ids.

**The fallback.** vLLM reads the top-level ``eagle_aux_hidden_state_layer_ids``, then ``dflash_config.target_layer_ids``
(+1), then the nested ``eagle_config.eagle_aux_hidden_state_layer_ids`` (:mod:`specparity.idrules.vllm` rule 1; before
0.11 the nested key only, :data:`specparity.idrules.vllm.RELEASE_RULES`). Every other shape silently leaves it
without ids, and it serves its model default ``(2, L//2, L-3)``: a vLLM PR measured 1.21% acceptance against 58.9%
for a published Llama-3.3-70B drafter whose ``eagle_config`` has no key (vllm-project/vllm#50170). The shapes, each a
:data:`FALLBACK_SHAPES` name: ``no_eagle_config``, ``eagle_config_without_key``, ``ids_null``, ``ids_empty``,
``ids_not_a_list``, ``eagle_config_not_object`` and ``key_at_wrong_level`` (the key somewhere vLLM never looks).

**The shift.** SpecForge hands its ids to SGLang's setter, which adds ``+1`` (llama family, domain.md §3): id ``v``
is ``layer:v``. vLLM and speculators read id ``k`` as boundary ``k``: ``layer:k-1``. The same list is one layer
earlier on vLLM (a vLLM PR measured 10% first-position acceptance against 45% for this on MiniMax-M2). The hints
below say so on either engine's explain, where a draft's ids look like the other convention.

Pure functions; no engine is imported.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

IDS_KEY = "eagle_aux_hidden_state_layer_ids"
FALLBACK_SHAPES = ("no_eagle_config", "eagle_config_without_key", "ids_null", "ids_empty", "ids_not_a_list",
                   "eagle_config_not_object", "key_at_wrong_level", "release_reads_no_ids")
_READ_PATHS = (IDS_KEY, "dflash_config.target_layer_ids", f"eagle_config.{IDS_KEY}")  # 0.22-0.33 (idrules/vllm.py)
_ID_KEYS = (IDS_KEY, "target_layer_ids", "layer_ids", "dspark_target_layer_ids")


@dataclass(frozen=True)
class IdsFallback:
    """Why vLLM read no ids from a draft config: ``shape`` (one of :data:`FALLBACK_SHAPES`), the key path(s)
    concerned, and the sentence a user reads."""

    shape: str
    where: str
    message: str


def _paths(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every ``(dotted path, value)`` of the ids key inside ``value`` (lists of objects included)."""
    if isinstance(value, Mapping):
        for key, child in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if key in _ID_KEYS:
                yield path, child
            yield from _paths(child, path)
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _paths(child, f"{prefix}[{i}]")


def fallback_shape(config: Mapping[str, Any], *, reads: Sequence[str] = _READ_PATHS) -> IdsFallback | None:
    """The shape of a draft config from which vLLM reads no aux layer ids, or None when it reads some.

    ``reads``: the key paths the release's reader looks at (idrules/vllm.py ``READ_PATHS``; 0.22-0.33's by default).
    A release with no reader (before 0.11.1) ignores any ids: ``release_reads_no_ids``."""
    read = tuple(reads)
    found = dict(_paths(config))
    if not read:
        where = ", ".join(p for p, v in found.items() if isinstance(v, list) and v) or "none"
        return IdsFallback("release_reads_no_ids", where, "this vLLM release reads no ids from the draft config at "
                           f"all (ids in the config: {where}); vLLM reads them from 0.11.1")
    if any(found.get(p) for p in read if isinstance(found.get(p), list)):
        return None
    reads = " then ".join(read)
    misplaced = [p for p, v in found.items() if p not in read and isinstance(v, list) and v]
    if misplaced:
        return IdsFallback("key_at_wrong_level", ", ".join(misplaced),
                           f"the ids are at {', '.join(misplaced)}, where vLLM never looks (it reads {reads})")
    for path in read:
        if path in found and found[path] is None:
            return IdsFallback("ids_null", path, f"{path} is null")
        if path in found and isinstance(found[path], list | tuple) and not found[path]:
            return IdsFallback("ids_empty", path, f"{path} is [] (empty)")
        if path in found and not isinstance(found[path], list | tuple):
            return IdsFallback("ids_not_a_list", path, f"{path} is {found[path]!r}, not a list (vLLM reads only a list)")
    eagle = config.get("eagle_config")
    if eagle is None:
        return IdsFallback("no_eagle_config", "eagle_config",
                           f"the draft config has no eagle_config and no {IDS_KEY} at any level vLLM reads")
    if not isinstance(eagle, Mapping):
        return IdsFallback("eagle_config_not_object", "eagle_config",
                           f"eagle_config is {type(eagle).__name__} {eagle!r}, not an object")
    wanted = [p.split(".", 1)[1] for p in read if p.startswith("eagle_config.")] or [IDS_KEY]
    return IdsFallback("eagle_config_without_key", "eagle_config",
                       f"eagle_config has no {' or '.join(wanted)}, the key this release reads there (keys: "
                       f"{', '.join(sorted(map(str, eagle))) or 'none'})")


def _in_range(ids: Sequence[int], num_layers: int) -> bool:
    return all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_layers for i in ids)


def specforge_reading(ids: Sequence[int], num_layers: int) -> list[str] | None:
    """What SpecForge/SGLang (llama-style ``+1``: id ``v`` is ``layer:v``) make of ``ids``; None outside ``0..L-1``."""
    return [f"layer:{v}" for v in sorted(set(ids))] if _in_range(ids, num_layers) else None


def vllm_shift_hint(ids: Sequence[int], key: str | None, served: Sequence[str], *, num_layers: int) -> str | None:
    """On vLLM: the ids look like SpecForge's/SGLang's (they sit in the nested ``eagle_config``, where SpecForge and
    SGLang write them, or they are SpecForge's default ``[1, L//2-1, L-4]``), which read them one layer later."""
    default = [1, num_layers // 2 - 1, num_layers - 4]
    if key != f"eagle_config.{IDS_KEY}" and sorted(ids) != default:
        return None
    theirs = specforge_reading(ids, num_layers)
    if theirs is None or list(theirs) == list(served):
        return None
    why = "are SpecForge's default" if sorted(ids) == default else "sit in eagle_config, where SpecForge and SGLang write them"
    return (f"the ids {list(ids)} {why}: read with SGLang's/SpecForge's +1 these would be {', '.join(theirs)}; "
            f"vLLM feeds {', '.join(served)} (one layer earlier). If the drafter was trained with SpecForge, write "
            f"[{', '.join(str(int(s.split(':')[1]) + 1) for s in theirs)}] for vLLM")


# named for the engine it warns on: SGLang's reading of the ids, the converse of vllm_shift_hint's, not a rule of both
def sglang_shift_hint(config: Mapping[str, Any], ids: Sequence[int] | None, served: Sequence[str], *,
                      num_layers: int) -> str | None:
    """On SGLang: the draft's ids look like vLLM's/speculators' (a top-level key, where speculators writes them, or
    vLLM's default ``[2, L//2, L-3]``), which read id ``k`` as ``hidden_states[k]``: ``layer:k-1``."""
    top = config.get(IDS_KEY)
    candidates = [list(top)] if isinstance(top, list) and top else []
    if ids is not None:
        candidates.append(list(ids))
    default = [2, num_layers // 2, num_layers - 3]
    for cand in candidates:
        if not all(isinstance(i, int) and not isinstance(i, bool) and 1 <= i <= num_layers for i in cand):
            continue
        if cand is not top and sorted(cand) != default:
            continue
        theirs = [f"layer:{k - 1}" for k in sorted(set(cand))]
        if theirs == list(served):
            continue
        why = (f"sit at the top level ({IDS_KEY}), where speculators and vLLM write them" if cand is top
               else "are vLLM's and speculators' default")
        return (f"the ids {cand} {why}: read as vLLM/speculators read them (id k = hidden_states[k], no +1) these "
                f"would be {', '.join(theirs)}; SGLang feeds {', '.join(served) or 'nothing'}")
    return None
