"""One gate run of the fault tier, and what is checked after it.

A :class:`Run` is a real ``specparity gate`` (or ``pytest -m parity``) in a process of its own, started in a session
of its own, with its own ``TMPDIR`` (so the temp-directory check is exact), its own run marker
(``SPECPARITY_RUN_ID``, serving/child/reaper.py) and, where a test signals it, ``SPECPARITY_TEST_PAUSE`` naming the point
where it waits (src/specparity/testpoints.py): the test waits for the point's file, sends the signal to the run's
process group (as a terminal's Ctrl-C or a CI cancel does) and then checks, each within a few seconds:

- the exit code (:func:`expected_code`);
- no process of the run alive: none carries the marker, none has the run's ``TMPDIR`` in its environment (which
  also finds the reaper's watchdog, the one process that drops the marker), and no process group seen while the run
  was paused has a live member;
- nothing left in the run's ``TMPDIR`` but torch's inductor cache: no directory of ours (``specparity-serving-*``,
  ``-evidence-*``, ``-server-*``, ``-zygote-*``, ``-replay-*``, ``-launch-*``) and no file the engine made there
  either (SGLang's ``PortArgs`` makes an empty IPC placeholder per server process and never removes it:
  serving/sglang/child_setup.py nccl_port);
- the inputs byte-identical (:func:`digest` of the contract, its probe pack, the target and the draft);
- the reports: none for an interrupted run, and no temporary file beside a report path
  (docs/report-format.md, "Cut short"); otherwise each one parses and its verdict agrees with the exit code.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.process_marks import describe, gone, marked_alive

from specparity.serving.child.reaper import MARKER_ENV, TERM_GRACE_S
from specparity.testpoints import PAUSE_ENV

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "contracts" / "tiny-llama-eagle3.json"
TARGET = ROOT / "fixtures" / "default" / "target"
DRAFT = ROOT / "fixtures" / "default" / "draft"
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL)
VERDICT_CODES = {"pass": 0, "fail": 1, "error": 3}
REACH_S = 240.0  # a point far into a run on a loaded 2-core machine (a capture's start-up is 15-60 s)
# after the gate is gone: the watchdog's grace for a group that ignores SIGTERM, then its directory removal
SETTLE_S = TERM_GRACE_S + 10.0


def expected_code(sig: signal.Signals) -> int:
    """The exit code of a gate cut short by ``sig`` as :class:`subprocess.Popen` reports it: 130 (SIGINT), 143
    (SIGTERM), 129 (SIGHUP) from the gate itself; -9 for SIGKILL (a shell says 137)."""
    return -9 if sig == signal.SIGKILL else 128 + int(sig)


def digest(paths: Iterable[Path]) -> dict[str, str]:
    """sha256 of every file under ``paths`` (a file, or a directory walked without following links; a link is its
    target's name), keyed by path: equal digests mean byte-identical inputs and no file added or removed."""
    out: dict[str, str] = {}
    for root in paths:
        items = [root] if not root.is_dir() or root.is_symlink() else sorted(root.rglob("*"))
        for p in items:
            if p.is_symlink():
                out[str(p)] = "link:" + os.readlink(p)
            elif p.is_file():
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
            elif p.is_dir():
                out[str(p)] = "dir"
    return out


def contract_files(contract: Path) -> list[Path]:
    """The contract and its probe pack."""
    data = json.loads(contract.read_text())
    return [contract, contract.parent / data["probes"]["file"]]


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of ``pid``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[2])


def _pids() -> list[int]:
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]


def alive_with_env(entry: str) -> list[int]:
    """Live (non-zombie) processes whose environment holds ``entry`` (``NAME=value``)."""
    want = entry.encode()
    out = []
    for pid in _pids():
        st = _stat(pid)
        if st is not None and st[0] != "Z" and want in _environ(pid):
            out.append(pid)
    return out


def alive_in_groups(groups: set[int]) -> list[int]:
    """Live (non-zombie) members of any of the process groups ``groups``."""
    out = []
    for pid in _pids():
        st = _stat(pid)
        if st is not None and st[0] != "Z" and st[1] in groups:
            out.append(pid)
    return out


def _wait_for(check: object, within_s: float) -> list[int]:
    """Poll ``check()`` (a list of what is left) until it is empty or ``within_s`` pass; the last answer."""
    end = time.monotonic() + within_s
    left: list[int] = check()  # type: ignore[operator]
    while left and time.monotonic() < end:
        time.sleep(0.2)
        left = check()  # type: ignore[operator]
    return left


def left_in(tmp: Path) -> list[str]:
    """Whatever is still in the run's ``tmp``: its own directories, or anything the engine made there. torch's
    inductor cache is not a run's leftover: torch keeps it in the temp directory across runs by design
    (``<tmp>/torchinductor_<user>``, torch/_inductor/runtime/cache_dir_utils.py), and a launched server is pointed
    at it (serving/live/capture.py scratch_env)."""
    return sorted(p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_"))


@dataclass
class Run:
    """One specparity process under test (module docstring). ``argv`` follows the interpreter (``-m MODULE ...``)."""

    root: Path
    argv: Sequence[str]
    name: str
    warm: bool = False
    pause_at: str | None = None
    reports: Sequence[Path] = ()
    inputs: Sequence[Path] = field(default_factory=lambda: [*contract_files(CONTRACT), TARGET, DRAFT])
    env: dict[str, str | None] = field(default_factory=dict)  # None: the variable is removed
    proc: subprocess.Popen[bytes] | None = None
    groups: set[int] = field(default_factory=set)
    started: float = 0.0

    def __post_init__(self) -> None:
        # short, beside pytest's own tmp: a launched server's scratch TMPDIR below it must fit a socket path
        # (serving/live/capture.py scratch_env); removed with this object
        self.tmp = Path(tempfile.mkdtemp(prefix="spf-"))
        weakref.finalize(self, shutil.rmtree, self.tmp, True)
        self.points = self.root / "points"
        self.points.mkdir(parents=True)
        self.marker = f"faults-{self.name}-{os.getpid()}-{time.monotonic_ns()}"
        self.before = digest(self.inputs)

    @property
    def stdout(self) -> str:
        return (self.root / "stdout").read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return (self.root / "stderr").read_text(errors="replace")

    def output(self) -> str:
        return f"--- stdout (tail)\n{self.stdout[-3000:]}\n--- stderr (tail)\n{self.stderr[-5000:]}"

    def start(self) -> Run:
        env = {k: v for k, v in os.environ.items() if k not in (PAUSE_ENV, "PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER")}
        env.update({MARKER_ENV: self.marker, "TMPDIR": str(self.tmp), "SPECPARITY_WARM_START": "1" if self.warm else "0",
                    "PYTHONUNBUFFERED": "1", "TERM": "dumb"})
        for k, v in self.env.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        if self.pause_at is not None:
            env[PAUSE_ENV] = f"{self.pause_at}@{self.points}"
        with (self.root / "stdout").open("wb") as out, (self.root / "stderr").open("wb") as err:
            self.proc = subprocess.Popen([sys.executable, *self.argv], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=err, start_new_session=True,
                                         preexec_fn=_default_sigint)
        self.started = time.monotonic()
        return self

    def reached(self) -> list[Path]:
        return sorted(p for p in self.points.iterdir() if not p.name.endswith(".go"))

    def wait_point(self, within_s: float = REACH_S) -> float:
        """Wait until a process of the run waits at ``pause_at``; the seconds it took. Records the process groups of
        the run seen then (the gate's, each engine child's, the zygote's, a server's)."""
        assert self.proc is not None and self.pause_at is not None
        end = time.monotonic() + within_s
        while not self.reached():
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name}: the run ended (exit {self.proc.returncode}) before it reached "
                                     f"{self.pause_at}\n{self.output()}")
            if time.monotonic() > end:
                self.kill()
                raise AssertionError(f"{self.name}: {self.pause_at} not reached within {within_s:g} s\n{self.output()}")
            time.sleep(0.1)
        self.groups = {self.proc.pid}
        for pid in marked_alive(self.marker):
            st = _stat(pid)
            if st is not None:
                self.groups.add(st[1])
        return time.monotonic() - self.started

    def go(self) -> None:
        """Let the paused process go on."""
        assert self.pause_at is not None
        (self.points / f"{self.pause_at}.go").write_text("")

    def signal(self, sig: signal.Signals) -> None:
        """``sig`` to the run's process group, as a terminal's Ctrl-C or a CI runner's cancel sends it."""
        assert self.proc is not None
        os.killpg(self.proc.pid, sig)

    def wait(self, within_s: float = 60.0) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name}: still running {within_s:g} s after it was told to end\n"
                                 f"{self.output()}") from None

    def kill(self) -> None:
        """The test's own last resort: SIGKILL to everything of the run (never reached when the run behaves)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pid in [*marked_alive(self.marker), *alive_with_env(f"TMPDIR={self.tmp}")]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def check_clean(self) -> None:
        """Nothing of the run alive, no run directory left, the inputs unchanged (module docstring)."""
        problems = []
        if not gone(self.marker, within_s=SETTLE_S):
            problems.append(f"alive with the run marker: {describe(marked_alive(self.marker))}")
        left = _wait_for(lambda: alive_with_env(f"TMPDIR={self.tmp}"), SETTLE_S)
        if left:
            problems.append(f"alive with the run's TMPDIR: {describe(left)}")
        left = _wait_for(lambda: alive_in_groups(self.groups), SETTLE_S)
        if left:
            problems.append(f"alive in the run's process groups {sorted(self.groups)}: {describe(left)}")
        end = time.monotonic() + SETTLE_S
        while left_in(self.tmp) and time.monotonic() < end:
            time.sleep(0.2)
        if left_in(self.tmp):
            problems.append(f"left in TMPDIR: {left_in(self.tmp)}")
        after = digest(self.inputs)
        if after != self.before:
            changed = sorted(k for k in {*after, *self.before} if after.get(k) != self.before.get(k))
            problems.append(f"inputs changed: {changed}")
        if problems:
            self.kill()
            raise AssertionError(f"{self.name}:\n" + "\n".join(problems) + f"\n{self.output()}")

    def check_reports(self, code: int) -> None:
        """No report (nor a temporary file beside one) for an interrupted run; otherwise each report whole, parsed,
        and its verdict the exit code's."""
        stray = sorted(str(p) for r in self.reports for p in r.parent.glob(f".{r.name}.*.tmp"))
        assert not stray, f"{self.name}: temporary report files left: {stray}\n{self.output()}"
        if code not in VERDICT_CODES.values():
            there = [str(r) for r in self.reports if os.path.lexists(r)]
            assert not there, f"{self.name}: exit {code} (cut short) but reports were written: {there}\n{self.output()}"
            return
        for r in self.reports:
            if not r.exists():
                continue
            status = report_status(r)
            assert VERDICT_CODES[status] == code, f"{self.name}: {r} says {status}, the exit code is {code}"


def report_status(path: Path) -> str:
    """The verdict a report file gives: JSON ``verdict``, the JUnit ``verdict`` property, the HTML ``data-status``."""
    text = path.read_text()
    if path.suffix == ".json":
        return str(json.loads(text)["verdict"])
    if path.suffix == ".xml":
        tree = ET.fromstring(text)
        found = [p.get("value") for p in tree.iter("property") if p.get("name") == "verdict"]
        assert found, f"{path}: no verdict property"
        return str(found[0])
    assert text.rstrip().endswith("</html>"), f"{path}: not a whole HTML page"
    marker = 'data-status="'
    assert marker in text, f"{path}: no data-status"
    return text.split(marker, 1)[1].split('"', 1)[0]


def _default_sigint() -> None:  # pragma: no cover - runs in the child between fork and exec
    """SIGINT as a terminal's process has it: a shell's background job inherits it ignored, and Python then never
    turns it into KeyboardInterrupt; the gate under test must see the signal as a user's Ctrl-C sends it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def gate_argv(*, level: str, reports: Path | None, contract: Path = CONTRACT, target: Path = TARGET,
              draft: Path = DRAFT, extra: Sequence[str] = ()) -> list[str]:
    """``specparity gate`` on the bundled tiny deployment; with ``reports``, its JSON, HTML and JUnit reports there."""
    argv = ["-m", "specparity.cli", "gate", "--contract", str(contract), "--target", str(target), "--draft", str(draft),
            "--level", level, "--timeout", "600", *extra]
    if reports is not None:
        argv += ["--json", str(reports / "r.json"), "--html", str(reports / "r.html"),
                 "--junit", str(reports / "j.xml")]
    return argv


def report_paths(reports: Path) -> list[Path]:
    return [reports / "r.json", reports / "r.html", reports / "j.xml"]
