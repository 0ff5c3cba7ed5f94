"""Findings from the deploy command itself, shown by ``specparity explain`` and the gate.

- ``eagle3_served_as_eagle`` (error): an EAGLE-3 drafter (its config's ``architectures`` name Eagle3, or a
  speculators eagle3 config) served under SGLang's ``--speculative-algorithm EAGLE``/``NEXTN`` or vLLM's
  ``"method": "eagle"``. Neither engine then captures the target's aux hidden states: SGLang sets
  ``eagle_use_aux_hidden_state`` only for EAGLE3 (0.5.23 ``model_executor/model_runner_components/
  spec_aux_hidden_state.py:185-186``) and its EAGLE-3 drafter skips fc when the input is one hidden state wide
  (``models/llama_eagle3.py:238``); vLLM turns on ``use_aux_hidden_state_outputs`` only for ``eagle3``
  (0.32 ``v1/worker/gpu_model_runner.py:644-648``). Acceptance falls to about one token, silently
  (sgl-project/sglang#21272).
- ``served_target_unexpected`` (warning): the command serves a target other than the one the drafter's config
  (speculators' ``speculators_config.verifier.name_or_path``) or the contract (``target.name_or_path``) names. The
  gate's error for a wrong target is the contract's fingerprints (``target_mismatch``, deployed.py).
- ``target_from_draft_config`` (info): vLLM's form where the positional model is the drafter and vLLM serves the
  target its config names (``transformers_utils/config.py:754-813``).
- ``spec_config_rewritten`` (a warning in ``explain``, citing the rule's file:line in the installed release): the
  engine serves other speculative settings than the command asks for (SGLang: ``num_draft_tokens = num_steps + 1``
  at topk 1, 16 -> 4). The gate reports the same difference against the contract as an error (compare/diagnosis.py).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from specparity.compare.findings import Finding, FindingKind, Severity, engine_label
from specparity.compare.fix import spec_fix
from specparity.serving.command.parse import LaunchSpec

_SGLANG_AUX = ("sglang 0.5.23 model_executor/model_runner_components/spec_aux_hidden_state.py:185-186 (aux states "
               "only for EAGLE3), models/llama_eagle3.py:238 (fc skipped for a one-state input)")
_VLLM_AUX = "vllm 0.32 v1/worker/gpu_model_runner.py:644-648 (aux hidden state outputs only for eagle3)"


def eagle3_reason(draft_config: Mapping[str, Any] | None) -> str | None:
    """Why the drafter is EAGLE-3 (``architectures LlamaForCausalLMEagle3``, a speculators eagle3 config), or None."""
    if not draft_config:
        return None
    archs = [str(a) for a in draft_config.get("architectures") or []]
    if any("eagle3" in a.lower() for a in archs):
        return f"its config.json architectures: {', '.join(archs)}"
    spec_cfg = draft_config.get("speculators_config")
    algorithm = spec_cfg.get("algorithm") if isinstance(spec_cfg, Mapping) else None
    if draft_config.get("speculators_model_type") == "eagle3" or algorithm == "eagle3":
        return "its config.json is a speculators eagle3 config"
    return None


def _served_algorithm(spec: LaunchSpec) -> tuple[str | None, str]:
    """The speculative algorithm the engine serves with, and the flag that says it."""
    if spec.engine == "vllm":
        return spec.speculative.get("effective_method"), '--speculative-config "method"'
    raw = spec.speculative.get("algorithm")
    resolved = (spec.resolved or {}).get("speculative_algorithm")
    return (str(resolved or raw).upper() if (resolved or raw) else None), "--speculative-algorithm"


def command_findings(spec: LaunchSpec, *, draft_config: Mapping[str, Any] | None,
                     contract_target: str | None = None) -> list[Finding]:
    """What the command itself gets wrong or says (module docstring), without an engine run."""
    out: list[Finding] = []
    label = engine_label(spec.engine)
    why = eagle3_reason(draft_config)
    algorithm, flag = _served_algorithm(spec)
    wrong = {"sglang": ("EAGLE", "NEXTN"), "vllm": ("eagle",)}.get(spec.engine, ())
    if why and algorithm in wrong:
        right = "EAGLE3" if spec.engine == "sglang" else "eagle3"
        out.append(Finding(
            FindingKind.EAGLE3_SERVED_AS_EAGLE, Severity.ERROR,
            f"the drafter {spec.draft} is EAGLE-3 ({why}) but the command serves it with {flag} {algorithm}: "
            f"{label} then feeds fc no aux hidden states (one hidden state instead of the target's layer stack) and "
            f"acceptance falls to about one token, with no error ({_SGLANG_AUX if spec.engine == 'sglang' else _VLLM_AUX}"
            "; sgl-project/sglang#21272)",
            details={"check": "static", "engine": spec.engine, "algorithm": algorithm, "flag": flag,
                     "draft": spec.draft, "why": why},
            fix=f"serve it with {flag} {right}" if spec.engine == "sglang"
            else 'set "method": "eagle3" in --speculative-config'))
    named = _names(spec, draft_config, contract_target)
    for where, name in named:
        if not _same_model(name, spec.target, base=where[1]):
            out.append(Finding(
                FindingKind.SERVED_TARGET_UNEXPECTED, Severity.WARNING,
                f"the command serves the target {spec.target} (from {spec.target_flag}), but {where[0]} names "
                f"{name!r}: a drafter is trained on one target's hidden states",
                details={"check": "static", "served": spec.target, "named": name, "by": where[0]},
                fix=f"serve {name} as the target, or the drafter trained on {spec.target_name or spec.target}"))
    if spec.draft_from_config:
        out.append(Finding(
            FindingKind.TARGET_FROM_DRAFT_CONFIG, Severity.INFO,
            f"the command's model {spec.draft_from_config['draft']} is a speculators-format drafter: {label} "
            f"{spec.engine_version} serves the target its config names ({spec.target}, from "
            "speculators_config.verifier.name_or_path) and the drafter with it (vllm transformers_utils/config.py:"
            "754-813, engine/arg_utils.py:2223-2238)",
            details={"check": "static", **spec.draft_from_config}))
    return out


def _names(spec: LaunchSpec, draft_config: Mapping[str, Any] | None,
           contract_target: str | None) -> list[tuple[tuple[str, Path | None], str]]:
    """``((who names it, the directory a relative name means), name)`` for each recorded target name."""
    out: list[tuple[tuple[str, Path | None], str]] = []
    spec_cfg = (draft_config or {}).get("speculators_config")
    verifier = spec_cfg.get("verifier") if isinstance(spec_cfg, Mapping) else None
    name = verifier.get("name_or_path") if isinstance(verifier, Mapping) else None
    if name and not spec.draft_from_config:  # in the speculators form the verifier *is* the served target
        out.append((("the drafter's speculators_config.verifier.name_or_path",
                     Path(spec.draft) if spec.draft else None), str(name)))
    if contract_target:
        out.append((("the contract's target.name_or_path", None), contract_target))
    return out


def _same_model(name: str, served: str, *, base: Path | None) -> bool:
    """Whether ``name`` is the served directory. A name that is a directory here (read against ``base``, the
    drafter's directory, then this process's) is compared as a path; a hub id (``org/Model``) by its last
    component (served from ``/models/Model``) or its Hugging Face cache directory (``models--org--Model``)."""
    served_path = Path(served)
    for root in (base, None):
        p = Path(name).expanduser()
        p = (root / p) if root is not None and not p.is_absolute() else p
        if p.is_dir():
            try:
                return p.resolve() == served_path.resolve()
            except OSError:
                return False
    if name.startswith((".", "/", "~")) or name.count("/") != 1:  # a path that is not here: nothing to compare
        return True
    last = name.rstrip("/").rsplit("/", 1)[-1].lower()
    cache_dir = f"models--{name.lower().replace('/', '--')}"
    return served_path.name.lower() == last or any(q.lower() == cache_dir for q in served_path.parts)


def rewrite_findings(data: Mapping[str, Any], *, engine: str, rule: str | None) -> list[Finding]:
    """``spec_config_rewritten`` warnings for ``explain``: the speculative settings the engine serves differ from the
    ones it was asked for (``requested_spec``/``resolved_spec`` of an explanation), with the rule's file:line."""
    requested = data.get("requested_spec") or {}
    resolved = data.get("resolved_spec") or {}
    out = []
    version = data.get("engine_version")
    for key in ("num_steps", "eagle_topk", "num_draft_tokens"):
        want, got = requested.get(key), resolved.get(key)
        if want is None or got is None or want == got:
            continue
        why = (" (with topk 1 it serves num_steps + 1 draft tokens)"
               if key == "num_draft_tokens" and resolved.get("eagle_topk") == 1 else "")
        where = f", {rule}" if rule else ""
        out.append(Finding(
            FindingKind.SPEC_CONFIG_REWRITTEN, Severity.WARNING,
            f"{engine_label(engine)} {version} rewrites speculative {key} {want} -> {got}{why}{where}: the server "
            "runs the resolved value, not the one the command gives",
            details={"check": "static", "setting": key, "requested": want, "resolved": got, "rule": rule},
            fix=spec_fix(requested, resolved)))
    return out


def rule_for(spec: LaunchSpec | None, *, engine: str, python: str | None) -> str | None:
    """The file:line of the engine's num_draft_tokens rule in the installed release: from the launch parse, else
    read from the engine's package in ``python`` (found without importing it)."""
    if spec is not None and spec.rewrite_rule:
        return spec.rewrite_rule
    if engine != "sglang":
        return None
    from specparity.serving.command.parse_child import cite_line
    from specparity.serving.sglang.command_parse import REWRITE_FILES, REWRITE_NEEDLE

    root = _package_dir(python or "", "sglang")
    return cite_line("sglang", REWRITE_FILES, REWRITE_NEEDLE, root=root) if root else None


@lru_cache(maxsize=8)
def _package_dir(python: str, package: str) -> str | None:
    import sys

    code = (f"import importlib.util, json; s = importlib.util.find_spec({package!r}); "
            "print(json.dumps(list(s.submodule_search_locations or []) if s else []))")
    try:
        done = subprocess.run([python or sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        dirs = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    return str(dirs[0]) if dirs else None
