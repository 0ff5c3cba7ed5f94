"""The deployed target against the one training recorded: the contract's fingerprints, field by field.

The contract stores (training/builder.py) a sha256 over the target config fields that matter
(``fingerprint_fields``), one over ``tokenizer.json`` (or ``tokenizer.model``) and one over the chat
template. Each difference is its own named failure: ``target_mismatch`` naming the config field(s),
``tokenizer_mismatch`` and ``chat_template_mismatch``. A hash cannot say which field changed, so the
fields the contract also stores in clear (architecture, layers, hidden size, vocab) are compared by
value and named; otherwise the message lists the deployed values of every fingerprinted field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from specparity.compare.findings import Finding, FindingKind, Severity
from specparity.training.hfdir import TargetInfo, sha256_bytes

_FIX = "deploy the target the drafter was trained against, or retrain the drafter (and its contract) on this one"


def _text_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    # the same view training fingerprinted (training/hfdir.py: multimodal wrappers nest text_config)
    inner = cfg.get("text_config")
    return {**cfg, **inner} if isinstance(inner, Mapping) else dict(cfg)


def config_fingerprint(config: Mapping[str, Any], fields: Sequence[str]) -> str:
    """sha256 of ``fields`` of ``config``, computed exactly as the contract's ``config_fingerprint``."""
    view = _text_config(config)
    return sha256_bytes(json.dumps({k: view.get(k) for k in fields}, sort_keys=True).encode())


def _short(h: str | None) -> str:
    return "none" if h is None else h.removeprefix("sha256:")[:12]


def target_findings(expected: Any, deployed: TargetInfo) -> list[Finding]:
    """Findings for the contract's ``target`` section (``expected``, a TargetSpec) against the deployed target."""
    out: list[Finding] = []
    where = f"deployed target {deployed.path}"
    fields = list(expected.fingerprint_fields)
    got = config_fingerprint(deployed.config, fields)
    if got != expected.config_fingerprint:
        clear = {"architecture": (expected.architecture, deployed.architecture),
                 "num_hidden_layers": (expected.num_hidden_layers, deployed.num_layers),
                 "hidden_size": (expected.hidden_size, deployed.hidden_size),
                 "vocab_size": (expected.vocab_size, deployed.vocab_size)}
        named = {k: v for k, v in clear.items() if v[0] != v[1]}
        view = _text_config(deployed.config)
        if named:
            what = "; ".join(f"{k} is {b}, training's was {a}" for k, (a, b) in named.items())
        else:
            values = ", ".join(f"{k}={json.dumps(view.get(k))}" for k in fields)
            what = f"one of the fingerprinted config fields differs from training's (deployed: {values})"
        out.append(Finding(
            FindingKind.TARGET_MISMATCH, Severity.ERROR,
            f"{where}: config.json differs from the target training recorded: {what} "
            f"(config fingerprint {_short(got)} vs contract {_short(expected.config_fingerprint)})",
            details={"check": "static", "reason": "config", "fields": sorted(named) or fields,
                     "expected": expected.config_fingerprint, "deployed": got},
            fix=_FIX))
    for kind, name, want, have in (
        (FindingKind.TOKENIZER_MISMATCH, "tokenizer", expected.tokenizer_fingerprint, deployed.tokenizer_fingerprint),
        (FindingKind.CHAT_TEMPLATE_MISMATCH, "chat template", expected.chat_template_fingerprint,
         deployed.chat_template_fingerprint),
    ):
        if want is None or want == have:
            continue  # training recorded none: nothing to compare against
        found = "has none" if have is None else f"has fingerprint {_short(have)}"
        out.append(Finding(
            kind, Severity.ERROR,
            f"{where}: the {name} differs from the one training used: the deployed target {found}, the "
            f"contract's is {_short(want)}; token ids (and so every hidden state) change with it",
            details={"check": "static", "field": "target." + name.replace(" ", "_") + "_fingerprint",
                     "expected": want, "deployed": have},
            fix=f"deploy the {name} the drafter was trained with"))
    return out
