"""Gate the server you run: the user's own server, launched by us from their command, or already running.

Capturing in a child we build (``Engine.capture``) and capturing inside the user's server are two ways to the same
evidence (a :class:`CaptureResult`); compare/, replay/ and report/ do not know which. This module does the
engine-neutral part of a server's life; each engine adds its own (``Engine.live_switches``, ``live_capture``,
``live_resolve``: its hook switches, its evidence channel, its counters).

- :func:`capture_launched`: the command as given (same program, flags and env), plus only the engine's hook switches,
  a free port and a temp directory of its own (serving/child/scratch.py); its own process group; ``/health`` awaited with a
  timeout (the log tail goes into the failure);
  the contract's probes as token ids, greedy; then the whole process tree stopped, whatever happened.
- :func:`capture_attached`: the same against ``--server URL``; nothing started, nothing stopped.

Security: the server binds where the user's command says (127.0.0.1 when it says nothing); dev-mode endpoints an
engine needs (vLLM's ``/collective_rpc``) are never turned on for a non-loopback host without
``allow_dev_endpoints``; the evidence directory is created 0700 and removed after; an API key is never printed
(:func:`specparity.serving.live.server.redact`); the report lists every flag and env var we added (:class:`LiveRun`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specparity.deploy_command import flag_values
from specparity.errors import EnvironmentProblem, InputError
from specparity.serving.child import reaper, scratch
from specparity.serving.live.server import (
    LaunchedServer,
    ServerClient,
    ServerError,
    free_port,
    is_loopback,
    redact,
)
from specparity.serving.results import (
    SERVER_FAILED,
    SERVER_UNREACHABLE,
    CaptureResult,
    OutcomeRequest,
    ServingFailure,
)
from specparity.testpoints import pause

if TYPE_CHECKING:
    from specparity.compare.reduced import Reduction
    from specparity.deploy_command import LaunchCommand
    from specparity.serving.command.parse import LaunchSpec
    from specparity.serving.engine import Engine

PYTHON_NAMES = ("python", "python3")


@dataclass(frozen=True)
class LiveRun:
    """Where the evidence came from, for every face of the report: ``launched`` (a server we started from the
    user's command) or ``attached`` (``--server URL``)."""

    mode: str
    url: str
    command: tuple[str, ...] = ()  # as run, API key redacted
    added_flags: tuple[str, ...] = ()
    added_env: Mapping[str, str] = field(default_factory=dict)
    startup_s: float | None = None
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "url": self.url, "command": list(self.command),
                "added_flags": list(self.added_flags), "added_env": dict(self.added_env),
                "startup_s": self.startup_s, "notes": list(self.notes)}


def _program(program: Sequence[str], python: str | None) -> tuple[list[str], list[str]]:
    """The program to run and notes: a bare ``python``/``python3``/``vllm``/``sglang`` is looked up first beside
    ``python`` (the engine env's interpreter, ``--python``), then on PATH; anything else runs as written."""
    out, notes = list(program), []
    head = out[0]
    if python and os.sep not in head:
        beside = Path(python).parent / head
        if head.startswith("python") and head.rstrip("0123456789.") in PYTHON_NAMES:
            out[0] = python
            notes.append(f"{head} is {python} (--python)")
        elif beside.is_file():
            out[0] = str(beside)
            notes.append(f"{head} is {beside} (beside --python)")
    if os.sep not in out[0] and shutil.which(out[0]) is None:
        raise InputError(f"the program {out[0]!r} is not on PATH (give the engine env's interpreter with --python)",
                         field="--launch")
    return out, notes


def host_of(args: Sequence[str]) -> str | None:
    """The ``--host`` the command's words give (the last one, as argparse takes it), or None."""
    return next(iter(flag_values(args, "--host")[-1:]), None)


@dataclass
class StartedServer:
    """A server started from the user's command with the engine's hook switches, not yet known healthy: started
    while the engine's parser reads the command (the parse and the server's start-up overlap), or by
    :func:`capture_launched` itself. :meth:`stop` stops its process tree and removes its evidence directory."""

    server: LaunchedServer
    evidence: Path
    run: LiveRun
    cwd: str

    def stop(self) -> None:
        try:
            self.server.stop()
        finally:
            reaper.release_dir(self.evidence)


def start_server(engine: Engine, command: LaunchCommand, *, python: str | None,
                 allow_dev_endpoints: bool = False) -> StartedServer:
    """Start the command as given plus the engine's hook switches and a free port (module docstring); returns at
    once. InputError (exit 2) for a non-loopback host with dev endpoints without ``allow_dev_endpoints``, or a
    program that is not there."""
    if command.dynamo:
        raise EnvironmentProblem(
            f"the command runs {engine.label} under NVIDIA Dynamo ({' '.join(command.program)}): a Dynamo worker "
            "serves through Dynamo's frontend and runtime, which specparity does not start; the static level reads "
            "the same command (--level static), or give the engine's own server command")
    given = host_of(command.args)
    host = given or "127.0.0.1"
    evidence = Path(tempfile.mkdtemp(prefix="specparity-evidence-"))
    os.chmod(evidence, 0o700)
    reaper.adopt_dir(evidence)
    try:
        program, where = _program(command.program, python)
        flags, env, notes = engine.live_switches(command, evidence_dir=evidence, program=program)
        if env.get("VLLM_SERVER_DEV_MODE") and not is_loopback(host) and not allow_dev_endpoints:
            raise InputError(f"the command binds {host}, not loopback, and the capture needs {engine.label}'s dev-mode "
                             "endpoints there; pass --allow-dev-endpoints to accept that, or drop --host",
                             field="--launch")
        port = free_port("127.0.0.1" if host in ("0.0.0.0", "::") else host)
        placed = ["--host", host, "--port", str(port)] if given is None else ["--port", str(port)]
        argv = [*program, *command.args, *flags, *placed]
        added_env = {**env, "PYTHONPATH": _python_path(evidence, env, command.env),
                     **scratch.scratch_env(evidence / "tmp", command.env)}  # removed with the evidence
        connect = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        url = f"http://{connect}:{port}"
        secrets = [v for k, v in command.env.items() if "KEY" in k.upper() or "TOKEN" in k.upper()]
        shown = redact(argv, [*secrets, *_key_words(command.args)])
        run = LiveRun("launched", url, tuple(shown), tuple(flags + placed), added_env, notes=tuple(where + notes))
        server = LaunchedServer(argv, {**command.env, **added_env}, url, health_path=engine.health_path,
                                cwd=command.cwd, log=evidence / "server.log")
        server.start()
    except BaseException:
        reaper.release_dir(evidence)
        raise
    return StartedServer(server, evidence, run, command.cwd)


def _key_words(args: Sequence[str]) -> list[str]:
    """The values of an ``--api-key`` in the command's words (hidden in what the report shows)."""
    return flag_values(args, "--api-key")


def capture_launched(engine: Engine, spec: LaunchSpec, *, probes: Sequence[Sequence[int]],
                     outcome: OutcomeRequest | None, python: str | None, timeout_s: float,
                     progress: Callable[[int, int], None] | None = None, allow_dev_endpoints: bool = False,
                     started: StartedServer | None = None, reduction: Reduction | None = None,
                     node_evidence: Sequence[Path] = ()) -> CaptureResult:
    """Launch the user's server with the engine's hook switches (or take the one ``started`` while the command was
    parsed), capture through it, stop it (module docstring)."""
    if started is None:
        started = start_server(engine, spec.command, python=python or spec.python or None,
                               allow_dev_endpoints=allow_dev_endpoints)
    server, run = started.server, started.run
    api_key = api_key_of(spec)
    server.api_key = api_key
    try:
        try:
            server.wait_healthy(timeout_s)
        except ServerError as e:
            server.stop()
            failure = engine.server_failure(str(e), server.log_tail(3000).splitlines())
            return CaptureResult(None, None, None, (failure,), loop={"live": run.to_dict()})
        run = replace(run, startup_s=server.started_s)
        pause("server_up")  # test-only (specparity/testpoints.py): inert unless its variable names it
        try:
            with ServerClient(server.url, api_key=api_key, timeout_s=timeout_s) as client:
                result = engine.live_capture(client, evidence_dir=started.evidence, probes=probes, outcome=outcome,
                                             progress=progress, cwd=started.cwd,
                                             **_reducing(reduction, node_evidence))
        except ServerError as e:
            alive = server.alive()
            result = CaptureResult(None, None, None, (ServingFailure(
                SERVER_FAILED if not alive else SERVER_UNREACHABLE,
                f"{e}" + ("" if alive else f"; the server died; log tail:\n{server.log_tail()}")),))
        return _with_live(result, run)
    finally:
        started.stop()


def _reducing(reduction: Reduction | None, node_evidence: Sequence[Path] = ()) -> dict[str, Any]:
    """The engine's ``reduction`` and ``node_evidence`` keywords, only where the gate gives them (an engine that
    reduces its evidence; SGLang's other nodes' evidence directories)."""
    out: dict[str, Any] = {"reduction": reduction} if reduction is not None else {}
    if node_evidence:
        out["node_evidence"] = tuple(node_evidence)
    return out


def capture_attached(engine: Engine, url: str, *, api_key: str | None, probes: Sequence[Sequence[int]],
                     outcome: OutcomeRequest | None, timeout_s: float,
                     progress: Callable[[int, int], None] | None = None,
                     reduction: Reduction | None = None, node_evidence: Sequence[Path] = ()) -> CaptureResult:
    """The capture through a running server (``--server URL``); nothing is started or stopped."""
    run = LiveRun("attached", url.rstrip("/"))
    try:
        with ServerClient(url, api_key=api_key, timeout_s=timeout_s) as client:
            if not client.healthy(engine.health_path):
                raise ServerError(f"{url}{engine.health_path} does not answer")
            result = engine.live_capture(client, evidence_dir=None, probes=probes, outcome=outcome,
                                         progress=progress, cwd=None, **_reducing(reduction, node_evidence))
    except ServerError as e:
        result = CaptureResult(None, None, None, (ServingFailure(SERVER_UNREACHABLE, str(e)),))
    return _with_live(result, run)


def detect_engine(url: str, *, api_key: str | None, timeout_s: float = 30.0) -> str | None:
    """Which engine serves ``url``: the ``owned_by`` of its OpenAI ``/v1/models`` listing, which both engines fill
    with their own name (vllm 0.32 entrypoints/serve/engine/protocol.py:109; sglang 0.5.23
    entrypoints/openai/protocol.py:93), else None."""
    from specparity.serving.results import ENGINES

    try:
        with ServerClient(url, api_key=api_key, timeout_s=timeout_s) as client:
            data = client.get_json("/v1/models").get("data") or []
    except (ServerError, AttributeError):
        return None
    owner = str((data[0] if data and isinstance(data[0], dict) else {}).get("owned_by") or "").lower()
    return next((e for e in ENGINES if e in owner), None)


def api_key_of(spec: LaunchSpec) -> str | None:
    """The API key the command gives its server (a secret argument, or the engine's key variable in its env),
    which the gate sends as a Bearer header and never prints."""
    for i in spec.secret_args:
        if 0 <= i < len(spec.command.args):
            arg = str(spec.command.args[i])
            return arg.partition("=")[2] if arg.startswith("-") else arg
    return spec.command.env.get("VLLM_API_KEY") if spec.engine == "vllm" else None


def _with_live(result: CaptureResult, run: LiveRun) -> CaptureResult:
    """The result with where it came from; and the evidence bytes the engine's channel moved (every rank's fc
    calls and boundaries), which the report keeps beside it."""
    moved = (result.loop or {}).get("evidence_bytes")
    live = {**run.to_dict(), **({"evidence_bytes": int(moved)} if isinstance(moved, int) else {})}
    others = (result.loop or {}).get("other_request_rows")
    if isinstance(others, int) and others:  # told apart by token ids (serving/vllm/evidence.py locate) and ignored
        live["other_request_rows"] = others
        live["notes"] = [*live["notes"], f"other clients' requests shared the probes' batches ({others} runs of fc "
                                         "rows); they were told apart by token ids and ignored"]
    return replace(result, loop={**(result.loop or {}), "live": live})


def _python_path(evidence: Path, hooks: Mapping[str, str], command: Mapping[str, str]) -> str:
    """PYTHONPATH for the server's processes: a directory holding only a link to the gate's ``specparity`` package
    (as the in-process child gets it, ``serving/child/process.py`` ``child_env``), then what the hook switches put there,
    then the command's own PYTHONPATH, so the hook modules import in the engine's interpreter without installing
    anything there; the gate's own PYTHONPATH never reaches another interpreter."""
    from specparity.serving.child.process import package_link

    parts = (str(package_link(evidence / "path")), hooks.get("PYTHONPATH", ""), command.get("PYTHONPATH", ""))
    return os.pathsep.join(p for p in parts if p)
