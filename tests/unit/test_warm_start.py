"""Warm start (serving/zygote.py, serving/warm.py): jobs forked from one zygote behave as cold children.

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

from specparity.serving import warm
from specparity.serving.process import child_env

DATA = Path(__file__).parent / "data" / "warm"
MODULE = "warm_probe_worker"


@pytest.fixture
def zygote_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(DATA), os.environ.get("PYTHONPATH", "")) if p))
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


def test_warm_start_is_off_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(warm.WARM_START_ENV, raising=False)
    assert not warm.enabled()
    monkeypatch.setenv(warm.WARM_START_ENV, "1")
    assert warm.enabled()
