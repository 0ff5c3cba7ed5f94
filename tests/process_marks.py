"""Every process of a run, found by the run marker specparity puts in the environment of each process it starts
(src/specparity/serving/child/reaper.py MARKER_ENV): what a test asserts is gone after a run, a stop or a signal."""

from __future__ import annotations

import os
import time
from pathlib import Path

from specparity.serving.child.reaper import MARKER_ENV


def marked_alive(marker: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries ``marker`` as the run marker."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            env = Path(entry.path, "environ").read_bytes()
            state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"{MARKER_ENV}={marker}".encode() in env.split(b"\0") and state != "Z":
            out.append(int(entry.name))
    return out


def gone(marker: str, within_s: float = 10.0) -> bool:
    """True once no live process carries ``marker`` (waiting at most ``within_s``)."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if not marked_alive(marker):
            return True
        time.sleep(0.1)
    return False


def describe(pids: list[int]) -> list[str]:
    """``pid: command line`` of each, for an assertion message."""
    out = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            out.append(f"{pid}: {cmd[:160]}")
        except OSError:
            out.append(f"{pid}: (gone)")
    return out
