"""A warm parent for engine children: import the engine once, fork one fresh process per job.

``python -m specparity.serving.child.zygote WORKER_MODULE DEVICE`` runs in the engine's interpreter with the
child environment :func:`specparity.serving.child.process.child_env` builds. It calls ``WORKER_MODULE.warm(DEVICE)``
once (the worker's own set-up: environment variables, the ``sgl_kernel`` stand-in where needed, the adapter and
the engine modules it imports; no model, no distributed state, no forward), then serves jobs read from stdin as
JSON lines::

    {"job": 3, "argv": ["REQUEST.json", "OUT_DIR"], "stdout": "PATH", "stderr": "PATH", "env": {...}}

For each job it forks. The forked process starts its own session (so a timeout kills its whole process
group, as for a cold child), takes the job's environment (what a cold child would get now; the zygote's own
was fixed when it started), sends its stdout/stderr to the given files and runs
``WORKER_MODULE.run(argv, warm_state)``: the same code path as a cold ``python -m WORKER_MODULE``, in a process
that holds no state of any earlier job. The zygote answers on stdout::

    {"zygote": 1, "pid": PID}         at once, before importing anything of the engine
    {"ready": true, "pid": PID}       once warm
    {"job": 3, "pid": 4711}           the job's process
    {"pid": 4711, "exit": 0}          its exit status (negative: killed by that signal)

Why: importing torch and SGLang costs ~20 CPU-s per child on 2 cores, ~80% of a small deployment's whole
check (measured on the bundled example: resolve 22.5 CPU-s, of which imports 21). A session that checks many
deployments (the pytest plugin with several ``[tool.specparity.deployments]``, the test matrix) pays it
once per interpreter instead of once per child. Enabled by ``SPECPARITY_WARM_START=1``
(:mod:`specparity.serving.child.process`).

Fork safety: the zygote never runs a job, a model or a torch op itself; after ``warm`` it holds only
imported modules (one Python thread). A job's process initialises torch's thread pools, torch.distributed and
SGLang's runtime state itself, exactly as a cold child does. Two things a fork could carry over are handled:

- **Environment.** A job runs under the environment a cold child would get now (sent with the job), plus what
  ``warm`` itself set (e.g. ``SGLANG_USE_CPU_ENGINE``, which a cold child sets in the same code before the
  same imports).
- **CUDA.** Touching CUDA in a CUDA build of torch (SGLang's imports ask for the device count, and some model
  files try ``get_device_capability``) registers torch's fork guard, after which every forked child raises
  "Cannot re-initialize CUDA in forked subprocess" where a fresh process raises "Found no NVIDIA driver" or uses
  the GPU. So the zygote first asks a fresh interpreter of this environment (a subprocess) what those two calls
  give here. Where there is **no** CUDA device, ``warm`` runs while ``torch._C._cuda_getDeviceCount`` and
  ``torch._C._cuda_init`` give exactly that answer (0, and the same exception) without the real calls; both are
  restored after ``warm``, so a job calls the real ones. Where a GPU is visible, or a probe fork still finds
  the guard set, the zygote answers ``{"ready": false, "why": ...}`` and every job starts cold.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import subprocess
import sys
import traceback
from collections.abc import Iterator
from typing import Any

# What a fresh interpreter's torch says about CUDA here: its device count, and what CUDA's init raises.
_CUDA_FACTS = """
import json, torch
facts = {"built": bool(torch.backends.cuda.is_built()), "count": None, "init_error": None}
if facts["built"]:
    facts["count"] = torch.cuda.device_count()
    if facts["count"] == 0:
        try:
            torch._C._cuda_init()
        except BaseException as e:
            facts["init_error"] = [type(e).__module__, type(e).__qualname__, str(e)]
print(json.dumps(facts))
"""


def _say(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def _run_job(worker: Any, state: Any, job: dict[str, Any]) -> int:
    """In the forked process: a new session, the job's own stdio, the worker's run; never returns."""
    code = 1
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        out = os.open(job["stdout"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        err = os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in (devnull, out, err):
            os.close(fd)
        if job.get("env") is not None:
            os.environ.clear()
            os.environ.update(job["env"])
        code = int(worker.run(list(job["argv"]), state))
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        # like the cold worker: skip interpreter teardown (SGLang leaves threads behind)
        os._exit(code)


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _say({"pid": pid, "exit": os.waitstatus_to_exitcode(status)})


def _fresh_cuda_facts() -> dict[str, Any]:
    """:data:`_CUDA_FACTS`, run in a fresh interpreter of this environment."""
    out = subprocess.run([sys.executable, "-c", _CUDA_FACTS], capture_output=True, text=True, timeout=600,
                         check=True)
    facts: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return facts


@contextlib.contextmanager
def _cuda_answers_without_fork_guard(init_error: BaseException) -> Iterator[None]:
    """While the engine is imported: torch's device-count query gives 0 and CUDA's init raises ``init_error``,
    what a fresh interpreter measured here, without the real calls (which register torch's fork guard)."""
    import torch

    real_count, real_init = torch._C._cuda_getDeviceCount, torch._C._cuda_init

    def no_driver() -> None:
        raise type(init_error)(*init_error.args)

    torch._C._cuda_getDeviceCount = lambda: 0
    torch._C._cuda_init = no_driver
    try:
        yield
    finally:
        torch._C._cuda_getDeviceCount, torch._C._cuda_init = real_count, real_init


def _forked_child_is_fresh() -> bool:
    """A probe fork: is a child of this zygote free of torch's CUDA bad-fork state?"""
    pid = os.fork()
    if pid == 0:
        torch = sys.modules.get("torch")
        os._exit(1 if torch is not None and torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _warm(worker: Any, device: str) -> tuple[Any, str | None]:
    """``worker.warm(device)`` under the CUDA precautions; (state, why this zygote cannot serve)."""
    import builtins
    import importlib.util

    # torch imported here, not left to the worker's warm(): the precautions below must be in place before the first
    # CUDA query, whichever module makes it (the worker may import torch only inside warm())
    torch = importlib.import_module("torch") if importlib.util.find_spec("torch") is not None else None
    guard: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if torch is not None and torch.backends.cuda.is_built():
        facts = _fresh_cuda_facts()
        if facts["count"] != 0:
            return None, f"{facts['count']} CUDA device(s) visible: a forked child could not use CUDA; jobs start cold"
        module, name, message = facts["init_error"] or ("", "", "")
        error_type = getattr(builtins, name, None) if module == "builtins" else None
        if not (isinstance(error_type, type) and issubclass(error_type, BaseException)):
            return None, f"CUDA's init raises {module}.{name} here, which the zygote cannot replay; jobs start cold"
        guard = _cuda_answers_without_fork_guard(error_type(message))
    state = None
    with guard:
        try:
            state = worker.warm(device)
        except BaseException:  # a warm-up that fails is reported by every job, as a cold child would
            traceback.print_exc()
    if not _forked_child_is_fresh():
        return None, "the engine's import left torch's CUDA fork guard set; jobs start cold"
    return state, None


def serve(module: str, device: str) -> int:
    # first, before any import of the engine: this interpreter runs the zygote protocol (warm.py gives up on an
    # interpreter whose first line is anything else, e.g. a wrapper script, and starts that job cold)
    _say({"zygote": 1, "pid": os.getpid()})
    worker = importlib.import_module(module)
    before = dict(os.environ)
    state, why = _warm(worker, device)
    warm_env = {k: v for k, v in os.environ.items() if before.get(k) != v}  # what warm() set, a cold child too
    if why is not None:
        _say({"ready": False, "why": why, "pid": os.getpid()})
        return 0
    _say({"ready": True, "pid": os.getpid()})
    buffer = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.2)
        _reap()
        if not ready:
            continue
        chunk = os.read(0, 65536)
        if not chunk:  # the parent closed our stdin (or died): stop; running jobs finish in their sessions
            return 0
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if not line.strip():
                continue
            job = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            if job.get("env") is not None:
                job["env"] = {**job["env"], **warm_env}
            pid = os.fork()
            if pid == 0:
                _run_job(worker, state, job)
            _say({"job": job["job"], "pid": pid})


if __name__ == "__main__":
    raise SystemExit(serve(sys.argv[1], sys.argv[2]))
