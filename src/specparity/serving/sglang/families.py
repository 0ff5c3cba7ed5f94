"""The one table mapping SGLang releases to the code that serves them (domain.md §6), read by ``specparity versions``.

Each row (:class:`Family`, a letter A-E) is a PEP 440 range of releases with its adapter module and matrix envs. The
adapter modules live in one folder per code family, named for the first release it serves, each with the same core
files (``adapter.py``: the registry hook ``make_adapter``; ``core.py``: the adapter on the release it was written
against; ``run.py``: start-up and batches of the capture level; ``static.py``: the static level):

- ``since_0_4_4/``: before the worker-v2 API (rows A and B, 0.4.4.post2-0.5.10); also ``static_only.py`` (row A's
  adapter), ``glue.py`` (the tested releases' glue), ``shims.py`` (old-SGLang CPU shims), ``common.py``.
- ``since_0_5_11/``: the worker-v2 API (rows C, D and E, 0.5.11-); also ``run_compat.py`` and ``static_compat.py``
  (the paths of the releases before the 0.5.23 module layout, by feature detection).

A family serves from its first release up to the next family's; adding a release is a row here (or a widened
range) plus, at most, one new folder.

Plain data, importable without torch or sglang, and runnable as a script so that
``scripts/venv-engine.sh sglang`` reads the same table::

    python3 src/specparity/serving/sglang/families.py env-for 0.5.12     # -> sglang-0.5.14 (family C's env)
    python3 src/specparity/serving/sglang/families.py check 0.4.3        # exit 2: no EAGLE-3 before 0.4.4.post2

Ranges cover every SGLang release from 0.4.4.post2 (the first with ``models/llama_eagle3.py``) to
0.5.23 with no gap (:data:`KNOWN_RELEASES`, the release list ``pip index versions sglang`` printed;
0.5.0rc0 is downloadable but unlisted). Pre-releases count as their release's range.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

FIRST_EAGLE3 = "0.4.4.post2"  # models/llama_eagle3.py is absent in 0.4.4.post1 (domain.md §6)


@dataclass(frozen=True)
class MatrixEnv:
    """One tox / scripts/matrix.sh env: the SGLang it installs and its pinned list."""

    name: str  # tox env and .tox/<name> venv
    sglang: str  # the exact version installed
    constraints: str  # constraints/ list (sglang and its runtime deps), installed --no-deps
    torch: str = "constraints/torch-cpu-2.13.txt"  # torch list: the CPU build, or the CUDA build (runs on CPU)


@dataclass(frozen=True)
class Family:
    """One adapter family: a PEP 440 range of SGLang releases served by one adapter module."""

    letter: str
    specifier: str  # PEP 440, half-open, e.g. ">=0.5.11,<0.5.17"
    module: str  # adapter module with make_adapter (imports sglang: loaded only in the child)
    envs: tuple[str, ...]  # MatrixEnv names that test this family, the representative first
    summary: str
    untested_why: str = ""  # why no matrix env runs this family's real-SGLang tests (empty when one does)
    # the capture through the user's own server (serving/sglang/live.py, docs/live-sglang.md): "yes"/"no" and why
    live: tuple[str, str] = ("no", "")

    @property
    def folder(self) -> str:
        """The code family's folder under ``serving/sglang/`` (``since_0_4_4``, ``since_0_5_11``)."""
        return self.module.removeprefix(_PKG).split(".")[0]

    def contains(self, version: str) -> bool:
        return SpecifierSet(self.specifier).contains(release_of(Version(version)), prereleases=True)


def release_of(v: Version) -> Version:
    """A pre-/dev-release counts as the release it precedes (``0.5.11rc0`` -> ``0.5.11``, which PEP 440's
    ``<0.5.11`` would otherwise exclude from both neighbouring ranges); post-releases stay as they are."""
    if not (v.is_prerelease or v.is_devrelease):
        return v
    return Version(".".join(map(str, v.release)) + (f".post{v.post}" if v.post is not None else ""))


# Where sglang imports torchvision at import time (0.5.10 utils/common.py:90, 0.5.14
# multimodal/internvl_utils.py:5, 0.5.20 utils/common.py:98), PyPI's torchvision needs a CUDA build of torch
# (under torch-2.13.0+cpu it raises "operator torchvision::nms does not exist"): those envs use a CUDA build,
# which imports and runs on CPU: 2.14.1 from local disk (.venv's). 0.5.20 pins 2.13.0, whose CUDA build (1.4 GB
# from PyPI with its cuDNN/NCCL) is not on local disk; its tests passed on 2.14.1 as they did on 2.13.0.
_CUDA_TORCH = "constraints/torch-0.5.23.txt"
ENVS: dict[str, MatrixEnv] = {e.name: e for e in (
    MatrixEnv("sglang-0.4.8", "0.4.8", "constraints/sglang-0.4.8.txt"),
    MatrixEnv("sglang-0.4.10", "0.4.10.post2", "constraints/sglang-0.4.10.post2.txt"),
    MatrixEnv("sglang-0.5.3", "0.5.3", "constraints/sglang-0.5.3.txt"),
    MatrixEnv("sglang-0.5.10", "0.5.10", "constraints/sglang-0.5.10.txt", _CUDA_TORCH),
    MatrixEnv("sglang-0.5.14", "0.5.14", "constraints/sglang-0.5.14.txt", _CUDA_TORCH),
    MatrixEnv("sglang-0.5.20", "0.5.20", "constraints/sglang-0.5.20.txt", _CUDA_TORCH),
    MatrixEnv("sglang-0.5.23", "0.5.23", "constraints/sglang-0.5.23.txt", _CUDA_TORCH),  # .venv (scripts/venv.sh)
)}

_PKG = "specparity.serving.sglang."
# --forward-hooks first ships in 0.5.6 (serving/sglang/live.py FIRST_RELEASE_WITH_FORWARD_HOOKS); the live capture
# was measured on CPU with each yes-family's env (docs/live-sglang.md)
_LIVE_CPU = ("; on CPU: --skip-server-warmup, max_new_tokens 1, the in-process capture's stand-ins "
             "(serving/sglang/live_stand_ins.py)")
FAMILIES: tuple[Family, ...] = (
    Family("A", f">={FIRST_EAGLE3},<0.4.9", _PKG + "since_0_4_4.static_only", ("sglang-0.4.8",),
           "configured draft ids ignored (default capture always), fc bias always built; static level only",
           live=("no", "no --forward-hooks (first in 0.5.6); a running server gives the static level "
                       "(/get_server_info)")),
    Family("B", ">=0.4.9,<0.5.11", _PKG + "since_0_4_4.adapter", ("sglang-0.5.3", "sglang-0.4.10", "sglang-0.5.10"),
           "+1 ids, nested eagle_config only; ids read after CUDA graphs (D3); fc width fixed at 3*H_t",
           live=("no", "no --forward-hooks before 0.5.6; 0.5.6-0.5.10 have them, but on CPU the server refuses at "
                       "start (the EAGLE worker builds its draft-decode backend in __init__, 0.5.10 "
                       "speculative/eagle_worker.py:205 -> draft_utils.py:61, which no in-process stand-in "
                       "covers); on a GPU: designed, not run")),
    Family("C", ">=0.5.11,<0.5.17", _PKG + "since_0_5_11.adapter", ("sglang-0.5.14",),
           "ids set before graphs; fc_norm/num_aux_hidden_states (0.5.12); DeepSeek first-id rule (0.5.13)",
           live=("yes", "measured with 0.5.14" + _LIVE_CPU + ", and --disable-overlap-schedule and a port <= 55535 "
                        "(server_args.py:2761-2769)")),
    Family("D", ">=0.5.17,<0.5.22", _PKG + "since_0_5_11.adapter", ("sglang-0.5.20",),
           "norm_before_fc, gpt_oss boundary rule (0.5.17); spec rewrite via resolved_view (0.5.19)",
           live=("yes", "measured with 0.5.20" + _LIVE_CPU)),
    Family("E", ">=0.5.22,<0.5.24", _PKG + "since_0_5_11.adapter", ("sglang-0.5.23",),
           "layer_boundary refactor: id -1 serves the embedding on llama-style targets; capture-only mode",
           live=("yes", "measured with 0.5.23" + _LIVE_CPU + " (tests/serving/test_sglang_live_server.py)")),
)
NEWEST = FAMILIES[-1]

# Every release from 0.4.4.post2 to 0.5.23 (``pip index versions sglang``, plus the unlisted 0.5.0rc0).
KNOWN_RELEASES: tuple[str, ...] = (
    "0.4.4.post2", "0.4.4.post3", "0.4.4.post4", "0.4.5", "0.4.5.post1", "0.4.5.post2", "0.4.5.post3", "0.4.6",
    "0.4.6.post1", "0.4.6.post2", "0.4.6.post3", "0.4.6.post4", "0.4.6.post5", "0.4.7", "0.4.7.post1", "0.4.8",
    "0.4.8.post1", "0.4.9", "0.4.9.post1", "0.4.9.post2", "0.4.9.post3", "0.4.9.post4", "0.4.9.post5",
    "0.4.9.post6", "0.4.10", "0.4.10.post1", "0.4.10.post2", "0.5.0rc0", "0.5.1", "0.5.1.post1", "0.5.1.post2",
    "0.5.1.post3", "0.5.2", "0.5.3", "0.5.3.post1", "0.5.3.post2", "0.5.3.post3", "0.5.4", "0.5.4.post1",
    "0.5.4.post2", "0.5.4.post3", "0.5.5", "0.5.5.post1", "0.5.5.post2", "0.5.5.post3", "0.5.6", "0.5.6.post1",
    "0.5.6.post2", "0.5.7", "0.5.8", "0.5.8.post1", "0.5.9", "0.5.10", "0.5.10.post1", "0.5.11", "0.5.12",
    "0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18",
    "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23",
)


@dataclass(frozen=True)
class Selection:
    """What :func:`family_for` decided for one installed version."""

    family: Family | None  # None: refused
    untested: bool = False  # newer than every known range: served by the newest adapter, with a warning
    reason: str = ""  # why it was refused, or the untested_version warning


def family_for(version: str) -> Selection:
    """The family serving ``version``; newer than known -> the newest, flagged; older or unparsable -> refused."""
    try:
        v = Version(version)
    except InvalidVersion:
        return Selection(None, reason=f"sglang {version} is not a PEP 440 version")
    for fam in FAMILIES:
        if fam.contains(version):
            return Selection(fam)
    if release_of(v) < Version(FIRST_EAGLE3):
        return Selection(None, reason=(f"sglang {version} has no EAGLE-3 (models/llama_eagle3.py first ships in "
                                       f"{FIRST_EAGLE3})"))
    newest = NEWEST.specifier.split("<")[-1]
    return Selection(NEWEST, untested=True, reason=(
        f"untested_version: sglang {version} is newer than every tested range (newest: {NEWEST.specifier}); "
        f"it runs through the family {NEWEST.letter} adapter, which was tested below {newest}"))


def env_for(version: str) -> MatrixEnv | None:
    """The matrix env installing exactly ``version``, else its family's representative env."""
    for env in ENVS.values():
        if env.sglang == version:
            return env
    sel = family_for(version)
    if sel.family is None or sel.untested:
        return None
    reps = sel.family.envs or tuple(e for e in ENVS if family_for(ENVS[e].sglang).family == sel.family)
    return ENVS[reps[0]] if reps else None


def versions_table() -> list[dict[str, Any]]:
    """``specparity versions --json``: one object per range, oldest first, then the untested newer range.

    Keys: ``range`` (PEP 440), ``family``, ``adapter`` (the registry name), ``folder`` (the code family's folder),
    ``module`` (the adapter module in it), ``tested_with``
    (matrix envs), ``tested_versions`` (the exact SGLang each installs), ``releases`` (known releases in the
    range), ``untested`` (the newer-than-known row), ``untested_why`` (no env), ``summary``, and ``live_capture``
    (``yes``/``no``: the capture through the user's own server) with ``live_capture_why``.
    """
    rows: list[dict[str, Any]] = []
    for fam in FAMILIES:
        rows.append({
            "range": fam.specifier, "family": fam.letter, "adapter": adapter_name(fam),
            "folder": fam.folder, "module": fam.module.removeprefix(_PKG), "tested_with": list(fam.envs),
            "tested_versions": [ENVS[e].sglang for e in fam.envs],
            "releases": [r for r in KNOWN_RELEASES if fam.contains(r)], "untested": False, "summary": fam.summary,
            "untested_why": fam.untested_why, "live_capture": fam.live[0], "live_capture_why": fam.live[1]})
    upper = NEWEST.specifier.split(",<")[-1]
    rows.append({"range": f">={upper}", "family": NEWEST.letter, "adapter": adapter_name(NEWEST),
                 "folder": NEWEST.folder, "module": NEWEST.module.removeprefix(_PKG), "tested_with": [], "tested_versions": [],
                 "releases": [], "untested": True, "untested_why": "newer than every known release",
                 "live_capture": NEWEST.live[0], "live_capture_why": "untested: " + NEWEST.live[1],
                 "summary": "newer than every tested release: the newest adapter, with an untested_version warning"})
    return rows


def adapter_name(fam: Family) -> str:
    """The registry name of a family's adapter (``deployment.adapter`` in reports)."""
    return f"sglang-family-{fam.letter}"


def _main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("env-for", "check"):
        print("usage: families.py {env-for|check} VERSION", file=sys.stderr)
        return 2
    sel = family_for(argv[1])
    if sel.family is None or sel.untested:
        print(f"families.py: {sel.reason}", file=sys.stderr)
        return 2
    if argv[0] == "check":
        print(sel.family.letter)
        return 0
    env = env_for(argv[1])
    if env is None:
        print(f"families.py: no pinned list for family {sel.family.letter}", file=sys.stderr)
        return 2
    print(f"{env.name} {env.sglang} {env.constraints} {env.torch} {sel.family.letter}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
