"""Report files: checked before the engine starts, written whole or not at all.

- :func:`check_report_path` refuses, before any engine starts, a report path that cannot be written: a directory
  where a file goes, a path under a regular file, a read-only file system, a folder without write permission. The
  :class:`~specparity.errors.InputError` names the option (exit 2).
- :func:`write_files` writes every face of one run to a temporary file beside its destination, and renames them into
  place only once all of them are on disk. A failure while writing (a full disk, an I/O error) leaves no partial or
  temporary file, and is a :class:`ReportWriteError` (exit 3) saying which faces were written (none, unless a
  rename itself failed) and which were not. A report on disk is therefore always whole, and from the same run.
  An interrupt (Ctrl-C, SIGTERM, SIGHUP) while writing removes the faces this call already put in place: a run cut
  short leaves no report that could be read as its verdict. Until the last rename, every temporary file and every
  face put in place is registered with the reaper's watchdog (serving/child/reaper.py), which removes them if the process
  is killed (SIGKILL) before this call ends.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specparity.errors import EnvironmentProblem, InputError
from specparity.serving.child import reaper
from specparity.testpoints import pause


class ReportWriteError(EnvironmentProblem):
    """A report could not be written after the check ran (exit 3); ``written`` and ``not_written`` name the faces."""

    def __init__(self, failed: ReportFile, error: OSError, *, written: Sequence[ReportFile],
                 not_written: Sequence[ReportFile]) -> None:
        self.failed, self.error = failed, error
        self.written, self.not_written = tuple(written), tuple(not_written)
        reason = error.strerror or str(error)
        super().__init__(
            f"could not write the {failed.face} {failed.path}: {reason}; written: "
            f"{', '.join(f'{f.face} {f.path}' for f in written) or 'none'}; not written: "
            f"{', '.join(f'{f.face} {f.path}' for f in not_written)} (no partial file is left)")


@dataclass(frozen=True)
class ReportFile:
    """One face of a run as a file: ``face`` names it in messages (``--json report``, ``report.html``)."""

    face: str
    path: Path
    text: str


def _existing_ancestor(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (a dangling symlink counts: it exists as a name)."""
    p = path
    while not os.path.lexists(p) and p != p.parent:
        p = p.parent
    return p


def check_report_path(path: str | Path, *, option: str, directory: bool = False) -> Path:
    """Raise :class:`InputError` naming ``option`` when a report cannot be written at ``path`` (a file; with
    ``directory``, a folder the reports go into). Creates nothing: a probe file in the nearest existing folder is
    written and removed, so a read-only file system, a full one and missing permissions all show here."""
    p = Path(path)
    if directory:
        if os.path.lexists(p) and not p.is_dir():
            raise InputError("exists and is not a directory; give the folder the reports go into", path=p,
                             field=option)
    elif p.is_dir():
        raise InputError("is a directory; give the report's file name", path=p, field=option)
    ancestor = _existing_ancestor(p if directory else p.parent)
    if not ancestor.is_dir():
        raise InputError(f"lies under {ancestor}, which is a regular file, so nothing can be written there",
                         path=p, field=option)
    try:
        fd, probe = tempfile.mkstemp(dir=ancestor, prefix=".specparity-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise InputError(f"cannot write in {ancestor}: {e.strerror or e}", path=p, field=option) from None
    return p


def _stage(f: ReportFile, guard: list[Path]) -> Path:
    """``f.text`` in a new temporary file beside ``f.path`` (synced), which is removed again if writing fails; its
    name joins ``guard`` (the watchdog's) before it exists."""
    f.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.path.with_name(f".{f.path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    _guard(tmp, guard)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for any new file
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(f.text)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _guard(path: Path, guard: list[Path]) -> None:
    """``path`` is removed by the reaper's watchdog should this process be killed before :func:`write_files` ends."""
    with contextlib.suppress(OSError):  # no watchdog process to be had: the files are still written
        reaper.adopt_file(path.absolute())
    guard.append(path)


def _unwritten(written: Sequence[ReportFile]) -> None:
    for f in written:
        f.path.unlink(missing_ok=True)


def write_files(files: Sequence[ReportFile]) -> list[Path]:
    """Write every file whole, or none (module docstring); returns the paths written, in order."""
    staged: list[Path] = []
    written: list[ReportFile] = []
    guard: list[Path] = []  # what a SIGKILL before the end must not leave: every temporary file, every face renamed
    try:
        for i, f in enumerate(files):
            try:
                staged.append(_stage(f, guard))
            except OSError as e:
                raise ReportWriteError(f, e, written=(), not_written=files[i:]) from None
        for i, (f, tmp) in enumerate(zip(files, staged, strict=True)):
            _guard(f.path, guard)
            try:
                os.replace(tmp, f.path)
            except OSError as e:
                raise ReportWriteError(f, e, written=written, not_written=files[i:]) from None
            written.append(f)
            if i == 0:
                pause("report_write")  # test-only (specparity/testpoints.py): inert unless its variable names it
    except BaseException as e:
        if not isinstance(e, Exception):  # Ctrl-C, SIGTERM/SIGHUP (serving/child/reaper.py Interrupted): a run cut short
            _unwritten(written)  # leaves none of its faces, so none can be read as its verdict
        raise
    finally:
        for tmp in staged:
            tmp.unlink(missing_ok=True)  # only those not renamed into place are still there
        for p in guard:  # what is on disk now is this call's result: the watchdog leaves it
            reaper.release_file(p.absolute())
    return [f.path for f in files]
