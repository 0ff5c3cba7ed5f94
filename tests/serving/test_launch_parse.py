"""SGLang's own parse of real launch commands: ``parse_launch`` against the installed release's
``prepare_server_args`` on the same words.

The commands are published ones, copied verbatim into tests/launch_commands/ (sources in its README.md); only their
model names become the bundled fixture directories. The reference is SGLang itself: one child of this interpreter
runs ``prepare_server_args`` (and ``sglang serve``'s own positional rewrite) on every command's words, so the test
never re-implements the parse it checks. Each ``parse_launch`` is one child of its own (the product path); the
time of each is printed (``-s``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from version_facts import installed_facts

from specparity.deploy_command import LaunchCommand, read_launch
from specparity.errors import EXIT_BAD_INPUT, InputError
from specparity.serving.command.parse import LaunchSpec, parse_launch

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "launch_commands" / "sglang"
TARGET, DRAFT = REPO / "fixtures" / "default" / "target", REPO / "fixtures" / "default" / "draft"
# the hub ids and paths in the published commands -> the bundled models (nothing else in a command changes)
MODELS = {
    "meta-llama/Meta-Llama-3.1-8B-Instruct": TARGET, "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B": DRAFT,
    "Qwen/Qwen2.5-7B-Instruct": TARGET, "Qwen/Qwen2.5-1.5B-Instruct": DRAFT,
    "<target-model-path>": TARGET, "<draft-model-path>": DRAFT,
    "/models/Qwen3-8B": TARGET, "engyunw/qwen3_8b_eagle3": DRAFT,
    "meta-llama/Llama-2-7b-chat-hf": TARGET, "lmzheng/sglang-EAGLE-llama2-chat-7B": DRAFT,
    "/mnt/data/open_source/QwQ-32B/Qwen__QwQ-32B/": TARGET, "/mnt/train/eagle/EAGLE-1/ckpt_2/state_1/": DRAFT,
    "Qwen/Qwen3-Next-80B-A3B-Instruct": TARGET,
}
_CHECKED = ("model_path", "speculative_draft_model_path", "speculative_algorithm", "speculative_num_steps",
            "speculative_eagle_topk", "speculative_num_draft_tokens", "tp_size", "dtype", "mem_fraction_static",
            "port", "attention_backend", "cuda_graph_max_bs", "log_level")
# SGLang's own code on the same words, in one child for every command (the reference the specs are held to)
_REFERENCE = textwrap.dedent("""
    import argparse, json, os, sys
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    from specparity.serving.sglang.worker import install_kernel_stub_if_needed
    install_kernel_stub_if_needed("cpu")
    from sglang.srt.server_args import ServerArgs, prepare_server_args
    out = []
    for entry, argv in json.load(sys.stdin):
        if entry == "sglang serve":
            try:
                from sglang.cli.serve import _normalize_positional_model_path
            except ImportError:
                out.append({"exit": "no sglang serve"})
                continue
            argv = _normalize_positional_model_path(argv)[0]
        # the values as SGLang's own parser reads them (ServerArgs.add_cli_args on argparse, as prepare_server_args
        # builds it), then what prepare_server_args and the resolution make of them
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        try:
            ns = parser.parse_args(list(argv))
        except SystemExit as e:
            out.append({"exit": e.code})
            continue
        row = {k: getattr(ns, k, None) for k in json.loads(os.environ["CHECKED"])}
        try:
            sa = prepare_server_args(list(argv))
            if hasattr(sa, "resolve_once"):
                sa.resolve_once()
                row["resolved_num_draft_tokens"] = sa.resolved_dict()["speculative_num_draft_tokens"]
            else:
                row["resolved_num_draft_tokens"] = sa.speculative_num_draft_tokens
        except BaseException:
            row["resolved_num_draft_tokens"] = None
        out.append(row)
    print("@@ref " + json.dumps(out, default=str))
""")


def _command(name: str, *, edit: dict[str, str] | None = None, program: str | None = None,
             cwd: Path = REPO) -> LaunchCommand:
    text = (DATA / name).read_text(encoding="utf-8")
    for old, new in {**MODELS, **(edit or {})}.items():
        text = text.replace(old, str(new))
    if program is not None:
        text = text.replace("python3 -m sglang.launch_server", program, 1)
    return read_launch(text, source="--launch-file", path=DATA / name, cwd=cwd, environ={})


# (id, file, edits of the text besides the model names, the program instead of python3 -m sglang.launch_server)
_GRAPH_FIX = {"--cuda-graph-max-bs ": "--cuda-graph-max-bs-decode "}
CASES: list[tuple[str, str, dict[str, str] | None, str | None]] = [
    ("docs-eagle3", "docs_eagle3.sh", None, None),
    # SGLang 0.5.23 split --cuda-graph-max-bs into -decode/-prefill, so its own docs' command is ambiguous to it;
    # the variants below carry the fix its message points to, every other word as published
    ("docs-eagle3-graph-fix", "docs_eagle3.sh", _GRAPH_FIX, None),
    ("docs-eagle3-sglang-serve-positional", "docs_eagle3.sh", {**_GRAPH_FIX, "--model ": ""}, "sglang serve"),
    # a user who tunes the docs' topk to 1 and keeps its 16 draft tokens: SGLang rewrites 16 -> steps + 1 = 4
    ("docs-eagle3-topk1", "docs_eagle3.sh",
     {**_GRAPH_FIX, "--speculative-eagle-topk 4": "--speculative-eagle-topk 1"}, None),
    ("docs-spec-v2-graph-fix", "docs_spec_v2.sh", _GRAPH_FIX, None),
    ("specforge-specbundle", "specforge_specbundle.sh", None, None),
    ("eagle-issue-298-graph-fix", "eagle_issue_298.sh", _GRAPH_FIX, None),
    ("eagle-pr-173", "eagle_pr_173.sh", None, None),
    ("sglang-issue-5491-graph-fix", "issue_5491.sh", _GRAPH_FIX, None),
    ("docs-qwen3-next", "docs_qwen3_next.sh", None, None),
]
_RESOLVE = ("docs-eagle3-graph-fix", "docs-eagle3-topk1", "specforge-specbundle")
# The matrix's other SGLang envs parse only the cases whose answer depends on the release (scripts/matrix.sh sets
# this: the docs' flag a release split, the draft-token rewrite, an older release's flag abbreviation); every case
# runs on the default release (make test) and with SPECPARITY_MATRIX_FULL=1. Each case is one parse child (~10
# CPU-s of SGLang's imports), so this is ~70 CPU-s per env.
_ONLY = [c for c in os.environ.get("SPECPARITY_LAUNCH_CASES", "").split(",") if c]
if _ONLY:
    CASES = [c for c in CASES if c[0] in _ONLY]
Parsed = dict[str, tuple[LaunchCommand, "LaunchSpec | InputError", float]]


@pytest.fixture(scope="module")
def parsed() -> Parsed:
    out: Parsed = {}
    for case_id, name, edit, program in CASES:
        c = _command(name, edit=edit, program=program)
        t0 = time.perf_counter()
        try:
            got: LaunchSpec | InputError = parse_launch(c, resolve=case_id in _RESOLVE)
        except InputError as e:
            got = e
        out[case_id] = (c, got, time.perf_counter() - t0)
        print(f"parse_launch {case_id}: {out[case_id][2]:.1f} s"
              + (" (rejected)" if isinstance(got, InputError) else f" (child {got.timings['parse_s']:.1f} s)"))
    return out


def _spec(parsed: Parsed, case_id: str) -> LaunchSpec:
    got = parsed[case_id][1]
    if isinstance(got, InputError):
        pytest.fail(f"{case_id}: {got}")
    return got


@pytest.fixture(scope="module")
def reference(parsed: Parsed) -> dict[str, dict[str, Any]]:
    ids = [case_id for case_id, *_ in CASES]
    argvs = [[parsed[i][0].entry, list(parsed[i][0].args)] for i in ids]
    env = {**os.environ, "CHECKED": json.dumps(_CHECKED), "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, "-c", _REFERENCE], input=json.dumps(argvs), capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=600)
    line = next(x for x in done.stdout.splitlines() if x.startswith("@@ref "))
    return dict(zip(ids, json.loads(line[len("@@ref "):]), strict=True))


@pytest.mark.parametrize("case_id", [c[0] for c in CASES])
def test_launch_spec_is_sglangs_own_parse(case_id: str, parsed: Parsed, reference: dict[str, dict[str, Any]]) -> None:
    """Where SGLang's parser refuses the words (argparse exit 2), the spec is exit 2 with its message; else every
    value the command set reaches the gate as SGLang itself parsed it."""
    _, got, _ = parsed[case_id]
    ref = reference[case_id]
    if "exit" in ref:
        assert ref["exit"] in (2, "no sglang serve")
        assert isinstance(got, InputError) and got.exit_code == EXIT_BAD_INPUT
        assert "SGLang rejects the command (line" in str(got)
        return
    spec = _spec(parsed, case_id)
    assert spec.engine == "sglang" and spec.engine_version
    assert Path(spec.target).resolve() == (REPO / ref["model_path"]).resolve() == TARGET.resolve()
    if ref["speculative_draft_model_path"] is None:
        assert spec.draft is None
    else:
        assert Path(spec.draft or "").resolve() == DRAFT.resolve()
    for key in _CHECKED[2:]:
        if key == "port":
            assert spec.port == ref[key]
        elif key in spec.explicit:
            assert spec.engine_args[key] == ref[key], key
    assert spec.speculative["algorithm"] == ref["speculative_algorithm"]
    assert (spec.speculative["num_steps"], spec.speculative["eagle_topk"], spec.speculative["num_draft_tokens"]) == \
        (ref["speculative_num_steps"], ref["speculative_eagle_topk"], ref["speculative_num_draft_tokens"])
    assert "model_path" not in spec.engine_args and "speculative_draft_model_path" not in spec.engine_args
    if spec.resolved is not None:
        assert spec.resolved["speculative_num_draft_tokens"] == ref["resolved_num_draft_tokens"]


def test_the_forms_reach_the_gate(parsed: Parsed, reference: dict[str, dict[str, Any]]) -> None:
    """What each published form means, as SGLang parsed it (spot values, besides the reference comparison)."""
    if _ONLY:
        pytest.skip(f"SPECPARITY_LAUNCH_CASES parses only {_ONLY} here (scripts/matrix.sh); every form is checked on "
                    "the default release")
    if "exit" in reference["docs-eagle3-graph-fix"]:
        pytest.skip("this SGLang has no --cuda-graph-max-bs-decode (before 0.5.2x): the variants are refused")
    docs = _spec(parsed, "docs-eagle3-graph-fix")
    assert docs.engine_args["speculative_algorithm"] == "EAGLE3" and docs.engine_args["dtype"] == "float16"
    assert docs.engine_args["mem_fraction_static"] == 0.7 and "--model" in docs.command.args
    if "exit" in reference["docs-eagle3-sglang-serve-positional"]:  # no positional model before 0.5.2x (0.5.14)
        got = parsed["docs-eagle3-sglang-serve-positional"][1]
        assert isinstance(got, InputError) and "--model-path" in str(got), got
    else:
        serve = _spec(parsed, "docs-eagle3-sglang-serve-positional")  # `sglang serve MODEL ...`
        assert serve.target == docs.target and serve.engine_args == docs.engine_args
        assert serve.command.entry == "sglang serve" and serve.target_flag == "--model-path"
    spec_v2 = _spec(parsed, "docs-spec-v2-graph-fix")
    assert spec_v2.command.env == {"SGLANG_ENABLE_SPEC_V2": "True"}
    assert spec_v2.engine_args["speculative_algorithm"] == "STANDALONE"
    issue = _spec(parsed, "eagle-issue-298-graph-fix")
    assert issue.engine_args["mem_fraction_static"] == 0.9 and issue.port == 30000  # --mem-fraction abbreviates
    tp = _spec(parsed, "sglang-issue-5491-graph-fix")
    assert tp.engine_args["tp_size"] == 2 and tp.engine_args["speculative_algorithm"] == "EAGLE"
    qwen = _spec(parsed, "docs-qwen3-next")
    assert qwen.engine_args["tp_size"] == 4 and qwen.speculative["algorithm"] == "NEXTN" and qwen.draft is None
    rewrite = _spec(parsed, "docs-eagle3-topk1")
    assert rewrite.resolved is not None and rewrite.resolved["speculative_num_draft_tokens"] == 4
    assert rewrite.engine_args["speculative_num_draft_tokens"] == 16  # the command's own value reaches the gate
    assert rewrite.rewrite_rule is not None and rewrite.rewrite_rule.startswith("sglang/srt/")
    assert any("16 -> 4" in line for line in rewrite.lines())


def test_sglangs_own_docs_command_is_refused_by_this_release(parsed: Parsed, reference: dict[str, dict[str, Any]]) \
        -> None:
    """The rejection names the flag and its line in the file, with SGLang's own message."""
    got = parsed["docs-eagle3"][1]
    if "exit" not in reference["docs-eagle3"]:
        assert isinstance(got, LaunchSpec)
        return
    assert isinstance(got, InputError)
    assert "--cuda-graph-max-bs" in str(got) and "(line 9)" in str(got) and "ambiguous option" in str(got)
    assert str(DATA / "docs_eagle3.sh") in str(got)
    # the releases that take it (serving/flag_history.py), and --python
    assert re.search(r"--cuda-graph-max-bs is a flag of SGLang 0\.4\.0-0\.5\.\d+ ", str(got)), str(got)
    assert "give --python with the serving env's own interpreter" in str(got)


def test_a_flag_sglang_rejects_is_exit_2_naming_it(parsed: Parsed, reference: dict[str, dict[str, Any]]) -> None:
    """SafeAILab/EAGLE#173's --speculative-draft (an older SGLang's flag) is ambiguous to 0.5.23's parser."""
    got = parsed["eagle-pr-173"][1]
    if "exit" not in reference["eagle-pr-173"]:
        assert isinstance(got, LaunchSpec)
        return
    assert isinstance(got, InputError) and got.exit_code == EXIT_BAD_INPUT
    assert "--speculative-draft" in str(got) and "(line 1)" in str(got)
    assert "--speculative-draft is the abbreviation of --speculative-draft-model-path in SGLang 0.4." in str(got)
    assert "--python" in str(got)


@pytest.mark.parametrize(("text", "words"), [
    ("python -m sglang.launch_server --model-path fixtures/default/target --attention-backend fa99 --tp-size two",
     ["--attention-backend", "invalid choice"]),
    ("python -m sglang.launch_server --model-path fixtures/default/target \\\n --no-such-flag 1",
     ["--no-such-flag", "unrecognized", "(line 2)"]),
    ("python -m sglang.launch_server --model-path no/such-model", ["--model-path", "no/such-model",
                                                                   "not a directory"]),
    ("python -m sglang.launch_server --model-path fixtures/default/target --speculative-draft-model-path nodir",
     ["--speculative-draft-model-path", "nodir"]),
    ("python -m sglang.launch_server --model-path fixtures/default/target --config missing.yaml", ["--config"]),
    ("python -m sglang.cli.main serve fixtures/default/target", ["runs nothing"]),
])
def test_bad_input_is_exit_2(text: str, words: list[str]) -> None:
    with pytest.raises(InputError) as e:
        parse_launch(read_launch(text, source="--launch", cwd=REPO, environ={}), resolve=False)
    assert e.value.exit_code == EXIT_BAD_INPUT
    for w in words:
        assert w in str(e.value)


def _has_config_merger() -> bool:
    """Whether the installed SGLang has a --config merger (read from its files: importing sglang here would not do)."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    root = Path(spec.origin or "").parent if spec is not None else None
    return root is not None and any((root / "srt" / p).is_file() for p in (
        "utils/server_args_config_parser.py", "server_args_config_parser.py"))


def test_config_yaml_merged_by_sglang(tmp_path: Path) -> None:
    """A --config YAML (the docs' EAGLE-3 flags as keys) goes through SGLang's own ConfigArgumentMerger; the
    command line wins over the file, as SGLang merges them."""
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(f"model-path: {TARGET}\nspeculative-algorithm: EAGLE3\nspeculative-draft-model-path: {DRAFT}\n"
                   "speculative-num-steps: 3\nspeculative-eagle-topk: 4\nspeculative-num-draft-tokens: 16\n"
                   "mem-fraction-static: 0.7\ntp: 1\n")
    c = read_launch(f"python -m sglang.launch_server --config {cfg} --speculative-num-steps 5", source="--launch",
                    cwd=tmp_path, environ={})
    if not _has_config_merger():  # 0.4.x has no --config: refused by name, exit 2
        with pytest.raises(InputError, match="has no --config") as e:
            parse_launch(c, resolve=False)
        assert e.value.exit_code == EXIT_BAD_INPUT
        return
    spec = parse_launch(c, resolve=False)
    assert Path(spec.target) == TARGET and Path(spec.draft or "") == DRAFT
    assert spec.engine_args["speculative_num_steps"] == 5 and spec.engine_args["speculative_eagle_topk"] == 4
    assert spec.engine_args["tp_size"] == 1 and spec.engine_args["mem_fraction_static"] == 0.7


def test_api_key_never_leaves_the_parse() -> None:
    c = read_launch(f"python -m sglang.launch_server --model-path {TARGET} --api-key sk-secret-1",
                    source="--launch", environ={})
    spec = parse_launch(c, resolve=False)
    assert spec.api_key_set
    shown = json.dumps(spec.to_dict()) + "\n".join(spec.lines())
    assert "sk-secret-1" not in shown and "***" in shown
    assert "api_key" not in spec.engine_args and "sk-secret-1" not in json.dumps(spec.parsed)


def test_explain_launch_warns_of_the_rewrite_and_strict_fails_it(tmp_path: Path) -> None:
    """SpecForge's own command with the docs' 16 draft tokens at topk 1: explain answers as before, adds the
    rewrite as a warning citing the rule in the installed release, and --strict exits 1 on it."""
    from click.testing import CliRunner

    from specparity.cli import main

    text = _command("specforge_specbundle.sh", edit={"--speculative-num-draft-tokens 4": "--speculative-num-draft-tokens "
                                                                                           "16"}).text
    out = tmp_path / "answer.json"
    result = CliRunner().invoke(main, ["explain", "--strict", "--json", str(out), "--launch", "--", text])
    assert result.exit_code == 1, result.output
    assert "warning  spec_config_rewritten: SGLang" in result.output and "16 -> 4" in result.output
    # family B resolves explain's cuda device with CUDA graphs on: its own error note decides first (D3); family A
    # ignores the draft's ids and biases fc (D1, D4): its errors decide first
    facts, first = installed_facts(), result.output.splitlines()[0]
    if facts.fc_always_biased:
        assert "draft_ids_ignored" in first
    else:
        assert ("cuda_graph_ids_hazard" in first) if facts.graph_ids_hazard else \
            ("--strict: warnings spec_config_rewritten" in first)
    answer = json.loads(out.read_text())
    assert answer["launch"]["engine_args"]["speculative_num_draft_tokens"] == 16
    (warning,) = [f for f in answer["findings"] if f["kind"] == "spec_config_rewritten"]
    assert warning["details"]["rule"].startswith("sglang/srt/") and answer["served_sources"] == (
        ["layer:1", "layer:3", "layer:4"] if facts.fc_always_biased else ["layer:1", "layer:3", "layer:5"])


def test_gate_launch_static_runs_the_commands_deployment(tmp_path: Path) -> None:
    """gate --launch at the static level: the command's deployment, resolved by SGLang, against the bundled
    contract; the report carries the command and its parse."""
    from click.testing import CliRunner

    from specparity.cli import main

    c = _command("specforge_specbundle.sh")
    report = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["gate", "--contract", str(REPO / "contracts" / "tiny-llama-eagle3.json"),
                                       "--level", "static", "--json", str(report), "--launch", "--", c.text])
    # family B's CUDA-graph hazard (D3) is an error on the bundle's [1, 3, 5], and family A's ignored ids and biased
    # fc (D1, D4): the command's deployment, judged
    hazard = installed_facts().graph_ids_hazard or installed_facts().fc_always_biased
    assert result.exit_code == (1 if hazard else 0), result.output
    assert "Launch parsed by SGLang" in result.output
    v = json.loads(report.read_text())
    assert v["verdict"] == ("fail" if hazard else "pass")
    assert v["launch"]["engine_args"]["speculative_num_steps"] == 3
    assert Path(v["launch"]["target"]) == TARGET and v["launch"]["speculative"]["algorithm"] == "EAGLE3"


# ------------------------------------------------------------------------------------------------ NVIDIA Dynamo
DYNAMO = "dynamo_glm5_decode.sh"  # Dynamo's GLM-5 recipe: its SGLang decode worker (tests/launch_commands/README.md)
_DYNAMO_MODELS = {"nvidia/GLM-5-NVFP4": str(TARGET)}


def test_dynamos_published_sglang_worker_is_refused_naming_the_flags() -> None:
    """Its --cuda-graph-max-bs is ambiguous to SGLang 0.5.2x (exit 2, SGLang's own words, the line), and the message
    names the releases that accept it and --python; an older release, whose own flag it is, refuses another of the
    recipe's words (its nsa backends), exit 2 all the same."""
    from importlib import metadata

    c = _command(DYNAMO, edit=_DYNAMO_MODELS)
    assert c.dynamo
    release = tuple(int(x) for x in metadata.version("sglang").split(".")[:3] if x.isdigit())
    if release < (0, 5, 20):  # --cuda-graph-max-bs is this release's own flag: its parser decides the rest
        try:
            parse_launch(c, resolve=False)  # 0.5.14 has every word of the recipe
        except InputError as refused:  # 0.4.x: the recipe's nsa backends
            assert refused.exit_code == EXIT_BAD_INPUT and "SGLang rejects the command (line " in str(refused)
            assert "Traceback" not in str(refused)
        return
    with pytest.raises(InputError) as e:
        parse_launch(c, resolve=False)
    assert e.value.exit_code == EXIT_BAD_INPUT and "Traceback" not in str(e.value)
    assert "SGLang rejects the command (line 13)" in str(e.value) and "--cuda-graph-max-bs" in str(e.value)
    assert "--cuda-graph-max-bs is a flag of SGLang 0.4.0-" in str(e.value) and "--python" in str(e.value)


def test_a_dynamo_sglang_worker_is_sglangs_own_parse_with_dynamos_flags_set_aside() -> None:
    """The recipe's worker with the fix SGLang's message points to and without the flags 0.5.23 does not have,
    plus Dynamo's own flags and a trailing '&': the same engine arguments as the plain launch_server command of the
    same SGLang words, and the report says it ran under Dynamo."""
    edit = {**_DYNAMO_MODELS, "--cuda-graph-max-bs ": "--cuda-graph-max-bs-decode ",
            "--nsa-decode-backend trtllm \\\n": "", "--nsa-prefill-backend trtllm \\\n": "",
            "--prefill-round-robin-balance \\\n": "", "--watchdog-timeout 3600": "--watchdog-timeout 3600 &"}
    sglang_words = _command(DYNAMO, edit=edit)
    plain = read_launch(sglang_words.text.replace("exec python3 -m dynamo.sglang", "python3 -m sglang.launch_server"),
                        source="--launch", cwd=REPO, environ={})
    try:
        b = parse_launch(plain, resolve=False)
    except InputError as e:  # another SGLang release: the recipe's other flags may not be its own
        pytest.skip(f"this SGLang rejects the recipe's words without Dynamo too: {e}")
    dynamo_words = _command(DYNAMO, edit={**edit, "--trust-remote-code": "--trust-remote-code --endpoint "
                                          "dyn://glm.decode.generate --dyn-tool-call-parser glm47"})
    a = parse_launch(dynamo_words, resolve=False)
    assert a.engine_args == b.engine_args and a.target == b.target == str(TARGET)
    assert a.engine_args["speculative_algorithm"] == "EAGLE" and a.engine_args["tp_size"] == 16
    assert a.speculative == b.speculative and a.command.background
    notes = " ".join(a.notes)
    assert "NVIDIA Dynamo (python -m dynamo.sglang)" in notes and "trailing '&'" in notes
    assert "--endpoint dyn://glm.decode.generate --dyn-tool-call-parser glm47" in notes
    assert not any("Dynamo" in n for n in b.notes)

