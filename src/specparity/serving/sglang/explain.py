"""``specparity explain`` on SGLang (``SglangEngine.explain``): what SGLang will feed the drafter's fc, and how. No contract.

One static resolution (``serving.sglang.client.resolve_deployment``: SGLang's own ServerArgs, the real target and
draft classes built on the meta device, the real ``set_eagle3_layers_to_capture``) turned into an
:class:`Explanation`: the served sources in fc order, which config key the ids came from, the rule the
target's model file applied (with its SGLang file:line), any fallback to the default and why, the fc
width against the checkpoint, and the speculative settings after SGLang's rewrite.

The rule is quoted from the release that resolved: the setters that ran, as the child cited them from the
installed SGLang (``ResolvedDeployment.capture_rule_source``, serving/sglang/setter_source.py); 0.5.23's
remembered lines are a last resort, labelled as 0.5.23's.

Exit codes follow what is printed (and agree with ``specparity gate``, which renders the same adapter notes as
findings, compare.findings.adapter_findings): 0 resolved and nothing wrong; 1 SGLang refuses the deployment, would serve fewer
states than fc takes, or an ``error`` adapter note says it does not serve what the draft config says (e.g. family
A's draft_ids_ignored, config_mismatch); 2 malformed input; 3 environment (SGLang missing, unsupported, crashed,
timed out) or an answer specparity could not compute (a default taken for no recorded reason).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specparity.drafters import DrafterFamily
from specparity.errors import EXIT_BAD_INPUT, EXIT_ENVIRONMENT, EXIT_PARITY_FAILURE, EXIT_PASS
from specparity.idrules import sglang
from specparity.idrules.sglang import ArchFamily, arch_family, parse_version
from specparity.serving.explain_families import family_data, family_lines
from specparity.serving.results import Explanation, ResolvedDeployment, ServingFailure
from specparity.serving.sglang.setter_source import citation_text

IDS_KEY = "eagle_config.eagle_aux_hidden_state_layer_ids"
DFLASH_IDS_KEY = "dflash_config.target_layer_ids"
# the DFlash path's rule (sglang 0.5.23 model_runner_components/spec_aux_hidden_state.py:199-283, then the target's
# set_dflash_layers_to_capture, e.g. models/qwen3.py:793-805): ids name layer outputs, so the setter stores id + 1;
# without ids SGLang picks them itself (speculative/dflash_utils.py:348-385)
_DFLASH_RULE = ("DFlash: boundary = id + 1 (id k = layer:k), default ids build_target_layer_ids(L, draft layers) "
                "= evenly from 1 to L-3")
# the DSpark path (model_runner_components/spec_aux_hidden_state.py:260-277): the ids its own parse names
# (speculative/dspark_components/dspark_config.py:214-322), else DFlash's default; the target's
# set_dspark_layers_to_capture where it has one, else its set_dflash_layers_to_capture (attention_backend_setup.py:62-66)
DSPARK_IDS_KEY = "target_layer_ids"
_DSPARK_RULE = ("DSpark: id k = layer:k (the target's set_dflash_layers_to_capture stores id + 1), default ids "
                "DFlash's build_target_layer_ids(L, draft layers) = evenly from 1 to L-3")
# Where sglang 0.5.23 keeps each setter family's rule (domain.md §3.1). A last resort, quoted only when the child
# recorded no setter (capture_rule_source empty), and then labelled as 0.5.23's.
_RULES: dict[ArchFamily, str] = {
    ArchFamily.LLAMA: "models/llama.py:929-941",
    ArchFamily.DEEPSEEK: "models/deepseek_v2.py:3458-3473",
    ArchFamily.GPT_OSS: "models/gpt_oss.py:1337-1352",
    ArchFamily.MINIMAX_M3: "models/minimax_m3_vl.py:246-262",
}
_DELEGATES = {"KimiK25ForConditionalGeneration": "models/kimi_k25.py:928-939",
              "Llama4ForConditionalGeneration": "models/mllama4.py:971-973"}
# The releases a setter family's rule changed in (domain.md §7): D6 DeepSeek's first-id rule, D7 gpt_oss's boundaries
_DEEPSEEK_FIRST_ID = parse_version("0.5.13")
_GPT_OSS_BOUNDARIES = parse_version("0.5.17")
_ENVIRONMENT = frozenset({"sglang_missing", "engine_import", "unsupported_version", "timeout", "child_crashed",
                          "needs_hardware"})


def _applied(dep: ResolvedDeployment) -> str:
    ids = dep.draft_config_ids
    if not dep.ids_read:
        return "the default stored whatever the draft config says"
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
        problems.append("k*H_t == H_d: SGLang skips fc entirely (sglang 0.5.23 models/llama_eagle3.py:238)")
    return f"fc       {built} as SGLang constructs it; {ckpt}", problems


def _rule_words(dep: ResolvedDeployment, family: ArchFamily) -> str:
    """The rule of this release's setter family, in words, with the default it stores for this target."""
    try:
        v = parse_version(dep.engine_version)
        stored = sglang.default_boundaries(dep.num_layers, architecture=dep.target_architecture,
                                           version=dep.engine_version)
        default = f"default boundaries {list(stored)}"
    except ValueError:
        v, default = (), "default boundaries [2, L//2, L-3]"
    if not dep.ids_read:
        return f"the setter takes no ids: always the {default}"
    if family is ArchFamily.DEEPSEEK and v >= _DEEPSEEK_FIRST_ID:
        words = "boundary = id + 1 only when the first id is 1, otherwise the ids are boundaries"
    elif family is ArchFamily.GPT_OSS and v >= _GPT_OSS_BOUNDARIES:
        words = "ids are boundaries when max(ids) == L, otherwise boundary = id + 1"
    else:
        words = "boundary = id + 1"
    return f"{words}, {default}"


def _rule(dep: ResolvedDeployment, family: ArchFamily) -> tuple[str, dict[str, Any]]:
    """The rule line and its JSON: the setters that ran on the resolved release, else 0.5.23's lines, labelled."""
    words = {DrafterFamily.DFLASH.value: _DFLASH_RULE, DrafterFamily.DSPARK.value: _DSPARK_RULE}.get(
        dep.drafter_family or "") or _rule_words(dep, family)
    cites = dep.capture_rule_source
    if cites:
        *outer, inner = cites
        where = f"sglang {dep.engine_version} " + "".join(f"{citation_text(c)} delegates to " for c in outer)
        where += citation_text(inner)
        sources = [{"function": f, "file": path, "first_line": a, "last_line": b, "code": code,
                    "role": "delegates" if i < len(outer) else "rule"}
                   for i, (f, path, a, b, code) in enumerate(cites)]
        return f"{words} ({where})", {"cited_release": dep.engine_version, "sources": sources}
    where = _RULES[family]
    if dep.target_architecture in _DELEGATES:
        where += f"; {dep.target_architecture} delegates to its language model ({_DELEGATES[dep.target_architecture]})"
    label = ("" if dep.engine_version == "0.5.23" else
             f"; not sglang {dep.engine_version}'s own lines: its setter was not recorded")
    return f"{words} (as read in sglang 0.5.23: {where}{label})", {"cited_release": "0.5.23", "sources": []}


def _ids(dep: ResolvedDeployment) -> tuple[str, str, list[int] | None, str | None]:
    """``(ids line, ids_source, draft_ids for the JSON, why the answer is unknown or None)``."""
    v = dep.engine_version
    key = {DrafterFamily.DFLASH.value: DFLASH_IDS_KEY, DrafterFamily.DSPARK.value: DSPARK_IDS_KEY}.get(
        dep.drafter_family or "", IDS_KEY)
    if not dep.ids_read:  # family A (D1): the release never reads them
        asked = dep.ignored_config_ids
        source = f"draft config.json, ignored by sglang {v} (its setter takes no ids)"
        if asked is None:
            return (f"ids      none in the draft config; sglang {v} reads no draft ids anyway (its setter takes "
                    "none)", source, None, None)
        return (f"ids      {list(asked)} in the draft config, ignored: sglang {v} reads no draft ids (its setter "
                "takes none), so the target captures its default", source, list(asked), None)
    if dep.draft_config_ids is not None:
        return (f"ids      {list(dep.draft_config_ids)} from draft config.json: {key}",
                f"draft config.json: {key}", list(dep.draft_config_ids), None)
    if dep.ids_fallback_reason is None:
        unknown = (f"sglang {v} took its default ids, and specparity recorded no reason why (the adapter could not "
                   "read what its id reader saw)")
        return f"ids      none reached the target: {unknown}", "SGLang default: unknown", None, unknown
    return (f"ids      none reached the target (SGLang default: {dep.ids_fallback_reason})",
            f"SGLang default: {dep.ids_fallback_reason}", None, None)


def _note_status(dep: ResolvedDeployment) -> str:
    """``pass``, ``fail`` or ``error``: what the gate makes of the same adapter notes (compare.findings.adapter_findings,
    status_of), so that explain and gate never disagree on them."""
    from specparity.compare.findings import adapter_findings, status_of

    return status_of(adapter_findings(dep))


def explain_resolved(dep: ResolvedDeployment) -> Explanation:
    """The explanation of a successful static resolution."""
    family = arch_family(dep.target_architecture)
    rule, rule_data = _rule(dep, family)
    ids_line, ids_source, draft_ids, unknown = _ids(dep)
    fc_line, problems = _fc_line(dep)
    if dep.unreachable_boundaries:
        problems.insert(0, f"boundaries {list(dep.unreachable_boundaries)} are never reached by "
                           f"{dep.target_architecture}'s layer loop: fewer states than configured")
    spec = dep.resolved_spec
    served = ", ".join(dep.served_sources) or "nothing"
    shown = [(kind, sev, msg) for kind, sev, msg, _ in dep.adapter_notes if kind != "resolution_note"]
    errors = [kind for kind, sev, _ in shown if sev == "error"]
    lines = [
        f"target   {dep.target_architecture}: {dep.num_layers} layers, hidden {dep.target_hidden_size}, "
        f"{dep.target_dtype} (sglang {dep.engine_version})",
        f"draft    {dep.draft_model_class or dep.draft_architecture}: hidden {dep.draft_hidden_size}",
        *family_lines(dep),
        ids_line,
        f"rule     {rule}: {_applied(dep)}",
        f"capture  layers_to_capture {list(dep.layers_to_capture)} on {dep.capture_owner or 'model'}",
        f"serves   {served} (fc order)",
        fc_line,
        f"spec     steps {spec.num_steps}, topk {spec.eagle_topk}, draft tokens {spec.num_draft_tokens}"
        + (f" (requested {dep.requested_spec.to_dict()})" if any(dep.requested_spec.to_dict().values()) else ""),
        *(f"note     {n}" for n in (*dep.notes, *dep.spec_warnings)),
        *(f"{sev:<8} {kind}: {msg}" for kind, sev, msg in shown),
        *(f"problem  {p}" for p in problems),
    ]
    data = {
        "engine": "sglang", "engine_version": dep.engine_version, "target_architecture": dep.target_architecture,
        "num_layers": dep.num_layers, "target_hidden_size": dep.target_hidden_size,
        "draft_architecture": dep.draft_model_class or dep.draft_architecture,
        "draft_ids": draft_ids, "ids_read": dep.ids_read, "ids_source": ids_source,
        "convention": {"family": family.value, "rule": rule, "applied": _applied(dep), **rule_data},
        "layers_to_capture": list(dep.layers_to_capture), "capture_owner": dep.capture_owner,
        "served_sources": list(dep.served_sources), "ids_fallback": dep.ids_fallback_reason,
        "fc_in_features": dep.draft_fc_module[0] if dep.draft_fc_module else dep.fc_in_features,
        "fc_checkpoint": {"in_features": dep.fc_in_features, "out_features": dep.fc_out_features,
                          "bias": dep.fc_bias} if dep.fc_source == "checkpoint" else None,
        "fc_applied": dep.fc_applied, "resolved_spec": dep.resolved_spec.to_dict(),
        "requested_spec": dep.requested_spec.to_dict(), "server_args": dep.server_args,
        "notes": list(dep.notes), "problems": problems, "unknown": [unknown] if unknown else [],
        "adapter_notes": [{"kind": k, "severity": sev, "message": m, "cite": c} for k, sev, m, c in dep.adapter_notes],
        **family_data(dep),
    }
    status = _note_status(dep)
    head = f"SGLang {dep.engine_version} feeds fc {served}"
    if problems:
        code, summary = EXIT_PARITY_FAILURE, (f"SGLang {dep.engine_version} would not serve this drafter as built: "
                                              f"{problems[0]}")
    elif status == "fail":
        code, summary = EXIT_PARITY_FAILURE, (f"{head}, yet the deployment does not serve what the draft config "
                                              f"says ({', '.join(errors)}: see the error lines)")
    elif unknown or status == "error":
        code = EXIT_ENVIRONMENT
        summary = f"{head}, but the answer is incomplete: {unknown or ', '.join(errors)}"
        if unknown:
            lines.append(f"unknown  {unknown}")
    else:
        code, summary = EXIT_PASS, head
    return Explanation(code, summary, data, tuple(lines))


def explain_failure(failure: ServingFailure) -> Explanation:
    """A refusal (exit 1), bad input (2) or an environment problem (3), with what to do."""
    if failure.kind == "needs_hardware":  # a hardware-only validation is a note, not a crash
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
    from specparity.serving.sglang.client import resolve_deployment

    dep = resolve_deployment(target, draft, server_args=dict(sglang_args), device="cpu", python=python,
                             timeout_s=timeout_s)
    if not isinstance(dep, ResolvedDeployment):
        return explain_failure(dep)
    return with_shift_hint(explain_resolved(dep), dep, draft)


def with_shift_hint(e: Explanation, dep: ResolvedDeployment, draft: Path) -> Explanation:
    """The converse of vLLM's hint (idrules/vllm_shapes.py): ids that look like vLLM's/speculators' (a top-level key,
    or vLLM's default list) mean one layer earlier there than SGLang serves them. A warning: ``--strict`` exits 1."""
    import json
    from dataclasses import replace

    from specparity.idrules.vllm_shapes import sglang_shift_hint

    try:
        cfg = json.loads((draft / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return e
    hint = sglang_shift_hint(cfg if isinstance(cfg, dict) else {}, dep.draft_config_ids, list(dep.served_sources),
                             num_layers=dep.num_layers) if dep.ids_read else None
    if hint is None:
        return e
    note = {"kind": "engine_convention_mismatch", "severity": "warning", "message": hint,
            "cite": "vllm/model_executor/models/interfaces.py (id k = hidden_states[k])"}
    data = {**e.data, "adapter_notes": [*(e.data.get("adapter_notes") or []), note]}
    return replace(e, data=data, lines=(*e.lines, f"warning  engine_convention_mismatch: {hint}"))
