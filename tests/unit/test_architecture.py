"""docs/architecture.md stays true: its floors block places every room of src/specparity, no import runs from a
lower floor to a higher one, and every file under src/specparity is named in it.

A room is a top-level module or subpackage of specparity (``gate``, ``serving``, ``compare``; ``__init__`` is the
package face). Imports are read with ``ast`` from every .py file under src/specparity: module-level and
function-local, absolute and relative. What ``importlib.import_module`` loads by a computed name is not an
import here (the SGLang adapter registry, the zygote's worker module: both inside ``serving``).

Under ``serving/``, no function runs past 80 lines, and no file past 400 unless a comment in it says why.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "specparity"
DOC = ROOT / "docs" / "architecture.md"
_BLOCK = re.compile(r"^```floors\n(.*?)^```", re.S | re.M)
_LINE = re.compile(r"^floor\s+(\d+)\s*:\s*(.+)$")


def doc_floors() -> dict[str, int]:
    """Room -> floor, from the ```floors block of docs/architecture.md (``floor N: room, room``)."""
    found = _BLOCK.search(DOC.read_text(encoding="utf-8"))
    assert found, f"{DOC.relative_to(ROOT)} has no ```floors block"
    floors: dict[str, int] = {}
    for raw in found.group(1).splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.match(line)
        assert m, f"{DOC.relative_to(ROOT)}: cannot read floors line {raw!r} (expected 'floor N: room, room')"
        for name in (n.strip() for n in m.group(2).split(",")):
            assert name not in floors, f"{DOC.relative_to(ROOT)}: room {name} is placed twice"
            floors[name] = int(m.group(1))
    return floors


def code_rooms() -> set[str]:
    """Every top-level module and subpackage of src/specparity."""
    rooms = {p.stem for p in PACKAGE.glob("*.py")}
    rooms |= {d.name for d in PACKAGE.iterdir() if d.is_dir() and d.name != "__pycache__" and any(d.rglob("*.py"))}
    return rooms


def _module_of(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def room_of(module: str) -> str:
    """``specparity.serving.sglang.since_0_4_4.core`` -> ``serving``; the package itself -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(path: Path, rooms: set[str]) -> Iterator[tuple[int, str]]:
    """(line, module) for every import of specparity in ``path``, wherever it stands in the file."""
    module, is_package = _module_of(path)
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            # `from specparity import sources` names a room; `from specparity import __version__` the face
            targets = ([f"specparity.{a.name}" if a.name in rooms else "specparity" for a in node.names]
                       if target == "specparity" else [target])
        for t in targets:
            if t == "specparity" or t.startswith("specparity."):
                yield node.lineno, t


def test_every_room_is_placed_on_a_floor() -> None:
    floors, rooms = doc_floors(), code_rooms()
    missing, stale = sorted(rooms - floors.keys()), sorted(floors.keys() - rooms)
    assert not missing, (f"rooms of src/specparity missing from the floors block of docs/architecture.md: "
                         f"{', '.join(missing)}; place each on the floor above everything it imports")
    assert not stale, f"docs/architecture.md places rooms that src/specparity no longer has: {', '.join(stale)}"


def test_no_import_runs_up_a_floor() -> None:
    floors, rooms = doc_floors(), code_rooms()
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = room_of(_module_of(path)[0])
        for line, target in imports_of(path, rooms):
            there = room_of(target)
            if there == here or here not in floors or there not in floors:
                continue  # a room missing from the doc is test_every_room_is_placed_on_a_floor's failure
            if floors[there] >= floors[here]:
                bad.append(f"{path.relative_to(ROOT)}:{line}: specparity.{here} (floor {floors[here]}) imports "
                           f"{target}, in specparity.{there} (floor {floors[there]})")
    assert not bad, ("imports that run up (or across) a floor of docs/architecture.md; a room imports only "
                     "rooms on lower floors:\n" + "\n".join(bad))


@pytest.mark.parametrize("room", sorted(code_rooms()))
def test_each_room_imports(room: str) -> None:
    importlib.import_module("specparity" if room == "__init__" else f"specparity.{room}")


_SECTION = re.compile(r"^### (.+)$", re.M)
_FOLDER = re.compile(r"`([\w./]*?/)(\*\*)?`")


def doc_sections() -> list[tuple[set[str], set[str], str]]:
    """Each ``### `folder/``` section of docs/architecture.md: (folders it is the section of, whole stand-in trees it
    names with ``**``, its text). ``./`` is the top level of src/specparity."""
    text = DOC.read_text(encoding="utf-8")
    heads = list(_SECTION.finditer(text))
    out = []
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        body = text[head.end():end].split("\n## ", 1)[0]
        folders = {m.group(1).removeprefix("./") for m in _FOLDER.finditer(head.group(1)) if not m.group(2)}
        trees = {m.group(1) for m in _FOLDER.finditer(head.group(1)) if m.group(2)}
        out.append((folders, trees, body))
    return out


def _names(text: str, name: str) -> bool:
    return re.search(r"(?<![\w./])" + re.escape(name) + r"(?![\w])", text) is not None


def unnamed_files() -> list[str]:
    """Every .py under src/specparity that docs/architecture.md does not name: by its path from src/specparity
    anywhere, or by its file name in the section of its folder (a package's ``__init__.py`` by that section alone),
    or as part of a stand-in tree (``folder/**``)."""
    text, sections = DOC.read_text(encoding="utf-8"), doc_sections()
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        folder = rel.rpartition("/")[0] + "/" if "/" in rel else ""
        if _names(text, rel) or any(rel.startswith(tree) for _, trees, _ in sections for tree in trees):
            continue
        mine = [body for folders, _, body in sections if folder in folders]
        if mine and (path.name == "__init__.py" or any(_names(body, path.name) for body in mine)):
            continue
        missing.append(rel)
    return missing


def test_every_file_is_named_in_the_doc() -> None:
    missing = unnamed_files()
    assert not missing, ("files under src/specparity that docs/architecture.md does not name (add each to the "
                         "section of its folder under 'Every file, folder by folder', saying what it does):\n"
                         + "\n".join(missing))


def test_the_doc_names_no_file_that_is_gone() -> None:
    stale = []
    for folders, _, body in doc_sections():
        for folder in folders:
            for m in re.finditer(r"^- `([\w.]+\.py)`", body, re.M):
                if not (PACKAGE / folder / m.group(1)).is_file() and not any(
                        (PACKAGE / f / m.group(1)).is_file() for f in folders):
                    stale.append(f"{folder}{m.group(1)}")
    assert not stale, f"docs/architecture.md names files src/specparity no longer has: {', '.join(sorted(set(stale)))}"


SERVING = PACKAGE / "serving"
_MAX_FUNCTION_LINES, _MAX_FILE_LINES = 80, 400
_ARGUED = re.compile(r"^# Over .*400 lines", re.M)  # a file's own comment saying why it is longer


def test_serving_functions_and_files_stay_short_or_say_why() -> None:
    long = []
    for path in sorted(SERVING.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > _MAX_FILE_LINES and not _ARGUED.search(text):
            long.append(f"{path.relative_to(ROOT)}: {len(text.splitlines())} lines, and no '# Over ... 400 lines' "
                        "comment saying why")
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > _MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name} is {lines} lines")
    assert not long, (f"under src/specparity/serving/, functions over {_MAX_FUNCTION_LINES} lines and files over "
                      f"{_MAX_FILE_LINES} lines that do not say why:\n" + "\n".join(long))
