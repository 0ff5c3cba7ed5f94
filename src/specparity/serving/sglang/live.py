"""SGLang's part of a live check, parent side: the hook switches, the static level from ``/server_info``, and the
hook evidence turned into the project's records. Imports no sglang (the server runs it; this process reads files
and HTTP answers).

The user's server is ``python -m sglang.launch_server ...`` (or ``sglang serve ...``), launched by the gate
(``serving/live.py``) or already running. Everything goes through interfaces SGLang supports, cited from 0.5.23:

- **hook switches** (:func:`hook_switches`): ``--forward-hooks '<json>'`` naming :data:`HOOK_FACTORY`
  (``srt/arg_groups/fields/observability.py:231-237``; ``model_executor/hook_manager.py:11-55``), registered per
  model runner, target and draft, after CUDA-graph capture (``model_executor/model_runner_components/
  cuda_graph_setup.py:452-459`` ``finalize_cuda_graph_capture``). First in sglang 0.5.6
  (:data:`FIRST_RELEASE_WITH_FORWARD_HOOKS`; there ``model_executor/model_runner.py:527-528``, also after
  ``init_device_graphs``). On ``cpu`` also the environment of the CPU stand-ins
  (:mod:`specparity.serving.sglang.live_stand_ins`).
- **static level** (:func:`deployment_from_server_info`): ``GET /server_info`` (``entrypoints/http_server.py:863-890``;
  ``/get_server_info`` at ``:853``, deprecated, back to 0.4.10) returns the server args after SGLang's own rewrites
  (so a 16 -> 2 draft-token rewrite is shown by the server itself) and, from 0.5.20, ``launch_command``, the argv as
  given (the requested values). The aux ids are not in it: the draft's ``config.json`` at the
  ``speculative_draft_model_path`` the server names is read here and put through SGLang's own id rule
  (:func:`specparity.idrules.sglang.sglang_capture_plan`).
- **capture** (:func:`live_capture`, :func:`evidence_to_capture`): the gate arms the hooks (``<evidence>/ARMED``),
  flushes the radix cache (``POST /flush_cache``, ``http_server.py:1025``) and sends each probe as token ids to
  ``POST /generate`` (greedy, ``max_new_tokens`` 1: the prefill is where the drafter's fc sees every prompt token,
  ``speculative/eagle_worker_v2.py:1548-1602``), disarms, and reads ``<evidence>/records``. SGLang has no channel to
  return hook evidence over HTTP: the gate must run on the server's host and read the directory (a remote attach
  gets the static level, and the capture exits 3 by name, :data:`HOOKS_MISSING`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specparity.serving import stand_ins as stand_in_names
from specparity.serving.results import (
    CAPTURE_SHAPE,
    FC_NOT_CALLED,
    NODE_MISSING,
    PROBE_NOT_ISOLATED,
    RANK_MISSING,
    SGLANG_EXCEPTION,
    CaptureResult,
    FcCapture,
    LayerAtlas,
    ResolvedDeployment,
    ServingFailure,
    SpecSettings,
)
from specparity.serving.sglang import live_hooks
from specparity.serving.sglang.live_stand_ins import ENV_STAND_INS, SITE_DIR, STAND_INS_DIR
from specparity.testpoints import pause

if TYPE_CHECKING:
    from specparity.compare.reduced import Reduction

HOOK_FACTORY = "specparity.serving.sglang.live_hooks:factory"
# 0.5.5.post3 ships no model_executor/hook_manager.py and its ServerArgs has no forward_hooks; 0.5.6 has both
# (server_args.py:592, model_executor/model_runner.py:527-528) [read in the released wheels]
FIRST_RELEASE_WITH_FORWARD_HOOKS = "0.5.6"
# /server_info carries launch_command (the raw argv) from 0.5.20 (live-servers.md)
FIRST_RELEASE_WITH_LAUNCH_COMMAND = "0.5.20"
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
# the same kind the engine-neutral layer (serving/live.py) gives a server started without the hook switches
HOOKS_MISSING = "hooks_missing"
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
EXTEND_MODES = frozenset({"EXTEND", "MIXED"})


# ---------------------------------------------------------------------------------------------- hook switches
def hook_specs(evidence_dir: str | Path) -> list[dict[str, Any]]:
    """The ``--forward-hooks`` spec: :data:`HOOK_FACTORY` on each model runner's inner ``model`` (the llama-style
    module name every EAGLE-3 target and drafter class of 0.5.23 uses); the taps it installs while armed are its
    own (``live_hooks`` module docstring)."""
    return [{"name": "specparity", "target_modules": ["model"], "hook_factory": HOOK_FACTORY,
             "config": {"evidence_dir": str(evidence_dir)}}]


def hook_switches(evidence_dir: str | Path, *, cpu_stand_ins: bool = False) -> tuple[list[str], dict[str, str]]:
    """``(extra_argv, extra_env)``: exactly what specparity adds to the user's SGLang command.

    ``extra_argv`` is ``--forward-hooks '<json>'`` (:func:`hook_specs`). ``extra_env`` is empty on a GPU server;
    with ``cpu_stand_ins`` (a CPU server on a machine without SGLang's CPU kernels, like CI's) it is the stand-ins'
    switch (``SPECPARITY_SGLANG_LIVE_STAND_INS`` = the evidence directory they record into), ``PYTHONPATH`` = the
    directory whose ``sitecustomize.py`` installs them in every server process (to be put BEFORE the command's own
    PYTHONPATH), and ``SGLANG_USE_CPU_ENGINE=1`` (``is_cpu()`` is false without it and ``lru_cache``d,
    sglang 0.5.23 ``utils/common.py:221-224``). The package link the hook modules import through is the server
    layer's (``serving/live.py``)."""
    argv = ["--forward-hooks", json.dumps(hook_specs(evidence_dir), separators=(",", ":"))]
    env: dict[str, str] = {}
    if cpu_stand_ins:
        env = {ENV_STAND_INS: str(evidence_dir), "PYTHONPATH": str(SITE_DIR), "SGLANG_USE_CPU_ENGINE": "1"}
    return argv, env


def has_hook_switches(args: Sequence[str]) -> bool:
    """True when ``args`` already name specparity's hook factory in a ``--forward-hooks``."""
    return any(HOOK_FACTORY in a for a in args)


LEASE_S = 120.0  # the ARMED lease per probe (and one for the priming request): the hooks disarm themselves after


@contextlib.contextmanager
def armed(evidence_dir: str | Path, *, lease_s: float = LEASE_S) -> Any:
    """The hooks record while the block runs (``<evidence>/ARMED`` exists), and stop after, whatever happens: the
    file is removed in ``finally``, by the watchdog if this process is killed (``serving/reaper.py``), and by the
    hooks themselves when its lease (``lease_s`` from now, this process alive) ends (``live_hooks``)."""
    from specparity.serving import reaper

    flag = Path(evidence_dir) / live_hooks.ARMED
    fd = os.open(flag, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, live_hooks.lease_text(lease_s=lease_s).encode())
    finally:
        os.close(fd)
    reaper.adopt_file(flag)
    try:
        yield flag
    finally:
        with contextlib.suppress(FileNotFoundError):
            flag.unlink()
        reaper.release_file(flag)


def lease_ends(evidence_dir: str | Path) -> list[str]:
    """Why the hooks disarmed themselves during the last probe run (``lease/<pid>.json``), if they did."""
    return [e for entries in _notes(evidence_dir, live_hooks.LEASE).values() for e in entries]


# ---------------------------------------------------------------------------------------------- static level
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
    from specparity.idrules.sglang import sglang_capture_plan

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
            plan = sglang_capture_plan(ids, num_layers=num_layers, architecture=arch, version=version)
        except ValueError as e:
            notes.append(f"SGLang's id rule not applied: {e}")
        else:
            stored, served, unreachable = plan.layers_to_capture, plan.served_sources, plan.unreachable
            notes.extend(plan.notes)
            if plan.crash:
                notes.append(f"SGLang's forward fails with this draft config: {plan.crash}")
    else:
        notes.append("the target's config.json was not readable here: the capture list is not computed")
    fc_in, fc_out, fc_bias, fc_source = k * h_t_draft, h_d, False, "config: draft checkpoint not read"
    if draft_dir is not None:
        from specparity.serving.worker_common import fc_shape_from_checkpoint

        with contextlib.suppress(OSError, ValueError, KeyError):
            shape = fc_shape_from_checkpoint(Path(draft_dir))
            if shape is not None:
                fc_in, fc_out, fc_bias, fc_source = shape.in_features, shape.out_features, shape.bias, "checkpoint"
            else:
                fc_source = "config: no fc.weight in checkpoint"
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
    from specparity.serving.sglang.common import json_safe

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


# ---------------------------------------------------------------------------------------------- evidence
@dataclass(frozen=True)
class Record:
    """One hook record: one forward of one model runner on one rank."""

    path: Path
    runner: str
    rank: int
    world_size: int
    mode: str
    call: int
    seq: int
    pid: int
    meta: Mapping[str, str]
    tensors: Mapping[str, Any]

    def segments(self) -> list[tuple[int, int, int, int]]:
        """``(row start, rows, prefix length, req_pool_index)`` per request of the batch."""
        ids = self.tensors.get("input_ids")
        t = self.tensors
        return live_hooks.segments(t.get("extend_seq_lens"), t.get("extend_prefix_lens"), t.get("req_pool_indices"),
                                   int(ids.shape[0]) if ids is not None else 0)


def read_records(evidence_dir: str | Path | Sequence[str | Path]) -> list[Record]:
    """Every hook record in ``<evidence>/records`` (of each directory given: one per node), in each process's order
    (safetensors only; never unpickled)."""
    from safetensors import safe_open

    dirs = [evidence_dir] if isinstance(evidence_dir, (str, Path)) else list(evidence_dir)
    paths = [p for d in dirs if (Path(d) / live_hooks.RECORDS).is_dir()
             for p in sorted((Path(d) / live_hooks.RECORDS).glob("r*.safetensors"))]
    out: list[Record] = []
    for path in paths:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
        if meta.get("format") != live_hooks.RECORD_FORMAT:
            continue
        out.append(Record(path, meta["runner"], int(meta["rank"]), int(meta["world_size"]), meta["forward_mode"],
                          int(meta["call"]), int(meta["seq"]), int(meta["pid"]), meta, tensors))
    out.sort(key=lambda r: (r.rank, r.pid, r.seq))
    return out


def server_stand_ins(evidence_dir: str | Path, records: Sequence[Record] = ()) -> tuple[tuple[str, ...],
                                                                                  tuple[str, ...] | None]:
    """The stand-ins SGLang's server processes recorded (``stand_ins/<pid>.json``, and the records' own list), and
    the ``sgl_kernel`` stand-in's calls over all processes (per process its latest count; None: no process imported
    the stand-in)."""
    folder = Path(evidence_dir) / STAND_INS_DIR
    names: list[str] = []
    per_pid: dict[int, list[str]] = {}
    seen: list[tuple[int, list[str], list[str] | None]] = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            d = json.loads(path.read_text())
            seen.append((int(d["pid"]), [str(n) for n in d.get("stand_ins") or []], d.get("kernel_stub_calls")))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    for r in records:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            seen.append((r.pid, [str(n) for n in json.loads(r.meta.get("stand_ins", "[]"))],
                         json.loads(r.meta.get("kernel_stub_calls", "null"))))
    for pid, active, stub in seen:
        names.extend(n for n in active if n not in names)
        if stub is not None and len(stub) >= len(per_pid.get(pid, [])):
            per_pid[pid] = [str(c) for c in stub]
    if not per_pid:
        return tuple(names), None
    return tuple(names), tuple(c for pid in sorted(per_pid) for c in per_pid[pid])


def _notes(evidence_dir: str | Path, folder_name: str) -> dict[int, list[str]]:
    folder = Path(evidence_dir) / folder_name
    out: dict[int, list[str]] = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            d = json.loads(path.read_text())
            out[int(d["pid"])] = [str(t) for t in d.get("entries", [])]
    return out


def hooks_registered(evidence_dir: str | Path | Sequence[str | Path]) -> dict[int, list[str]]:
    """``{pid: specs}`` of the server processes where SGLang called specparity's hook factory
    (``factory_calls/<pid>.json``: one entry per model runner), over every directory given."""
    dirs = [evidence_dir] if isinstance(evidence_dir, (str, Path)) else list(evidence_dir)
    return {pid: v for d in dirs for pid, v in _notes(d, live_hooks.FACTORY_CALLS).items()}


def hooks_ready(evidence_dir: str | Path) -> dict[int, list[str]]:
    """``{pid: runners}`` whose hook has adopted its model (after that runner's first forward; ``ready/<pid>.json``)."""
    return _notes(evidence_dir, live_hooks.READY)


def settle(evidence_dir: str | Path, *, timeout_s: float = 5.0, quiet_s: float = 0.3) -> None:
    """Wait until no record is being written (no temp file) and the record count held still for ``quiet_s``: a TP
    rank other than the one that answered HTTP may still be writing."""
    folder = Path(evidence_dir) / live_hooks.RECORDS
    deadline = time.monotonic() + timeout_s
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
        busy = any(n.startswith(".tmp-") for n in names)
        if len(names) != last or busy:
            last, since = len(names), time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.05)


@dataclass
class _Match:
    target: list[tuple[Record, int, int]]  # (record, row start, rows) per chunk
    draft: list[tuple[Record, int, int]]


def _find_probe(records: Sequence[Record], probe: Sequence[int]) -> tuple[_Match | None, str]:
    """The target extend rows of ``probe`` (its chunks, chained by req_pool_index and prefix), and the draft
    extend that followed each chunk in the same process; or None and why."""
    want = [int(t) for t in probe]
    cache_hit = ""
    targets = [r for r in records if r.runner == "target" and r.mode in EXTEND_MODES and "input_ids" in r.tensors]
    for r in targets:
        ids = r.tensors["input_ids"]
        for start, n, prefix, pool in r.segments():
            seg = [int(x) for x in ids[start:start + n].tolist()]
            if prefix > 0 and want[prefix:prefix + n] == seg:
                cache_hit = (f"its prefill started at token {prefix} (the radix cache held the rest): flush the "
                             "cache before each probe")
            if prefix != 0 or seg != want[:n] or n == 0:
                continue
            chunks = [(r, start, n)]
            done = n
            for later in (x for x in targets if x.pid == r.pid and x.seq > r.seq):
                if done >= len(want):
                    break
                lids = later.tensors["input_ids"]
                for s2, n2, p2, pool2 in later.segments():
                    if pool2 == pool and p2 == done and [int(x) for x in lids[s2:s2 + n2].tolist()] == \
                            want[done:done + n2]:
                        chunks.append((later, s2, n2))
                        done += n2
                        break
            if done != len(want):
                continue
            drafts = []
            for rec, s, n_rows in chunks:
                seg_index = [x[0] for x in rec.segments()].index(s)
                nxt = next((d for d in records if d.runner == "draft" and d.pid == rec.pid and d.seq > rec.seq
                            and ("fc_input" in d.tensors or "spec_hidden" in d.tensors
                                 or d.meta.get(live_hooks.EVIDENCE_KEY) == "reduced")), None)
                if nxt is None:
                    break
                dsegs = nxt.segments()
                pool = rec.segments()[seg_index][3]
                if seg_index >= len(dsegs) or dsegs[seg_index][1] != n_rows or dsegs[seg_index][3] != pool:
                    break  # not this chunk's draft extend (eagle_worker_v2.py:1593-1600 runs it right after)
                drafts.append((nxt, dsegs[seg_index][0], n_rows))
            return _Match(chunks, drafts if len(drafts) == len(chunks) else []), ""
    return None, cache_hit or "no extend forward of it reached the hooks"


def _rows(parts: Sequence[tuple[Record, int, int]], key: str) -> Any:
    import torch

    pieces = [rec.tensors[key][s:s + n] for rec, s, n in parts if key in rec.tensors]
    if len(pieces) != len(parts):
        return None
    return torch.cat(pieces, dim=0).clone()


def evidence_to_capture(evidence_dir: str | Path, probes: Sequence[Sequence[int]], *,
                        deployment: ResolvedDeployment | None = None,
                        node_dirs: Sequence[str | Path] = ()) -> CaptureResult:
    """The hook evidence of one probe run as the project's records: :class:`FcCapture` (fc input per probe, with the
    target's aux states) and :class:`LayerAtlas` (the target's residual boundaries per probe), or typed failures.

    Never a pass on partial evidence: hooks never built, a probe no hook saw, a drafter that never ran fc, an
    empty or misshapen capture, NaN/Inf, and a rank of ``deployment.layout["ranks_expected"]`` without records are
    each a :class:`ServingFailure`. Ranks of one TP group see the same rows: the lowest reporting rank's tensors are
    the evidence; the others must match it (a note gives the largest difference). ``deployment`` (from
    :func:`deployment_from_server_info`) gets the stand-ins and the ranks that reported.

    ``node_dirs``: the evidence directories of the server's other nodes (``--nnodes``), as the user gives them: SGLang's
    hooks write on each node's own disk and SGLang has no route that returns them. A node of the deployment with no
    record in any directory read is :data:`NODE_MISSING` (exit 3, naming the node and its ranks), never a pass on
    the ranks that did report. Reduced records (``live_hooks``: the lead rank's statistics, the others' digests) give
    the atlas as :class:`~specparity.compare.reduced.ReducedSample` per probe."""
    import torch

    from specparity.serving.sglang.common import judge_fc_capture
    from specparity.serving.vllm.tap_reduce import fc_digest
    from specparity.serving.worker_common import nonfinite_failures

    evidence = Path(evidence_dir)
    dirs = [evidence, *(Path(d) for d in node_dirs)]
    failures: list[ServingFailure] = []
    version = deployment.engine_version if deployment is not None else "?"
    registered = hooks_registered(dirs)
    records = read_records(dirs)
    names, calls = server_stand_ins(evidence, records)
    active = [n for n in names if n != stand_in_names.SGL_KERNEL]
    if calls is not None:
        active.insert(0, f"{stand_in_names.SGL_KERNEL}: calls {', '.join(sorted(set(calls))) or 'none'}")
        bad = stand_in_names.kernel_stub_violations(calls)
        if bad:
            failures.append(ServingFailure(SGLANG_EXCEPTION, (
                f"the sgl_kernel stand-in was called for {', '.join(bad)}, outside its allowlist "
                f"{sorted(stand_in_names.KERNEL_STUB_ALLOWED)} (nothing measured through a stand-in op is trusted)")))
    elif stand_in_names.SGL_KERNEL in names:
        active.insert(0, f"{stand_in_names.SGL_KERNEL}: never imported")
    by_rank: dict[int, list[Record]] = {}
    for r in records:
        by_rank.setdefault(r.rank, []).append(r)
    expected = list((deployment.layout or {}).get("ranks_expected") or []) if deployment is not None else []
    dep = deployment
    if dep is not None:
        layout = {**dep.layout, "ranks_reported": sorted(by_rank) or None,
                  "ranks": {str(r): {"records": len(rs), "pids": sorted({x.pid for x in rs})}
                            for r, rs in sorted(by_rank.items())}}
        dep = replace(dep, stand_ins=tuple(active), layout=layout)
    if not registered:
        failures.insert(0, ServingFailure(HOOKS_MISSING, (
            "the server built none of specparity's hooks (no factory call in the evidence directory): start it with "
            f"the switches of `specparity launch-flags --engine sglang` (sglang >= {FIRST_RELEASE_WITH_FORWARD_HOOKS}"
            " has --forward-hooks)")))
        return CaptureResult(dep, None, None, tuple(failures))
    missing = [r for r in expected if r not in by_rank]
    node_map = {int(k): [int(r) for r in v] for k, v in ((dep.layout or {}).get("node_ranks") or {}).items()} \
        if dep is not None else {}
    if len(node_map) > 1 and by_rank:
        for node, ranks in sorted(node_map.items()):
            if ranks and not any(r in by_rank for r in ranks):
                failures.append(ServingFailure(NODE_MISSING, (
                    f"node {node} of {len(node_map)} (ranks {ranks[0]}-{ranks[-1]}) wrote no hook record to any "
                    f"evidence directory the gate read ({', '.join(str(d) for d in dirs)}): SGLang's hooks write on "
                    "each node's own disk and SGLang returns nothing of them over HTTP; give that node's evidence "
                    "directory (shared or copied) with --node-evidence DIR")))
                missing = [r for r in missing if r not in ranks]
    if missing and by_rank:
        failures.append(ServingFailure(RANK_MISSING, f"rank(s) {missing} wrote no hook record; ranks "
                                       f"{sorted(by_rank)} did (every rank of the served world must report)"))
    if not by_rank:
        ready = hooks_ready(evidence)
        why = ("no armed forward reached them (the probes never ran an eager forward of the model)" if ready else
               "they never fired: no forward of either model ran")
        failures.append(ServingFailure(FC_NOT_CALLED, (
            f"the hooks were built in {len(registered)} server process(es) and adopted by "
            f"{sum(len(v) for v in ready.values())} model(s), but no record was written: {why}")))
        return CaptureResult(dep, None, None, tuple(failures))
    lead = min(by_rank)
    fc_rows: list[Any] = []
    aux_rows: list[Any] = []
    aux_widths: list[int] = []
    atlas_rows: list[dict[str, Any]] = []
    drafts_used = 0
    graph_notes: set[str] = set()
    target_seen = False
    per_rank_diff = 0.0
    reduced: list[Any] = []  # per probe: its ReducedSample, or None (the full atlas)
    disagree: set[int] = set()
    for i, probe in enumerate(probes):
        match, why = _find_probe(by_rank[lead], probe)
        if match is None:
            # a radix-cache hit: the probe's own prefill never ran whole, so fc was never fed every token of it (the
            # machine's state, exit 3 by name); no extend of it at all: the drafter was never reached (fc_not_called)
            kind = PROBE_NOT_ISOLATED if "radix cache" in why else FC_NOT_CALLED
            failures.append(ServingFailure(kind, f"probe {i} ({len(probe)} tokens): {why}", sample=i))
            continue
        target_seen = True
        if not match.draft:
            failures.append(ServingFailure(FC_NOT_CALLED, (
                f"probe {i}: the target's extend ran but no draft forward called fc after it "
                "(the drafter's draft extend did not run)"), sample=i))
            continue
        drafts_used += len(match.draft)
        rows_of_fc = _rows(match.draft, "fc_input")
        if rows_of_fc is None:  # the fc tap did not fire; what fc was handed (live_hooks: a draft body in a graph)
            rows_of_fc = _rows(match.draft, "spec_hidden")
            pre_fc_norm = dep is not None and (dep.norm_before_fc or dep.fc_norm)
            if rows_of_fc is None or pre_fc_norm:
                failures.append(ServingFailure(HOOKS_MISSING, (
                    f"probe {i}: the drafter's fc tap did not fire (its prefill body ran in a CUDA graph: sglang "
                    "0.5.23 turns the breakable prefill graph on by default on CUDA, model_executor/"
                    "cuda_graph_config.py:119-123)" + ("; the fc input is normed after the batch's hidden states, "
                                                       "so they are not fc's input" if pre_fc_norm else "")),
                    sample=i))
                continue
            graph_notes.add("the fc input is the draft batch's spec_info.hidden_states (the drafter's body ran in "
                            "a CUDA graph, so its fc tap did not fire; models/llama_eagle3.py:233-247)")
        fc_rows.append(rows_of_fc)
        aux = _rows(match.target, "aux")
        if aux is not None:
            aux_rows.append(aux)
        elif match.target[0][0].meta.get(live_hooks.AUX_WIDTH):  # reduced: the states were not kept, their width was
            aux_widths.append(int(match.target[0][0].meta[live_hooks.AUX_WIDTH]))
        keys = [k for k in match.target[0][0].tensors if k == "embedding" or k == "final_norm" or
                k.startswith("layer:")]
        atlas_rows.append({k: v for k in keys if (v := _rows(match.target, k)) is not None})
        held = any(rec.meta.get(live_hooks.EVIDENCE_KEY) == "reduced" for rec, _, _ in match.target)
        red, why_not = _reduced_of(match.draft, i, probes) if held else (None, "")
        if held and red is None:
            failures.append(ServingFailure(HOOKS_MISSING, (
                f"probe {i}: rank {lead}'s hooks held the target's boundaries for the reduction but its draft extend "
                f"reduced nothing ({why_not}); gate with --evidence full"), sample=i))
        reduced.append(red)
        for rank in sorted(by_rank):
            if rank == lead:
                continue
            other, _ = _find_probe(by_rank[rank], probe)
            if other is None or not other.draft:
                failures.append(ServingFailure(RANK_MISSING, f"rank {rank} has no record of probe {i}", sample=i))
                continue
            digest = _digest_of(other.draft, i, probes)
            if digest is not None:  # reduced: the rank proves agreement by the digest of its fc rows
                if digest != fc_digest(fc_rows[-1]):
                    disagree.add(rank)
                continue
            o = _rows(other.draft, "fc_input")
            o = o if o is not None else _rows(other.draft, "spec_hidden")
            if o is None or o.shape != fc_rows[-1].shape:
                failures.append(ServingFailure(CAPTURE_SHAPE, f"rank {rank}'s fc input of probe {i} is "
                                               f"{None if o is None else tuple(o.shape)}, rank {lead}'s "
                                               f"{tuple(fc_rows[-1].shape)}", sample=i))
            else:
                per_rank_diff = max(per_rank_diff, float((o.float() - fc_rows[-1].float()).abs().max()))
    lengths = [len(p) for p in probes]
    if not fc_rows or len(fc_rows) != len(probes):
        return CaptureResult(dep, None, None, tuple(failures) or (ServingFailure(FC_NOT_CALLED, "no probe"),))
    first = fc_rows[0]
    width = int(first.shape[-1])
    rows = sum(int(t.shape[0]) for t in fc_rows)
    aux_count = 0
    aux_seen = bool(aux_rows) or len(aux_widths) == len(probes)
    if aux_seen and dep is not None and dep.target_hidden_size:
        width = int(aux_rows[0].shape[-1]) if aux_rows else aux_widths[0]
        aux_count = width // dep.target_hidden_size
    expected_width = dep.fc_in_features if dep is not None else width
    judged = judge_fc_capture(hook_calls=drafts_used, rows=rows, width=width, expected_rows=sum(lengths),
                              expected_width=expected_width, aux_captured=aux_count if aux_seen else 0,
                              aux_expected=dep.num_aux_hidden_states if dep is not None and aux_seen else 0,
                              fc_applied=dep.fc_applied if dep is not None else True, target_ran=target_seen)
    failures = [*judged, *failures]
    failures.extend(nonfinite_failures(fc_rows, what="fc input"))
    stub_active = calls is not None
    fc = FcCapture(per_sample=fc_rows, dtype=str(first.dtype).removeprefix("torch."), engine_version=version,
                   hook_calls=drafts_used, aux_states_captured=aux_count,
                   aux_states_expected=dep.num_aux_hidden_states if dep is not None else aux_count,
                   kernel_stub_calls=tuple(calls or ()), aux_per_sample=aux_rows if len(aux_rows) == len(probes)
                   else [], kernel_stub_active=stub_active)
    atlas: LayerAtlas | None = None
    whole = [r for r in reduced if r is not None]
    if whole and len(whole) != len(reduced):  # the two forms cannot be attributed together: exit 3, never a verdict
        failures.append(ServingFailure(HOOKS_MISSING, (
            "some probes' evidence was reduced in the server and some came as the full atlas (a prefill the hooks "
            "could not match to a whole probe: chunked, or shared with another request), so the chunks cannot be "
            "attributed together; gate with --evidence full")))
    elif whole and all(atlas_rows) and len({tuple(sorted(a)) for a in atlas_rows}) == 1:
        layer_keys = [n for n in whole[0].names if n.startswith("layer:")]
        num_layers = dep.num_layers if dep is not None and dep.num_layers else \
            1 + max(int(k.split(":")[1]) for k in layer_keys)
        atlas = LayerAtlas(per_sample=atlas_rows, num_layers=num_layers, reduced=whole)
        failures.extend(nonfinite_failures([torch.stack(list(s.values())) for s in atlas_rows], what="final norm"))
        failures.extend(_reduced_nonfinite(whole))
    elif not whole and atlas_rows and all(atlas_rows) and len({tuple(sorted(a)) for a in atlas_rows}) == 1:
        num_layers = dep.num_layers if dep is not None and dep.num_layers else \
            1 + max(int(k.split(":")[1]) for k in atlas_rows[0] if k.startswith("layer:"))
        atlas = LayerAtlas(per_sample=atlas_rows, num_layers=num_layers)
        failures.extend(nonfinite_failures([torch.stack(list(s.values())) for s in atlas_rows], what="layer atlas"))
    else:  # the hooks could not see the stream (a graph replay): the machine's setting, never a width finding (exit 3)
        failures.append(ServingFailure(HOOKS_MISSING, (
            "the target's residual boundaries were not recorded for every probe: its prefill body ran without the "
            "boundary taps firing (on CUDA, sglang 0.5.23's default breakable prefill graph replays it, "
            "model_executor/cuda_graph_config.py:119-123; the layer atlas needs an eager prefill, "
            "--cuda-graph-backend-prefill disabled on the server)")))
    if dep is not None and graph_notes:
        dep = replace(dep, notes=(*dep.notes, *sorted(graph_notes)))
    others = _other_segments(by_rank[lead], probes)
    if dep is not None and others:
        dep = replace(dep, notes=(*dep.notes, f"{others} prefill segment(s) of other requests were armed with the "
                                               "probes and ignored (each probe is matched by its own token ids)"))
    if dep is not None and len(by_rank) > 1:
        dep = replace(dep, notes=(*dep.notes, f"ranks {sorted(by_rank)} reported; fc inputs differ across ranks by "
                                               f"at most {per_rank_diff:.3g}" + (
                                                   f"; ranks {sorted(disagree)} fed fc other bytes than rank {lead} "
                                                   "(SHA-256 of the prefill's fc rows; --evidence full measures by "
                                                   "how much)" if disagree else "")))
    loop = {"evidence": "reduced" if whole and len(whole) == len(reduced) else "full"}
    if disagree:
        loop["ranks_differing"] = sorted(disagree)  # type: ignore[assignment]
    return CaptureResult(dep, fc, atlas, tuple(failures), loop=loop)


def _other_segments(records: Sequence[Record], probes: Sequence[Sequence[int]]) -> int:
    """Target extend segments (one rank's) that start no probe and continue none: other clients' requests (the
    gate's one-token priming request is not counted)."""
    wanted = [[int(t) for t in p] for p in probes]
    count = 0
    for r in records:
        if r.runner != "target" or r.mode not in EXTEND_MODES or "input_ids" not in r.tensors:
            continue
        ids = r.tensors["input_ids"]
        for start, n, prefix, _ in r.segments():
            seg = [int(x) for x in ids[start:start + n].tolist()]
            if n <= 1 and prefix == 0:
                continue  # the priming token
            if not any(w[prefix:prefix + n] == seg for w in wanted):
                count += 1
    return count


def _probe_indices(i: int, probes: Sequence[Sequence[int]]) -> list[int]:
    """Probe ``i`` and every probe with the same tokens (the hooks match an expectation by its tokens)."""
    return [i, *(j for j, p in enumerate(probes) if j != i and list(p) == list(probes[i]))]


def _reduced_of(parts: Sequence[tuple[Record, int, int]], i: int,
                probes: Sequence[Sequence[int]]) -> tuple[Any, str]:
    """Probe ``i``'s reduced sample from its draft record (live_hooks ``_reduce``), or None and why not."""
    from specparity.compare.reduced import META_KEY, from_tensors

    if len(parts) != 1:
        return None, f"its prefill came in {len(parts)} chunks"
    rec = parts[0][0]
    for j in _probe_indices(i, probes):
        meta = rec.meta.get(f"{live_hooks.REDUCED_META}{j}")
        if meta is not None:
            prefix = f"{live_hooks.REDUCED_PREFIX}{j}/"
            tensors = {"reduced/" + k.removeprefix(prefix): v for k, v in rec.tensors.items() if k.startswith(prefix)}
            return from_tensors(tensors, {META_KEY: meta}), ""
        error = rec.meta.get(f"{live_hooks.REDUCE_ERROR}/{j}")
        if error is not None:
            return None, f"the reduction raised {error}"
    return None, "no reduced statistics in its record"


def _digest_of(parts: Sequence[tuple[Record, int, int]], i: int, probes: Sequence[Sequence[int]]) -> str | None:
    """A non-lead rank's SHA-256 of its fc rows of probe ``i`` (reduced records), or None (a full record)."""
    if len(parts) != 1:
        return None
    for j in _probe_indices(i, probes):
        digest = parts[0][0].meta.get(f"{live_hooks.DIGEST_META}{j}")
        if digest is not None:
            return digest
    return None


def _reduced_nonfinite(samples: Sequence[Any]) -> list[ServingFailure]:
    """NaN/Inf in the boundaries the server reduced (the Gram sums count them per token)."""
    out = []
    for i, red in enumerate(samples):
        bad = red.tensors.get("gram/nonfinite")
        if bad is not None and bool((bad > 0).any()):
            out.append(ServingFailure("nonfinite", "the layer atlas the server reduced has NaN/Inf", sample=i))
    return out


# ---------------------------------------------------------------------------------------------- one probe run
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


def flush_cache(client: Any, *, wait_s: float = 10.0) -> str | None:
    """Empty the radix cache before a probe, so its prefill holds every token: ``POST /flush_cache?timeout=S``, which
    SGLang defers until the scheduler is idle (0.5.23 ``managers/scheduler_components/flush_wrapper.py:21-37``); a
    release that flushes only when idle right now is asked again until ``wait_s`` passes. None when flushed, else
    SGLang's answer."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            client.post("/flush_cache", params={"timeout": f"{wait_s:g}"})
            return None
        except Exception as e:  # SGLang answers 400 while requests are in flight
            if time.monotonic() >= deadline:
                return str(e)
            time.sleep(0.2)


def live_capture(client: Any, *, evidence_dir: str | Path | None, probes: Sequence[Sequence[int]],
                 cwd: str | Path | None = None, progress: Callable[[int, int], None] | None = None,
                 max_new_tokens: int = 1, reduction: Reduction | None = None,
                 node_dirs: Sequence[str | Path] = ()) -> CaptureResult:
    """One probe run through a server started with :func:`hook_switches`: its static level, then each probe as token
    ids (radix cache flushed first, greedy, ``max_new_tokens`` 1) with the hooks armed, then the evidence.

    ``client`` has ``get_json``/``post_json``/``post`` (``serving.server.ServerClient``). ``evidence_dir`` None (a
    server on another host) gives the static level and :data:`HOOKS_MISSING`. ``reduction`` (compare/reduced.py):
    the hooks reduce the atlas in the server (``live_hooks``: expectations written beside ``ARMED``, removed after).
    ``node_dirs``: the other nodes' evidence directories (:func:`evidence_to_capture`), armed and read as this one."""
    t0 = time.perf_counter()
    dep = resolve_from_server(client, cwd=cwd)
    if isinstance(dep, ServingFailure):
        return CaptureResult(None, None, None, (dep,))
    timings = {"server_info_s": time.perf_counter() - t0}
    if evidence_dir is None:
        return CaptureResult(dep, None, None, (ServingFailure(HOOKS_MISSING, (
            "SGLang returns no hook evidence over HTTP: the capture reads the hooks' directory, so the gate must run "
            "on the server's host; the static level above is the server's own")),))
    dirs = [Path(evidence_dir), *(Path(d) for d in node_dirs)]
    if not hooks_registered(dirs):
        return evidence_to_capture(evidence_dir, probes, deployment=dep, node_dirs=node_dirs)
    from specparity.serving import reaper

    notes: list[str] = []
    for d in dirs:
        # an earlier probe run's files are not this one's; this run's go at its end, or with the watchdog if the gate
        # is killed (they hold the probes' and any other client's token ids and hidden states)
        for folder in (live_hooks.RECORDS, live_hooks.EXPECT, live_hooks.LEASE):
            for old in (d / folder).glob("*") if (d / folder).is_dir() else []:
                with contextlib.suppress(OSError):
                    old.unlink()
            reaper.adopt_dir(d / folder)
    t1 = time.perf_counter()
    try:
        if reduction is not None:
            for d in dirs:
                live_hooks.write_expectations(d, probes, reduction.recorded, expected=list(reduction.expected),
                                              rtol=reduction.rtol, lead=0, served=reduction.served)
        with contextlib.ExitStack() as stack:
            for d in dirs:
                stack.enter_context(armed(d, lease_s=LEASE_S * (len(probes) + 1)))
            pause("armed")  # test-only (specparity/testpoints.py): inert unless its variable names it
            # each runner's first forward only adopts its model (live_hooks): one token through both runners first
            client.post_json("/generate", {"input_ids": [int(probes[0][0]) if probes and probes[0] else 0],
                                           "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
            for i, probe in enumerate(probes):
                refused = flush_cache(client)
                if refused:
                    notes.append(f"probe {i}: the radix cache was not flushed ({refused})")
                client.post_json("/generate", {"input_ids": [int(t) for t in probe],
                                               "sampling_params": {"max_new_tokens": max_new_tokens,
                                                                   "temperature": 0}})
                if progress is not None:
                    progress(i + 1, len(probes))
        for d in dirs:
            settle(d)
        timings["probes_s"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        result = evidence_to_capture(evidence_dir, probes, deployment=replace(dep, timings=timings),
                                     node_dirs=node_dirs)
        ended = [f"{d}: {why}" for d in dirs for why in lease_ends(d)]
        moved = sum(f.stat().st_size for d in dirs if (d / live_hooks.RECORDS).is_dir()
                    for f in (d / live_hooks.RECORDS).iterdir() if f.is_file())
        result = replace(result, loop={**(result.loop or {}), "evidence_bytes": moved})
    finally:
        for d in dirs:
            for folder in (live_hooks.RECORDS, live_hooks.EXPECT, live_hooks.LEASE):
                reaper.release_dir(d / folder, remove=True)
    if ended:  # the hooks stopped recording before the gate disarmed: what they wrote is not the whole run
        result = replace(result, failures=(*result.failures, ServingFailure(HOOKS_MISSING, (
            f"the hooks disarmed themselves during the probe run ({'; '.join(ended)}), so the evidence may be "
            "partial; rerun the gate (a longer run needs fewer probes per run)"))))
    timings["evidence_s"] = time.perf_counter() - t2
    timings["total_s"] = time.perf_counter() - t0
    if result.deployment is not None and notes:
        result = replace(result, deployment=replace(result.deployment, notes=(*result.deployment.notes, *notes)))
    return result


# ---------------------------------------------------------------------------------------------- the server's acceptance
# SGLang returns each request's own acceptance histogram in /generate's meta_info at finish: entry j counts the verify
# steps that accepted exactly j draft tokens (0.5.23 managers/schedule_batch.py:1566-1572
# update_spec_correct_drafts_histogram, from scheduler_components/batch_result_processor.py:834-836; returned by
# managers/tokenizer_manager.py:3193-3201). Older releases return only pooled figures (spec_accept_length).
HISTOGRAM = "spec_correct_drafts_histogram"
GENERATE_TOKENS = 16  # greedy tokens per probe prompt (as vLLM's live outcome, serving/vllm/worker.py)


def acceptance_from_meta(metas: Sequence[Mapping[str, Any]]) -> tuple[Any, str | None]:
    """The server's own per-position acceptance over the probes' requests, from each answer's meta_info histogram
    (position ``k`` is accepted in the verify steps that accepted more than ``k`` drafts, as vLLM's per-position
    counter counts it): a :class:`~specparity.serving.results.LoopAcceptance`, or None and why not."""
    from specparity.serving.results import LoopAcceptance

    total: list[int] = []
    for i, meta in enumerate(metas):
        hist = meta.get(HISTOGRAM)
        if hist is None:
            if int(meta.get("spec_verify_ct") or 0) > 0 or "spec_accept_length" in meta:
                return None, (f"the server's answer to probe {i} has spec_accept_length but no {HISTOGRAM}: this "
                              "release counts acceptance pooled per request, not per draft position")
            continue  # no verify step in this request (it ended at its prefill)
        if not isinstance(hist, list) or not all(isinstance(x, int) and x >= 0 for x in hist):
            return None, f"the server's {HISTOGRAM} for probe {i} is not a list of counts: {hist!r}"
        total += [0] * (len(hist) - len(total))
        for j, n in enumerate(hist):
            total[j] += n
    drafts = sum(total)
    if drafts <= 0:
        return None, "the server verified no draft while it served the probes' prompts"
    per_pos = tuple(sum(total[k + 1:]) for k in range(len(total) - 1))
    if not per_pos:
        per_pos = (0,)
    return LoopAcceptance(engine="sglang", drafts=drafts, accepted_per_position=per_pos, accepted=sum(per_pos),
                          prompts="assistant_start"), None


def served_acceptance(client: Any, probes: Sequence[Sequence[int]], prompt_lengths: Sequence[int | None], *,
                      generate_tokens: int = GENERATE_TOKENS) -> tuple[Any, dict[str, Any], str | None]:
    """The server's own loop on the probes' prompts (up to the assistant's first token, the text the drafter was
    trained on; the whole probe where the pack does not say), greedy, each request's own counts: (acceptance, the
    loop's facts, why not)."""
    metas = []
    t0 = time.perf_counter()
    for ids, n in zip(probes, prompt_lengths, strict=True):
        prompt = [int(t) for t in (ids[: max(1, int(n))] if n is not None else ids)]
        flush_cache(client)
        answer = client.post_json("/generate", {"input_ids": prompt, "sampling_params": {
            "max_new_tokens": generate_tokens, "temperature": 0, "ignore_eos": True}})
        metas.append(dict((answer or {}).get("meta_info") or {}) if isinstance(answer, dict) else {})
    acc, why = acceptance_from_meta(metas)
    loop = {"engine": "sglang", "source": "server_metrics", "acceptance_source": "per_request",
            "other_requests": None, "generate_tokens": generate_tokens, "generate_s": time.perf_counter() - t0,
            "loop_prompts": "assistant_start", "requests": len(metas)}
    return acc, loop, why


# ---------------------------------------------------------------------------------------------- refusals
@dataclass(frozen=True)
class Refusal:
    """Where SGLang refuses on this machine, by call and release: the gate's exit 3 names it."""

    needle: str
    call: str
    release: str
    why: str


# Measured on a 2-core x86-64 CPU without AVX-512/AMX (docs/live-sglang.md); ``call`` is where the release named
# refuses, and :func:`server_failure` adds the innermost sglang frames of the log's own traceback
CPU_REFUSALS: tuple[Refusal, ...] = (
    Refusal("sgl_kernel.assign_req_to_token_pool_cpu", "mem_cache/allocation.py:746 assign_req_to_token_pool_func "
            "-> sgl_kernel.assign_req_to_token_pool_cpu (from speculative/eagle_utils.py:910 "
            "eagle_prepare_for_decode)", "0.5.23",
            "the EAGLE decode step needs a CPU sgl_kernel op that no installable package provides; the server's "
            "own warm-up request decodes 8 tokens (entrypoints/http_server.py:2407), so on CPU the command needs "
            "--skip-server-warmup and the probes run with max_new_tokens 1"),
    Refusal("triton_ops/cache_locs.py", "speculative/triton_ops/cache_locs.py:58 assign_req_to_token_pool_func "
            "(a Triton kernel; Triton has no CPU driver) from speculative/eagle_info_v2.py:104 prepare_for_decode",
            "0.5.14", "the EAGLE decode step; with the overlap scheduler it is prepared even for a request that "
            "ends after its prefill, so on CPU the command needs --disable-overlap-schedule (0.5.23 turns it off "
            "itself on CPU)"),
    Refusal("EAGLE is not supported in decode attention backend", "speculative/draft_utils.py (0.5.23 :64 from "
            "speculative/eagle_worker_v2.py:405; 0.5.10 :35 from speculative/eagle_worker.py:205 -> :224, in the "
            "worker's __init__)", "0.5.10, 0.5.23",
            "SGLang's EAGLE draft-decode backend map has no CPU entry (torch_native). From 0.5.11 the live "
            "stand-in falls back to the draft runner's own backend, as the in-process capture does; before, the "
            "worker builds the backend in its __init__ and no in-process stand-in covers it"),
    Refusal("No module named 'sgl_kernel'", "sglang/kernels/ops/kvcache/cache_move.py:10 import sgl_kernel",
            "0.5.23", "no CPU sgl_kernel build is installable; the live stand-ins were not active"),
    Refusal("must be between 1 and 65535", "server_args.py:2761-2769 (grpc_port = port + 10000)", "0.5.14",
            "the port is above 55535; 0.5.23 derives the gRPC port only when gRPC is on"),
    Refusal("from vllm._custom_ops import rotary_embedding", "layers/rotary_embedding/base.py:138", "0.5.23",
            "SGLang took its non-CPU path: SGLANG_USE_CPU_ENGINE=1 is not set (utils/common.py:221-224)"),
)


def cpu_refusals(log_text: str | Iterable[str]) -> list[Refusal]:
    """The known CPU refusals a server log shows, in :data:`CPU_REFUSALS` order."""
    text = log_text if isinstance(log_text, str) else "\n".join(log_text)
    return [r for r in CPU_REFUSALS if r.needle in text]


def server_failure(message: str, log_lines: Sequence[str]) -> ServingFailure:
    """Why a server failed, for the report: a known refusal by call and release (the gate's exit 3), else
    SGLang's own last exception line, with the log tail; a log with no exception at all (a server that never answered
    /health in time, or was killed from outside) is the machine's (``server_failed``, exit 3), as for vLLM."""
    from specparity.serving.results import NEEDS_HARDWARE

    found = cpu_refusals(log_lines)
    if found:
        r = found[0]
        frames = innermost_sglang_frames(log_lines)
        at = f" (this log: {' <- '.join(frames)})" if frames else ""
        return ServingFailure(NEEDS_HARDWARE, f"sglang {r.release} refuses on this CPU at {r.call}{at}: {r.why}. "
                                              f"{message}")
    last = next((ln for ln in reversed(log_lines) if "Error" in ln or "Exception" in ln), "")
    if not last:  # no exception of SGLang's in its log (a slow start, a server killed from outside): the machine's
        from specparity.serving.results import SERVER_FAILED

        return ServingFailure(SERVER_FAILED, f"{message} (no exception in the server's log)")
    return ServingFailure(SGLANG_EXCEPTION, f"{message} (last error: {last.strip()})")


MARKER = ".specparity-evidence"  # written by `specparity launch-flags --evidence-dir`: the directory is the gate's


def _token_file(evidence_dir: Path) -> Path:
    """Where launch-flags keeps this user's token of an evidence directory (outside it: a server cannot forge it)."""
    import hashlib

    root = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    key = hashlib.sha256(str(evidence_dir.resolve()).encode()).hexdigest()[:32]
    return root / "specparity" / "evidence" / key


def mark_evidence_dir(evidence_dir: Path) -> str:
    """Create ``evidence_dir`` (0700) with its marker, a fresh token kept both inside it and in this user's state
    (:func:`_token_file`), and return the token (launch-flags prints it)."""
    import secrets

    evidence_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    problem = live_hooks.evidence_dir_problem(evidence_dir)
    if problem is not None:
        from specparity.errors import InputError

        raise InputError(f"cannot be an evidence directory: {problem}", path=evidence_dir, field="--evidence-dir")
    token = secrets.token_hex(16)
    kept = _token_file(evidence_dir)
    kept.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    for path in (kept, evidence_dir / MARKER):
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
        os.replace(tmp, path)
    return token


def marker_problem(evidence_dir: Path) -> str | None:
    """Why a directory a server names is not one the gate may write in: not this user's 0700 directory, no marker
    (a regular file of this user's, 0600), or a token other than the one ``launch-flags`` kept for it; or None."""
    import stat

    problem = live_hooks.evidence_dir_problem(evidence_dir)
    if problem is not None:
        return problem
    marker = evidence_dir / MARKER
    try:
        st = os.lstat(marker)
        ok = stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077
        token = marker.read_text().strip() if ok else ""
        kept = _token_file(evidence_dir).read_text().strip()
    except OSError:
        return (f"{evidence_dir} has no marker of `specparity launch-flags --engine sglang --evidence-dir` for this "
                "user")
    if not ok:
        return f"{marker} is not a 0600 file of uid {os.getuid()}"
    if not token or token != kept:
        return f"{marker}'s token is not the one launch-flags printed for {evidence_dir}"
    return None


def server_hooks_dir(client: Any) -> Path | None:
    """The evidence directory a running server's ``--forward-hooks`` names for specparity's factory (read from its
    own ``/server_info``), when that directory is on this host; None otherwise (the capture then exits 3 by name).

    The gate writes and deletes in it (ARMED, expectations, records), so a directory named by an HTTP answer must be
    one ``launch-flags`` made for this user (:func:`marker_problem`); else :class:`InputError` (exit 2), and no file
    is touched."""
    try:
        specs = server_info(client).get("forward_hooks") or []
    except Exception:  # the static level reports an unreadable server; here only the directory is asked
        return None
    for spec in specs if isinstance(specs, list) else []:
        if isinstance(spec, dict) and spec.get("hook_factory") == HOOK_FACTORY:
            where = Path(str((spec.get("config") or {}).get("evidence_dir") or ""))
            if where.is_dir():
                problem = marker_problem(where)
                if problem is not None:
                    from specparity.errors import InputError

                    raise InputError(f"the server names {where} as its hooks' evidence directory, and the gate "
                                     f"writes and deletes files there only if `specparity launch-flags --engine "
                                     f"sglang --evidence-dir {where}` made it: {problem}. No file was touched",
                                     path=where, field="evidence_dir")
                return where
    return None


_FRAME = re.compile(r'File "[^"]*/sglang/(srt/[^"]+|[^"]+)", line (\d+), in (\S+)')


def innermost_sglang_frames(log_lines: Iterable[str], count: int = 2) -> list[str]:
    """The innermost ``count`` sglang frames of the log's last traceback, innermost first (``srt/x.py:N fn``)."""
    lines = list(log_lines)
    start = max((i for i, ln in enumerate(lines) if "Traceback (most recent call last)" in ln), default=-1)
    frames = [f"{m.group(1).removeprefix('srt/')}:{m.group(2)} {m.group(3)}" for ln in lines[start + 1:]
              if (m := _FRAME.search(ln))]
    return frames[::-1][:count]
