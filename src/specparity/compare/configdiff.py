"""The contract against a contract-shaped view of the deployment, as typed, numbered mismatches.

Both sides are reduced to the same plain shape (:func:`contract_view`, :func:`view_from_resolved` or
:func:`view_from_configs`) and compared with deepdiff. Integers, ids, strings and source lists are
compared exactly (a list is reported whole, never item by item); floats relatively (``rel_tol``,
with ``abs_tol`` near zero). Each difference becomes a :class:`ConfigMismatch` with a 1-based number,
a dotted path (``drafter.fc_in_features``), both values and a kind; :meth:`ConfigMismatch.to_finding`
names the failure class.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from deepdiff import DeepDiff
from deepdiff.operator import BaseOperator

from specparity.compare.findings import Finding, FindingKind, Severity

MismatchKind = Literal["changed", "type_changed", "missing", "unexpected"]
_ABSENT = "<absent>"


@dataclass(frozen=True)
class ConfigMismatch:
    """Mismatch number ``n`` (1-based): the contract has ``expected`` at ``path``, the deployment ``actual``.

    ``kind``: ``changed`` (values differ), ``type_changed`` (e.g. bool vs int), ``missing`` (the
    deployment lacks what the contract has), ``unexpected`` (the deployment has what the contract lacks).
    """

    n: int
    path: str
    expected: object
    actual: object
    kind: MismatchKind

    def to_dict(self) -> dict[str, object]:
        """Plain-JSON view."""
        return {"n": self.n, "path": self.path, "expected": self.expected, "actual": self.actual, "kind": self.kind}

    def to_finding(self) -> Finding:
        """This mismatch as a :class:`Finding` of the matching kind."""
        kind, severity = _classify(self.path, self.kind)
        if self.kind == "missing":
            what = f"the contract has {self.expected!r}, the deployment has none"
        elif self.kind == "unexpected":
            what = f"the deployment has {self.actual!r}, the contract has none"
        else:
            what = f"contract {self.expected!r}, deployment {self.actual!r}"
        return Finding(kind, severity, f"#{self.n} {self.path}: {what}", details=self.to_dict())


def _classify(path: str, kind: MismatchKind) -> tuple[FindingKind, Severity]:
    if path.startswith("fc_input.sources"):
        return FindingKind.LAYOUT_MISMATCH, Severity.ERROR
    if path in ("fc_input.total_width", "drafter.fc_in_features"):
        return FindingKind.WIDTH_MISMATCH, Severity.ERROR
    if path.split(".")[-1] in ("norm_before_fc", "fc_norm", "norm_output"):
        return FindingKind.NORM_MISMATCH, Severity.ERROR
    if path.startswith(("drafter.vocab_map", "drafter.draft_vocab_size")):
        return FindingKind.VOCAB_MAP_MISMATCH, Severity.ERROR
    if path.startswith("serving."):
        return FindingKind.SPEC_CONFIG_REWRITTEN, Severity.ERROR
    if path.startswith("drafter.checkpoint_keys") and kind == "unexpected":
        return FindingKind.CONFIG_MISMATCH, Severity.WARNING  # a weight training did not produce
    return FindingKind.CONFIG_MISMATCH, Severity.ERROR


def _get(d: Mapping[str, Any], *keys: str) -> Any:
    cur: Any = d
    for k in keys:
        if not isinstance(cur, Mapping) or k not in cur:
            return None
        cur = cur[k]
    return cur


def _prune(d: Mapping[str, Any]) -> dict[str, Any]:
    """Drop None values (unknown on that side) recursively; empty sections go too."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            v = _prune(v)
            if not v:
                continue
        if v is not None:
            out[k] = v
    return out


def _keys(keys: Sequence[str] | None) -> dict[str, bool] | None:
    return None if keys is None else {k: True for k in sorted(keys)}


def contract_view(contract: Mapping[str, Any] | Any) -> dict[str, Any]:
    """The comparable facts of a contract (a ``Contract`` model or its JSON dict)."""
    d: Mapping[str, Any] = contract.model_dump(mode="json") if hasattr(contract, "model_dump") else contract
    drafter = d.get("drafter") or {}
    serving = d.get("serving") or {}
    return _prune({
        "target": {k: _get(d, "target", k) for k in ("architecture", "num_hidden_layers", "hidden_size",
                                                       "vocab_size", "dtype")},
        "fc_input": {"sources": _get(d, "fc_input", "sources"), "total_width": _get(d, "fc_input", "total_width")},
        "drafter": {
            **{k: drafter.get(k) for k in ("architecture", "hidden_size", "fc_in_features", "fc_out_features",
                                           "fc_bias", "norm_before_fc", "fc_norm", "norm_output",
                                           "draft_vocab_size")},
            "vocab_map": {"d2t_sha256": _get(drafter, "vocab_map", "d2t_sha256")},
            "checkpoint_keys": _keys(drafter.get("checkpoint_keys")),
        },
        "serving": {k: serving.get(k) for k in ("num_steps", "eagle_topk", "num_draft_tokens")},
    })


def view_from_resolved(
    resolved: Mapping[str, Any],
    *,
    checkpoint_keys: Sequence[str] | None = None,
    d2t_sha256: str | None = None,
) -> dict[str, Any]:
    """The deployment as the serving adapter resolved it (``ResolvedDeployment.to_dict()``)."""
    spec = resolved.get("resolved_spec") or {}
    return _prune({
        "target": {"architecture": resolved.get("target_architecture"), "num_hidden_layers": resolved.get("num_layers"),
                   "hidden_size": resolved.get("target_hidden_size"), "vocab_size": resolved.get("target_vocab_size"),
                   "dtype": resolved.get("target_dtype")},
        "fc_input": {"sources": list(resolved["served_sources"]) if resolved.get("served_sources") is not None
                     else None, "total_width": resolved.get("fc_in_features")},
        "drafter": {
            "architecture": resolved.get("draft_architecture"), "hidden_size": resolved.get("draft_hidden_size"),
            "fc_in_features": resolved.get("fc_in_features"), "fc_out_features": resolved.get("fc_out_features"),
            "fc_bias": resolved.get("fc_bias"), "norm_before_fc": resolved.get("norm_before_fc"),
            "fc_norm": resolved.get("fc_norm"), "norm_output": resolved.get("norm_output"),
            "draft_vocab_size": resolved.get("draft_vocab_size"),
            "vocab_map": {"d2t_sha256": d2t_sha256},
            "checkpoint_keys": _keys(checkpoint_keys),
        },
        "serving": {k: spec.get(k) for k in ("num_steps", "eagle_topk", "num_draft_tokens")},
    })


def view_from_configs(
    draft_config: Mapping[str, Any],
    target_config: Mapping[str, Any],
    *,
    resolved_spec: Mapping[str, int | None] | None = None,
    served_sources: Sequence[str] | None = None,
    served_dtype: str | None = None,
    checkpoint_keys: Sequence[str] | None = None,
    d2t_sha256: str | None = None,
) -> dict[str, Any]:
    """The deployment read from the raw ``config.json`` files, the way SGLang's drafter reads them."""
    eagle = draft_config.get("eagle_config")
    eagle = eagle if isinstance(eagle, Mapping) else {}
    # sglang 0.5.23 models/llama_eagle3.py:151-161: H_t = target_hidden_size or hidden_size;
    # k = num_aux_hidden_states, else len(eagle_config ids), else 3
    h_t = draft_config.get("target_hidden_size") or draft_config.get("hidden_size")
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    k = draft_config.get("num_aux_hidden_states") or (len(ids) if isinstance(ids, list) and ids else 3)
    fc_in = h_t * k if isinstance(h_t, int) else None
    archs = target_config.get("architectures") or [None]
    draft_archs = draft_config.get("architectures") or [None]
    dtype = served_dtype or target_config.get("dtype") or target_config.get("torch_dtype")
    return _prune({
        "target": {"architecture": archs[0], "num_hidden_layers": target_config.get("num_hidden_layers"),
                   "hidden_size": target_config.get("hidden_size"), "vocab_size": target_config.get("vocab_size"),
                   "dtype": dtype},
        "fc_input": {"sources": list(served_sources) if served_sources is not None else None, "total_width": fc_in},
        "drafter": {
            "architecture": draft_archs[0], "hidden_size": draft_config.get("hidden_size"),
            "fc_in_features": fc_in, "fc_out_features": draft_config.get("hidden_size"),
            "fc_bias": bool(draft_config.get("bias", False)),
            # :169-207 norm_before_fc nested or top level; fc_norm or legacy use_aux_norm; norm_output default False
            "norm_before_fc": bool(eagle.get("norm_before_fc", draft_config.get("norm_before_fc", False))),
            "fc_norm": bool(draft_config.get("fc_norm", draft_config.get("use_aux_norm", False))),
            "norm_output": bool(draft_config.get("norm_output", False)),
            "draft_vocab_size": draft_config.get("draft_vocab_size") or draft_config.get("vocab_size"),
            "vocab_map": {"d2t_sha256": d2t_sha256},
            "checkpoint_keys": _keys(checkpoint_keys),
        },
        "serving": dict(resolved_spec or {}),
    })


class _RelativeFloats(BaseOperator):
    """Floats equal within ``rel_tol`` (or ``abs_tol`` near zero) are not reported."""

    def __init__(self, rel_tol: float, abs_tol: float) -> None:
        super().__init__(types=[float])
        self.rel_tol = rel_tol
        self.abs_tol = abs_tol

    def give_up_diffing(self, level: Any, diff_instance: Any) -> bool:
        a, b = level.t1, level.t2
        numbers = (int, float)
        if isinstance(a, bool) or isinstance(b, bool) or not (isinstance(a, numbers) and isinstance(b, numbers)):
            return False
        return math.isclose(a, b, rel_tol=self.rel_tol, abs_tol=self.abs_tol)


def _fmt_path(keys: Sequence[Any]) -> str:
    out = ""
    for k in keys:
        out += f"[{k}]" if isinstance(k, int) or (out.endswith("checkpoint_keys")) else (f".{k}" if out else str(k))
    return out


def _lookup(d: Any, keys: Sequence[Any]) -> Any:
    cur = d
    for k in keys:
        cur = cur[k]
    return cur


def diff_views(
    expected: Mapping[str, Any],
    actual: Mapping[str, Any],
    *,
    rel_tol: float = 1e-6,
    abs_tol: float = 1e-12,
) -> list[ConfigMismatch]:
    """Every difference between two views, numbered in path order."""
    diff = DeepDiff(dict(expected), dict(actual), verbose_level=2,
                    custom_operators=[_RelativeFloats(rel_tol, abs_tol)])
    kinds: dict[str, MismatchKind] = {
        "values_changed": "changed", "type_changes": "type_changed",
        "dictionary_item_removed": "missing", "dictionary_item_added": "unexpected",
        "iterable_item_removed": "changed", "iterable_item_added": "changed",
    }
    found: dict[str, tuple[object, object, MismatchKind]] = {}
    for report, kind in kinds.items():
        for level in diff.tree.get(report, []):
            keys = list(level.path(output_format="list"))
            # a list is reported whole: ids and sources are compared exactly, as a unit
            for i, key in enumerate(keys):
                if isinstance(key, int):
                    keys, kind_here = keys[:i], "changed"
                    break
            else:
                kind_here = kind
            path = _fmt_path(keys)
            if path in found:
                continue
            exp = _lookup(expected, keys) if kind_here != "unexpected" else _ABSENT
            act = _lookup(actual, keys) if kind_here != "missing" else _ABSENT
            found[path] = (exp, act, kind_here)  # type: ignore[assignment]
    return [ConfigMismatch(n=i + 1, path=p, expected=e, actual=a, kind=k)
            for i, (p, (e, a, k)) in enumerate(sorted(found.items()))]


def config_findings(mismatches: Sequence[ConfigMismatch]) -> list[Finding]:
    """Each mismatch as a finding, in number order."""
    return [m.to_finding() for m in mismatches]
