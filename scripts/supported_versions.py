#!/usr/bin/env python3
"""Print the supported-versions tables (Markdown) for docs/engines.md, from ``specparity versions --json``.

    .venv/bin/python scripts/supported_versions.py

The SGLang rows are ``specparity.serving.sglang.families.versions_table()`` and the vLLM rows
``specparity.serving.vllm.versions.versions_rows()`` (what ``specparity versions --json`` prints), plus the pins of
each SGLang matrix env's lists in ``constraints/``. Needs only ``packaging``: neither torch nor an engine is imported.
tests/unit/test_docs.py checks that docs/engines.md holds this output between its markers.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _load(name: str, path: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module while the class is built
    spec.loader.exec_module(module)
    return module


families: Any = _load("_families", "src/specparity/serving/sglang/families.py")
vllm_versions: Any = _load("_vllm_versions", "src/specparity/serving/vllm/versions.py")


def _pin(path: Path, package: str) -> str:
    if not path.is_file():
        return "?"
    for line in path.read_text().splitlines():
        name, _, version = line.partition("==")
        if name.strip().lower() == package:
            return version.lstrip("=").strip()  # an `===` exact pin reads the same
    return "?"


def _tested(env_name: str) -> str:
    env = families.ENVS[env_name]
    lst = REPO / env.constraints
    return (f"sglang {_pin(lst, 'sglang')}, torch {_pin(REPO / env.torch, 'torch')}, "
            f"transformers {_pin(lst, 'transformers')} (`{env_name}`)")


def table() -> str:
    """The Markdown table, one row per range, oldest first, then the untested newer range."""
    rows = ["| SGLang versions | family (domain.md §6) | adapter (`serving/sglang/`) | releases | tested in the matrix (tox, scripts/matrix.sh) with | live server capture |",
            "|---|---|---|---|---|---|"]
    for r in families.versions_table():
        if r["untested"]:
            tested = "untested: the newest adapter, with an `untested_version` warning in every report"
        elif r["tested_with"]:
            tested = "; ".join(_tested(e) for e in r["tested_with"])
        else:
            tested = r["untested_why"]
        releases = f"{r['releases'][0]} … {r['releases'][-1]} ({len(r['releases'])})" if r["releases"] else "—"
        rows.append(f"| `{r['range']}` | {r['family']}: {r['summary']} | `{r['module'].replace('.', '/')}.py` | {releases} "
                    f"| {tested} | {r['live_capture']} |")
    return "\n".join(rows)


def vllm_table() -> str:
    """The vLLM rows, one per family (serving/vllm/families.py), oldest first, then the untested newer range."""
    envs = vllm_versions.ENVS
    rows = ["| vLLM versions | family | adapter (`serving/vllm/`) | reads the draft's ids | releases read "
            "(`idrules/vllm_releases.py`) | levels on CPU | tested in the matrix with |", "|---|---|---|---|---|---|---|"]
    for r in vllm_versions.versions_rows():
        tested = "; ".join(f"{envs[e].dist} {v} (`{e}`: {'static, capture, outcome' if envs[e].cpu_capture else 'static'})"
                           for e, v in zip(r["tested_with"], r["tested_versions"], strict=True)) or r["untested_why"]
        releases = f"{r['releases'][0]} … {r['releases'][-1]} ({len(r['releases'])})" if r["releases"] else "—"
        rows.append(f"| `{r['range']}` | {r['family']}: {r['summary']} | `{r['folder'].removeprefix('serving/vllm/')}` "
                    f"| `{r['reader']}` | {releases} | {', '.join(r['levels_on_cpu'])} | {tested} |")
    return "\n".join(rows)


def main() -> int:
    print(table())
    print()
    print(f"SGLang older than {families.FIRST_EAGLE3} (no EAGLE-3) is refused with an `unsupported_version` "
          "failure naming these ranges. `specparity versions [--json]` prints the same table. .ci/run runs every "
          "env. Family A is served at the static level only: its capture level is a typed `unsupported_version` "
          "failure (exit 3), never a pass. The live server capture (through the server you run, `--launch` or "
          "`--server`) is `specparity versions`' column `live`: docs/live-sglang.md says why each family has it or not.")
    print()
    print(vllm_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
