"""Facts about the deployed files themselves (draft config and weights, target directory) and the findings
they give without SGLang: the contract-vs-deployment config diff and the target's fingerprints.

Used by gate.py; the SGLang-side facts come from the serving adapter.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specparity.compare import configdiff
from specparity.compare.findings import Finding, FindingKind, Severity
from specparity.contract import Contract
from specparity.errors import EnvironmentProblem, InputError
from specparity.serving import ResolvedDeployment


def _config(directory: Path) -> dict[str, Any] | None:
    """``directory/config.json`` as a dict, or None where there is none to read (the readers that need it say so)."""
    try:
        cfg = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) else None


def _drafter_config(directory: Path) -> str | None:
    """What in ``directory/config.json`` says it is an EAGLE drafter (``architectures LlamaForCausalLMEagle3``,
    ``eagle_config``, ``speculators_model_type``), or None (no such config, or an ordinary model's)."""
    cfg = _config(directory)
    if cfg is None:
        return None
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else ""
    if "eagle" in arch.lower():
        return f"architectures {arch}"
    return next((f"{key} in its config" for key in ("speculators_model_type", "eagle_config") if key in cfg), None)


# Drafter families whose fc input specparity does not model yet: what in the draft's config.json says so. Each is
# served through another path than the Llama-style EAGLE-3 head (sglang 0.5.23 srt/models/kimi_k25_eagle3.py and
# srt/models/dflash.py; vllm 0.32 model_executor/models/deepseek_eagle3.py and models/qwen3_dflash.py), so an answer
# computed as for an EAGLE-3 head (three default layers, fc over them) would be a confident wrong one.
_UNMODELLED_FAMILIES: tuple[tuple[str, Callable[[dict[str, Any], str], bool]], ...] = (
    ("DFlash (block-diffusion drafter)", lambda cfg, arch: "dflash_config" in cfg or "dflash" in arch),
    ("DSpark", lambda cfg, arch: "dspark" in arch),
    ("MLA EAGLE-3 head (DeepSeek-style attention)", lambda cfg, arch: "eagle3" in arch and (
        "deepseek" in arch or "kv_lora_rank" in cfg)),
)


def unmodelled_family(draft: Path) -> str | None:
    """The drafter family of ``draft/config.json`` when it is one specparity does not model yet (and what said so),
    else None."""
    cfg = _config(draft)
    if cfg is None:
        return None
    archs = cfg.get("architectures")
    arch = " ".join(a for a in archs if isinstance(a, str)) if isinstance(archs, list) else ""
    for family, matches in _UNMODELLED_FAMILIES:
        if matches(cfg, arch.lower()):
            return f"{family}: architectures {arch or 'none'}" + (
                f", dflash_config.target_layer_ids {cfg['dflash_config'].get('target_layer_ids')}"
                if isinstance(cfg.get("dflash_config"), dict) else "")
    return None


def check_deployed_files(target: Path, draft: Path) -> None:
    """Before any engine starts, an :class:`InputError` (exit 2) naming the file and ``--target``/``--draft``:

    - a ``--target`` that is an EAGLE drafter (the two directories swapped, or the drafter given twice);
    - a weight file the engine cannot load (checkpoint_files.check_weight_files): the draft's pickles are read
      through ``weights_only`` onto the meta device; the target's, which may be large, are not;

    and an :class:`EnvironmentProblem` (exit 3) for a drafter of a family specparity does not model yet
    (:func:`unmodelled_family`: DFlash, DSpark, MLA EAGLE-3 heads), never an EAGLE-3 answer about it.
    """
    from specparity.checkpoint_files import check_weight_files

    drafter = _drafter_config(target)
    if drafter is not None:
        swapped = _drafter_config(draft) is None and (draft / "config.json").is_file()
        raise InputError(f"is an EAGLE drafter ({drafter}), not a target model"
                         + (f"; {draft} is the target: --target and --draft are swapped" if swapped else ""),
                         path=target, field="--target")
    family = unmodelled_family(draft)
    if family is not None:  # a limit of specparity, never a verdict on the deployment (exit 3)
        raise EnvironmentProblem(
            f"{draft} is a drafter of a family specparity does not model yet ({family}); the engines serve it through "
            "another path than the Llama-style EAGLE-3 head, so no answer computed as for one would be true: nothing "
            "was checked (docs/engines.md, drafter families)")
    check_weight_files(target, field="--target", pickles=False)
    check_weight_files(draft, field="--draft")


def draft_facts(draft: Path) -> tuple[dict[str, Any], str | None, bool, list[str] | None, list[Finding]]:
    """The deployed draft as SGLang will load it: config.json, d2t fingerprint, weight names, and a
    ``check_skipped`` warning for each check that reading it turned off (issue 11 item 7)."""
    from specparity.training.drafts import read_specforge_draft, read_speculators_draft

    cfg_path = draft / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read the deployed draft config: {e}", path=cfg_path) from None
    # a speculators-format draft (vLLM serves it as is) is read by its own format's reader, never as a SpecForge
    # export it is not (its sizes live in transformer_layer_config: the SpecForge reader finds no hidden_size)
    reader = read_speculators_draft if isinstance(cfg, dict) and "speculators_model_type" in cfg else read_specforge_draft
    try:
        info = reader(draft)
    except InputError as e:  # SGLang reports what it makes of an odd config; the gate goes on, and says so
        skipped = Finding(FindingKind.CHECK_SKIPPED, Severity.WARNING,
                          f"vocab-map and checkpoint-key checks not run: the deployed draft could not be read ({e})",
                          details={"check": "static", "skipped": ["vocab_map", "checkpoint_keys"],
                                   "reason": str(e)})
        return cfg, None, False, None, [skipped]
    return cfg, info.vocab_map.d2t_sha256 if info.vocab_map else None, True, info.checkpoint_keys, []


def config_findings(contract: Contract, dep: ResolvedDeployment, d2t: str | None,
                     keys: list[str] | None) -> list[Finding]:
    """The deepdiff of contract vs deployment, minus what a dedicated rule already reports."""
    covered = ("fc_input", "serving", "drafter.fc_in_features", "drafter.vocab_map", "drafter.norm_before_fc",
               "drafter.fc_norm", "drafter.norm_output", "target.dtype")
    expected = configdiff.contract_view(contract)
    actual = configdiff.view_from_resolved(dep.to_dict(), checkpoint_keys=keys, d2t_sha256=d2t)
    if keys is None or contract.drafter.checkpoint_keys is None:
        for view in (expected, actual):
            view.get("drafter", {}).pop("checkpoint_keys", None)
    kept = [m for m in configdiff.diff_views(expected, actual)
            if not any(m.path == p or m.path.startswith(p + ".") for p in covered)]
    return configdiff.config_findings(kept)


def target_findings(contract: Contract, target: Path | None) -> list[Finding]:
    """The contract's target fingerprints against the deployed target directory (compare/target.py)."""
    if target is None:
        return []
    from specparity.compare.target import target_findings
    from specparity.training.hfdir import read_target

    return target_findings(contract.target, read_target(target))
