"""A per-process cache of child results, so one pytest session starts SGLang once per deployment.

Keyed by content, not by path: (operation, a fingerprint of the target and of the draft directory, device,
sorted server args, probes hash, atlas, the interpreter and the SGLang version it imports). A directory's
fingerprint hashes its JSON files' bytes (configs, tokenizer) and every other file's name, size and mtime, so
an in-place edit of a config or a rewritten weight file is a new key, not a stale hit.
Cached objects are shared: callers must treat them (and their tensors) as read-only. The pytest
plugin wraps :data:`SESSION_CACHE` in session-scoped fixtures; this module knows nothing of pytest.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from specparity.serving import capture_deployment, resolve_deployment
from specparity.serving.results import TIMEOUT, CaptureResult, ResolvedDeployment, ServingFailure

CacheKey = tuple[str, ...]


def probes_hash(probes: Sequence[Sequence[int]]) -> str:
    """Stable hash of a probe list (order and lengths matter)."""
    return hashlib.sha256(json.dumps([list(p) for p in probes]).encode()).hexdigest()[:16]


def directory_fingerprint(path: str | Path) -> str:
    """Hash of a model directory's content: JSON bytes, and name/size/mtime of every other file."""
    root = Path(path)
    h = hashlib.sha256(str(root.resolve()).encode())
    if not root.is_dir():
        h.update(b"missing" if not root.exists() else b"not a directory")
        return h.hexdigest()[:16]
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = file.relative_to(root).as_posix()
        try:
            st = file.stat()
            h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
            if file.suffix == ".json":
                h.update(file.read_bytes())
        except OSError as e:  # unreadable: its own key, so a later readable state is a miss
            h.update(f"{rel}\0{type(e).__name__}\0".encode())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=16)
def _sglang_version_of(python: str) -> str:
    if python == sys.executable:
        try:
            return importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            return "absent"
    code = "import importlib.metadata as m\ntry: print(m.version('sglang'))\nexcept m.PackageNotFoundError: print('absent')"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                             env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    except (OSError, subprocess.SubprocessError) as e:
        return f"unknown ({type(e).__name__})"
    return out.stdout.strip() or f"unknown (exit {out.returncode})"


def interpreter_identity(python: str | None) -> str:
    """The interpreter a child runs under (resolved path) and the SGLang version it imports."""
    exe = python or sys.executable
    return f"{os.path.realpath(exe)} sglang={_sglang_version_of(exe)}"


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
    """The key one call is cached under (computed afresh on every call: it stats the two directories)."""
    args = json.dumps(sorted((str(k), repr(v)) for k, v in (server_args or {}).items()))
    return (
        op,
        directory_fingerprint(target),
        directory_fingerprint(draft),
        device,
        args,
        probes_hash(probes),
        str(atlas),
        interpreter_identity(python),
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
