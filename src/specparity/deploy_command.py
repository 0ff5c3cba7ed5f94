"""The deploy command as the user wrote it -> :class:`LaunchCommand`: the shell layer, no engine.

``specparity gate --launch -- <command>``, ``--launch-file FILE`` and a ``launch = "..."`` key in a
``[tool.specparity.deployments.<name>]`` table all come here first. This module reads the text the way a POSIX
shell would, far enough to know what the engine is given, and nothing more; what the engine makes of the
arguments is its own parser's answer (:mod:`specparity.serving.command.parse`, in the engine's interpreter).

What is read:

- backslash-newline continuations, single and double quotes (a quoted value may span lines: a
  ``--speculative-config '{...}'`` spread over several), backslash escapes, ``#`` comments, ``;``;
- ``VAR=value`` prefixes of the command (its environment), ``export VAR=value`` lines (exported: the command's
  environment too), plain ``VAR=value`` lines (shell variables: expanded, not exported), ``set ...`` lines (a
  script's ``set -e``), a ``#!`` line, and the wrappers ``exec``, ``nohup`` and ``env NAME=value``;
- ``$VAR``, ``${VAR}``, ``${VAR:-default}`` and ``${VAR-default}``, from the command's own assignments first, then
  the caller's environment; an unquoted expansion is split on whitespace, as the shell splits it; a leading ``~``;
- a trailing ``&`` (a deploy script backgrounding the server): set aside, the command is the one it backgrounds,
  and the report says so (:meth:`LaunchCommand.notes`);
- NVIDIA Dynamo's workers ``python -m dynamo.sglang`` and ``python -m dynamo.vllm``: the engine's own server flags
  plus Dynamo's, which the engine's child sets aside (:mod:`specparity.serving.dynamo`).

The command's words are expanded before its own ``VAR=value`` prefixes apply, as in the shell (POSIX 2.9.1): a
prefix sets the engine's environment, not the text of its arguments.

Anything else (a second command, a pipe, a redirection, ``&&``, an ``&`` before more text, ``$(...)``, ``cd``,
``source``) is refused with the line that holds it, and so is an unset variable: exit 2
(:class:`specparity.errors.InputError`), never a traceback. Standard library only.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from specparity.errors import InputError

Engine = Literal["sglang", "vllm"]

# (module run with ``python -m``, then the words after it that name the entry) -> (engine, entry). The entry names
# the parser the engine's own launcher builds (serving/<engine>/command_parse.py reads it).
_PYTHON_MODULES: dict[str, tuple[tuple[str, ...], Engine, str]] = {
    "sglang.launch_server": ((), "sglang", "sglang.launch_server"),
    "sglang.cli.main": (("serve",), "sglang", "sglang serve"),
    "vllm.entrypoints.openai.api_server": ((), "vllm", "vllm.entrypoints.openai.api_server"),
    "vllm.entrypoints.cli.main": (("serve",), "vllm", "vllm serve"),
    # NVIDIA Dynamo's workers: the engine's own server flags plus Dynamo's; the child sets Dynamo's aside
    # (serving/dynamo.py) and gives the rest to the engine's parser
    "dynamo.sglang": ((), "sglang", "dynamo.sglang"),
    "dynamo.vllm": ((), "vllm", "dynamo.vllm"),
}
_CONSOLE_SCRIPTS: dict[str, tuple[Engine, str]] = {"sglang": ("sglang", "sglang serve"), "vllm": ("vllm", "vllm serve")}
ENTRIES = ("sglang.launch_server", "sglang serve", "vllm.entrypoints.openai.api_server", "vllm serve", "dynamo.sglang",
           "dynamo.vllm")
DYNAMO_ENTRIES = ("dynamo.sglang", "dynamo.vllm")
_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
# python's own options that may stand before ``-m`` (``python3 -u -m sglang.launch_server``); those taking a value
_PY_FLAGS = frozenset({"-u", "-O", "-OO", "-B", "-E", "-s", "-S", "-I", "-P", "-q", "-v", "-b", "-bb", "-d"})
_PY_FLAGS_WITH_VALUE = frozenset({"-X", "-W"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=")
_WRAPPERS = frozenset({"exec", "nohup"})
# commands that change the shell's own state (environment, directory, interpreter) rather than start a program
_SHELL_STATE = frozenset({"source", ".", "cd", "pushd", "popd", "conda", "module", "eval", "alias", "unset"})
# an environment variable whose value is a secret: shown as *** in every report
SECRET_NAME = re.compile(r"(API_?KEY|(^|_)TOKEN$|SECRET|PASSWORD|PASSWD)", re.I)
REDACTED = "***"


@dataclass(frozen=True)
class LaunchCommand:
    """One deploy command, read as the shell would run it.

    ``text`` is the command as given (a file's whole text); ``source`` the option or pyproject key it came from
    and ``path`` its file (None for ``--launch``); ``cwd`` the directory its relative paths mean (the caller's,
    as a shell script runs in its caller's directory; a pyproject key's file's directory). ``env`` is what the
    command itself sets for the engine (``export`` lines and ``VAR=value`` prefixes, expanded), ``program`` the
    words that start the engine (``("python3", "-m", "sglang.launch_server")``, ``("vllm", "serve")``) and
    ``args`` the engine's arguments, expanded and unquoted, ``arg_lines`` the line each came from. ``entry`` names
    the engine's launcher (:data:`ENTRIES`). Together they re-run the command exactly as given:
    ``env`` over the caller's environment, ``program + args`` in ``cwd``.

    ``to_dict`` keeps every value, secrets included (it is what re-runs the command); reports show
    :meth:`redacted` copies only.
    """

    text: str
    source: str
    path: str | None
    cwd: str
    env: dict[str, str] = field(hash=False)
    program: tuple[str, ...]
    args: tuple[str, ...]
    engine: Engine
    entry: str
    line: int
    arg_lines: tuple[int, ...] = ()
    setup: tuple[str, ...] = ()  # the other statements run before it, as written (``set -e``, ``A=1``)
    background: bool = False  # the command ended in a trailing ``&`` (a script backgrounding it), set aside

    @property
    def dynamo(self) -> bool:
        """Whether the command runs the engine under NVIDIA Dynamo (``python -m dynamo.sglang``/``dynamo.vllm``)."""
        return self.entry in DYNAMO_ENTRIES

    def notes(self) -> list[str]:
        """What the shell layer set aside or read through, for the report."""
        out = []
        if self.background:
            out.append("the command's trailing '&' (run in the background) was set aside: read as the one command "
                       "it backgrounds")
        return out

    @property
    def argv(self) -> tuple[str, ...]:
        """The process's argument vector: ``program + args``."""
        return self.program + self.args

    @property
    def python(self) -> str | None:
        """The interpreter the command names by path (``/opt/venv/bin/python -m ...``), else None."""
        first = self.program[0]
        if _PYTHON.match(Path(first).name) and os.sep in first:
            p = Path(first)
            return str(p if p.is_absolute() else Path(self.cwd) / p)
        return None

    def line_of(self, index: int) -> int:
        """The line of ``args[index]`` (the command's first line when unknown)."""
        return self.arg_lines[index] if 0 <= index < len(self.arg_lines) else self.line

    def redacted(self, secret_args: Sequence[int] = ()) -> LaunchCommand:
        """A copy safe to print: the values of ``args[i]`` for ``i`` in ``secret_args`` (an API key, the engine's
        parse says which) and of environment variables with a secret's name, replaced by ``***`` in ``args``,
        ``env`` and ``text``."""
        secret = {i for i in secret_args if 0 <= i < len(self.args)}
        values = {_flag_value(self.args[i]) for i in secret}
        values |= {v for k, v in self.env.items() if SECRET_NAME.search(k) and v}
        text = self.text
        for v in sorted((v for v in values if v), key=len, reverse=True):
            text = text.replace(v, REDACTED)
        args = tuple(a.replace(_flag_value(a), REDACTED) if i in secret and _flag_value(a) else a
                     for i, a in enumerate(self.args))
        env = {k: (REDACTED if SECRET_NAME.search(k) and v else v) for k, v in self.env.items()}
        return LaunchCommand(text=text, source=self.source, path=self.path, cwd=self.cwd, env=env,
                             program=self.program, args=args, engine=self.engine, entry=self.entry, line=self.line,
                             arg_lines=self.arg_lines, setup=self.setup, background=self.background)

    def one_line(self) -> str:
        """The command as one shell line: its environment, then ``program + args``, quoted."""
        return shlex.join([*(f"{k}={v}" for k, v in self.env.items()), *self.argv])

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "source": self.source, "path": self.path, "cwd": self.cwd, "env": dict(self.env),
                "program": list(self.program), "args": list(self.args), "engine": self.engine, "entry": self.entry,
                "line": self.line, "arg_lines": list(self.arg_lines), "setup": list(self.setup),
                "background": self.background}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LaunchCommand:
        engine = d["engine"]
        if engine not in ("sglang", "vllm"):
            raise ValueError(f"unknown engine {engine!r}")
        return cls(text=str(d["text"]), source=str(d["source"]), path=d.get("path"), cwd=str(d["cwd"]),
                   env={str(k): str(v) for k, v in dict(d.get("env") or {}).items()},
                   program=tuple(str(x) for x in d["program"]), args=tuple(str(x) for x in d["args"]),
                   engine=engine, entry=str(d["entry"]), line=int(d.get("line", 1)),
                   arg_lines=tuple(int(x) for x in d.get("arg_lines") or ()),
                   setup=tuple(str(x) for x in d.get("setup") or ()), background=bool(d.get("background")))


def _flag_value(arg: str) -> str:
    """``--api-key=abc`` -> ``abc``; any other word is its own value."""
    return arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg


# ------------------------------------------------------------------------------------------------ the scanner
# A word is a list of parts: ("lit", text, quoted) or ("var", name, op, default_parts, quoted). ``op`` is None,
# ":-" or "-"; ``quoted`` says whether the shell would split the part's expansion on whitespace (it does not
# inside quotes).
_Part = tuple[Any, ...]


@dataclass
class _Word:
    parts: list[_Part]
    line: int


@dataclass
class _Statement:
    words: list[_Word]
    line: int
    first: int  # offset of its first character in the text
    last: int = 0


class _Scanner:
    def __init__(self, text: str, *, where: dict[str, Any]) -> None:
        self.text, self.where = text, where
        self.i, self.line = 0, 1
        self.background = False  # the text ended in a trailing '&', set aside

    def fail(self, message: str, line: int | None = None) -> InputError:
        return InputError(f"line {line or self.line}: {message}", **self.where)

    def statements(self) -> list[_Statement]:
        out: list[_Statement] = []
        stmt: _Statement | None = None
        word: _Word | None = None
        t, n = self.text, len(self.text)

        def end_word() -> None:
            nonlocal word, stmt
            if word is not None:
                if stmt is None:
                    stmt = _Statement([], word.line, self.i)
                stmt.words.append(word)
                word = None

        def end_statement() -> None:
            nonlocal stmt
            end_word()
            if stmt is not None and stmt.words:
                stmt.last = self.i
                out.append(stmt)
            stmt = None

        def part(p: _Part) -> None:
            nonlocal word, stmt
            if word is None:
                word = _Word([], self.line)
                if stmt is None:
                    stmt = _Statement([], self.line, self.i)
            word.parts.append(p)

        while self.i < n:
            c = t[self.i]
            if c == "\\":
                if t.startswith("\\\n", self.i):
                    self.i += 2
                    self.line += 1
                    continue
                part(("lit", t[self.i + 1:self.i + 2] or "\\", True))
                self.i += 2
            elif c == "'":
                close = t.find("'", self.i + 1)
                if close < 0:
                    raise self.fail("a single quote is never closed")
                part(("lit", t[self.i + 1:close], True))
                self.line += t.count("\n", self.i, close)
                self.i = close + 1
            elif c == '"':
                self.i += 1
                for p in self._double_quoted():
                    part(p)
            elif c == "$":
                part(self._dollar(quoted=False))
            elif c == "`":
                raise self.fail("command substitution (`...`) is not read: write the value itself")
            elif c in " \t\r":
                end_word()
                self.i += 1
            elif c == "\n":
                end_statement()
                self.i += 1
                self.line += 1
            elif c == "#" and word is None:
                nl = t.find("\n", self.i)
                self.i = n if nl < 0 else nl
            elif c == ";":
                end_statement()
                self.i += 1
            elif c == "&" and not t.startswith("&&", self.i) and _only_comments(t[self.i + 1:]):
                # a trailing '&': a deploy script backgrounding the server; the command is the same one command
                end_statement()
                self.background = True
                self.i = n
            elif c in "&|<>()":
                op = t[self.i:self.i + 2] if t[self.i:self.i + 2] in ("&&", "||", ">>", "2>") else c
                raise self.fail(f"the shell operator {op!r} is not read: give the one command that starts the "
                                "server (no pipes, redirections, '&&', nor an '&' other than one that ends the text)")
            else:
                part(("lit", c, False))
                self.i += 1
        end_statement()
        return out

    def _double_quoted(self) -> list[_Part]:
        t, n = self.text, len(self.text)
        out: list[_Part] = []
        buf: list[str] = []
        start = self.line
        while self.i < n:
            c = t[self.i]
            if c == '"':
                self.i += 1
                out.append(("lit", "".join(buf), True))
                return out
            if c == "\\" and self.i + 1 < n and t[self.i + 1] in '$`"\\\n':
                if t[self.i + 1] == "\n":
                    self.line += 1
                else:
                    buf.append(t[self.i + 1])
                self.i += 2
            elif c == "$":
                out.append(("lit", "".join(buf), True))
                buf = []
                out.append(self._dollar(quoted=True))
            elif c == "`":
                raise self.fail("command substitution (`...`) is not read: write the value itself")
            else:
                if c == "\n":
                    self.line += 1
                buf.append(c)
                self.i += 1
        raise self.fail("a double quote is never closed", start)

    def _dollar(self, *, quoted: bool) -> _Part:
        """``$NAME``, ``${NAME}``, ``${NAME:-default}``, ``${NAME-default}``; a lone ``$`` is itself."""
        t = self.text
        self.i += 1
        if t.startswith("(", self.i):
            raise self.fail("command substitution $(...) is not read: write the value itself")
        if t.startswith("{", self.i):
            self.i += 1
            m = _NAME.match(t, self.i) or re.compile(r"\d+").match(t, self.i)
            if m is None:
                raise self.fail(f"the expansion ${{{t[self.i:self.i + 10]}... is not read")
            name = m.group(0)
            self.i = m.end()
            if t.startswith("}", self.i):
                self.i += 1
                return ("var", name, None, [], quoted, self.line)
            for op in (":-", "-"):
                if t.startswith(op, self.i):
                    self.i += len(op)
                    default = self._default(quoted=quoted)
                    return ("var", name, op, default, quoted, self.line)
            raise self.fail(f"only ${{{name}}}, ${{{name}:-default}} and ${{{name}-default}} are read here")
        m = _NAME.match(t, self.i) or re.compile(r"\d").match(t, self.i)
        if m is None:
            if self.i < len(t) and t[self.i] in "@*#?!$-":
                raise self.fail(f"the special parameter ${t[self.i]} is not read")
            return ("lit", "$", quoted)
        self.i = m.end()
        return ("var", m.group(0), None, [], quoted, self.line)

    def _default(self, *, quoted: bool) -> list[_Part]:
        """The word after ``:-`` up to the closing ``}``."""
        t, n = self.text, len(self.text)
        out: list[_Part] = []
        while self.i < n:
            c = t[self.i]
            if c == "}":
                self.i += 1
                return out
            if c == "'" and not quoted:
                close = t.find("'", self.i + 1)
                if close < 0:
                    raise self.fail("a single quote is never closed")
                out.append(("lit", t[self.i + 1:close], True))
                self.i = close + 1
            elif c == '"':
                self.i += 1
                out.extend(self._double_quoted())
            elif c == "$":
                out.append(self._dollar(quoted=quoted))
            elif c == "\\" and self.i + 1 < n:
                out.append(("lit", t[self.i + 1], True))
                self.i += 2
            else:
                if c == "\n":
                    self.line += 1
                out.append(("lit", c, quoted))
                self.i += 1
        raise self.fail("a ${...} is never closed")


# ------------------------------------------------------------------------------------------------ expansion
class _Expander:
    def __init__(self, environ: Mapping[str, str], *, where: dict[str, Any]) -> None:
        self.shell: dict[str, str] = {}  # every variable the text assigned (exported or not)
        self.exported: dict[str, str] = {}
        self.environ = environ
        self.where = where

    def lookup(self, name: str) -> str | None:
        return self.shell[name] if name in self.shell else self.environ.get(name)

    def segments(self, parts: Sequence[_Part], *, split_literals: bool = False) -> list[tuple[str, bool]]:
        """``(text, splittable)`` pieces of a word: an unquoted expansion is splittable, and so is the unquoted
        text of an unquoted ``${VAR:-default}``'s default (``split_literals``)."""
        out: list[tuple[str, bool]] = []
        for p in parts:
            if p[0] == "lit":
                out.append((p[1], split_literals and not p[2]))
                continue
            _, name, op, default, quoted, line = p
            value = self.lookup(name)
            if (op == ":-" and not value) or (op == "-" and value is None):
                out += self.segments(default, split_literals=not quoted)
                continue
            if value is None:
                raise InputError(f"line {line}: ${name} is not set (neither by the command's own lines nor in "
                                 f"this environment); set it, or write the value", **self.where)
            out.append((value, not quoted))
        return out

    def words(self, word: _Word) -> list[str]:
        """A word after expansion and field splitting: none, one or several."""
        parts = list(word.parts)
        if parts and parts[0][0] == "lit" and not parts[0][2]:
            parts = self._tilde(parts)
        fields: list[str] = []
        current: list[str] = []
        has_field = any(p[0] == "lit" and (p[2] or p[1]) for p in parts)
        for text, split in self.segments(parts):
            if not split:
                current.append(text)
                continue
            pieces = re.split(r"[ \t\n]+", text)
            if len(pieces) == 1:
                current.append(text)
                continue
            current.append(pieces[0])
            if "".join(current):
                fields.append("".join(current))
            fields += [p for p in pieces[1:-1] if p]
            current = [pieces[-1]]
        if "".join(current) or (has_field and not fields):
            fields.append("".join(current))
        return fields

    def one(self, parts: Sequence[_Part]) -> str:
        """An assignment's value: expanded, never split (POSIX 2.9.1)."""
        return "".join(text for text, _ in self.segments(parts))

    @staticmethod
    def _tilde(parts: list[_Part]) -> list[_Part]:
        """A leading unquoted ``~`` or ``~/``: the home directory."""
        joined = ""
        k = 0
        while k < len(parts) and parts[k][0] == "lit" and not parts[k][2]:
            joined += parts[k][1]
            k += 1
        if joined == "~" or joined.startswith("~/"):
            return [("lit", os.path.expanduser("~") + joined[1:], True), *parts[k:]]
        return parts


def _assignment(word: _Word) -> tuple[str, list[_Part]] | None:
    """``NAME=value`` -> (NAME, the value's parts); None for any other word."""
    head = ""
    for k, p in enumerate(word.parts):
        if p[0] != "lit" or p[2]:
            break
        head += p[1]
        m = _ASSIGNMENT.match(head)
        if m:
            rest = head[m.end():]
            value = ([("lit", rest, False)] if rest else []) + list(word.parts[k + 1:])
            if value and value[0][0] == "lit" and not value[0][2] and (value[0][1] == "~" or
                                                                         value[0][1].startswith("~/")):
                value = [("lit", os.path.expanduser("~") + value[0][1][1:], True), *value[1:]]
            return m.group(1), value
    return None


def _only_comments(rest: str) -> bool:
    """Whether ``rest`` holds nothing the shell would run: blank lines and ``#`` comments."""
    return all(not line.strip() or line.strip().startswith("#") for line in rest.splitlines())


def _literal(word: _Word) -> str | None:
    """The word's text when it is plain unquoted literal text (a keyword such as ``export``), else None."""
    if all(p[0] == "lit" and not p[2] for p in word.parts):
        return "".join(p[1] for p in word.parts)
    return None


def flag_values(args: Sequence[str], *names: str) -> list[str]:
    """Every value the engine's words give any of the flags ``names`` (``--flag value`` or ``--flag=value``), in
    order: argparse keeps the last one, so ``flag_values(...)[-1:]`` is what the engine reads."""
    out = []
    for i, a in enumerate(args):
        if a in names and i + 1 < len(args):
            out.append(args[i + 1])
        elif "=" in a and a.split("=", 1)[0] in names:
            out.append(a.split("=", 1)[1])
    return out


def read_launch(text: str, *, source: str, path: str | Path | None = None, cwd: str | Path | None = None,
                environ: Mapping[str, str] | None = None) -> LaunchCommand:
    """Read a deploy command (or a short script ending in one) as the shell would run it.

    ``source`` names where it came from in errors (``--launch``, ``--launch-file``, a pyproject key), ``path``
    its file; ``cwd`` is the directory its relative paths mean (default: this process's); ``environ`` the
    caller's environment (default: ``os.environ``). Raises :class:`InputError` naming the line for anything that
    is not one engine command, ``export``/assignment lines, ``set`` lines or comments.
    """
    where: dict[str, Any] = {"path": path, "field": source}
    if not text.strip():
        raise InputError("the launch command is empty", **where)
    scanner = _Scanner(text, where=where)
    statements = scanner.statements()
    expander = _Expander(os.environ if environ is None else environ, where=where)
    command: LaunchCommand | None = None
    setup: list[str] = []
    for st in statements:
        written = text[st.first:st.last].strip() or "".join(str(p[1]) for p in st.words[0].parts)
        head = _literal(st.words[0])
        if command is not None:
            raise InputError(f"line {st.line}: a statement after the launch command ({written.splitlines()[0]!r}); "
                             "give one command, with export lines before it", **where)
        if head == "set":
            setup.append(written)
            continue
        if head == "export":
            for w in st.words[1:]:
                a = _assignment(w)
                name = a[0] if a else _literal(w)
                if name is None or not _NAME.fullmatch(name):
                    raise InputError(f"line {w.line}: export takes NAME=value, got {written!r}", **where)
                if a is not None:
                    expander.shell[name] = expander.one(a[1])
                value = expander.lookup(name)
                if value is None:
                    raise InputError(f"line {w.line}: export {name}: ${name} is not set", **where)
                expander.exported[name] = value
            continue
        assignments = []
        k = 0
        while k < len(st.words) and (a := _assignment(st.words[k])) is not None:
            assignments.append(a)
            k += 1
        if k == len(st.words):  # only assignments: shell variables, expanded in order
            for var, parts in assignments:
                expander.shell[var] = expander.one(parts)
                if var in expander.exported:
                    expander.exported[var] = expander.shell[var]
            setup.append(written)
            continue
        command = _command(st, assignments, k, expander, text=text, source=source, path=path,
                           cwd=cwd, setup=setup, where=where)
    if command is None:
        raise InputError("no command that starts SGLang or vLLM: only assignments, exports or comments", **where)
    if scanner.background:  # the last statement ended in '&', and nothing may follow the command: it is the command
        command = replace(command, background=True)
    return command


def _command(st: _Statement, assignments: list[tuple[str, list[_Part]]], k: int, expander: _Expander, *,
             text: str, source: str, path: str | Path | None, cwd: str | Path | None, setup: list[str],
             where: dict[str, Any]) -> LaunchCommand:
    # the command's words are expanded before its prefix assignments take effect (POSIX 2.9.1)
    words: list[str] = []
    lines: list[int] = []
    for w in st.words[k:]:
        for x in expander.words(w):
            words.append(x)
            lines.append(w.line)
    env = dict(expander.exported)
    for var, parts in assignments:
        env[var] = expander.one(parts)
    # wrappers that run the engine in the same process environment: exec, nohup, env NAME=value
    while words and (words[0] in _WRAPPERS or words[0] == "env"):
        wrapper = words.pop(0)
        lines.pop(0)
        while wrapper == "env" and words and _ASSIGNMENT.match(words[0]):
            var, _, value = words.pop(0).partition("=")
            lines.pop(0)
            env[var] = value
    if not words:
        raise InputError(f"line {st.line}: no program to run", **where)
    if words[0] in _SHELL_STATE:
        raise InputError(f"line {st.line}: {' '.join(words[:3])!r} changes the shell itself, which specparity does "
                         "not run: give the interpreter that serves with --python, variables as export lines, and "
                         "run specparity from the server's directory", **where)
    engine, entry, n = _program(words, line=st.line, where=where)
    first = lines[0] if lines else st.line
    return LaunchCommand(text=text, source=source, path=None if path is None else str(path),
                         cwd=str(Path(cwd) if cwd is not None else Path.cwd()), env=env, program=tuple(words[:n]),
                         args=tuple(words[n:]), engine=engine, entry=entry, line=first,
                         arg_lines=tuple(lines[n:]), setup=tuple(setup))


def _program(words: Sequence[str], *, line: int, where: dict[str, Any]) -> tuple[Engine, str, int]:
    """``(engine, entry, number of words that name the program)`` for the command's first words."""
    name = Path(words[0]).name
    if name in _CONSOLE_SCRIPTS and len(words) > 1 and words[1] == "serve":
        engine, entry = _CONSOLE_SCRIPTS[name]
        return engine, entry, 2
    if _PYTHON.match(name):
        k = 1
        while k < len(words) and words[k] != "-m":
            if words[k] in _PY_FLAGS:
                k += 1
            elif words[k] in _PY_FLAGS_WITH_VALUE:
                k += 2
            else:
                break
        if k + 1 < len(words) and words[k] == "-m":
            module = words[k + 1]
            if module in _PYTHON_MODULES:
                after, engine, entry = _PYTHON_MODULES[module]
                if tuple(words[k + 2:k + 2 + len(after)]) == after:
                    return engine, entry, k + 2 + len(after)
                found = " ".join(words[:k + 2 + len(after)])
            else:
                found = " ".join(words[:k + 2])
        else:
            found = " ".join(words[:k + 1])
    else:
        found = " ".join(words[:2]) if name in _CONSOLE_SCRIPTS else words[0]
    known = ", ".join(["python -m sglang.launch_server", "sglang serve", "python -m sglang.cli.main serve",
                       "vllm serve", "python -m vllm.entrypoints.openai.api_server",
                       "python -m vllm.entrypoints.cli.main serve", "python -m dynamo.sglang",
                       "python -m dynamo.vllm"])
    raise InputError(f"line {line}: {found!r} starts neither engine; specparity reads {known}", **where)
