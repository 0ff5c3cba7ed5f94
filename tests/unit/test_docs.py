"""The README is a front door and it and every page in docs/ stay true: their relative links resolve
(anchors to headings), their shell blocks' commands parse with the parsers that will read them (specparity's CLI,
pytest's with the plugin loaded), the make targets they name exist, and the versions tables are the generated ones."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from tests.doc_commands import ROOT, click_parse, commands, make_targets, pytest_parse, shell_blocks

README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
README_LINES = 120

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _prose(text: str) -> list[tuple[int, str]]:
    """The lines of a page outside its fenced blocks, with inline code spans removed, numbered from 1."""
    out, fence = [], None
    for n, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if m and (fence is None or m.group(1).startswith(fence)):
            fence = m.group(1)[0] * 3 if fence is None else None
            continue
        if fence is None:
            out.append((n, line))
    return out


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: link syntax to its text, lower case, punctuation but - and _ dropped,
    spaces to -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for _, line in _prose(page.read_text()):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = _slug(m.group(1))
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_LINES, f"README.md is {len(lines)} lines; what is not the front door goes in docs/"
    text = README.read_text()
    for form in ("--launch --", "--server ", "--target ", "pytest -m parity", "[tool.specparity.deployments.",
                 "docs/workflows/parity.yml", "docs/README.md"):
        assert form in text, f"README.md: the quick path lost {form!r}"
    # the launch form is the first way the README gates a deployment
    assert text.index("--launch --") < text.index("--server ") < text.index("--target /")


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in PAGES:
        for n, line in _prose(page.read_text()):
            for target in _LINK.findall(re.sub(r"`[^`]*`", "", line)):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                    continue
                path, _, anchor = target.partition("#")
                dest = (page.parent / path).resolve() if path else page
                if not dest.exists():
                    broken.append(f"{_rel(page)}:{n}: {target}: no such file")
                elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                    broken.append(f"{_rel(page)}:{n}: {target}: no heading #{anchor} in {_rel(dest)}")
    assert not broken, "\n".join(broken)


def test_every_page_in_docs_is_in_the_index() -> None:
    index = (DOCS / "README.md").read_text()
    linked = {(DOCS / t.partition("#")[0]).resolve() for _, line in _prose(index) for t in _LINK.findall(line)}
    missing = [_rel(p) for p in PAGES if p.parent == DOCS and p.name != "README.md" and p.resolve() not in linked]
    assert not missing, f"docs/README.md does not link {missing}"


def test_every_command_in_a_shell_block_parses(pytester: pytest.Pytester) -> None:
    targets = make_targets()
    seen: set[str] = set()
    wrong = []
    for page in PAGES:
        for start, block in shell_blocks(page.read_text()):
            where = f"{_rel(page)}:{start}"
            for cmd in commands(block):
                exe, args = cmd[0], cmd[1:]
                try:
                    if exe == "specparity":
                        seen.add(f"specparity {click_parse(args, where).info_name}")
                    elif exe == "pytest" or args[:2] == ["-m", "pytest"]:
                        pytest_parse(pytester, args if exe == "pytest" else args[2:], where)
                        seen.add("pytest")
                    elif exe == "make":
                        named = [a for a in args if not a.startswith("-") and "=" not in a]
                        assert set(named) <= targets, f"{where}: no make target {sorted(set(named) - targets)}"
                        seen.add("make")
                    else:  # a script of this repository
                        assert (ROOT / exe).is_file(), f"{where}: {exe} is not in the repository"
                except AssertionError as e:
                    wrong.append(str(e).splitlines()[0])
    assert not wrong, "\n".join(wrong)
    assert {"specparity gate", "specparity explain", "pytest", "make"} <= seen, seen


def test_every_make_target_named_exists() -> None:
    targets = make_targets()
    named = {(page, t) for page in PAGES for t in re.findall(r"`make ([A-Za-z0-9_.-]+)", page.read_text())}
    missing = sorted(f"{_rel(page)}: make {t}" for page, t in named if t not in targets)
    assert not missing, missing


def test_every_toml_block_is_toml() -> None:
    for page in PAGES:
        for block in re.findall(r"^```toml\n(.*?)^```", page.read_text(), flags=re.S | re.M):
            tomllib.loads(block)


def test_the_versions_tables_are_the_generated_ones() -> None:
    """docs/engines.md holds what scripts/supported_versions.py prints from the release registries."""
    table = subprocess.run([sys.executable, str(ROOT / "scripts" / "supported_versions.py")], check=True,
                           capture_output=True, text=True).stdout.strip()
    page = (DOCS / "engines.md").read_text()
    begin = "<!-- begin: generated by scripts/supported_versions.py -->\n"
    start = page.index(begin) + len(begin)
    end = page.index("\n<!-- end: generated -->")
    assert page[start:end].strip() == table, "run: .venv/bin/python scripts/supported_versions.py and paste it"
