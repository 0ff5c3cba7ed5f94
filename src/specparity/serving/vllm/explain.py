"""``specparity explain --engine vllm`` (``VllmEngine.explain``): what vLLM will feed the drafter's fc, and how.

One static resolution through vLLM's own code (``serving.vllm.client.resolve_deployment``: ``EngineArgs
.create_engine_config`` with its ``SpeculativeConfig``, and ``GPUModelRunner._get_eagle3_aux_layers_from_config``),
no weights loaded, explained with vLLM's id rules (:mod:`specparity.idrules.vllm`): which key the
ids came from, that id ``k`` is ``hidden_states[k]`` (no ``+1``), the default when there are none, and fc's width.
Exit codes as :mod:`specparity.serving.sglang.explain`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specparity.errors import EXIT_BAD_INPUT, EXIT_ENVIRONMENT, EXIT_PARITY_FAILURE, EXIT_PASS, InputError
from specparity.serving.explain_families import family_data, family_lines
from specparity.serving.results import Explanation, ResolvedDeployment, ServingFailure

_ENVIRONMENT = frozenset({"vllm_missing", "unsupported_version", "timeout", "child_crashed", "internal_error",
                          "engine_import", "needs_hardware"})
IDS_KEY = "eagle_aux_hidden_state_layer_ids"
DFLASH_FC = "vllm 0.32 model_executor/models/qwen3_dflash.py:108-117 (_get_dflash_fc_input_size)"
RULE = ("id k = boundary k = hidden_states[k], no +1 (vllm/model_executor/models/interfaces.py:1601-1611, "
        "models/llama.py:428-441); sorted and deduplicated (interfaces.py:1577-1578)")


def explain_vllm_resolved(dep: ResolvedDeployment, draft_config: Mapping[str, object]) -> Explanation:
    """The explanation of vLLM's static resolution."""
    from specparity.idrules.vllm import drafter_aux_count, read_ids

    read = read_ids(draft_config, num_layers=dep.num_layers, version=dep.engine_version)
    ids_source = (f"draft config.json: {read.key}" if read.key is not None else
                  f"vLLM default (2, L//2, L-3): {dep.ids_fallback_reason}")
    notes = _warnings(dep, draft_config, read)
    problems = []
    if dep.unreachable_boundaries:
        problems.append(f"boundaries {list(dep.unreachable_boundaries)} are outside 0..{dep.num_layers}")
    if dep.drafter_family == "dflash":  # fc sized by vLLM's own function in the child (serving/vllm/drafter_static.py)
        k, why = dep.num_aux_hidden_states, "the dflash ids' count, else the draft's num_hidden_layers; " + DFLASH_FC
    else:  # llama_eagle3.py:209-216 and deepseek_eagle3.py:189-199 read the same keys
        k, why = drafter_aux_count(draft_config), "num_aux_hidden_states, else the nested eagle_config ids"
    if len(dep.served_sources) != k:
        problems.append(f"the target captures {len(dep.served_sources)} states ({len(dep.served_sources)} x "
                        f"{dep.target_hidden_size} values) but the drafter's fc takes {k} ({why}): vLLM fails at "
                        "the first draft step or feeds a wrong width")
    served = ", ".join(dep.served_sources) or "nothing"
    spec = dep.resolved_spec
    lines = (
        f"target   {dep.target_architecture}: {dep.num_layers} layers, hidden {dep.target_hidden_size}, "
        f"{dep.target_dtype} (vllm {dep.engine_version})",
        f"draft    {dep.draft_architecture}: hidden {dep.draft_hidden_size}",
        *family_lines(dep),
        f"ids      {list(read.ids) if read.ids is not None else 'none'} from {ids_source}",
        f"rule     {rule_line(dep.engine_version)}",
        f"capture  aux_hidden_state_layers {list(dep.layers_to_capture)}",
        f"serves   {served} (fc order)",
        f"fc       {dep.fc_in_features} -> {dep.fc_out_features} ({dep.fc_source})",
        f"spec     num_speculative_tokens {spec.num_steps} (one chain)",
        *(f"{n['severity']:<8} {n['kind']}: {n['message']}" for n in notes),
        *(f"problem  {p}" for p in problems),
    )
    data = {"engine": "vllm", "engine_version": dep.engine_version, "target_architecture": dep.target_architecture,
            "num_layers": dep.num_layers, "draft_ids": list(read.ids) if read.ids is not None else None,
            "ids_source": ids_source, "convention": {"rule": RULE}, "layers_to_capture": list(dep.layers_to_capture),
            "served_sources": list(dep.served_sources), "ids_fallback": dep.ids_fallback_reason,
            "fc_in_features": dep.fc_in_features, "resolved_spec": spec.to_dict(), "problems": problems,
            "adapter_notes": notes, **family_data(dep)}
    code = EXIT_PARITY_FAILURE if problems else EXIT_PASS
    summary = (f"vLLM {dep.engine_version} feeds fc {served}" if not problems
               else f"vLLM {dep.engine_version} would not serve this drafter as built: {problems[0]}")
    return Explanation(code, summary, data, lines)


def rule_line(version: str) -> str:
    """How ``version`` reads and captures ids, with its own file:line (idrules/vllm_releases.py)."""
    from specparity.idrules.vllm_releases import code_of, loop_rule, reader_rule

    code = code_of(version)
    where = f"vllm/{code.reader}" if code.reader else "no reader"
    return (f"{reader_rule(version).words} ({where}); id k = boundary k = hidden_states[k], no +1: "
            f"{loop_rule(version).words} (vllm/{code.loop}); default vllm/{code.default}")


def _warnings(dep: ResolvedDeployment, draft_config: Mapping[str, Any], read: Any) -> list[dict[str, Any]]:
    """What a user must hear before a contract exists (warnings: ``--strict`` exits 1 on them): the silent default
    fallback, by its exact shape, and the cross-engine shift of SpecForge-style ids (idrules/vllm_shapes.py)."""
    from specparity.idrules.vllm import READ_PATHS
    from specparity.idrules.vllm_releases import reader_rule
    from specparity.idrules.vllm_shapes import fallback_shape, vllm_shift_hint

    notes: list[dict[str, Any]] = [{"kind": k, "severity": sev, "message": m, "cite": c}
                                   for k, sev, m, c in dep.adapter_notes]
    if read.ids is None and dep.drafter_family == "dflash":
        pass  # the DFlash path's own fallback note, from the child (serving/vllm/drafter_static.py)
    elif read.ids is None:
        shape = fallback_shape(draft_config, reads=READ_PATHS[reader_rule(dep.engine_version).name])
        what = f"{shape.shape}: {shape.message}" if shape else "vLLM's reader returned no ids"
        notes.append({"kind": "default_ids_fallback", "severity": "warning", "shape": shape.shape if shape else None,
                      "message": f"vLLM reads no aux layer ids ({what}) and silently serves its default (2, L//2, "
                                 f"L-3) = {', '.join(dep.served_sources)}; a drafter trained on other layers "
                                 f"loses its acceptance with no error (vllm-project/vllm#50170: 1.21% against "
                                 f"58.9%). Write the ids the drafter was trained on as the top-level {IDS_KEY}",
                      "cite": "vllm/v1/worker/gpu_model_runner.py _get_eagle3_aux_layers_from_config; "
                              "model_executor/models/interfaces.py get_eagle3_default_aux_hidden_state_layers"})
    else:
        hint = vllm_shift_hint(list(read.ids), read.key, list(dep.served_sources), num_layers=dep.num_layers)
        if hint is not None:
            notes.append({"kind": "engine_convention_mismatch", "severity": "warning", "message": hint,
                          "cite": RULE})
    return notes


def explain_vllm_failure(failure: ServingFailure) -> Explanation:
    if failure.kind == "internal_error":  # ours, never vLLM's (worker.exception_failure)
        return Explanation(EXIT_ENVIRONMENT, f"specparity failed (internal_error): {failure.message}",
                           {"engine": "vllm", "error": failure.to_dict()})
    if failure.kind in _ENVIRONMENT:
        return Explanation(EXIT_ENVIRONMENT, f"vLLM could not run: {failure.message}",
                           {"engine": "vllm", "error": failure.to_dict()})
    if failure.kind == "bad_deployment":
        return Explanation(EXIT_BAD_INPUT, failure.message, {"engine": "vllm", "error": failure.to_dict()})
    return Explanation(EXIT_PARITY_FAILURE, f"vLLM refuses the deployment: {failure.message}",
                       {"engine": "vllm", "error": failure.to_dict()})


def explain_vllm(target: Path, draft: Path, *, engine_args: Mapping[str, object], python: str | None = None,
                 timeout_s: float = 600) -> Explanation:
    """Resolve (target, draft, args) with vLLM's own code and explain the result."""
    from specparity.serving.vllm.client import resolve_deployment

    try:
        cfg = json.loads((draft / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read the draft config: {e}", path=draft / "config.json") from None
    dep = resolve_deployment(target, draft, engine_args=dict(engine_args), python=python, timeout_s=timeout_s)
    return explain_vllm_resolved(dep, cfg) if isinstance(dep, ResolvedDeployment) else explain_vllm_failure(dep)
