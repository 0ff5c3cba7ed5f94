"""vLLM's own parse of real launch commands: ``parse_launch`` against the installed release's serve
parser on the same words.

The commands are published ones, copied verbatim into tests/launch_commands/vllm (sources in its README.md); only
their model names become the bundled fixture directories. The reference is vLLM itself, in this process (the tests
run inside the vllm env): ``make_arg_parser`` on a ``FlexibleArgumentParser`` as each launcher builds it, then
``AsyncEngineArgs.from_cli_args``. Each ``parse_launch`` is one child (the product path); times are printed (``-s``).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from specparity.deploy_command import LaunchCommand, read_launch
from specparity.errors import EXIT_BAD_INPUT, InputError
from specparity.serving.command.parse import LaunchSpec, parse_launch

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "launch_commands" / "vllm"
TARGET, DRAFT = REPO / "fixtures" / "vllm" / "target", REPO / "fixtures" / "vllm" / "draft"
SPECULATORS = REPO / "fixtures" / "vllm" / "speculators" / "draft"  # verifier.name_or_path "../../target"
MODELS = {
    "facebook/opt-6.7b": TARGET, "facebook/opt-125m": DRAFT,
    "openai/gpt-oss-120b": TARGET, "nvidia/gpt-oss-120b-Eagle3-v3": DRAFT, "nvidia/gpt-oss-120b-Eagle3-v2": DRAFT,
    "RedHatAI/Qwen3-8B-FP8-dynamic": TARGET, "RedHatAI/Qwen3-8B-speculator.eagle3": SPECULATORS,
    "nm-testing/eagle3-llama3.1-8b-instruct-speculators": SPECULATORS,
    "/models/Meta-Llama-3.1-405B-Instruct": TARGET, "/models/Meta-Llama-3.1-8B-Instruct": DRAFT,
    "meta-llama/Llama-3.1-8B-Instruct": TARGET,
}


def _text(name: str, extra: dict[str, str] | None = None) -> str:
    text = (DATA / name).read_text(encoding="utf-8")
    for old, new in {**MODELS, **(extra or {})}.items():
        text = text.replace(old, str(new))
    return text


def _command(name: str, *, cwd: Path = REPO, extra: dict[str, str] | None = None) -> LaunchCommand:
    return read_launch(_text(name, extra), source="--launch-file", path=DATA / name, cwd=cwd, environ={})


def _reference(command: LaunchCommand) -> Any:
    """vLLM's own parse of the same words, in this process (its launchers' construction, cli/serve.py:164-174,
    launchers/api_server/entry.py:224-228, then the model_tag precedence of cli/serve.py:54-56)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if command.entry == "vllm serve":
        top = FlexibleArgumentParser()
        make_arg_parser(top.add_subparsers(dest="subparser").add_parser("serve"))
        ns = top.parse_args(["serve", *command.args])
        if ns.model_tag is not None:
            ns.model = ns.model_tag
    else:
        ns = make_arg_parser(FlexibleArgumentParser()).parse_args(list(command.args))
    return AsyncEngineArgs.from_cli_args(ns), ns


def _parse(command: LaunchCommand) -> LaunchSpec:
    t0 = time.perf_counter()
    spec = parse_launch(command)
    print(f"parse_launch {(command.path and Path(command.path).name) or command.args[:1]}: "
          f"{time.perf_counter() - t0:.1f} s")
    return spec


@pytest.mark.parametrize("name", ["docs_api_server.sh", "recipes_pr_449.sh", "speculators_blog.sh"])
def test_launch_spec_is_vllms_own_parse(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    command = _command(name)
    spec = _parse(command)
    monkeypatch.chdir(command.cwd)
    ref, ns = _reference(command)
    assert spec.engine == "vllm" and spec.engine_version
    assert Path(spec.target).resolve() == Path(ref.model).resolve() == TARGET.resolve()
    draft = ref.speculative_config["model"]
    assert Path(spec.draft or "").resolve() == Path(draft).resolve()
    # every engine argument the command set, as vLLM's own EngineArgs holds it
    for key, value in spec.engine_args.items():
        if key == "speculative_config":
            assert {**value, "model": draft} == {**ref.speculative_config, "model": draft}
        elif key != "num_speculative_tokens":
            assert getattr(ref, key) == value, key
    assert spec.engine_args.get("num_speculative_tokens") == ref.speculative_config["num_speculative_tokens"]
    assert spec.port == ns.port and spec.host == ns.host


def test_the_forms_reach_the_gate() -> None:
    api = _parse(_command("docs_api_server.sh"))
    assert api.command.entry == "vllm.entrypoints.openai.api_server"
    assert api.engine_args["tensor_parallel_size"] == 1  # -tp
    assert api.engine_args["gpu_memory_utilization"] == 0.8  # --gpu_memory_utilization (underscores)
    assert api.engine_args["seed"] == 42 and api.port == 8000 and api.host == "0.0.0.0"
    recipe = _parse(_command("recipes_pr_449.sh"))
    assert recipe.command.env == {"CUDA_VISIBLE_DEVICES": "0"}
    assert recipe.engine_args["speculative_config"]["method"] == "eagle3"
    assert recipe.engine_args["num_speculative_tokens"] == 7 and recipe.engine_args["kv_cache_dtype"] == "fp8"
    assert recipe.speculative["effective_method"] == "eagle3" and recipe.target_flag == "model_tag"


def test_a_speculators_drafter_as_the_model_serves_its_verifier() -> None:
    """vllm-project/vllm#20436's form: the positional model is the drafter; vLLM reads the target from its
    config (speculators_config.verifier.name_or_path, here "../../target", which vLLM reads relative to the
    server's directory), with vLLM's own maybe_override_with_speculators."""
    spec = _parse(_command("pr_20436_speculators.sh", cwd=SPECULATORS))
    assert Path(spec.target).resolve() == TARGET.resolve()
    assert Path(spec.draft or "").resolve() == SPECULATORS.resolve()
    assert spec.draft_from_config is not None and spec.target_flag == "speculators_config.verifier.name_or_path"
    assert spec.engine_args["speculative_config"]["method"] == "eagle3"
    assert any("speculators-format drafter" in n for n in spec.notes)
    # from the repository root the same words name a target that is not there: exit 2, naming the config key
    with pytest.raises(InputError) as e:
        _parse(_command("pr_20436_speculators.sh"))
    assert e.value.exit_code == EXIT_BAD_INPUT and "verifier.name_or_path" in str(e.value)


def test_a_removed_flag_is_exit_2_naming_it() -> None:
    """vllm-project/vllm#7456's --speculative-model is gone from vLLM 0.32's parser."""
    with pytest.raises(InputError) as e:
        _parse(_command("issue_7456.sh"))
    assert e.value.exit_code == EXIT_BAD_INPUT
    assert "--speculative-model" in str(e.value) and "(line 1)" in str(e.value)
    # the releases that took it (serving/flag_history.py), and --python
    assert "--speculative-model is a flag of vLLM 0.5.5" in str(e.value) and "--python" in str(e.value)


def test_config_yaml_through_vllms_own_reader(tmp_path: Path) -> None:
    """vLLM's docs' config.yaml (the model from the file) and its own docstring's nested YAML (a table becomes the
    JSON-valued --speculative-config)."""
    (tmp_path / "config.yaml").write_text(_text("serve_args_config.yaml"), encoding="utf-8")
    spec = _parse(read_launch(_text("serve_args_config.sh"), source="--launch-file", cwd=tmp_path, environ={}))
    assert Path(spec.target).resolve() == TARGET.resolve() and spec.port == 6379 and spec.host == "127.0.0.1"
    assert spec.draft is None
    (tmp_path / "nested.yaml").write_text(_text("argparse_utils_nested.yaml"), encoding="utf-8")
    spec = _parse(read_launch(f"vllm serve {TARGET} --config nested.yaml", source="--launch", cwd=tmp_path,
                              environ={}))
    assert Path(spec.draft or "").resolve() == DRAFT.resolve()
    assert spec.engine_args["speculative_config"]["num_speculative_tokens"] == 3
    # the reports' view is the config object's changed fields; what crosses to the resolve child is the object itself
    # (serving/engine_values.py), rebuilt there as vLLM's parser made it
    assert spec.shown_args()["compilation_config"]["pass_config"]["fuse_allreduce_rms"] is True
    assert spec.engine_args["compilation_config"]["state"]["pass_config"]["state"]["fuse_allreduce_rms"] is True


def test_eagle3_drafter_under_method_eagle_is_parsed_as_given() -> None:
    """vLLM's own docs give an EAGLE-3 speculators drafter with "method": "eagle" (docs/features/spec_decode/eagle.md):
    the parse keeps the method the command gives (the finding that judges it is in tests/unit)."""
    cfg = {"model": str(SPECULATORS), "draft_tensor_parallel_size": 2, "num_speculative_tokens": 2,
           "method": "eagle"}
    spec = _parse(read_launch(f"vllm serve {TARGET} --tensor-parallel-size 2 --speculative-config "
                              f"'{json.dumps(cfg)}'", source="--launch", environ={}))
    assert spec.speculative["method"] == spec.speculative["effective_method"] == "eagle"
    assert spec.engine_args["tensor_parallel_size"] == 2


@pytest.mark.parametrize(("text", "words"), [
    (f"vllm serve {TARGET} --tensor-parallel-size two", ["--tensor-parallel-size", "invalid"]),
    (f"vllm serve {TARGET} --speculative-config '{{not json'", ["--speculative-config"]),
    ("vllm serve no/such-model", ["model_tag", "no/such-model", "not a directory"]),
    (f"vllm serve {TARGET} --config missing.yaml", ["--config"]),
])
def test_bad_input_is_exit_2(text: str, words: list[str]) -> None:
    with pytest.raises(InputError) as e:
        parse_launch(read_launch(text, source="--launch", cwd=REPO, environ={}))
    assert e.value.exit_code == EXIT_BAD_INPUT
    for w in words:
        assert w in str(e.value)


def test_a_warm_parse_equals_a_cold_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parse forked from a zygote that has imported vLLM's parser (serving/command/parse.py) gives the cold parse's spec
    and the same named rejection (exit 2): the suite's parses take this path (SPECPARITY_WARM_START=1)."""
    from specparity.serving.child import warm

    good = _text("speculators_blog.sh")
    bad = f"vllm serve {TARGET} --tensor-parallel-size two"
    specs, errors = [], []
    for flag in ("0", "1", "1"):  # cold, then two jobs of the same zygote
        monkeypatch.setenv(warm.WARM_START_ENV, flag)
        d = parse_launch(read_launch(good, source="--launch", cwd=REPO, environ={}), timeout_s=600).to_dict()
        d.pop("timings")  # the warm ones skip vLLM's import: that is the point
        specs.append(d)
        with pytest.raises(InputError) as e:
            parse_launch(read_launch(bad, source="--launch", cwd=REPO, environ={}), timeout_s=600)
        assert e.value.exit_code == EXIT_BAD_INPUT
        errors.append(str(e.value))
    assert specs[0] == specs[1] == specs[2]
    # the warm ones really ran in a zygote (a zygote that cannot serve falls back cold, which this test could
    # not tell from the warm path)
    assert any(z.ready and "specparity.serving.vllm.command_parse" in z.proc.args for z in warm._ZYGOTES.values())
    assert errors[0] == errors[1] == errors[2] and "--tensor-parallel-size" in errors[0]


def test_the_positional_model_is_ignored_by_the_api_server_entry(tmp_path: Path) -> None:
    """Only `vllm serve` copies the positional model to --model (cli/serve.py:54-56): the api_server entry serves
    --model (its default when absent), and the parse says so."""
    shutil.copytree(TARGET, tmp_path / "Qwen" / "Qwen3-0.6B")  # vLLM 0.32's default --model, here a local copy
    spec = _parse(read_launch(f"python -m vllm.entrypoints.openai.api_server {TARGET}", source="--launch",
                              cwd=tmp_path, environ={}))
    assert Path(spec.target).resolve() == (tmp_path / "Qwen" / "Qwen3-0.6B").resolve()
    assert any("positional model" in n and "ignored" in n for n in spec.notes)


def test_gate_launch_static_on_the_speculators_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm#20436's `vllm serve <speculators drafter>` from the drafter's directory, end to end at the static level:
    vLLM's own parse finds the target in the drafter's config, vLLM resolves the deployment, the contract written
    from that drafter's recordings passes, and the report says where the target came from."""
    from click.testing import CliRunner

    from specparity.cli import main

    contract = REPO / "fixtures" / "vllm" / "contract-speculators" / "tiny-llama-eagle3-hd32-speculators.json"
    monkeypatch.chdir(SPECULATORS)
    report = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["gate", "--contract", str(contract), "--level", "static", "--json",
                                       str(report), "--launch", "--", _text("pr_20436_speculators.sh")])
    assert result.exit_code == 0, result.output
    v = json.loads(report.read_text())
    assert v["verdict"] == "pass" and v["engine"] == "vllm"
    assert Path(v["launch"]["target"]).resolve() == TARGET.resolve()
    assert v["launch"]["draft_from_config"] is not None
    assert "target_from_draft_config" in [f["kind"] for f in v["findings"]]


def test_dynamos_published_vllm_worker_is_vllms_own_parse() -> None:
    """Dynamo's own EAGLE-3 example (examples/backends/vllm/launch/agg_spec_decoding.sh): `python -m dynamo.vllm`,
    backgrounded with a trailing '&'. vLLM's engine parser, built as Dynamo's worker builds it
    (AsyncEngineArgs.add_cli_args on a FlexibleArgumentParser), reads the same engine arguments; Dynamo's own flags
    are set aside; the report says both."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    extra = {"meta-llama/Meta-Llama-3.1-8B-Instruct": str(TARGET), "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B": str(DRAFT),
             "--enforce-eager": "--enforce-eager --endpoint dyn://ns.backend.generate --connector nixl lmcache"}
    command = _command("dynamo_agg_spec_decoding.sh", extra=extra)
    spec = _parse(command)
    parser = FlexibleArgumentParser()
    AsyncEngineArgs.add_cli_args(parser, async_args_only=False)
    words = [w for w in command.args if w not in ("--endpoint", "dyn://ns.backend.generate", "--connector", "nixl",
                                                    "lmcache")]
    ref = AsyncEngineArgs.from_cli_args(parser.parse_args(words))
    assert Path(spec.target).resolve() == Path(ref.model).resolve() == TARGET.resolve()
    assert Path(spec.draft or "").resolve() == DRAFT.resolve() and spec.command.entry == "dynamo.vllm"
    for key, value in spec.engine_args.items():
        if key == "speculative_config":
            assert {**value, "model": str(DRAFT)} == {**ref.speculative_config, "model": str(DRAFT)}
        elif key != "num_speculative_tokens":
            assert getattr(ref, key) == value, key
    assert spec.engine_args["num_speculative_tokens"] == 2 and spec.speculative["effective_method"] == "eagle3"
    assert spec.command.env == {"DYN_SYSTEM_ENABLED": "true", "DYN_SYSTEM_PORT": "8081", "CUDA_VISIBLE_DEVICES": "0"}
    notes = " ".join(spec.notes)
    assert "trailing '&'" in notes and "NVIDIA Dynamo (python -m dynamo.vllm)" in notes
    assert "--endpoint dyn://ns.backend.generate --connector nixl lmcache" in notes


def test_a_flag_dynamos_vllm_worker_does_not_take_is_exit_2_saying_so() -> None:
    """`vllm serve`'s --port is not an engine argument: Dynamo's vLLM worker has no such flag either (exit 2)."""
    with pytest.raises(InputError) as e:
        _parse(_command("dynamo_agg_spec_decoding.sh", extra={"--enforce-eager": "--enforce-eager --port 8000"}))
    assert e.value.exit_code == EXIT_BAD_INPUT and "--port" in str(e.value) and "(line 6)" in str(e.value)
    assert "under Dynamo" in str(e.value) and "without Dynamo" in str(e.value)


def test_the_flag_history_holds_this_vllms_own_flags() -> None:
    """scripts/flag_history.py reads vLLM releases from their source's literals and FrontendArgs fields: for the
    installed release they are its own make_arg_parser's option strings, less the --no- negations of its boolean
    flags (which the literals do not spell), and nothing else."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from specparity.serving.flag_history import _flags_in, load
    from specparity.serving.vllm.command_parse import _version

    history = load()["vllm"]
    if _version() not in history["releases"]:
        pytest.skip(f"vLLM {_version()} is not among the releases read")
    real = {s for a in make_arg_parser(FlexibleArgumentParser())._actions for s in a.option_strings} - {"-h", "--help"}
    scanned = _flags_in(history, _version())
    assert scanned <= real and all(f.startswith("--no-") for f in real - scanned)
