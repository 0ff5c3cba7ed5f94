#!/usr/bin/env python3
"""Print the supported-SGLang-versions table (Markdown) from the adapter registry, for the README.

    .venv/bin/python scripts/supported_versions.py

Reads ``specparity.serving.sglang.adapter.REGISTRY`` and, without importing any adapter module (they
import sglang), each module's docstring for its family, and ``constraints/`` for the pinned lists the
CI matrix builds. Any specparity venv will do (the serving package imports torch); sglang is not needed.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from specparity.serving.sglang.adapter import REGISTRY, AdapterEntry  # noqa: E402

# tox env / scripts/matrix.sh env that runs each adapter's real-SGLang tests, and its pinned lists.
MATRIX = {
    "sglang-0.4.10": ("sglang-0.4.10", "constraints/sglang-0.4.10.post2.txt", "constraints/torch-cpu-2.13.txt"),
    "sglang-0.5.3": ("sglang-0.5.3", "constraints/sglang-0.5.3.txt", "constraints/torch-cpu-2.13.txt"),
    "sglang-0.5.23": ("sglang-0.5.23", "constraints/sglang-0.5.23.txt", "constraints/torch-0.5.23.txt"),
}


def _module_doc(module: str) -> str:
    path = REPO / "src" / Path(*module.split(".")).with_suffix(".py")
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def _family(doc: str) -> str:
    m = re.search(r"\((family [A-E][^;)]*)", doc)
    if m is None:
        return "?"
    return ", ".join(part.strip() for part in m.group(1).split(",") if "domain.md" not in part)


def _pin(path: str, package: str) -> str:
    f = REPO / path
    if not f.is_file():
        return "?"
    for line in f.read_text().splitlines():
        name, _, version = line.partition("==")
        if name.strip().lower() == package:
            return version.strip()
    return "?"


def _tested(entry: AdapterEntry) -> str:
    env, sglang_list, torch_list = MATRIX.get(entry.name, ("", "", ""))
    if not env:
        return "not in the CI matrix"
    return (f"sglang {_pin(sglang_list, 'sglang')}, torch {_pin(torch_list, 'torch')}, "
            f"transformers {_pin(sglang_list, 'transformers')} (`{env}`)")


def table() -> str:
    """The Markdown table, one row per registered adapter, oldest first."""
    rows = ["| SGLang versions | adapter | family (domain.md §6) | tested in CI with |",
            "|---|---|---|---|"]
    for entry in sorted(REGISTRY, key=lambda e: e.lowest):
        rows.append(f"| `{entry.range_text}` | `{entry.module.rsplit('.', 1)[-1]}` | "
                    f"{_family(_module_doc(entry.module))} | {_tested(entry)} |")
    return "\n".join(rows)


def main() -> int:
    print(table())
    print()
    print("Any other installed SGLang version is refused with an `unsupported_version` failure naming "
          "these ranges.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
