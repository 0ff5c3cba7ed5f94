"""Install the old-SGLang CPU shims (``compat_stubs/``) inside the SGLang child process.

Two pieces of test-only glue ship as package data next to the ``sgl_kernel`` stand-in
(sglang-cpu.md §9, "Shims"):

- ``compat_stubs/vllm``: an identity ``vllm`` package. On CPUs without AMX, sglang <= 0.5.3 imports
  vllm's ``SiluAndMul``/``RMSNorm`` and ``_custom_ops`` as a fallback; the shim re-exports SGLang's own
  classes, so the fallback is a no-op and any custom-op call raises.
- ``compat_stubs/torch_drift/sitecustomize.py``: sglang 0.4.10.post2 reads
  ``torch._C._cpu._is_amx_tile_supported`` at import time (``srt/utils.py:217``), which torch 2.13 lacks.

Both are used ONLY by the 0.4.10 and 0.5.3 adapters, ONLY on ``device == "cpu"``, ONLY inside the child
(:func:`install` runs before the adapter's first sglang import), and never when the real module exists.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

COMPAT_DIR = Path(__file__).resolve().parents[1] / "compat_stubs"  # serving/sglang/compat_stubs, beside the folders
VLLM_SHIM_DIR = COMPAT_DIR / "vllm"
TORCH_DRIFT_DIR = COMPAT_DIR / "torch_drift"

_installed: list[str] = []


def installed() -> tuple[str, ...]:
    """Names of the shims :func:`install` put in place in this process (for the execution record)."""
    return tuple(_installed)


def _real_vllm_importable() -> bool:
    spec = importlib.util.find_spec("vllm")
    return spec is not None and not str(spec.origin or "").startswith(str(COMPAT_DIR))


def install(*, device: str, torch_drift: bool) -> tuple[str, ...]:
    """Put the shims in place for an old SGLang on ``device``; returns what was installed. Idempotent.

    ``torch_drift`` is True only for sglang 0.4.10.post2. Nothing happens unless ``device == "cpu"``.
    Must run before ``sglang.srt`` is imported: both fallbacks are taken at module import time.
    """
    if device != "cpu":
        return installed()
    if "vllm" not in _installed and not _real_vllm_importable():
        sys.path.insert(0, str(VLLM_SHIM_DIR))
        _installed.append("vllm")
    if torch_drift and "torch_drift" not in _installed:
        spec = importlib.util.spec_from_file_location(
            "specparity_torch_drift", TORCH_DRIFT_DIR / "sitecustomize.py")
        if spec is None or spec.loader is None:  # pragma: no cover - the file ships with the package
            raise RuntimeError(f"cannot load {TORCH_DRIFT_DIR / 'sitecustomize.py'}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # applies the alias on import (a no-op when torch has it)
        _installed.append("torch_drift")
    return installed()


def vllm_shim_calls() -> tuple[str, ...]:
    """Every ``vllm._custom_ops`` call the shim recorded (each one also raised)."""
    module = sys.modules.get("vllm._custom_ops")
    return tuple(getattr(module, "CALLED", ())) if module is not None else ()
