"""The plugin's report directory: ``--parity-report`` is checked when the session starts, before
any gate run (a usage error naming the option, pytest's exit 4), and writing it at session end never ends in a
traceback: the failure is one line naming what was not written, and a session whose checks passed exits 3.

The gate is replaced by a canned pass (the plugin is thin; the gate and the report writer have their own tests).
The full disk and the read-only file system are a small tmpfs (root only; CI runs as root).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tests.bad_inputs import needs_root, tmpfs, under_a_file

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "contracts" / "tiny-llama-eagle3.json"

CANNED_PASS = '''
import os
import specparity.gate as gate
from specparity.verdict import ChunkReport, Heatmap, Verdict

COLUMNS = ["embedding", *(f"layer:{i}" for i in range(8))]

def fake(contract, target, draft, *, level="all", **kw):
    with open(os.environ["CALLS"], "a") as f:
        f.write("run\\n")
    exp = ["layer:1", "layer:3", "layer:5"]
    rows = [[max(0.0, 1.0 - 0.2 * abs(c - p)) for c in range(len(COLUMNS))] for p in (2, 4, 6, 2, 4, 6)]
    return Verdict(contract_name="tiny", contract_hash="ab" * 32, level=level, status="pass", engine_version="0.5.23",
                   target_architecture="LlamaForCausalLM", draft_path=str(draft), expected_layout=exp,
                   served_layout=exp, chunks=[ChunkReport(i, e, e, 1.0, 0.0) for i, e in enumerate(exp)],
                   heatmap=Heatmap([f"served {i}" for i in range(3)] + [f"recorded {i}" for i in range(3)], COLUMNS,
                                   rows),
                   probes=[{"index": i, "tokens": 80, "status": "pass", "max_abs_err": 0.0} for i in range(4)])

gate.run_gate = fake
'''


@pytest.fixture
def calls(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    out = tmp_path / "calls.txt"
    monkeypatch.setenv("CALLS", str(out))
    pytester.makeconftest(CANNED_PASS)
    shutil.copy(CONTRACT, pytester.path / "c.json")
    return out


def run(pytester: pytest.Pytester, report: Path) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-m", "parity", "--parity-contract", "c.json",
                                         "--parity-target", "t", "--parity-draft", "d", "--parity-report", str(report))


def test_a_report_dir_under_a_regular_file_stops_the_session_before_any_gate_run(
        pytester: pytest.Pytester, calls: Path, tmp_path: Path) -> None:
    report = under_a_file(tmp_path, "reports")
    result = run(pytester, report)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: specparity: {report}: --parity-report: lies under {report.parent}, which is "
                                 "a regular file*"])
    assert not calls.exists()  # the gate never ran, so no engine started


@needs_root
def test_a_read_only_report_dir_stops_the_session_before_any_gate_run(pytester: pytest.Pytester, calls: Path,
                                                                        tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", read_only=True) as ro:
        result = run(pytester, ro / "reports")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: specparity: */reports: --parity-report: cannot write in *: Read-only file "
                                 "system"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str() and not calls.exists()


@needs_root
def test_a_full_report_dir_is_one_line_and_exit_3_never_a_traceback(pytester: pytest.Pytester, calls: Path,
                                                                    tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", size="16k") as small:
        result = run(pytester, small)
        names = sorted(p.name for p in small.iterdir())
    result.assert_outcomes(passed=6)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR  # 3: the checks passed, their report is missing
    out = result.stdout.str()
    assert "Traceback" not in out and "INTERNALERROR" not in out
    result.stdout.fnmatch_lines(["specparity: report of tiny-llama-eagle3 not written: could not write the *: No space "
                                 "left on device; written: none; not written: *report.html*(no partial file is left)"])
    assert names == []  # whole or not at all: no truncated report.html or report.json


def test_reports_are_written_whole_when_they_fit(pytester: pytest.Pytester, calls: Path, tmp_path: Path) -> None:
    result = run(pytester, tmp_path / "reports")
    result.assert_outcomes(passed=6)
    assert result.ret == pytest.ExitCode.OK
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == [
        "heatmap.svg", "junit.xml", "report.html", "report.json", "report.txt"]
