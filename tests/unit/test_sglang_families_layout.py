"""One folder per SGLang code family, the same core files in each, and one table mapping releases to them:
``serving/sglang/families.py`` is that table; these checks need no SGLang."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from packaging.version import Version

from specparity.cli import main
from specparity.serving.sglang.families import _PKG, FAMILIES, KNOWN_RELEASES

SGLANG_ROOM = Path(__file__).resolve().parents[2] / "src" / "specparity" / "serving" / "sglang"
CORE_FILES = {"__init__.py", "adapter.py", "core.py", "run.py", "static.py"}


def _folders() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for fam in FAMILIES:
        out.setdefault(fam.folder, []).append(fam.letter)
    return out


def test_every_row_names_an_adapter_module_inside_its_family_folder() -> None:
    for fam in FAMILIES:
        rel = fam.module.removeprefix(_PKG)
        assert rel.startswith(fam.folder + ".") and rel.count(".") == 1, fam
        assert (SGLANG_ROOM / (rel.replace(".", "/") + ".py")).is_file(), f"row {fam.letter}: no module {rel}"


def test_each_family_folder_has_the_same_core_files_and_is_named_for_its_first_release() -> None:
    folders = _folders()
    assert len(folders) >= 2
    for folder, letters in folders.items():
        files = {p.name for p in (SGLANG_ROOM / folder).glob("*.py")}
        assert files >= CORE_FILES, f"{folder} lacks {sorted(CORE_FILES - files)}"
        first = min((r for r in KNOWN_RELEASES if any(f.contains(r) for f in FAMILIES if f.letter in letters)),
                    key=Version)
        assert folder == "since_" + "_".join(str(x) for x in Version(first).release), (folder, first)


def test_no_family_folder_imports_another() -> None:
    """Shared pieces live beside the folders (common.py, meta_build.py, run_common.py ...), never across them."""
    folders = set(_folders())
    for folder in folders:
        for path in (SGLANG_ROOM / folder).glob("*.py"):
            text = path.read_text(encoding="utf-8")
            for other in folders - {folder}:
                assert f"sglang.{other}" not in text, f"{path.name} in {folder} imports {other}"


def test_versions_reads_the_table_folder_by_folder() -> None:
    rows = json.loads(CliRunner().invoke(main, ["versions", "--json"]).output)
    sglang = [r for r in rows if r["engine"] == "sglang"]
    assert [(r["family"], r["folder"]) for r in sglang[:-1]] == [(f.letter, f.folder) for f in FAMILIES]
    text = CliRunner().invoke(main, ["versions"]).output
    for fam in FAMILIES:
        assert any(fam.folder in line and line.startswith(fam.specifier) for line in text.splitlines()), fam
