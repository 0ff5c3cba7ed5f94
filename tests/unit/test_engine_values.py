"""serving/engine_values.py: the encoding engine arguments cross the parent in (no engine here; the engines' own
values are held to it in tests/vllm_engine/test_vllm_engine_args_transport.py and
tests/serving/test_server_args_transport.py)."""

from __future__ import annotations

import collections
import dataclasses
import enum
import json
import math
import pathlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specparity.serving import engine_values
from specparity.serving.engine_values import TAG, UntransportableValue, decode, decode_args, encode, shown


class Mode(enum.Enum):
    NONE = 0
    FULL_AND_PIECEWISE = (2, 1)  # a tuple value, as vLLM's CUDAGraphMode


class Bits(enum.Flag):
    A = 1
    B = 2


@dataclasses.dataclass
class Inner:
    on: bool = False


@dataclasses.dataclass
class Config:
    mode: Mode = Mode.NONE
    sizes: tuple[int, ...] = ()
    inner: Inner = dataclasses.field(default_factory=Inner)
    derived: int = dataclasses.field(init=False, default=0)

    def __post_init__(self) -> None:  # not idempotent: rebuilding by __init__ would not give the object back
        self.derived += 1


@pytest.fixture
def here(monkeypatch: pytest.MonkeyPatch) -> None:
    """This module's classes count as an engine's (decode imports classes only from the engines' packages)."""
    monkeypatch.setattr(engine_values, "_DECODABLE_ROOTS", engine_values._DECODABLE_ROOTS | {__name__.split(".")[0]})


def _wire(value: Any) -> Any:
    return json.loads(json.dumps(encode(value), allow_nan=False))


@pytest.mark.parametrize("value", [None, True, 3, "x", 0.1, [1, "a", None], {"a": {"b": [1.5, False]}}])
def test_plain_json_crosses_unchanged(value: Any) -> None:
    assert encode(value) == value and decode(_wire(value)) == value


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
                    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
                    | st.frozensets(st.integers() | st.text(max_size=3), max_size=3)
                    | st.dictionaries(st.text(max_size=3) | st.integers(), inner, max_size=3), max_leaves=10))
@settings(max_examples=200, deadline=None, database=None)
def test_builtin_values_come_back_equal_and_of_the_same_types(value: Any) -> None:
    back = decode(_wire(value))
    assert _same(back, value)


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def test_a_set_and_a_tag_key_are_kept() -> None:
    assert decode(_wire({1, 2})) == {1, 2} and type(decode(_wire({1}))) is set
    odd = {TAG: "tuple", "items": [1]}  # a user's dict that looks like an encoding
    assert decode(_wire(odd)) == odd


def test_enum_tuple_value_and_config_object_come_back(here: None) -> None:
    cfg = Config(mode=Mode.FULL_AND_PIECEWISE, sizes=(1, 2, 4), inner=Inner(on=True))
    wire = _wire(cfg)
    assert wire["state"]["mode"] == {TAG: "enum", "class": f"{__name__}:Mode", "name": "FULL_AND_PIECEWISE"}
    back = decode(wire)
    assert back == cfg and back.mode is Mode.FULL_AND_PIECEWISE and back.derived == 1  # __post_init__ not rerun
    assert type(back.sizes) is tuple and type(back.inner) is Inner
    assert shown(wire)["mode"] == "FULL_AND_PIECEWISE" and shown(wire)["sizes"] == [1, 2, 4]
    assert decode(_wire(Bits.A | Bits.B)) == Bits.A | Bits.B


def test_standard_library_kinds_come_back() -> None:
    counter = collections.Counter({"a": 2})
    assert _wire(collections.defaultdict(list))[TAG] == "opaque"  # its default_factory is state a dict lacks
    assert decode(_wire(counter)) == counter and type(decode(_wire(counter))) is collections.Counter
    assert decode(_wire(pathlib.PurePosixPath("/m"))) == pathlib.PurePosixPath("/m")
    assert decode(_wire(enum.FlagBoundary.STRICT)) is enum.FlagBoundary.STRICT
    assert shown(_wire(float("inf"))) == "inf" and decode(_wire(float("-inf"))) == float("-inf")


def test_what_cannot_be_carried_is_named_never_guessed() -> None:
    wire = _wire({"hook": len, "local": Mode.NONE})  # a callable; an enum of a module decode does not import
    assert wire["hook"][TAG] == "opaque" and wire["local"][TAG] == "opaque"
    with pytest.raises(UntransportableValue, match="specparity cannot carry"):
        decode_args(wire)


def test_decode_imports_no_class_outside_the_engines() -> None:
    with pytest.raises(UntransportableValue, match="not an engine's class"):
        decode({TAG: "object", "class": "os:system", "state": {}})
    with pytest.raises(UntransportableValue, match="not an enum"):
        decode({TAG: "enum", "class": "collections:Counter", "name": "x"})
