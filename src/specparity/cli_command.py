"""The deploy command on the command line: ``--launch -- COMMAND``, ``--launch-file FILE`` (``specparity gate`` and
``specparity explain``), and ``explain``'s findings from the command (docs/launch.md).

``--launch`` is a flag; the command follows ``--`` as it would be typed, the shell that runs specparity having
already split it into words (a single word holding spaces is read as the command's text). ``--launch-file`` reads a
shell script. Either goes through :func:`specparity.deploy_command.read_launch` (the shell layer), then the engine's
own parser (:func:`specparity.serving.command.parse.parse_launch`); ``--target``, ``--draft`` and ``--engine`` then
become optional, and given as well must agree with the command.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from specparity.deploy_command import LaunchCommand, read_launch
from specparity.errors import EXIT_PARITY_FAILURE, EXIT_PASS, InputError
from specparity.serving.command.parse import LaunchSpec
from specparity.serving.live.capture import StartedServer

F = TypeVar("F", bound=Callable[..., Any])


def launch_options(f: F) -> F:
    """``--launch`` (the command after ``--``), ``--launch-file FILE`` and the trailing command words."""
    f = click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- COMMAND...]")(f)
    f = click.option("--launch-file", "launch_file", type=click.Path(path_type=Path, dir_okay=False), default=None,
                     help="A shell script that starts the server (export lines and the one command); read as "
                          "--launch reads the command.")(f)
    f = click.option("--launch", "launch", is_flag=True, default=False,
                     help="The deploy command follows `--`, as you run it (python -m sglang.launch_server, sglang "
                          "serve, vllm serve, ...): parsed by the engine's own parser; --target, --draft and "
                          "--engine then come from it.")(f)
    return f


def read_command(launch: bool, command: Sequence[str], launch_file: Path | None, *,
                 cwd: Path | None = None) -> LaunchCommand | None:
    """The command given with ``--launch``/``--launch-file``, read by the shell layer; None when neither is given."""
    if command and not launch:
        raise InputError(f"unexpected words {' '.join(command[:3])!r}...: to give the deploy command, write "
                         "--launch -- COMMAND", field="--launch")
    if launch and launch_file is not None:
        raise InputError("give the deploy command once: --launch -- COMMAND or --launch-file FILE", field="--launch")
    if launch:
        if not command:
            raise InputError("--launch needs the command after `--`: --launch -- vllm serve MODEL ...",
                             field="--launch")
        words = list(command)
        text = words[0] if len(words) == 1 and any(c.isspace() for c in words[0]) else shlex.join(words)
        return read_launch(text, source="--launch", cwd=cwd)
    if launch_file is not None:
        try:
            text = launch_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"cannot read the launch file: {e}", path=launch_file, field="--launch-file") from None
        return read_launch(text, source="--launch-file", path=launch_file, cwd=cwd)
    return None


def server_options(f: F) -> F:
    """``--server URL`` (a running server to check), ``--api-key`` and ``--allow-dev-endpoints``."""
    f = click.option("--allow-dev-endpoints", is_flag=True, default=False,
                     help="Let the gate turn on an engine's dev-mode endpoints (vLLM's /collective_rpc) on a launched "
                          "server whose command binds a non-loopback host, or use them on a --server URL that is "
                          "not loopback.")(f)
    f = click.option("--api-key", "api_key", envvar="SPECPARITY_API_KEY", default=None, metavar="KEY",
                     help="The running server's API key (or SPECPARITY_API_KEY); sent as a Bearer header, never "
                          "printed.")(f)
    f = click.option("--server", "server", default=None, metavar="URL",
                     help="A running server to check (started with `specparity launch-flags`' switches for the "
                          "capture level); the deployment is what it reports.")(f)
    return f


def launch_spec(launch: bool, command: Sequence[str], launch_file: Path | None, *, python: str | None,
                timeout_s: float, cmd: LaunchCommand | None = None) -> LaunchSpec | None:
    """The deploy command as its engine parses it (None without ``--launch``/``--launch-file``); ``cmd`` when the
    shell layer has read it already."""
    cmd = cmd or read_command(launch, command, launch_file)
    if cmd is None:
        return None
    from specparity.serving.command.parse import parse_launch

    return parse_launch(cmd, python=python, timeout_s=min(timeout_s, 300))


def start_early(cmd: LaunchCommand | None, *, level: str, python: str | None,
                allow_dev_endpoints: bool) -> StartedServer | None:
    """At the capture levels, the user's server started from the command's words before its engine parses them:
    the engine's parser (seconds of imports) runs while the server starts (serving/live/capture.py ``start_server``).
    None at the static level, or without a command."""
    if cmd is None or level == "static" or cmd.dynamo:  # a Dynamo worker is refused after the parse (serving/live/capture.py)
        return None
    from specparity.serving.command.parse import interpreter_for
    from specparity.serving.engine import get_engine
    from specparity.serving.live.capture import start_server

    return start_server(get_engine(cmd.engine), cmd, python=interpreter_for(cmd, python),
                        allow_dev_endpoints=allow_dev_endpoints)


def engine_given() -> bool:
    """Whether ``--engine`` was typed (not its default)."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    return ctx.get_parameter_source("engine") in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def deployment(spec: LaunchSpec | None, target: Path | None, draft: Path | None,
               engine: str) -> tuple[Path, Path, str, dict[str, object]]:
    """``(target, draft, engine, the command's engine arguments)``: from the command when given, else the options."""
    if spec is None:
        for role, p in (("--target", target), ("--draft", draft)):
            if p is None:
                raise InputError(f"missing {role} (or give the deploy command: --launch -- COMMAND)", field=role)
        assert target is not None and draft is not None
        return target, draft, engine, {}
    from specparity.gate_live import apply_launch

    t, d, eng, args = apply_launch(spec, target=target, draft=draft, engine=engine if engine_given() else None,
                                   engine_args=None)
    return Path(t), Path(d), eng, args


def interpreter(spec: LaunchSpec | None, python: str | None) -> str | None:
    """The interpreter that serves: ``--python``, else the one that parsed the command (None: this one)."""
    if python or spec is None:
        return python
    return spec.python if spec.python and spec.python != sys.executable else None


def explain_findings(spec: LaunchSpec | None, data: Mapping[str, Any], *, engine: str, draft: Path,
                     python: str | None) -> list[Any]:
    """What ``explain`` adds to the engine's answer: the speculative settings the engine rewrites (a warning citing
    the rule in the installed release) and the command's own findings (serving/command/findings.py)."""
    from specparity.serving.command.findings import command_findings, rewrite_findings, rule_for

    out = []
    if data.get("requested_spec") and data.get("resolved_spec"):
        rule = rule_for(spec, engine=engine, python=python)
        out += rewrite_findings({**data, "engine_version": data.get("engine_version")}, engine=engine, rule=rule)
    if spec is not None:
        try:
            cfg = json.loads((draft / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            cfg = None
        out += command_findings(spec, draft_config=cfg if isinstance(cfg, dict) else None)
    return out


def explain_exit(code: int, summary: str, findings: Sequence[Any], data: Mapping[str, Any], *,
                 strict: bool) -> tuple[int, str]:
    """The exit code and summary with the added findings: an error finding makes a resolved deployment exit 1;
    ``--strict`` makes any warning (these, or the engine adapter's own notes) exit 1."""
    if code != EXIT_PASS:
        return code, summary
    errors = [f.kind.value for f in findings if f.severity.value == "error"]
    if errors:
        return EXIT_PARITY_FAILURE, f"{summary}; but the deployment is wrong: {', '.join(errors)}"
    warnings = [f.kind.value for f in findings if f.severity.value == "warning"]
    warnings += [str(n.get("kind")) for n in data.get("adapter_notes") or () if n.get("severity") == "warning"]
    if strict and warnings:
        return EXIT_PARITY_FAILURE, f"{summary}; --strict: warnings {', '.join(warnings)}"
    return code, summary
