"""SGLang's part of a live check, parent side: the hook switches, the static level from ``/server_info``, and the
hook evidence turned into the project's records. Imports no sglang (the server runs it; this process reads files
and HTTP answers).

The user's server is ``python -m sglang.launch_server ...`` (or ``sglang serve ...``), launched by the gate
(``serving/live/capture.py``) or already running. Everything goes through interfaces SGLang supports, cited from 0.5.23:

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
  (:func:`specparity.idrules.sglang.capture_plan`).
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
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specparity.serving.results import (
    HOOKS_MISSING,
    CaptureResult,
    ServingFailure,
)
from specparity.serving.sglang import live_wire
from specparity.serving.sglang.live_stand_ins import ENV_STAND_INS, SITE_DIR
from specparity.testpoints import pause

if TYPE_CHECKING:
    from specparity.compare.reduced import Reduction

HOOK_FACTORY = "specparity.serving.sglang.live_hooks:factory"

from specparity.serving.sglang.live_evidence import (  # noqa: E402  (the live check's parts, one name space)
    evidence_to_capture,
)
from specparity.serving.sglang.live_outcome import (  # noqa: E402
    GENERATE_TOKENS,
    HISTOGRAM,
    acceptance_from_meta,
    flush_cache,
    served_acceptance,
)
from specparity.serving.sglang.live_records import (  # noqa: E402
    EXTEND_MODES,
    Record,
    _notes,
    hooks_ready,
    hooks_registered,
    read_records,
    server_stand_ins,
    settle,
)
from specparity.serving.sglang.live_refusals import (  # noqa: E402
    CPU_REFUSALS,
    Refusal,
    cpu_refusals,
    innermost_sglang_frames,
    server_failure,
)
from specparity.serving.sglang.live_static import (  # noqa: E402
    ADAPTER,
    FIRST_RELEASE_WITH_FORWARD_HOOKS,
    FIRST_RELEASE_WITH_LAUNCH_COMMAND,
    REPORTED_ARGS,
    REWRITE_RULE,
    SERVER_INFO_PATHS,
    deployment_from_server_info,
    node_ranks,
    requested_spec,
    resolve_from_server,
    server_info,
    sglang_config_ids,
)

__all__ = ["ADAPTER", "CPU_REFUSALS", "EXTEND_MODES", "FIRST_RELEASE_WITH_FORWARD_HOOKS",
           "FIRST_RELEASE_WITH_LAUNCH_COMMAND", "GENERATE_TOKENS", "HISTOGRAM", "REPORTED_ARGS", "REWRITE_RULE",
           "SERVER_INFO_PATHS", "Record", "Refusal", "acceptance_from_meta", "cpu_refusals", "deployment_from_server_info",
           "evidence_to_capture", "flush_cache", "hooks_ready", "hooks_registered", "innermost_sglang_frames",
           "node_ranks", "read_records", "requested_spec", "resolve_from_server", "served_acceptance",
           "server_failure", "server_info", "server_stand_ins", "settle", "sglang_config_ids"]



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
    layer's (``serving/live/capture.py``)."""
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
    file is removed in ``finally``, by the watchdog if this process is killed (``serving/child/reaper.py``), and by the
    hooks themselves when its lease (``lease_s`` from now, this process alive) ends (``live_hooks``)."""
    from specparity.serving.child import reaper

    flag = Path(evidence_dir) / live_wire.ARMED
    fd = os.open(flag, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, live_wire.lease_text(lease_s=lease_s).encode())
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
    return [e for entries in _notes(evidence_dir, live_wire.LEASE).values() for e in entries]


def live_capture(client: Any, *, evidence_dir: str | Path | None, probes: Sequence[Sequence[int]],
                 cwd: str | Path | None = None, progress: Callable[[int, int], None] | None = None,
                 max_new_tokens: int = 1, reduction: Reduction | None = None,
                 node_dirs: Sequence[str | Path] = ()) -> CaptureResult:
    """One probe run through a server started with :func:`hook_switches`: its static level, then each probe as token
    ids (radix cache flushed first, greedy, ``max_new_tokens`` 1) with the hooks armed, then the evidence.

    ``client`` has ``get_json``/``post_json``/``post`` (``serving.live.server.ServerClient``). ``evidence_dir`` None (a
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
    from specparity.serving.child import reaper

    notes: list[str] = []
    for d in dirs:
        # an earlier probe run's files are not this one's; this run's go at its end, or with the watchdog if the gate
        # is killed (they hold the probes' and any other client's token ids and hidden states)
        for folder in (live_wire.RECORDS, live_wire.EXPECT, live_wire.LEASE):
            for old in (d / folder).glob("*") if (d / folder).is_dir() else []:
                with contextlib.suppress(OSError):
                    old.unlink()
            reaper.adopt_dir(d / folder)
    t1 = time.perf_counter()
    try:
        if reduction is not None:
            for d in dirs:
                live_wire.write_expectations(d, probes, reduction.recorded, expected=list(reduction.expected),
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
        moved = sum(f.stat().st_size for d in dirs if (d / live_wire.RECORDS).is_dir()
                    for f in (d / live_wire.RECORDS).iterdir() if f.is_file())
        result = replace(result, loop={**(result.loop or {}), "evidence_bytes": moved})
    finally:
        for d in dirs:
            for folder in (live_wire.RECORDS, live_wire.EXPECT, live_wire.LEASE):
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
    problem = live_wire.evidence_dir_problem(evidence_dir)
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

    problem = live_wire.evidence_dir_problem(evidence_dir)
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
