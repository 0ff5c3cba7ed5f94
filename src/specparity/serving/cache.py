"""A per-process cache of child results, so one pytest session starts SGLang once per deployment.

Keyed by (operation, target, draft, device, sorted server args, probes hash, atlas, interpreter).
Cached objects are shared: callers must treat them (and their tensors) as read-only. The pytest
plugin wraps :data:`SESSION_CACHE` in session-scoped fixtures; this module knows nothing of pytest.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from specparity.serving import capture_deployment, resolve_deployment
from specparity.serving.results import TIMEOUT, CaptureResult, ResolvedDeployment, ServingFailure

CacheKey = tuple[str, ...]


def probes_hash(probes: Sequence[Sequence[int]]) -> str:
    """Stable hash of a probe list (order and lengths matter)."""
    return hashlib.sha256(json.dumps([list(p) for p in probes]).encode()).hexdigest()[:16]


def cache_key(
    op: str,
    target: str | Path,
    draft: str | Path,
    *,
    server_args: Mapping[str, object] | None,
    device: str,
    probes: Sequence[Sequence[int]] = (),
    atlas: bool = False,
    python: str | None = None,
) -> CacheKey:
    """The key one call is cached under."""
    args = json.dumps(sorted((str(k), repr(v)) for k, v in (server_args or {}).items()))
    return (
        op,
        str(Path(target).resolve()),
        str(Path(draft).resolve()),
        device,
        args,
        probes_hash(probes),
        str(atlas),
        python or "",
    )


class SessionCache:
    """Memoises :func:`resolve_deployment` and :func:`capture_deployment` within one process.

    Timeouts are not cached (a retry with a larger budget should run again).
    """

    def __init__(self) -> None:
        self._store: dict[CacheKey, ResolvedDeployment | ServingFailure | CaptureResult] = {}
        self._lock = threading.Lock()
        self.misses = 0
        self.hits = 0

    def _get(
        self, key: CacheKey, compute: Callable[[], ResolvedDeployment | ServingFailure | CaptureResult]
    ) -> ResolvedDeployment | ServingFailure | CaptureResult:
        with self._lock:
            if key in self._store:
                self.hits += 1
                return self._store[key]
        value = compute()
        self.misses += 1
        timed_out = (isinstance(value, ServingFailure) and value.kind == TIMEOUT) or (
            isinstance(value, CaptureResult) and TIMEOUT in value.failure_kinds()
        )
        if not timed_out:
            with self._lock:
                self._store.setdefault(key, value)
        return value

    def resolve(
        self,
        target: str | Path,
        draft: str | Path,
        *,
        server_args: Mapping[str, object] | None = None,
        device: str = "cpu",
        timeout_s: float = 300,
        python: str | None = None,
    ) -> ResolvedDeployment | ServingFailure:
        """Cached :func:`~specparity.serving.resolve_deployment`."""
        key = cache_key("resolve", target, draft, server_args=server_args, device=device, python=python)
        value = self._get(
            key,
            lambda: resolve_deployment(
                target, draft, server_args=server_args, device=device, timeout_s=timeout_s, python=python
            ),
        )
        assert isinstance(value, ResolvedDeployment | ServingFailure)
        return value

    def capture(
        self,
        target: str | Path,
        draft: str | Path,
        *,
        probes: Sequence[Sequence[int]],
        server_args: Mapping[str, object] | None = None,
        device: str = "cpu",
        atlas: bool = True,
        timeout_s: float = 600,
        python: str | None = None,
    ) -> CaptureResult:
        """Cached :func:`~specparity.serving.capture_deployment`."""
        key = cache_key(
            "capture",
            target,
            draft,
            server_args=server_args,
            device=device,
            probes=probes,
            atlas=atlas,
            python=python,
        )
        value = self._get(
            key,
            lambda: capture_deployment(
                target,
                draft,
                probes=probes,
                server_args=server_args,
                device=device,
                atlas=atlas,
                timeout_s=timeout_s,
                python=python,
            ),
        )
        assert isinstance(value, CaptureResult)
        return value

    def clear(self) -> None:
        with self._lock:
            self._store.clear()


SESSION_CACHE = SessionCache()
