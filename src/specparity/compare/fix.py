"""The change that makes SGLang serve what the contract promises.

- :func:`layout_fix`: for one SGLang version and target architecture, the draft ``config.json`` edit
  (an RFC 6902 JSON patch plus a one-line human fix) whose ids SGLang turns into exactly the
  contract's sources, derived with :func:`specparity.idrules.sglang.ids_for_sources`.
- :func:`spec_fix`: the server flags that stop SGLang rewriting the speculative settings.
- :func:`apply_json_patch`: a small RFC 6902 applier (add / replace / remove / test) so callers and
  tests can apply the patch to a config dict.

Only the nested ``eagle_config.eagle_aux_hidden_state_layer_ids`` reaches the target (D11, sglang
0.5.23 model_runner_components/spec_aux_hidden_state.py:185-196), so that is the key we write.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specparity.errors import InputError
from specparity.sources import EMBEDDING, FINAL_NORM, layer_index, order_key

IDS_KEY = "eagle_aux_hidden_state_layer_ids"


@dataclass(frozen=True)
class DraftConfigFix:
    """A draft-config change. ``ids`` is None when no id list makes this SGLang serve the contract."""

    summary: str
    file: str
    ids: tuple[int, ...] | None
    json_patch: tuple[Mapping[str, Any], ...] = field(default_factory=tuple)

    @property
    def feasible(self) -> bool:
        """Whether some draft config serves the contract on this SGLang version and architecture."""
        return self.ids is not None

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON view (the shape of ``verdict.FixSuggestion``)."""
        return {"summary": self.summary, "file": self.file, "ids": list(self.ids) if self.ids is not None else None,
                "json_patch": [dict(op) for op in self.json_patch]}


def _why_unservable(sources: Sequence[str], *, num_layers: int, version: str) -> str:
    keys = [order_key(s) for s in sources]
    if any(a >= b for a, b in itertools.pairwise(keys)):
        return ("SGLang concatenates aux states in ascending layer order and drops duplicates "
                "(sglang 0.5.23 models/llama.py:485-493); retrain with an ascending source list or permute "
                "fc.weight's input blocks")
    if FINAL_NORM in sources:
        return "SGLang captures only pre-norm residual states; final_norm cannot be served"
    if any(layer_index(s) == num_layers - 1 for s in sources):
        return (f"layer:{num_layers - 1} is past the last boundary this target's forward captures "
                "(sglang 0.5.23 models/llama.py:485-493)")
    if EMBEDDING in sources:
        return f"boundary 0 (embedding) crashes or is unreachable on this target with sglang {version} (D9)"
    return f"sglang {version} ignores draft-config ids here and always serves its default (D1)"


def dflash_layout_fix(sources: Sequence[str], draft_config: Mapping[str, Any], *, num_layers: int, file: str,
                      engine_rule: str) -> DraftConfigFix | None:
    """For a DFlash drafter, the edit of its own key: ``dflash_config.target_layer_ids``, id k for ``layer:k``
    (``contract/conventions.py`` ``dflash_ids_to_sources``; ``engine_rule`` says how the serving engine reads them).
    None for a drafter of another family."""
    from specparity.contract.conventions import sources_to_dflash_ids
    from specparity.drafters import DrafterFamily, family_of

    if family_of(draft_config) is not DrafterFamily.DFLASH:
        return None
    key = "dflash_config.target_layer_ids"
    try:
        ids = sources_to_dflash_ids(list(sources), num_layers=num_layers)
    except ValueError as e:
        return DraftConfigFix(summary=f"no DFlash draft config serves {', '.join(sources)}: {e}", file=file, ids=None)
    dc = draft_config.get("dflash_config")
    ops: list[dict[str, Any]]
    if not isinstance(dc, Mapping):
        ops = [{"op": "replace" if "dflash_config" in draft_config else "add", "path": "/dflash_config",
                "value": {"target_layer_ids": ids}}]
    elif dc.get("target_layer_ids") != ids:
        ops = [{"op": "replace" if "target_layer_ids" in dc else "add", "path": "/dflash_config/target_layer_ids",
                "value": ids}]
    else:
        ops = []
    summary = (f"{file} already sets {key} = {ids}" if not ops
               else f"set {key} = {ids} in {file} (id k is layer:k: {engine_rule})")
    return DraftConfigFix(summary=summary, file=file, ids=tuple(ids), json_patch=tuple(ops))


def layout_fix(
    sources: Sequence[str],
    draft_config: Mapping[str, Any],
    *,
    num_layers: int,
    architecture: str,
    version: str,
    draft_path: str = "<draft>",
) -> DraftConfigFix:
    """The draft-config patch that makes ``sglang version`` on ``architecture`` serve ``sources``.

    ``draft_config`` is the draft's ``config.json`` as a dict (not modified). The patch is empty when
    the config already holds the right ids.
    """
    from specparity.idrules import sglang

    file = f"{draft_path.rstrip('/')}/config.json"
    dflash = dflash_layout_fix(sources, draft_config, num_layers=num_layers, file=file,
                               engine_rule="SGLang's DFlash path reads them and its set_dflash_layers_to_capture adds 1, "
                                           "sglang 0.5.23 models/qwen3.py:793-805")
    if dflash is not None:
        return dflash
    try:
        ids = sglang.ids_for_sources(list(sources), num_layers=num_layers, architecture=architecture, version=version)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    if ids is None:
        reason = _why_unservable(sources, num_layers=num_layers, version=version)
        return DraftConfigFix(summary=f"no draft config serves {', '.join(sources)} on sglang {version} "
                                      f"({architecture}): {reason}", file=file, ids=None)
    ops: list[dict[str, Any]] = []
    eagle = draft_config.get("eagle_config")
    if isinstance(eagle, Mapping):
        current = eagle.get(IDS_KEY)
        if IDS_KEY not in eagle:
            ops.append({"op": "add", "path": f"/eagle_config/{IDS_KEY}", "value": list(ids)})
        elif current != list(ids):
            ops.append({"op": "replace", "path": f"/eagle_config/{IDS_KEY}", "value": list(ids)})
        if eagle.get("use_aux_hidden_state") is False:
            ops.append({"op": "replace", "path": "/eagle_config/use_aux_hidden_state", "value": True})
    else:
        # absent, null or malformed: SGLang's bare except serves the default (I32, D11)
        ops.append({"op": "replace" if "eagle_config" in draft_config else "add", "path": "/eagle_config",
                    "value": {IDS_KEY: list(ids), "use_aux_hidden_state": True}})
    # keep the drafter's own view consistent: fc width comes from num_aux_hidden_states when present
    # (sglang 0.5.23 models/llama_eagle3.py:156-161) and eagle_utils also reads a top-level key (:253-276)
    if "num_aux_hidden_states" in draft_config and draft_config["num_aux_hidden_states"] != len(ids):
        ops.append({"op": "replace", "path": "/num_aux_hidden_states", "value": len(ids)})
    if IDS_KEY in draft_config and draft_config[IDS_KEY] != list(ids):
        ops.append({"op": "replace", "path": f"/{IDS_KEY}", "value": list(ids)})
    if not ops:
        summary = f"{file} already sets eagle_config.{IDS_KEY} = {list(ids)}"
    else:
        summary = f"set eagle_config.{IDS_KEY} = {list(ids)} in {file}"
    return DraftConfigFix(summary=summary, file=file, ids=tuple(ids), json_patch=tuple(ops))


def spec_fix(requested: Mapping[str, int | None], resolved: Mapping[str, int | None]) -> str | None:
    """The server flags that make SGLang keep the requested speculative settings (None if none differ).

    Keys: ``num_steps``, ``eagle_topk``, ``num_draft_tokens``. SGLang forces ``num_draft_tokens =
    num_steps + 1`` when ``topk == 1`` (sglang 0.5.23 arg_groups/speculative_hook.py:1255-1266) and
    auto-chooses the whole triple when steps are unset (:1159-1173).
    """
    changed = [k for k in ("num_steps", "eagle_topk", "num_draft_tokens")
               if requested.get(k) is not None and resolved.get(k) is not None and requested[k] != resolved[k]]
    if not changed:
        return None
    steps, topk, ndt = (requested.get(k) for k in ("num_steps", "eagle_topk", "num_draft_tokens"))
    got_topk = resolved.get("eagle_topk") if topk is None else topk
    if "num_draft_tokens" in changed and ndt is not None and got_topk == 1:
        return (f"pass --speculative-num-steps {ndt - 1} to get {ndt} draft tokens with topk 1, "
                f"or raise --speculative-eagle-topk above 1")
    if steps is None:
        return ("pass --speculative-num-steps, --speculative-eagle-topk and --speculative-num-draft-tokens "
                "together; with steps unset SGLang auto-chooses all three")
    flags = {"num_steps": "--speculative-num-steps", "eagle_topk": "--speculative-eagle-topk",
             "num_draft_tokens": "--speculative-num-draft-tokens"}
    return "pass " + " ".join(f"{flags[k]} {requested[k]}" for k in changed) + " and check SGLang's warnings"


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise InputError(f"JSON pointer must start with '/': {path!r}", field="json_patch")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def apply_json_patch(document: Mapping[str, Any], ops: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Apply RFC 6902 ``add`` / ``replace`` / ``remove`` / ``test`` ops to a copy of ``document``."""
    doc: Any = copy.deepcopy(dict(document))
    for op in ops:
        parts = _pointer(str(op["path"]))
        if not parts:
            raise InputError("patching the whole document is not supported", field="json_patch")
        parent: Any = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        kind = op["op"]
        if isinstance(parent, list):
            idx = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(idx, copy.deepcopy(op["value"]))
            elif kind == "replace":
                parent[idx] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[idx]
            elif kind == "test" and parent[idx] != op["value"]:
                raise InputError(f"test failed at {op['path']}", field="json_patch")
            continue
        if kind == "add":
            parent[last] = copy.deepcopy(op["value"])
        elif kind in ("replace", "remove", "test"):
            if last not in parent:
                raise InputError(f"{kind} of a missing member {op['path']}", field="json_patch")
            if kind == "replace":
                parent[last] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[last]
            elif parent[last] != op["value"]:
                raise InputError(f"test failed at {op['path']}", field="json_patch")
        else:
            raise InputError(f"unsupported op {kind!r}", field="json_patch")
    return dict(doc)
