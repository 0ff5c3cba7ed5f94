"""The pytest plugin, through pytester: items, options, ini, reports, xdist, and failure paths.

Most tests replace the gate with a canned verdict (the plugin is thin; the gate has its own tests),
so they exercise exactly the plugin. ``test_real_*`` run the real gate on the bundled models.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tests.deploy_files import draft_with_ids, pyproject_with_deployments

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "contracts" / "tiny-llama-eagle3.json"
BUNDLE = ROOT / "fixtures" / "default"

# Inner conftest: replace run_gate with a canned verdict and log every call. Inner runs are subprocesses
# (runpytest_subprocess), so the replacement never leaks into this session.
CANNED = '''
import json, os
import specparity.gate as gate
from specparity.compare.findings import Finding, FindingKind, Severity
from specparity.verdict import ChunkReport, FixSuggestion, OutcomeSummary, Verdict

KIND = os.environ.get("CANNED", "pass")

def fake(contract, target, draft, *, deployed_args=None, level="all", python=None, **kw):
    with open(os.environ["CALLS"], "a") as f:
        f.write(json.dumps({"contract": str(contract), "target": str(target), "draft": str(draft),
                            "args": deployed_args, "level": level}) + "\\n")
    if KIND == "bad-input":
        from specparity.errors import InputError
        raise InputError("unknown field (not in contract schema v1)", path=contract, field="drafter.fc_biass")
    exp = ["layer:1", "layer:3", "layer:5"]
    findings, status, served = [], "pass", exp
    if KIND == "fail":
        status, served = "fail", ["embedding", "layer:1", "layer:3"]
        findings = [Finding(FindingKind.EXTRA_EMBEDDING, Severity.ERROR, "chunk 0: served embedding, expected layer:1",
                            chunk=0, details={"check": "capture"})]
    if KIND == "error":
        status = "error"
        findings = [Finding(FindingKind.ENGINE_ERROR, Severity.ERROR,
                            "TypeError: unsupported operand at sglang/srt/models/llama.py:340", details={"check": "engine"})]
    return Verdict(contract_name="tiny", contract_hash="ab" * 32, level=level, status=status, engine_version="0.5.23",
                   target_architecture="LlamaForCausalLM", draft_path=str(draft), expected_layout=exp,
                   served_layout=served, chunks=[ChunkReport(i, e, s, 1.0 if e == s else 0.5, 0.0 if e == s else 0.1)
                                                 for i, (e, s) in enumerate(zip(exp, served))],
                   findings=findings,
                   outcome={"pass": OutcomeSummary([0.8], [0.8], 1.8, 1.8, [0.8], "healthy"),
                            "fail": OutcomeSummary([0.8], [0.1], 1.8, 1.1, [0.8], "wiring")}.get(status),
                   fix=FixSuggestion("set eagle_config.eagle_aux_hidden_state_layer_ids = [1, 3, 5] in d/config.json")
                   if status == "fail" else None,
                   probes=[{"index": i, "tokens": 80, "status": "pass" if status == "pass" else "fail",
                            "max_abs_err": 0.0} for i in range(4)])

gate.run_gate = fake
'''


@pytest.fixture
def canned_calls(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The pytester dir set up for the canned gate (its conftest, the contract as c.json); the file the canned
    gate logs its calls to. ``CANNED`` (the verdict) is left to the test."""
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("CALLS", str(calls))
    pytester.makeconftest(CANNED)
    shutil.copy(CONTRACT, pytester.path / "c.json")
    return calls


@pytest.fixture
def canned(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, canned_calls: Path):  # type: ignore[no-untyped-def]
    calls = canned_calls

    def run(kind: str, *args: str):  # type: ignore[no-untyped-def]
        monkeypatch.setenv("CANNED", kind)
        base = ["-m", "parity", "--parity-contract", "c.json", "--parity-target", "t", "--parity-draft", "d", *args]
        result = pytester.runpytest_subprocess(*base)
        lines = calls.read_text().splitlines() if calls.exists() else []
        return result, [json.loads(x) for x in lines]

    return run


def test_marker_is_registered_with_usage(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.parity: train/serve parity checks*--parity-contract FILE*"])


def test_pass_generates_one_item_per_check_and_probe(canned) -> None:  # type: ignore[no-untyped-def]
    result, calls = canned("pass", "-v")
    result.stdout.fnmatch_lines(["parity::tiny-llama-eagle3::static PASSED*", "parity::tiny-llama-eagle3::capture?probe-0? PASSED*",
                                 "parity::tiny-llama-eagle3::capture?probe-3? PASSED*", "parity::tiny-llama-eagle3::outcome PASSED*"])
    result.assert_outcomes(passed=6)
    assert len(calls) == 1  # one gate run shared by every item


def test_fail_shows_house_style_lines_on_capture_items(canned) -> None:  # type: ignore[no-untyped-def]
    result, _ = canned("fail")
    result.assert_outcomes(passed=2, failed=4)  # static and outcome own no failing finding here
    result.stdout.fnmatch_lines([
        "*FAIL  fc input does not match contract 'tiny'*",
        "Fix: set eagle_config.eagle_aux_hidden_state_layer_ids = [[]1, 3, 5[]] in d/config.json",
        "chunk 0: served embedding      expected layer:1*",
        "error   extra_embedding: chunk 0: served embedding, expected layer:1",
    ])
    assert "Traceback" not in result.stdout.str()


def test_environment_error_fails_every_item_never_skips(canned) -> None:  # type: ignore[no-untyped-def]
    result, _ = canned("error")
    result.assert_outcomes(failed=6)
    result.stdout.fnmatch_lines(["*ERROR  could not check fc input*SGLang failed*", "*sglang/srt/models/llama.py:340*"])


def test_bad_contract_fails_with_file_and_field(canned) -> None:  # type: ignore[no-untyped-def]
    result, _ = canned("bad-input")
    result.assert_outcomes(failed=6)
    result.stdout.fnmatch_lines(["*specparity: c.json: drafter.fc_biass: unknown field*"])
    assert "Traceback" not in result.stdout.str()


def test_options_from_ini_and_level(pytester: pytest.Pytester, monkeypatch, canned_calls) -> None:  # type: ignore[no-untyped-def]
    calls = canned_calls
    monkeypatch.setenv("CANNED", "pass")
    pytester.makeini("""
        [pytest]
        parity_contract = c.json
        parity_target = models/target
        parity_draft = models/draft
        parity_level = static
        parity_sglang_args =
            speculative_num_steps=3
            speculative_eagle_topk=1
    """)
    result = pytester.runpytest_subprocess("-m", "parity", "-v")
    result.stdout.fnmatch_lines(["parity::tiny-llama-eagle3::static PASSED*"])
    result.assert_outcomes(passed=1)  # static level: no capture or outcome items
    call = json.loads(calls.read_text())
    assert call["level"] == "static"
    assert call["args"] == {"speculative_num_steps": 3, "speculative_eagle_topk": 1}
    assert call["target"] == str(pytester.path / "models" / "target")  # ini paths are relative to the rootdir


def test_command_line_overrides_ini(canned, pytester: pytest.Pytester) -> None:  # type: ignore[no-untyped-def]
    pytester.makeini("[pytest]\nparity_draft = from-ini\n")
    _, calls = canned("pass", "--parity-sglang-arg", "speculative_num_draft_tokens=16")
    assert calls[0]["draft"] == "d" and calls[0]["args"] == {"speculative_num_draft_tokens": 16}


def test_older_engine_args_key_in_pyproject_is_read_as_an_alias(pytester: pytest.Pytester, monkeypatch,  # type: ignore[no-untyped-def]
                                                                canned_calls) -> None:
    """A user's pyproject.toml written for an older specparity names the engine's arguments parity_sglang_args: they
    still reach the gate, under parity_engine_args' values of the same key."""
    monkeypatch.setenv("CANNED", "pass")
    pytester.makepyprojecttoml("""
        [tool.pytest.ini_options]
        parity_contract = "c.json"
        parity_target = "t"
        parity_draft = "d"
        parity_level = "static"
        parity_sglang_args = ["speculative_num_steps=3", "speculative_eagle_topk=2"]
        parity_engine_args = ["speculative_eagle_topk=1"]
    """)
    result = pytester.runpytest_subprocess("-m", "parity")
    result.assert_outcomes(passed=1)
    assert json.loads(canned_calls.read_text())["args"] == {"speculative_num_steps": 3, "speculative_eagle_topk": 1}


def test_parity_without_configuration_fails_with_usage(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("-m", "parity")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*specparity: pytest -m parity needs a contract: pass --parity-contract FILE*"])


def test_contract_without_target_is_a_usage_failure(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("-m", "parity", "--parity-contract", "c.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*--parity-contract is set but --parity-target, --parity-draft is not*"])


def test_plain_runs_are_untouched(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x():\n    assert True\n")
    pytester.runpytest().assert_outcomes(passed=1)


def test_junit_properties_and_report_dir(canned, pytester: pytest.Pytester) -> None:  # type: ignore[no-untyped-def]
    result, _ = canned("fail", "--junitxml=out.xml", "--parity-report", "reports")
    xml = (pytester.path / "out.xml").read_text()
    assert '<property name="verdict" value="fail"' in xml
    assert '<property name="finding.0" value="extra_embedding: chunk 0: served embedding, expected layer:1"' in xml
    report = json.loads((pytester.path / "reports" / "report.json").read_text())
    assert report["verdict"] == "fail" and report["served_layout"][0] == "embedding"
    html = (pytester.path / "reports" / "report.html").read_text()
    assert "FAIL" in html and "extra_embedding" in html  # the canned verdict has no heatmap to show
    result.stdout.fnmatch_lines(["*specparity: report written to*report.json*"])


def test_xdist_workers_share_one_gate_run(canned, pytester: pytest.Pytester) -> None:  # type: ignore[no-untyped-def]
    result, calls = canned("pass", "-n", "2", "--parity-report", "reports")
    result.assert_outcomes(passed=6)
    assert len(calls) == 1
    assert json.loads((pytester.path / "reports" / "report.json").read_text())["verdict"] == "pass"


def test_a_later_run_never_reuses_an_earlier_verdict(canned) -> None:  # type: ignore[no-untyped-def]
    first, _ = canned("pass", "-n", "2")
    first.assert_outcomes(passed=6)
    second, calls = canned("fail", "-n", "2")
    second.assert_outcomes(passed=2, failed=4)
    assert len(calls) == 2


@pytest.mark.sglang
def test_real_gate_pass_and_kimi_bug(pytester: pytest.Pytester, tmp_path: Path) -> None:
    draft = draft_with_ids(BUNDLE / "draft", tmp_path / "draft-kimi", [-1, 1, 3])
    common = ["-m", "parity", "--parity-contract", str(CONTRACT), "--parity-target", str(BUNDLE / "target"),
              "--parity-level", "capture", "-p", "no:cacheprovider"]
    ok = pytester.runpytest_subprocess(*common, "--parity-draft", str(BUNDLE / "draft"))
    ok.assert_outcomes(passed=5)
    bad = pytester.runpytest_subprocess(*common, "--parity-draft", str(draft))
    bad.assert_outcomes(passed=1, failed=4)
    bad.stdout.fnmatch_lines(["*FAIL  fc input does not match contract 'tiny-llama-eagle3' (sglang 0.5.23*",
                              "Fix: set eagle_config.eagle_aux_hidden_state_layer_ids = [[]1, 3, 5[]] in *",
                              "chunk 0: served embedding      expected layer:1*",
                              "error   extra_embedding: chunk 0: served embedding, expected layer:1*"])


# --- node ids, collection and several deployments ------------------------------------------------

DEPLOYMENTS = pyproject_with_deployments({
    "llama-a": {"contract": "c.json", "target": "models/target", "draft": "models/draft-a",
                "engine_args": {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "a": "3", "b": "True",
                                "e": "none", "f": [1]}},
    "llama-b": {"contract": "c.json", "target": "models/target", "draft": "models/draft-b", "level": "capture",
                "engine": "sglang"},
})


def test_node_ids_do_not_depend_on_the_invocation_dir(canned, pytester: pytest.Pytester) -> None:  # type: ignore[no-untyped-def]
    sub = pytester.mkdir("deep").joinpath("er")
    sub.mkdir()
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(sub)  # the rootdir stays pytester.path (the ini file); the invocation dir is two below
        result, _ = canned("pass", "-v", f"--rootdir={pytester.path}", "--parity-contract", str(pytester.path / "c.json"))
    out = result.stdout.str()
    result.stdout.fnmatch_lines(["collecting ... collected 6 items",
                                 "parity::tiny-llama-eagle3::static PASSED*",
                                 "parity::tiny-llama-eagle3::capture[[]probe-0[]] PASSED*",
                                 "parity::tiny-llama-eagle3::outcome PASSED*"])
    assert "../" not in out and "parity::static" not in out


def test_collect_only_counts_and_lists_the_items(canned) -> None:  # type: ignore[no-untyped-def]
    result, calls = canned("pass", "--collect-only", "-q")
    result.stdout.fnmatch_lines([
        "parity::tiny-llama-eagle3::static",
        *(f"parity::tiny-llama-eagle3::capture[[]probe-{i}[]]" for i in range(4)),
        "parity::tiny-llama-eagle3::outcome",
        "6 tests collected in *",
    ])
    assert calls == []  # collecting never runs the gate
    deselected, _ = canned("pass", "-m", "not parity")  # the later -m wins: every parity item is deselected
    deselected.stdout.fnmatch_lines(["collected 6 items / 6 deselected / 0 selected"])


def test_two_deployments_in_one_session(pytester: pytest.Pytester, monkeypatch, canned_calls) -> None:  # type: ignore[no-untyped-def]
    calls = canned_calls
    monkeypatch.setenv("CANNED", "pass")
    pytester.makepyprojecttoml(DEPLOYMENTS)
    result = pytester.runpytest_subprocess("-m", "parity", "-v", "--parity-report", "reports")
    result.stdout.fnmatch_lines([
        "collecting ... collected 11 items",
        "parity::llama-a::static PASSED*", "parity::llama-a::capture[[]probe-3[]] PASSED*",
        "parity::llama-a::outcome PASSED*",
        "parity::llama-b::static PASSED*", "parity::llama-b::capture[[]probe-3[]] PASSED*",
    ])
    result.assert_outcomes(passed=11)  # llama-b is capture level: no outcome item
    got = [json.loads(x) for x in calls.read_text().splitlines()]
    assert len(got) == 2  # one gate run (one engine start) per deployment
    by_draft = {Path(c["draft"]).name: c for c in got}
    assert by_draft["draft-a"]["args"] == {"speculative_num_steps": 3, "speculative_eagle_topk": 1,  # as written
                                           "a": "3", "b": "True", "e": "none", "f": [1]}
    assert by_draft["draft-a"]["level"] == "all" and by_draft["draft-b"]["level"] == "capture"
    assert by_draft["draft-b"]["target"] == str(pytester.path / "models" / "target")  # relative to pyproject.toml
    for name in ("llama-a", "llama-b"):
        report = json.loads((pytester.path / "reports" / name / "report.json").read_text())
        assert report["verdict"] == "pass" and report["draft_path"].endswith(f"draft-{name[-1]}")
    only_b = pytester.runpytest_subprocess("-m", "parity", "-k", "llama-b")
    only_b.assert_outcomes(passed=5)
    assert len(calls.read_text().splitlines()) == 3  # -k llama-b started only llama-b's engine
    xdist = pytester.runpytest_subprocess("-m", "parity", "-n", "2", "--parity-report", "xreports")
    xdist.assert_outcomes(passed=11)
    assert len(calls.read_text().splitlines()) == 5  # under xdist too: one gate run per deployment
    assert sorted(p.name for p in (pytester.path / "xreports").iterdir()) == ["llama-a", "llama-b"]


def test_deployments_from_ini_lines(pytester: pytest.Pytester, monkeypatch, canned_calls) -> None:  # type: ignore[no-untyped-def]
    calls = canned_calls
    monkeypatch.setenv("CANNED", "fail")
    pytester.makeini("""
        [pytest]
        parity_deployments =
            one contract=c.json target=t draft=d1 level=static
            two contract=c.json target=t draft=d2 level=capture engine_arg=speculative_num_steps=2
    """)
    result = pytester.runpytest_subprocess("-m", "parity")
    result.assert_outcomes(passed=2, failed=4)  # static items own no failing finding; two's captures fail
    result.stdout.fnmatch_lines(["collected 6 items", "FAILED parity::two::capture[[]probe-0[]]*"])
    got = [json.loads(x) for x in calls.read_text().splitlines()]
    assert sorted((Path(c["draft"]).name, c["level"], c["args"]) for c in got) == [
        ("d1", "static", {}), ("d2", "capture", {"speculative_num_steps": 2})]


@pytest.mark.parametrize(("toml", "message"), [
    ('[tool.specparity.deployments.x]\ncontract = "c.json"\ntarget = "t"\n',
     "*specparity: */pyproject.toml: tool.specparity.deployments.x.draft: missing key 'draft'*"),
    ('[tool.specparity.deployments.x]\ncontract = "c.json"\ntarget = "t"\ndraft = "d"\ntarget_dir = "t"\n',
     "*tool.specparity.deployments.x.target_dir: unknown key 'target_dir'*"),
    ('[tool.specparity.deployments.x]\ncontract = "c.json"\ntarget = "t"\ndraft = "d"\nlevel = "most"\n',
     "*tool.specparity.deployments.x.level: unknown level 'most'*"),
])
def test_bad_deployment_table_names_file_and_field(pytester: pytest.Pytester, toml: str, message: str) -> None:
    pytester.makepyprojecttoml(toml)
    result = pytester.runpytest_subprocess("-m", "parity", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([message])
    assert "Traceback" not in result.stdout.str()


HEAVY_PROBE = '''
import json, os, sys

HEAVY = ("torch", "matplotlib", "sglang", "vllm", "transformers", "rich", "jinja2")

def pytest_collection_finish(session):
    with open(os.environ["HEAVY_OUT"], "w") as f:
        json.dump(sorted(m for m in HEAVY if m in sys.modules), f)
'''


def test_start_up_imports_no_torch_matplotlib_or_engine(pytester: pytest.Pytester, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Collecting two deployments' parity items loads nothing heavy; benchmarks/bench_startup.py times it."""
    out = tmp_path / "heavy.json"
    monkeypatch.setenv("HEAVY_OUT", str(out))
    pytester.makeconftest(HEAVY_PROBE)
    shutil.copy(CONTRACT, pytester.path / "c.json")
    pytester.makepyprojecttoml(DEPLOYMENTS)
    result = pytester.runpytest_subprocess("--collect-only", "-q")
    result.stdout.fnmatch_lines(["parity::llama-a::static", "11 tests collected in *"])
    assert json.loads(out.read_text()) == []


def test_node_ids_on_the_command_line_select_items(canned, pytester: pytest.Pytester) -> None:  # type: ignore[no-untyped-def]
    pytester.makepyfile("def test_app():\n    assert True\n")
    two, calls = canned("pass", "-v", "parity::tiny-llama-eagle3::static", "parity::tiny-llama-eagle3::capture[probe-1]")
    two.assert_outcomes(passed=2)
    two.stdout.fnmatch_lines(["collecting ... collected 6 items / 4 deselected / 2 selected",
                              "parity::tiny-llama-eagle3::static PASSED*",
                              "parity::tiny-llama-eagle3::capture[[]probe-1[]] PASSED*"])
    assert len(calls) == 1
    group, _ = canned("pass", "-n", "2", "parity::tiny-llama-eagle3", "test_node_ids_on_the_command_line_select_items.py")
    group.assert_outcomes(passed=6)  # the whole group under xdist, and -m parity deselected the file's test
    missing, _ = canned("pass", "parity::nope::static")
    assert missing.ret == pytest.ExitCode.USAGE_ERROR
    missing.stderr.fnmatch_lines(["ERROR: not found: parity::nope::static (parity items here: parity::tiny-llama-eagle3)"])
