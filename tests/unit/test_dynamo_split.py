"""NVIDIA Dynamo's own flags set aside from a worker command (specparity.serving.dynamo), without an engine: the
engine's option strings are given here; tests/serving and tests/vllm_engine run the same split in front of the
installed engine's own parser, on published Dynamo commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specparity.serving import dynamo
from specparity.serving.sglang.command_parse import dynamo_rewrites

ENGINE = {"--model-path", "--speculative-algorithm", "--speculative-num-steps", "--tp-size", "--enable-multimodal",
          "--cuda-graph-backend-prefill", "--disaggregation-mode", "--mem-fraction-static"}


def _split(args: list[str], engine: str = "sglang") -> dynamo.Split:
    return dynamo.split(args, engine=engine, module=f"dynamo.{engine}", label=engine, engine_options=ENGINE,
                        is_engine_option=lambda w: w in ENGINE)


def test_the_data_is_dynamos_own_source_with_file_and_line() -> None:
    data = dynamo.load()
    assert "ai-dynamo" in data["source"] and "scripts/dynamo_flags.py" in data["source"]
    for release in data["releases"].values():
        for engine in ("sglang", "vllm"):
            flags = release[engine]
            assert {"--endpoint", "--namespace", "--dyn-tool-call-parser"} <= set(flags)
            for flag, info in flags.items():
                assert flag.startswith("--") and info["arity"] in (0, 1, "*", "+", "?")
                path, _, line = info["at"].rpartition(":")
                assert path.startswith("dynamo/") and path.endswith(".py") and int(line) > 0
    assert json.loads(Path(dynamo.DATA).read_text()) == data


def test_dynamos_flags_are_set_aside_with_the_words_they_take() -> None:
    flags, _ = dynamo.dynamo_flags("sglang")
    star = next(f for f, i in flags.items() if i["arity"] == "*")
    switch = next(f for f, i in flags.items() if i["arity"] == 0 and not f.endswith("-worker"))
    got = _split(["--model-path", "/m", "--endpoint", "dyn://ns.backend.generate", "--namespace=ns", switch,
                  star, "a", "b", "--speculative-num-steps", "3", "--dyn-tool-call-parser", "hermes"])
    assert got.engine_args == ["--model-path", "/m", "--speculative-num-steps", "3"]
    assert got.set_aside == [["--endpoint", "dyn://ns.backend.generate"], ["--namespace=ns"], [switch],
                             [star, "a", "b"], ["--dyn-tool-call-parser", "hermes"]]
    note = " ".join(got.notes("dynamo.sglang", "SGLang"))
    assert "NVIDIA Dynamo" in note and "--endpoint dyn://ns.backend.generate" in note and "ai-dynamo" in note


@pytest.mark.parametrize(("args", "words"), [
    (["--enable-multimodal"], ["--enable-multimodal is both a flag of sglang and Dynamo's own", "without Dynamo"]),
    (["--speculative-algo", "EAGLE3"], ["--speculative-algo abbreviates --speculative-algorithm", "in full"]),
    (["--endpo", "x"], ["--endpo abbreviates --endpoint", "in full"]),
    (["--embedding-worker"], ["other than an LLM server"]),
    (["--disagg-config", "d.yaml"], ["--disagg-config", "YAML"]),
    (["--endpoint"], ["--endpoint needs a value"]),
    (["--endpoint", "--tp-size", "2"], ["--endpoint needs a value"]),
])
def test_what_cannot_be_told_apart_without_dynamo_is_refused(args: list[str], words: list[str]) -> None:
    with pytest.raises(dynamo.DynamoRefused) as e:
        _split(["--model-path", "/m", *args])
    for w in words:
        assert w in e.value.message
    assert e.value.flag == args[0]


def test_an_unknown_flag_goes_to_the_engine_whose_parser_rejects_it() -> None:
    """Neither the engine's nor a recorded Dynamo flag: the engine's parser says so, with the note below; so does a
    prefix of several engine flags and none of Dynamo's (ambiguous to the engine, whoever reads it first)."""
    assert _split(["--model-path", "/m", "--no-such", "1"]).engine_args == ["--model-path", "/m", "--no-such", "1"]
    assert _split(["--speculative", "1"]).engine_args == ["--speculative", "1"]
    note = dynamo.unknown_note("--no-such", ("1.6.1",), "SGLang")
    assert "ai-dynamo 1.6.1" in note and "refuses rather than guess" in note


def test_dynamos_rewrites_of_sglangs_words() -> None:
    words, notes = dynamo_rewrites(["--disaggregation-mode", "agg", "--disable-piecewise-cuda-graph"], ENGINE)
    assert words == ["--disaggregation-mode", "null", "--cuda-graph-backend-prefill", "disabled"]
    assert any("_compat.py:194-211" in n for n in notes) and any("args.py:458-463" in n for n in notes)
    assert dynamo_rewrites(["--disaggregation-mode=pd"], ENGINE)[0] == ["--disaggregation-mode", "null"]
    assert dynamo_rewrites(["--disaggregation-mode", "decode"], ENGINE)[0] == ["--disaggregation-mode",
                                                                                      "decode"]
    with pytest.raises(dynamo.DynamoRefused, match="encode worker"):
        dynamo_rewrites(["--disaggregation-mode", "encode"], ENGINE)


def test_the_capture_levels_refuse_a_dynamo_worker() -> None:
    """A Dynamo worker serves through Dynamo's frontend and runtime: specparity starts no such thing (exit 3),
    before anything is started."""
    from types import SimpleNamespace

    from specparity.deploy_command import read_launch
    from specparity.errors import EXIT_ENVIRONMENT, EnvironmentProblem
    from specparity.serving.live.capture import start_server

    cmd = read_launch("python -m dynamo.vllm --model /m &", source="--launch", environ={})
    with pytest.raises(EnvironmentProblem, match=r"NVIDIA Dynamo.*--level static") as e:
        start_server(SimpleNamespace(label="vLLM"), cmd, python=None)
    assert e.value.exit_code == EXIT_ENVIRONMENT
