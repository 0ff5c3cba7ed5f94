"""Nothing left running: every process group and temporary directory a gate run starts is stopped and removed by
us, on success, failure, timeout and signal, and even when the gate itself is killed with SIGKILL.

Three layers, each covering what the one before cannot:

1. the caller's ``finally`` (``serving/child/process.py``, ``serving/live/server.py``) stops its own child: success, failure,
   timeout, and a signal turned into an exception (:func:`install_signal_handlers`: SIGTERM and SIGHUP raise
   :class:`Interrupted`, SIGINT raises KeyboardInterrupt as Python does by default);
2. :func:`stop_all` at interpreter exit (``atexit``) stops whatever a caller did not;
3. a watchdog process, started with the first group this process adopts, holds the read end of a pipe whose write
   end only this process has. When this process dies for any reason (SIGKILL included: no handler runs) the pipe
   closes, and the watchdog sends SIGTERM, then SIGKILL, to every group still registered and removes every
   registered directory and file (a report being written: report/writing.py). It runs in a session of its own, so a
   signal to the gate's process group does not reach it.

Each child also gets ``PR_SET_PDEATHSIG`` (Linux), so the direct child dies with this process even before the
watchdog acts, and the marker :data:`MARKER_ENV` in its environment, by which a test finds every process of a run.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

MARKER_ENV = "SPECPARITY_RUN_ID"  # in the environment of every process a run starts (a test greps /proc for it)
TERM_GRACE_S = 5.0

# The watchdog: reads "+gPGID", "-gPGID", "+dPATH", "-dPATH", "+fPATH", "-fPATH" lines; at EOF (its parent died, or
# closed the pipe at the end) it stops the groups still registered and removes the directories and files. Standard
# library only.
_WATCHDOG = r"""
import os, shutil, signal, sys, time
groups, dirs, files = set(), set(), set()
for line in sys.stdin:
    line = line.rstrip("\n")
    op, kind, value = line[:1], line[1:2], line[2:]
    target = groups if kind == "g" else dirs if kind == "d" else files
    item = int(value) if kind == "g" else value
    (target.add if op == "+" else target.discard)(item)
for sig, wait in ((signal.SIGTERM, float(sys.argv[1])), (signal.SIGKILL, 0)):
    for g in list(groups):
        try:
            os.killpg(g, sig)
        except OSError:
            groups.discard(g)
    end = time.monotonic() + wait
    while groups and time.monotonic() < end:
        for g in list(groups):
            try:
                os.killpg(g, 0)
            except OSError:
                groups.discard(g)
        time.sleep(0.1)
for d in dirs:
    shutil.rmtree(d, ignore_errors=True)
for f in files:
    try:
        os.unlink(f)
    except OSError:
        pass
"""


class Interrupted(BaseException):
    """SIGTERM or SIGHUP arrived: unwinds like KeyboardInterrupt, so every ``finally`` stops what it started."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name


_lock = threading.Lock()
_groups: set[int] = set()
_dirs: set[str] = set()
_files: set[str] = set()
_watchdog: subprocess.Popen[str] | None = None
_watchdog_pid_owner: int | None = None  # the pid that started it (a forked child must not reuse it)


def _send(line: str) -> None:
    global _watchdog, _watchdog_pid_owner
    if _watchdog is None or _watchdog_pid_owner != os.getpid():
        # not marked: it outlives each run it guards (it exits with this process), so it is not one of the run's
        env = {k: v for k, v in os.environ.items() if k != MARKER_ENV}
        _watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(TERM_GRACE_S)], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                                     start_new_session=True, close_fds=True, env=env)
        _watchdog_pid_owner = os.getpid()
        for g in _groups:
            _watchdog.stdin.write(f"+g{g}\n")  # type: ignore[union-attr]
        for d in _dirs:
            _watchdog.stdin.write(f"+d{d}\n")  # type: ignore[union-attr]
        for f in _files:
            _watchdog.stdin.write(f"+f{f}\n")  # type: ignore[union-attr]
    assert _watchdog.stdin is not None
    with contextlib.suppress(BrokenPipeError, ValueError):
        _watchdog.stdin.write(line + "\n")
        _watchdog.stdin.flush()


def adopt_group(pgid: int) -> None:
    """Register a child's process group: it is stopped at exit, on a signal, or by the watchdog."""
    with _lock:
        _groups.add(pgid)
        _send(f"+g{pgid}")


def release_group(pgid: int) -> None:
    with _lock:
        _groups.discard(pgid)
        if _watchdog is not None and _watchdog_pid_owner == os.getpid():
            _send(f"-g{pgid}")


def adopt_dir(path: str | Path) -> None:
    """Register a temporary directory: removed at exit, or by the watchdog if this process is killed."""
    with _lock:
        _dirs.add(str(path))
        _send(f"+d{path}")


def release_dir(path: str | Path, *, remove: bool = True) -> None:
    if remove:
        shutil.rmtree(path, ignore_errors=True)
    with _lock:
        _dirs.discard(str(path))
        if _watchdog is not None and _watchdog_pid_owner == os.getpid():
            _send(f"-d{path}")


@contextlib.contextmanager
def temp_dir(prefix: str) -> Iterator[Path]:
    """A new temporary directory (``tempfile.mkdtemp``), adopted: removed when the block ends, or by the watchdog
    if this process is killed inside it (a ``TemporaryDirectory`` is removed by its ``__exit__`` alone, which a
    SIGKILL, or pytest's default SIGTERM, never runs)."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix=prefix))
    adopt_dir(path)
    try:
        yield path
    finally:
        release_dir(path)


def adopt_file(path: str | Path) -> None:
    """Register a file the watchdog removes if this process is killed before :func:`release_file` (a report being
    written, report/writing.py: a run killed while writing leaves no report of its own). Only the watchdog removes
    it: a caller that is not killed removes or keeps it itself."""
    with _lock:
        _files.add(str(path))
        _send(f"+f{path}")


def release_file(path: str | Path) -> None:
    with _lock:
        _files.discard(str(path))
        if _watchdog is not None and _watchdog_pid_owner == os.getpid():
            _send(f"-f{path}")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(pgid: int, *, grace_s: float = TERM_GRACE_S) -> None:
    """SIGTERM to the whole group, then SIGKILL to what is left after ``grace_s``; returns when it is gone
    (or after a further second: a zombie leader keeps its group id until its parent reaps it)."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 1.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        end = time.monotonic() + wait
        while time.monotonic() < end:
            if not group_alive(pgid) or _only_zombies(pgid):
                release_group(pgid)
                return
            time.sleep(0.05)
    release_group(pgid)


def _only_zombies(pgid: int) -> bool:
    """True when every process left in ``pgid`` is a zombie (gone, waiting to be reaped by its parent)."""
    found = False
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid:
            found = True
            if fields[0] != "Z":
                return False
    return found or not os.path.isdir("/proc")


def stop_all() -> None:
    """Stop every registered group and remove every registered directory (atexit, and on a signal)."""
    with _lock:
        groups, dirs = list(_groups), list(_dirs)
    for g in groups:
        stop_group(g, grace_s=2.0)
    for d in dirs:
        release_dir(d)
    with _lock:
        if _watchdog is not None and _watchdog_pid_owner == os.getpid() and _watchdog.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                _watchdog.stdin.close()  # the watchdog's EOF: it has nothing left to stop and exits


atexit.register(stop_all)


def _set_pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the child dies when the thread that forked it does."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)


def child_preexec() -> Callable[[], None] | None:
    """The ``preexec_fn`` for a child we start: a parent-death signal where the platform has one (Linux)."""
    return _set_pdeathsig if sys.platform.startswith("linux") else None


def marked_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with this run's marker (the same for every process of one gate process)."""
    return {**env, MARKER_ENV: os.environ.get(MARKER_ENV) or f"{os.getpid()}-{int(time.time())}"}


def _raise_interrupted(signum: int, _frame: FrameType | None) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def signals_unwind() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise :class:`Interrupted` in the main thread (SIGINT raises
    KeyboardInterrupt as usual), so ``finally`` blocks stop what they started; the old handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
