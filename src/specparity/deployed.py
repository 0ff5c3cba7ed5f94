"""Facts about the deployed files themselves (draft config and weights, target directory) and the findings
they give without SGLang: the contract-vs-deployment config diff and the target's fingerprints.

Used by gate.py; the SGLang-side facts come from the serving adapter.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specparity.compare import configdiff
from specparity.compare.findings import Finding, FindingKind, Severity
from specparity.contract import Contract
from specparity.drafters import SGLANG_ALGORITHM, VLLM_METHOD, DrafterFamily, family_of, family_words
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


# Families specparity does not model yet: refused by name before any engine starts (exit 3). Empty since DSpark's
# static level (each engine's DSpark path asked on its own objects: serving/sglang/since_0_5_11/static_families.py,
# serving/vllm/drafter_static.py); kept for the next family.
_UNMODELLED: frozenset[DrafterFamily] = frozenset()
_UNMODELLED_WHY = "its engine path is not modelled"


def drafter_family(draft: Path) -> DrafterFamily:
    """The family of ``draft/config.json`` (a Llama-style EAGLE-3 head where there is no config to read)."""
    cfg = _config(draft)
    return family_of(cfg) if cfg is not None else DrafterFamily.EAGLE3


def unmodelled_family(draft: Path) -> str | None:
    """The drafter family of ``draft/config.json`` when it is one specparity does not model yet (and what said so),
    else None."""
    cfg = _config(draft)
    if cfg is None or family_of(cfg) not in _UNMODELLED:
        return None
    return family_words(cfg)


# Where a capture of a family cannot run on this CPU, as each engine's own code refuses it (measured with a tiny
# generated pair on the fixtures' 8-layer target): refused before the engine starts (exit 3) for an
# in-process capture on the CPU. A capture on a GPU (--device cuda) or through the user's own server (--launch,
# --server) is attempted: there the engine's own paths serve these drafters [inferred: not run on a GPU here], and
# specparity's fc taps find their fc where the Llama-style head keeps it (vllm 0.32 models/deepseek_eagle3.py:201-209
# and qwen3_dflash.py:494-504, both `model.fc`; sglang 0.5.23 models/kimi_k25_eagle3.py:212-219). vLLM's CPU capture
# of an MLA head is attempted too: vLLM refuses it itself (v1/worker/utils.py:554, "No common block size ...
# CPU_MLA"), a named machine limit (verdict/rules.py), exit 3.
_CPU_CAPTURE_REFUSED = {
    (DrafterFamily.EAGLE3_MLA, "sglang"): (
        "SGLang 0.5.23 cannot run the MLA head on this CPU: at start-up its set_embed calls torch.cuda.synchronize "
        "(models/kimi_k25_eagle3.py:414-415: 'Found no NVIDIA driver'), and where the draft's hidden size differs "
        "from the target's (set_embed returns early, :406-411) the drafter's own MLA attention fails right after fc on "
        "the CPU backend (layers/attention/torch_native_backend.py:160: the query's head size against MLA's latent "
        "cache, kv_lora_rank + qk_rope_head_dim wide); on a GPU SGLang serves MLA with its MLA backends"),
    (DrafterFamily.DFLASH, "sglang"): (
        "SGLang refuses DFLASH on its CPU platform (sglang 0.5.23 arg_groups/speculative_hook.py:287-300, "
        "_handle_dflash: 'DFLASH speculative decoding is not supported by CpuSRTPlatform'); vLLM's CPU path serves "
        "it (--engine vllm)"),
    (DrafterFamily.DSPARK, "sglang"): (
        "SGLang refuses DSPARK on any device but CUDA, NPU or XPU (sglang 0.5.23 arg_groups/speculative_hook.py:"
        "668-672, _handle_dspark: 'DSpark speculative decoding only supports CUDA, NPU or XPU device.')"),
}
# What a capture cannot do for a family on any device, live or in-process: specparity's own limit (exit 3)
_CAPTURE_REFUSED_ANYWHERE = {
    (DrafterFamily.DSPARK, "vllm"): (
        "vLLM serves DSpark through its V2 model runner's DSparkSpeculator (vllm 0.32 v1/worker/gpu/spec_decode/"
        "__init__.py:45-50), whose fc specparity's tap does not hook: the tap hooks the V1 runner's proposers "
        "(v1/spec_decode/llm_base_proposer.py), where the V1 runner would put a DSpark drafter under its EAGLE "
        "proposer with no aux states (v1/worker/gpu_model_runner.py:638-647)"),
}
# What the outcome level cannot run for a family yet (ours: never attempted, exit 3)
_OUTCOME_LIMITS = {
    family: ("specparity's outcome evidence (SGLang's drafter replay, vLLM's acceptance per draft position) is built "
             "and tested for the Llama-style EAGLE-3 head only; the capture level checks what this drafter's fc is "
             "fed")
    for family in (DrafterFamily.EAGLE3_MLA, DrafterFamily.DFLASH, DrafterFamily.DSPARK)
}


def check_family_level(draft: Path, level: str, *, engine: str = "sglang", device: str = "cpu",
                       live: bool = False) -> None:
    """An :class:`EnvironmentProblem` (exit 3) for a level that cannot run for the drafter's family here, named:

    - the outcome level (and ``all``) of an MLA EAGLE-3 head, a DFlash or a DSpark drafter: specparity's own limit;
    - an in-process CPU capture the engine itself cannot run (:data:`_CPU_CAPTURE_REFUSED`, with the engine's lines):
      SGLang's MLA head, DFlash and DSpark; ``live`` (a launched or attached server) and ``device`` other than cpu go
      on;
    - a capture specparity cannot take on any device (:data:`_CAPTURE_REFUSED_ANYWHERE`): vLLM's DSpark, whose fc
      specparity's tap cannot see.
    """
    family = drafter_family(draft)
    why = _OUTCOME_LIMITS.get(family) if level in ("outcome", "all") else None
    instead = "--level capture or --level static"
    if why is None and level != "static":
        why = _CAPTURE_REFUSED_ANYWHERE.get((family, engine))
        if why is None and device == "cpu" and not live:
            why = _CPU_CAPTURE_REFUSED.get((family, engine))
        instead = "--level static"
    if why is not None:
        raise EnvironmentProblem(
            f"{draft} is a {family.label}; the {level} level cannot run for it here: {why}. Run {instead} "
            "(docs/engines.md, drafter families)")


def check_family_algorithm(draft: Path, args: Mapping[str, Any]) -> None:
    """An :class:`EnvironmentProblem` (exit 3) for a DFlash or DSpark drafter the deployment serves under another
    family's algorithm (an EAGLE algorithm, DFLASH for a DSpark drafter, DSPARK for a DFlash one), or an EAGLE-3 head
    under DFLASH or DSPARK: what the engine makes of such a pair (SGLang's EAGLE-3 path reads no
    ``dflash_config`` and would serve its three default layers) is not modelled, and an answer computed as for the
    drafter's own path would be a confident wrong one."""
    family = drafter_family(draft)
    algo = args.get("speculative_algorithm")
    spec = args.get("speculative_config")
    method = spec.get("method") if isinstance(spec, Mapping) else None
    asked = str(algo or method or "")
    if not asked:
        return
    want = SGLANG_ALGORITHM[family] if algo else VLLM_METHOD[family]
    served = {"DFLASH": DrafterFamily.DFLASH, "DSPARK": DrafterFamily.DSPARK}.get(asked.upper())
    own = family if family in (DrafterFamily.DFLASH, DrafterFamily.DSPARK) else None
    if served is not own:
        raise EnvironmentProblem(
            f"{draft} is a {family.label}, served with {want}, but the deployment asks for {asked}: specparity does "
            "not model what the engine makes of that pair, so nothing was checked (docs/engines.md, drafter families)")


def check_deployed_files(target: Path, draft: Path) -> None:
    """Before any engine starts, an :class:`InputError` (exit 2) naming the file and ``--target``/``--draft``:

    - a ``--target`` that is an EAGLE drafter (the two directories swapped, or the drafter given twice);
    - a weight file the engine cannot load (checkpoint_files.check_weight_files): the draft's pickles are read
      through ``weights_only`` onto the meta device; the target's, which may be large, are not;

    and an :class:`EnvironmentProblem` (exit 3) for a drafter of a family specparity does not model yet
    (:func:`unmodelled_family`; none today), never an EAGLE-3 answer about it.
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
            f"{draft} is a drafter of a family specparity does not model yet ({family}); {_UNMODELLED_WHY}, so no "
            "answer computed as for an EAGLE-3 head or a DFlash drafter would be true: nothing was checked "
            "(docs/engines.md, drafter families)")
    check_weight_files(target, field="--target", pickles=False)
    check_weight_files(draft, field="--draft")


def draft_facts(draft: Path) -> tuple[dict[str, Any], str | None, bool, list[str] | None, list[Finding]]:
    """The deployed draft as SGLang will load it: config.json, d2t fingerprint, weight names, and a
    ``check_skipped`` warning for each check that reading it turned off."""
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
               "drafter.fc_norm", "drafter.norm_output", "target.dtype", "drafter.family")
    expected = configdiff.contract_view(contract)
    actual = configdiff.view_from_resolved(dep.to_dict(), checkpoint_keys=keys, d2t_sha256=d2t)
    if keys is None or contract.drafter.checkpoint_keys is None:
        for view in (expected, actual):
            view.get("drafter", {}).pop("checkpoint_keys", None)
    kept = [m for m in configdiff.diff_views(expected, actual)
            if not any(m.path == p or m.path.startswith(p + ".") for p in covered)]
    family = []
    if contract.drafter.family != dep.drafter_family:  # another drafter than training wrote, served by another path
        family.append(Finding(FindingKind.DRAFTER_FAMILY_MISMATCH, Severity.ERROR,
                              f"the contract is for a {contract.drafter.family} drafter but the deployed draft is a "
                              f"{dep.drafter_family} drafter",
                              details={"check": "static", "expected": contract.drafter.family,
                                       "actual": dep.drafter_family}))
    return family + configdiff.config_findings(kept)


def target_findings(contract: Contract, target: Path | None) -> list[Finding]:
    """The contract's target fingerprints against the deployed target directory (compare/target.py)."""
    if target is None:
        return []
    from specparity.compare.target import target_findings
    from specparity.training.hfdir import read_target

    return target_findings(contract.target, read_target(target))
