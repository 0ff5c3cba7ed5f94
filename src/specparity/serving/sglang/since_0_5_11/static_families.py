"""The static level's pieces for drafters other than the Llama-style EAGLE-3 head on SGLang 0.5.23: the
DFlash path's own reading of its ids and block size, the notes a family's defaults give, and the meta build's server
args where SGLang refuses the algorithm on this machine's platform.

Everything here is read from SGLang's own objects after its own functions ran (``resolve_spec_aux_hidden_state_config``,
``parse_dflash_draft_config``, ``resolved_view``); nothing re-derives a rule. This module imports sglang: use it only
inside the serving child process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specparity.drafters import DrafterFamily
from specparity.serving.results import ResolvedDeployment
from specparity.serving.sglang.engine_messages import exception_failure

# sglang 0.5.23: where the DFlash path takes its ids, its default and its block size
DFLASH_IDS = "model_runner_components/spec_aux_hidden_state.py:199-283 (_resolve_dflash_aux_hidden_state)"
DFLASH_DEFAULT = "speculative/dflash_utils.py:348-385 (build_target_layer_ids) via :556-585 (resolve_target_layer_ids)"
DFLASH_OFFSET = "the target's set_dflash_layers_to_capture, e.g. models/qwen3.py:793-805 and models/llama.py:943-953"
DFLASH_BLOCK = "arg_groups/speculative_hook.py:368-425 (_handle_dflash: speculative_num_draft_tokens = block size)"
# sglang 0.5.23: the DSpark path runs the DFlash one, then takes the ids its own parse names
# (model_runner_components/spec_aux_hidden_state.py:260-277, speculative/dspark_components/dspark_config.py:214-322:
# dspark_target_layer_ids, else dflash_config's or the top-level target_layer_ids); the setter is the target's
# set_dspark_layers_to_capture where it has one, else set_dflash_layers_to_capture (attention_backend_setup.py:62-66);
# speculative_num_draft_tokens = gamma + 1 (arg_groups/speculative_hook.py:806-839, _handle_dspark)
DSPARK_IDS = ("model_runner_components/spec_aux_hidden_state.py:260-277 (_resolve_dflash_aux_hidden_state, "
              "DSpark branch; parse_dspark_draft_config at speculative/dspark_components/dspark_config.py:214-322)")


@dataclass(frozen=True)
class DflashFacts:
    """What SGLang's DFlash path made of the draft config: the ids it names (None: it names none), why SGLang then
    took its default, and the block size the speculative settings resolved to."""

    config_ids: list[int] | None
    fallback_reason: str | None
    block_size: int | None


def dflash_facts(spec: Any, draft_hf: Any, sa: Any) -> DflashFacts:
    """The DFlash facts from SGLang's own parse of the draft config and its resolved server args (a DSpark
    drafter's from its own parse: its ids, and its block gamma, which SGLang serves as gamma + 1 draft tokens)."""
    from sglang.srt.arg_groups.model_override_base import resolved_view
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

    view = resolved_view(sa)
    block = getattr(view, "speculative_num_draft_tokens", None)
    if spec.is_dspark:
        from sglang.srt.speculative.dspark_components.dspark_config import (
            dspark_gamma_from_num_draft_tokens,
            parse_dspark_draft_config,
        )

        parsed_ds = parse_dspark_draft_config(draft_hf_config=draft_hf)
        named = None if parsed_ds.target_layer_ids is None else [int(i) for i in parsed_ds.target_layer_ids]
        reason = None
        if named is None:
            reason = (f"the DSpark config names no target_layer_ids: SGLang picks {list(spec.dflash_target_layer_ids)} "
                      f"for {spec.dflash_draft_num_layers} draft layers, DFlash's default (sglang 0.5.23 "
                      f"{DFLASH_DEFAULT}, kept by {DSPARK_IDS})")
        gamma = dspark_gamma_from_num_draft_tokens(int(block)) if block is not None else None
        return DflashFacts(named, reason, gamma)
    parsed = parse_dflash_draft_config(draft_hf_config=draft_hf)
    named = None if parsed.target_layer_ids is None else [int(i) for i in parsed.target_layer_ids]
    reason = None
    if named is None:
        reason = (f"dflash_config.target_layer_ids is not set: SGLang picks {list(spec.dflash_target_layer_ids)} "
                  f"for {spec.dflash_draft_num_layers} draft layers (sglang 0.5.23 {DFLASH_DEFAULT})")
    return DflashFacts(named, reason, int(block) if block is not None else None)


def build_server_args(sa: Any, build_kw: dict[str, Any], construct: Any, notes: list[str]) -> Any:
    """The server args the meta build runs under: SGLang's own resolution of ``build_kw`` (this machine's device,
    one rank), or, where SGLang refuses the deployment's algorithm on this machine's platform (DFLASH on CPU, sglang
    0.5.23 ``arg_groups/speculative_hook.py:287-300``), the same with the deployment's own device: the models are
    built on the meta device, never run, so the platform's refusal to serve the algorithm says nothing about them.
    Where that fails too, SGLang's first refusal stands."""
    try:
        return construct(build_kw)[0]
    except Exception as exc:
        if build_kw.get("device") == getattr(sa, "device", None):
            raise
        kept = {**build_kw, "device": sa.device}
        try:
            built = construct(kept)[0]
        except Exception:
            raise exc from None
        notes.append(f"meta build: on this machine's platform SGLang refuses '{exception_failure(exc).message}'; "
                     f"the models were built on the meta device under device={sa.device}, as deployed")
        return built


def family_notes(request: Any, family: DrafterFamily, dep: ResolvedDeployment,
                 dflash: DflashFacts | None) -> tuple[tuple[str, str, str, str], ...]:
    """The notes a family gives: the algorithm specparity assumed where the deployment names none, and the engine's
    default ids where the draft config names none (warnings: ``explain --strict`` exits 1 on each)."""
    if family is DrafterFamily.EAGLE3:
        return ()
    notes: list[tuple[str, str, str, str]] = []
    if not request.server_args.get("speculative_algorithm"):
        notes.append(("speculative_algorithm_assumed", "warning",
                      f"the deployment names no --speculative-algorithm; a {family.label} is served with "
                      f"{dep.speculative_algorithm}, which specparity assumed from the draft config", "drafters.py"))
    if dflash is not None and dflash.config_ids is None and dflash.fallback_reason:
        dspark = family is DrafterFamily.DSPARK
        notes.append(("default_ids_fallback", "warning",
                      f"{dflash.fallback_reason}; a drafter trained on other layers loses its acceptance with no "
                      "error: write the ids it was trained on as "
                      + ("target_layer_ids" if dspark else "dflash_config.target_layer_ids"),
                      f"sglang {dep.engine_version} {DSPARK_IDS if dspark else DFLASH_IDS}"))
    elif dflash is None and dep.draft_config_ids is None and dep.ids_read:
        notes.append(("default_ids_fallback", "warning",
                      f"no ids reached the target ({dep.ids_fallback_reason}): SGLang serves its default "
                      f"{', '.join(dep.served_sources)}; write the ids the drafter was trained on as "
                      "eagle_config.eagle_aux_hidden_state_layer_ids",
                      f"sglang {dep.engine_version} model_runner_components/spec_aux_hidden_state.py:132-196"))
    return tuple(notes)
