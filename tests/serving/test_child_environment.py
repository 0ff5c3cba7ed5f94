"""A ``--python`` child imports only specparity from the gate; reports name what it ran on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

import specparity.serving.child.process as process
from specparity.serving.sglang.families import ENVS

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "fixtures" / "default"
CONTRACT = REPO / "contracts" / "tiny-llama-eagle3.json"


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


def _torch_pin(torch_list: Path) -> str:
    """The torch version a matrix env's torch list installs (``torch==2.13.0+cpu``, ``torch===2.13.0``)."""
    for line in torch_list.read_text().splitlines():
        name, sep, pin = line.partition("==")
        if sep and name.strip() == "torch":
            return pin.lstrip("=").split("+")[0].strip()
    raise AssertionError(f"{torch_list} pins no torch")


# Every matrix env but .venv's own (sglang-0.5.23: the gate's interpreter), one per family and family end.
CHILD_ENVS = sorted(name for name in ENVS if name != "sglang-0.5.23")


def _child_cases() -> list[str]:
    """The case this interpreter runs: in .venv (the gate's own env, `make test`) the issue's case,
    ``--python .tox/sglang-0.5.3``; inside a matrix env (scripts/matrix.sh), that env's own interpreter as the
    child of .venv's gate. So every family env is checked once, by the matrix run that has it built."""
    try:
        installed = version("sglang")
    except PackageNotFoundError:
        return ["sglang-0.5.3"]
    own = [name for name in CHILD_ENVS if ENVS[name].sglang == installed]
    return own or ["sglang-0.5.3"]


def test_every_family_has_a_child_env_case() -> None:
    from specparity.serving.sglang.families import FAMILIES

    covered = {fam.letter for fam in FAMILIES for env in fam.envs if env in CHILD_ENVS}
    assert covered == {fam.letter for fam in FAMILIES} - {"E"}, covered  # E is .venv itself
    assert "sglang-0.5.3" in CHILD_ENVS  # the case this test was written for, run by `make test`


@pytest.mark.sglang
@pytest.mark.parametrize("env_name", _child_cases())
def test_gate_with_python_reports_the_childs_sglang_and_torch(tmp_path: Path, env_name: str) -> None:
    """The gate runs from .venv (sglang 0.5.23, torch 2.14) and serves through another matrix env's python:
    the report must name that env's sglang and torch and its sglang path."""
    env = ENVS[env_name]
    old_env = REPO / ".tox" / env_name
    python = old_env / "bin" / "python"
    if not python.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{python} is missing: build it with scripts/venv-engine.sh sglang {env.sglang}")
        pytest.skip(f"{python} is not built (scripts/venv-engine.sh sglang {env.sglang}); in CI (CI set) this fails")
    torch_version = _torch_pin(REPO / env.torch)
    out = tmp_path / "verdict.json"
    run_env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    gate_python = REPO / ".venv" / "bin" / "python"  # the gate's own env (sglang 0.5.23), as the issue states
    proc = subprocess.run(
        [str(gate_python if gate_python.is_file() else sys.executable), "-m", "specparity.cli", "gate",
         "--contract", str(CONTRACT), "--target", str(BUNDLE / "target"), "--draft", str(BUNDLE / "draft"),
         "--level", "static", "--python", str(python), "--json", str(out)],
        capture_output=True, text=True, timeout=600, check=False, env=run_env, cwd=REPO)
    assert out.is_file(), proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["engine_version"] == env.sglang, report["findings"]
    child = report["environment"]
    assert child["sglang"] == env.sglang and child["torch"].startswith(torch_version), child
    assert Path(child["sglang_path"]).is_relative_to(old_env.resolve()) or str(old_env) in child["sglang_path"]
    assert Path(child["torch_path"]).is_relative_to(old_env.resolve()) or str(old_env) in child["torch_path"]
    assert child["python"].startswith(str(old_env)) and child["device"] == "cpu"
    assert f"sglang {env.sglang}" in proc.stdout and f"torch {torch_version}" in proc.stdout, proc.stdout[-2000:]
