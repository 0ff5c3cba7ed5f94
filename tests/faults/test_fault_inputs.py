"""Bad input and report paths that cannot be written, each a real ``specparity gate`` process: exit 2 naming the file
(or option) and field, before any engine starts (the run waits at ``engine_import`` should it ever get there, and the
test fails at once), nothing left running, no run directory, the inputs unchanged, no report.

The cases are tests/bad_inputs.py's tables (a 0-byte, truncated, symlink-loop, directory or
pickle draft; a probe of 0 tokens, a NaN or Inf recorded fc input, a NaN in the contract's acceptance), a 0-byte
target, swapped --target/--draft, a --json under a regular file and (as root: CI) an --html on a read-only file
system. All run at ``--level all``, the level that reads the most, side by side (each is one interpreter start, a
few CPU-seconds).
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path

import pytest
from tests.bad_inputs import (
    BAD_CONTRACTS,
    BAD_DRAFTS,
    is_root,
    named_file,
    tmpfs,
    tripwire_marker,
    under_a_file,
)
from tests.faults.fault_runs import CONTRACT, DRAFT, TARGET, Run, contract_files, gate_argv, report_paths

pytestmark = [pytest.mark.faults]


def _case(root: Path, name: str) -> Path:
    d = root / name
    d.mkdir()
    return d


def _cases(root: Path) -> list[tuple[Run, str]]:
    """Every case as a run (not started) and the words its one error line must hold."""
    out: list[tuple[Run, str]] = []
    for name, bad in sorted(BAD_DRAFTS.items()):
        base = _case(root, f"draft-{name}")
        draft = bad.build(base / "draft")
        out.append((Run(base / "run", gate_argv(level="all", reports=None, draft=draft), name=f"draft-{name}",
                        pause_at="engine_import", inputs=[*contract_files(CONTRACT), TARGET, draft]),
                    f"{draft / bad.file}: --draft: "))
    for name, bad_c in sorted(BAD_CONTRACTS.items()):
        base = _case(root, f"contract-{name}")
        contract = bad_c.build(base / "c")
        out.append((Run(base / "run", gate_argv(level="all", reports=None, contract=contract), name=f"contract-{name}",
                        pause_at="engine_import", inputs=[*contract_files(contract), TARGET, DRAFT]),
                    f"{named_file(contract, bad_c.file)}: {bad_c.field}: "))
    base = _case(root, "target-empty")
    target = Path(shutil.copytree(TARGET, base / "target"))
    (target / "model.safetensors").write_bytes(b"")
    out.append((Run(base / "run", gate_argv(level="all", reports=None, target=target), name="target-empty",
                    pause_at="engine_import", inputs=[*contract_files(CONTRACT), target, DRAFT]),
                f"{target / 'model.safetensors'}: --target: 0 bytes"))
    base = _case(root, "swapped")
    out.append((Run(base / "run", gate_argv(level="all", reports=None, target=DRAFT, draft=TARGET), name="swapped",
                    pause_at="engine_import"), "--target and --draft are swapped"))
    base = _case(root, "json-under-a-file")
    report = under_a_file(base)
    out.append((Run(base / "run", gate_argv(level="all", reports=None, extra=["--json", str(report)]),
                    name="json-under-a-file", pause_at="engine_import", reports=[report]),
                f"{report}: --json: lies under"))
    return out


def _check(run: Run, says: str) -> None:
    code = run.wait()
    assert code == 2, f"{run.name}: exit {code}\n{run.output()}"
    assert not run.reached(), f"{run.name}: an engine started\n{run.output()}"
    line = run.stderr.strip().splitlines()[-1]
    assert line.startswith("specparity: error: ") and says in line, f"{run.name}: {line!r}"
    assert "Traceback" not in run.stderr, run.output()
    run.check_clean()
    run.check_reports(code)


def _run_all(runs: list[tuple[Run, str]], *, within_s: float = 300) -> None:
    """Start every run, then check each; a run that reaches the engine is stopped at once."""
    for run, _ in runs:
        run.start()
    end = time.monotonic() + within_s
    while any(r.proc is not None and r.proc.poll() is None for r, _ in runs) and time.monotonic() < end:
        for run, _ in runs:
            if run.reached():
                run.kill()
        time.sleep(0.2)
    problems = []
    for run, says in runs:
        try:
            _check(run, says)
        except AssertionError as e:
            problems.append(str(e))
    assert not problems, "\n\n".join(problems)


def test_bad_input_is_exit_2_and_nothing_starts(tmp_path: Path) -> None:
    runs = _cases(tmp_path)
    _run_all(runs)
    for name in BAD_DRAFTS:
        assert not tripwire_marker(tmp_path / f"draft-{name}" / "draft").exists()  # no pickle ran


@pytest.mark.skipif(not is_root(), reason="mounts a tmpfs: needs root (CI runs as root)")
def test_an_html_report_on_a_read_only_file_system_is_exit_2_before_the_engine(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", read_only=True) as ro:
        run = Run(tmp_path / "run", gate_argv(level="all", reports=None, extra=["--html", str(ro / "r.html")]),
                  name="html-read-only", pause_at="engine_import", reports=[ro / "r.html"])
        _run_all([(run, f"{ro / 'r.html'}: --html: cannot write in {ro}")])


@pytest.mark.sglang
def test_an_engine_that_cannot_be_imported_is_exit_3(tmp_path: Path) -> None:
    """SGLang's import makes ``~/.cache`` (tests/serving/test_engine_import.py); a HOME where no folder can be made
    (a read-only mount as root, as in a container; else a path under a regular file) fails it: exit 3, the JSON
    report's verdict ``error``, nothing of the run left."""
    with contextlib.ExitStack() as stack:
        if is_root():
            home = stack.enter_context(tmpfs(tmp_path / "home", read_only=True))
        else:
            home = under_a_file(tmp_path, "home")
        reports = tmp_path / "reports"
        run = Run(tmp_path / "run", gate_argv(level="static", reports=reports), name="engine-import",
                  env={"HOME": str(home), "XDG_CACHE_HOME": None, "TORCHINDUCTOR_CACHE_DIR": None,
                       "TRITON_CACHE_DIR": None}, reports=report_paths(reports)).start()
        code = run.wait(within_s=300)
        assert code == 3, run.output()
        assert "engine_import" in (reports / "r.json").read_text() and "SGLang refuses" not in run.stdout
        run.check_clean()
        run.check_reports(code)
