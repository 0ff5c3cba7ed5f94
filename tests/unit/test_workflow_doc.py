"""The GitHub Actions workflow a user copies (docs/workflows/parity.yml), read as a runner would:
every command it runs parses with specparity's own CLI (click) and pytest's own option parser with the plugin
loaded, the cache holds the engine env it builds, and the reports the gate writes are what it uploads."""

from __future__ import annotations

import shlex
from typing import Any

import click
import pytest
import yaml
from tests.doc_commands import ROOT, click_parse, commands, pytest_parse, shell_blocks

import specparity

WORKFLOW = ROOT / "docs" / "workflows" / "parity.yml"


def _load() -> dict[str, Any]:
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(doc, dict), WORKFLOW
    return doc


def _steps(name: str = "parity") -> list[dict[str, Any]]:
    return list(_load()["jobs"][name]["steps"])


def _commands(name: str = "parity") -> list[list[str]]:
    """Every command of every ``run`` block of job ``name``, with the job's env expanded."""
    job = _load()["jobs"][name]
    env = job.get("env", {})
    out = []
    for step in _steps(name):
        for line in step.get("run", "").splitlines():
            for key, value in env.items():
                line = line.replace(f"${key}", value).replace(f"${{{key}}}", value)
            if line.strip():
                out.append(shlex.split(line))
    return out


def _click_parse(args: list[str]) -> click.Context:
    return click_parse(args, WORKFLOW.name)


def test_every_command_parses_with_the_cli_and_the_plugin(pytester: pytest.Pytester) -> None:
    engine_env = _load()["jobs"]["parity"]["env"]["ENGINE_ENV"]
    seen = set()
    for cmd in _commands():
        exe, args = cmd[0], cmd[1:]
        if exe == "python" and args[:2] == ["-m", "venv"]:
            seen.add("venv")
        elif exe == f"{engine_env}/bin/specparity":
            ctx = _click_parse(args)
            seen.add(f"specparity {ctx.info_name}")
        elif exe == f"{engine_env}/bin/python" and args[:2] == ["-m", "pip"]:
            pins = [a for a in args if a.startswith("specparity")]
            assert pins in ([], [f"specparity=={specparity.__version__}"]), pins  # the release this checkout is
            seen.add("pip")
        elif exe == f"{engine_env}/bin/python" and args[:2] == ["-m", "pytest"]:
            config = pytest_parse(pytester, args[2:], WORKFLOW.name)  # pytest's own parser, specparity's plugin loaded
            assert config.getoption("markexpr") == "parity"
            seen.add("pytest")
        else:
            pytest.fail(f"{WORKFLOW.name}: a command this test does not know: {shlex.join(cmd)}")
    assert {"venv", "pip", "specparity versions", "specparity explain", "pytest"} <= seen, seen


def test_the_engine_env_is_cached_keyed_on_its_pins_and_the_reports_are_uploaded_always() -> None:
    job = _load()["jobs"]["parity"]
    steps = _steps()
    (cache,) = [s for s in steps if str(s.get("uses", "")).startswith("actions/cache@")]
    assert cache["with"]["path"] == job["env"]["ENGINE_ENV"]
    assert "hashFiles('requirements-serving.txt')" in cache["with"]["key"]
    (build,) = [s for s in steps if "requirements-serving.txt" in s.get("run", "")]
    assert build["if"] == f"steps.{cache['id']}.outputs.cache-hit != 'true'"  # built only on a cache miss
    (gate,) = [c for c in _commands() if c[1:3] == ["-m", "pytest"]]
    report_dir = gate[gate.index("--parity-report") + 1]
    assert gate[gate.index("--junitxml") + 1].startswith(f"{report_dir}/")
    (upload,) = [s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert upload["if"] == "always()" and upload["with"]["path"].rstrip("/") == report_dir
    assert upload["with"]["if-no-files-found"] == "error"  # a gate that wrote nothing fails the job


def test_the_ci_guide_points_at_the_workflow_file() -> None:
    guide = (ROOT / "docs" / "ci.md").read_text()
    assert "workflows/parity.yml" in guide and "```yaml" not in guide  # one copy of the workflow: the file


def test_the_ci_guides_shell_commands_parse_with_the_cli() -> None:
    """tests/unit/test_docs.py parses every page's commands; the CI guide must show the CLI form at all."""
    guide = (ROOT / "docs" / "ci.md").read_text()
    gates = [c for _, block in shell_blocks(guide) for c in commands(block) if c[:1] == ["specparity"]]
    assert gates, "docs/ci.md shows no specparity command"
    for cmd in gates:
        _click_parse(cmd[1:])


def test_the_server_job_launches_the_deploy_command_and_keeps_its_reports() -> None:
    """The second job gates the server itself (docs/live-server.md): the deploy script launched on a GPU runner."""
    job = _load()["jobs"]["parity-server"]
    assert "gpu" in job["runs-on"] and job["needs"] == "parity"
    env = job["env"]["ENGINE_ENV"]
    gates = [c for c in _commands("parity-server") if c[:1] == [f"{env}/bin/specparity"]]
    assert len(gates) == 1
    ctx = _click_parse(gates[0][1:])
    assert ctx.info_name == "gate" and ctx.params["launch_file"] is not None
    assert ctx.params["python"] == f"{env}/bin/python"
    (upload,) = [s for s in _steps("parity-server") if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    report_dir = upload["with"]["path"].rstrip("/")
    assert upload["if"] == "always()" and str(ctx.params["json_path"]).startswith(f"{report_dir}/")

