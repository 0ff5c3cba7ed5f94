"""Error types shared by every room, and the CLI exit codes they map to.

Exit codes (stable; CI scripts depend on them):
  0  pass
  1  the deployment does not match the contract: it serves other fc inputs, SGLang refuses to load it or
     crashes on it because of the draft or target as deployed, or the target is not the one trained on
  2  bad input or usage (a file or field the user gave is wrong)
  3  the check could not run here (SGLang missing or unsupported, out of memory, timeout)
"""

from __future__ import annotations

from pathlib import Path

EXIT_PASS = 0
EXIT_PARITY_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_ENVIRONMENT = 3


class SpecparityError(Exception):
    """Base class; ``exit_code`` says how the CLI ends when this escapes."""

    exit_code = EXIT_ENVIRONMENT


class InputError(SpecparityError):
    """Something the user gave is malformed. The message names the file and the field."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, *, path: str | Path | None = None, field: str | None = None) -> None:
        self.path = str(path) if path is not None else None
        self.field = field
        self.detail = message
        where = ""
        if self.path is not None:
            where = self.path + (f": {field}" if field else "")
        elif field:
            where = field
        super().__init__(f"{where}: {message}" if where else message)


class EnvironmentProblem(SpecparityError):
    """The environment cannot run the check (SGLang missing, crashed, timed out)."""

    exit_code = EXIT_ENVIRONMENT
