"""Run one SGLang job in a child process: JSON request in, ``result.json`` + safetensors out.

The child runs in its own session (process group); a timeout kills the whole group, so neither the
interpreter nor anything SGLang spawned is left behind. A child that dies without writing a result
becomes a ``child_crashed`` failure carrying the tail of its stderr.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import specparity
from specparity.serving.child import reaper, warm
from specparity.serving.child.transport import ChildOutcome, read_result
from specparity.serving.child.worker_common import PROGRESS_PREFIX, WorkerRequest
from specparity.serving.results import CHILD_CRASHED, SGLANG_MISSING, TIMEOUT, ServingFailure

WORKER_MODULE = "specparity.serving.sglang.worker"
# the workers with a zygote entry (``warm(device)``, ``run(argv, state)``: serving/child/zygote.py), by module name
WARM_WORKERS = frozenset({WORKER_MODULE, "specparity.serving.vllm.worker"})
STDERR_TAIL_LINES = 25


def _package_dir() -> Path:
    return Path(specparity.__file__).resolve().parent


def child_env(work: Path, *, python: str | None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: only the specparity package comes from the gate, everything else from the
    child interpreter's own environment.

    The gate's package directory's parent is site-packages for a regular install, so putting it on the
    child's PYTHONPATH (as before) made a deploy interpreter (``python=``) import the gate's torch,
    transformers and sglang. Instead ``work/path`` holds one link, ``specparity``, to the gate's package,
    and is the child's whole PYTHONPATH when it runs another interpreter. The same interpreter keeps the
    gate's own PYTHONPATH after it (it is the same environment).
    """
    env = dict(os.environ if base is None else base)
    shim = package_link(work / "path")
    inherited = env.get("PYTHONPATH", "") if python is None or python == sys.executable else ""
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim), inherited) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def package_link(shim: Path) -> Path:
    """``shim``, a directory holding one link, ``specparity``, to the gate's package: a PYTHONPATH entry that gives
    another interpreter (an engine's child or server) specparity and nothing else of the gate's environment."""
    shim.mkdir(parents=True, exist_ok=True)
    link = shim / "specparity"
    if not link.exists():
        link.symlink_to(_package_dir(), target_is_directory=True)
    return shim


def _pump(stream: IO[str], sink: Callable[[str], None]) -> None:
    for line in stream:
        sink(line.rstrip("\n"))
    stream.close()


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _tail(lines: list[str]) -> str:
    text = "\n".join(lines[-STDERR_TAIL_LINES:])
    return text[-3000:]


class _ColdChild:
    """A new interpreter running ``python -m <module>``, its stdout and stderr pumped by two threads."""

    def __init__(self, proc: subprocess.Popen[str], on_stdout: Callable[[str], None]) -> None:
        self.proc = proc
        self._stderr: collections.deque[str] = collections.deque(maxlen=4000)  # a worker's root cause can be early
        self._threads = [
            threading.Thread(target=_pump, args=(proc.stdout, on_stdout), daemon=True),
            threading.Thread(target=_pump, args=(proc.stderr, self._stderr.append), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def poll(self) -> int | None:
        return self.proc.poll()

    def kill(self) -> None:
        _kill_group(self.proc)  # reaps anything the child left in its group too
        self.proc.wait()
        reaper.release_group(self.proc.pid)

    def finish(self) -> None:
        for t in self._threads:
            t.join(timeout=5)

    def stderr_lines(self) -> list[str]:
        return list(self._stderr)


def _start_cold(interpreter: str, module: str, argv: list[str], env: dict[str, str],
                on_stdout: Callable[[str], None]) -> _ColdChild | ServingFailure:
    try:
        proc = subprocess.Popen(
            [interpreter, "-m", module, *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=reaper.marked_env(env),
            start_new_session=True,
            preexec_fn=reaper.child_preexec(),  # a parent-death signal (serving/child/reaper.py)
        )
    except OSError as exc:
        return ServingFailure(SGLANG_MISSING, f"cannot start the interpreter {interpreter!r}: {exc}")
    reaper.adopt_group(proc.pid)  # stopped with the run, even when the gate is killed (the reaper's watchdog)
    return _ColdChild(proc, on_stdout)


def run_child(
    request: WorkerRequest,
    *,
    python: str | None = None,
    timeout_s: float = 600,
    progress: Callable[[int, int], None] | None = None,
    module: str = WORKER_MODULE,
    engine: str = "SGLang",
    annotate: Callable[[ChildOutcome, list[str]], ChildOutcome] | None = None,
) -> ChildOutcome | ServingFailure:
    """Run ``request`` in ``python -m <module>`` (default the SGLang worker); always returns, never hangs.

    With ``SPECPARITY_WARM_START=1`` an engine job (SGLang's or vLLM's worker) is forked from a zygote of the same
    interpreter that has already imported the engine (:mod:`specparity.serving.child.warm`); otherwise, or when no
    zygote can serve, it starts a new interpreter. Both run the worker's same code in a fresh process of its own session.
    ``annotate(outcome, stderr_lines)`` may rewrite a result with what the child's stderr says (vLLM's workers log
    their own exception there: :mod:`specparity.serving.vllm.root_cause`)."""
    interpreter = python or sys.executable
    work = Path(tempfile.mkdtemp(prefix="specparity-serving-"))
    reaper.adopt_dir(work)
    deadline = time.monotonic() + timeout_s
    try:
        req_path, out_dir = work / "request.json", work / "out"
        req_path.write_text(json.dumps(request.to_dict()))
        argv = [str(req_path), str(out_dir)]
        events: queue.Queue[tuple[int, int]] = queue.Queue()

        def on_stdout(line: str) -> None:
            if line.startswith(PROGRESS_PREFIX):
                done, total = line.split()[1:3]
                events.put((int(done), int(total)))

        child: _ColdChild | warm.WarmChild | ServingFailure | None = None
        if warm.enabled() and module in WARM_WORKERS:
            child = warm.start_job(interpreter, module, request.device, argv, work, on_stdout=on_stdout,
                                   env_for=lambda w: child_env(w, python=python), deadline=deadline)
        if child is None:
            child = _start_cold(interpreter, module, argv, child_env(work, python=python), on_stdout)
        if isinstance(child, ServingFailure):
            return child
        timed_out = False
        try:
            while True:
                code = child.poll()
                while progress is not None and not events.empty():
                    progress(*events.get_nowait())
                if code is not None:
                    break
                if time.monotonic() >= deadline:
                    timed_out = True
                    break
                time.sleep(0.1)
        finally:  # also on Ctrl-C or a raising progress callback: never leave SGLang running
            child.kill()
        child.finish()
        while progress is not None and not events.empty():
            progress(*events.get_nowait())
        if timed_out:
            return ServingFailure(
                TIMEOUT,
                f"the {engine} child did not finish within {timeout_s:g} s; its process group was killed",
            )
        outcome = read_result(out_dir)
        if outcome is None:
            return ServingFailure(
                CHILD_CRASHED,
                f"the {engine} child exited with code {child.poll()} "
                f"without a result; stderr tail:\n{_tail(child.stderr_lines())}",
            )
        return outcome if annotate is None else annotate(outcome, child.stderr_lines())
    finally:
        reaper.release_dir(work)
