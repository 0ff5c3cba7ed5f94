"""SGLang's own parse of a launch command: ``python -m specparity.serving.sglang.command_parse`` (a child in the
engine's interpreter; protocol in :mod:`specparity.serving.command.parse_child`).

What runs is the installed release's own code, as its launcher runs it:

- ``python -m sglang.launch_server ARGS``: ``prepare_server_args(sys.argv[1:])`` (0.5.23 ``launch_server.py:80``,
  after ``load_plugins()`` at :78), which builds ``argparse.ArgumentParser(prog="sglang serve")`` with
  ``ServerArgs.add_cli_args`` (``srt/server_args.py:679-680``; argparse's ``allow_abbrev`` left at its default,
  so ``--speculative-algo`` and ``--mem-frac`` are the flags they abbreviate), merges a ``--config`` YAML through
  ``ConfigArgumentMerger`` when ``"--config"`` is one of the words (:683-689) and builds ``ServerArgs.from_cli_args``
  (:446-452, :706). Older releases have the same function (0.5.3 ``srt/server_args.py:3144-3179``, whose
  ``ServerArgs.__post_init__`` resolves at construction).
- ``sglang serve ARGS``: ``sglang/cli/serve.py`` ``serve()`` first takes ``--model-type`` out
  (``_extract_model_type_override``, :32-60) and turns a positional model into ``--model-path``
  (``_normalize_positional_model_path``, :63-67), then the same ``prepare_server_args`` (:101-111).
- ``python -m sglang.cli.main serve`` where that module runs at all (0.5.23's ``cli/main.py`` defines ``main()``
  with no ``__main__`` block: ``python -m`` runs nothing, and the parse says so).

A second parse of the same words with every default replaced by a marker says which arguments the command gave.
Then, where the release offers it, what SGLang resolves from them: 0.5.20+ ``ServerArgs.resolve_once()`` and
``resolved_dict()`` (:244-330), older releases the record after ``__post_init__``. Resolution runs on this machine
(``device="cpu"`` sets ``SGLANG_USE_CPU_ENGINE=1`` before sglang is imported, as the worker does): a probe that
fails here becomes a note, never a failed parse.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import os
import sys
from collections.abc import Iterable, Iterator
from importlib import metadata
from typing import Any

from specparity.serving import dynamo
from specparity.serving.command.parse_child import (
    SECRET_DEST,
    Rejected,
    answer_request,
    argparse_errors,
    cite_line,
    given,
    json_safe,
    local_model,
    module_runs,
    package_dir,
    parsed_view,
    transported,
    with_defaults_not_given,
)

# ServerArgs keywords that are not engine arguments of the in-process resolve: the models (target and draft have
# their own fields), where it listens, and secrets
_NOT_ENGINE_ARGS = frozenset({"model_path", "speculative_draft_model_path", "host", "port", "config"})
# argparse destinations that ServerArgs.from_cli_args copies to another field before building the record
# (0.5.3 srt/server_args.py:2876-2880: --tp-size/--tensor-parallel-size parse into tensor_parallel_size)
_FIELD_OF = {"tensor_parallel_size": "tp_size", "pipeline_parallel_size": "pp_size", "data_parallel_size": "dp_size",
             "expert_parallel_size": "ep_size"}
SPEC_KEYS = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
             "speculative_num_draft_tokens")
# what the report shows of SGLang's resolution besides the speculative settings
_RESOLVED_KEYS = (*SPEC_KEYS, "tp_size", "pp_size", "dp_size", "ep_size", "dtype", "quantization",
                  "kv_cache_dtype", "attention_backend", "device")
# the rule behind SGLang's best-known rewrite, found by its warning text in the installed release
REWRITE_NEEDLE = "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1"
REWRITE_FILES = ("srt/arg_groups/speculative_hook.py", "srt/server_args.py")


def _field_names(server_args_cls: Any) -> set[str]:
    if dataclasses.is_dataclass(server_args_cls):
        return {f.name for f in dataclasses.fields(server_args_cls)}
    from sglang.srt import server_args as sa_mod

    return {f.name for f in sa_mod.record_fields(server_args_cls)}  # 0.5.22+: a msgspec record


def transported_args(values: dict[str, Any], explicit: list[str], fields: set[str]) \
        -> tuple[dict[str, Any], dict[str, Any]]:
    """The ServerArgs keywords the command gave, as they cross to the resolve/capture child (encoded: that child
    rebuilds the values SGLang's parser made, serving/engine_values.py), and their plain view for the reports."""
    keys = {k: _FIELD_OF.get(k, k) if k not in fields else k for k in explicit
            if (k in fields or _FIELD_OF.get(k) in fields) and k not in _NOT_ENGINE_ARGS and not SECRET_DEST.search(k)}
    return transported({key: values[k] for k, key in keys.items()})


def _serve_argv(args: list[str]) -> tuple[list[str], list[str]]:
    """``sglang serve``'s own rewrite of its words before the server parser sees them (cli/serve.py:171-183)."""
    try:
        from sglang.cli import serve as cli_serve
    except ImportError:
        raise Rejected(f"sglang {metadata.version('sglang')} has no `sglang serve` command (no sglang.cli.serve); "
                       "use python -m sglang.launch_server") from None
    notes = []
    extract = getattr(cli_serve, "_extract_model_type_override", None)
    if extract is not None:
        try:
            backend, args = extract(list(args))
        except ValueError as e:
            raise Rejected(str(e), flag="--model-type") from None
        if backend not in ("auto", "llm"):
            notes.append(f"sglang serve --model-type {backend}: not the LLM server; parsed as the LLM server")
    normalize = getattr(cli_serve, "_normalize_positional_model_path", None)
    if normalize is not None:
        args, positional = normalize(list(args))
        if positional:
            notes.append("the positional model is --model-path (sglang/cli/serve.py _normalize_positional_model_path)")
    return list(args), notes


def _parser(server_args_cls: Any) -> argparse.ArgumentParser:
    # as prepare_server_args builds it (0.5.23 srt/server_args.py:679-680; 0.5.3 :3175-3176)
    parser = argparse.ArgumentParser(prog="sglang serve")
    server_args_cls.add_cli_args(parser)
    return parser


def _merge_config(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """SGLang's own --config merge, in the same condition (0.5.23 server_args.py:683-689)."""
    if "--config" not in argv:
        return argv
    try:
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger
    except ImportError:  # before 0.5.1x the module sat beside server_args (0.5.3 server_args.py:3156)
        try:
            from sglang.srt.server_args_config_parser import ConfigArgumentMerger
        except ImportError:  # no --config at all (0.4.x: no config parser module, no --config argument)
            raise Rejected(f"sglang {metadata.version('sglang')} has no --config (no server_args_config_parser: "
                           "the YAML merge came with 0.5.x); give the flags on the command line",
                           flag="--config") from None
    try:
        merger = ConfigArgumentMerger(parser)
    except TypeError:  # 0.5.3: ConfigArgumentMerger(boolean_actions=[...]) (server_args.py:3164-3172)
        merger = ConfigArgumentMerger(boolean_actions=[a.dest for a in parser._actions
                                                       if isinstance(a, argparse._StoreTrueAction)])
    try:
        return list(merger.merge_config_with_args(list(argv)))
    except (ValueError, OSError, TypeError) as e:
        raise Rejected(f"--config: {e}", flag="--config") from None
    except Exception as e:  # yaml.YAMLError and the like: the file is the user's
        raise Rejected(f"--config: {type(e).__name__}: {e}", flag="--config") from None


def _resolve(server_args: Any, notes: list[str]) -> dict[str, Any] | None:
    """What SGLang resolves from the parsed record, where the release can say (None where it cannot)."""
    try:
        if hasattr(server_args, "resolve_once"):  # 0.5.20+: construction leaves the record raw
            server_args.resolve_once()
            return dict(server_args.resolved_dict()) if hasattr(server_args, "resolved_dict") else None
        return {k: v for k, v in vars(server_args).items() if not k.startswith("_")}  # resolved in __post_init__
    except Exception as e:  # a hardware probe or a check this machine cannot pass: the parse still stands
        notes.append(f"SGLang's own resolution of these arguments raised here ({type(e).__name__}: "
                     f"{str(e).splitlines()[0][:300] if str(e) else ''}); the values shown are as parsed")
        return None


def parse(request: dict[str, Any]) -> dict[str, Any]:
    entry, args, cwd = request["entry"], list(request["args"]), request.get("cwd") or os.getcwd()
    if request.get("device", "cpu") == "cpu":
        # is_cpu() is lru_cached at first use (0.5.23 utils/common.py:221-224): set before the first sglang import
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        from specparity.serving.sglang.worker import install_kernel_stub_if_needed

        install_kernel_stub_if_needed("cpu")
    version = metadata.version("sglang")
    notes: list[str] = []
    if entry == "sglang serve":
        if request.get("module") and not module_runs(request["module"]):
            raise Rejected(f"`python -m {request['module']}` runs nothing in sglang {version} (the module has no "
                           "__main__ block); use `sglang serve` or `python -m sglang.launch_server`")
        argv, serve_notes = _serve_argv(args)
        notes += serve_notes
    elif entry in ("sglang.launch_server", "dynamo.sglang"):
        argv = list(args)  # under Dynamo, its own flags are set aside below, once SGLang's parser is built
    else:
        raise Rejected(f"{entry} is not an SGLang entry point")
    from sglang.srt import server_args as sa_mod

    if _has_module("sglang.srt.plugins"):  # both launchers load plugins before parsing (0.5.23
        from sglang.srt.plugins import load_plugins  # launch_server.py:78, cli/serve.py:205-207)

        load_plugins()
    cls = sa_mod.ServerArgs
    parser = _parser(cls)
    releases: tuple[str, ...] = ()
    if entry == "dynamo.sglang":
        argv, releases = _dynamo_argv(argv, parser, notes)
    merged = _merge_config(parser, argv)
    with _under_dynamo(releases), argparse_errors("SGLang's server parser"):
        namespace = parser.parse_args(merged)
    with argparse_errors("SGLang's server parser"):
        explicit = given(with_defaults_not_given(_parser(cls)).parse_args(merged))
    if any(a.startswith("--config=") for a in argv):
        notes.append("--config=FILE is never merged by SGLang: it merges the YAML only when --config and the file "
                     "are two words (0.5.23 srt/server_args.py:683); this release ignores the file")
    fields = _field_names(cls)
    server_args = None
    prepare = getattr(sa_mod, "prepare_server_args", None)
    try:
        with argparse_errors("SGLang's server parser"):
            server_args = prepare(list(argv)) if prepare is not None else cls.from_cli_args(namespace)
    except Rejected:
        raise
    except Exception as e:  # 0.5.3 resolves in __post_init__: a probe failing here is not the user's input
        notes.append(f"ServerArgs construction raised here ({type(e).__name__}: {str(e)[:300]}); values as parsed")
    resolved = _resolve(server_args, notes) if server_args is not None and request.get("resolve", True) else None
    values = vars(namespace)
    engine_args, shown_args = transported_args(values, explicit, fields)
    target, target_note = local_model(values.get("model_path"), cwd)
    draft_name = values.get("speculative_draft_model_path")
    draft, draft_note = local_model(draft_name, cwd)
    notes += [n for n in (target_note, draft_note) if n]
    return {
        "engine": "sglang", "engine_version": version, "entry": entry, "python": sys.executable,
        "package_dir": package_dir("sglang"),
        "parser": f"sglang {version} srt/server_args.py prepare_server_args (argparse, ServerArgs.add_cli_args)",
        **parsed_view(values, args),
        "explicit": explicit, "engine_args": engine_args, "engine_args_shown": shown_args,
        "target_name": values.get("model_path"), "target": target, "target_flag": "--model-path",
        "draft_name": draft_name, "draft": draft, "draft_flag": "--speculative-draft-model-path",
        "host": values.get("host"), "port": values.get("port"),
        "api_key_set": any(values.get(k) for k in values if SECRET_DEST.search(k) and "api_key" in k),
        "speculative": {"algorithm": values.get("speculative_algorithm"),
                        **{k.removeprefix("speculative_"): values.get(k)
                           for k in SPEC_KEYS[1:]}},
        "resolved": json_safe({k: resolved.get(k) for k in _RESOLVED_KEYS if k in resolved}) if resolved else None,
        "rewrite_rule": cite_line("sglang", REWRITE_FILES, REWRITE_NEEDLE),
        "notes": notes,
    }


def dynamo_rewrites(words: list[str], options: Iterable[str]) -> tuple[list[str], list[str]]:
    """Dynamo's own rewrites of SGLang's words before SGLang's parser reads them (ai-dynamo 1.6.1): ``(words,
    notes)``. ``--disaggregation-mode agg|pd`` becomes ``null`` (``dynamo/sglang/args.py:458-463``; ``encode`` makes a
    multimodal encode worker, refused); the old ``--disable-piecewise-cuda-graph`` becomes
    ``--cuda-graph-backend-prefill disabled`` where SGLang has the one and not the other
    (``dynamo/sglang/_compat.py:194-211``)."""
    have = set(options)
    out: list[str] = []
    notes: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        name, eq, value = w.partition("=")
        if name == "--disaggregation-mode":
            if not eq:
                value = words[i + 1] if i + 1 < len(words) else ""
            if value == "encode":
                raise dynamo.DynamoRefused("--disaggregation-mode encode makes a Dynamo multimodal encode worker "
                                           "(dynamo/sglang/args.py:465-480), not an LLM server", flag=name)
            if value in ("agg", "pd"):
                notes.append(f"--disaggregation-mode {value} read as null, as Dynamo rewrites it for SGLang "
                             "(ai-dynamo 1.6.1 dynamo/sglang/args.py:458-463)")
                out += ["--disaggregation-mode", "null"]
                i += 1 if eq else 2
                continue
        if (w == "--disable-piecewise-cuda-graph" and "--cuda-graph-backend-prefill" in have
                and "--disable-piecewise-cuda-graph" not in have):
            notes.append("--disable-piecewise-cuda-graph read as --cuda-graph-backend-prefill disabled, the flag "
                         "Dynamo adds to SGLang's parser (ai-dynamo 1.6.1 dynamo/sglang/_compat.py:194-211)")
            out += ["--cuda-graph-backend-prefill", "disabled"]
            i += 1
            continue
        out.append(w)
        i += 1
    return out, notes


def _dynamo_argv(args: list[str], parser: argparse.ArgumentParser, notes: list[str]) -> tuple[list[str], tuple[str, ...]]:
    """``python -m dynamo.sglang``: Dynamo's own flags set aside, Dynamo's rewrites of SGLang's words applied
    (:func:`dynamo_rewrites`), what SGLang's parser reads returned with the Dynamo releases the split follows."""
    options = parser._option_string_actions
    try:
        part = dynamo.split(args, engine="sglang", module="dynamo.sglang", label="SGLang",
                            is_engine_option=lambda w: w in options, engine_options=options)
        words, rewrites = dynamo_rewrites(part.engine_args, options)
    except dynamo.DynamoRefused as e:
        raise Rejected(e.message, flag=e.flag) from None
    part.rewrites += rewrites
    notes += part.notes("dynamo.sglang", "SGLang")
    return words, part.releases


@contextlib.contextmanager
def _under_dynamo(releases: tuple[str, ...]) -> Iterator[None]:
    """Under Dynamo, a flag SGLang does not know may be a Dynamo release's own: the rejection says so."""
    try:
        yield
    except Rejected as e:
        if releases and "unrecognized" in e.message:
            raise Rejected(e.message + dynamo.unknown_note(e.flag, releases, "SGLang"), flag=e.flag) from None
        raise


def _has_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def warm(device: str) -> None:
    """A warm zygote's set-up (:mod:`specparity.serving.child.zygote`): what :func:`parse` imports before it reads any word,
    in the order it does (the CPU switch and the kernel stand-in before SGLang), so that a job forked from it parses in
    about 2 s instead of paying ~9 CPU-s of imports. No command is read here."""
    if device == "cpu":
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        from specparity.serving.sglang.worker import install_kernel_stub_if_needed

        install_kernel_stub_if_needed("cpu")
    importlib.import_module("sglang.srt.server_args")
    if _has_module("sglang.srt.plugins"):  # the module only: the plugins themselves load in each job, as cold
        importlib.import_module("sglang.srt.plugins")


def run(argv: list[str], state: object = None) -> int:
    """A job forked from the warm zygote: the request from the file ``argv[0]``, the answer on stdout."""
    answer_request(parse, engine="sglang", request_file=argv[0])
    return 0


if __name__ == "__main__":
    answer_request(parse, engine="sglang")
