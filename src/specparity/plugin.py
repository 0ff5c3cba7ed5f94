"""pytest plugin: ``pytest -m parity`` runs the gate with ordinary pytest output.

Thin over :mod:`specparity.gate`. When a contract is configured (``--parity-contract`` or the
``parity_contract`` ini key), the plugin adds generated items, all marked ``parity``:

- ``parity::static``            the deployment as SGLang resolves it (ids, capture list, fc width, spec args)
- ``parity::capture[probe-<i>]`` SGLang's real fc input on probe sample ``i``, chunk by chunk
- ``parity::outcome``           drafter acceptance on recorded vs captured inputs

All items share one gate run per session (under pytest-xdist, one per run: the first worker runs it
and the others read its result). A check that could not run fails; nothing is skipped.

Fixtures: ``parity_contract``, ``parity_verdict`` (the whole gate), ``sglang_resolve`` and
``sglang_capture`` (session-cached factories over the serving adapter, keyed by target, draft and
server args).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from specparity.verdict import Verdict

_OPTIONS: tuple[tuple[str, str, str], ...] = (
    ("contract", "parity_contract", "contract JSON written at training time"),
    ("target", "parity_target", "target model directory as deployed"),
    ("draft", "parity_draft", "draft model directory as deployed"),
    ("report", "parity_report", "directory for report.json / report.html / report.txt"),
    ("level", "parity_level", "static | capture | outcome | all (default all)"),
    ("python", "parity_python", "interpreter whose SGLang serves (default: this one)"),
)
VERDICT_KEY = pytest.StashKey[Verdict]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("specparity", "train/serve parity of EAGLE-3 drafters")
    for name, ini, help_text in _OPTIONS:
        group.addoption(f"--parity-{name}", dest=ini, default=None, help=f"{help_text} (ini: {ini})")
        parser.addini(ini, help_text, default=None)
    group.addoption(
        "--parity-sglang-arg", dest="parity_sglang_args", action="append", default=None, metavar="KEY=VALUE",
        help="SGLang server argument for the deployment, repeatable (ini: parity_sglang_args, one per line)",
    )
    parser.addini("parity_sglang_args", "SGLang server arguments KEY=VALUE, one per line", type="linelist", default=[])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "parity: train/serve parity checks of an EAGLE-3 drafter against its contract "
        "(pytest -m parity --parity-contract FILE --parity-target DIR --parity-draft DIR)",
    )


def _setting(config: pytest.Config, ini: str) -> str | None:
    value = config.getoption(ini)
    if value is None:
        value = config.getini(ini)
    return str(value) if value else None


def _resolve_path(config: pytest.Config, value: str | None, *, from_ini: bool) -> str | None:
    if value is None:
        return None
    p = Path(value)
    if not p.is_absolute() and from_ini:
        p = Path(config.rootpath) / p  # ini paths are relative to the rootdir, like pytest's own
    return str(p)


def parity_settings(config: pytest.Config) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, ini, _ in _OPTIONS:
        from_ini = config.getoption(ini) is None
        value = _setting(config, ini)
        out[name] = _resolve_path(config, value, from_ini=from_ini) if name in ("contract", "target", "draft", "report") else value
    args = config.getoption("parity_sglang_args")
    out["sglang_args"] = list(args) if args is not None else list(config.getini("parity_sglang_args"))
    return out


class ParityItem(pytest.Item):
    """One gate check, reported as a pytest test."""

    def __init__(self, *, check: str, probe: int | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.check = check
        self.probe = probe
        self.add_marker(pytest.mark.parity)

    def runtest(self) -> None:
        verdict = _verdict(self.session)
        self.user_properties.append(("verdict", verdict.status))
        for n, f in enumerate(verdict.findings):
            self.user_properties.append((f"finding.{n}", f"{f.kind.value}: {f.message}"))
        from specparity.gate import check_failures

        problems = check_failures(verdict, self.check, probe=self.probe)
        if problems:
            raise ParityFailure(problems)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ParityFailure):
            return str(excinfo.value)
        if isinstance(excinfo.value, GateSetupError):
            return f"specparity: {excinfo.value}"
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[str, int | None, str]:
        return "specparity", None, self.name


class ParityFailure(Exception):
    pass


class GateSetupError(Exception):
    pass


class _ConfigItem(pytest.Item):
    """Fails with a usage message when ``-m parity`` is asked for but the gate is not configured."""

    def __init__(self, *, message: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.message = message
        self.add_marker(pytest.mark.parity)

    def runtest(self) -> None:
        raise GateSetupError(self.message)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        return f"specparity: {excinfo.value}"

    def reportinfo(self) -> tuple[str, int | None, str]:
        return "specparity", None, self.name


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    s = parity_settings(config)
    if s["contract"] is None:
        if "parity" in (config.option.markexpr or "") and not any(i.get_closest_marker("parity") for i in items):
            items.append(_ConfigItem.from_parent(session, name="configuration", nodeid="parity::configuration", message=(
                "pytest -m parity needs a contract: pass --parity-contract FILE --parity-target DIR --parity-draft DIR "
                "or set parity_contract, parity_target, parity_draft in [tool.pytest.ini_options]")))
        return
    missing = [f"--parity-{k}" for k in ("target", "draft") if s[k] is None]
    if missing:
        items.append(_ConfigItem.from_parent(session, name="configuration", nodeid="parity::configuration",
                                             message=f"--parity-contract is set but {', '.join(missing)} is not"))
        return
    num_probes = _num_probes(s["contract"])
    level = s["level"] or "all"
    new: list[pytest.Item] = [_item(session, "static", check="static")]
    if level in ("capture", "outcome", "all"):
        new += [_item(session, f"capture[probe-{i}]", check="capture", probe=i) for i in range(num_probes)]
    if level in ("outcome", "all"):
        new.append(_item(session, "outcome", check="outcome"))
    items.extend(new)


def _item(session: pytest.Session, name: str, *, check: str, probe: int | None = None) -> ParityItem:
    return ParityItem.from_parent(session, name=name, nodeid=f"parity::{name}", check=check, probe=probe)


def _num_probes(contract_path: str) -> int:
    try:
        data = json.loads(Path(contract_path).read_text(encoding="utf-8"))
        return max(1, int(data["probes"]["num_samples"]))
    except (OSError, ValueError, KeyError, TypeError):
        return 1  # the gate run reports the real problem with the file


def _run_gate(config: pytest.Config) -> Verdict:
    from specparity.errors import SpecparityError
    from specparity.gate import parse_sglang_args, run_gate

    s = parity_settings(config)
    try:
        return run_gate(
            s["contract"], s["target"], s["draft"], sglang_args=parse_sglang_args(s["sglang_args"]),
            level=s["level"] or "all", python=s["python"],
        )
    except SpecparityError as e:
        raise GateSetupError(str(e)) from None


def _verdict(session: pytest.Session) -> Verdict:
    """The session's one gate run. Under pytest-xdist the first worker runs it and the others read its
    result, through a file keyed by this run's id and the settings (never reused by a later run)."""
    config = session.config
    if VERDICT_KEY in config.stash:
        return config.stash[VERDICT_KEY]
    worker = getattr(config, "workerinput", None)
    if worker is None:
        verdict = _run_gate(config)
    else:
        from specparity.verdict import verdict_from_dict

        key = hashlib.sha256(json.dumps([worker.get("testrunuid"), parity_settings(config)], sort_keys=True,
                                        default=str).encode()).hexdigest()[:16]
        # every worker's basetemp is <run basetemp>/popen-gw<N>; their parent is shared
        shared = Path(config._tmp_path_factory.getbasetemp()).parent  # type: ignore[attr-defined]
        result = shared / f"specparity-verdict-{key}.json"
        with open(shared / f"specparity-verdict-{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if result.is_file():
                    verdict = verdict_from_dict(json.loads(result.read_text()))
                else:
                    verdict = _run_gate(config)
                    result.write_text(json.dumps(verdict.to_dict()))
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    config.stash[VERDICT_KEY] = verdict
    return verdict


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: take the verdict a worker ran, so the report is written once, here."""
    data = getattr(node, "workeroutput", {}).get("specparity_verdict")
    if data and VERDICT_KEY not in node.config.stash:
        from specparity.verdict import verdict_from_dict

        node.config.stash[VERDICT_KEY] = verdict_from_dict(json.loads(data))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    verdict = config.stash.get(VERDICT_KEY, None)
    worker_output = getattr(config, "workeroutput", None)
    if worker_output is not None:  # an xdist worker hands its verdict to the controller
        if verdict is not None:
            worker_output["specparity_verdict"] = json.dumps(verdict.to_dict())
        return
    s = parity_settings(config)
    if s["report"] is None or verdict is None:
        return
    from specparity.report import write_reports

    paths = write_reports(verdict, Path(s["report"]))
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line(f"specparity: report written to {', '.join(str(p) for p in paths)}")


# --- fixtures ----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def parity_contract(pytestconfig: pytest.Config) -> Any:
    """The configured contract (``--parity-contract``), validated."""
    from specparity.contract import load_contract

    path = parity_settings(pytestconfig)["contract"]
    if path is None:
        pytest.fail("parity_contract needs --parity-contract FILE (or the parity_contract ini key)", pytrace=False)
    return load_contract(path)


@pytest.fixture(scope="session")
def parity_verdict(request: pytest.FixtureRequest) -> Verdict:
    """The gate's verdict for the configured contract and deployment (one run per session)."""
    if parity_settings(request.config)["contract"] is None:
        pytest.fail("parity_verdict needs --parity-contract, --parity-target and --parity-draft", pytrace=False)
    try:
        return _verdict(request.session)
    except GateSetupError as e:
        pytest.fail(f"specparity: {e}", pytrace=False)


@pytest.fixture(scope="session")
def sglang_resolve() -> Callable[..., Any]:
    """``sglang_resolve(target, draft, **server_args)`` -> ResolvedDeployment | ServingFailure (session-cached)."""
    from specparity.serving.cache import SESSION_CACHE

    def resolve(target: str | os.PathLike[str], draft: str | os.PathLike[str], **server_args: object) -> Any:
        return SESSION_CACHE.resolve(Path(target), Path(draft), server_args=server_args)

    return resolve


@pytest.fixture(scope="session")
def sglang_capture() -> Callable[..., Any]:
    """``sglang_capture(target, draft, probes, **server_args)`` -> CaptureResult with fc input and atlas (cached)."""
    from specparity.serving.cache import SESSION_CACHE

    def capture(target: str | os.PathLike[str], draft: str | os.PathLike[str], probes: Sequence[Sequence[int]],
                **server_args: object) -> Any:
        return SESSION_CACHE.capture(Path(target), Path(draft), probes=probes, server_args=server_args)

    return capture
