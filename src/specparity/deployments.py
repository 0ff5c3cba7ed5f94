"""The deployments a pytest session checks: one group of parity items and one gate run each.

A deployment is a contract plus what serves it: target and draft directories, the engine, its
arguments, the level and the interpreter. They come from (first match wins):

1. the command line: ``--parity-contract`` (with ``--parity-target``, ``--parity-draft``, ...), one
   deployment named after its contract;
2. ``[tool.specparity.deployments.<name>]`` tables in pyproject.toml, and ``parity_deployments`` ini
   lines (``<name> contract=PATH target=PATH draft=PATH [engine=NAME] [level=L] [python=PATH]
   [engine_arg=KEY=VALUE ...]``), plus the ``parity_contract`` ini key as one more deployment.

Relative paths are relative to the file that names them (pyproject.toml, or the ini file's rootdir).
This module reads only TOML and JSON: collection never imports torch or an engine.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping, Sequence
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
FIELDS = ("contract", "target", "draft", "engine", "engine_args", "level", "python")
TABLE = "tool.specparity.deployments"
_BAD_NAME_CHARS = ("::", "[", "]", "/", " ", "\t")


@dataclass(frozen=True)
class Deployment:
    """One deployment to check: ``engine_args`` are ``KEY=VALUE`` strings, typed when the gate runs."""

    name: str
    contract: str
    target: str | None
    draft: str | None
    engine: str = DEFAULT_ENGINE
    engine_args: tuple[str, ...] = ()
    level: str = "all"
    python: str | None = None
    source: str = "command line"  # where it was declared, for error messages

    def to_dict(self) -> dict[str, Any]:
        """The settings that identify a gate run (what a shared xdist verdict is keyed by)."""
        return {"name": self.name, "contract": self.contract, "target": self.target, "draft": self.draft,
                "engine": self.engine, "engine_args": list(self.engine_args), "level": self.level,
                "python": self.python}

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


def _arg_text(key: str, value: object) -> str:
    if isinstance(value, bool):
        return f"{key}={'true' if value else 'false'}"
    if isinstance(value, (int, float, str)):
        return f"{key}={value}"
    return f"{key}={json.dumps(value)}"


def _engine_args(value: object, *, where: str, field: str) -> tuple[str, ...]:
    if isinstance(value, Mapping):
        return tuple(_arg_text(str(k), v) for k, v in value.items())
    if isinstance(value, list) and all(isinstance(v, str) and "=" in v for v in value):
        return tuple(value)
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
    for required in ("contract", "target", "draft"):
        if required not in table:
            raise InputError(f"missing key {required!r}", path=where, field=f"{prefix}.{required}")
    engine = table.get("engine", DEFAULT_ENGINE)
    if not isinstance(engine, str) or not engine:
        raise InputError(f"expected an engine name, got {engine!r}", path=where, field=f"{prefix}.engine")
    python = table.get("python")
    return Deployment(
        name=name,
        contract=_path(table["contract"], base, where=where, field=f"{prefix}.contract"),
        target=_path(table["target"], base, where=where, field=f"{prefix}.target"),
        draft=_path(table["draft"], base, where=where, field=f"{prefix}.draft"),
        engine=engine,
        engine_args=_engine_args(table.get("engine_args", {}), where=where, field=f"{prefix}.engine_args"),
        level=_check_level(table.get("level", "all"), where=where, field=f"{prefix}.level"),
        python=None if python is None else _path(python, base, where=where, field=f"{prefix}.python"),
        source=where,
    )


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
