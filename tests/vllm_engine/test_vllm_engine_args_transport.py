"""vLLM's ``EngineArgs`` values survive the trip from the launch parse child to the resolve/capture child.

For every field of the installed release's ``AsyncEngineArgs`` whose type is not a plain scalar (a config object, an
enum, a tuple, a list, a set, a dict: found by introspecting the dataclass fields with vLLM's own type reader,
``engine/arg_utils.py:261``, not a hand list), a value is built through vLLM's own parser (argv words ->
``make_arg_parser`` on a ``FlexibleArgumentParser``, as the api_server entry builds it,
``entrypoints/launchers/api_server/entry.py:224-228`` -> ``AsyncEngineArgs.from_cli_args``,
``engine/arg_utils.py:1933-1941``) and taken through the product path: the parse child's encoding
(``command_parse.transported_args``) -> JSON text of the worker request -> the worker's keyword builder
(``worker.llm_kwargs``) -> ``EngineArgs(**kw)``. The field must equal (same type, same value) what vLLM's parser
made. A config object's JSON sets one of its own fields (found the same way), with hypothesis over the field and its
value (enum members by name, literals, numbers, booleans); words vLLM's parser refuses are not generated values.
``--compilation-config '{"cudagraph_mode": "FULL_AND_PIECEWISE"}'`` (a published recipe's flag) is one explicit row.
In process: no engine starts.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import io
import json
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specparity.serving.child.worker_common import WorkerRequest
from specparity.serving.command.parse_child import SECRET_DEST
from specparity.serving.vllm.command_parse import transported_args
from specparity.serving.vllm.worker import llm_kwargs

pytestmark = pytest.mark.vllm

from vllm.engine import arg_utils  # noqa: E402
from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs  # noqa: E402
from vllm.entrypoints.launchers.cli_args import make_arg_parser  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TARGET, DRAFT = REPO / "fixtures" / "vllm" / "target", REPO / "fixtures" / "vllm" / "draft"
PARSER = make_arg_parser(FlexibleArgumentParser())
ACTIONS: dict[str, argparse.Action] = {}
for _a in PARSER._actions:
    if _a.option_strings and _a.dest not in ACTIONS:
        ACTIONS[_a.dest] = _a
FIELDS = {f.name: f for f in dataclasses.fields(AsyncEngineArgs)}
_PLAIN = (str, int, float, bool, type(None))


def _hints(tp: Any) -> set[Any]:
    return set(arg_utils.get_type_hints(tp))  # vLLM's own reader of a field's type (what its parser is built from)


def _plain(tp: Any) -> bool:
    return all(h in _PLAIN or (typing.get_origin(h) is typing.Literal and all(type(v) in _PLAIN
                                                                             for v in typing.get_args(h)))
               for h in _hints(tp))


NON_PLAIN = sorted(n for n, f in FIELDS.items() if not _plain(f.type))
NO_FLAG = sorted(n for n in NON_PLAIN if n not in ACTIONS)  # no command can set them: nothing crosses
SECRET = sorted(n for n in FIELDS if SECRET_DEST.search(n))  # never leave the parse child (serving/command/parse_child.py)
CROSSING = [n for n in NON_PLAIN if n not in NO_FLAG and n not in SECRET and n != "model"]


def _enum_of(hints: set[Any]) -> type[enum.Enum] | None:
    return next((h for h in hints if isinstance(h, type) and issubclass(h, enum.Enum)), None)


def _dataclass_of(hints: set[Any]) -> type | None:
    return next((h for h in hints if isinstance(h, type) and dataclasses.is_dataclass(h)), None)


_word = st.from_regex(r"[A-Za-z][A-Za-z0-9_.-]{0,8}", fullmatch=True)
_json_scalar = st.none() | st.booleans() | st.integers(-1000, 1000) | st.floats(allow_nan=False, allow_infinity=False) \
    | st.text(max_size=6)
_json = st.recursive(_json_scalar, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)


def _value(tp: Any, depth: int = 0) -> st.SearchStrategy[Any] | None:
    """A JSON value for a config field of type ``tp`` (what a user would write in the flag's JSON), or None."""
    options: list[st.SearchStrategy[Any]] = []
    for h in _hints(tp):
        origin = typing.get_origin(h)
        if h is type(None):
            options.append(st.none())
        elif h is bool:
            options.append(st.booleans())
        elif h is int:
            options.append(st.integers(0, 64))
        elif h is float:
            options.append(st.floats(0, 4, allow_nan=False))
        elif h is str:
            options.append(_word)
        elif origin is typing.Literal:
            options.append(st.sampled_from(list(typing.get_args(h))))
        elif isinstance(h, type) and issubclass(h, enum.Enum):
            options.append(st.sampled_from([m.name for m in h]))
        elif origin in (list, tuple, set) or h in (list, tuple, set):
            args = [a for a in typing.get_args(h) if a is not Ellipsis]
            inner = _value(args[0], depth + 1) if args else st.integers(0, 64)
            if inner is not None:
                options.append(st.lists(inner, max_size=3))
        elif origin is dict or h is dict:
            options.append(st.dictionaries(_word, _json_scalar, max_size=2))
        elif isinstance(h, type) and dataclasses.is_dataclass(h) and depth < 1:
            options.append(_config_json(h, depth + 1))
    return st.one_of(options) if options else None


def _config_json(cls: type, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """A JSON object for config class ``cls``: empty, or one of its fields (a hypothesis choice) set."""
    one: list[st.SearchStrategy[dict[str, Any]]] = []
    for f in dataclasses.fields(cls):
        if not f.init or f.name.startswith("_"):
            continue
        v = _value(f.type, depth)
        if v is not None:
            one.append(v.map(lambda x, name=f.name: {name: x}))
    return st.just({}) | st.one_of(one) if one else st.just({})


def _words(name: str) -> st.SearchStrategy[list[str]]:
    """argv words for the flag of field ``name``, from the field's type as vLLM builds the flag from it
    (``engine/arg_utils.py:319-430``)."""
    action, hints = ACTIONS[name], _hints(FIELDS[name].type)
    cls = _dataclass_of(hints)
    if cls is not None:  # parse_dataclass: TypeAdapter(cls).validate_json (:363-367)
        return _config_json(cls).map(lambda d: [json.dumps(d)])
    members = _enum_of(hints)
    if members is not None:  # an enum given by name (its parser's type is str)
        return st.sampled_from([m.name for m in members]).map(lambda w: [w])
    if action.nargs == "+":
        if action.choices:
            return st.lists(st.sampled_from([c for c in action.choices if c is not None]), min_size=1, max_size=3)
        element = next((typing.get_args(h)[0] for h in hints if typing.get_origin(h) in (list, set, tuple)
                        and typing.get_args(h)), str)
        return st.lists(st.integers(0, 512).map(str) if element is int else _word, min_size=1, max_size=3)
    if name == "device_ids":  # comma-separated ids (:1162-1167)
        return st.lists(st.integers(0, 7).map(str) | _word, min_size=1, max_size=3).map(lambda v: [",".join(v)])
    if any(h is dict or typing.get_origin(h) is dict for h in hints) or "dict" in str(FIELDS[name].type):
        return st.dictionaries(_word, _json, max_size=3).map(lambda d: [json.dumps(d)])
    if action.choices:
        return st.sampled_from([str(c) for c in action.choices if c is not None]).map(lambda w: [w])
    if str in hints:  # a str-or-class field (distributed_executor_backend, scheduler_cls): the CLI gives the str
        return _word.map(lambda w: [w])
    raise AssertionError(f"no generator for --{name} (types {hints}, nargs {action.nargs}): add one so that this "
                         "field's transport is tested")


def _parse(words: list[str]) -> Any:
    """vLLM's own parse, or None where its parser or EngineArgs refuses the words (then nothing crosses)."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return AsyncEngineArgs.from_cli_args(PARSER.parse_args(words))
    except (SystemExit, ValueError, TypeError, AssertionError):
        return None


def _round_trip(reference: Any, name: str) -> Any:
    """The value of field ``name`` in the worker's ``EngineArgs`` after the transport."""
    engine_args, shown = transported_args(reference, [name], set(FIELDS))
    json.dumps(shown, allow_nan=False)  # the reports' view stays plain JSON
    wire = json.loads(json.dumps(WorkerRequest("resolve", "/t", "/d", server_args=engine_args).to_dict(),
                                 allow_nan=False))
    kw, _, _ = llm_kwargs(WorkerRequest.from_dict(wire))
    return getattr(EngineArgs(**kw), name)


def _assert_same(name: str, words: list[str], reference: Any) -> None:
    want, got = getattr(reference, name), _round_trip(reference, name)
    assert type(got) is type(want) and got == want, \
        f"{words}: {got!r} after transport, vLLM's parser made {want!r}"


def test_the_fields_are_found_by_introspection() -> None:
    """The sweep covers what the installed release has, not a hand list (printed with -s)."""
    kinds = {n: sorted(getattr(h, "__name__", str(h)) for h in _hints(FIELDS[n].type)) for n in CROSSING}
    assert any(_dataclass_of(_hints(FIELDS[n].type)) for n in CROSSING), kinds
    assert any(_enum_of(_hints(FIELDS[n].type)) for n in CROSSING), kinds
    assert "compilation_config" in CROSSING
    print(f"{len(FIELDS)} AsyncEngineArgs fields: {len(NON_PLAIN)} non-plain, {len(CROSSING)} crossing; no flag: "
          f"{', '.join(NO_FLAG)}; secret-named, never crossing: {', '.join(SECRET)}")


_EXAMPLES = settings(max_examples=15, deadline=None, derandomize=True, database=None,
                     suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])


@pytest.mark.parametrize("name", CROSSING)
def test_engine_arg_survives_the_transport(name: str) -> None:
    flag = next(o for o in ACTIONS[name].option_strings if o.startswith("--"))
    crossed: list[list[str]] = []

    @_EXAMPLES
    @given(_words(name))
    def check(words: list[str]) -> None:
        reference = _parse([flag, *words])
        if reference is None:
            return
        _assert_same(name, [flag, *words], reference)
        crossed.append(words)

    check()
    assert crossed, f"vLLM's parser accepted none of the generated {flag} values: the field was not tested"


@pytest.mark.parametrize("name", sorted(n for n in CROSSING if _enum_of(_hints(FIELDS[n].type))))
def test_every_member_of_an_enum_field_survives(name: str) -> None:
    flag = next(o for o in ACTIONS[name].option_strings if o.startswith("--"))
    members = _enum_of(_hints(FIELDS[name].type))
    assert members is not None
    crossed = 0
    for member in members:
        reference = _parse([flag, member.name])
        if reference is not None:
            _assert_same(name, [flag, member.name], reference)
            crossed += 1
    assert crossed


def _enum_subfields() -> list[tuple[str, str, str]]:
    """(engine arg, config field, member name) for every enum member of every config object's enum field."""
    out = []
    for name in CROSSING:
        cls = _dataclass_of(_hints(FIELDS[name].type))
        if cls is None:
            continue
        for f in dataclasses.fields(cls):
            members = _enum_of(_hints(f.type)) if f.init else None
            out += [(name, f.name, m.name) for m in members or ()]
    return out


@pytest.mark.parametrize(("name", "field", "member"), _enum_subfields())
def test_every_enum_member_inside_a_config_object_survives(name: str, field: str, member: str) -> None:
    words = [next(o for o in ACTIONS[name].option_strings if o.startswith("--")), json.dumps({field: member})]
    reference = _parse(words)
    if reference is None:
        pytest.skip(f"vLLM's own parser refuses {words}")
    _assert_same(name, words, reference)


def test_the_published_compilation_config_row() -> None:
    """vLLM's own recipes' flag: CUDAGraphMode.FULL_AND_PIECEWISE, whose value (2, 1) plain JSON turned into a list
    that CompilationConfig refused."""
    from vllm.config.compilation import CUDAGraphMode

    words = ["--compilation-config", '{"cudagraph_mode": "FULL_AND_PIECEWISE"}']
    reference = _parse(words)
    assert reference is not None
    assert reference.compilation_config.cudagraph_mode is CUDAGraphMode.FULL_AND_PIECEWISE
    _assert_same("compilation_config", words, reference)
    assert _round_trip(reference, "compilation_config").cudagraph_mode is CUDAGraphMode.FULL_AND_PIECEWISE


def test_explain_launch_with_the_published_compilation_config_resolves(tmp_path: Path) -> None:
    """End to end (the parse child, the parent, vLLM's resolve in its own child): the recipe's --compilation-config
    is vLLM's to accept, never "vLLM refuses the deployment" from our transport (exit 1 before)."""
    from click.testing import CliRunner

    from specparity.cli import main

    spec = json.dumps({"method": "eagle3", "model": str(DRAFT), "num_speculative_tokens": 3})
    report = tmp_path / "explain.json"
    result = CliRunner().invoke(main, ["explain", "--json", str(report), "--launch", "--", "vllm", "serve",
                                       str(TARGET), "--speculative-config", spec, "--compilation-config",
                                       '{"cudagraph_mode": "FULL_AND_PIECEWISE"}'])
    assert "refuses" not in result.output, result.output
    assert result.exit_code == 0, result.output
    launch = json.loads(report.read_text())["launch"]
    assert launch["engine_args_encoded"]["compilation_config"]["state"]["cudagraph_mode"] == {
        "$specparity": "enum", "class": "vllm.config.compilation:CUDAGraphMode", "name": "FULL_AND_PIECEWISE"}
