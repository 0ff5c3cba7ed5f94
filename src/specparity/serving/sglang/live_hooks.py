"""The ``--forward-hooks`` factory that runs inside a live SGLang server's scheduler processes (one per TP rank).

SGLang reads ``--forward-hooks`` as a JSON list of ``{"name", "target_modules": [fnmatch patterns], "hook_factory":
"module:fn", "config": {...}}`` (0.5.23 ``srt/arg_groups/fields/observability.py:231-237``).
``model_executor/hook_manager.py:11-55`` ``register_forward_hooks`` calls ``factory(config)`` once per spec (:33) and
registers the returned callable with ``module.register_forward_hook`` on every module whose name matches (:42-54).
It runs once per model runner, target and draft, in ``model_executor/model_runner_components/cuda_graph_setup.py:
452-459`` ``finalize_cuda_graph_capture``: AFTER CUDA-graph capture, so nothing of ours is traced into a graph and
the hooks fire only on the eager path (prefill/extend, and any batch no graph covers). ``--forward-hooks`` first
appears in sglang 0.5.6 (``model_executor/model_runner.py:527-528``, after ``init_device_graphs``).

specparity's one spec (``serving/sglang/live.py`` ``hook_specs``) puts :func:`factory`'s hook on each runner's inner
``model`` (``config = {"evidence_dir": DIR}``). That hook is all an idle server runs:

- its first call (the end of the runner's first forward) adopts the model: it adds a forward pre-hook of its own on
  the same module, and notes ``ready/<pid>.json``;
- the pre-hook, at the start of every forward, looks for ``<evidence>/ARMED`` (one ``stat``). Only while that file
  exists (the gate creates it when a probe run starts and removes it after) does it install the taps, and it
  removes them once the file is gone. The file is a lease (JSON: the gate's pid and pid namespace, a deadline):
  the hooks disarm themselves, and remove the file, once the deadline passes or the gate's process is gone (a gate
  killed with SIGKILL), noting why in ``lease/<pid>.json``; so an attached server never records on without its gate. So an idle server pays one hooked module per forward of each runner and one
  ``stat``, and nothing of the taps. The first forward of each runner only adopts: the gate sends one priming
  request after arming (``live.live_capture``);
- the taps, while armed: on the drafter's ``fc``, its input ``input[0]`` (what SGLang feeds fc, after
  ``norm_before_fc``/``fc_norm`` where the drafter has them, as the in-process pre-hook sees it;
  ``models/llama_eagle3.py:236-247``); on the target's ``layers.<i>.input_layernorm`` and ``norm``, the residual
  stream at every boundary (``specparity.sources``). 0.5.23's layers hand the residual to the next layer's input
  norm (``layers/layer_boundary/stage.py:92-131`` ``_prepare``: the add+norm returns ``(normed, hidden +
  residual)``), and SGLang's own aux capture reads that same updated residual (``stage.py:444-458``), so
  ``embedding`` = layer 0's input-norm input (the stream entering layer 0, where ``stage.py:425-432`` captures
  boundary 0), ``layer:i-1`` = layer i's input-norm output ``[1]`` (boundary i), ``layer:L-1`` and ``final_norm``
  = ``norm``'s output ``[1]`` and ``[0]`` (``residual/batch.py:135-190``);
- the end hook of an armed forward writes the record: what the taps collected, the target's aux hidden states (the
  inner model returns ``(hidden, aux)`` when it captures, ``models/llama.py:500-505``), and the batch's token ids,
  positions, ``extend_seq_lens``/``extend_prefix_lens`` and ``req_pool_indices`` (which rows are which request's).

**Reduced evidence (the default).** While armed, the gate may leave one expectation per probe in
``<evidence>/expect/p<i>.safetensors`` (the probe's token ids, its recorded fc input, the contract's sources, the rtol
table and the lead rank: ``compare/reduced.py``). A target extend segment whose tokens are a whole probe (prefix 0)
then has its boundaries held in this process, on the server's device, instead of written; the draft extend of the
same request (same ``req_pool_index``, same rows: ``eagle_worker_v2.py:1593-1600`` runs it right after) reduces
them against its fc rows with the gate's own scan (``compare/reduced.py`` ``reduce_sample``) on the lead rank, and
every other rank writes only the SHA-256 of its fc rows (``serving/vllm/tap_reduce.py`` ``fc_digest``). So a rank's
record of a probe is its token ids, the per-token statistics (lead), the fc input and final norm (lead) or one
digest (the others): a few MB at Kimi-K2.5's geometry where the full atlas is ~460 MB per rank. A segment that is not
a whole probe (a chunked prefill, another client's request) is written as the full atlas, exactly as without
expectations, and the gate refuses to judge the two forms together (exit 3).

Each record is one safetensors file ``records/r<rank>-<runner>-<pid>-<seq>.safetensors`` (written to a temp name in
the same directory, then renamed), tagged in its metadata with the model runner (``target``/``draft``), the
``torch.distributed`` rank and world size, the forward mode (``EXTEND``, ``MIXED``, ...), the runner's call number
and the process's sequence number, the tensor keys (``fc_input``; ``embedding``, ``layer:<i>``, ``final_norm``,
``aux``; ``input_ids``, ...), the ``sgl_kernel`` stand-in's calls and the active stand-ins. DECODE and IDLE forwards
are never written. Never pickle; the taps only clone (``detach().clone()``) and return None, so no tensor and no
module output changes. The evidence directory must be a directory of this user with mode 0700, else the factory
registers nothing (and says so on stderr).

Inside SGLang's processes this module imports only the standard library and ``live_wire`` (standard library only) at
import time; torch and safetensors when a record is written.
"""

# Over 400 lines, on purpose: this file is everything of specparity that runs inside the user's SGLang server, one
# class (_Process) whose methods are the hook's whole life in a scheduler process (adopt, arm on the lease, tap, write,
# hold, reduce), so that what a live check does inside a production server can be audited in one read. What the gate
# and the hooks exchange through the evidence directory is live_wire.py; the reduction's arithmetic is
# compare/reduced.py.
from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specparity.serving.sglang.live_wire import (  # the evidence directory's layout, shared with the gate's side
    ARMED,
    AUX_HELD,
    AUX_WIDTH,
    DIGEST_META,
    EVIDENCE_KEY,
    FACTORY_CALLS,
    LEASE,
    READY,
    RECORD_FORMAT,
    RECORDS,
    REDUCE_ERROR,
    REDUCED_META,
    REDUCED_PREFIX,
    evidence_dir_problem,
    lease_ended,
    read_expectations,
    read_lease,
    save_atomic,
    segments,
)

# forward modes never written (sglang 0.5.23 model_executor/forward_batch_info.py:198-222)
SKIPPED_MODES = frozenset({"DECODE", "IDLE"})


class _Process:
    """This process's hook state for one evidence directory: what the one SGLang-registered hook installs."""

    def __init__(self, evidence: Path) -> None:
        self.evidence = evidence
        self.flag = str(evidence / ARMED)
        self.records = evidence / RECORDS
        self.local = threading.local()  # per forward thread: armed (this forward is recorded), pending
        self.seq = itertools.count()
        self.calls: dict[str, int] = {}
        # keyed by the inner model itself, weakly: an id() would be reused by a model built after another was freed
        # (that one would then never be adopted), and a freed model's entries go with it
        self.names: weakref.WeakKeyDictionary[Any, tuple[dict[int, str], int]] = weakref.WeakKeyDictionary()
        self.adopted: weakref.WeakSet[Any] = weakref.WeakSet()  # inner models that carry our start-of-forward pre-hook
        self.taps: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()  # the taps while armed
        self.arming: tuple[int, int] | None = None  # (inode, mtime) of the ARMED file the expectations belong to
        self.lease: dict[str, Any] = {}  # this arming's lease (the ARMED file's JSON)
        self.expect: list[dict[str, Any]] = []  # this arming's per-probe expectations (reduced evidence)
        self.held: dict[int, tuple[dict[str, Any], dict[str, Any] | None]] = {}  # req_pool_index -> (exp, atlas)

    # ------------------------------------------------------------------ per forward
    def end_hook(self, module: Any, args: tuple[Any, ...], output: Any) -> None:
        """SGLang's forward hook on the inner ``model`` (the one ``--forward-hooks`` registers): the end of a forward.
        The first call adopts the model (installs the start-of-forward pre-hook, :meth:`start_hook`); an armed
        forward's record is written here."""
        if module not in self.adopted:
            self.adopted.add(module)
            module.register_forward_pre_hook(self.start_hook)
            _note(self.evidence, READY, "target" if not hasattr(module, "fc") else "draft")
            return
        local = self.local
        if not getattr(local, "armed", False):
            return
        pending, local.armed, local.pending = local.pending, False, []
        try:
            self.write(module, args, output, pending)
        except Exception as exc:  # never break the server's forward; say why on its log
            sys.stderr.write(f"specparity live hook: record not written: {type(exc).__name__}: {exc}\n")

    def start_hook(self, module: Any, args: tuple[Any, ...]) -> None:
        """The start of every forward of an adopted model: one ``stat`` of the flag. Armed: the taps are installed
        (once) and this forward is recorded unless it is a DECODE/IDLE one; disarmed: the taps are removed."""
        local = self.local
        try:
            st = os.stat(self.flag)
            armed = True
        except OSError:
            armed = False
        if armed and (st.st_ino, st.st_mtime_ns) != self.arming:  # a new arming: its expectations, nothing held
            self.arming, self.held = (st.st_ino, st.st_mtime_ns), {}
            self.expect = read_expectations(self.evidence)
            self.lease = read_lease(self.flag)
        if armed:
            ended = lease_ended(self.lease)
            if ended is not None:  # the gate did not drain in time, or is gone: disarm, for every rank
                with contextlib.suppress(OSError):
                    os.unlink(self.flag)
                _note(self.evidence, LEASE, ended)
                armed = False
        if not armed and self.arming is not None:
            self.arming, self.held, self.expect, self.lease = None, {}, [], {}
        taps = self.taps.get(module)
        if armed and taps is None:
            self.taps[module] = self._install(module)
        elif not armed and taps is not None:
            for handle in self.taps.pop(module):
                handle.remove()
        if armed:
            batch = next((a for a in args if hasattr(a, "forward_mode")), None)
            mode = getattr(getattr(batch, "forward_mode", None), "name", "UNKNOWN")
            armed = mode not in SKIPPED_MODES
        local.armed, local.pending = armed, []

    def _install(self, inner: Any) -> list[Any]:
        """The taps on this model's modules: the drafter's ``fc``; the target's input norms and final norm."""
        names, _ = self._module_names(inner)
        modules = dict(inner.named_modules())
        handles = []
        if hasattr(inner, "fc"):
            handles.append(inner.fc.register_forward_hook(self._tap("fc")))
        else:
            for name in names.values():
                if name == "norm" or _layer_index(name, suffix="input_layernorm") is not None:
                    handles.append(modules[name].register_forward_hook(self._tap("atlas")))
        return handles

    def _tap(self, tap: str) -> Callable[..., None]:
        def hook(module: Any, args: tuple[Any, ...], output: Any) -> None:
            local = self.local
            if getattr(local, "armed", False):
                local.pending.append((tap, module, _take(tap, args, output)))

        hook.__qualname__ = f"specparity_live_{tap}_tap"
        return hook

    # ------------------------------------------------------------------ the record
    def _module_names(self, inner: Any) -> tuple[dict[int, str], int]:
        """``{id(module): name}`` under the inner model, and its layer count (the highest ``layers.<i>`` + 1; under
        pipeline parallelism the missing layers keep their place, ``models/llama.py:440-452`` make_pp_layers)."""
        known = self.names.get(inner)
        if known is None:
            names = {id(m): n for n, m in inner.named_modules()}
            indices = [i for i in (_layer_index(n) for n in names.values()) if i is not None]
            known = self.names[inner] = (names, max(indices) + 1 if indices else 0)
        return known

    def write(self, inner: Any, args: tuple[Any, ...], output: Any, pending: list[tuple[str, Any, Any]]) -> None:
        batch = next((a for a in args if hasattr(a, "forward_mode")), None)
        mode = getattr(getattr(batch, "forward_mode", None), "name", "UNKNOWN")
        if mode in SKIPPED_MODES:
            return
        if evidence_dir_problem(self.evidence) is not None:
            return
        import torch

        runner = "draft" if hasattr(inner, "fc") else "target"
        names, num_layers = self._module_names(inner)
        tensors: dict[str, torch.Tensor] = {}
        for tap, module, taken in pending:
            name = names.get(id(module))
            if name is None or (tap == "fc") != (runner == "draft"):
                continue  # another model's module, or the drafter's own norms (only its fc input is evidence)
            for key, value in _boundaries(tap, name, taken, num_layers):
                tensors[key] = value  # a later call of the same module in this forward wins
        if runner == "target" and isinstance(output, tuple) and len(output) == 2:
            aux = list(output[1]) if output[1] is not None else []
            if aux and all(isinstance(t, torch.Tensor) for t in aux):
                tensors["aux"] = torch.cat([t.detach() for t in aux], dim=-1).clone()
        ids = getattr(batch, "input_ids", None)
        if isinstance(ids, torch.Tensor):  # rows left over from a forward that raised before its end: dropped
            tensors = {k: v for k, v in tensors.items() if v.dim() >= 1 and v.shape[0] == ids.shape[0]}
        for key in ("input_ids", "positions", "extend_seq_lens", "extend_prefix_lens", "req_pool_indices"):
            value = getattr(batch, key, None)
            if isinstance(value, torch.Tensor):
                tensors[key] = value.detach().to("cpu", copy=True).to(torch.int64)
        if runner == "draft" and "fc_input" not in tensors:
            # the fc tap did not fire: a draft body replayed in a CUDA graph (0.5.23 prefill_cuda_graph_runner.py
            # :2187-2212 swaps the inner model's forward for a replay, inside nn.Module.__call__, so this end hook
            # still runs), or a draft decode step that never reaches fc. What fc would have been fed is the batch's
            # spec_info.hidden_states (models/llama_eagle3.py:233-247), before any norm_before_fc/fc_norm.
            hidden = getattr(getattr(batch, "spec_info", None), "hidden_states", None)
            if not isinstance(hidden, torch.Tensor) or not isinstance(ids, torch.Tensor) or \
                    hidden.dim() != 2 or hidden.shape[0] != ids.shape[0]:
                return  # nothing fc-shaped in this forward: nothing to say
            tensors["spec_hidden"] = hidden.detach().clone()
        rank, world = _rank()
        reduced: dict[str, str] = {}
        if self.expect and isinstance(ids, torch.Tensor):
            reduced = (self._hold(batch, ids, tensors, rank) if runner == "target"
                       else self._reduce(batch, tensors, rank))
        self.calls[runner] = call = self.calls.get(runner, -1) + 1
        seq = next(self.seq)
        from specparity.serving.sglang.live_stand_ins import active, kernel_stub_calls

        stub = kernel_stub_calls()
        meta = {"format": RECORD_FORMAT, "runner": runner, "rank": str(rank), "world_size": str(world),
                "forward_mode": mode, "call": str(call), "seq": str(seq), "pid": str(os.getpid()),
                "kernel_stub_calls": json.dumps(None if stub is None else list(stub)),
                "stand_ins": json.dumps(list(active())), "tensors": json.dumps(sorted(tensors)),
                EVIDENCE_KEY: "reduced" if reduced else "full", **reduced}
        self.records.mkdir(mode=0o700, exist_ok=True)
        final = self.records / f"r{rank}-{runner}-{os.getpid()}-{seq:08d}.safetensors"
        save_atomic({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, meta, final)

    # ------------------------------------------------------------------ reduced evidence
    def _hold(self, batch: Any, ids: Any, tensors: dict[str, Any], rank: int) -> dict[str, str]:
        """A target extend: each segment that is a whole probe has its boundaries held here (the lead rank) for the
        draft extend to reduce, and the record drops the boundaries (every rank) and the final norm and aux states
        (all but the lead). ``{}`` (the record stays full) when no segment is a whole probe."""
        held: dict[int, int] = {}
        for start, n, prefix, pool in _segments(batch, int(ids.shape[0])):
            seg = ids[start:start + n].tolist() if prefix == 0 else None
            exp = next((e for e in self.expect if e["ids"] == seg), None)
            if exp is None:
                continue
            atlas = {k: v[start:start + n] for k, v in tensors.items() if _atlas_key(k) or k == "final_norm"}
            lead = rank == exp["lead"]
            if lead and (not _fits(exp, atlas, n) or (exp["served"] == "aux" and "aux" not in tensors)):
                continue  # a shape the reduction cannot take: this forward's record stays the full atlas
            if lead and exp["served"] == "aux":
                atlas = {**atlas, AUX_HELD: tensors["aux"][start:start + n]}
            self.held[pool] = (exp, atlas if lead else None)
            held[pool] = exp["index"]
        if not held:
            return {}
        lead = rank == next(e["lead"] for e in self.expect)
        keep_aux = lead and any(e["served"] == "aux" for e in self.expect)
        meta = {"held": json.dumps({str(p): i for p, i in held.items()})}
        if "aux" in tensors:  # its width says how many aux states the target captured (the gate's count check)
            meta[AUX_WIDTH] = str(int(tensors["aux"].shape[-1]))
        for k in [k for k in tensors if _atlas_key(k) or (not lead and k == "final_norm")
                  or (k == "aux" and not keep_aux)]:
            del tensors[k]
        return meta

    def _reduce(self, batch: Any, tensors: dict[str, Any], rank: int) -> dict[str, str]:
        """A draft extend after held target rows: per probe, the lead rank's statistics of its fc rows against the
        held boundaries (tensors ``reduced<i>/...``), every other rank's digest of its fc rows; the non-lead ranks'
        records then carry no fc input."""
        fc = tensors.get("fc_input")
        if fc is None or not self.held:
            return {}
        from specparity.compare.reduced import reduce_sample
        from specparity.serving.vllm.tap_reduce import fc_digest

        meta: dict[str, str] = {}
        lead = False
        for start, n, _prefix, pool in _segments(batch, int(fc.shape[0])):
            exp, atlas = self.held.get(pool, (None, None))
            if exp is None or n != len(exp["ids"]):
                continue
            del self.held[pool]
            x = fc[start:start + n]
            if atlas is not None and AUX_HELD in atlas:  # the gate compares the target's aux states (normed before fc)
                atlas = dict(atlas)
                x = atlas.pop(AUX_HELD)
            index = exp["index"]
            if rank != exp["lead"]:
                meta[f"{DIGEST_META}{index}"] = fc_digest(x)
                continue
            lead = True  # the lead rank's record keeps its fc input, whatever its reduction gives
            try:
                assert atlas is not None
                first = next(iter(atlas.values()))
                hidden = int(first.shape[-1])
                rtol = exp["rtol"][f"{_dt(x)}/{_dt(first)}"]
                chunks = max(int(x.shape[-1]) // hidden, int(exp["recorded"].shape[-1]) // hidden)
                red = reduce_sample(x, exp["recorded"].to(device=x.device, dtype=x.dtype), atlas,
                                    expected=exp["expected"], rtol=[float(r) for r in rtol[:chunks]])
            except Exception as exc:  # named in the record; the gate refuses the probe (exit 3), never judges it
                meta[f"{REDUCE_ERROR}/{index}"] = f"{type(exc).__name__}: {exc}"
                continue
            for k, v in red.tensors.items():
                tensors[f"{REDUCED_PREFIX}{index}/{k}"] = v
            meta[f"{REDUCED_META}{index}"] = json.dumps(red.meta)
        if meta and not lead:
            tensors.pop("fc_input", None)  # the digest stands for it
        return meta


def _atlas_key(key: str) -> bool:
    return key == "embedding" or key.startswith("layer:")


def _dt(t: Any) -> str:
    return str(t.dtype).removeprefix("torch.")


def _fits(exp: dict[str, Any], atlas: dict[str, Any], rows: int) -> bool:
    """Whether the reduction can take these boundaries (the same checks as vLLM's tap, tap_reduce.reduced_call)."""
    if not atlas:
        return False
    first = next(iter(atlas.values()))
    hidden = int(first.shape[-1])
    rec = exp["recorded"]
    return (hidden > 0 and int(rec.shape[0]) == rows and int(rec.shape[-1]) % hidden == 0
            and all(tuple(v.shape) == (rows, hidden) for v in atlas.values())
            and any(key.endswith(f"/{_dt(first)}") for key in exp["rtol"]))


def _segments(batch: Any, rows: int) -> list[tuple[int, int, int, int]]:
    """``(row start, rows, prefix length, req_pool_index)`` per request of a ForwardBatch-like ``batch``."""
    return segments(getattr(batch, "extend_seq_lens", None), getattr(batch, "extend_prefix_lens", None),
                    getattr(batch, "req_pool_indices", None), rows)


def _take(tap: str, args: tuple[Any, ...], output: Any) -> Any:
    """The tensors one hook call keeps, cloned at once (a later fused kernel may update the stream in place):
    fc's input; or a norm's ``(stream in, updated residual, normed)``, ``None`` where the call has none."""
    if tap == "fc":
        return args[0].detach().clone()
    if isinstance(output, tuple):  # called with a residual: (normed, hidden + residual)
        return (None, output[1].detach().clone(), output[0].detach().clone())
    stream_in = args[0].detach().clone() if args and hasattr(args[0], "detach") else None
    return (stream_in, None, output.detach().clone())


def _boundaries(tap: str, name: str, taken: Any, num_layers: int) -> list[tuple[str, Any]]:
    """The record keys of one hook call, in canonical source names (``specparity.sources``): boundary ``b`` (the
    stream entering layer ``b``) is ``embedding`` for 0, else ``layer:<b-1>``."""
    if tap == "fc":
        return [("fc_input", taken)] if name == "fc" else []
    stream_in, residual, normed = taken
    if name == "norm":
        out = [("final_norm", normed)]
        if residual is not None and num_layers > 0:
            out.append((f"layer:{num_layers - 1}", residual))
        return out
    index = _layer_index(name, suffix="input_layernorm")
    if index is None:
        return []
    if residual is not None and index > 0:
        return [(f"layer:{index - 1}", residual)]
    if index == 0 and residual is None and stream_in is not None:
        return [("embedding", stream_in)]
    return []


def _layer_index(name: str, *, suffix: str | None = None) -> int | None:
    """``i`` for ``layers.<i>`` (or ``layers.<i>.<suffix>``), else None."""
    parts = name.split(".")
    want = 2 if suffix is None else 3
    if len(parts) != want or parts[0] != "layers" or not parts[1].isdigit():
        return None
    if suffix is not None and parts[2] != suffix:
        return None
    return int(parts[1])


def _rank() -> tuple[int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    return 0, 1


_PROCESSES: dict[str, _Process] = {}


def _note(evidence: Path, folder_name: str, entry: str) -> None:
    """Append ``entry`` to ``<folder_name>/<pid>.json`` (with this process's rank), atomically; never raises."""
    folder = evidence / folder_name
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        path = folder / f"{os.getpid()}.json"
        seen: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        rank, world = _rank()
        seen.update(pid=os.getpid(), rank=rank, world_size=world, entries=[*seen.get("entries", []), entry])
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(seen))
        os.replace(tmp, path)
    except (OSError, ValueError):
        pass


def factory(config: dict[str, Any]) -> Callable[..., None] | None:
    """SGLang's hook factory (``hook_manager.py:33``): the end-of-forward hook for the inner ``model`` of each model
    runner, or None (SGLang then registers nothing and logs it) when the evidence directory is unsafe."""
    evidence = Path(str(config.get("evidence_dir", "")))
    problem = evidence_dir_problem(evidence) if str(evidence) not in ("", ".") else "no evidence_dir in the config"
    if problem is not None:
        sys.stderr.write(f"specparity live hook: not registered: {problem}\n")
        return None
    key = str(evidence.resolve())
    process = _PROCESSES.get(key)
    if process is None:
        process = _PROCESSES[key] = _Process(evidence)
    _note(evidence, FACTORY_CALLS, "model")

    def specparity_live_end_hook(module: Any, args: tuple[Any, ...], output: Any) -> None:
        process.end_hook(module, args, output)

    return specparity_live_end_hook
