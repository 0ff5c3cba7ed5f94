"""SGLang's ``ServerArgs`` values survive the trip from the launch parse child to the resolve/capture child.

For every field of the installed release's ``ServerArgs`` whose type is not a plain scalar (a list, a dict or JSON
value, a set, a config object: found by introspecting the record's fields and their types, not a hand list), and for
every float field (``inf`` and ``nan`` are no JSON), a value is built through SGLang's own parser (argv words ->
``ServerArgs.add_cli_args`` on an ``argparse.ArgumentParser``, as ``prepare_server_args`` builds it, 0.5.23
``srt/server_args.py:679-680``) and taken through the product path: the parse child's encoding
(``command_parse.transported_args``) -> JSON text of the worker request -> the worker's request reader and the
installed family's keyword builder (``server_args_kwargs``) -> ``ServerArgs(**kw)``. The field must equal what
``ServerArgs.from_cli_args`` made from the same parse (0.5.23 :446-451); on a release that resolves in
``__post_init__`` (before 0.5.20) the keyword ``ServerArgs`` gets is compared instead. In process: no engine starts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import types
import typing
from importlib import metadata
from typing import Any

import pytest

from specparity.serving.sglang.worker import install_kernel_stub_if_needed

pytestmark = pytest.mark.sglang

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")  # before the first sglang import, as the serving child does
install_kernel_stub_if_needed("cpu")

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from specparity.serving.child.worker_common import WorkerRequest  # noqa: E402
from specparity.serving.command.parse_child import SECRET_DEST  # noqa: E402
from specparity.serving.sglang.command_parse import _field_names, _parser, transported_args  # noqa: E402

sa_mod = pytest.importorskip("sglang.srt.server_args")
INSTALLED = metadata.version("sglang")
ServerArgs = sa_mod.ServerArgs
FIELDS = _field_names(ServerArgs)
PARSER = _parser(ServerArgs)
ACTIONS: dict[str, argparse.Action] = {}
for _a in PARSER._actions:
    if _a.option_strings and _a.dest not in ACTIONS and _a.help != argparse.SUPPRESS:
        ACTIONS[_a.dest] = _a
_PLAIN = (str, int, float, bool, type(None))


def _field_types() -> dict[str, Any]:
    try:
        return typing.get_type_hints(ServerArgs)
    except Exception:  # a release whose annotations do not resolve here: read them as written
        return {name: getattr(ServerArgs, "__annotations__", {}).get(name) for name in FIELDS}


TYPES = _field_types()


def _members(tp: Any) -> list[Any]:
    """The union members of a type, Annotated and Optional unwrapped."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _members(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(tp) for m in _members(a)]
    return [tp]


def _plain_scalar(tp: Any) -> bool:
    for m in _members(tp):
        if typing.get_origin(m) is typing.Literal:
            if not all(type(v) in _PLAIN for v in typing.get_args(m)):
                return False
        elif m not in _PLAIN:
            return False
    return True


def _has_float(tp: Any) -> bool:
    return float in _members(tp)


NON_PLAIN = sorted(n for n in FIELDS if not _plain_scalar(TYPES.get(n)))
FLOATS = sorted(n for n in FIELDS if _plain_scalar(TYPES.get(n)) and _has_float(TYPES.get(n)) and n in ACTIONS
                and not SECRET_DEST.search(n))
NO_FLAG = [n for n in NON_PLAIN if n not in ACTIONS]  # no command can set them: nothing crosses
# secret-named arguments never leave the parse child (serving/command/parse_child.py SECRET_DEST): their values do not cross at all
SECRET = sorted(n for n in FIELDS if SECRET_DEST.search(n))
CROSSING = [n for n in NON_PLAIN if n not in NO_FLAG and n not in SECRET]


def _type_name(action: argparse.Action) -> str:
    t = action.type
    return getattr(t, "__name__", type(t).__name__) if t is not None else "None"


_json_scalar = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False) \
    | st.text(max_size=8)
_json = st.recursive(_json_scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6),
                                                                                             inner, max_size=3),
                     max_leaves=8)


def _words(action: argparse.Action) -> st.SearchStrategy[list[str]]:
    """argv words for ``action``, by how SGLang's parser reads them (its type function and nargs)."""
    name = _type_name(action)
    if type(action).__name__ == "LoRAPathAction":  # srt/arg_groups/argparse_actions.py:8-25
        one = st.from_regex(r"[a-z][a-z0-9_/]{0,8}", fullmatch=True) | st.builds(
            lambda n, p: json.dumps({"lora_name": n, "lora_path": p}), st.text("abc", min_size=1, max_size=4),
            st.text("xyz/", min_size=1, max_size=6))
        return st.lists(one, min_size=1, max_size=3)
    if name == "parse_cuda_graph_config_arg":  # model_executor/cuda_graph_config.py:246-282
        from sglang.srt.model_executor import cuda_graph_config as cg

        phases = st.dictionaries(st.sampled_from(cg.Phase.ALL), st.fixed_dictionaries(
            {"backend": st.sampled_from(sorted({b for bs in cg.ALLOWED_BACKENDS_PER_PHASE.values() for b in bs}))}), min_size=1)
        return phases.map(lambda d: [json.dumps(d)])
    if name == "loads" or "loads" in name:  # json.loads, SGLang's JSON-valued flags
        return st.dictionaries(st.text(max_size=6), _json, max_size=3).map(lambda d: [json.dumps(d)])
    if name == "json_list_type":  # utils/common.py:4818-4824 (orjson.loads)
        return st.lists(_json, max_size=3).map(lambda v: [json.dumps(v)])
    if action.nargs in ("+", "*") or isinstance(action.nargs, int):
        if action.choices:
            elem: st.SearchStrategy[str] = st.sampled_from([str(c) for c in action.choices])
        elif action.type is int:
            elem = st.integers(-1000, 1000).map(str)
        elif action.type is float:
            elem = st.floats(allow_nan=True, allow_infinity=True).map(repr)
        else:
            elem = st.from_regex(r"[A-Za-z0-9_./:-]{1,10}", fullmatch=True)
        size = action.nargs if isinstance(action.nargs, int) else None
        return st.lists(elem, min_size=size or (1 if action.nargs == "+" else 0), max_size=size or 4)
    if action.type is str or action.type is None:
        return st.from_regex(r"[A-Za-z0-9_./:-]{1,10}", fullmatch=True).map(lambda w: [w])
    raise AssertionError(f"no generator for {action.option_strings[0]} (type {name}, nargs {action.nargs}): add one "
                         "so that this field's transport is tested")


def _parse(words: list[str]) -> argparse.Namespace | None:
    import contextlib
    import io

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return PARSER.parse_args(["--model-path", "/m", *words])
    except SystemExit:  # SGLang's parser refuses these words: nothing would cross
        return None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def _server_args_kwargs() -> Any:
    """The installed family's keyword builder, the one its worker calls (serving/sglang/families.py)."""
    from specparity.serving.sglang.adapter import AdapterEntry, select_adapter

    entry = select_adapter(INSTALLED)
    assert isinstance(entry, AdapterEntry), entry
    if ".since_0_4_4." in entry.module:
        from specparity.serving.sglang.since_0_4_4.common import server_args_kwargs as legacy

        return legacy
    from specparity.serving.sglang.since_0_5_11.core import server_args_kwargs

    return server_args_kwargs


# 0.5.20+ builds the record raw and resolves apart (resolve_once): the record itself is compared; an older release
# resolves in __post_init__ (probing this machine, reading the model), so there the keyword ServerArgs gets is
# compared, which is what from_cli_args hands it (cls(**{attr: getattr(args, attr)}), 0.5.3 server_args.py:2876-2880)
RAW_RECORD = hasattr(ServerArgs, "resolve_once")


def _round_trip(namespace: argparse.Namespace, dest: str) -> tuple[Any, Any]:
    """(the value SGLang's parser made for ``dest``, the value the worker's ``ServerArgs`` gets after transport)."""
    engine_args, shown = transported_args(vars(namespace), [dest], FIELDS)
    json.dumps(shown, allow_nan=False)  # the reports' view stays plain JSON
    wire = json.loads(json.dumps(WorkerRequest("resolve", "/t", "/d", server_args=engine_args).to_dict(),
                                 allow_nan=False))
    kw = _server_args_kwargs()(WorkerRequest.from_dict(wire))
    if RAW_RECORD:
        return getattr(ServerArgs.from_cli_args(namespace), dest), getattr(ServerArgs(**kw), dest)
    return getattr(namespace, dest), kw.get(dest)


def test_the_fields_are_found_by_introspection() -> None:
    """The sweep covers what the installed release has, not a hand list."""
    assert len(FIELDS) > 100
    assert CROSSING, "no non-plain field has a flag: the introspection found nothing to test"
    assert FLOATS
    print(f"{len(FIELDS)} ServerArgs fields: {len(NON_PLAIN)} non-plain ({len(CROSSING)} crossing, "
          f"{len(NO_FLAG)} without a flag: {', '.join(NO_FLAG)}; secret-named, never crossing: {', '.join(SECRET)}), "
          f"{len(FLOATS)} float")


_EXAMPLES = settings(max_examples=12, deadline=None, derandomize=True, database=None,
                     suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])


@pytest.mark.parametrize("dest", CROSSING)
def test_non_plain_field_survives_the_transport(dest: str) -> None:
    action = ACTIONS[dest]
    flag = action.option_strings[-1] if action.option_strings[-1].startswith("--") else action.option_strings[0]
    strategy = _words(action)
    seen: list[int] = []

    @_EXAMPLES
    @given(strategy)
    def check(words: list[str]) -> None:
        namespace = _parse([flag, *words])
        hypothesis.assume(namespace is not None)
        assert namespace is not None
        want, got = _round_trip(namespace, dest)
        assert _same(got, want), f"{flag} {words}: {got!r} after transport, SGLang's parser made {want!r}"
        seen.append(1)

    check()
    assert seen, f"SGLang's parser accepted none of the generated {flag} values"


@pytest.mark.parametrize("dest", FLOATS)
def test_float_field_survives_the_transport_inf_and_nan_included(dest: str) -> None:
    flag = next(o for o in ACTIONS[dest].option_strings if o.startswith("--"))
    for text in ("inf", "-inf", "nan", "0.1", "1e-300"):
        namespace = _parse([flag, text])
        if namespace is None:  # a choices-limited float flag
            continue
        want, got = _round_trip(namespace, dest)
        assert _same(got, want), f"{flag} {text}: {got!r} after transport, SGLang's parser made {want!r}"


def test_the_transport_of_a_command_with_many_non_plain_flags() -> None:
    """One command, several kinds at once: lists of ints and floats (inf among them), a JSON dict, a set choice."""
    rows = [["--cuda-graph-bs-decode", "1", "2", "4"],  # 0.5.23's name
            ["--cuda-graph-bs", "1", "2", "4"],  # the older releases' name (an alias in some)
            ["--bucket-inter-token-latency", "0.1", "inf"],
            ["--json-model-override-args", '{"rope_scaling": {"factor": 2.0}}'],
            ["--lora-target-modules", "q_proj", "v_proj"]]
    dest_of = {o: a.dest for a in PARSER._actions for o in a.option_strings}
    rows = [words for words in rows if words[0] in dest_of]  # the installed release's own flags
    dests = {dest_of[words[0]] for words in rows}
    assert len(dests) >= 3, sorted(dests)
    namespace = _parse([w for words in rows for w in words])
    assert namespace is not None
    for dest in dests:
        want, got = _round_trip(namespace, dest)
        assert _same(got, want), dest
