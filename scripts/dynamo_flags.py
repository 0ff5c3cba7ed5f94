#!/usr/bin/env python3
"""NVIDIA Dynamo's own worker flags, from a released ai-dynamo's source, as data:
``python scripts/dynamo_flags.py [VERSION ...]`` -> ``src/specparity/serving/dynamo_flags.json``.

``python -m dynamo.sglang`` and ``python -m dynamo.vllm`` take the engine's server flags plus Dynamo's own. The
launch parse (``serving/dynamo.py``) sets Dynamo's aside before the engine's parser reads the rest, and for that it
needs Dynamo's flags without Dynamo installed. This script reads them from the release's own source: the ai-dynamo
wheel of that version (``pip download ai-dynamo==VERSION --no-deps``; the wheel is the release tag's
``components/src/dynamo/...`` tree, nothing is installed or run). It walks, with ``ast``, every call that registers a
flag in the files each worker's parser draws on (:data:`FILES`): ``add_argument(..., flag_name="--x", ...)`` and
``add_negatable_bool_argument`` (Dynamo's helpers, ``dynamo/common/configuration/utils.py``: ``--x`` plus
``obsolete_flag``; a negatable flag also ``--no-x``) and argparse's own ``.add_argument("--x", ...)``. For each flag it
records how many words follow it (0 for a switch, 1 for a value, ``*``/``+``/``?`` as its ``nargs``) and the
``file:line`` of the call. A flag that is not a string literal stops the script: the data never leaves one out.

The set is a superset for a worker: the router groups' frontend-only flags are in it (``RouterArgGroup`` takes them
behind ``include_frontend_only``), so a command that gives one has it set aside, never read as the engine's.
Standard library only, besides pip for the download.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "src" / "specparity" / "serving" / "dynamo_flags.json"
DEFAULT_VERSIONS = ("1.6.1",)
_COMMON = ("dynamo/common/configuration/groups/runtime_args.py", "dynamo/common/configuration/groups/router_args.py",
           "dynamo/common/configuration/groups/kv_router_args.py",
           "dynamo/common/configuration/groups/frontend_decoding_args.py")
# the files whose flags each worker's parser registers (dynamo/<engine>/args.py parse_args: the runtime group, the
# engine's Dynamo group in backend_args.py, the worker router flags; frontend decoding is added by backend_args.py)
FILES = {"sglang": (*_COMMON, "dynamo/sglang/backend_args.py"), "vllm": (*_COMMON, "dynamo/vllm/backend_args.py")}
_SWITCH_ACTIONS = {"store_true", "store_false", "store_const", "count", "version", "help", "BooleanOptionalAction"}


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _loop_values(tree: ast.AST) -> dict[int, dict[str, list[str]]]:
    """For each ``for a, b in <literal tuple of tuples>`` (the literal inline or a name assigned one just before), the
    string values each loop variable takes, keyed by the id of every node in the loop's body."""
    assigned = {t.id: n.value for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Name) and isinstance(n.value, ast.Tuple | ast.List)}
    out: dict[int, dict[str, list[str]]] = {}
    for loop in ast.walk(tree):
        if not isinstance(loop, ast.For):
            continue
        it = assigned.get(loop.iter.id) if isinstance(loop.iter, ast.Name) else loop.iter
        if not isinstance(it, ast.Tuple | ast.List):
            continue
        targets = loop.target.elts if isinstance(loop.target, ast.Tuple) else [loop.target]
        values: dict[str, list[str]] = {}
        for row in it.elts:
            cells = row.elts if isinstance(row, ast.Tuple | ast.List) else [row]
            for t, c in zip(targets, cells, strict=False):
                if isinstance(t, ast.Name) and _str(c) is not None:
                    values.setdefault(t.id, []).append(str(_str(c)))
        for stmt in loop.body:
            for n in ast.walk(stmt):
                out[id(n)] = values
    return out


def flags_of(path: Path, rel: str) -> dict[str, dict[str, Any]]:
    """``{flag: {"arity": 0|1|"*"|"+"|"?"|n, "at": "rel:line"}}`` for every flag registered in one file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
    loops = _loop_values(tree)
    out: dict[str, dict[str, Any]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or _name(node.func) not in ("add_argument", "add_negatable_bool_argument"):
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        helper = isinstance(node.func, ast.Name)  # Dynamo's helpers are called by name, argparse's as a method
        if helper:
            if "flag_name" not in kw:
                continue  # a definition's own recursive call shape, not a registration
            names = [kw["flag_name"]] + ([kw["obsolete_flag"]] if "obsolete_flag" in kw else [])
        else:
            names = [a for a in node.args if not (isinstance(a, ast.Constant) and a.value is None)]
        literal: list[str | None] = []
        for n in names:
            if isinstance(n, ast.Name) and n.id in loops.get(id(node), {}):
                literal += loops[id(node)][n.id]  # a flag per row of the loop's literal table
            else:
                literal.append(_str(n))
        if any(x is None for x in literal):
            if helper and _name(node.func) == "add_argument" and rel.endswith("utils.py"):
                continue
            raise SystemExit(f"{rel}:{node.lineno}: a flag that is not a string literal ({ast.unparse(node)[:120]}); "
                             "read it by hand before using this release's data")
        flags = [x for x in literal if x and x.startswith("-")]
        if not flags:
            continue
        action = _name(kw["action"]) if "action" in kw and not _str(kw["action"]) else (_str(kw.get("action")) or "")
        negatable = _name(node.func) == "add_negatable_bool_argument" or action == "BooleanOptionalAction"
        nargs = kw.get("nargs")
        arity: Any = 0 if negatable or action in _SWITCH_ACTIONS else 1
        if nargs is not None:
            arity = nargs.value if isinstance(nargs, ast.Constant) else "?"
        for f in flags:
            out[f] = {"arity": arity, "at": f"{rel}:{node.lineno}"}
            if negatable and f.startswith("--"):
                out["--no-" + f[2:]] = {"arity": 0, "at": f"{rel}:{node.lineno}"}
    return out


def release(version: str, work: Path) -> dict[str, Any]:
    subprocess.run([sys.executable, "-m", "pip", "download", f"ai-dynamo=={version}", "--no-deps", "-q", "-d",
                    str(work)], check=True)
    wheel = next(work.glob(f"ai_dynamo-{version}-*.whl"))
    tree = work / version
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tree)
    out: dict[str, Any] = {"wheel": wheel.name}
    for engine, files in FILES.items():
        flags: dict[str, dict[str, Any]] = {}
        for rel in files:
            for f, info in flags_of(tree / rel, rel).items():
                flags.setdefault(f, info)
        out[engine] = dict(sorted(flags.items()))
    return out


def main(argv: list[str]) -> None:
    versions = argv or list(DEFAULT_VERSIONS)
    with tempfile.TemporaryDirectory() as tmp:
        releases = {v: release(v, Path(tmp)) for v in versions}
    data = {"source": "ai-dynamo wheels from PyPI (the release tags' components/src/dynamo tree), read with "
                      "scripts/dynamo_flags.py; nothing installed or run",
            "releases": releases}
    OUT.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    n = {v: {e: len(r[e]) for e in FILES} for v, r in releases.items()}
    print(f"wrote {OUT}: {n}")


if __name__ == "__main__":
    main(sys.argv[1:])
