"""Reading the commands a page shows the way a user's shell would, and parsing them with the parsers that will read
them: specparity's own CLI (click) and pytest's option parser with the specparity plugin loaded. Shared by the
workflow's test (tests/unit/test_workflow_doc.py) and the README and docs' (tests/unit/test_docs.py)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from specparity.cli import main

ROOT = Path(__file__).resolve().parents[1]

# a fenced block with one of these info strings holds commands to run; an unlabelled fence is a synopsis
# (`[--level L]`) or a session's output, and is not parsed
SHELL_FENCES = {"sh", "bash", "shell", "console"}
_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")
_ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_COMMAND = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*=\S*\s+)*"
                      r"(specparity|pytest|make|\S*python[0-9.]*\s+-m\s+pytest|(scripts|benchmarks|fixtures)/\S+)(\s|$)")


def click_parse(args: list[str], where: str = "the page") -> click.Context:
    """Resolve the subcommand path as click would and parse its options (raises on an unknown one)."""
    cmd: click.Command = main
    ctx = None
    name = "specparity"
    while isinstance(cmd, click.Group) and args and not args[0].startswith("-"):
        ctx = cmd.make_context(name, [args[0]], resilient_parsing=True, parent=ctx)
        sub = cmd.get_command(ctx, args[0])
        assert sub is not None, f"{where}: specparity has no command {args[0]!r}"
        name, cmd, args = args[0], sub, args[1:]
    try:
        return cmd.make_context(name, list(args), parent=ctx)
    except click.ClickException as e:
        raise AssertionError(f"{where}: specparity {name} {shlex.join(args)}: {e.format_message()}") from e


def pytest_parse(pytester: pytest.Pytester, args: list[str], where: str = "the page") -> pytest.Config:
    """pytest's own parser, with the plugins installed beside it (specparity's among them), on ``args``."""
    try:
        config = pytester.parseconfig(*args)
    except (pytest.UsageError, SystemExit) as e:  # argparse's message: usage, its error line, the ini file
        lines = [line for line in str(e).splitlines() if "error:" in line] or [str(e) or type(e).__name__]
        raise AssertionError(f"{where}: pytest {shlex.join(args)}: {lines[0].strip()}") from e
    assert config.pluginmanager.has_plugin("specparity"), "the plugin is not loaded"
    return config


def shell_blocks(text: str) -> list[tuple[int, str]]:
    """The shell code of a Markdown page: fenced blocks labelled ``sh``/``bash``/``shell``/``console``, and
    indented code blocks (four spaces after a blank line, outside a fence), each with the line it starts on."""
    blocks: list[tuple[int, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence:
            marker, info = fence.group(1), fence.group(2).lower()
            j = i + 1
            while j < len(lines) and not lines[j].startswith(marker):
                j += 1
            if info in SHELL_FENCES:
                blocks.append((i + 2, "\n".join(lines[i + 1:j])))
            i = j + 1
            continue
        if lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip()) and lines[i].strip():
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            blocks.append((i + 1, "\n".join(line[4:] for line in lines[i:j])))
            i = j
            continue
        i += 1
    return blocks


def commands(block: str) -> list[list[str]]:
    """The commands of one shell block that specparity's pages run: ``specparity``, ``pytest`` (also as
    ``python -m pytest``), ``make`` and a script of this repository, with continuations joined, comments and a ``$ ``
    prompt dropped, and the ``VAR=value`` words in front of a command (its environment) left out. Other lines (a
    directory listing, output, another program) are not read."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.removeprefix("$ ")
        if not _COMMAND.match(line):
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError as e:
            raise AssertionError(f"{e}: {line}") from None
        while words and _ENV_WORD.match(words[0]):
            words = words[1:]
        out.append(words)
    return out


def make_targets(makefile: Path = ROOT / "Makefile") -> set[str]:
    """The targets the Makefile defines."""
    targets = set()
    for line in makefile.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+(?:\s+[A-Za-z0-9_.-]+)*)\s*:(?!=)", line)
        if m and not line.startswith("."):
            targets.update(m.group(1).split())
    return targets
