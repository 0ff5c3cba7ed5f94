"""The interface every SGLang version adapter implements, and the registry that picks one.

One adapter per version family (domain.md §6; ranges, modules and matrix envs in ``families.py``),
covering every release from 0.4.4.post2 to 0.5.23; differences inside a family are found by feature
detection in the adapter, not by version. Adapter modules import sglang, so the registry imports them
lazily, inside the child process only.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

# the job both engines' workers take (serving/child/worker_common.py), importable from here as before
from specparity.serving.child.worker_common import WorkerRequest as WorkerRequest
from specparity.serving.results import (
    UNSUPPORTED_VERSION,
    CaptureResult,
    ResolvedDeployment,
    ServingFailure,
)
from specparity.serving.sglang.families import FAMILIES, adapter_name, family_for, release_of

Progress = Callable[[int, int], None]


class SglangAdapter(Protocol):
    """What a version adapter offers. Both methods run inside the child process."""

    name: str

    def resolve(self, request: WorkerRequest) -> ResolvedDeployment | ServingFailure:
        """Static resolution: ServerArgs, draft ids, capture list, fc shape. No model forward."""
        ...

    def capture(self, request: WorkerRequest, *, progress: Progress) -> CaptureResult:
        """Real forward of the probes through SGLang's workers; fc input and (optionally) the atlas."""
        ...


@dataclass(frozen=True)
class AdapterEntry:
    """One adapter family (``families.py``): the PEP 440 range it serves and where its module lives.

    ``untested`` is set on the entry :func:`select_adapter` returns for a version newer than every known
    range: the newest adapter serves it and every report carries an ``untested_version`` warning.
    """

    name: str
    family: str
    specifier: str
    module: str
    tested_with: tuple[str, ...] = ()  # matrix envs (tox.ini, scripts/matrix.sh) running its real-SGLang tests
    untested: bool = False
    note: str = ""  # the untested_version warning when ``untested``

    @property
    def range_text(self) -> str:
        return self.specifier

    def accepts(self, version: tuple[int, ...] | str) -> bool:
        text = _dotted(version) if isinstance(version, tuple) else version
        try:
            return SpecifierSet(self.specifier).contains(release_of(Version(text)), prereleases=True)
        except InvalidVersion:
            return False


REGISTRY: tuple[AdapterEntry, ...] = tuple(
    AdapterEntry(name=adapter_name(f), family=f.letter, specifier=f.specifier, module=f.module,
                 tested_with=f.envs)
    for f in FAMILIES)


def _dotted(v: tuple[int, ...]) -> str:
    return ".".join(str(x) for x in v)


def parse_version(text: str) -> tuple[int, ...]:
    """Leading numeric release of a version string: ``"0.5.23.post1"`` -> ``(0, 5, 23)``."""
    m = re.match(r"^\s*v?(\d+(?:\.\d+)*)", text)
    if m is None:
        raise ValueError(f"cannot parse version {text!r}")
    parts = [int(x) for x in m.group(1).split(".")]
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts[:3])


def supported_range() -> str:
    """Human text naming every supported SGLang range."""
    return "; ".join(f"sglang {e.range_text} ({e.name})" for e in REGISTRY) + (
        f"; newer versions run through {REGISTRY[-1].name} with an untested_version warning")


def select_adapter(version: str) -> AdapterEntry | ServingFailure:
    """The adapter family for an installed SGLang version, or ``unsupported_version``.

    Newer than every known range: the newest family, flagged ``untested`` (never refused). Older than
    0.4.4.post2 (no EAGLE-3) or not a version: ``unsupported_version``.
    """
    sel = family_for(version)
    if sel.family is None:
        return ServingFailure(UNSUPPORTED_VERSION, f"sglang {version} is not supported by specparity: {sel.reason}; "
                                                   f"supported: {supported_range()}")
    entry = next(e for e in REGISTRY if e.family == sel.family.letter)
    return dataclasses.replace(entry, untested=True, note=sel.reason) if sel.untested else entry


def load_adapter(entry: AdapterEntry, *, sglang_version: str) -> SglangAdapter:
    """Import the adapter module (this imports sglang) and build its adapter."""
    module = importlib.import_module(entry.module)
    adapter: SglangAdapter = module.make_adapter(sglang_version=sglang_version, name=entry.name)
    return adapter
