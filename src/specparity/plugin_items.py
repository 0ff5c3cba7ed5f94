"""The items of the pytest plugin (:mod:`specparity.plugin`) and the one gate run they share.

A :class:`ParityDeployment` collects one deployment's :class:`ParityItem` s (``static``,
``capture[probe-<i>]``, ``outcome``); each item reads the deployment's verdict from :func:`_verdict`,
which runs the gate once per session (under pytest-xdist, once per run) and keeps it under
:data:`VERDICTS_KEY`. :class:`_ConfigItem` fails with a usage message when the gate is not configured.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from specparity.plugin_deployments import DEFAULT_ENGINE, Deployment
from specparity.verdict import Verdict

VERDICTS_KEY = pytest.StashKey[dict[str, Verdict]]()


class ParityItem(pytest.Item):
    """One gate check of one deployment, reported as a pytest test."""

    def __init__(self, *, check: str, probe: int | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.check = check
        self.probe = probe
        self.add_marker(pytest.mark.parity)

    @property
    def deployment(self) -> Deployment:
        assert isinstance(self.parent, ParityDeployment)
        return self.parent.deployment

    def runtest(self) -> None:
        verdict = _verdict(self.session, self.deployment)
        self.user_properties.append(("deployment", self.deployment.name))
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


class ParityDeployment(pytest.Collector):
    """The items of one deployment: ``static``, ``capture[probe-<i>]`` per probe sample, ``outcome``."""

    def __init__(self, *, deployment: Deployment, **kw: Any) -> None:
        super().__init__(**kw)
        self.deployment = deployment

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        level = self.deployment.level
        items: list[pytest.Item | pytest.Collector] = [ParityItem.from_parent(self, name="static", check="static")]
        if level in ("capture", "outcome", "all"):
            items += [ParityItem.from_parent(self, name=f"capture[probe-{i}]", check="capture", probe=i)
                      for i in range(self.deployment.num_probes)]
        if level in ("outcome", "all"):
            items.append(ParityItem.from_parent(self, name="outcome", check="outcome"))
        return items

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


def _run_gate(deployment: Deployment) -> Verdict:
    import inspect

    from specparity.engine_args import parse_engine_args
    from specparity.errors import SpecparityError
    from specparity.gate import run_gate

    kwargs: dict[str, Any] = {}
    if deployment.engine != DEFAULT_ENGINE:
        if "engine" not in inspect.signature(run_gate).parameters:
            raise GateSetupError(f"deployment {deployment.name!r}: engine {deployment.engine!r} is not supported "
                                 f"by this specparity (only {DEFAULT_ENGINE!r})")
        kwargs["engine"] = deployment.engine
    try:
        if deployment.launch is not None:  # the deploy command as written, parsed by its engine (docs/launch.md)
            from specparity.deploy_command import read_launch
            from specparity.serving.command.parse import parse_launch

            command = read_launch(deployment.launch, source=f"tool.specparity.deployments.{deployment.name}.launch",
                                  path=deployment.source, cwd=deployment.launch_cwd)
            kwargs["launch"] = parse_launch(command, python=deployment.python)
        if deployment.server is not None:  # a running server (docs/live-server.md); its key from the environment
            import os

            from specparity.serving.live.capture import detect_engine

            key = os.environ.get("SPECPARITY_API_KEY")
            kwargs.update(server=deployment.server, api_key=key)
            if deployment.engine == DEFAULT_ENGINE:  # the server says which engine it is (its /v1/models)
                kwargs["engine"] = detect_engine(deployment.server, api_key=key) or DEFAULT_ENGINE
        return run_gate(
            deployment.contract, deployment.target or None, deployment.draft or None,
            deployed_args=deployment.gate_args(parse_engine_args), level=deployment.level, python=deployment.python,
            **kwargs,
        )
    except SpecparityError as e:
        raise GateSetupError(str(e)) from None


def _verdict(session: pytest.Session, deployment: Deployment) -> Verdict:
    """The one gate run of ``deployment`` in this session. Under pytest-xdist the first worker to need
    it runs it and the others read its result, through a file keyed by this run's id and the
    deployment's settings (never reused by a later run)."""
    config = session.config
    verdicts = config.stash.setdefault(VERDICTS_KEY, {})
    if deployment.name in verdicts:
        return verdicts[deployment.name]
    worker = getattr(config, "workerinput", None)
    if worker is None:
        verdict = _run_gate(deployment)
    else:
        from specparity.verdict import verdict_from_dict

        key = hashlib.sha256(json.dumps([worker.get("testrunuid"), deployment.to_dict()], sort_keys=True,
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
                    verdict = _run_gate(deployment)
                    result.write_text(json.dumps(verdict.to_dict()))
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    verdicts[deployment.name] = verdict
    return verdict
