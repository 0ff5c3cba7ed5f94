"""Which releases of an engine accept a server flag that the installed one rejects.

A published command is often written for another release than the one installed here: SGLang's own docs give
``--cuda-graph-max-bs``, which 0.5.23 split into ``--cuda-graph-max-bs-decode``/``-prefill`` (ambiguous to it);
vLLM's older ``--speculative-model`` is gone. When the installed engine's parser rejects a flag as unknown or
ambiguous, :func:`history_notes` says which releases accept it, exactly or as the one flag it abbreviates (argparse's
``allow_abbrev``, on in both engines' parsers), and that ``--python`` points the parse at the serving env's own
interpreter. The engine's message stays the answer: the installed release is what parsed.

The data (``flag_history.json``) is built by ``scripts/flag_history.py`` from the engines' release wheels (their
own ``server_args``/``arg_utils`` at each release; the script's docstring says how each was read): per engine, the
releases read in order and, for every flag, the runs of consecutive releases that have it. Standard library only.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("flag_history.json")
LABELS = {"sglang": "SGLang", "vllm": "vLLM"}
_REJECTED = re.compile(r"unrecognized arguments?:|ambiguous option:")


@functools.lru_cache(maxsize=1)
def load(path: Path = DATA) -> dict[str, Any]:
    return dict(json.loads(path.read_text(encoding="utf-8")))


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version))


def _flags_in(history: dict[str, Any], release: str) -> set[str]:
    k = _key(release)
    return {f for f, runs in history["flags"].items() if any(_key(a) <= k <= _key(b) for a, b in runs)}


def accepting(engine: str, flag: str, data: dict[str, Any] | None = None) -> list[tuple[str, str | None]]:
    """``[(release, the flag it abbreviates or None), ...]``: the releases read whose parser takes ``flag``, exactly
    or as the one long flag it is a prefix of."""
    history = (data or load())[engine]
    name = flag.split("=", 1)[0]
    if engine == "vllm" and name.startswith("--"):  # FlexibleArgumentParser reads _ as - and --json-arg.key
        name = "--" + name[2:].split(".", 1)[0].replace("_", "-")
    out: list[tuple[str, str | None]] = []
    runs = history["flags"].get(name)
    if runs:
        exact = {r for r in history["releases"] if any(_key(a) <= _key(r) <= _key(b) for a, b in runs)}
    else:
        exact = set()
    for release in history["releases"]:
        if release in exact:
            out.append((release, None))
        elif name.startswith("--"):
            matches = [f for f in _flags_in(history, release) if f.startswith(name)]
            if len(matches) == 1:
                out.append((release, matches[0]))
    return out


def _spans(releases: list[str], chosen: Iterable[str]) -> str:
    """``0.4.0-0.5.19, 0.5.21``: runs of consecutive releases among those read."""
    wanted = set(chosen)
    parts: list[list[str]] = []
    previous = False
    for r in releases:
        if r in wanted:
            if previous:
                parts[-1][1] = r
            else:
                parts.append([r, r])
        previous = r in wanted
    return ", ".join(a if a == b else f"{a}-{b}" for a, b in parts)


def rejected_flags(message: str, flag: str | None) -> list[str]:
    """The flags a parser's rejection names: every ``--word`` after ``unrecognized arguments:``, else ``flag``."""
    m = re.search(r"unrecognized arguments?: (.*)", message)
    if m:
        return [w for w in m.group(1).split() if w.startswith("-") and len(w) > 1]
    return [flag] if flag else []


def history_notes(engine: str, message: str, flag: str | None, *, installed: str,
                  data: dict[str, Any] | None = None) -> str:
    """What a rejection adds: for each flag it names that other releases accept, which; then ``--python``. Empty
    when the message is not an unknown/ambiguous flag, or no release read accepts the flag."""
    if not _REJECTED.search(message):
        return ""
    data = data or load()
    history = data[engine]
    label = LABELS.get(engine, engine)
    said = []
    for f in rejected_flags(message, flag):
        found = [(r, full) for r, full in accepting(engine, f, data) if r != installed]
        if not found:
            continue
        exact = [r for r, full in found if full is None]
        abbrev: dict[str, list[str]] = {}
        for r, full in found:
            if full is not None:
                abbrev.setdefault(full, []).append(r)
        parts = []
        if exact:
            parts.append(f"a flag of {label} {_spans(history['releases'], exact)}")
        parts += [f"the abbreviation of {full} in {label} {_spans(history['releases'], rs)}"
                  for full, rs in abbrev.items()]
        said.append(f"{f.split('=', 1)[0]} is {' and '.join(parts)}")
    if not said:
        return ""
    first, last = history["releases"][0], history["releases"][-1]
    parsed = f"{label} {installed}" if installed != "?" else f"The installed {label}"
    return (f". {'; '.join(said)} (of the {label} releases {first} to {last} read from their published code, "
            f"scripts/flag_history.py). {parsed} is what parsed here: if the server runs another release, give "
            "--python with the serving env's own interpreter, and the parse uses that release's parser")
