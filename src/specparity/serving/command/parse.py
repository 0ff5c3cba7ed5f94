"""The deploy command as the engine itself parses it: :class:`LaunchSpec` and :func:`parse_launch`.

The shell layer (:mod:`specparity.deploy_command`) says which program runs with which words and environment; this
module asks the engine which deployment those words are. The parse runs in the engine's own interpreter, with its
own parser (``python -m specparity.serving.<engine>.command_parse``: SGLang's ``prepare_server_args``, vLLM's
``make_arg_parser`` on a ``FlexibleArgumentParser``), so abbreviations, ``--config`` YAML, JSON-valued flags, ``-tp``
and a positional model mean exactly what they mean to that release. Engine-neutral: an engine's name appears here
only as the child module to run.

Which interpreter parses: ``python=`` when given; else the interpreter the command names by path
(``/opt/venv/bin/python -m sglang.launch_server``, or the ``#!`` line of a console script given by path,
``.venv/bin/vllm serve``); else this one. The same interpreter then serves the gate's checks.

Relative paths in the command mean what they mean to the shell that runs it: the command's ``cwd`` (the caller's
directory; a pyproject key's file's directory). The spec's ``target`` and ``draft`` are absolute.

Exit codes: bad input (a flag the engine's parser rejects, a ``--config`` file it cannot read, a model path that does
not exist here) is :class:`~specparity.errors.InputError` (2) naming the flag and the line; an engine that cannot be
imported in that interpreter, a crash or a timeout is :class:`~specparity.errors.EnvironmentProblem` (3).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specparity.deploy_command import LaunchCommand
from specparity.errors import EnvironmentProblem, InputError
from specparity.serving import engine_values
from specparity.serving.child import reaper, warm
from specparity.serving.command.parse_child import RESULT_PREFIX

ENGINE_LABELS = {"sglang": "SGLang", "vllm": "vLLM"}
_PYTHON_MODULE_ENTRIES = ("sglang.cli.main", "vllm.entrypoints.cli.main")


@dataclass(frozen=True)
class LaunchSpec:
    """One deploy command and the deployment its engine parses from it.

    ``parsed`` is every argument the engine's parser produced (JSON-safe, secrets left out), ``explicit`` the ones
    the command gave; ``engine_args`` the keywords the gate's resolve and capture take (SGLang ``ServerArgs``
    keywords; vLLM ``EngineArgs`` keywords plus ``num_speculative_tokens``), only what the command set, encoded so
    that the engine's child rebuilds the values its parser made (:mod:`specparity.serving.engine_values`), and
    ``engine_args_shown`` their plain view (what reports print); ``target``
    and ``draft`` absolute local directories (``target_flag``/``draft_flag`` name where the command set them);
    ``speculative`` the speculative settings as parsed (``algorithm`` for SGLang, ``method`` and
    ``effective_method`` for vLLM, and the triple); ``resolved`` what the engine resolves from them where it says
    before start-up (SGLang ``resolved_dict()``; None otherwise); ``rewrite_rule`` the file:line of the engine's
    num_draft_tokens rule in the installed release; ``python`` the interpreter that parsed.
    ``api_key_set`` says whether the command gives an API key, never the key; ``secret_args`` are the indices of
    ``command.args`` that hold one. :meth:`to_dict` is safe to print (the command redacted).
    """

    command: LaunchCommand
    engine: str
    engine_version: str
    parsed: dict[str, Any] = field(hash=False)
    target: str
    draft: str | None
    engine_args: dict[str, Any] = field(hash=False)
    host: str | None = None
    port: int | None = None
    api_key_set: bool = False
    notes: tuple[str, ...] = ()
    python: str = ""
    parser: str = ""
    explicit: tuple[str, ...] = ()
    target_name: str = ""
    target_flag: str = ""
    draft_name: str | None = None
    draft_flag: str | None = None
    draft_from_config: dict[str, str] | None = field(default=None, hash=False)
    speculative: dict[str, Any] = field(default_factory=dict, hash=False)
    resolved: dict[str, Any] | None = field(default=None, hash=False)
    rewrite_rule: str | None = None
    package_dir: str | None = None
    secret_args: tuple[int, ...] = ()
    timings: dict[str, float] = field(default_factory=dict, hash=False)
    engine_args_shown: dict[str, Any] | None = field(default=None, hash=False)

    def shown_args(self) -> dict[str, Any]:
        """The engine arguments as plain JSON, for people: the parse's own view, else the encoding's."""
        if self.engine_args_shown is not None:
            return dict(self.engine_args_shown)
        return {k: engine_values.shown(v) for k, v in self.engine_args.items()}

    def shown_command(self) -> LaunchCommand:
        """The command with its secrets replaced by ``***`` (what reports print)."""
        return self.command.redacted(self.secret_args)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON, safe to print: the command redacted (``command.text`` as given, ``***`` for a key)."""
        shown = self.shown_command()
        return {
            "command": {"text": shown.text, "one_line": shown.one_line(), "source": shown.source,
                        "path": shown.path, "cwd": shown.cwd, "env": dict(shown.env), "program": list(shown.program),
                        "args": list(shown.args), "entry": shown.entry, "line": shown.line},
            "engine": self.engine, "engine_version": self.engine_version, "parser": self.parser,
            "python": self.python, "target": self.target, "target_name": self.target_name,
            "target_flag": self.target_flag, "draft": self.draft, "draft_name": self.draft_name,
            "draft_flag": self.draft_flag, "draft_from_config": self.draft_from_config,
            "engine_args": self.shown_args(), "engine_args_encoded": dict(self.engine_args),
            "speculative": dict(self.speculative), "resolved": self.resolved,
            "rewrite_rule": self.rewrite_rule, "host": self.host, "port": self.port,
            "api_key_set": self.api_key_set, "explicit": list(self.explicit), "notes": list(self.notes),
            "timings": dict(self.timings),
        }

    def lines(self) -> list[str]:
        """The launch block of a terminal report: the command as given (redacted) and the engine's parse of it."""
        shown = self.shown_command()
        label = ENGINE_LABELS.get(self.engine, self.engine)
        where = f"{shown.source}" + (f" {shown.path}" if shown.path else "")
        args = ", ".join(f"{k}={json.dumps(v)}" for k, v in self.shown_args().items()) or "none"
        out = [f"launch   {shown.one_line()}  ({where}, line {shown.line})",
               f"parsed   by {label} {self.engine_version}'s own parser ({self.parser}), in {self.python}",
               f"target   {self.target}  (from {self.target_flag})"]
        if self.draft is not None:
            out.append(f"draft    {self.draft}  (from {self.draft_flag})")
        out.append(f"args     {args}")
        if self.resolved:
            changed = {k: v for k, v in self.resolved.items()
                       if k in self.parsed and self.parsed.get(k) is not None and self.parsed.get(k) != v}
            if changed:
                out.append("resolved " + ", ".join(f"{k}: {self.parsed.get(k)!r} -> {v!r}" for k, v in changed.items())
                           + f" ({label}'s own resolution)")
        out += [f"note     {n}" for n in self.notes]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LaunchSpec:
        """Read :meth:`to_dict` back (the command as it was printed: redacted)."""
        c = d["command"]
        command = LaunchCommand(text=c["text"], source=c["source"], path=c.get("path"), cwd=c["cwd"],
                                env=dict(c.get("env") or {}), program=tuple(c["program"]), args=tuple(c["args"]),
                                engine=d["engine"], entry=c["entry"], line=int(c.get("line", 1)))
        return cls(command=command, engine=d["engine"], engine_version=d["engine_version"], parsed={},
                   target=d["target"], draft=d.get("draft"),
                   engine_args=dict(d.get("engine_args_encoded", d.get("engine_args")) or {}),
                   engine_args_shown=dict(d.get("engine_args") or {}),
                   host=d.get("host"), port=d.get("port"), api_key_set=bool(d.get("api_key_set")),
                   notes=tuple(d.get("notes") or ()), python=d.get("python") or "", parser=d.get("parser") or "",
                   explicit=tuple(d.get("explicit") or ()), target_name=d.get("target_name") or "",
                   target_flag=d.get("target_flag") or "", draft_name=d.get("draft_name"),
                   draft_flag=d.get("draft_flag"), draft_from_config=d.get("draft_from_config"),
                   speculative=dict(d.get("speculative") or {}), resolved=d.get("resolved"),
                   rewrite_rule=d.get("rewrite_rule"), timings=dict(d.get("timings") or {}))


def interpreter_for(command: LaunchCommand, python: str | None = None) -> str:
    """The interpreter whose engine parses (and serves) the command (module docstring)."""
    if python:
        return python
    if command.python:
        return command.python
    first = command.program[0]
    if os.sep in first and command.program[-1] == "serve":  # a console script by path: its own interpreter
        script = Path(first) if Path(first).is_absolute() else Path(command.cwd) / first
        try:
            with open(script, encoding="utf-8", errors="replace") as f:
                shebang = f.readline()
        except OSError:
            shebang = ""
        if shebang.startswith("#!") and "python" in shebang:
            return shebang[2:].strip().split()[0]
    return sys.executable


def parse_launch(command: LaunchCommand, *, python: str | None = None, timeout_s: float = 180,
                 device: str = "cpu", resolve: bool = True) -> LaunchSpec:
    """Parse ``command`` with its engine's own parser, in the engine's interpreter (module docstring).

    ``device`` is where the engine's own resolution may probe (``cpu`` on a machine without the deployment's GPU);
    ``resolve=False`` skips SGLang's resolution (the parse alone). Raises :class:`InputError` for input the engine
    rejects or a model path that does not exist here, :class:`EnvironmentProblem` when the engine cannot run.
    """
    from specparity.serving.child.process import child_env

    interpreter = interpreter_for(command, python)
    module = f"specparity.serving.{command.engine}.command_parse"
    request = {"entry": command.entry, "args": list(command.args), "cwd": command.cwd, "device": device,
               "resolve": resolve,
               "module": next((m for m in _PYTHON_MODULE_ENTRIES if m in command.program[:-1]), None)}
    t0 = time.perf_counter()
    label = ENGINE_LABELS[command.engine]

    def env_for(work: Path) -> dict[str, str]:
        env = child_env(work, python=interpreter, base={**os.environ, **command.env})
        if command.env.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.pathsep.join((env["PYTHONPATH"], command.env["PYTHONPATH"]))
        return env

    with reaper.temp_dir("specparity-launch-") as work:
        got = _run_warm(interpreter, module, request, env_for=env_for, work=work, command=command,
                        device=device, timeout_s=timeout_s, label=label) if warm.enabled() else None
        answer, stderr = got or _run_child(interpreter, module, request, env=env_for(work), cwd=command.cwd,
                                           timeout_s=timeout_s, label=label)
    elapsed = time.perf_counter() - t0
    return _spec(command, answer, stderr=stderr, interpreter=interpreter, elapsed=elapsed)


def _run_warm(interpreter: str, module: str, request: dict[str, Any], *, env_for: Callable[[Path], dict[str, str]],
              work: Path, command: LaunchCommand, device: str, timeout_s: float,
              label: str) -> tuple[dict[str, Any], str] | None:
    """The parse as a job forked from a zygote that has imported the engine's parser (``SPECPARITY_WARM_START=1``,
    :mod:`specparity.serving.child.warm`): the same module's same ``parse``, in a fresh process of its own session, with
    the environment and working directory a cold child gets; a command's own variables get a zygote of their own.
    About 2 s instead of ~9 CPU-s of imports per parse on this CPU (the test suites parse each published command in
    every SGLang env). None: no zygote can serve; the caller parses cold."""
    request_file = work / "request.json"
    request_file.write_text(json.dumps(request))
    deadline = time.monotonic() + timeout_s
    child = warm.start_job(interpreter, module, device, [str(request_file)], work, env_for=env_for,
                           on_stdout=lambda _line: None, deadline=deadline, cwd=command.cwd,
                           key_extra=json.dumps(sorted(command.env.items())))
    if child is None:
        return None
    try:
        while (code := child.poll()) is None:
            if time.monotonic() >= deadline:
                raise EnvironmentProblem(f"{label}'s parse of the launch command did not finish within "
                                         f"{timeout_s:g} s in {interpreter}")
            time.sleep(0.05)
    finally:  # also on Ctrl-C: never leave the job behind
        child.kill()
    try:
        out = child.stdout.read_text(errors="replace")
    except OSError:
        out = ""
    err = "\n".join(child.stderr_lines())
    return _answer(out, err, code, label=label, interpreter=interpreter), err


def _run_child(interpreter: str, module: str, request: dict[str, Any], *, env: dict[str, str], cwd: str,
               timeout_s: float, label: str) -> tuple[dict[str, Any], str]:
    try:
        # a child of the run like the engine's (serving/child/reaper.py): marked, dies with the gate, its group stopped by
        # the watchdog if the gate is killed while the engine's parser reads the command
        proc = subprocess.Popen([interpreter, "-m", module], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=reaper.marked_env(env), cwd=cwd,
                                start_new_session=True, preexec_fn=reaper.child_preexec())
    except OSError as e:
        raise EnvironmentProblem(f"cannot start the interpreter {interpreter!r} to parse the launch command: {e}") \
            from None
    reaper.adopt_group(proc.pid)
    try:
        out, err = proc.communicate(json.dumps(request), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise EnvironmentProblem(f"{label}'s parse of the launch command did not finish within {timeout_s:g} s "
                                 f"in {interpreter}") from None
    finally:  # also on Ctrl-C: never leave the child behind
        if proc.poll() is None:
            _kill(proc)
        reaper.release_group(proc.pid)
    return _answer(out, err, proc.returncode, label=label, interpreter=interpreter), err


def _answer(out: str, err: str, code: int | None, *, label: str, interpreter: str) -> dict[str, Any]:
    line = next((x for x in reversed(out.splitlines()) if x.startswith(RESULT_PREFIX)), None)
    if line is None:
        tail = "\n".join(err.strip().splitlines()[-15:])
        raise EnvironmentProblem(f"{label}'s parse of the launch command ended (exit {code}) without an "
                                 f"answer in {interpreter}; stderr tail:\n{tail}")
    answer: dict[str, Any] = json.loads(line[len(RESULT_PREFIX):])
    return answer


def _kill(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _flag_line(command: LaunchCommand, flag: str | None) -> str:
    """`` (line N)`` for the first argument that spells ``flag`` (or abbreviates it), else the command's line."""
    if flag:
        for i, a in enumerate(command.args):
            word = a.split("=", 1)[0]
            if word == flag or (word.startswith("--") and len(word) > 3 and flag.startswith(word)):
                return f" (line {command.line_of(i)})"
    return f" (line {command.line})"


def _spec(command: LaunchCommand, a: dict[str, Any], *, stderr: str, interpreter: str, elapsed: float) -> LaunchSpec:
    label = ENGINE_LABELS[command.engine]
    where: dict[str, Any] = {"path": command.path, "field": command.source}
    if not a.get("ok"):
        kind, message = a.get("kind"), str(a.get("message"))
        if kind == "bad_input":
            flag = a.get("flag")
            named = f"{flag}: " if flag and flag not in message else ""
            history = _history(command.engine, message, flag, a.get("engine_version"), interpreter)
            raise InputError(f"{label} rejects the command{_flag_line(command, flag)}: {named}{message}{history}",
                             **where)
        raise EnvironmentProblem(f"{label}'s parse of the launch command could not run in {interpreter} "
                                 f"({kind}): {message}")
    notes = [*command.notes(), *(a.get("notes") or ())]
    target = a.get("target")
    if not target:
        raise InputError(_missing(command, a.get("target_flag"), a.get("target_name"), "target"), **where)
    draft = a.get("draft")
    if a.get("draft_name") and not draft:
        raise InputError(_missing(command, a.get("draft_flag"), a.get("draft_name"), "draft"), **where)
    engine_args = dict(a.get("engine_args") or {})
    shown = dict(a["engine_args_shown"]) if isinstance(a.get("engine_args_shown"), dict) else None
    for args in (engine_args, shown or {}):
        spec_cfg = args.get("speculative_config")
        if isinstance(spec_cfg, dict) and draft and spec_cfg.get("model"):
            args["speculative_config"] = {**spec_cfg, "model": draft}  # absolute: the gate's child runs elsewhere
    return LaunchSpec(
        command=command, engine=str(a["engine"]), engine_version=str(a["engine_version"]),
        parsed=dict(a.get("parsed") or {}), target=str(target), draft=None if draft is None else str(draft),
        engine_args=engine_args, engine_args_shown=shown, host=a.get("host"), port=a.get("port"),
        api_key_set=bool(a.get("api_key_set")),
        notes=tuple(notes), python=str(a.get("python") or interpreter), parser=str(a.get("parser") or ""),
        explicit=tuple(a.get("explicit") or ()), target_name=str(a.get("target_name") or ""),
        target_flag=str(a.get("target_flag") or ""), draft_name=a.get("draft_name"), draft_flag=a.get("draft_flag"),
        draft_from_config=a.get("draft_from_config"), speculative=dict(a.get("speculative") or {}),
        resolved=a.get("resolved"), rewrite_rule=a.get("rewrite_rule"), package_dir=a.get("package_dir"),
        secret_args=tuple(int(i) for i in a.get("secret_args") or ()), timings={"parse_s": round(elapsed, 3)})


def _history(engine: str, message: str, flag: str | None, version: Any, interpreter: str) -> str:
    """For a flag the installed release rejects as unknown or ambiguous: the releases that accept it, and
    ``--python`` (serving/flag_history.py). Never changes the answer: the data missing is no note."""
    from specparity.serving.flag_history import history_notes

    try:
        note = history_notes(engine, message, flag, installed=str(version or "?"))
    except (OSError, ValueError, KeyError):
        return ""
    return note + (f" (this parse ran in {interpreter})" if note else "")


def _missing(command: LaunchCommand, flag: str | None, name: str | None, role: str) -> str:
    if not name:
        return f"the command names no {role} model (the engine's parser found none)"
    if flag == "speculators_config.verifier.name_or_path":
        return (f"the draft's {flag} is {name!r}, which is not a directory here: vLLM serves it as the target and "
                f"reads it relative to the server's directory ({command.cwd})")
    return (f"{flag} {name!r}{_flag_line(command, flag)} is not a directory here (relative paths are read from "
            f"{command.cwd}) nor a Hugging Face id in this machine's cache: specparity reads the {role}'s files, "
            "give a local path")
