"""Report files: checked before any engine starts (exit 2 naming the option), written whole or
not at all (a temp file beside each, renamed into place once every face is on disk), and a failure while writing
is exit 3 naming the faces written and not written, with no partial or temporary file left.

The full disk and the read-only file system are real: a 64 KiB tmpfs (tests/bad_inputs.py, root only; CI runs as
root). The CLI runs in-process with the gate replaced, so a test that passes never started an engine.
"""

from __future__ import annotations

import errno
import json
import os
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from tests.bad_inputs import BUNDLE, CONTRACT, needs_root, tmpfs, under_a_file

import specparity.gate
from specparity.cli import main
from specparity.errors import InputError
from specparity.report import ReportWriteError, check_report_path, render_json, write_junit, write_reports
from specparity.verdict import ChunkReport, Heatmap, Verdict

SOURCES = ("layer:1", "layer:3", "layer:5")
COLUMNS = ("embedding", *(f"layer:{i}" for i in range(8)))


def passing_verdict() -> Verdict:
    """A pass at the capture level with a heatmap: its HTML (an embedded PNG) is larger than a 64 KiB tmpfs."""
    rows = [[round(max(0.0, 1.0 - 0.2 * abs(c - p)), 3) for c in range(len(COLUMNS))] for p in (2, 4, 6, 2, 4, 6)]
    return Verdict(
        contract_name="tiny-llama-eagle3", contract_hash="ab" * 32, level="capture", status="pass",
        engine_version="0.5.23", target_architecture="LlamaForCausalLM", draft_path="d", expected_layout=SOURCES,
        served_layout=SOURCES, chunks=tuple(ChunkReport(i, s, s, cosine=1.0, max_abs_err=0.0)
                                            for i, s in enumerate(SOURCES)),
        findings=(), heatmap=Heatmap([f"served {i}" for i in range(3)] + [f"recorded {i}" for i in range(3)],
                                     COLUMNS, rows),
        probes=tuple({"index": i, "tokens": 32, "status": "pass", "max_abs_err": 0.0} for i in range(4)),
        timings={"static": 1.0, "capture": 2.0, "compare": 0.5, "total": 3.5})


def leftovers(directory: Path) -> list[str]:
    """Every name in ``directory`` (temporary files start with a dot)."""
    return sorted(p.name for p in directory.iterdir())


# --- before the engine starts -------------------------------------------------------------------------------------


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The gate replaced by one that fails the test: an exit before it means no engine started."""
    calls: list[Any] = []

    def run_gate(*args: Any, **kw: Any) -> Verdict:
        calls.append(args)
        raise AssertionError("the gate ran (an engine would have started) before the report paths were checked")

    monkeypatch.setattr(specparity.gate, "run_gate", run_gate)
    yield calls


def gate_cli(*extra: str) -> Any:
    args = ["gate", "--contract", str(CONTRACT), "--target", str(BUNDLE / "target"), "--draft",
            str(BUNDLE / "draft"), "--level", "capture", *extra]
    return CliRunner().invoke(main, args)


@pytest.mark.parametrize("option", ["--json", "--html", "--junit"])
def test_a_report_path_under_a_regular_file_is_exit_2_naming_the_option(tmp_path: Path, option: str,
                                                                        no_engine: list[Any]) -> None:
    path = under_a_file(tmp_path)
    result = gate_cli(option, str(path))
    assert result.exit_code == 2, result.output
    assert f"{path}: {option}: lies under {tmp_path / 'plain'}, which is a regular file" in result.output
    assert not no_engine


def test_a_directory_given_for_a_report_file_is_exit_2(tmp_path: Path, no_engine: list[Any]) -> None:
    result = gate_cli("--junit", str(tmp_path))
    assert result.exit_code == 2 and f"{tmp_path}: --junit: is a directory" in result.output, result.output
    assert not no_engine


@needs_root
@pytest.mark.parametrize("option", ["--json", "--html", "--junit"])
def test_a_read_only_file_system_is_exit_2_naming_the_option(tmp_path: Path, option: str,
                                                             no_engine: list[Any]) -> None:
    with tmpfs(tmp_path / "ro", read_only=True) as ro:
        result = gate_cli("--json", str(tmp_path / "ok.json"), option, str(ro / "reports" / "r.out"))
        assert result.exit_code == 2, result.output
        assert f"{option}: cannot write in {ro}: Read-only file system" in result.output
        assert not no_engine
    assert not (tmp_path / "ok.json").exists()  # nothing is written when the run never started


def test_check_report_path_creates_nothing(tmp_path: Path) -> None:
    check_report_path(tmp_path / "a" / "b" / "r.json", option="--json")
    check_report_path(tmp_path / "reports", option="--parity-report", directory=True)
    assert leftovers(tmp_path) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError) as e:
        check_report_path(tmp_path / "file", option="--parity-report", directory=True)
    assert e.value.field == "--parity-report" and "is not a directory" in str(e.value)


def test_the_explain_json_path_is_checked_before_the_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import specparity.serving.engine as engine

    monkeypatch.setattr(engine, "get_engine", lambda name: pytest.fail("explain started the engine"))
    path = under_a_file(tmp_path)
    result = CliRunner().invoke(main, ["explain", "--target", str(BUNDLE / "target"), "--draft",
                                       str(BUNDLE / "draft"), "--json", str(path)])
    assert result.exit_code == 2 and f"{path}: --json: lies under" in result.output, result.output


# --- written whole or not at all ----------------------------------------------------------------------------------


def test_each_face_replaces_the_old_file_whole(tmp_path: Path) -> None:
    old = tmp_path / "r.json"
    old.write_text("an older report\n")
    paths = write_reports(passing_verdict(), json_path=old, html_path=tmp_path / "r.html",
                          junit_path=tmp_path / "j.xml")
    assert paths == [old, tmp_path / "r.html", tmp_path / "j.xml"]
    assert json.loads(old.read_text())["verdict"] == "pass"
    assert leftovers(tmp_path) == ["j.xml", "r.html", "r.json"]  # no temporary file beside them
    assert oct(old.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_failure_while_writing_leaves_no_face_and_no_temp_file(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The second face fails mid-write (ENOSPC from fsync): none is renamed into place, the old files stay."""
    (tmp_path / "r.json").write_text("an older report\n")
    real, seen = os.fsync, []

    def fsync(fd: int) -> None:
        seen.append(fd)
        if len(seen) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(ReportWriteError) as e:
        write_reports(passing_verdict(), json_path=tmp_path / "r.json", html_path=tmp_path / "r.html",
                      junit_path=tmp_path / "j.xml")
    assert leftovers(tmp_path) == ["r.json"] and (tmp_path / "r.json").read_text() == "an older report\n"
    assert str(e.value) == (
        f"could not write the --html report {tmp_path / 'r.html'}: No space left on device; written: none; not "
        f"written: --html report {tmp_path / 'r.html'}, --junit report {tmp_path / 'j.xml'} (no partial file is left)")
    assert e.value.exit_code == 3


def test_a_failed_rename_names_the_faces_already_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real, calls = os.replace, []

    def replace(src: Any, dst: Any) -> None:
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(errno.EIO, "Input/output error")
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(ReportWriteError) as e:
        write_reports(passing_verdict(), json_path=tmp_path / "r.json", junit_path=tmp_path / "j.xml")
    assert f"written: --json report {tmp_path / 'r.json'}; not written: --junit report" in str(e.value)
    assert leftovers(tmp_path) == ["r.json"]


@needs_root
def test_a_full_disk_leaves_no_truncated_report(tmp_path: Path) -> None:
    verdict = passing_verdict()
    with tmpfs(tmp_path / "small") as small:
        (small / "report.json").write_text("an older report\n")
        with pytest.raises(ReportWriteError) as e:
            write_reports(verdict, small)
        assert "No space left on device" in str(e.value) and "written: none" in str(e.value)
        assert leftovers(small) == ["report.json"] and (small / "report.json").read_text() == "an older report\n"
        # the JSON alone fits: it is written whole and parses
        write_reports(verdict, json_path=small / "report.json")
        assert json.loads((small / "report.json").read_text()) == json.loads(render_json(verdict))
        assert leftovers(small) == ["report.json"]


@needs_root
def test_the_gate_exits_3_when_its_reports_do_not_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check passed; the HTML does not fit on the disk: exit 3 (never 0, never a traceback), no file left."""
    monkeypatch.setattr(specparity.gate, "run_gate", lambda *a, **k: passing_verdict())
    with tmpfs(tmp_path / "small") as small:
        result = gate_cli("--json", str(small / "r.json"), "--html", str(small / "r.html"), "--junit",
                          str(small / "j.xml"))
        assert result.exit_code == 3, result.output
        assert result.output.startswith("PASS  fc input matches")
        assert (f"specparity: error: could not write the --html report {small / 'r.html'}: No space left on device; "
                "written: none; not written: --html report") in result.output
        assert "Traceback" not in result.output and "internal error" not in result.output
        assert leftovers(small) == []


def test_write_junit_is_whole_too(tmp_path: Path) -> None:
    out = write_junit(passing_verdict(), tmp_path / "reports" / "j.xml")
    assert ET.parse(out).getroot().tag == "testsuites" and leftovers(tmp_path / "reports") == ["j.xml"]


def test_junit_suite_time_is_the_run_not_its_parts_added_twice() -> None:
    from specparity.report import render_junit

    suite = ET.fromstring(render_junit(passing_verdict()).split("\n", 1)[1]).find("testsuite")
    assert suite is not None and suite.get("time") == "3.500"  # "total", not total + static + capture + compare


def test_an_interrupt_while_writing_leaves_no_face_of_the_run(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM unwinds as a BaseException (serving/child/reaper.py Interrupted): the faces already renamed into place go
    too, so an interrupted run leaves nothing that reads as its verdict."""
    from specparity.serving.child.reaper import Interrupted

    real, calls = os.replace, []

    def replace(src: Any, dst: Any) -> None:
        calls.append(dst)
        if len(calls) == 2:
            raise Interrupted(15)
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(Interrupted):
        write_reports(passing_verdict(), json_path=tmp_path / "r.json", junit_path=tmp_path / "j.xml")
    assert leftovers(tmp_path) == []
