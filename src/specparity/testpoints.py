"""Test-only: named points where a run waits, so that a test can signal it at a known moment (tests/faults).

Inert unless :data:`PAUSE_ENV` is set, which nothing but the fault tier does (never set it in a deployment). Its
value ``POINT@DIR`` makes every process of the run that reaches the point named ``POINT`` create
``DIR/POINT.<pid>`` and then wait until ``DIR/POINT.go`` exists (it goes on), a signal ends the wait (a handler that
raises, or the signal's default action), or :data:`PAUSE_MAX_S` pass (it goes on). The variable reaches every process
the run starts (the engine child, the warm-start zygote, a launched server), as any environment variable does.

The points (each ``pause("name")`` call is the only trace in the code):

- ``engine_import``: the engine child (or the zygote) is about to import SGLang (serving/sglang/worker.py ``prepare``)
  or vLLM (serving/vllm/worker.py ``main``, and ``warm`` in a zygote);
- ``model_load``: SGLang is imported and its target worker is about to load the model
  (serving/sglang/since_0_5_11/run.py ``start_workers``);
- ``capture``: the engine is up and the tapped prefill is about to run (serving/sglang/run_common.py
  ``capture_forward``; vLLM: serving/vllm/worker.py ``capture``, its engine's own processes up);
- ``report_write``: every report face is on disk and the first is renamed into place, the others not yet
  (report/writing.py ``write_files``);
- ``server_up``: the server launched from the user's command answers its health check and the capture through it
  is about to start (serving/live/capture.py ``capture_launched``).
- ``armed``: the hooks of an SGLang server are armed (``ARMED`` written) and the probes are about to be sent
  (serving/sglang/live.py ``live_capture``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PAUSE_ENV = "SPECPARITY_TEST_PAUSE"  # test-only: POINT@DIR (module docstring)
PAUSE_MAX_S = 300.0


def pause(name: str) -> None:
    """Wait at the point ``name`` when :data:`PAUSE_ENV` names it; otherwise return at once."""
    spec = os.environ.get(PAUSE_ENV)
    if not spec:
        return
    point, sep, folder = spec.partition("@")
    if not sep or point != name:
        return
    where = Path(folder)
    try:
        (where / f"{name}.{os.getpid()}").write_text(f"{os.getpid()}\n")
    except OSError:
        return
    go = where / f"{name}.go"
    end = time.monotonic() + PAUSE_MAX_S
    while not go.exists() and time.monotonic() < end:
        time.sleep(0.05)
