"""The deployed target against the one training recorded: the contract's fingerprints, field by field.

The contract stores (training/builder.py) a sha256 over the target config fields that matter
(``fingerprint_fields``), one over the tokenizer and one over the chat template. Each difference is its
own named failure: ``target_mismatch`` naming the config field(s), ``tokenizer_mismatch`` and
``chat_template_mismatch``. A hash cannot say which field changed, so the fields the contract also stores
in clear (architecture, layers, hidden size, vocab) are compared by value and named; otherwise the message
lists the deployed values of every fingerprinted field.

The tokenizer fingerprint is semantic (training/tokenizer_fingerprint.py: vocabulary, merges, special
tokens, normalization, not the file's layout). Contracts written before recorded a sha256 of the file's
bytes; the recorded value matches when it equals either the deployed tokenizer's semantic fingerprint or
its byte hash, so an unchanged file never fails. When an old byte hash matches neither, a re-serialized
file cannot be told from another tokenizer: the message says so and asks to re-record the contract.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from specparity.compare.findings import Finding, FindingKind, Severity, engine_label
from specparity.training.hfdir import TargetInfo, sha256_bytes
from specparity.training.tokenizer_fingerprint import is_semantic

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
    tok = tokenizer_finding(expected.tokenizer_fingerprint, deployed)
    if tok is not None:
        out.append(tok)
    want, have = expected.chat_template_fingerprint, deployed.chat_template_fingerprint
    if want is not None and want != have:  # training recorded none: nothing to compare against
        found = "has none" if have is None else f"has fingerprint {_short(have)}"
        out.append(Finding(
            FindingKind.CHAT_TEMPLATE_MISMATCH, Severity.ERROR,
            f"{where}: the chat template differs from the one training used: the deployed target {found}, the "
            f"contract's is {_short(want)}; token ids (and so every hidden state) change with it",
            details={"check": "static", "field": "target.chat_template_fingerprint",
                     "expected": want, "deployed": have},
            fix="deploy the chat template the drafter was trained with"))
    return out


def tokenizer_finding(want: str | None, deployed: TargetInfo) -> Finding | None:
    """``tokenizer_mismatch`` unless the contract's ``tokenizer_fingerprint`` (``want``) is the deployed
    tokenizer's semantic fingerprint or its file's byte hash (what older contracts recorded)."""
    have, raw = deployed.tokenizer_fingerprint, deployed.tokenizer_byte_hash
    if want is None or want in (have, raw):
        return None  # training recorded none, or the same tokenizer
    where = f"deployed target {deployed.path}"
    details = {"check": "static", "field": "target.tokenizer_fingerprint", "expected": want, "deployed": have,
               "deployed_byte_hash": raw, "recorded": "semantic" if is_semantic(want) else "byte_hash"}
    if have is None:
        return Finding(
            FindingKind.TOKENIZER_MISMATCH, Severity.ERROR,
            f"{where}: the tokenizer differs from the one training used: the deployed target has none "
            f"(no tokenizer.json or tokenizer.model), the contract's fingerprint is {_short(want)}",
            details=details, fix="deploy the tokenizer the drafter was trained with")
    if is_semantic(want):
        return Finding(
            FindingKind.TOKENIZER_MISMATCH, Severity.ERROR,
            f"{where}: the tokenizer differs from the one training used (vocabulary, merges, special tokens "
            f"or normalization, not only the file's layout): fingerprint {_short(have)}, the contract's is "
            f"{_short(want)}; token ids (and so every hidden state) change with it",
            details=details, fix="deploy the tokenizer the drafter was trained with")
    return Finding(
        FindingKind.TOKENIZER_MISMATCH, Severity.ERROR,
        f"{where}: the contract recorded a byte hash of the tokenizer file ({_short(want)}; specparity before "
        f"semantic tokenizer fingerprints), and the deployed file's bytes differ ({_short(raw)}). A byte hash "
        "cannot tell a re-serialized file (other key order or indentation, a re-save by another transformers "
        "version) from another tokenizer, so this is not proof that the tokenizer changed",
        details=details,
        fix="re-record the contract with this specparity against the tokenizer training used (it then records a "
            "semantic fingerprint); if the tokenizer did change, deploy the one the drafter was trained with")


def _listed(names: Sequence[str], count: int) -> str:
    more = count - len(names)
    return ", ".join(names) + (f" and {more} more" if more > 0 else "")


def partial_load_findings(load: Mapping[str, Any], *, engine: str, version: str) -> list[Finding]:
    """``target_partly_loaded`` when the engine's own load of the target left parameters unloaded.

    ``load`` is what the engine's child measured around the target's ``load_weights``
    (``ResolvedDeployment.target_load``, serving/sglang/load_check.py); empty where nothing was measured.
    """
    never = int(load.get("never_loaded_count") or 0)
    if not never:
        return []
    label = engine_label(engine)
    names = [str(n) for n in load.get("never_loaded") or []]
    modules = [str(m) for m in load.get("modules") or []]
    skipped = load.get("skipped")
    n_skipped = load.get("skipped_count")
    function, cite, tensors = load.get("function"), load.get("engine_file_line"), load.get("checkpoint_tensors")
    held = f"in {'; '.join(modules)}" if modules else _listed(names, never)
    message = (f"{label} {version} loaded the target only partly: its {function} ({cite}) left {never} of the "
               f"target's {load.get('parameters')} parameters unloaded ({_listed(names, never)})"
               + (f", in {'; '.join(modules)}" if modules else ""))
    if skipped is None:
        message += ("; which checkpoint tensors it skipped cannot be said exactly (a parameter was loaded without a "
                    "weight loader)")
        fix = (f"{label} {version} loads this checkpoint only partly: the parameters {held} hold no checkpoint "
               f"value; compare the checkpoint with what {label}'s {function} builds")
    elif n_skipped:
        message += (f"; it skipped {n_skipped} of the checkpoint's {tensors} tensors (no weight loader ran for them): "
                    f"{_listed([str(s) for s in skipped], int(n_skipped))}")
        fix = (f"{label} {version} loads this checkpoint only partly: it skips {n_skipped} of its tensors and leaves "
               f"the parameters {held} unloaded. The checkpoint is not at fault (it may be the one training used): "
               f"serve it on an engine or {label} release that loads it whole, or report it to {label}")
    else:
        message += f"; it skipped none of the checkpoint's {tensors} tensors: the checkpoint holds none for them"
        fix = (f"{label} {version} loads this checkpoint only partly: the checkpoint has no tensor for the "
               f"parameters {held}; deploy a checkpoint that holds them")
    message += (". The served target computes with memory no checkpoint tensor filled, so its hidden states are not "
                "the checkpoint's")
    return [Finding(FindingKind.TARGET_PARTLY_LOADED, Severity.ERROR, message,
                    details={"check": "capture", "engine": engine, "version": version,
                             "cite": load.get("engine_file_line"), "function": load.get("function"),
                             "never_loaded": names, "never_loaded_count": never, "modules": modules,
                             "skipped": skipped, "skipped_count": n_skipped,
                             "checkpoint_tensors": load.get("checkpoint_tensors"),
                             "parameters": load.get("parameters")},
                    fix=fix)]


_OTHER_WEIGHTS = ": the deployed target has other weights than the one training recorded"


def explained_by_partial_load(findings: Sequence[Finding]) -> list[Finding]:
    """With ``target_partly_loaded`` present, a ``target_mismatch`` on the weights (the recording matches no
    boundary of the served target) is what the partial load makes: said so, and its "deploy the target the drafter
    was trained against" fix dropped, since the deployed checkpoint may be that very target."""
    if not any(f.kind is FindingKind.TARGET_PARTLY_LOADED for f in findings):
        return list(findings)
    out = []
    for f in findings:
        if f.kind is FindingKind.TARGET_MISMATCH and f.details.get("reason") == "weights":
            head = f.message  # compare/recorded.py's claim of other weights is what the partial load makes untrue
            if head.endswith(_OTHER_WEIGHTS):
                head = head.removesuffix(_OTHER_WEIGHTS) + ": the served target computes other hidden states than " \
                                                           "the one training recorded"
            f = Finding(f.kind, f.severity,
                        f"{head}; the engine loaded this target only partly (target_partly_loaded), which alone gives "
                        f"other hidden states, whichever checkpoint is deployed",
                        f.chunk, {**f.details, "explained_by": FindingKind.TARGET_PARTLY_LOADED.value}, fix=None)
        out.append(f)
    return out
