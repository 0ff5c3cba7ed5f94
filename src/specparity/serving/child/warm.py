"""Warm start, the parent's side: one zygote per (interpreter, worker module, device, environment).

With ``SPECPARITY_WARM_START=1``, :func:`specparity.serving.child.process.run_child` asks :func:`start_job` for a
process forked from a zygote (:mod:`specparity.serving.child.zygote`) that has already imported the engine, instead
of starting a new interpreter. Everything else stays as for a cold child: the job runs the worker's own code
in its own session, a timeout kills its process group, a job that dies without a result is a
``child_crashed`` failure with its stderr tail. A zygote that cannot start or dies is dropped and the job
starts cold; nothing is ever skipped for it.

Keyed by the interpreter, the worker module, the device, the working directory and the parent's environment
(but ``PYTEST_CURRENT_TEST``, which pytest rewrites for every test), so a changed environment variable (or
another ``--python``) gets its own zygote; each job also runs under the environment a cold child would get at
that moment (the zygote applies it after forking). At most
:data:`MAX_ZYGOTES` live per process (the least recently used one is ended). Zygotes end with this process
(their stdin closes) or with :func:`shutdown`.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from specparity.serving.child import reaper

WARM_START_ENV = "SPECPARITY_WARM_START"
# A zygote's first line comes before it imports the engine (an interpreter start plus specparity's light
# imports, well under a second unloaded); an interpreter silent this long is not one we can use.
HELLO_S = 30.0
ZYGOTE_MODULE = "specparity.serving.child.zygote"


def enabled() -> bool:
    """Whether children start warm (``SPECPARITY_WARM_START=1``)."""
    return os.environ.get(WARM_START_ENV, "") == "1"


class Zygote:
    """A running zygote and what it has told us: which pid each job got, and each pid's exit status."""

    def __init__(self, interpreter: str, module: str, device: str,
                 env_for: Callable[[Path], dict[str, str]], cwd: str | None = None) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="specparity-zygote-"))
        self.stderr_path = self.work / "zygote.stderr"
        self._cond = threading.Condition()
        self._pids: dict[int, int] = {}
        self._exits: dict[int, int] = {}
        self._next = 0
        self.hello = False  # its first line said it runs the zygote protocol
        self.ready = False
        self.dead = False
        self.why_cold: str | None = None
        self.interpreter = interpreter
        with self.stderr_path.open("w") as err:
            self.proc = subprocess.Popen(
                [interpreter, "-m", ZYGOTE_MODULE, module, device], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=err, text=True, env=reaper.marked_env(env_for(self.work)), cwd=cwd, start_new_session=True,
                preexec_fn=reaper.child_preexec())  # a parent-death signal (serving/child/reaper.py)
        reaper.adopt_group(self.proc.pid)
        reaper.adopt_dir(self.work)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                msg = None
            if not self.hello:  # the first line decides whether this interpreter runs the zygote at all
                with self._cond:
                    self.hello = isinstance(msg, dict) and msg.get("zygote") == 1
                    self.dead = not self.hello
                    if self.dead:  # remembered (zygote_for): this interpreter's jobs start cold
                        self.why_cold = f"{self.interpreter} does not run the zygote (first line {line[:80]!r})"
                    self._cond.notify_all()
                if self.dead:
                    self.close()
                    return
                continue
            if not isinstance(msg, dict):
                continue
            with self._cond:
                if msg.get("ready") is True:
                    self.ready = True
                elif msg.get("ready") is False:  # it cannot fork faithfully here (zygote.py): jobs start cold
                    self.why_cold = str(msg.get("why"))
                    self.dead = True
                elif "job" in msg:
                    self._pids[int(msg["job"])] = int(msg["pid"])
                elif "exit" in msg:
                    self._exits[int(msg["pid"])] = int(msg["exit"])
                self._cond.notify_all()
        with self._cond:
            self.dead = True
            self._cond.notify_all()

    def submit(self, argv: list[str], stdout: Path, stderr: Path, *, env: dict[str, str],
               deadline: float) -> int | None:
        """Fork one job; its pid, or None when the zygote is dead or not ready by ``deadline``."""
        with self._cond:
            hello_by = min(deadline, time.monotonic() + HELLO_S)
            if not self._cond.wait_for(lambda: self.hello or self.dead, timeout=max(0.0, hello_by - time.monotonic())):
                self.dead = True  # silent interpreter: not a zygote we can use; its jobs start cold
                self.why_cold = f"no first line from {self.interpreter} within {HELLO_S:.0f} s"
                return None
            if not self._cond.wait_for(lambda: self.ready or self.dead, timeout=max(0.0, deadline - time.monotonic())):
                return None
            if self.dead:
                return None
            job, self._next = self._next, self._next + 1
            line = json.dumps({"job": job, "argv": argv, "stdout": str(stdout), "stderr": str(stderr), "env": env})
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(line + "\n")
                self.proc.stdin.flush()
            except (OSError, ValueError):
                self.dead = True
                return None
            self._cond.wait_for(lambda: job in self._pids or self.dead, timeout=60)
            return self._pids.get(job)

    def exit_of(self, pid: int) -> int | None:
        with self._cond:
            if pid in self._exits:
                return self._exits[pid]
            if self.dead:  # the zygote is gone and cannot report: the job's session ended with it, or not
                return None if _alive(pid) else -1
            return None

    def wait_exit(self, pid: int, timeout: float) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits or self.dead, timeout=timeout)
        return self.exit_of(pid)

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        reaper.release_group(self.proc.pid)
        reaper.release_dir(self.work)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


MAX_ZYGOTES = 2  # each holds an imported engine (~0.7-1 GB RSS)
_ZYGOTES: dict[str, Zygote] = {}  # in least-recently-used order
_LOCK = threading.Lock()


VOLATILE_ENV = frozenset({"PYTEST_CURRENT_TEST"})  # rewritten by pytest for every test; read by no engine


def _key(interpreter: str, module: str, device: str, cwd: str | None, extra: str) -> str:
    env = json.dumps(sorted((k, v) for k, v in os.environ.items() if k not in VOLATILE_ENV))
    where = f"{os.path.realpath(interpreter)}\0{module}\0{device}\0{cwd or os.getcwd()}\0{env}\0{extra}"
    return hashlib.sha256(where.encode()).hexdigest()


def zygote_for(interpreter: str, module: str, device: str, env_for: Callable[[Path], dict[str, str]], *,
               cwd: str | None = None, key_extra: str = "") -> Zygote | None:
    """The live zygote for this key, started on first use; None if it cannot start. ``cwd`` is where the zygote
    starts (``python -m`` puts it first on ``sys.path``, as for a cold child started there); ``key_extra`` is what
    else the jobs' environment depends on beyond this process's (e.g. a deploy command's own variables, which
    ``env_for`` adds): a different value gets its own zygote."""
    key = _key(interpreter, module, device, cwd, key_extra)
    with _LOCK:
        z = _ZYGOTES.pop(key, None)
        if z is not None and z.why_cold is not None:  # it said it cannot fork faithfully here: remember that
            _ZYGOTES[key] = z
            return None
        if z is not None and (z.dead or z.proc.poll() is not None):
            z.close()
            z = None
        if z is None:
            while len(_ZYGOTES) >= MAX_ZYGOTES:
                _ZYGOTES.pop(next(iter(_ZYGOTES))).close()
            try:
                z = Zygote(interpreter, module, device, env_for, cwd)
            except OSError:
                return None
        _ZYGOTES[key] = z
        return z


class WarmChild:
    """A job forked by a zygote, seen through the same four calls as a cold child (process.py)."""

    def __init__(self, zygote: Zygote, pid: int, stdout: Path, stderr: Path,
                 on_stdout: Callable[[str], None]) -> None:
        self.zygote, self.pid, self.stdout, self.stderr = zygote, pid, stdout, stderr
        self._on_stdout = on_stdout
        self._offset = 0
        self._partial = ""

    def _drain(self) -> None:
        try:
            with self.stdout.open() as f:
                f.seek(self._offset)
                text = f.read()
                self._offset = f.tell()
        except OSError:
            return
        text = self._partial + text
        *lines, self._partial = text.split("\n")
        for line in lines:
            self._on_stdout(line)

    def poll(self) -> int | None:
        self._drain()
        return self.zygote.exit_of(self.pid)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self.zygote.wait_exit(self.pid, timeout=10)
        reaper.release_group(self.pid)

    def finish(self) -> None:
        self._drain()

    def stderr_lines(self) -> list[str]:
        try:
            return self.stderr.read_text(errors="replace").splitlines()
        except OSError:
            return []


def start_job(interpreter: str, module: str, device: str, argv: list[str], work: Path, *,
              env_for: Callable[[Path], dict[str, str]], on_stdout: Callable[[str], None],
              deadline: float, cwd: str | None = None, key_extra: str = "") -> WarmChild | None:
    """Fork ``argv`` from the zygote for this key; None means: start it cold."""
    z = zygote_for(interpreter, module, device, env_for, cwd=cwd, key_extra=key_extra)
    if z is None:
        return None
    stdout, stderr = work / "child.stdout", work / "child.stderr"
    pid = z.submit(argv, stdout, stderr, env=env_for(work), deadline=deadline)
    if pid is None:
        return None
    reaper.adopt_group(pid)  # the job's own session (zygote.py): stopped with the run, even if the gate is killed
    return WarmChild(z, pid, stdout, stderr, on_stdout)


@atexit.register
def shutdown() -> None:
    """End every zygote of this process."""
    with _LOCK:
        for z in _ZYGOTES.values():
            z.close()
        _ZYGOTES.clear()
