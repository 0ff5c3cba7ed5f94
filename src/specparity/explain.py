"""``specparity explain``: what SGLang will feed the drafter's fc, and how it got there. No contract.

One static resolution (``serving.resolve_deployment``: SGLang's own ServerArgs, the real target and
draft classes built on the meta device, the real ``set_eagle3_layers_to_capture``) turned into an
:class:`Explanation`: the served sources in fc order, which config key the ids came from, the rule the
target's model file applied (with its SGLang file:line), any fallback to the default and why, the fc
width against the checkpoint, and the speculative settings after SGLang's rewrite.

Exit codes: 0 resolved; 1 SGLang refuses the deployment (or would serve fewer states than fc takes);
2 malformed input; 3 environment (SGLang missing, unsupported, crashed, timed out).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specparity.contract.sglang_capture import ArchFamily, arch_family
from specparity.errors import EXIT_BAD_INPUT, EXIT_ENVIRONMENT, EXIT_PARITY_FAILURE, EXIT_PASS, InputError
from specparity.serving import ResolvedDeployment, ServingFailure

IDS_KEY = "eagle_config.eagle_aux_hidden_state_layer_ids"
# sglang 0.5.23 rules, by the setter family of the target's model file (domain.md §3.1)
_RULES: dict[ArchFamily, str] = {
    ArchFamily.LLAMA: "boundary = id + 1, default [2, L//2, L-3] (models/llama.py:929-941)",
    ArchFamily.DEEPSEEK: "boundary = id + 1 only when the first id is 1, otherwise the ids are boundaries "
                         "(models/deepseek_v2.py:3458-3473)",
    ArchFamily.GPT_OSS: "ids are boundaries when max(ids) == L, otherwise boundary = id + 1 "
                        "(models/gpt_oss.py:1337-1352)",
    ArchFamily.MINIMAX_M3: "boundary = id + 1, also on the default (models/minimax_m3_vl.py:246-262)",
}
_DELEGATES = {"KimiK25ForConditionalGeneration": "models/kimi_k25.py:928-939",
              "Llama4ForConditionalGeneration": "models/mllama4.py:971-973"}
_ENVIRONMENT = frozenset({"sglang_missing", "unsupported_version", "timeout", "child_crashed", "needs_hardware"})


@dataclass(frozen=True)
class Explanation:
    """The answer to "what will SGLang feed fc?", as one JSON-able record."""

    exit_code: int
    summary: str
    data: dict[str, Any] = field(default_factory=dict)
    lines: tuple[str, ...] = ()


def _applied(dep: ResolvedDeployment) -> str:
    ids = dep.draft_config_ids
    if ids is None:
        return "SGLang's default (no ids reached the target)"
    got = list(dep.layers_to_capture)
    if got == [i + 1 for i in ids]:
        return "+1 applied (id v -> boundary v+1 = layer:v)"
    if got == list(ids):
        return "ids taken as boundaries (no +1: id v -> layer:v-1)"
    return f"stored {got}"


def _fc_line(dep: ResolvedDeployment) -> tuple[str, list[str]]:
    problems: list[str] = []
    module = dep.draft_fc_module
    built = f"Linear({module[0]} -> {module[1]}, bias={module[2]})" if module else "no fc module"
    if dep.fc_source == "checkpoint":
        ckpt = f"checkpoint fc.weight [{dep.fc_out_features}, {dep.fc_in_features}]"
        if module and (module[0], module[1]) != (dep.fc_in_features, dep.fc_out_features):
            problems.append(f"SGLang builds fc as {built} but the checkpoint's fc.weight is "
                            f"[{dep.fc_out_features}, {dep.fc_in_features}]: its loader refuses the weight")
    else:
        ckpt = "checkpoint has no fc.weight (SGLang would keep fc's random init)"
    width = len(dep.served_sources) * dep.target_hidden_size
    if module and module[0] is not None and width != module[0] and dep.fc_applied:
        problems.append(f"the target serves {len(dep.served_sources)} state(s) x {dep.target_hidden_size} = {width} "
                        f"values but fc takes {module[0]}: SGLang fails or feeds a wrong width")
    if not dep.fc_applied:
        problems.append("k*H_t == H_d: SGLang skips fc entirely (models/llama_eagle3.py:238)")
    return f"fc       {built} as SGLang constructs it; {ckpt}", problems


def explain_resolved(dep: ResolvedDeployment) -> Explanation:
    """The explanation of a successful static resolution."""
    family = arch_family(dep.target_architecture)
    rule = _RULES[family]
    if dep.target_architecture in _DELEGATES:
        rule += f"; {dep.target_architecture} delegates to its language model ({_DELEGATES[dep.target_architecture]})"
    ids_source = (f"draft config.json: {IDS_KEY}" if dep.draft_config_ids is not None
                  else f"SGLang default: {dep.ids_fallback_reason}")
    fc_line, problems = _fc_line(dep)
    if dep.unreachable_boundaries:
        problems.insert(0, f"boundaries {list(dep.unreachable_boundaries)} are never reached by "
                           f"{dep.target_architecture}'s layer loop: fewer states than configured")
    spec = dep.resolved_spec
    served = ", ".join(dep.served_sources) or "nothing"
    lines = [
        f"target   {dep.target_architecture}: {dep.num_layers} layers, hidden {dep.target_hidden_size}, "
        f"{dep.target_dtype} (sglang {dep.sglang_version})",
        f"draft    {dep.draft_model_class or dep.draft_architecture}: hidden {dep.draft_hidden_size}",
        f"ids      {list(dep.draft_config_ids) if dep.draft_config_ids is not None else 'none'} from {ids_source}",
        f"rule     {rule}: {_applied(dep)}",
        f"capture  layers_to_capture {list(dep.layers_to_capture)} on {dep.capture_owner or 'model'}",
        f"serves   {served} (fc order)",
        fc_line,
        f"spec     steps {spec.num_steps}, topk {spec.eagle_topk}, draft tokens {spec.num_draft_tokens}"
        + (f" (requested {dep.requested_spec.to_dict()})" if any(dep.requested_spec.to_dict().values()) else ""),
        *(f"note     {n}" for n in (*dep.notes, *dep.spec_warnings)),
        *(f"{sev:<8} {kind}: {msg}" for kind, sev, msg, _ in dep.adapter_notes if kind != "resolution_note"),
        *(f"problem  {p}" for p in problems),
    ]
    data = {
        "engine": "sglang", "engine_version": dep.sglang_version, "target_architecture": dep.target_architecture,
        "num_layers": dep.num_layers, "target_hidden_size": dep.target_hidden_size,
        "draft_architecture": dep.draft_model_class or dep.draft_architecture,
        "draft_ids": list(dep.draft_config_ids) if dep.draft_config_ids is not None else None,
        "ids_source": ids_source, "convention": {"family": family.value, "rule": rule, "applied": _applied(dep)},
        "layers_to_capture": list(dep.layers_to_capture), "capture_owner": dep.capture_owner,
        "served_sources": list(dep.served_sources), "ids_fallback": dep.ids_fallback_reason,
        "fc_in_features": dep.draft_fc_module[0] if dep.draft_fc_module else dep.fc_in_features,
        "fc_checkpoint": {"in_features": dep.fc_in_features, "out_features": dep.fc_out_features,
                          "bias": dep.fc_bias} if dep.fc_source == "checkpoint" else None,
        "fc_applied": dep.fc_applied, "resolved_spec": dep.resolved_spec.to_dict(),
        "requested_spec": dep.requested_spec.to_dict(), "server_args": dep.server_args,
        "notes": list(dep.notes), "problems": problems,
        "adapter_notes": [{"kind": k, "severity": sev, "message": m, "cite": c} for k, sev, m, c in dep.adapter_notes],
    }
    code = EXIT_PARITY_FAILURE if problems else EXIT_PASS
    summary = (f"SGLang {dep.sglang_version} feeds fc {served}" if not problems
               else f"SGLang {dep.sglang_version} would not serve this drafter as built: {problems[0]}")
    return Explanation(code, summary, data, tuple(lines))


def explain_failure(failure: ServingFailure) -> Explanation:
    """A refusal (exit 1), bad input (2) or an environment problem (3), with what to do."""
    if failure.kind == "needs_hardware":  # issue 12: a hardware-only validation is a note, not a crash
        todo = "run explain on a machine with the deployment's GPU; nothing here says the deployment is wrong"
        return Explanation(EXIT_ENVIRONMENT, f"SGLang cannot resolve this deployment on this machine: {failure.message}",
                           {"engine": "sglang", "error": failure.to_dict(), "notes": [failure.message],
                            "what_to_do": todo}, (f"note     {failure.message}", f"do       {todo}"))
    if failure.kind in _ENVIRONMENT:
        return Explanation(EXIT_ENVIRONMENT, f"SGLang could not run: {failure.message}",
                           {"engine": "sglang", "error": failure.to_dict()})
    if failure.kind == "bad_deployment":
        return Explanation(EXIT_BAD_INPUT, failure.message, {"engine": "sglang", "error": failure.to_dict()})
    todo = ("convert the draft config as described above" if failure.kind == "draft_unreadable"
            else "fix the deployment SGLang names above (server args, draft config or target), then explain again")
    return Explanation(EXIT_PARITY_FAILURE, f"SGLang refuses the deployment: {failure.message}",
                       {"engine": "sglang", "error": failure.to_dict(), "what_to_do": todo}, (f"do       {todo}",))


def explain(target: Path, draft: Path, *, sglang_args: Mapping[str, object], python: str | None = None,
            timeout_s: float = 600) -> Explanation:
    """Resolve (target, draft, args) with SGLang's own code and explain the result."""
    from specparity.serving import resolve_deployment

    for role, p in (("--target", target), ("--draft", draft)):
        if not (p / "config.json").is_file():
            raise InputError("not a model directory (no config.json)", path=p, field=role)
    dep = resolve_deployment(target, draft, server_args=dict(sglang_args), device="cpu", python=python,
                             timeout_s=timeout_s)
    return explain_resolved(dep) if isinstance(dep, ResolvedDeployment) else explain_failure(dep)
