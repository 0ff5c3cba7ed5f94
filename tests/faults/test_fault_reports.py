"""Reports cut short (docs/report-format.md "Cut short"): a full disk while a real gate run writes
them (root: a small tmpfs; CI runs as root), a writer killed between two renames, and the pytest plugin: its report
directory on a read-only disk, and the session interrupted while its gate runs.

- Full disk: exit 3, the report lines printed, one line naming what was written (none) and not written, no partial
  or temporary file on the disk, nothing of the run left.
- SIGKILL while the faces are renamed into place (the ``report_write`` point: the first face renamed, the others
  staged): nothing of the run's reports is left, neither the face in place nor a temporary file (the reaper's
  watchdog removes both). The writer is the gate's own ``write_files`` with three faces, in a process of its own, so
  the case costs no engine start; test_fault_signals.py meets the same point in a real gate.
- ``pytest -m parity --parity-report DIR``: DIR on a read-only disk is pytest's usage error (exit 4) before any gate
  run. The session interrupted: SIGTERM while the engine captures ends pytest by the signal (pytest installs no
  handler for it: exit -15 here, 143 from a shell), SIGINT while the engine is imported is pytest's own "interrupted"
  (exit 2); either way the engine child and its directories are gone within seconds and DIR holds no report.
"""

from __future__ import annotations

import signal
import textwrap
from pathlib import Path

import pytest
from tests.bad_inputs import is_root, tmpfs
from tests.faults.fault_runs import CONTRACT, DRAFT, TARGET, Run, gate_argv, report_paths

pytestmark = [pytest.mark.faults]


@pytest.mark.sglang
@pytest.mark.skipif(not is_root(), reason="mounts a tmpfs: needs root (CI runs as root)")
def test_a_full_disk_while_writing_is_exit_3_and_leaves_no_partial_file(tmp_path: Path) -> None:
    # two pages: the static run's JSON report (~3 KB) takes one, its HTML report (~5 KB) needs two, so its writing
    # stops part way (a truncated temporary file, which must not be left)
    with tmpfs(tmp_path / "full", size="8k") as disk:
        run = Run(tmp_path / "run", gate_argv(level="static", reports=disk), name="full-disk",
                  reports=report_paths(disk)).start()
        code = run.wait(within_s=300)
        assert code == 3, run.output()
        line = run.stderr.strip().splitlines()[-1]
        assert line.startswith(f"specparity: error: could not write the --html report {disk / 'r.html'}: "
                               "No space left on device; written: none; not written: "), line
        assert "(no partial file is left)" in line and "Traceback" not in run.stderr
        assert run.stdout.startswith("PASS"), run.output()  # the terminal face is whole: the check ran
        assert sorted(p.name for p in disk.iterdir()) == [], "a partial or temporary file is left"
        run.check_clean()
        run.check_reports(code)


# the gate's own writer, its three faces with what a passing run writes in them
WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from specparity.report.writing import ReportFile, write_files
    out = Path(sys.argv[1])
    write_files([ReportFile("--json report", out / "r.json", '{"verdict": "pass"}\\n'),
                 ReportFile("--html report", out / "r.html", '<html data-status="pass"></html>\\n'),
                 ReportFile("--junit report", out / "j.xml", '<testsuites><property name="verdict" value="pass"/>'
                            '</testsuites>\\n')])
""")


def test_sigkill_between_two_renames_leaves_no_report(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    run = Run(tmp_path / "run", ["-c", WRITER, str(reports)], name="writer-killed", pause_at="report_write",
              reports=report_paths(reports)).start()
    run.wait_point(within_s=60)
    assert (reports / "r.json").is_file()  # the first face is in place, the others staged
    assert len(list(reports.glob(".*.tmp"))) == 2
    run.signal(signal.SIGKILL)
    code = run.wait()
    assert code == -signal.SIGKILL
    run.check_clean()  # the watchdog is gone too: it removed the files, then exited
    run.check_reports(code)
    assert sorted(p.name for p in reports.iterdir()) == []


@pytest.mark.sglang
@pytest.mark.parametrize(("sig", "point"), [(signal.SIGTERM, "capture"), (signal.SIGINT, "engine_import")],
                         ids=["SIGTERM-capture", "SIGINT-engine_import"])
def test_the_plugin_interrupted_while_its_gate_runs(tmp_path: Path, sig: signal.Signals, point: str) -> None:
    session = tmp_path / "session"
    session.mkdir()
    reports = tmp_path / "reports"
    run = Run(tmp_path / "run", ["-m", "pytest", "-p", "no:cacheprovider", "-q", "--rootdir", str(session), "-m", "parity",
                                 "--parity-contract", str(CONTRACT), "--parity-target", str(TARGET),
                                 "--parity-draft", str(DRAFT), "--parity-level", "capture",
                                 "--parity-report", str(reports), str(session)],
              name=f"plugin-{sig.name}", pause_at=point,
              reports=[reports / n for n in ("report.json", "report.html", "report.txt", "junit.xml")]).start()
    run.wait_point()
    run.signal(sig)
    code = run.wait()
    print(f"pytest -m parity, {sig.name} at {point}: exit {code}")
    expected = -signal.SIGTERM if sig == signal.SIGTERM else 2  # pytest's own: 2 is "interrupted"
    assert code == expected, f"{run.name}: exit {code}, expected {expected}\n{run.output()}"
    run.check_clean()
    run.check_reports(code)
    assert not reports.exists() or not any(reports.iterdir()), f"{run.name}: {sorted(reports.iterdir())}"


@pytest.mark.skipif(not is_root(), reason="mounts a tmpfs: needs root (CI runs as root)")
def test_the_plugin_report_on_a_read_only_disk_stops_the_session_before_any_gate_run(tmp_path: Path) -> None:
    """``--parity-report`` on a read-only disk (it ended in a raw traceback after the items passed): pytest's usage
    error (exit 4) naming the option, before any gate run; nothing written, nothing left. (A disk that fills while the
    session writes its reports is tests/plugin/test_plugin_reports.py's, on a canned verdict.)"""
    session = tmp_path / "session"
    session.mkdir()
    with tmpfs(tmp_path / "disk", read_only=True) as reports:
        run = Run(tmp_path / "run", ["-m", "pytest", "-p", "no:cacheprovider", "-q", "--rootdir", str(session), "-m",
                                     "parity", "--parity-contract", str(CONTRACT), "--parity-target", str(TARGET),
                                     "--parity-draft", str(DRAFT), "--parity-report", str(reports), str(session)],
                  name="plugin-read-only", pause_at="engine_import",
                  reports=[reports / n for n in ("report.json", "report.html", "report.txt", "junit.xml")]).start()
        code = run.wait(within_s=300)
        out = run.stdout + run.stderr
        assert code == 4 and f"{reports}: --parity-report: cannot write in {reports}" in out, run.output()
        assert "Traceback" not in out and not run.reached(), run.output()
        assert sorted(p.name for p in reports.iterdir()) == []
        run.check_clean()
