"""The ``vllm.general_plugins`` tap: what vLLM's own workers feed the drafter's ``fc``, per rank.

vLLM loads every ``vllm.general_plugins`` entry point in every process it starts, the engine core and
each tensor-parallel worker included (``vllm/plugins/__init__.py:77``). :func:`register` does nothing
unless :data:`ENV_ON` is set, so the same plugin can sit in a production server's venv.
When enabled it wraps the model runner's ``load_model`` (``vllm/v1/worker/cpu_model_runner.py:62-78``,
``gpu_model_runner.py``), and once the target and the drafter are loaded installs, in that worker:

- a forward pre-hook on the drafter's ``fc`` (called from ``combine_hidden_states``,
  ``vllm/model_executor/models/llama_eagle3.py:397-418``): every call, prefill and every verify step,
  is kept in the worker's memory as one safetensors blob;
- with :data:`ENV_ATLAS` set, a wrapper on the target's ``_maybe_add_hidden_state``
  (``vllm/model_executor/models/interfaces.py:1601-1611``), the very function that picks the aux states,
  called at every boundary ``0..L`` of the layer loop (``models/llama.py:428-441``) with the values vLLM
  would capture (``hidden_states + residual``), plus a forward hook on the target's final ``norm``
  (``llama.py:452``). The boundaries of the target forward that preceded an fc call go into that call's blob.

With the atlas in :data:`REDUCED` mode (the gate's default) the boundaries are recorded only for the prefill of the
probe the gate announced (:data:`EXPECT`), kept on the device, and reduced there to the statistics attribution reads
(``tap_reduce.py``): no atlas leaves the worker.

The evidence leaves the worker only through vLLM's own channel: the gate calls :func:`drain` with
``LLM.collective_rpc`` (``vllm/entrypoints/llm.py:574``), which every executor implements (in-process,
multiprocessing, Ray across nodes), so no rank's evidence depends on a path only one node can read. Each
reply names the rank, its place in the TP/PP groups, its host (and Ray node), what was installed, and the
fc calls seen since the last drain. The tap never changes a tensor: hooks only clone.

In a server (``vllm serve`` / ``python -m vllm.entrypoints.openai.api_server``) the same methods reach the workers
through vLLM's ``--worker-extension-cls`` (:class:`TapWorkerExtension`; ``v1/worker/worker_base.py:296-320`` mixes it
into the worker class) and the dev-mode ``POST /collective_rpc`` route (``entrypoints/serve/dev/rpc/api_router.py:
23-58``, which returns dicts and lists as JSON, so the blobs go as base64 text there). In a server nothing is
installed until the gate arms the tap (:data:`ARM`), and a disarmed tap's hooks return at once: an idle server
with the switches on pays one attribute read per hooked call.

Each fc call carries the token ids, positions and request boundaries of the batch it was fed (``tap/ids``,
``tap/positions``, ``tap/qsl``): the drafter's ``propose`` is handed them beside the hidden states that reach fc
(``v1/spec_decode/llm_base_proposer.py:514-552``: ``target_token_ids``, ``target_positions``,
``common_attn_metadata.query_start_loc_cpu``; built in ``v1/worker/gpu_model_runner.py:4946-5017``, which the CPU
runner inherits), so the gate can tell its own probe's rows from another client's in the same batch
(``serving/vllm/evidence.py``).

An armed tap is bounded and leased, so a gate that dies (SIGKILL) leaves nothing behind in an attached server:

- ``pending`` holds at most :data:`MAX_PENDING_CALLS` calls and :data:`MAX_PENDING_BYTES` bytes (the gate drains
  after every probe, which is ~20 fc calls at 16 generated tokens); a call past either bound disarms the tap, drops
  what it held, and the next drain says so (``overflow``: the gate's ``tap_overflow``, exit 3);
- arming carries a lease (``lease_s``, the gate's per-request timeout); every drain and expectation renews it. A tap
  whose lease runs out disarms itself and drops what it held, from a timer thread, so with no traffic at all too
  (``expired``: the gate's ``tap_lease_expired``, exit 3).
"""

# Over 400 lines, on purpose: this file is everything of specparity that runs inside vLLM's own workers (the plugin
# entry point, the worker extension's RPC methods, the fc and boundary wrappers, the bounds and the lease), so that
# what a live check does inside a production server can be audited in one read. The RPC names are tap_wire.py; the
# reduction is tap_reduce.py; the deployment the describe RPC answers is deployment.py.
from __future__ import annotations

import functools
import inspect
import os
import socket
import sys
import threading
import time
from typing import Any, cast

from specparity.serving.vllm.tap_wire import (  # the RPC names and batch keys, shared with the gate's side
    ARM,
    DESCRIBE,
    DISARM,
    EXPECT,
    IDS_KEY,
    POSITIONS_KEY,
    QSL_KEY,
    RPC,
)

ENV_ON = "SPECPARITY_VLLM_TAP"
ENV_ATLAS = "SPECPARITY_VLLM_TAP_ATLAS"
SERVER_MODE = "server"  # ENV_ON's value in a server: RPC methods only, hooks installed when the gate arms the tap
REDUCED = "reduced"  # ARM's atlas value (and ENV_ATLAS's) for the default evidence: serving/vllm/tap_reduce.py
EXTENSION = "specparity.serving.vllm.tap.TapWorkerExtension"  # the --worker-extension-cls a server gets
_MARK = "_specparity_tap_wrapped"
# the armed tap's bounds (module docstring): calls and bytes held between two drains, and the lease's default and cap
MAX_PENDING_CALLS = 1024
MAX_PENDING_BYTES = 2 * 1024**3
LEASE_S = 120.0
MAX_LEASE_S = 3600.0


def _rank() -> int:
    import torch.distributed as dist

    return int(dist.get_rank()) if dist.is_available() and dist.is_initialized() else 0


def _group_ranks() -> dict[str, int]:
    """This worker's rank in vLLM's TP and PP groups (``vllm/distributed/parallel_state.py``), where initialised."""
    out: dict[str, int] = {}
    try:
        from vllm.distributed import parallel_state as ps

        out["tp_rank"] = int(ps.get_tp_group().rank_in_group)
        out["pp_rank"] = int(ps.get_pp_group().rank_in_group)
    except Exception:  # groups not initialised (a process that is not a worker)
        pass
    return out


def _node() -> dict[str, Any]:
    """Where this worker runs: host, process, and the Ray node id when Ray started it."""
    out: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(), "ray_node_id": None}
    ray = sys.modules.get("ray")  # never imported here: only a worker Ray started has it
    if ray is not None:
        try:
            if ray.is_initialized():
                out["ray_node_id"] = str(ray.get_runtime_context().get_node_id())
        except Exception:
            pass
    return out


def _inner_target(model: Any) -> Any:
    # the EagleModelMixin holder, unwrapped as set_aux_hidden_state_layers does (interfaces.py:1689-1710)
    parent = model.get_language_model() if hasattr(model, "get_language_model") else model
    return getattr(parent, "model", parent)


class _Tap:
    """Per-worker state: the fc calls not yet drained, and the boundaries of the last target forward."""

    def __init__(self, meta: dict[str, Any], atlas: bool, *, armed: bool = True, reduced: bool = False) -> None:
        self.meta, self.atlas_on, self.armed = meta, atlas, armed
        self.pending: list[bytes] = []
        self.atlas: dict[str, Any] = {}
        # reduced evidence (tap_reduce.py): the expected probe (EXPECT) and how its first fc call went
        self.reduced, self.expect, self.probe = reduced, cast("dict[str, Any] | None", None), cast("str | None", None)
        # the batch fed to the drafter's propose now (token ids, positions, request boundaries; CPU tensors)
        self.batch: dict[str, Any] | None = None
        # bounds and lease (module docstring); ``disarmed``: why the tap disarmed itself since it was armed
        self.max_calls, self.max_bytes, self.held = MAX_PENDING_CALLS, MAX_PENDING_BYTES, 0
        self.lease_s, self.deadline = LEASE_S, float("inf")
        self.disarmed: dict[str, Any] | None = None
        self.lock = threading.Lock()
        self._wake = threading.Event()
        self._watcher: threading.Thread | None = None

    def _recording(self) -> bool:
        # reduced: the boundaries of a probe's prefill only, kept on the device; full: every forward's, on the host
        return self.armed and (not self.reduced or self.expect is not None)

    def boundary(self, index: int, value: Any) -> None:
        if not self._recording():
            return
        if index == 0:
            self.atlas = {}
        self.atlas[f"b{index}"] = value.detach().clone() if self.reduced else value.detach().to("cpu").clone()

    def final_norm(self, out: Any) -> None:
        if not self._recording():
            return
        t = out[0] if isinstance(out, tuple) else out
        self.atlas["final_norm"] = t.detach().clone() if self.reduced else t.detach().to("cpu").clone()

    def fc_call(self, x: Any) -> None:
        if not self.armed:
            return
        if self.reduced:
            from specparity.serving.vllm.tap_reduce import reduced_call

            self.keep(reduced_call(self, x))
            return
        from safetensors.torch import save

        tensors = {"fc": x.detach().to("cpu").contiguous().clone(), **self.batch_tensors()}
        if self.atlas_on:
            tensors.update({f"atlas/{k}": v.contiguous() for k, v in self.atlas.items()})
        self.atlas = {}
        self.keep(save(tensors))

    def batch_tensors(self) -> dict[str, Any]:
        """The batch facts of the call being recorded (empty where the drafter's propose was not seen)."""
        b = self.batch or {}
        return {k: v for k, v in ((IDS_KEY, b.get("ids")), (POSITIONS_KEY, b.get("positions")),
                                  (QSL_KEY, b.get("qsl"))) if v is not None}

    def keep(self, blob: bytes) -> None:
        """Hold one call's blob for the next drain, within the bounds: past either, disarm and drop everything."""
        with self.lock:
            if not self.armed:
                return
            if len(self.pending) + 1 > self.max_calls or self.held + len(blob) > self.max_bytes:
                self._disarm_locked({"why": "overflow", "calls": len(self.pending) + 1,
                                     "bytes": self.held + len(blob), "max_calls": self.max_calls,
                                     "max_bytes": self.max_bytes})
                return
            self.pending.append(blob)
            self.held += len(blob)

    def take(self) -> list[bytes]:
        """What a drain sends: every call held, and the lease renewed."""
        with self.lock:
            calls, self.pending, self.held = self.pending, [], 0
            self.renew_locked()
            return calls

    def renew_locked(self) -> None:
        if self.armed:
            self.deadline = time.monotonic() + self.lease_s

    def lease(self, lease_s: float) -> None:
        """Start (or restart) the lease: the watcher thread disarms the tap once it runs out without a renewal."""
        with self.lock:
            self.lease_s = min(max(float(lease_s), 0.0), MAX_LEASE_S)
            self.renew_locked()
            if self._watcher is None or not self._watcher.is_alive():
                self._watcher = threading.Thread(target=self._watch, name="specparity-tap-lease", daemon=True)
                self._watcher.start()

    def _watch(self) -> None:
        while True:
            with self.lock:
                if not self.armed:
                    return
                left = self.deadline - time.monotonic()
                if left <= 0:
                    self._disarm_locked({"why": "lease", "lease_s": self.lease_s})
                    return
            self._wake.wait(left)
            self._wake.clear()

    def _disarm_locked(self, why: dict[str, Any] | None) -> None:
        self.armed, self.pending, self.held, self.atlas, self.expect = False, [], 0, {}, None
        self.batch, self.deadline = None, float("inf")
        if why is not None:
            self.disarmed = why
        self._wake.set()

    def disarm(self, why: dict[str, Any] | None = None) -> None:
        with self.lock:
            self._disarm_locked(why)

    def arm(self) -> None:
        with self.lock:
            self.armed, self.pending, self.held, self.atlas, self.disarmed = True, [], 0, {}, None
            self._wake.clear()


def _batch_of(sig: inspect.Signature | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The batch facts of one ``propose`` call (``v1/spec_decode/llm_base_proposer.py:514-552``), as CPU int64
    tensors: the token ids and positions of every row fed to fc, and the request boundaries (``query_start_loc``)."""
    import torch

    try:
        bound = sig.bind_partial(*args, **kwargs).arguments if sig is not None else dict(kwargs)
    except TypeError:
        bound = dict(kwargs)
    out: dict[str, Any] = {}
    ids, pos = bound.get("target_token_ids"), bound.get("target_positions")
    cam = bound.get("common_attn_metadata")
    qsl = getattr(cam, "query_start_loc_cpu", None)
    if isinstance(ids, torch.Tensor):
        out["ids"] = ids.detach().reshape(-1).to("cpu", torch.int64).clone()
    if isinstance(pos, torch.Tensor):  # [num_tokens], or [3, num_tokens] under M-RoPE (the text row first)
        out["positions"] = (pos[0] if pos.ndim == 2 else pos).detach().reshape(-1).to("cpu", torch.int64).clone()
    if isinstance(qsl, torch.Tensor):
        out["qsl"] = qsl.detach().reshape(-1).to("cpu", torch.int64).clone()
    return out


def _wrap_propose(drafter: Any, tap: _Tap) -> None:
    """Keep the batch facts of each ``propose`` call on the tap while it runs (armed only: a disarmed tap reads
    nothing); the drafter's fc is called inside it (``llm_base_proposer.py:550``)."""
    propose = getattr(drafter, "propose", None)
    if not callable(propose) or getattr(propose, _MARK, False):
        return
    try:
        sig: inspect.Signature | None = inspect.signature(propose)
    except (TypeError, ValueError):
        sig = None

    def proposing(*args: Any, **kwargs: Any) -> Any:
        if tap.armed:
            tap.batch = _batch_of(sig, args, kwargs)
        try:
            return propose(*args, **kwargs)
        finally:
            tap.batch = None

    functools.update_wrapper(proposing, propose)
    setattr(proposing, _MARK, True)
    drafter.propose = proposing


_ACTIVE: _Tap | None = None  # this process's tap (one model runner per vLLM worker process)


def install(runner: Any, *, atlas: bool, armed: bool = True, reduced: bool = False) -> dict[str, Any]:
    """Install the hooks on one loaded model runner; returns what was installed."""
    global _ACTIVE
    meta: dict[str, Any] = {"rank": _rank(), **_group_ranks(), **_node(), "drafter": None, "fc": None,
                            "aux_layers": None}
    tap = _Tap(meta, atlas, armed=armed, reduced=reduced)
    target = _inner_target(runner.model)
    meta["aux_layers"] = [int(b) for b in getattr(target, "aux_hidden_state_layers", ())]
    meta["num_layers"] = len(getattr(target, "layers", ()))
    drafter = getattr(runner, "drafter", None)
    if drafter is not None:
        meta["drafter"] = type(drafter).__name__
        fc = getattr(getattr(getattr(drafter, "model", None), "model", None), "fc", None)
        if fc is not None:
            # vLLM's linear layers keep their logical sizes (model_executor/layers/linear.py, LinearBase)
            meta["fc"] = {"type": type(fc).__name__, "in_features": int(getattr(fc, "input_size", -1)),
                          "out_features": int(getattr(fc, "output_size", -1)),
                          "bias": getattr(fc, "bias", None) is not None}
            fc.register_forward_pre_hook(lambda _m, args: tap.fc_call(args[0]))
            _wrap_propose(drafter, tap)
    if atlas and hasattr(target, "_maybe_add_hidden_state"):
        original = target._maybe_add_hidden_state

        def recording(aux: Any, layer_idx: int, hidden: Any, residual: Any) -> Any:
            # the armed flag first: a disarmed tap does no tensor arithmetic at all (the sum is the boundary's value,
            # what vLLM would capture there, interfaces.py:1601-1611)
            if tap._recording():
                tap.boundary(int(layer_idx), hidden + residual if residual is not None else hidden)
            return original(aux, layer_idx, hidden, residual)

        target._maybe_add_hidden_state = recording
        norm = getattr(target, "norm", None)
        if norm is not None:
            norm.register_forward_hook(lambda _m, _a, o: tap.final_norm(o))
    _ACTIVE = tap
    return meta


def drain(_worker: Any = None, encoding: str = "") -> dict[str, Any]:
    """Called in every worker as :data:`RPC` by ``LLM.collective_rpc``: this rank's identity, what the tap installed
    (``meta`` None: no tap in this worker), the fc calls since the last drain (``encoding="base64"``: as text, for
    the HTTP route) and, where the tap disarmed itself since it was armed, why (``disarmed``: overflow or lease).
    Renews the lease."""
    tap = _ACTIVE
    if tap is None:
        return {"rank": _rank(), **_group_ranks(), **_node(), "meta": None, "calls": []}
    calls = tap.take()
    state = {"armed": tap.armed, "disarmed": dict(tap.disarmed) if tap.disarmed else None}
    if encoding == "base64":
        import base64

        return {"rank": int(tap.meta["rank"]), **_group_ranks(), **_node(), "meta": dict(tap.meta), **state,
                "calls": [base64.b64encode(c).decode("ascii") for c in calls]}
    return {"rank": int(tap.meta["rank"]), **_group_ranks(), **_node(), "meta": dict(tap.meta), **state,
            "calls": calls}


def arm(worker: Any, atlas: str = "1", lease_s: str = "", max_calls: str = "", max_bytes: str = "") -> dict[str, Any]:
    """:data:`ARM`: install the hooks on this worker's loaded model runner (once) and start recording; drops what
    an earlier arming left undrained. ``atlas``: "" none, "1" the full atlas, :data:`REDUCED` the reduced evidence;
    ``lease_s``: seconds without a drain after which the tap disarms itself ("" no lease; the module docstring);
    ``max_calls``/``max_bytes``: the bounds on what it holds ("" :data:`MAX_PENDING_CALLS`,
    :data:`MAX_PENDING_BYTES`). Strings: the HTTP route's rule. Returns this rank's identity and meta, as
    :func:`drain` does."""
    tap = _ACTIVE
    if tap is None or tap.atlas_on != bool(atlas):
        runner = getattr(worker, "model_runner", None)
        if runner is None or getattr(runner, "model", None) is None:
            return {"rank": _rank(), **_group_ranks(), **_node(), "meta": None, "calls": []}
        if tap is None:
            install(runner, atlas=bool(atlas), armed=False)
        else:
            tap.atlas_on = bool(atlas)
    active = _ACTIVE
    assert active is not None
    active.max_calls = int(max_calls) if max_calls else MAX_PENDING_CALLS
    active.max_bytes = int(max_bytes) if max_bytes else MAX_PENDING_BYTES
    active.reduced, active.expect, active.probe = atlas == REDUCED, None, None
    active.arm()
    if lease_s:
        active.lease(float(lease_s))
    return drain(worker, encoding="base64")


def expect(worker: Any, recorded: str = "", spec: str = "") -> dict[str, Any]:
    """:data:`EXPECT`: the next probe's recorded fc input and token ids, and the gate's sources and rtol table, for
    the reduced evidence of its prefill (serving/vllm/tap_reduce.py); drops the boundaries of any forward before it;
    renews the lease."""
    tap = _ACTIVE
    if tap is None or not tap.reduced:
        return {"rank": _rank(), "expecting": False}
    from specparity.serving.vllm.tap_reduce import expectation

    with tap.lock:
        tap.renew_locked()
    if not tap.armed:  # disarmed by itself (overflow, lease): nothing to expect; the next drain says why
        return {"rank": int(tap.meta["rank"]), "expecting": False}
    tap.expect, tap.probe, tap.atlas = expectation(recorded, spec), None, {}
    return {"rank": int(tap.meta["rank"]), "expecting": True}


def disarm(worker: Any) -> dict[str, Any]:
    """:data:`DISARM`: stop recording (the hooks stay, returning at once) and drop what was not drained."""
    if _ACTIVE is not None:
        _ACTIVE.disarm()
    return {"rank": _rank(), "armed": False}


def describe(worker: Any) -> dict[str, Any]:
    """:data:`DESCRIBE`: the deployment as this worker's own ``VllmConfig`` resolved it (ResolvedDeployment as JSON),
    and this rank's identity."""
    from specparity.serving.vllm.deployment import describe_config

    return {"rank": _rank(), **_group_ranks(), **_node(), "deployment": describe_config(worker.vllm_config)}


class TapWorkerExtension:
    """The tap's RPC methods for a server's workers (``--worker-extension-cls``, :data:`EXTENSION`); installs nothing
    until armed."""

    def specparity_tap_arm(self, atlas: str = "1", lease_s: str = "", max_calls: str = "",
                           max_bytes: str = "") -> dict[str, Any]:
        return arm(self, atlas, lease_s, max_calls, max_bytes)

    def specparity_tap_drain(self, encoding: str = "") -> dict[str, Any]:
        return drain(self, encoding)

    def specparity_tap_expect(self, recorded: str = "", spec: str = "") -> dict[str, Any]:
        return expect(self, recorded, spec)

    def specparity_tap_disarm(self) -> dict[str, Any]:
        return disarm(self)

    def specparity_tap_describe(self) -> dict[str, Any]:
        return describe(self)


def _wrap(cls: type) -> None:
    original = cls.__dict__.get("load_model")
    if original is None or getattr(original, _MARK, False):
        return

    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        if os.environ.get(ENV_ON):
            mode = os.environ.get(ENV_ATLAS) or ""
            install(self, atlas=bool(mode), reduced=mode == REDUCED)
        return result

    functools.update_wrapper(load_model, original)  # __wrapped__: inspect reads the release's own load_model
    setattr(load_model, _MARK, True)
    cls.load_model = load_model  # type: ignore[attr-defined]


def register() -> None:
    """The entry point (``vllm.general_plugins``): inactive unless ``SPECPARITY_VLLM_TAP`` is set. Set to
    :data:`SERVER_MODE`, it only gives the workers the RPC methods and installs nothing until armed."""
    mode = os.environ.get(ENV_ON)
    if not mode:
        return
    from vllm.v1.worker.worker_base import WorkerBase

    for name, method in ((RPC, drain), (ARM, arm), (DISARM, disarm), (DESCRIBE, describe), (EXPECT, expect)):
        if not hasattr(WorkerBase, name):  # every hardware's worker (CPUWorker, Worker) derives from it
            setattr(WorkerBase, name, method)
    if mode == SERVER_MODE:
        return
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:  # vllm 0.34 removed the V1 runner (a CUDA build: its capture needs a GPU)
        return
    _wrap(GPUModelRunner)
    try:
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    except ImportError:  # a GPU-only build
        return
    _wrap(CPUModelRunner)
