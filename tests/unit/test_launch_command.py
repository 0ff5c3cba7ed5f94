"""The shell layer of ``--launch``: a deploy command as written -> program, arguments and environment, as a POSIX
shell would run it (specparity.deploy_command). No engine here: tests/serving and tests/vllm_engine check the
engines' own parse of the same commands."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specparity.deploy_command import LaunchCommand, read_launch
from specparity.errors import EXIT_BAD_INPUT, InputError


def _read(text: str, **env: str) -> LaunchCommand:
    return read_launch(text, source="--launch", environ=env, cwd="/work")


# ------------------------------------------------------------------------------------------------ programs
@pytest.mark.parametrize(("text", "engine", "entry", "program"), [
    ("python -m sglang.launch_server --model-path m", "sglang", "sglang.launch_server",
     ("python", "-m", "sglang.launch_server")),
    ("python3.11 -u -m sglang.launch_server --model-path m", "sglang", "sglang.launch_server",
     ("python3.11", "-u", "-m", "sglang.launch_server")),
    ("/opt/venv/bin/python3 -m sglang.launch_server --model-path m", "sglang", "sglang.launch_server",
     ("/opt/venv/bin/python3", "-m", "sglang.launch_server")),
    ("sglang serve m", "sglang", "sglang serve", ("sglang", "serve")),
    ("python -m sglang.cli.main serve m", "sglang", "sglang serve", ("python", "-m", "sglang.cli.main", "serve")),
    ("vllm serve m", "vllm", "vllm serve", ("vllm", "serve")),
    (".venv/bin/vllm serve m", "vllm", "vllm serve", (".venv/bin/vllm", "serve")),
    ("python -m vllm.entrypoints.openai.api_server --model m", "vllm", "vllm.entrypoints.openai.api_server",
     ("python", "-m", "vllm.entrypoints.openai.api_server")),
    ("python -m vllm.entrypoints.cli.main serve m", "vllm", "vllm serve",
     ("python", "-m", "vllm.entrypoints.cli.main", "serve")),
    ("exec nohup env CUDA_VISIBLE_DEVICES=0 vllm serve m", "vllm", "vllm serve", ("vllm", "serve")),
    ("python3 -m dynamo.sglang --model-path m", "sglang", "dynamo.sglang", ("python3", "-m", "dynamo.sglang")),
    ("exec python -m dynamo.vllm --model m", "vllm", "dynamo.vllm", ("python", "-m", "dynamo.vllm")),
])
def test_programs_of_both_engines(text: str, engine: str, entry: str, program: tuple[str, ...]) -> None:
    c = _read(text)
    assert (c.engine, c.entry, c.program) == (engine, entry, program)
    assert c.args[-1] == "m"


def test_dynamo_workers_are_read_as_their_engine() -> None:
    assert _read("python -m dynamo.sglang --model-path m").dynamo
    assert _read("python -m dynamo.vllm --model m").dynamo
    assert not _read("python -m sglang.launch_server --model-path m").dynamo


@pytest.mark.parametrize("text", [
    "vllm serve m --port 8000 &",
    "vllm serve m --port 8000 &   # in the background\n\n# done\n",
    "export A=1\nCUDA_VISIBLE_DEVICES=0 vllm serve m \\\n  --port 8000 &\n",
])
def test_a_trailing_ampersand_is_set_aside_and_said(text: str) -> None:
    """A deploy script backgrounding the server: the same one command, and the report notes the '&'."""
    c = _read(text)
    assert c.args == ("m", "--port", "8000") and c.background
    assert any("trailing '&'" in n for n in c.notes())
    assert not _read("vllm serve m --port 8000").background and _read("vllm serve m").notes() == []
    assert LaunchCommand.from_dict(c.to_dict()) == c and c.redacted().background


@pytest.mark.parametrize(("text", "op"), [
    ("vllm serve m & vllm serve n", "'&'"),
    ("vllm serve m &\nwait", "'&'"),
    ("vllm serve m &&", "'&&'"),
    ("vllm serve m & # x\nsleep 1", "'&'"),
    ("vllm serve m | tee log &", "'|'"),
    ("nohup vllm serve m > log 2>&1 &", "'>'"),
])
def test_an_ampersand_before_more_text_stays_refused(text: str, op: str) -> None:
    with pytest.raises(InputError, match=f"the shell operator {op}") as e:
        _read(text)
    assert e.value.exit_code == EXIT_BAD_INPUT


def test_a_python_by_path_is_the_interpreter() -> None:
    assert _read("/opt/venv/bin/python -m sglang.launch_server").python == "/opt/venv/bin/python"
    assert _read(".venv/bin/python -m sglang.launch_server").python == "/work/.venv/bin/python"
    assert _read("python3 -m sglang.launch_server").python is None


@pytest.mark.parametrize(("text", "found"), [
    ("echo hi", "'echo'"),
    ("python -m sglang.bench_serving --model m", "'python -m sglang.bench_serving'"),
    ("python train.py", "'python train.py'"),
    ("vllm bench serve", "'vllm bench'"),
    ("trtllm-serve m", "'trtllm-serve'"),
])
def test_neither_engine_is_exit_2_naming_what_it_found(text: str, found: str) -> None:
    with pytest.raises(InputError) as e:
        _read(text)
    assert e.value.exit_code == EXIT_BAD_INPUT
    assert f"{found} starts neither engine" in str(e.value)
    assert "line 1" in str(e.value)


# ------------------------------------------------------------------------------------------------ shell syntax
def test_continuations_quotes_and_json_over_lines() -> None:
    c = _read("vllm serve /m \\\n  -tp 2 \\\n  --speculative-config '{\n    \"model\": \"/d\",\n"
              "    \"num_speculative_tokens\": 3\n  }' \\\n  --port 8000\n")
    assert c.args == ("/m", "-tp", "2", "--speculative-config",
                      '{\n    "model": "/d",\n    "num_speculative_tokens": 3\n  }', "--port", "8000")
    assert c.arg_lines == (1, 2, 2, 3, 3, 7, 7)


def test_env_prefix_export_lines_and_a_script() -> None:
    c = _read("#!/bin/bash\nset -ex\n# the model\nexport HF_HOME=/cache\nMODEL=/models/llama\n"
              "SGLANG_ENABLE_SPEC_V2=1 CUDA_VISIBLE_DEVICES=0,1 python3 -m sglang.launch_server \\\n"
              "    --model $MODEL --tp ${TP:-2}  # two GPUs\n")
    assert c.env == {"HF_HOME": "/cache", "SGLANG_ENABLE_SPEC_V2": "1", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert c.args == ("--model", "/models/llama", "--tp", "2")
    assert c.setup == ("set -ex", "MODEL=/models/llama")
    assert c.line == 6


def test_expansion_from_own_assignments_then_the_environment() -> None:
    c = _read('A=from_text\nvllm serve $A ${B} "${C:-c d}" ${D-dd} "$E"', B="from_env", E="")
    assert c.args == ("from_text", "from_env", "c d", "dd", "")


def test_an_unquoted_expansion_is_split_as_the_shell_splits_it() -> None:
    c = _read('ARGS="--tp 2  --dtype bfloat16"\nvllm serve m $ARGS "$ARGS"')
    assert c.args == ("m", "--tp", "2", "--dtype", "bfloat16", "--tp 2  --dtype bfloat16")


def test_prefix_assignments_do_not_expand_the_commands_own_words() -> None:
    # POSIX 2.9.1: the words are expanded before the prefix applies; bash would give vllm an empty model
    with pytest.raises(InputError, match=r"line 1: \$MODEL is not set"):
        _read("MODEL=/m vllm serve $MODEL")


def test_tilde_and_a_comment_inside_a_continued_command() -> None:
    c = _read("vllm serve ~/models/m \\\n  --port 1 # the port \\\n")
    assert c.args == (str(Path.home() / "models/m"), "--port", "1")


@pytest.mark.parametrize(("text", "message"), [
    ("vllm serve $MODEL", r"line 1: \$MODEL is not set"),
    ("export A=1\n\nvllm serve m \\\n  --x ${NOPE}", r"line 4: \$NOPE is not set"),
    ("vllm serve m | tee log", r"line 1: the shell operator '\|'"),
    ("vllm serve m > log 2>&1 &", r"the shell operator '>'"),
    ("cd /srv && vllm serve m", r"the shell operator '&&'"),
    ("vllm serve $(cat model.txt)", r"command substitution"),
    ("vllm serve `cat model.txt`", r"command substitution"),
    ("vllm serve 'm", r"single quote is never closed"),
    ('vllm serve "m', r"double quote is never closed"),
    ("vllm serve m\nvllm serve n", r"line 2: a statement after the launch command"),
    ("export A\nvllm serve m", r"export A: \$A is not set"),
    ("A=1\n# only that", r"no command that starts SGLang or vLLM"),
    ("", r"empty"),
    ("source venv/bin/activate\nvllm serve m", r"line 1: 'source venv/bin/activate' changes the shell itself"),
    ("cd /srv\nvllm serve m", r"line 1: 'cd /srv' changes the shell itself"),
])
def test_bad_input_is_exit_2_naming_the_line(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as e:
        _read(text)
    assert e.value.exit_code == EXIT_BAD_INPUT
    assert e.value.field == "--launch"


def test_errors_name_the_file_and_source(tmp_path: Path) -> None:
    f = tmp_path / "serve.sh"
    with pytest.raises(InputError) as e:
        read_launch("vllm serve $X", source="--launch-file", path=f, environ={})
    assert str(e.value).startswith(f"{f}: --launch-file: line 1:")


# ------------------------------------------------------------------------------------------------ secrets and records
def test_redacted_hides_keys_in_args_env_and_text() -> None:
    c = _read("export HF_TOKEN=hf_abc\nOPENAI_API_KEY=sk-1 vllm serve m --api-key sk-2 --admin-api-key=sk-3 "
              "--max-num-batched-tokens 8")
    shown = c.redacted([c.args.index("sk-2"), c.args.index("--admin-api-key=sk-3")])
    for secret in ("hf_abc", "sk-1", "sk-2", "sk-3"):
        assert secret not in shown.text and secret not in shown.one_line()
    assert shown.env == {"HF_TOKEN": "***", "OPENAI_API_KEY": "***"}
    assert "--max-num-batched-tokens" in shown.args and "8" in shown.args
    assert c.args[c.args.index("--api-key") + 1] == "sk-2"  # the command itself keeps what re-runs it


def test_record_round_trips_through_json() -> None:
    import json

    c = _read("export A=1\nvllm serve m --x 'a b'")
    assert LaunchCommand.from_dict(json.loads(json.dumps(c.to_dict()))) == c


# ------------------------------------------------------------------------------------------------ rules for all inputs
_WORD = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=0, max_size=12) \
    | st.sampled_from(["--speculative-config", '{"a": [1, 2]}', "a b", "it's", '"q"', "$HOME", "\\", "#x", "~", ""])


@settings(max_examples=150, deadline=None)
@given(st.lists(_WORD, max_size=8), st.data())
def test_quoting_round_trips_any_words(words: list[str], data: st.DataObject) -> None:
    """Any argument words, quoted by shlex and spread over continued lines, read back as the same words."""
    quoted = [shlex.quote(w) for w in words]
    breaks = data.draw(st.lists(st.booleans(), min_size=len(quoted), max_size=len(quoted)))
    text = "vllm serve" + "".join((" \\\n    " if b else " ") + q for q, b in zip(quoted, breaks, strict=True))
    c = _read(text)
    assert c.args == tuple(words)
    assert _read(c.one_line()).args == tuple(words)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True),
                       st.text(alphabet=st.characters(codec="ascii", exclude_categories=("Cc",)), max_size=10),
                       max_size=4))
def test_env_prefixes_round_trip(env: dict[str, str]) -> None:
    text = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " python -m sglang.launch_server --x 1"
    c = _read(text)
    assert c.env == env
    assert c.args == ("--x", "1")


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.characters(codec="ascii", exclude_categories=("Cc",)), max_size=12))
def test_a_quoted_expansion_is_the_value_itself(value: str) -> None:
    c = _read('vllm serve "$V" "${V}" "${V:-x}"', V=value)
    assert c.args == (value, value, value or "x")


# ------------------------------------------------------------------------------------------------ real commands
REAL = Path(__file__).resolve().parents[1] / "launch_commands"  # published commands, sources in its README.md


@pytest.mark.parametrize(("name", "engine", "entry", "env"), [
    ("sglang/docs_eagle3.sh", "sglang", "sglang.launch_server", {}),
    ("sglang/docs_spec_v2.sh", "sglang", "sglang.launch_server", {"SGLANG_ENABLE_SPEC_V2": "True"}),
    ("sglang/eagle_issue_298.sh", "sglang", "sglang.launch_server", {}),
    ("sglang/eagle_pr_173.sh", "sglang", "sglang.launch_server", {}),
    ("sglang/issue_5491.sh", "sglang", "sglang.launch_server", {}),
    ("sglang/docs_qwen3_next.sh", "sglang", "sglang.launch_server", {}),
    ("vllm/docs_api_server.sh", "vllm", "vllm.entrypoints.openai.api_server", {}),
    ("vllm/recipes_pr_449.sh", "vllm", "vllm serve", {"CUDA_VISIBLE_DEVICES": "0"}),
    ("vllm/speculators_blog.sh", "vllm", "vllm serve", {}),
    ("vllm/pr_20436_speculators.sh", "vllm", "vllm serve", {}),
    ("vllm/issue_7456.sh", "vllm", "vllm serve", {}),
    ("vllm/dynamo_agg_spec_decoding.sh", "vllm", "dynamo.vllm",
     {"DYN_SYSTEM_ENABLED": "true", "DYN_SYSTEM_PORT": "8081", "CUDA_VISIBLE_DEVICES": "0"}),
    ("sglang/dynamo_glm5_decode.sh", "sglang", "dynamo.sglang", {}),
])
def test_real_commands_read_by_the_shell_layer(name: str, engine: str, entry: str, env: dict[str, str]) -> None:
    c = read_launch((REAL / name).read_text(encoding="utf-8"), source="--launch-file", path=REAL / name,
                    environ={})
    assert (c.engine, c.entry, c.env) == (engine, entry, env)
    # continuations joined, no stray escapes (a quoted JSON value keeps its own lines)
    assert all("\\" not in a and ("\n" not in a or a.startswith("{")) for a in c.args)
    assert c.background == (name == "vllm/dynamo_agg_spec_decoding.sh")  # Dynamo's example backgrounds its worker
    if name == "vllm/recipes_pr_449.sh":
        i = c.args.index("--speculative-config")
        assert c.args[i + 1] == ('{"method": "eagle3", "model": "nvidia/gpt-oss-120b-Eagle3-v3", '
                                 '"num_speculative_tokens": 7}')


def test_a_real_script_that_sources_an_environment_is_exit_2_naming_the_line() -> None:
    """tutu329/server-install's script activates conda before the command: specparity cannot run `source`; the
    interpreter it would pick is given with --python."""
    with pytest.raises(InputError, match=r"line 3: 'source /home/tutu/miniconda3/etc/profile.d/conda.sh' changes "
                       r"the shell itself.*--python") as e:
        read_launch((REAL / "sglang/server_install_ds_v3.sh").read_text(encoding="utf-8"), source="--launch-file",
                    environ={})
    assert e.value.exit_code == EXIT_BAD_INPUT
