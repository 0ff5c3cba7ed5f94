"""specparity where users deploy: built as a wheel and an sdist by the standard build frontend,
checked by twine, installed into a fresh venv outside this checkout, and run as ``pytest -m parity`` in a temporary
deploy repo whose pyproject.toml names two deployments.

The fresh venv holds specparity only from the wheel (its files, its dist-info and so its pytest11 and console-script
entry points). The serving stack a deploy repo already has (torch, SGLang 0.5.23, pytest) is borrowed from .venv
through one ``.pth`` line pointing at a view of .venv's site-packages without specparity's editable install, so
nothing in the deploy repo can import this checkout's src/ (asserted). Everything runs in subprocesses with this
checkout's environment variables for the suite removed: cold engine starts, as in a user's CI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from tests.deploy_files import draft_with_ids, pyproject_with_deployments

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "fixtures" / "default"
CONTRACT = REPO / "contracts" / "tiny-llama-eagle3.json"
pytestmark = [pytest.mark.sglang, pytest.mark.slow]

PYPROJECT = pyproject_with_deployments({
    "tiny-healthy": {"contract": "contracts/tiny-llama-eagle3.json", "target": "models/target",
                     "draft": "drafters/healthy", "level": "capture"},
    "tiny-kimi": {"contract": "contracts/tiny-llama-eagle3.json", "target": "models/target",
                  "draft": "drafters/kimi", "level": "static"},
})


def _env() -> dict[str, str]:
    """The caller's environment without this suite's settings and without any path into this checkout."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT",
            "PYTEST_CURRENT_TEST")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SPECPARITY_")}


def _run(args: list[str | Path], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    r = _run([REPO / "scripts" / "dist.sh", out], cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    # twine check --strict exits non-zero on any warning or failure; rich may wrap its lines, so count the words
    assert r.stdout.count("PASSED") == 2 and "FAILED" not in r.stdout and "WARNING" not in r.stdout, r.stdout
    return out


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv outside the checkout: specparity from the wheel, the serving stack borrowed from .venv."""
    root = tmp_path_factory.mktemp("deploy-venv")
    venv = root / "venv"
    assert _run([sys.executable, "-m", "venv", venv], cwd=root).returncode == 0
    stack = root / "serving-stack"  # .venv's site-packages, less specparity's editable install
    stack.mkdir()
    own = Path(sysconfig.get_paths()["purelib"])
    for entry in own.iterdir():
        if not entry.name.lower().startswith(("specparity", "__editable__.specparity")):
            (stack / entry.name).symlink_to(entry)
    site = Path(_run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=root).stdout.strip())
    (site / "serving-stack.pth").write_text(f"{stack}\n")
    (wheel,) = dist.glob("specparity-*.whl")
    r = _run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], cwd=root)
    assert r.returncode == 0, r.stderr
    return venv


def test_the_sdist_and_wheel_ship_what_the_gate_needs(dist: Path) -> None:
    import tarfile
    import zipfile

    (wheel,) = dist.glob("specparity-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("specparity/py.typed", "specparity/report/templates/report.html",
                   "specparity/serving/sglang/kernel_stub/sgl_kernel/__init__.py", "specparity/plugin.py"):
        assert needed in names, needed
    (info,) = {n.split("/")[0] for n in names if ".dist-info/" in n}
    entry_points = zipfile.ZipFile(wheel).read(f"{info}/entry_points.txt").decode()
    assert "specparity = specparity.plugin" in entry_points and "specparity = specparity.cli:main" in entry_points
    (sdist,) = dist.glob("specparity-*.tar.gz")
    with tarfile.open(sdist) as tar:
        members = tar.getnames()
    assert any(m.endswith("src/specparity/gate.py") for m in members)
    assert any(m.endswith("/pyproject.toml") for m in members)


def test_pytest_m_parity_in_a_foreign_deploy_repo_runs_both_deployments(venv: Path, tmp_path: Path) -> None:
    repo = tmp_path / "deploy-repo"  # the user's repo: contracts, models, drafters, pyproject.toml; no specparity
    (repo / "contracts").mkdir(parents=True)
    shutil.copy(CONTRACT, repo / "contracts" / CONTRACT.name)
    shutil.copy(CONTRACT.with_suffix(".probes.safetensors"), repo / "contracts")
    shutil.copytree(BUNDLE / "target", repo / "models" / "target")
    shutil.copytree(BUNDLE / "draft", repo / "drafters" / "healthy")
    # the seed incident: the embedding first, the rest shifted
    draft_with_ids(BUNDLE / "draft", repo / "drafters" / "kimi", [-1, 1, 3])
    (repo / "pyproject.toml").write_text(PYPROJECT)
    before = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()}

    py = venv / "bin" / "python"
    where = _run([py, "-c", "import specparity, importlib.metadata as m; print(specparity.__file__); "
                            "print(m.version('specparity'))"], cwd=repo)
    path, version = where.stdout.split()
    assert Path(path).is_relative_to(venv) and not Path(path).is_relative_to(REPO), path
    assert version == "0.1.0"
    versions = _run([venv / "bin" / "specparity", "versions"], cwd=repo)
    assert versions.returncode == 0 and "sglang-family-E" in versions.stdout, versions.stderr

    r = _run([py, "-m", "pytest", "-m", "parity", "-v", "--parity-report", "parity-reports",
              "--junitxml", "parity-reports/pytest-junit.xml"], cwd=repo)
    out = r.stdout
    assert r.returncode == 1, out + r.stderr[-3000:]  # one deployment fails: pytest's own exit code 1
    for line in ["parity::tiny-healthy::static PASSED", "parity::tiny-healthy::capture[probe-0] PASSED",
                 "parity::tiny-healthy::capture[probe-3] PASSED", "parity::tiny-kimi::static FAILED"]:
        assert line in out, out
    assert "passed" in out.splitlines()[-1] and "1 failed" in out.splitlines()[-1], out.splitlines()[-1]
    assert "FAIL" in out and "embedding" in out
    healthy = json.loads((repo / "parity-reports" / "tiny-healthy" / "report.json").read_text())
    kimi_report = json.loads((repo / "parity-reports" / "tiny-kimi" / "report.json").read_text())
    assert (healthy["verdict"], kimi_report["verdict"]) == ("pass", "fail")
    assert "extra_embedding" in [f["kind"] for f in kimi_report["findings"]], kimi_report["findings"]
    assert (repo / "parity-reports" / "tiny-healthy" / "report.html").is_file()
    cases = ET.parse(repo / "parity-reports" / "pytest-junit.xml").getroot().iter("testcase")
    verdicts = {(c.get("classname"), c.get("name")): c.find("failure") is None for c in cases}
    assert verdicts == {("parity.tiny-healthy", "static"): True,
                        **{("parity.tiny-healthy", f"capture[probe-{i}]"): True for i in range(4)},
                        ("parity.tiny-kimi", "static"): False}, verdicts
    assert {p: p.read_bytes() for p in before} == before  # nothing the user gave was modified
