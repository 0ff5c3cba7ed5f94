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
import inspect
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar, cast

from specparity.serving.results import TIMEOUT, CaptureResult, ServingFailure
from specparity.serving.sglang.client import capture_deployment, resolve_deployment

CacheKey = tuple[str, ...]
P = ParamSpec("P")
T = TypeVar("T")


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
def _dist_version_of(python: str, dist: str) -> str:
    """The version of distribution ``dist`` that interpreter ``python`` imports, ``absent`` or ``unknown (...)``."""
    if python == sys.executable:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "absent"
    code = f"import importlib.metadata as m\ntry: print(m.version({dist!r}))\nexcept m.PackageNotFoundError: print('absent')"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                             env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    except (OSError, subprocess.SubprocessError) as e:
        return f"unknown ({type(e).__name__})"
    return out.stdout.strip() or f"unknown (exit {out.returncode})"


def interpreter_identity(python: str | None) -> str:
    """The interpreter a child runs under (resolved path) and the SGLang version it imports."""
    exe = python or sys.executable
    return f"{os.path.realpath(exe)} sglang={_dist_version_of(exe, 'sglang')}"


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


# What a call is keyed by, beside the two directories: cache_key's keywords. timeout_s is a budget, not an
# input (a timeout is never cached); any other parameter (a progress callback, recorded fc inputs) the key
# cannot hold, so the cache refuses it.
_KEYED = ("server_args", "device", "probes", "atlas", "python")


def _cached(op: str, serve: Callable[[], Callable[P, T]]) -> Callable[Concatenate[SessionCache, P], T]:
    """The :class:`SessionCache` method memoising ``serve()``, with its parameters but those it cannot key.

    ``serve`` is looked up at every call, so a monkeypatch of this module's ``resolve_deployment`` or
    ``capture_deployment`` holds; the key binds the call to the real function's signature, defaults included.
    """
    signature = inspect.signature(serve())
    refused = set(signature.parameters) - {"target", "draft", "timeout_s", *_KEYED}

    def method(self: SessionCache, /, *args: P.args, **kwargs: P.kwargs) -> T:
        if unkeyed := refused.intersection(kwargs):
            raise TypeError(f"SessionCache.{op}() got an unexpected keyword argument {min(unkeyed)!r}")
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        given = call.arguments
        key = cache_key(op, given["target"], given["draft"], **{k: given[k] for k in _KEYED if k in given})
        return self._get(key, lambda: serve()(*args, **kwargs))

    method.__name__, method.__qualname__ = op, f"SessionCache.{op}"
    method.__doc__ = f"Cached :func:`~specparity.serving.{serve().__name__}`."
    return method


class SessionCache:
    """Memoises :func:`resolve_deployment` and :func:`capture_deployment` within one process.

    ``resolve`` and ``capture`` take those functions' parameters (``capture`` but ``progress`` and
    ``recorded_fc``). Timeouts are not cached (a retry with a larger budget should run again).
    """

    def __init__(self) -> None:
        self._store: dict[CacheKey, object] = {}
        self._lock = threading.Lock()
        self.misses = 0
        self.hits = 0

    def _get(self, key: CacheKey, compute: Callable[[], T]) -> T:
        with self._lock:
            if key in self._store:
                self.hits += 1
                return cast(T, self._store[key])
        value = compute()
        self.misses += 1
        timed_out = (isinstance(value, ServingFailure) and value.kind == TIMEOUT) or (
            isinstance(value, CaptureResult) and TIMEOUT in value.failure_kinds()
        )
        if not timed_out:
            with self._lock:
                self._store.setdefault(key, value)
        return value

    resolve = _cached("resolve", lambda: resolve_deployment)
    capture = _cached("capture", lambda: capture_deployment)

    def clear(self) -> None:
        with self._lock:
            self._store.clear()


SESSION_CACHE = SessionCache()
