"""The deployments a pytest session checks: one group of parity items and one gate run each.

A deployment is a contract plus what serves it: target and draft directories, the engine, its
arguments, the level and the interpreter. They come from (first match wins):

1. the command line: ``--parity-contract`` (with ``--parity-target``, ``--parity-draft``, ...), one
   deployment named after its contract;
2. ``[tool.specparity.deployments.<name>]`` tables in pyproject.toml (a ``launch = "..."`` key gives the deploy
   command as written, in place of ``target``/``draft``/``engine_args``: docs/launch.md), and ``parity_deployments`` ini
   lines (``<name> contract=PATH target=PATH draft=PATH [engine=NAME] [level=L] [python=PATH]
   [engine_arg=KEY=VALUE ...]``), plus the ``parity_contract`` ini key as one more deployment.

Relative paths are relative to the file that names them (pyproject.toml, or the ini file's rootdir).
This module reads only TOML and JSON: collection never imports torch or an engine.

Engine arguments keep the types they were written with: a TOML ``engine_args`` table reaches the engine
as it was written (``3`` an int, ``"3"`` a string, ``true`` a bool, an array a list, a table a dict), never
through text. Only text (command-line options, ini lines, a TOML list of ``"KEY=VALUE"`` strings) is typed,
once, by :func:`specparity.engine_args.parse_engine_args` when the gate runs.
"""

from __future__ import annotations

import datetime
import json
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specparity.errors import InputError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - pytest itself depends on tomli before 3.11
    import tomli as tomllib

DEFAULT_ENGINE = "sglang"
LEVELS = ("static", "capture", "outcome", "all")
FIELDS = ("contract", "target", "draft", "engine", "engine_args", "level", "python", "launch", "server")
TABLE = "tool.specparity.deployments"
_BAD_NAME_CHARS = ("::", "[", "]", "/", " ", "\t")


@dataclass(frozen=True)
class Deployment:
    """One deployment to check.

    ``engine_args`` are ``(key, value)`` pairs with the values as written in TOML (passed on unchanged);
    ``engine_arg_text`` are ``KEY=VALUE`` strings the user typed as text, typed once when the gate runs
    (:func:`specparity.engine_args.parse_engine_args`). A pair overrides a text argument of the same key.
    """

    name: str
    contract: str
    target: str | None
    draft: str | None
    engine: str = DEFAULT_ENGINE
    engine_args: tuple[tuple[str, Any], ...] = ()
    level: str = "all"
    python: str | None = None
    source: str = "command line"  # where it was declared, for error messages
    engine_arg_text: tuple[str, ...] = ()
    # the deploy command as written (a ``launch`` key; docs/launch.md), read by its engine's own parser when the gate
    # runs; its relative paths mean ``launch_cwd`` (the pyproject file's directory). Target, draft and engine then
    # come from the command.
    launch: str | None = None
    launch_cwd: str | None = None
    # a running server to check (a ``server`` key: its URL; docs/live-server.md): it reports what it serves, so target,
    # draft and engine are optional; its API key is read from SPECPARITY_API_KEY when the gate runs, never from a file
    server: str | None = None

    def __hash__(self) -> int:  # the values may be lists or dicts: hash what identifies the run
        return hash(json.dumps(self.to_dict(), sort_keys=True, default=repr))

    def to_dict(self) -> dict[str, Any]:
        """The settings that identify a gate run (what a shared xdist verdict is keyed by)."""
        return {"name": self.name, "contract": self.contract, "target": self.target, "draft": self.draft,
                "engine": self.engine, "engine_args": [list(p) for p in self.engine_args],
                "engine_arg_text": list(self.engine_arg_text), "level": self.level, "python": self.python,
                "launch": self.launch, "launch_cwd": self.launch_cwd, "server": self.server}

    def gate_args(self, parse: Callable[[Sequence[str]], dict[str, object]]) -> dict[str, object]:
        """The engine arguments for the gate: the text typed once by ``parse``, the TOML values as written."""
        return {**parse(self.engine_arg_text), **dict(self.engine_args)}

    @property
    def num_probes(self) -> int:
        """Probe samples in the contract (1 when unreadable: the gate run then names the problem)."""
        data = _contract_json(self.contract)
        try:
            return max(1, int(data["probes"]["num_samples"]))
        except (KeyError, TypeError, ValueError):
            return 1


def _contract_json(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def node_name(text: str) -> str:
    """``text`` made safe for a pytest node id segment (no ``::``, brackets, slashes or spaces)."""
    out = text
    for bad in _BAD_NAME_CHARS:
        out = out.replace(bad, "-")
    return out or "deployment"


def contract_name(path: str) -> str:
    """The contract's ``name`` field, else the file's stem (read as JSON only, never validated here)."""
    name = _contract_json(path).get("name")
    return node_name(name) if isinstance(name, str) and name else node_name(Path(path).stem)


def _path(value: object, base: Path, *, where: str, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise InputError(f"expected a path (a non-empty string), got {value!r}", path=where, field=field)
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else base / p)


def _check_level(level: object, *, where: str, field: str) -> str:
    if level not in LEVELS:
        raise InputError(f"unknown level {level!r}; choose one of {', '.join(LEVELS)}", path=where, field=field)
    return str(level)


def check_engine(engine: object, *, where: str | None, field: str) -> str:
    """``engine`` when it names an engine specparity serves (``sglang``, ``vllm``): an unknown one is refused where
    it was written, at collection, never as ``--engine`` when the gate runs."""
    from typing import get_args

    from specparity.deploy_command import Engine

    names = get_args(Engine)
    if not isinstance(engine, str) or engine not in names:
        raise InputError(f"unknown engine {engine!r}; choose one of {', '.join(names)}", path=where, field=field)
    return engine


def _check_value(value: object, *, where: str, field: str) -> object:
    """``value`` unchanged; a TOML date or time (no JSON value, so the engine's child cannot receive it) is refused."""
    if isinstance(value, (datetime.date, datetime.time)):
        raise InputError(f"expected a string, number, boolean, array or table, got {value!r}", path=where,
                         field=field)
    if isinstance(value, Mapping):
        for k, v in value.items():
            _check_value(v, where=where, field=f"{field}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_value(v, where=where, field=f"{field}[{i}]")
    return value


def _key(key: object, *, where: str, field: str) -> str:
    """``--speculative-num-steps`` -> ``speculative_num_steps``, the spelling text arguments get (engine_args.parse_engine_args)."""
    out = str(key).strip().lstrip("-").replace("-", "_")
    if not out.isidentifier():
        raise InputError(f"expected an argument name, got {key!r}", path=where, field=f"{field}.{key}")
    return out


def _engine_args(value: object, *, where: str, field: str) -> tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]:
    """(typed pairs, text arguments): a table's values as written; a list's ``KEY=VALUE`` strings as text."""
    if isinstance(value, Mapping):
        return tuple((_key(k, where=where, field=field), _check_value(v, where=where, field=f"{field}.{k}"))
                     for k, v in value.items()), ()
    if isinstance(value, list) and all(isinstance(v, str) and "=" in v for v in value):
        return (), tuple(value)
    raise InputError("expected a table of engine arguments or a list of 'KEY=VALUE' strings, "
                     f"got {value!r}", path=where, field=field)


def _check_name(name: str, *, where: str, field: str) -> str:
    if not name or any(bad in name for bad in _BAD_NAME_CHARS):
        raise InputError(f"deployment name {name!r} must be non-empty without '::', brackets, slashes or spaces",
                         path=where, field=field)
    return name


def from_table(name: str, table: object, *, base: Path, where: str) -> Deployment:
    """One ``[tool.specparity.deployments.<name>]`` table."""
    prefix = f"{TABLE}.{name}"
    _check_name(name, where=where, field=prefix)
    if not isinstance(table, Mapping):
        raise InputError(f"expected a table, got {table!r}", path=where, field=prefix)
    unknown = sorted(set(table) - set(FIELDS))
    if unknown:
        raise InputError(f"unknown key {unknown[0]!r}; known keys: {', '.join(FIELDS)}", path=where,
                         field=f"{prefix}.{unknown[0]}")
    launch, server = table.get("launch"), table.get("server")
    if launch is not None and server is not None:
        raise InputError("give the deploy command (launch) or a running server (server), not both", path=where,
                         field=f"{prefix}.server")
    if server is not None and (not isinstance(server, str) or not server.startswith(("http://", "https://"))):
        raise InputError(f"expected the server's URL (http://HOST:PORT), got {server!r}", path=where,
                         field=f"{prefix}.server")
    for required in ("contract",) if launch is not None or server is not None else ("contract", "target", "draft"):
        if required not in table:
            raise InputError(f"missing key {required!r}" + ("" if required == "contract" else " (or a launch key "
                             "with the deploy command, or a server key)"), path=where, field=f"{prefix}.{required}")
    engine = check_engine(table.get("engine", DEFAULT_ENGINE), where=where, field=f"{prefix}.engine")
    if launch is not None:
        engine = _launch_engine(launch, table.get("engine"), base=base, where=where, field=f"{prefix}.launch")
    python = table.get("python")
    typed, text = _engine_args(table.get("engine_args", {}), where=where, field=f"{prefix}.engine_args")
    return Deployment(
        name=name,
        contract=_path(table["contract"], base, where=where, field=f"{prefix}.contract"),
        target=_path(table["target"], base, where=where, field=f"{prefix}.target") if "target" in table else None,
        draft=_path(table["draft"], base, where=where, field=f"{prefix}.draft") if "draft" in table else None,
        engine=engine,
        engine_args=typed,
        engine_arg_text=text,
        level=_check_level(table.get("level", "all"), where=where, field=f"{prefix}.level"),
        python=None if python is None else _path(python, base, where=where, field=f"{prefix}.python"),
        source=where,
        launch=None if launch is None else str(launch),
        launch_cwd=None if launch is None else str(base),
        server=None if server is None else str(server),
    )


def _launch_engine(launch: object, engine: object, *, base: Path, where: str, field: str) -> str:
    """The engine a ``launch`` key's command starts, read by the shell layer alone (no engine is imported at
    collection); an ``engine`` key given as well must agree."""
    from specparity.deploy_command import read_launch

    if not isinstance(launch, str) or not launch.strip():
        raise InputError(f"expected the deploy command as a string, got {launch!r}", path=where, field=field)
    command = read_launch(launch, source=field, path=where, cwd=base)
    if engine is not None and engine != command.engine:
        raise InputError(f"engine = {engine!r} but the launch command starts {command.engine}", path=where,
                         field=field.rsplit(".", 1)[0] + ".engine")
    return command.engine


def from_pyproject(path: Path) -> list[Deployment]:
    """Every ``[tool.specparity.deployments.<name>]`` table in ``path`` (none when the file is absent)."""
    if not path.is_file():
        return []
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise InputError(f"cannot read TOML: {e}", path=path) from None
    tables = data.get("tool", {}).get("specparity", {}).get("deployments", {})
    if not isinstance(tables, Mapping):
        raise InputError(f"expected tables [{TABLE}.<name>], got {tables!r}", path=path, field=TABLE)
    return [from_table(str(name), table, base=path.parent, where=str(path)) for name, table in tables.items()]


def from_ini_line(line: str, *, base: Path, where: str) -> Deployment:
    """One ``parity_deployments`` line: ``<name> contract=PATH target=PATH draft=PATH [KEY=VALUE ...]``."""
    field = f"parity_deployments: {line.strip()}"
    try:
        name, *pairs = shlex.split(line)
    except ValueError as e:
        raise InputError(f"cannot split the line: {e}", path=where, field=field) from None
    table: dict[str, Any] = {}
    args: list[str] = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise InputError(f"expected KEY=VALUE, got {pair!r}", path=where, field=field)
        if key == "engine_arg":
            args.append(value)
        else:
            table[key] = value
    if args:
        table["engine_args"] = args
    return from_table(name, table, base=base, where=where)


def unique(deployments: Sequence[Deployment]) -> list[Deployment]:
    """``deployments``, raising InputError when two share a name (their items would share node ids)."""
    seen: dict[str, Deployment] = {}
    for d in deployments:
        if d.name in seen:
            raise InputError(f"deployment {d.name!r} is declared twice (also in {seen[d.name].source})",
                             path=d.source, field=d.name)
        seen[d.name] = d
    return list(deployments)
