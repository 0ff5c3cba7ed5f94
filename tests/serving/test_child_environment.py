"""Issue 11 item 3: a ``--python`` child imports only specparity from the gate; reports name what it ran on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import specparity.serving.process as process

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "fixtures" / "default"
CONTRACT = REPO / "contracts" / "tiny-llama-eagle3.json"
OLD_ENV = REPO / ".tox" / "sglang-0.5.3"


def test_child_pythonpath_holds_only_the_specparity_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A regular install puts specparity in site-packages beside torch and sglang; the old PYTHONPATH entry
    (the package's parent) handed all of them to the deploy interpreter."""
    site = tmp_path / "gate-site-packages"
    for pkg in ("specparity", "torch", "sglang", "transformers"):
        (site / pkg).mkdir(parents=True)
        (site / pkg / "__init__.py").write_text("")
    monkeypatch.setattr(process, "_package_dir", lambda: site / "specparity")
    env = process.child_env(tmp_path / "work", python="/deploy/bin/python",
                            base={"PYTHONPATH": str(site), "HOME": "/root"})
    entries = env["PYTHONPATH"].split(os.pathsep)
    assert len(entries) == 1  # the gate's own PYTHONPATH does not leak into another interpreter
    shim = Path(entries[0])
    assert [p.name for p in shim.iterdir()] == ["specparity"]
    assert (shim / "specparity").resolve() == (site / "specparity").resolve()
    assert env["HOME"] == "/root"
    # the gate's own interpreter keeps its PYTHONPATH (same environment), after the package link
    same = process.child_env(tmp_path / "work2", python=None, base={"PYTHONPATH": "/extra"})
    assert same["PYTHONPATH"].split(os.pathsep)[1:] == ["/extra"]


@pytest.mark.sglang
def test_gate_with_python_reports_the_childs_sglang_and_torch(tmp_path: Path) -> None:
    """The gate runs from .venv (sglang 0.5.23, torch 2.14) and serves through .tox/sglang-0.5.3's python:
    the report must name 0.5.3, torch 2.13 and that env's sglang path."""
    python = OLD_ENV / "bin" / "python"
    if not python.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{python} is missing: build it with scripts/venv-sglang.sh 0.5.3")
        pytest.skip(f"{python} is not built (scripts/venv-sglang.sh 0.5.3); in CI (CI set) this fails")
    out = tmp_path / "verdict.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    gate_python = REPO / ".venv" / "bin" / "python"  # the gate's own env (sglang 0.5.23), as the issue states
    proc = subprocess.run(
        [str(gate_python if gate_python.is_file() else sys.executable), "-m", "specparity.cli", "gate", "--contract", str(CONTRACT), "--target", str(BUNDLE / "target"),
         "--draft", str(BUNDLE / "draft"), "--level", "static", "--python", str(python), "--json", str(out)],
        capture_output=True, text=True, timeout=600, check=False, env=env, cwd=REPO)
    assert out.is_file(), proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["sglang_version"] == "0.5.3", report["findings"]
    child = report["environment"]
    assert child["sglang"] == "0.5.3" and child["torch"].startswith("2.13"), child
    assert Path(child["sglang_path"]).is_relative_to(OLD_ENV.resolve()) or str(OLD_ENV) in child["sglang_path"]
    assert Path(child["torch_path"]).is_relative_to(OLD_ENV.resolve()) or str(OLD_ENV) in child["torch_path"]
    assert child["python"].startswith(str(OLD_ENV)) and child["device"] == "cpu"
    assert "sglang 0.5.3" in proc.stdout and "torch 2.13" in proc.stdout, proc.stdout[-2000:]
