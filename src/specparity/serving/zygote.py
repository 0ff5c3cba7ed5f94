"""A warm parent for engine children: import the engine once, fork one fresh process per job.

``python -m specparity.serving.zygote WORKER_MODULE DEVICE`` runs in the engine's interpreter with the
child environment :func:`specparity.serving.process.child_env` builds. It calls ``WORKER_MODULE.warm(DEVICE)``
once (the worker's own set-up: environment variables, the ``sgl_kernel`` stand-in where needed, the adapter and
the engine modules it imports; no model, no distributed state, no forward), then serves jobs read from stdin as
JSON lines::

    {"job": 3, "argv": ["REQUEST.json", "OUT_DIR"], "stdout": "PATH", "stderr": "PATH"}

For each job it forks. The forked process starts its own session (so a timeout kills its whole process
group, as for a cold child), sends its stdout/stderr to the given files and runs
``WORKER_MODULE.run(argv, warm_state)``: the same code path as a cold ``python -m WORKER_MODULE``, in a process
that holds no state of any earlier job. The zygote answers on stdout::

    {"ready": true, "pid": PID}       once warm
    {"job": 3, "pid": 4711}           the job's process
    {"pid": 4711, "exit": 0}          its exit status (negative: killed by that signal)

Why: importing torch and SGLang costs ~20 CPU-s per child on 2 cores, ~80% of a small deployment's whole
check (measured on the bundled example: resolve 22.5 CPU-s, of which imports 21). A session that checks many
deployments (the pytest plugin with several ``[tool.specparity.deployments]``, the test matrix) pays it
once per interpreter instead of once per child. Enabled by ``SPECPARITY_WARM_START=1``
(:mod:`specparity.serving.process`).

Fork safety: the zygote never runs a job, a model or a torch op itself; after ``warm`` it holds only
imported modules (one Python thread). A job's process initialises torch's thread pools, torch.distributed and
SGLang's runtime state itself, exactly as a cold child does.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import sys
import traceback
from typing import Any


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


def serve(module: str, device: str) -> int:
    worker = importlib.import_module(module)
    try:
        state = worker.warm(device)
    except BaseException:  # a warm-up that fails is reported by every job, as a cold child would
        traceback.print_exc()
        state = None
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
            pid = os.fork()
            if pid == 0:
                _run_job(worker, state, job)
            _say({"job": job["job"], "pid": pid})


if __name__ == "__main__":
    raise SystemExit(serve(sys.argv[1], sys.argv[2]))
