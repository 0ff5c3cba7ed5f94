"""Warm start (serving/child/zygote.py, serving/child/warm.py): jobs forked from one zygote behave as cold children.

The engine-free protocol is tested here with a probe worker (tests/unit/data/warm/warm_probe_worker.py);
tests/serving/test_sglang_capture.py checks that a warm SGLang capture equals a cold one.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from specparity.serving.child import warm
from specparity.serving.child.process import child_env

DATA = Path(__file__).parent / "data" / "warm"
MODULE = "warm_probe_worker"
# The production wait for a zygote's first line. The fixture below lifts it to just under the tests' 120 s job
# deadline: on a loaded machine (CI builds five engine venvs and runs lint and mypy beside these tests on 2 cores)
# an interpreter start has been measured silent for over 30 s, and production's answer to that (start the job
# cold) is right there but is not what these tests check. The wrapper test keeps this bound for its own answer.
PRODUCTION_HELLO_S = warm.HELLO_S


@pytest.fixture
def zygote_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(DATA), os.environ.get("PYTHONPATH", "")) if p))
    monkeypatch.setattr(warm, "HELLO_S", 110.0)
    yield
    warm.shutdown()


def _job(tmp_path: Path, name: str, **req: object) -> tuple[warm.WarmChild, Path, list[str]]:
    work = tmp_path / name
    work.mkdir()
    (work / "request.json").write_text(json.dumps({"name": name, **req}))
    lines: list[str] = []
    child = warm.start_job(sys.executable, MODULE, "cpu", [str(work / "request.json"), str(work / "out")], work,
                           env_for=lambda w: child_env(w, python=None), on_stdout=lines.append,
                           deadline=time.monotonic() + 120)
    assert child is not None, "the zygote did not start"
    return child, work, lines


def _wait(child: warm.WarmChild, timeout: float = 60) -> int:
    end = time.monotonic() + timeout
    while (code := child.poll()) is None:
        assert time.monotonic() < end, "the job never ended"
        time.sleep(0.05)
    child.finish()
    return code


def test_each_job_is_a_fresh_process_forked_from_one_warm_zygote(tmp_path: Path, zygote_env: None) -> None:
    a, wa, lines = _job(tmp_path, "a")
    assert _wait(a) == 0
    b, wb, _ = _job(tmp_path, "b")
    assert _wait(b) == 0
    ra = json.loads((wa / "out" / "probe.json").read_text())
    rb = json.loads((wb / "out" / "probe.json").read_text())
    assert a.zygote is b.zygote
    assert ra["warmed_in"] == rb["warmed_in"] == a.zygote.proc.pid  # warm() ran once, in the zygote
    assert ra["ppid"] == rb["ppid"] == a.zygote.proc.pid and ra["pid"] != rb["pid"]
    assert ra["sid"] == ra["pid"] and rb["sid"] == rb["pid"]  # each job leads its own session
    assert rb["jobs_seen"] == ["b"], "job b saw state job a left behind"
    assert ra["state"] == {"device": "cpu"}
    assert "@@specparity-progress 1 2" in lines  # the job's stdout reaches the parent


def test_killing_a_job_kills_its_whole_session(tmp_path: Path, zygote_env: None) -> None:
    child, work, _ = _job(tmp_path, "slow", sleep=60)
    end = time.monotonic() + 60
    while not (work / "grandchild.pid").exists():
        assert time.monotonic() < end
        time.sleep(0.05)
    grandchild = int((work / "grandchild.pid").read_text())
    assert child.poll() is None
    child.kill()
    assert child.poll() == -9
    end = time.monotonic() + 10
    while warm._alive(grandchild) and not _zombie(grandchild):
        assert time.monotonic() < end, "the job's grandchild survived the kill"
        time.sleep(0.05)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_a_job_that_dies_reports_its_exit_code_and_stderr(tmp_path: Path, zygote_env: None) -> None:
    child, work, _ = _job(tmp_path, "dies", die=True)
    assert _wait(child) == 7
    assert "dying on purpose" in child.stderr_lines()
    assert not (work / "out" / "probe.json").exists()


def test_a_dead_zygote_means_a_cold_start(tmp_path: Path, zygote_env: None) -> None:
    child, _, _ = _job(tmp_path, "first")
    assert _wait(child) == 0
    child.zygote.proc.kill()
    child.zygote.proc.wait()
    again, _, _ = _job(tmp_path, "second")  # a new zygote replaces the dead one
    assert again.zygote is not child.zygote and _wait(again) == 0
    again.zygote.close()
    assert warm.start_job(sys.executable, MODULE, "cpu", ["x", "y"], tmp_path, env_for=lambda w: child_env(w, python=None),
                          on_stdout=print, deadline=time.monotonic() + 60) is not None  # closed -> replaced again


def test_a_changed_environment_gets_its_own_zygote(tmp_path: Path, zygote_env: None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    a, _, _ = _job(tmp_path, "a")
    _wait(a)
    monkeypatch.setenv("SPECPARITY_SOME_SETTING", "1")
    b, _, _ = _job(tmp_path, "b")
    _wait(b)
    assert a.zygote is not b.zygote
    monkeypatch.setenv("SPECPARITY_SOME_SETTING", "2")  # a third: the least recently used one (a's) is ended
    c, _, _ = _job(tmp_path, "c")
    _wait(c)
    assert warm.MAX_ZYGOTES == 2 and a.zygote.proc.wait(timeout=10) is not None and b.zygote.proc.poll() is None


def test_pytests_per_test_variable_keeps_the_zygote_and_reaches_the_job(tmp_path: Path, zygote_env: None,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest rewrites PYTEST_CURRENT_TEST for every test: that must not start a zygote per test, and each job
    still runs under the environment a cold child would get at that moment."""
    a, _, _ = _job(tmp_path, "a")
    _wait(a)
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "some/other::test (call)")
    b, wb, _ = _job(tmp_path, "b")
    _wait(b)
    assert a.zygote is b.zygote
    assert json.loads((wb / "out" / "probe.json").read_text())["current_test"] == "some/other::test (call)"


def test_a_job_sees_cuda_and_the_environment_as_a_fresh_process_does(tmp_path: Path, zygote_env: None,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The zygote's imports touched CUDA (as SGLang's do); in the job, CUDA still fails with the message a fresh
    process gets (never "Cannot re-initialize CUDA in forked subprocess"), and what warm() set is there."""
    import subprocess

    monkeypatch.setenv("PROBE_TOUCH_CUDA", "1")
    child, work, _ = _job(tmp_path, "cuda")
    assert _wait(child) == 0
    probe = json.loads((work / "out" / "probe.json").read_text())
    fresh = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]);"
                            "import warm_probe_worker as w; print(w._cuda_error())", str(DATA)],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert probe["cuda_error"] == fresh and "forked subprocess" not in fresh, (probe["cuda_error"], fresh)
    assert probe["set_by_warm"] == "1"
    assert child.zygote.ready and child.zygote.why_cold is None


def test_warm_start_is_off_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(warm.WARM_START_ENV, raising=False)
    assert not warm.enabled()
    monkeypatch.setenv(warm.WARM_START_ENV, "1")
    assert warm.enabled()


def test_an_interpreter_that_is_not_a_zygote_starts_its_jobs_cold_at_once(tmp_path: Path, zygote_env: None) -> None:
    """A wrapper script whose first line is not the zygote's hello (here it prints a progress line and hangs):
    the job is not held until its deadline; start_job gives up at once, and remembers it for the next job."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho '@@specparity-progress 1 3'\nsleep 300\n")
    fake.chmod(0o755)
    work = tmp_path / "w"
    work.mkdir()
    for _ in range(2):
        t0 = time.monotonic()
        child = warm.start_job(str(fake), MODULE, "cpu", ["r.json", "out"], work, on_stdout=lambda _line: None,
                               env_for=lambda w: child_env(w, python=None), deadline=time.monotonic() + 120)
        assert child is None
        assert time.monotonic() - t0 < PRODUCTION_HELLO_S  # decided by the first line, not by a timeout
    z = warm.zygote_for(str(fake), MODULE, "cpu", lambda w: child_env(w, python=None))
    assert z is None  # remembered: no second start of the wrapper
