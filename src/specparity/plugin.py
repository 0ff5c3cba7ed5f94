"""pytest plugin: ``pytest -m parity`` runs the gate with ordinary pytest output.

Thin over :mod:`specparity.gate`. Each configured deployment (``--parity-contract``, the
``parity_contract`` ini key, ``[tool.specparity.deployments.<name>]`` tables or ``parity_deployments``
ini lines; see :mod:`specparity.plugin_deployments`) is one group of items, all marked ``parity``, with node ids
that do not depend on the rootdir or the invocation dir:

- ``parity::<name>::static``            the deployment as the engine resolves it (ids, capture list, fc width)
- ``parity::<name>::capture[probe-<i>]`` the engine's real fc input on probe sample ``i``, chunk by chunk
- ``parity::<name>::outcome``           drafter acceptance on recorded vs captured inputs

A node id (or ``parity::<name>``) given as an argument selects those items, as a test path would.

``<name>`` is the deployment's name; a deployment given by options is named after its contract. The
items of one deployment share one gate run (one engine start) per session; under pytest-xdist, one per
run: the first worker runs it and the others read its result. A check that could not run fails;
nothing is skipped. Collection reads only JSON and TOML: torch and the engine load when an item runs.

Fixtures: ``parity_contract``, ``parity_verdict`` (the whole gate, one deployment), ``parity_verdicts``
(by deployment name), ``parity_resolve`` and ``parity_capture`` (session-cached factories over the
serving adapter, keyed by target, draft and server args; ``sglang_resolve`` and ``sglang_capture`` are their older
names, still served).

This module holds the options, the hooks and the fixtures; the items and the shared gate run are in
:mod:`specparity.plugin_items` (re-exported here by name).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from specparity.errors import InputError
from specparity.plugin_deployments import (
    DEFAULT_ENGINE,
    Deployment,
    check_engine,
    contract_name,
    from_ini_line,
    from_pyproject,
    unique,
)
from specparity.plugin_items import VERDICTS_KEY as VERDICTS_KEY
from specparity.plugin_items import GateSetupError as GateSetupError
from specparity.plugin_items import ParityDeployment as ParityDeployment
from specparity.plugin_items import ParityFailure as ParityFailure
from specparity.plugin_items import ParityItem as ParityItem
from specparity.plugin_items import _ConfigItem as _ConfigItem
from specparity.plugin_items import _run_gate as _run_gate
from specparity.plugin_items import _verdict as _verdict
from specparity.verdict import Verdict

PARITY_ROOT = "parity"  # first segment of every parity node id: parity::<deployment>::<check>

_OPTIONS: tuple[tuple[str, str, str], ...] = (
    ("contract", "parity_contract", "contract JSON written at training time"),
    ("target", "parity_target", "target model directory as deployed"),
    ("draft", "parity_draft", "draft model directory as deployed"),
    ("report", "parity_report", "directory for report.json / report.html / report.txt"),
    ("level", "parity_level", "static | capture | outcome | all (default all)"),
    ("python", "parity_python", "interpreter whose engine serves (default: this one)"),
    ("engine", "parity_engine", "serving engine: sglang | vllm (default sglang)"),
)
_PATH_OPTIONS = ("contract", "target", "draft", "report", "python")
DEPLOYMENTS_KEY = pytest.StashKey[list[Deployment]]()
SELECTED_KEY = pytest.StashKey[list[str]]()  # parity node ids given on the command line


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("specparity", "train/serve parity of EAGLE-3 drafters")
    for name, ini, help_text in _OPTIONS:
        group.addoption(f"--parity-{name}", dest=ini, default=None, help=f"{help_text} (ini: {ini})")
        parser.addini(ini, help_text, default=None)
    group.addoption(
        "--parity-sglang-arg", dest="parity_sglang_args", action="append", default=None, metavar="KEY=VALUE",
        help="engine argument for the deployment, repeatable: the older name of --parity-engine-arg, read as its alias "
             "(ini: parity_sglang_args, one per line)",
    )
    group.addoption(
        "--parity-engine-arg", dest="parity_engine_args", action="append", default=None, metavar="KEY=VALUE",
        help="engine argument (vllm.LLM keywords for vllm, ServerArgs for sglang), repeatable "
             "(ini: parity_engine_args, one per line)",
    )
    parser.addini("parity_sglang_args", "engine arguments KEY=VALUE, one per line: the older name of parity_engine_args, "
                  "read as its alias", type="linelist", default=[])
    parser.addini("parity_engine_args", "engine arguments KEY=VALUE, one per line", type="linelist", default=[])
    parser.addini("parity_deployments", "deployments to check, one per line: NAME contract=PATH target=PATH "
                  "draft=PATH [engine=NAME] [level=L] [python=PATH] [engine_arg=KEY=VALUE ...] "
                  "(or [tool.specparity.deployments.NAME] tables in pyproject.toml)", type="linelist", default=[])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "parity: train/serve parity checks of an EAGLE-3 drafter against its contract "
        "(pytest -m parity --parity-contract FILE --parity-target DIR --parity-draft DIR)",
    )
    # Parity node ids name no file, so show them as they are: pytest would otherwise print them
    # relative to the invocation dir (``../../parity::...``; _pytest/config/__init__.py:1438-1444,
    # cwd_relative_nodeid, used by terminal.py:1077 for -v lines and the short summary).
    relative = config.cwd_relative_nodeid

    def cwd_relative_nodeid(nodeid: Any) -> Any:
        return nodeid if str(nodeid).startswith(f"{PARITY_ROOT}::") else relative(nodeid)

    setattr(config, "cwd_relative_nodeid", cwd_relative_nodeid)  # noqa: B010 - a method, not plugin state


def _setting(config: pytest.Config, ini: str) -> tuple[str | None, bool]:
    """(value, from_ini) for one option; the command line wins."""
    value = config.getoption(ini)
    if value is not None:
        return str(value), False
    value = config.getini(ini)
    return (str(value) if value else None), True


def parity_settings(config: pytest.Config) -> dict[str, Any]:
    """The single-deployment options (``--parity-*`` / ``parity_*`` ini keys); ini paths are relative to
    the rootdir, like pytest's own."""
    out: dict[str, Any] = {}
    for name, ini, _ in _OPTIONS:
        value, from_ini = _setting(config, ini)
        if value is not None and name in _PATH_OPTIONS and from_ini and not Path(value).is_absolute():
            value = str(Path(config.rootpath) / value)
        out[name] = value
    # parity_sglang_args / --parity-sglang-arg: the older names, still read (a user's pyproject.toml may carry them)
    alias = config.getoption("parity_sglang_args")
    out["engine_arg_text"] = list(alias) if alias is not None else list(config.getini("parity_sglang_args"))
    args = config.getoption("parity_engine_args")
    out["engine_arg_text"] += list(args) if args is not None else list(config.getini("parity_engine_args"))
    out["engine"] = out.get("engine") or DEFAULT_ENGINE
    return out


def _single(config: pytest.Config, s: dict[str, Any]) -> Deployment:
    option = "--parity-engine" if config.getoption("parity_engine") is not None else "parity_engine"
    return Deployment(name=contract_name(s["contract"]), contract=s["contract"], target=s["target"],
                      draft=s["draft"], engine=check_engine(s["engine"], where=None, field=option),
                      engine_arg_text=tuple(s["engine_arg_text"]),
                      level=s["level"] or "all", python=s["python"])


def deployments(config: pytest.Config) -> list[Deployment]:
    """The deployments this session checks (module docstring of :mod:`specparity.plugin_deployments`).

    Raises InputError for a malformed declaration (the message names the file and field).
    """
    if DEPLOYMENTS_KEY in config.stash:
        return config.stash[DEPLOYMENTS_KEY]
    s = parity_settings(config)
    if config.getoption("parity_contract") is not None:
        found = [_single(config, s)]
    else:
        pyproject = config.inipath if config.inipath is not None and config.inipath.name == "pyproject.toml" \
            else Path(config.rootpath) / "pyproject.toml"
        where = str(config.inipath or Path(config.rootpath))
        found = from_pyproject(pyproject) + [
            from_ini_line(line, base=Path(config.rootpath), where=where)
            for line in config.getini("parity_deployments") if line.strip()]
        if s["contract"] is not None:
            found.append(_single(config, s))
    config.stash[DEPLOYMENTS_KEY] = unique(found)
    return config.stash[DEPLOYMENTS_KEY]


def _config_item(session: pytest.Session, message: str) -> _ConfigItem:
    return _ConfigItem.from_parent(session, name="configuration", nodeid=f"{PARITY_ROOT}::configuration",
                                   message=message)


def _parity_nodes(session: pytest.Session, config: pytest.Config,
                  items: list[pytest.Item]) -> list[pytest.Item | pytest.Collector]:
    try:
        found = deployments(config)
    except InputError as e:
        return [_config_item(session, str(e))]
    if not found:
        if "parity" in (config.option.markexpr or "") and not any(i.get_closest_marker("parity") for i in items):
            return [_config_item(session, (
                "pytest -m parity needs a contract: pass --parity-contract FILE --parity-target DIR --parity-draft DIR, "
                "set parity_contract, parity_target, parity_draft in [tool.pytest.ini_options], "
                "or declare [tool.specparity.deployments.NAME] tables in pyproject.toml"))]
        return []
    missing = [f"--parity-{k}" for d in found if d.source == "command line"
               for k in ("target", "draft") if getattr(d, k) is None]
    if missing:
        return [_config_item(session, f"--parity-contract is set but {', '.join(missing)} is not")]
    return [ParityDeployment.from_parent(session, name=d.name, nodeid=f"{PARITY_ROOT}::{d.name}", deployment=d)
            for d in found]


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session: pytest.Session) -> None:
    """Take parity node ids given as arguments (``pytest parity::<name>::static``) out of the paths pytest
    resolves (_pytest/main.py:808-809 reads config.args here), so they select items instead of failing as
    a missing file. Runs in each process that collects (xdist workers get the original arguments)."""
    picked = [a for a in session.config.args if a == PARITY_ROOT or a.startswith(f"{PARITY_ROOT}::")]
    if picked:
        session.config.stash[SELECTED_KEY] = picked
        session.config.args[:] = [a for a in session.config.args if a not in picked]


def _selected(nodeid: str, picked: list[str]) -> bool:
    return any(nodeid == p or nodeid.startswith((f"{p}::", f"{p}[")) for p in picked)


@pytest.hookimpl(tryfirst=True)  # before -m/-k deselection (_pytest/mark/__init__.py), which then sees them
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Collect the parity items through ``Session.genitems`` (_pytest/main.py:1050-1064), so that pytest
    reports their collection like any other: "collected N items" counts them, --collect-only lists them."""
    picked = config.stash.get(SELECTED_KEY, [])
    parity: list[pytest.Item] = []
    for node in _parity_nodes(session, config, items):
        parity.extend(session.genitems(node))
    if picked and not any(isinstance(i, _ConfigItem) for i in parity):
        missing = [p for p in picked if not any(_selected(i.nodeid, [p]) for i in parity)]
        if missing:
            raise pytest.UsageError(f"not found: {', '.join(missing)} (parity items here: "
                                    f"{', '.join(sorted({i.nodeid.rsplit('::', 1)[0] for i in parity})) or 'none'})")
        unpicked = [i for i in parity if not _selected(i.nodeid, picked)]
        if unpicked:
            config.hook.pytest_deselected(items=unpicked)
        parity = [i for i in parity if _selected(i.nodeid, picked)]
    items.extend(parity)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: take the verdicts a worker ran, so the reports are written once, here."""
    data = getattr(node, "workeroutput", {}).get("specparity_verdicts")
    if data:
        from specparity.verdict import verdict_from_dict

        verdicts = node.config.stash.setdefault(VERDICTS_KEY, {})
        for name, d in json.loads(data).items():
            verdicts.setdefault(name, verdict_from_dict(d))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Before any engine starts: a report directory that cannot be written is a usage error naming
    ``--parity-report`` (pytest's exit 4), where deployments are configured. xdist workers write no report."""
    config = session.config
    report = parity_settings(config)["report"]
    if report is None or hasattr(config, "workerinput"):
        return
    try:
        if not deployments(config):
            return
    except InputError:
        return  # the configuration item reports it
    from specparity.report.writing import check_report_path

    try:
        check_report_path(report, option="--parity-report", directory=True)
    except InputError as e:
        raise pytest.UsageError(f"specparity: {e}") from None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    verdicts = config.stash.get(VERDICTS_KEY, {})
    worker_output = getattr(config, "workeroutput", None)
    if worker_output is not None:  # an xdist worker hands its verdicts to the controller
        if verdicts:
            worker_output["specparity_verdicts"] = json.dumps({k: v.to_dict() for k, v in verdicts.items()})
        return
    report = parity_settings(config)["report"]
    if report is None or not verdicts:
        return
    from specparity.errors import SpecparityError
    from specparity.report import write_reports

    try:
        several = len(deployments(config)) > 1
    except InputError:
        return
    paths: list[Path] = []
    failed: list[str] = []
    for name, verdict in verdicts.items():  # one deployment: DIR/report.*; several: DIR/<name>/report.*
        try:
            paths += write_reports(verdict, Path(report) / name if several else Path(report))
        except (SpecparityError, OSError) as e:  # never a raw traceback at session end
            failed.append(f"specparity: report of {name} not written: {e}")
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        if paths:
            tr.write_line(f"specparity: report written to {', '.join(str(p) for p in paths)}")
        for line in failed:
            tr.write_line(line, red=True, bold=True)
    elif failed:
        print("\n".join(failed), file=sys.stderr)
    if failed and session.exitstatus == pytest.ExitCode.OK:
        # the checks passed but their report is missing: not a green run (pytest's 3, as the CLI's exit 3)
        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR


# --- fixtures ----------------------------------------------------------------------------------------


def _only_deployment(config: pytest.Config, fixture: str) -> Deployment:
    try:
        found = deployments(config)
    except InputError as e:
        pytest.fail(f"specparity: {e}", pytrace=False)
    if len(found) != 1:
        pytest.fail(f"{fixture} needs exactly one deployment (--parity-contract FILE --parity-target DIR "
                    f"--parity-draft DIR); {len(found)} are configured"
                    + (f": {', '.join(d.name for d in found)}; use parity_verdicts" if found else ""), pytrace=False)
    return found[0]


@pytest.fixture(scope="session")
def parity_contract(pytestconfig: pytest.Config) -> Any:
    """The configured contract (``--parity-contract``, or the one deployment's), validated."""
    from specparity.contract import load_contract

    return load_contract(_only_deployment(pytestconfig, "parity_contract").contract)


@pytest.fixture(scope="session")
def parity_verdict(request: pytest.FixtureRequest) -> Verdict:
    """The gate's verdict for the configured deployment (one run per session, shared with the parity items)."""
    deployment = _only_deployment(request.config, "parity_verdict")
    try:
        return _verdict(request.session, deployment)
    except GateSetupError as e:
        pytest.fail(f"specparity: {e}", pytrace=False)


@pytest.fixture(scope="session")
def parity_verdicts(request: pytest.FixtureRequest) -> dict[str, Verdict]:
    """Every configured deployment's verdict, by deployment name (one gate run each per session)."""
    try:
        return {d.name: _verdict(request.session, d) for d in deployments(request.config)}
    except (GateSetupError, InputError) as e:
        pytest.fail(f"specparity: {e}", pytrace=False)


def _resolve(target: str | os.PathLike[str], draft: str | os.PathLike[str], **server_args: object) -> Any:
    from specparity.serving.cache import SESSION_CACHE

    return SESSION_CACHE.resolve(Path(target), Path(draft), server_args=server_args)


def _capture(target: str | os.PathLike[str], draft: str | os.PathLike[str], probes: Sequence[Sequence[int]],
             **server_args: object) -> Any:
    from specparity.serving.cache import SESSION_CACHE

    return SESSION_CACHE.capture(Path(target), Path(draft), probes=probes, server_args=server_args)


@pytest.fixture(scope="session")
def parity_resolve() -> Callable[..., Any]:
    """``parity_resolve(target, draft, **server_args)`` -> ResolvedDeployment | ServingFailure (session-cached;
    the session cache serves SGLang, serving/cache.py)."""
    return _resolve


@pytest.fixture(scope="session")
def parity_capture() -> Callable[..., Any]:
    """``parity_capture(target, draft, probes, **server_args)`` -> CaptureResult with fc input and atlas (cached;
    the session cache serves SGLang, serving/cache.py)."""
    return _capture


# the older names of parity_resolve and parity_capture, kept as aliases: users' own conftests and tests may ask for them
@pytest.fixture(scope="session")
def sglang_resolve() -> Callable[..., Any]:
    """The older name of :func:`parity_resolve`, the same factory."""
    return _resolve


@pytest.fixture(scope="session")
def sglang_capture() -> Callable[..., Any]:
    """The older name of :func:`parity_capture`, the same factory."""
    return _capture
