"""The installed SGLang's own ``set_eagle3_layers_to_capture`` sources, read with ``inspect`` in a child.

What ``specparity explain`` must cite for the release under test, computed independently of specparity's tracer
(serving/sglang/setter_source.py records what ran; this reads the class attribute): the defining class, the file
under the sglang package, its first and last line, and its text. A child, because sglang needs the CPU shims
installed before its first import (as tests/serving/test_versions.py's setter child does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A child's first lines: the CPU shims this release's adapter installs before sglang is imported
CPU_SGLANG_PREAMBLE = textwrap.dedent("""
    import importlib, inspect, json, os, sys, types
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    from importlib import metadata
    from specparity.serving.sglang.since_0_4_4 import shims as legacy_shims
    from specparity.serving.sglang.adapter import select_adapter
    from specparity.serving.sglang.worker import install_kernel_stub_if_needed
    entry = select_adapter(metadata.version("sglang"))
    install_kernel_stub_if_needed("cpu")
    if entry.family in ("A", "B"):  # the pre-worker-v2 families' CPU shims (since_0_4_4.adapter.FamilyBAdapter)
        legacy_shims.install(device="cpu", torch_drift=True)
""")

_CHILD = CPU_SGLANG_PREAMBLE + textwrap.dedent("""
    import sglang
    root = os.path.dirname(os.path.dirname(os.path.abspath(sglang.__file__)))
    out = []
    for module, name in json.loads(sys.stdin.read()):
        fn = getattr(importlib.import_module(module), name).set_eagle3_layers_to_capture
        lines, first = inspect.getsourcelines(fn)
        path = os.path.relpath(os.path.abspath(inspect.getsourcefile(fn)), root).replace(os.sep, "/")
        out.append({"function": fn.__qualname__, "file": path, "first_line": first,
                    "last_line": first + len(lines) - 1, "code": "".join(lines)})
    print(json.dumps(out))
""")


def installed_setters(*classes: tuple[str, str]) -> list[dict[str, object]]:
    """``[(module, class), ...]`` -> each class's setter as the installed sglang defines it (inherited ones
    included: the function's own ``__qualname__`` names the class that defines it)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps([list(c) for c in classes]), text=True,
                          capture_output=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found: list[dict[str, object]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return found


def cited(setter: dict[str, object]) -> str:
    """How explain prints one citation: ``Class.set_eagle3_layers_to_capture at sglang/srt/...:first-last``."""
    return f"{setter['function']} at {setter['file']}:{setter['first_line']}-{setter['last_line']}"
