"""The interface every SGLang version adapter implements, and the registry that picks one.

Version-specific glue lives in one module per version family (``v0_5_23.py``; 0.5.3 and
0.4.10.post2 come later). Adapter modules import sglang, so the registry imports them lazily, inside
the child process only.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from specparity.serving.results import (
    UNSUPPORTED_VERSION,
    CaptureResult,
    ResolvedDeployment,
    ServingFailure,
)

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class WorkerRequest:
    """One job for the child process (travels as JSON)."""

    op: str  # "resolve" | "capture"
    target: str
    draft: str
    server_args: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    probes: tuple[tuple[int, ...], ...] = ()
    atlas: bool = True
    replay: dict[str, str] | None = None  # specparity.replay: {"inputs", "out"} (sglang/replay_hooks.py)

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "target": self.target, "draft": self.draft,
                "server_args": dict(self.server_args), "device": self.device,
                "probes": [list(p) for p in self.probes], "atlas": self.atlas, "replay": self.replay}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WorkerRequest:
        return cls(op=str(d["op"]), target=str(d["target"]), draft=str(d["draft"]),
                   server_args=dict(d.get("server_args") or {}), device=str(d.get("device", "cpu")),
                   probes=tuple(tuple(int(x) for x in p) for p in d.get("probes", [])),
                   atlas=bool(d.get("atlas", True)), replay=d.get("replay"))


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
    """One registered adapter: the half-open version range it serves and where its module lives."""

    name: str
    lowest: tuple[int, ...]
    below: tuple[int, ...]
    module: str

    @property
    def range_text(self) -> str:
        return f">={_dotted(self.lowest)},<{_dotted(self.below)}"

    def accepts(self, version: tuple[int, ...]) -> bool:
        return self.lowest <= version < self.below


REGISTRY: tuple[AdapterEntry, ...] = (
    AdapterEntry(name="sglang-0.4.10", lowest=(0, 4, 10), below=(0, 4, 11),
                 module="specparity.serving.sglang.v0_4_10"),
    AdapterEntry(name="sglang-0.5.3", lowest=(0, 5, 3), below=(0, 5, 4),
                 module="specparity.serving.sglang.v0_5_3"),
    AdapterEntry(name="sglang-0.5.23", lowest=(0, 5, 23), below=(0, 5, 24),
                 module="specparity.serving.sglang.v0_5_23"),
)


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
    return "; ".join(f"sglang {e.range_text} ({e.name})" for e in REGISTRY)


def select_adapter(version: str) -> AdapterEntry | ServingFailure:
    """The registered adapter for an installed SGLang version, or ``unsupported_version``."""
    try:
        parsed = parse_version(version)
    except ValueError:
        parsed = None
    for entry in REGISTRY:
        if parsed is not None and entry.accepts(parsed):
            return entry
    return ServingFailure(UNSUPPORTED_VERSION,
                          f"sglang {version} is not supported by specparity; supported: {supported_range()}")


def load_adapter(entry: AdapterEntry, *, sglang_version: str) -> SglangAdapter:
    """Import the adapter module (this imports sglang) and build its adapter."""
    module = importlib.import_module(entry.module)
    adapter: SglangAdapter = module.make_adapter(sglang_version=sglang_version, name=entry.name)
    return adapter
