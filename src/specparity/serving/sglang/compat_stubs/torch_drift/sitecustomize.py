"""torch-drift shim for sglang 0.4.10.post2 run on torch >= 2.13 (CPU test matrix only); test-only glue.

sglang 0.4.10.post2 ``srt/utils.py:217`` reads ``torch._C._cpu._is_amx_tile_supported`` at import time;
torch 2.13 no longer has it (AttributeError). This aliases it to ``torch.cpu._is_amx_tile_supported``
where that exists, else to a function returning False (no AMX: SGLang then takes its pure-torch path).
It never replaces an attribute torch still has, so on a torch that matches SGLang's pin it does nothing.

specparity applies it inside the SGLang child process (``specparity.serving.sglang.since_0_4_4.shims``) before the first sglang
import, ONLY for the 0.4.10 adapter on ``cpu``. The file is named ``sitecustomize`` so that a standalone
interpreter can get the same fix by putting this directory on ``PYTHONPATH``.
"""

from __future__ import annotations


def apply() -> bool:
    """Install the alias if torch lacks it; True when it was installed."""
    try:
        import torch
    except ImportError:
        return False
    cpu_c = getattr(torch._C, "_cpu", None)
    if cpu_c is None or hasattr(cpu_c, "_is_amx_tile_supported"):
        return False
    fallback = getattr(torch.cpu, "_is_amx_tile_supported", None)
    cpu_c._is_amx_tile_supported = fallback if callable(fallback) else (lambda: False)
    return True


apply()
