"""SGLang's live static level: the deployment as a running server reports it (``GET /server_info``, the draft's
``config.json`` at the path it names, SGLang's own id rule), without importing sglang. Part of the live check
(``serving/sglang/live.py``)."""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specparity.serving.results import (
    ResolvedDeployment,
    ServingFailure,
    SpecSettings,
)

if TYPE_CHECKING:
    pass

# 0.5.5.post3 ships no model_executor/hook_manager.py and its ServerArgs has no forward_hooks; 0.5.6 has both
# (server_args.py:592, model_executor/model_runner.py:527-528) [read in the released wheels]
FIRST_RELEASE_WITH_FORWARD_HOOKS = "0.5.6"
# /server_info carries launch_command (the raw argv) from 0.5.20 (live-servers.md)
FIRST_RELEASE_WITH_LAUNCH_COMMAND = "0.5.20"
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
ADAPTER = "live-server"
# what the report shows of the server's resolved args (the in-process REPORTED_ARGS, since_0_5_11/core.py:39-46)
REPORTED_ARGS = (
    "model_path", "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
    "speculative_eagle_topk", "speculative_num_draft_tokens", "speculative_attention_mode", "device", "dtype",
    "attention_backend", "prefill_attention_backend", "decode_attention_backend",
    "speculative_draft_attention_backend", "disable_cuda_graph", "disable_overlap_schedule", "page_size", "tp_size",
    "pp_size", "dp_size", "ep_size", "mem_fraction_static", "max_total_tokens", "max_running_requests",
    "kv_cache_dtype", "quantization", "enable_return_aux_hidden_states", "return_aux_hidden_state_layer_ids",
    "chunked_prefill_size", "disable_radix_cache", "skip_server_warmup", "forward_hooks",
)
_SPEC_FLAGS = {"--speculative-num-steps": "num_steps", "--speculative-eagle-topk": "eagle_topk",
               "--speculative-num-draft-tokens": "num_draft_tokens"}
# the rewrite SGLang applies (0.5.23 arg_groups/speculative_hook.py; older server_args.py): its own warning text
REWRITE_RULE = "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1"


def server_info(client: Any) -> dict[str, Any]:
    """``GET /server_info``, or ``/get_server_info`` where the release has only that (before 0.5.6)."""
    last: Exception | None = None
    for path in SERVER_INFO_PATHS:
        try:
            info = client.get_json(path)
        except Exception as e:  # ServerError: a 404 on the newer path means an older release
            if getattr(e, "status", None) != 404:
                raise
            last = e
            continue
        if isinstance(info, dict):
            return info
    raise last if last is not None else RuntimeError("no server info")


def _version_key(v: str) -> tuple[int, ...]:
    from specparity.idrules.sglang import parse_version

    try:
        return parse_version(v)
    except ValueError:
        return (0,)


def requested_spec(launch_command: str | Sequence[str] | None) -> SpecSettings:
    """The speculative triple as given on the command line (``/server_info``'s ``launch_command``), None where the
    command does not set it. An abbreviation argparse accepted names one flag only, so a prefix of one of the three
    flags is that flag."""
    if not launch_command:
        return SpecSettings(None, None, None)
    args = shlex.split(launch_command) if isinstance(launch_command, str) else list(launch_command)
    found: dict[str, int] = {}
    for i, a in enumerate(args):
        if not a.startswith("--"):
            continue
        flag, _, value = a.partition("=")
        names = [f for f in _SPEC_FLAGS if f == flag] or [f for f in _SPEC_FLAGS if f.startswith(flag) and
                                                        len(flag) > len("--speculative-")]
        if len(names) != 1:
            continue
        if not value and i + 1 < len(args):
            value = args[i + 1]
        with contextlib.suppress(ValueError):
            found[_SPEC_FLAGS[names[0]]] = int(value)
    return SpecSettings(found.get("num_steps"), found.get("eagle_topk"), found.get("num_draft_tokens"))


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) else config


def sglang_config_ids(draft_config: Mapping[str, Any]) -> tuple[tuple[int, ...] | None, str | None]:
    """The aux ids SGLang reads from a draft config, and why it took its default path when it reads none.

    0.5.23 reads ``eagle_config.eagle_aux_hidden_state_layer_ids`` only, and swallows any error into the default
    (domain.md D11; the in-process reason text, ``since_0_5_11/core.py:79-92``)."""
    ec = draft_config.get("eagle_config")
    top = draft_config.get("eagle_aux_hidden_state_layer_ids")
    note = " (a top-level eagle_aux_hidden_state_layer_ids never reaches the target)" if top else ""
    if ec is None:
        return None, "draft config has no eagle_config" + note
    if not isinstance(ec, Mapping):
        return None, f"malformed eagle_config: expected a mapping, got {type(ec).__name__}" + note
    if "eagle_aux_hidden_state_layer_ids" not in ec:
        return None, "malformed eagle_config: no eagle_aux_hidden_state_layer_ids" + note
    ids = ec.get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        return None, "malformed eagle_config: eagle_aux_hidden_state_layer_ids is null" + note
    try:
        return tuple(int(x) for x in ids), None
    except (TypeError, ValueError):
        return None, f"malformed eagle_config: eagle_aux_hidden_state_layer_ids is {ids!r}" + note


def _draft_k(draft_config: Mapping[str, Any], ids: tuple[int, ...] | None) -> int:
    # sglang 0.5.23 models/llama_eagle3.py:155-160: num_aux_hidden_states > len(eagle ids) > 3
    k = draft_config.get("num_aux_hidden_states")
    return int(k) if k is not None else (len(ids) if ids else 3)


def _draft_flags(draft_config: Mapping[str, Any]) -> dict[str, bool]:
    # sglang 0.5.23 models/llama_eagle3.py:163-207 (bias, norm_before_fc, fc_norm/use_aux_norm, norm_output)
    ec = draft_config.get("eagle_config")
    ec = ec if isinstance(ec, Mapping) else {}
    return {"norm_before_fc": bool(ec.get("norm_before_fc", draft_config.get("norm_before_fc", False))),
            "fc_norm": bool(draft_config.get("fc_norm") or draft_config.get("use_aux_norm", False)),
            "norm_output": bool(draft_config.get("norm_output", False)),
            "fc_bias_in_config": bool(draft_config.get("bias", False))}


def _layout(info: Mapping[str, Any]) -> dict[str, Any]:
    tp, pp = int(info.get("tp_size") or 1), int(info.get("pp_size") or 1)
    dp, ep = int(info.get("dp_size") or 1), int(info.get("ep_size") or 1)
    nnodes = int(info.get("nnodes") or 1)
    return {"engine": "sglang", "executor": "sglang scheduler processes", "tensor_parallel_size": tp,
            "pipeline_parallel_size": pp, "data_parallel_size": dp, "expert_parallel_size": ep,
            "ranks_expected": list(range(tp * pp)), "ranks_reported": None, "nodes": None, "ranks": None,
            "nnodes": nnodes, "node_ranks": {str(k): node_ranks(tp, pp, nnodes, k) for k in range(nnodes)}}


def node_ranks(tp: int, pp: int, nnodes: int, node_rank: int) -> list[int]:
    """The ``torch.distributed`` ranks of one node's scheduler processes, as SGLang places them: the PP and TP rank
    ranges of ``_calculate_rank_ranges`` (0.5.23 ``entrypoints/engine.py:2045-2077``), each process's world rank
    ``tp_size * pp_rank + tp_rank`` (``model_executor/model_runner.py:700``)."""
    pp_per_node = max(pp // nnodes, 1)
    nodes_per_pp = max(nnodes // pp, 1)
    tp_per_node = tp // nodes_per_pp
    pps = range(pp_per_node * (node_rank // nodes_per_pp), pp_per_node * (node_rank // nodes_per_pp + 1))
    tps = range(tp_per_node * (node_rank % nodes_per_pp), tp_per_node * (node_rank % nodes_per_pp + 1))
    return [tp * p + t for p in pps for t in tps]


def _fc_shape(draft_dir: str | Path | None, fc_in: int, fc_out: int) -> tuple[int, int, bool, str]:
    """fc's (in, out, bias) from the draft checkpoint's header where the draft directory is readable here, else the
    config's (``fc_in``, ``fc_out``, no bias), and where they come from."""
    if draft_dir is None:
        return fc_in, fc_out, False, "config: draft checkpoint not read"
    from specparity.checkpoint_files import fc_shape_from_checkpoint

    try:
        shape = fc_shape_from_checkpoint(Path(draft_dir))
    except (OSError, ValueError, KeyError):
        return fc_in, fc_out, False, "config: draft checkpoint not read"
    if shape is None:
        return fc_in, fc_out, False, "config: no fc.weight in checkpoint"
    return shape.in_features, shape.out_features, shape.bias, "checkpoint"


def deployment_from_server_info(info: Mapping[str, Any], *, draft_config: Mapping[str, Any],
                                target_config: Mapping[str, Any] | None = None,
                                draft_dir: str | Path | None = None) -> ResolvedDeployment:
    """The static level from what a running server reports (``GET /server_info``).

    ``draft_config`` is the draft's ``config.json`` at the ``speculative_draft_model_path`` the server names (the
    server does not report the aux ids); ``target_config`` the target's at ``model_path`` (architecture and layer
    count for SGLang's id rule; without it the plan is not computed and a note says so); ``draft_dir`` the draft
    directory, for ``fc``'s shape from the checkpoint header (else from the config). The resolved speculative
    settings are the server's own values; the requested ones come from ``launch_command`` (0.5.20+), so a rewrite
    shows as requested 16, resolved 2, with SGLang's own warning text."""
    from specparity.idrules import sglang

    version = str(info.get("version", "?"))
    target = _text_config(target_config or {})
    num_layers = int(target.get("num_hidden_layers") or 0)
    arch = next(iter((target_config or {}).get("architectures") or ["?"]))
    ids, reason = sglang_config_ids(draft_config)
    k = _draft_k(draft_config, ids)
    h_t = int(target.get("hidden_size") or 0)
    h_t_draft = int(draft_config.get("target_hidden_size") or h_t or draft_config.get("hidden_size") or 0)
    h_d = int(draft_config.get("hidden_size") or 0)
    notes = [f"static level from the server's own {SERVER_INFO_PATHS[0]} (sglang {version}); aux ids read from the "
             f"draft config at the speculative_draft_model_path it names"]
    stored: tuple[int, ...] = ()
    served: tuple[str, ...] = ()
    unreachable: tuple[int, ...] = ()
    if num_layers > 0 and arch != "?":
        try:
            plan = sglang.capture_plan(ids, num_layers=num_layers, architecture=arch, version=version)
        except ValueError as e:
            notes.append(f"SGLang's id rule not applied: {e}")
        else:
            stored, served, unreachable = plan.layers_to_capture, plan.served_sources, plan.unreachable
            notes.extend(plan.notes)
            if plan.crash:
                notes.append(f"SGLang's forward fails with this draft config: {plan.crash}")
    else:
        notes.append("the target's config.json was not readable here: the capture list is not computed")
    fc_in, fc_out, fc_bias, fc_source = _fc_shape(draft_dir, k * h_t_draft, h_d)
    resolved = SpecSettings(info.get("speculative_num_steps"), info.get("speculative_eagle_topk"),
                            info.get("speculative_num_draft_tokens"))
    launch = info.get("launch_command")
    requested = requested_spec(launch)
    warnings: list[str] = []
    if (requested.num_draft_tokens is not None and resolved.num_draft_tokens is not None
            and requested.num_draft_tokens != resolved.num_draft_tokens):
        warnings.append(f"{REWRITE_RULE} (the server resolved --speculative-num-draft-tokens "
                        f"{requested.num_draft_tokens} to {resolved.num_draft_tokens})")
    if launch:
        notes.append(f"launch_command: {launch}")
    elif _version_key(version) >= _version_key(FIRST_RELEASE_WITH_LAUNCH_COMMAND):
        notes.append("the server reported no launch_command")
    flags = _draft_flags(draft_config)
    from specparity.serving.sglang.child_output import json_safe

    return ResolvedDeployment(
        engine_version=version, adapter=ADAPTER, target_path=str(info.get("model_path", "")),
        draft_path=str(info.get("speculative_draft_model_path") or ""), device=str(info.get("device", "?")),
        target_architecture=arch, num_layers=num_layers, target_hidden_size=h_t,
        target_vocab_size=int(target.get("vocab_size") or 0),
        target_dtype=str(info.get("dtype") if info.get("dtype") not in (None, "auto")
                         else target.get("torch_dtype") or target.get("dtype") or "?"),
        draft_architecture=next(iter(draft_config.get("architectures") or ["?"])), draft_hidden_size=h_d,
        draft_vocab_size=draft_config.get("draft_vocab_size"), requested_spec=requested, resolved_spec=resolved,
        spec_warnings=tuple(warnings), draft_config_ids=ids, ids_fallback_reason=reason,
        layers_to_capture=stored, served_sources=served, unreachable_boundaries=unreachable,
        fc_in_features=fc_in, fc_out_features=fc_out, fc_bias=fc_bias, num_aux_hidden_states=k,
        fc_applied=k * h_t_draft != h_d, norm_before_fc=flags["norm_before_fc"], fc_norm=flags["fc_norm"],
        norm_output=flags["norm_output"], fc_bias_in_config=flags["fc_bias_in_config"],
        server_args={key: json_safe(info.get(key)) for key in REPORTED_ARGS if key in info},
        timings={}, fc_source=fc_source, notes=tuple(notes), engine="sglang", layout=_layout(info))


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _local(path: str, cwd: str | Path | None) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() or cwd is None else Path(cwd) / p


def resolve_from_server(client: Any, *, cwd: str | Path | None = None) -> ResolvedDeployment | ServingFailure:
    """The static level of a running server: its ``/server_info``, and the target's and draft's ``config.json`` at
    the paths it names (relative paths are the server's, resolved against ``cwd``)."""
    info = server_info(client)
    draft_path = str(info.get("speculative_draft_model_path") or "")
    if not draft_path:
        from specparity.serving.results import BAD_DEPLOYMENT

        return ServingFailure(BAD_DEPLOYMENT, "the server runs no draft model (speculative_draft_model_path is "
                                              f"unset; speculative_algorithm={info.get('speculative_algorithm')!r})")
    draft_dir = _local(draft_path, cwd)
    draft_config = _read_json(draft_dir / "config.json")
    if draft_config is None:
        from specparity.serving.results import DRAFT_UNREADABLE

        return ServingFailure(DRAFT_UNREADABLE, f"{draft_dir / 'config.json'} (the draft the server names) is not "
                                                "readable here: run the gate on the server's host or pass --draft")
    target_config = _read_json(_local(str(info.get("model_path", "")), cwd) / "config.json")
    return deployment_from_server_info(info, draft_config=draft_config, target_config=target_config,
                                       draft_dir=draft_dir)
