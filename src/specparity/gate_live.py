"""The gate's side of a deploy command (``specparity gate --launch``, a pyproject ``launch`` key) and of a running
server (``--server URL``): the deployment the command's engine parsed (:class:`~specparity.serving.command.parse.LaunchSpec`),
or the one the server reports (:func:`attach`), becomes the gate's target, draft, engine and engine arguments, and what
the command itself gets wrong becomes findings.

:func:`resolve_launched` (the static level) and :func:`capture_launched` (the capture, outcome and ``all``
levels) are the seams: the static level runs the engine's child (:meth:`Engine.resolve`) with the arguments the
command set, as ``--engine-arg`` would, and the command's own environment (its ``export`` lines and ``VAR=value``
prefixes) over this one (:func:`launch_env`); the capture levels start the user's own server from
``launch.command`` (``serving/live/capture.py``), and nothing else in the gate changes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specparity.compare.findings import Finding
from specparity.compare.reduced import Reduction
from specparity.contract import Contract
from specparity.errors import EnvironmentProblem, InputError
from specparity.serving.command.findings import command_findings
from specparity.serving.command.parse import LaunchSpec
from specparity.serving.engine import Engine
from specparity.serving.live.capture import StartedServer
from specparity.serving.results import (
    CaptureResult,
    OutcomeRequest,
    Progress,
    ResolvedDeployment,
    ServingFailure,
)


def _same_dir(a: str | Path, b: str | Path) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return str(a) == str(b)


def apply_launch(launch: LaunchSpec, *, target: str | Path | None, draft: str | Path | None, engine: str | None,
                 engine_args: Mapping[str, object] | None,
                 fields: tuple[str, str, str] = ("--target", "--draft", "--engine"),
                 ) -> tuple[str, str, str, dict[str, object]]:
    """``(target, draft, engine, engine arguments)`` of the deployment the command parses to.

    ``target``/``draft``/``engine`` given as well must agree with the command (exit 2 naming ``fields``
    otherwise); ``engine_args`` given as well override the command's, key by key (``--engine-arg``)."""
    where = {"path": launch.command.path}
    if engine is not None and engine != launch.engine:
        raise InputError(f"{fields[2]} {engine} but the launch command starts {launch.engine} "
                         f"({' '.join(launch.command.program)})", field=fields[2], **where)
    if target is not None and not _same_dir(target, launch.target):
        raise InputError(f"{fields[0]} {target} but the launch command serves {launch.target} (from "
                         f"{launch.target_flag}): give one, or the same", field=fields[0], **where)
    if draft is not None and launch.draft is not None and not _same_dir(draft, launch.draft):
        raise InputError(f"{fields[1]} {draft} but the launch command's draft is {launch.draft} (from "
                         f"{launch.draft_flag}): give one, or the same", field=fields[1], **where)
    chosen_draft = draft if draft is not None else launch.draft
    if chosen_draft is None:
        raise InputError(f"the launch command names no draft model ({launch.engine}'s parse found none): give "
                         f"{fields[1]}", field=fields[1], **where)
    return str(launch.target), str(chosen_draft), launch.engine, {**launch.engine_args, **(engine_args or {})}


def launch_findings(launch: LaunchSpec | None, contract: Contract, draft_config: Mapping[str, Any]) -> list[Finding]:
    """The command's own findings (serving/command/findings.py), with the contract's recorded target name."""
    if launch is None:
        return []
    return command_findings(launch, draft_config=draft_config, contract_target=contract.target.name_or_path)


@contextlib.contextmanager
def launch_env(launch: LaunchSpec | None) -> Iterator[None]:
    """The command's own environment over this process's while the engine's children start (they inherit it), then
    this process's again."""
    env = dict(launch.command.env) if launch is not None else {}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def resolve_launched(engine: Engine, launch: LaunchSpec, target: str | Path, draft: str | Path, *,
                     args: Mapping[str, object], device: str, timeout_s: float,
                     python: str | None) -> ResolvedDeployment | ServingFailure:
    """The static level of the deployment ``launch`` describes (module docstring)."""
    with launch_env(launch):
        return engine.resolve(target, draft, args=args, device=device, timeout_s=timeout_s, python=python)


def capture_launched(engine: Engine, launch: LaunchSpec, *, probes: Sequence[Sequence[int]], timeout_s: float,
                     python: str | None, progress: Progress | None, outcome: OutcomeRequest | None,
                     allow_dev_endpoints: bool = False, started: StartedServer | None = None,
                     reduction: Reduction | None = None, node_evidence: Sequence[Path] = ()) -> CaptureResult:
    """The capture (and the outcome's evidence) from the user's own server: the command launched as given, plus the
    engine's hook switches and a free port, then stopped (serving/live/capture.py)."""
    from specparity.serving.live.capture import capture_launched as launched

    return launched(engine, launch, probes=probes, outcome=outcome, python=python, timeout_s=timeout_s,
                    progress=progress, allow_dev_endpoints=allow_dev_endpoints, started=started, reduction=reduction,
                    node_evidence=node_evidence)


@dataclass(frozen=True)
class Attached:
    """A running server as the gate found it: what it reports it serves (or why that could not be read), and the
    target and draft directories the gate reads beside it (the server's own paths, or the user's copies)."""

    url: str
    deployment: ResolvedDeployment | ServingFailure
    target: str
    draft: str
    local: bool  # the server's own files are readable here (the gate runs on the server's host)
    live: dict[str, Any] = field(default_factory=dict)


def attach(engine: Engine, url: str, *, api_key: str | None, target: str | Path | None, draft: str | Path | None,
           python: str | None, timeout_s: float, allow_dev_endpoints: bool = False) -> Attached:
    """The static level of ``url`` (``Engine.live_resolve``: what the server itself reports), and where its files are.

    A server that cannot be read is :class:`EnvironmentProblem` (exit 3: nothing says what it serves); one whose draft
    is neither readable here nor given (``--draft``) is :class:`InputError` (exit 2); so is a URL that is not loopback
    whose server has dev-mode endpoints on (vLLM's ``VLLM_SERVER_DEV_MODE=1``), without ``allow_dev_endpoints``: the
    gate does not drive those endpoints across a network unless told to, as it never turns them on there
    (serving/live/capture.py ``start_server``)."""
    from urllib.parse import urlsplit

    from specparity.serving.live.capture import LiveRun
    from specparity.serving.live.server import ServerClient, is_loopback

    with ServerClient(url, api_key=api_key, timeout_s=timeout_s) as client:
        if not client.healthy(engine.health_path):
            raise EnvironmentProblem(f"{url}{engine.health_path} does not answer: no {engine.label} server to check "
                                     "there")
        host = urlsplit(url).hostname or ""
        if not allow_dev_endpoints and not is_loopback(host):
            exposed = engine.dev_endpoints(client)
            if exposed is not None:
                raise InputError(f"{url} is not loopback and its {engine.label} server runs with dev-mode endpoints "
                                 f"({exposed}); the gate drives them only on loopback unless you pass "
                                 "--allow-dev-endpoints", field="--server")
        dep = engine.live_resolve(client, python=python, timeout_s=timeout_s)
    live = LiveRun("attached", url.rstrip("/")).to_dict()
    if isinstance(dep, ServingFailure) and (target is None or draft is None):
        raise EnvironmentProblem(f"{url}: {dep}")
    named = (dep.target_path, dep.draft_path) if isinstance(dep, ResolvedDeployment) else ("", "")
    local = all((Path(p) / "config.json").is_file() for p in named)
    chosen_target = str(target) if target is not None else named[0]
    chosen_draft = str(draft) if draft is not None else named[1]
    if not (Path(chosen_draft) / "config.json").is_file():
        raise InputError(f"the server serves the draft {named[1]}, which is not readable on this host: run the gate "
                         "on the server's host, or give --draft with a copy of it", field="--draft")
    if not (Path(chosen_target) / "config.json").is_file():
        raise InputError(f"the server serves the target {named[0]}, which is not readable on this host: run the "
                         "gate on the server's host, or give --target with a copy of its config and tokenizer",
                         field="--target")
    return Attached(url.rstrip("/"), dep, chosen_target, chosen_draft, local, live)

