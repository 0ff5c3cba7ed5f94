"""NVIDIA Dynamo's workers as a launch command: ``python -m dynamo.sglang ARGS`` and ``python -m dynamo.vllm ARGS``.

A Dynamo worker takes the engine's own server flags plus Dynamo's. Dynamo's parse, as released (ai-dynamo 1.6.1,
the wheel of tag v1.6.1; paths are the wheel's, ``components/src/`` in the repository):

- SGLang (``dynamo/sglang/args.py``): an ``argparse.ArgumentParser`` of Dynamo's runtime and SGLang-worker flags
  (:570-576, ``allow_abbrev`` left on) takes its own with ``parse_known_args`` (:604); the worker router flags are
  taken out of the rest (:608, ``common/configuration/groups/router_args.py:352-363``); SGLang's own parser
  (``ServerArgs.add_cli_args``, :578-580) reads what is left (:633), after SGLang's ``--config`` merge (:626-628)
  and Dynamo's rewrite of ``--disaggregation-mode agg|pd`` to ``null`` (:458-463); ``ServerArgs.from_cli_args``
  builds the record (:887). Dynamo adds one flag of its own to SGLang's parser, the old
  ``--disable-piecewise-cuda-graph``, read as ``--cuda-graph-backend-prefill disabled`` when SGLang has the one and
  not the other (``dynamo/sglang/_compat.py:194-211``). Those two rewrites are SGLang's alone, so they live with
  SGLang's parse (``serving/sglang/command_parse.py`` ``dynamo_rewrites``).
- vLLM (``dynamo/vllm/args.py``): the same split with ``allow_abbrev=False`` (:122-126, :150, :153-154), then a
  ``FlexibleArgumentParser`` with ``AsyncEngineArgs.add_cli_args(..., async_args_only=False)`` (:136-137) reads
  the rest (:156) and ``AsyncEngineArgs.from_cli_args`` builds the engine's arguments (:166). No frontend flags
  (``--port``, ``--host``, ``--api-key``) and no positional model: ``--model``.

Here the engine's own parser reads the engine's part, in the engine's interpreter, and Dynamo's flags are set
aside: :func:`split` takes them out with the words that follow them, from the data that ``scripts/dynamo_flags.py``
reads from the release's source (``dynamo_flags.json``: each flag, how many words follow it, its file:line). Dynamo
itself is never imported (it need not be installed).

Where the two cannot be told apart without Dynamo, the parse refuses (exit 2) and says so, never a guess:

- a flag both Dynamo and the installed engine define (Dynamo's parser takes it first; whether it passes it on is
  Dynamo's code);
- an abbreviation (``--mig``): Dynamo's SGLang parser reads abbreviations against its own flags before SGLang sees
  them, and its flags differ between releases: under Dynamo, flags are given in full;
- ``--disagg-config``: Dynamo turns a section of that YAML into SGLang's ``--config`` (:613-623);
- a worker of another kind (``--embedding-worker``, ``--image-diffusion-worker``, ...): not an LLM server;
- a flag neither the engine nor the recorded Dynamo releases know: the engine's parser rejects it, and the message
  adds that it may be a flag of a Dynamo release specparity has not read.

Standard library only: it runs in the engine's child before the engine's parser.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("dynamo_flags.json")
_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")
# dynamo/sglang/args.py (ai-dynamo 1.6.1) lines cited in what the report says
SGLANG_SPLIT = "dynamo/sglang/args.py:604-633"
VLLM_SPLIT = "dynamo/vllm/args.py:150-166"


_ABBREV = {
    "dynamo.sglang": "Dynamo's SGLang worker reads an abbreviation against Dynamo's own flags before SGLang's parser "
                     "sees it (ai-dynamo 1.6.1 dynamo/sglang/args.py:570-604)",
    "dynamo.vllm": "Dynamo's vLLM worker reads none against its own flags (ai-dynamo 1.6.1 dynamo/vllm/args.py:122-126, "
                   "allow_abbrev=False) and leaves it to vLLM's parser, its SGLang worker does "
                   "(dynamo/sglang/args.py:570-604)",
}


class DynamoRefused(Exception):
    """The command cannot be read under Dynamo without Dynamo's own code: exit 2, naming the flag."""

    def __init__(self, message: str, flag: str | None = None) -> None:
        super().__init__(message)
        self.message, self.flag = message, flag


@dataclass
class Split:
    """The engine's words (for its own parser) and what was set aside as Dynamo's."""

    engine_args: list[str]
    set_aside: list[list[str]] = field(default_factory=list)  # each Dynamo flag with the words it took
    rewrites: list[str] = field(default_factory=list)
    releases: tuple[str, ...] = ()

    def notes(self, module: str, label: str) -> list[str]:
        split = SGLANG_SPLIT if module == "dynamo.sglang" else VLLM_SPLIT
        aside = " ".join(" ".join(words) for words in self.set_aside) or "none"
        out = [f"run under NVIDIA Dynamo (python -m {module}): {label}'s own parser read {label}'s flags; Dynamo's "
               f"own flags were set aside ({aside}), as ai-dynamo {', '.join(self.releases)} splits them "
               f"({split}); Dynamo itself was not run"]
        out += self.rewrites
        return out


def load(path: Path = DATA) -> dict[str, Any]:
    return dict(json.loads(path.read_text(encoding="utf-8")))


def dynamo_flags(engine: str, data: dict[str, Any] | None = None) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``({flag: {"arity", "at", "release"}}, releases)``: the union of Dynamo's worker flags for ``engine`` over the
    recorded releases. A flag whose arity differs between them has arity None (refused: its words are unknown)."""
    data = data or load()
    out: dict[str, Any] = {}
    releases = tuple(data["releases"])
    for version, release in data["releases"].items():
        for flag, info in release[engine].items():
            if flag in out and out[flag]["arity"] != info["arity"]:
                out[flag] = {**out[flag], "arity": None}
            else:
                out.setdefault(flag, {**info, "release": version})
    return out, releases


def _option(word: str) -> bool:
    return word.startswith("-") and len(word) > 1 and not _NEGATIVE.match(word)


def split(args: Sequence[str], *, engine: str, module: str, label: str, is_engine_option: Callable[[str], bool],
          engine_options: Iterable[str], data: dict[str, Any] | None = None) -> Split:
    """Take Dynamo's flags (and the words each takes) out of ``args``; the rest is the engine's, unchanged.

    ``is_engine_option(word)`` says whether a word (its ``=value`` cut off) is exactly one of the installed engine's
    option strings, as its parser spells them; ``engine_options`` are those strings (for abbreviations). Raises
    :class:`DynamoRefused` where the split needs Dynamo's own code (module docstring)."""
    flags, releases = dynamo_flags(engine, data)
    options = sorted(engine_options)
    where = f"ai-dynamo {', '.join(releases)}"
    out = Split([], releases=releases)
    i = 0
    while i < len(args):
        word = args[i]
        if not _option(word) or word == "--":
            out.engine_args.append(word)
            i += 1
            continue
        name, eq, _ = word.partition("=")
        info = flags.get(name)
        if info is not None:
            if is_engine_option(name):
                raise DynamoRefused(
                    f"{name} is both a flag of {label} and Dynamo's own ({info['at']}, {where}): Dynamo's parser "
                    f"takes it first, and whether {label} then sees it is Dynamo's code, which specparity does not "
                    "run; it cannot tell which one serves it without Dynamo", flag=name)
            taken = _values(args, i, info["arity"], name, bool(eq), label)
            if name == "--disagg-config":
                raise DynamoRefused(
                    f"--disagg-config ({info['at']}): Dynamo makes a section of that YAML into {label}'s --config "
                    "(dynamo/sglang/args.py:613-623), which specparity does not read without Dynamo: give the "
                    f"section's flags on the command line", flag=name)
            if name.endswith("-worker") and not name.startswith("--no-") and info["arity"] == 0:
                raise DynamoRefused(
                    f"{name} ({info['at']}) makes this Dynamo worker something other than an LLM server; specparity "
                    "checks the one that serves the target with its drafter", flag=name)
            out.set_aside.append(list(args[i:i + 1 + taken]))
            i += 1 + taken
            continue
        if not is_engine_option(name):
            theirs = {f for f in flags if f.startswith(name)}
            ours = {o for o in options if o.startswith(name)}
            near = sorted(theirs | ours)
            # a prefix of several engine flags and none of Dynamo's: the engine's parser refuses it as ambiguous
            # whoever reads it first, in its own words
            if near and name.startswith("--") and (theirs or len(ours) == 1):
                raise DynamoRefused(
                    f"{name} abbreviates {', '.join(near[:4])}{' ...' if len(near) > 4 else ''}: under Dynamo give "
                    f"flags in full. {_ABBREV[module]}, and Dynamo's flags differ between releases, so specparity "
                    "cannot tell whose flag an abbreviation is without Dynamo", flag=name)
        out.engine_args.append(word)
        i += 1
    return out


def _values(args: Sequence[str], i: int, arity: Any, name: str, attached: bool, label: str) -> int:
    """How many words after ``args[i]`` the Dynamo flag takes (argparse's rule for its ``nargs``)."""
    if arity is None:
        raise DynamoRefused(f"{name} takes a different number of words in different Dynamo releases: specparity "
                            "cannot tell where its value ends without Dynamo", flag=name)
    if attached or arity == 0:
        if attached and arity == 0:
            raise DynamoRefused(f"{name} takes no value, as Dynamo defines it", flag=name)
        return 0
    following = 0
    while i + 1 + following < len(args) and not _option(args[i + 1 + following]):
        following += 1
    if arity in ("*",):
        return following
    if arity == "?":
        return min(following, 1)
    need = 1 if arity == "+" else int(arity)
    if following < need:
        raise DynamoRefused(f"{name} needs {'a value' if need == 1 else f'{need} values'} (Dynamo's parser would "
                            "refuse it)", flag=name)
    return following if arity == "+" else need


def unknown_note(flag: str | None, releases: Sequence[str], label: str) -> str:
    """What a rejection of an unknown flag adds under Dynamo."""
    return (f"; under Dynamo: {flag or 'the flag'} is neither {label}'s nor a worker flag of ai-dynamo "
            f"{', '.join(releases)} (the releases whose source specparity has read, scripts/dynamo_flags.py); if it "
            "is another Dynamo release's own flag, specparity cannot tell it from the engine's without Dynamo, and "
            "refuses rather than guess")
