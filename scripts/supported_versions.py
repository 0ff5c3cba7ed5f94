#!/usr/bin/env python3
"""Print the supported-SGLang-versions table (Markdown) for the README, from ``specparity versions --json``.

    .venv/bin/python scripts/supported_versions.py

The rows are ``specparity.serving.sglang.families.versions_table()`` (what ``specparity versions --json``
prints), plus the pins of each matrix env's lists in ``constraints/``. Needs only ``packaging``: neither
torch nor sglang is imported.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("_families", REPO / "src/specparity/serving/sglang/families.py")
assert _spec is not None and _spec.loader is not None
families: Any = importlib.util.module_from_spec(_spec)
sys.modules["_families"] = families  # dataclasses resolve their module while the class is built
_spec.loader.exec_module(families)


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
    rows = ["| SGLang versions | family (domain.md §6) | adapter (`serving/sglang/`) | releases | tested in the matrix (tox, scripts/matrix.sh) with |",
            "|---|---|---|---|---|"]
    for r in families.versions_table():
        if r["untested"]:
            tested = "untested: the newest adapter, with an `untested_version` warning in every report"
        elif r["tested_with"]:
            tested = "; ".join(_tested(e) for e in r["tested_with"])
        else:
            tested = r["untested_why"]
        releases = f"{r['releases'][0]} … {r['releases'][-1]} ({len(r['releases'])})" if r["releases"] else "—"
        rows.append(f"| `{r['range']}` | {r['family']}: {r['summary']} | `{r['module'].replace('.', '/')}.py` | {releases} | {tested} |")
    return "\n".join(rows)


def main() -> int:
    print(table())
    print()
    print(f"SGLang older than {families.FIRST_EAGLE3} (no EAGLE-3) is refused with an `unsupported_version` "
          "failure naming these ranges. `specparity versions [--json]` prints the same table. .ci/run runs every "
          "env. Family A is served at the static level only: its capture level is a typed `unsupported_version` "
          "failure (exit 3), never a pass.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
