"""specparity's CPU stand-ins for SGLang's own server processes (``serving/sglang/live_stand_ins.py``).

This directory goes on a live SGLang server's ``PYTHONPATH`` only where specparity launches (or tells the user to
launch) that server on ``cpu`` (``serving/sglang/live.py`` ``hook_switches(..., cpu_stand_ins=True)``), so that the
launcher and every process it spawns run :func:`install` at interpreter start, before sglang is imported. Without
``SPECPARITY_SGLANG_LIVE_STAND_INS`` it does nothing. Any other ``sitecustomize`` on the path after this directory
still runs (Python imports only the first one it finds).
"""

from __future__ import annotations


def _run() -> None:
    import importlib.machinery
    import importlib.util
    import os
    import sys

    if os.environ.get("SPECPARITY_SGLANG_LIVE_STAND_INS"):
        try:
            from specparity.serving.sglang.live_stand_ins import install
        except ImportError as exc:  # specparity is not importable by this interpreter: say so, do nothing
            sys.stderr.write(f"specparity: live stand-ins not installed ({exc})\n")
        else:
            install()
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and spec.origin != __file__:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_run()
del _run
