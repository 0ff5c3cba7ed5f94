"""Engine-argument values across the process boundary: the launch parse child's values, as the engine's own parser made
them, rebuilt in the resolve or capture child into values equal to them.

The parse runs in one child (``serving/<engine>/command_parse.py``), the engine's resolve or capture in another
(``serving/<engine>/worker.py``), and the parent in between holds the arguments as JSON (the gate merges
``--engine-arg`` into them; the request travels as a file). Plain JSON alone loses what the engine's parser made: an
enum member becomes its value (vLLM 0.32's ``CUDAGraphMode.FULL_AND_PIECEWISE`` is the tuple ``(2, 1)``,
``config/compilation.py:53-63``, a list in JSON, which ``CompilationConfig(**dict)`` in ``EngineArgs.__post_init__``
then refuses, ``engine/arg_utils.py:862-863``), a tuple a list, a config object a dict, ``inf`` a string.

:func:`encode` keeps plain JSON as it is (a ``str``, ``int``, ``bool``, ``None``, a finite ``float``, a ``list`` and a
``dict`` with ``str`` keys, recursively: what ``--engine-arg`` and pyproject tables give) and writes anything else as
an object tagged ``{"$specparity": KIND, ...}``:

- ``enum``: the class (``module:qualname``) and the member's name (a composite flag: its value);
- ``tuple``, ``set``, ``frozenset``: the items;
- ``float``: ``inf``, ``-inf``, ``nan`` as text;
- ``dict``: a dict whose keys are not all ``str`` (or that holds the tag key), as ``[key, value]`` pairs;
- ``mapping``: a dict subclass (``collections.Counter``), by class and pairs;
- ``path``: a ``pathlib`` path, by class and text;
- ``object``: an instance of a class whose pickling is the default one (``copyreg.__newobj__``: dataclasses,
  pydantic dataclasses, plain classes), by class and instance state, rebuilt as pickle rebuilds it: ``cls.__new__``
  and the state set back, without running ``__init__`` again, so the rebuilt object is the one the engine's parser
  made, even where ``__post_init__`` would not give it back from its own fields.

Why not pickle: the parent prints, merges and stores these arguments (reports, ``LaunchSpec.to_dict``), and a request
read back must not run arbitrary code. :func:`decode` imports classes only from the engines' packages and the
standard library modules listed in :data:`_DECODABLE_ROOTS`, and only enum classes, ``pathlib`` paths, dict
subclasses and classes with the default pickling.

A value none of these carries (a callable, an object with its own ``__reduce__``) is ``opaque``: :func:`decode`
raises :class:`UntransportableValue` naming it, which the child reports as specparity's own limit, never as the
engine refusing the deployment.

:func:`shown` is the readable view of an encoded value (a member's name, a list for a tuple, an object's state).

Standard library only: both children import it before the engine.
"""

from __future__ import annotations

import collections
import copyreg
import enum
import importlib
import json
import math
import pathlib
from collections.abc import Mapping
from typing import Any

TAG = "$specparity"
_MAX_DEPTH = 32
# where decode may import a class from: the engines' own packages, and the standard library's
_DECODABLE_ROOTS = frozenset({"vllm", "sglang", "pathlib", "collections", "enum"})


class UntransportableValue(ValueError):
    """An engine-argument value specparity cannot rebuild in the engine's child (an ``opaque`` encoding)."""


def _qualified(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _sort_key(encoded: Any) -> str:
    return json.dumps(encoded, sort_keys=True)


def encode(value: Any, _depth: int = 0) -> Any:
    """``value`` as JSON that :func:`decode` rebuilds into an equal value (module docstring)."""
    if _depth > _MAX_DEPTH:
        return _opaque(value, "nested too deep")
    d = _depth + 1
    if isinstance(value, enum.Enum):  # before str and int: StrEnum and IntEnum members are both
        cls = type(value)
        if not _importable(cls):
            return _opaque(value, "an enum class specparity does not import")
        name = value.name
        if name is not None and cls.__members__.get(name) is value:
            return {TAG: "enum", "class": _qualified(cls), "name": name}
        return {TAG: "enum", "class": _qualified(cls), "value": encode(value.value, d)}
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        return value if math.isfinite(value) else {TAG: "float", "text": repr(value)}
    if kind is list:
        return [encode(v, d) for v in value]
    if kind is tuple:
        return {TAG: "tuple", "items": [encode(v, d) for v in value]}
    if kind in (set, frozenset):
        return {TAG: kind.__name__, "items": sorted((encode(v, d) for v in value), key=_sort_key)}
    if kind is dict:
        if all(type(k) is str for k in value) and TAG not in value:
            return {k: encode(v, d) for k, v in value.items()}
        return {TAG: "dict", "items": [[encode(k, d), encode(v, d)] for k, v in value.items()]}
    if isinstance(value, dict) and _importable(kind) and not getattr(value, "__dict__", None) \
            and not isinstance(value, collections.defaultdict):  # a dict subclass with no state of its own
        return {TAG: "mapping", "class": _qualified(kind), "items": [[encode(k, d), encode(v, d)]
                                                                      for k, v in value.items()]}
    if isinstance(value, pathlib.PurePath):
        return {TAG: "path", "class": _qualified(kind), "text": str(value)}
    state = _default_state(value)
    if state is not None:
        return {TAG: "object", "class": _qualified(kind), "state": {k: encode(v, d) for k, v in state.items()}}
    return _opaque(value, "no default pickling")


def _opaque(value: Any, why: str) -> dict[str, Any]:
    text = repr(value)
    return {TAG: "opaque", "class": _qualified(type(value)), "repr": text if len(text) <= 300 else text[:300] + "...",
            "why": why}


def _importable(cls: type) -> bool:
    """Whether :func:`decode` can find ``cls`` again by its module and qualified name."""
    if "<locals>" in cls.__qualname__ or cls.__module__.split(".")[0] not in _DECODABLE_ROOTS:
        return False
    try:
        return _find_class(_qualified(cls)) is cls
    except (ImportError, AttributeError, UntransportableValue):
        return False


def _default_state(value: Any) -> dict[str, Any] | None:
    """The instance state pickle would save for ``value`` when its class pickles the default way (a dataclass, a
    pydantic dataclass, a plain class: ``copyreg.__newobj__(cls)`` plus the instance ``__dict__``), else None."""
    cls = type(value)
    if not _importable(cls):
        return None
    try:
        reduced = value.__reduce_ex__(4)
    except Exception:
        return None
    if not isinstance(reduced, tuple) or len(reduced) < 3 or reduced[0] is not copyreg.__newobj__:  # type: ignore[attr-defined]
        return None
    if tuple(reduced[1]) != (cls,) or any(len(reduced) > i and reduced[i] is not None for i in (3, 4, 5)):
        return None
    state = reduced[2]
    if state is None:
        return {}
    if isinstance(state, dict) and all(type(k) is str for k in state):
        return dict(state)
    return None


def _find_class(qualified: str) -> Any:
    module, _, qualname = qualified.partition(":")
    if module.split(".")[0] not in _DECODABLE_ROOTS or not qualname:
        raise UntransportableValue(f"specparity does not rebuild objects of {qualified} (not an engine's class)")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def decode(value: Any) -> Any:
    """The value :func:`encode` was given, rebuilt (in the interpreter whose engine made it)."""
    if type(value) is list:
        return [decode(v) for v in value]
    if type(value) is not dict:
        return value
    kind = value.get(TAG)
    if kind is None:
        return {k: decode(v) for k, v in value.items()}
    if kind == "tuple":
        return tuple(decode(v) for v in value["items"])
    if kind == "set":
        return {decode(v) for v in value["items"]}
    if kind == "frozenset":
        return frozenset(decode(v) for v in value["items"])
    if kind == "float":
        return float(value["text"])
    if kind == "dict":
        return {decode(k): decode(v) for k, v in value["items"]}
    if kind == "opaque":
        raise UntransportableValue(f"specparity cannot carry the engine-argument value {value.get('repr')} (a "
                                   f"{value.get('class')}, {value.get('why')}) from the engine's parse of the command "
                                   "to the engine's own run: a limit of specparity, not of the deployment")
    cls = _find_class(str(value["class"]))
    if kind == "enum":
        if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
            raise UntransportableValue(f"{value['class']} is not an enum")
        return cls[value["name"]] if "name" in value else cls(decode(value["value"]))
    if kind == "path":
        if not (isinstance(cls, type) and issubclass(cls, pathlib.PurePath)):
            raise UntransportableValue(f"{value['class']} is not a path class")
        return cls(value["text"])
    if kind == "mapping":
        if not (isinstance(cls, type) and issubclass(cls, dict)):
            raise UntransportableValue(f"{value['class']} is not a dict class")
        mapping = cls()
        dict.update(mapping, ((decode(k), decode(v)) for k, v in value["items"]))  # the items as they were
        return mapping
    if kind == "object":
        if not isinstance(cls, type):
            raise UntransportableValue(f"{value['class']} is not a class")
        new: Any = cls.__new__  # as pickle rebuilds it (copyreg.__newobj__)
        obj = new(cls)
        state = {k: decode(v) for k, v in value["state"].items()}
        setstate = getattr(obj, "__setstate__", None)
        if setstate is not None and getattr(cls, "__setstate__", None) is not getattr(object, "__setstate__", None):
            setstate(state)
        else:
            for k, v in state.items():
                object.__setattr__(obj, k, v)
        return obj
    raise UntransportableValue(f"unknown encoding {kind!r}")


def decode_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """Engine keywords as they crossed (plain, or :func:`encode`\\ d), rebuilt."""
    return {str(k): decode(v) for k, v in args.items()}


def shown(value: Any) -> Any:
    """The readable plain-JSON view of an encoded value: a member's name, a tuple or set as a list, a path or a
    non-finite float as its text, an object as its state."""
    if type(value) is list:
        return [shown(v) for v in value]
    if type(value) is not dict:
        return value
    kind = value.get(TAG)
    if kind is None:
        return {k: shown(v) for k, v in value.items()}
    if kind in ("tuple", "set", "frozenset"):
        return [shown(v) for v in value["items"]]
    if kind == "float" or kind == "path":
        return value["text"]
    if kind in ("dict", "mapping"):
        return {json.dumps(shown(k)) if not isinstance(shown(k), str) else shown(k): shown(v)
                for k, v in value["items"]}
    if kind == "enum":
        return value["name"] if "name" in value else shown(value["value"])
    if kind == "object":
        return {k: shown(v) for k, v in value["state"].items()}
    return value.get("repr")
