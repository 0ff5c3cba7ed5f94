"""Which ``set_eagle3_layers_to_capture`` ran, read from the installed SGLang at resolution time.

The capture rule a report quotes is the code of the release that resolved the deployment, not a line number
remembered from another release: :func:`traced` runs the static level's setter call (the ``configure`` of
:func:`~.meta_build.read_capture`) under a profile hook that records every function named
``set_eagle3_layers_to_capture`` entered, outermost first. A delegating wrapper (Kimi-K2.5 ``models/kimi_k25.py``,
Llama-4 ``models/mllama4.py``) thus gives its own setter, then its language model's, which holds the rule.
Each one is cited by :func:`cite`: the defining class, the file under the ``sglang`` package, its first and last
line and its source text, all from ``inspect`` on the code object that ran.

Plain tuples, so they travel on :class:`~specparity.serving.results.ResolvedDeployment` as JSON. Importable
without sglang; the tracing runs only inside the child process.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

SETTER = "set_eagle3_layers_to_capture"
# the DFlash path's setters (sglang 0.5.23 attention_backend_setup.py:62-66 calls one of them instead)
SETTERS = frozenset({SETTER, "set_dflash_layers_to_capture", "set_dspark_layers_to_capture"})
# (function, file under the sglang package, first line, last line, source text); a first and last line of 0 and
# an empty text: no source to read (the file is missing or compiled)
Citation = tuple[str, str, int, int, str]


def _package_root() -> str | None:
    """The directory holding the imported ``sglang`` package (paths are cited from there: ``sglang/srt/...``)."""
    module = sys.modules.get("sglang")
    where = getattr(module, "__file__", None)
    return os.path.dirname(os.path.dirname(os.path.abspath(where))) if where else None


def relative_file(filename: str) -> str:
    """``filename`` as ``sglang/srt/...`` when it lies in the imported sglang package, else unchanged."""
    root = _package_root()
    path = os.path.abspath(filename)
    if root is not None and path.startswith(os.path.join(root, "sglang") + os.sep):
        return os.path.relpath(path, root).replace(os.sep, "/")
    return filename


def _owner_name(code: CodeType, receiver: Any) -> str:
    """``Class.method`` for the class in ``receiver``'s MRO whose attribute runs ``code``."""
    for klass in type(receiver).__mro__ if receiver is not None else ():
        fn = vars(klass).get(code.co_name)
        if getattr(fn, "__code__", None) is code:
            return f"{klass.__name__}.{code.co_name}"
    return str(getattr(code, "co_qualname", code.co_name))


def cite(code: CodeType, function: str) -> Citation:
    """The citation of one code object: where it lies in the installed release and its text."""
    try:
        lines, first = inspect.getsourcelines(code)
    except (OSError, TypeError):
        return (function, relative_file(code.co_filename), 0, 0, "")
    return (function, relative_file(code.co_filename), first, first + len(lines) - 1, "".join(lines))


def traced(configure: Callable[[Any], None], model: Any) -> tuple[Citation, ...]:
    """Run ``configure(model)`` and cite every setter of :data:`SETTERS` it entered, outermost first.

    A profile hook, not a trace hook: it sees calls only, and leaves ``sys.settrace`` (coverage, debuggers) alone.
    The previous profile hook is restored even when ``configure`` raises (the exception propagates).
    """
    seen: list[tuple[CodeType, str]] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        code = frame.f_code
        if event == "call" and code.co_name in SETTERS and all(code is not c for c, _ in seen):
            seen.append((code, _owner_name(code, frame.f_locals.get("self"))))

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        configure(model)
    finally:
        sys.setprofile(previous)
    return tuple(cite(code, name) for code, name in seen)


def citation_text(c: Citation) -> str:
    """``Class.method at sglang/srt/models/llama.py:700-706``."""
    function, path, first, last, _ = c
    where = path if not first else f"{path}:{first}" + (f"-{last}" if last != first else "")
    return f"{function} at {where}"


class SetterTrace:
    """A ``configure`` for :func:`~.meta_build.read_capture`: runs ``configure`` under :func:`traced` and
    keeps what it cited in :attr:`citations`."""

    def __init__(self, configure: Callable[[Any], None]) -> None:
        self._configure = configure
        self.citations: tuple[Citation, ...] = ()

    def __call__(self, model: Any) -> None:
        self.citations = traced(self._configure, model)
