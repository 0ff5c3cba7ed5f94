"""Two Ray nodes on one machine, on loopback, each in its own temporary directory (no shared filesystem between them).

``two_nodes()`` starts a head node and a second node as separate ``ray start --block`` processes, each in a session
of its own, waits until the cluster sees both alive, yields the address, and stops everything it started:
every process of both nodes' trees (raylets, GCS, agents, the workers the raylets started, found while the
raylets were alive), then anything left whose command line names either node's directory. ``orphans`` is what
was still alive after that, checked by the caller: an orphaned Ray process is a test failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    address: str
    dirs: tuple[Path, Path]
    alive_nodes: int = 0
    orphans: list[str] = field(default_factory=list)


def _start(python: str, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    with log.open("wb") as out:
        return subprocess.Popen([str(Path(python).with_name("ray")), "start", "--block", "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
                                 "--num-gpus", "0", "--object-store-memory", "100000000", *args],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def _alive_nodes(python: str, address: str) -> int:
    code = (f"import ray; ray.init(address={address!r}, logging_level='ERROR', log_to_driver=False); "
            "print(sum(1 for n in ray.nodes() if n['Alive'])); ray.shutdown()")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    lines = out.stdout.strip().splitlines()
    return int(lines[-1]) if out.returncode == 0 and lines and lines[-1].isdigit() else 0


def _tree(procs: list[subprocess.Popen[bytes]]) -> set[int]:
    pids: set[int] = set()
    for p in procs:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(p.pid)
            pids |= {root.pid} | {c.pid for c in root.children(recursive=True)}
    return pids


def _naming(dirs: tuple[Path, Path]) -> set[int]:
    out = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        if any(str(d) in cmd for d in dirs):
            out.add(proc.pid)
    return out


def _stop(pids: set[int], grace_s: float = 10.0) -> None:
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace_s)


@contextlib.contextmanager
def two_nodes(python: str = sys.executable, timeout_s: float = 120.0) -> Iterator[Cluster]:
    """``python``: the interpreter of the env whose Ray starts the nodes (its ``ray`` script beside it)."""
    root = Path(tempfile.mkdtemp(prefix="sp-ray-"))
    head_dir, node_dir = root / "head", root / "node"
    head_dir.mkdir()
    node_dir.mkdir()
    port = _free_port()
    address = f"127.0.0.1:{port}"
    cluster = Cluster(address, (head_dir, node_dir))
    procs: list[subprocess.Popen[bytes]] = []
    seen: set[int] = set()
    try:
        procs.append(_start(python, ["--head", "--port", str(port), "--include-dashboard", "false",
                             "--ray-client-server-port", str(_free_port()), "--temp-dir", str(head_dir)],
                            root / "head.log"))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _alive_nodes(python, address) < 1:
            time.sleep(2)
        procs.append(_start(python, ["--address", address, "--temp-dir", str(node_dir)], root / "node.log"))
        while time.monotonic() < deadline:
            cluster.alive_nodes = _alive_nodes(python, address)
            if cluster.alive_nodes >= 2:
                break
            time.sleep(2)
        seen = _tree(procs)
        yield cluster
    finally:
        seen |= _tree(procs) | _naming(cluster.dirs)
        _stop(seen)
        _stop(_naming(cluster.dirs))
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        cluster.orphans = [d for d in (_describe_live(pid) for pid in seen | _naming(cluster.dirs)) if d]
        shutil.rmtree(root, ignore_errors=True)


def _describe_live(pid: int) -> str | None:
    """The command line of a process still running (not a zombie awaiting its parent), else None."""
    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else f"{pid}: {' '.join(proc.cmdline())[:160]}"
    except psutil.Error:
        return None
