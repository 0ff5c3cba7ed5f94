"""A serving engine's HTTP server, engine-neutral: start one from a command, wait for it, talk to it, stop it.

- :class:`LaunchedServer`: the user's command, as given, plus only what the engine's hook switches add, started in
  a process group of its own (:mod:`specparity.serving.child.reaper` stops it on success, failure, timeout, signal, and
  if the gate is killed), its output in a log file whose tail goes into the finding when it fails to come up.
- :class:`ServerClient`: the HTTP calls a live check makes (JSON, Prometheus text), with the API key as a Bearer
  header; every failure is a :class:`ServerError`, never a raw exception.
- :func:`free_port`, :func:`is_loopback`.

What each engine adds (its parse of the command, its hook switches, its evidence channel, its counters) lives in
``serving/<engine>/live.py``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specparity.serving.child import reaper

LOG_TAIL_LINES = 40
__all__ = ["LaunchedServer", "ServerClient", "ServerError", "free_port", "is_loopback"]


class ServerError(Exception):
    """A server could not be reached or answered with an error; ``status`` is the HTTP status (None: no answer)."""

    def __init__(self, message: str, *, status: int | None = None, url: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.url = url


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the OS picks it; a server started right after takes it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def is_loopback(host: str) -> bool:
    """True for ``127.0.0.0/8``, ``::1`` and ``localhost``; a name is resolved once."""
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
        except OSError:
            return False


@dataclass
class ServerClient:
    """HTTP to one server. ``api_key`` goes out as ``Authorization: Bearer`` and is never printed."""

    url: str
    api_key: str | None = None
    timeout_s: float = 60.0
    _http: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        import httpx

        self.url = self.url.rstrip("/")
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        # trust_env=False: a proxy from the environment must never see a loopback server's traffic or its key.
        # No keep-alive: uvicorn closes an idle connection after 5 s (its timeout_keep_alive), and a request sent on
        # it just then is reset ("Connection reset by peer"), which a loaded machine's gaps between calls hit
        transport = httpx.HTTPTransport(retries=2, limits=httpx.Limits(max_keepalive_connections=0))
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=self.timeout_s, trust_env=False,
                                  transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, *, body: Any = None, params: Mapping[str, str] | None = None,
                 timeout_s: float | None = None) -> Any:
        import httpx

        try:
            r = self._http.request(method, path, json=body, params=params,
                                   timeout=self.timeout_s if timeout_s is None else timeout_s)
        except httpx.HTTPError as e:
            raise ServerError(f"{method} {self.url}{path}: {type(e).__name__}: {e}", url=self.url + path) from None
        if r.status_code >= 400:
            text = r.text[:500].replace(self.api_key or "\0", "***")
            raise ServerError(f"{method} {self.url}{path}: HTTP {r.status_code}: {text}", status=r.status_code,
                              url=self.url + path)
        return r

    def get_json(self, path: str, *, params: Mapping[str, str] | None = None, timeout_s: float | None = None) -> Any:
        return _json(self._request("GET", path, params=params, timeout_s=timeout_s), self.url + path)

    def post_json(self, path: str, body: Any, *, timeout_s: float | None = None) -> Any:
        r = self._request("POST", path, body=body, timeout_s=timeout_s)
        return _json(r, self.url + path) if r.content else None

    def post(self, path: str, *, params: Mapping[str, str] | None = None) -> int:
        return int(self._request("POST", path, params=params).status_code)

    def text(self, path: str, *, timeout_s: float | None = None) -> str:
        return str(self._request("GET", path, timeout_s=timeout_s).text)

    def healthy(self, path: str = "/health") -> bool:
        try:
            self._request("GET", path, timeout_s=5.0)
        except ServerError:
            return False
        return True


def _json(r: Any, url: str) -> Any:
    try:
        return r.json()
    except ValueError:
        raise ServerError(f"{url}: the answer is not JSON: {r.text[:200]!r}", status=r.status_code, url=url) from None


@dataclass
class LaunchedServer:
    """One server process tree that we started and will stop.

    ``argv`` and ``env`` are the command as run (the user's, plus the hook switches); ``env`` is added to this
    process's environment. The server's stdout and stderr go to ``log`` (kept for the log tail and removed with
    the run's directory). Use as a context manager: ``__exit__`` always stops the whole process group.
    """

    argv: Sequence[str]
    env: Mapping[str, str]
    url: str
    health_path: str = "/health"
    cwd: str | None = None
    api_key: str | None = None
    log: Path | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _own_dir: Path | None = field(default=None, repr=False)
    started_s: float | None = None  # seconds from start to healthy

    def start(self) -> None:
        if self.log is None:
            self._own_dir = Path(tempfile.mkdtemp(prefix="specparity-server-"))
            os.chmod(self._own_dir, 0o700)
            reaper.adopt_dir(self._own_dir)
            self.log = self._own_dir / "server.log"
        env = reaper.marked_env({**os.environ, **self.env})
        with open(self.log, "wb") as out:
            try:
                self.proc = subprocess.Popen(list(self.argv), env=env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                                             stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                             preexec_fn=reaper.child_preexec())
            except OSError as e:
                raise ServerError(f"cannot start {self.argv[0]!r}: {e}") from None
        reaper.adopt_group(self.proc.pid)
        self._t0 = time.monotonic()

    def wait_healthy(self, timeout_s: float) -> None:
        """Return when ``health_path`` answers 200; ServerError (with the log tail) when the server exits first or
        ``timeout_s`` passes."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        with ServerClient(self.url, api_key=self.api_key, timeout_s=5.0) as client:
            while True:
                code = self.proc.poll()
                if code is not None:
                    raise ServerError(f"the server exited with code {code} before it answered {self.health_path}"
                                      f"; log tail:\n{self.log_tail()}")
                if client.healthy(self.health_path):
                    self.started_s = time.monotonic() - self._t0
                    return
                if time.monotonic() >= deadline:
                    raise ServerError(f"the server did not answer {self.health_path} within {timeout_s:g} s; "
                                      f"log tail:\n{self.log_tail()}")
                time.sleep(0.5)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        if self.log is None or not self.log.is_file():
            return ""
        with open(self.log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
        out = "\n".join(text.splitlines()[-lines:])
        return out.replace(self.api_key, "***") if self.api_key else out

    def stop(self) -> None:
        """The whole process group: SIGTERM, then SIGKILL after the grace period; the leader reaped."""
        if self.proc is not None:
            reaper.stop_group(self.proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        if self._own_dir is not None:
            reaper.release_dir(self._own_dir)
            self._own_dir = None

    def __enter__(self) -> LaunchedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def redact(argv: Sequence[str], secrets: Sequence[str]) -> list[str]:
    """``argv`` with every secret value replaced by ``***`` (an API key in the user's command)."""
    out = []
    for a in argv:
        for s in secrets:
            if s:
                a = a.replace(s, "***")
        out.append(a)
    return out


def json_line(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str)
