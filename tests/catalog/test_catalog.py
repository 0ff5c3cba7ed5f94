"""The failure catalog: each miswiring, served by the installed SGLang's real code, gives its named finding.

Runs in every SGLang env of the matrix. Where the installed version cannot serve a scenario (e.g. an id
of -1 crashes llama targets before 0.5.22), the expectation comes from the conventions module's model
of that version, so the same scenario gives the same finding kinds on every version that serves it.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import pytest

from specparity.gate import run_gate
from specparity.idrules import sglang
from specparity.serving.sglang.adapter import AdapterEntry, parse_version, select_adapter
from specparity.verdict import Verdict

pytestmark = pytest.mark.sglang
SGLANG = version("sglang")
L = 8

_verdicts: dict[tuple[str, str], Verdict] = {}


def gate(catalog: dict[str, Any], name: str, *, level: str = "capture", **kw: Any) -> Verdict:
    key = (name, level + repr(sorted(kw.items())))
    if key not in _verdicts:
        contract, target, draft = catalog[name]
        _verdicts[key] = run_gate(contract, target, draft, level=level, **kw)
    return _verdicts[key]


def kinds(v: Verdict) -> set[str]:
    return {f.kind.value for f in v.errors}


def _serves(ids: list[int]) -> bool:
    return sglang.capture_plan(ids, num_layers=L, architecture="LlamaForCausalLM", version=SGLANG).crash is None


# D5 (domain.md §7): before 0.5.12 the drafter builds fc = Linear(3*H_t, H_d) whatever the config says
# (sglang 0.5.3 models/llama_eagle3.py:134-138); tests/serving/version_facts.py pins the same per adapter family.
FC_WIDTH_FIXED_AT_3 = parse_version(SGLANG) < (0, 5, 12)
NORM_BEFORE_FC_APPLIED = parse_version(SGLANG) >= (0, 5, 17)  # sglang 0.5.23 models/llama_eagle3.py:172-181
# Family A (0.4.4.post2-0.4.8) is served at the static level only (serving/sglang/since_0_4_4/static_only.py): every capture-level verdict is the
# typed unsupported_version refusal, an environment error (exit 3), never a pass and never a layout claim
_ENTRY = select_adapter(SGLANG)
STATIC_ONLY = isinstance(_ENTRY, AdapterEntry) and _ENTRY.family == "A"
# Family B (0.4.9-0.5.10, D3): CUDA graphs capture the default ids [1, L//2-1, L-4] = [1, 3, 4]; the static level
# resolves the deployment as served (device=cuda, graphs on) and reports the hazard for the bundle's [1, 3, 5]
GRAPH_IDS_HAZARD = isinstance(_ENTRY, AdapterEntry) and _ENTRY.family == "B"


# scenario -> (status, finding kinds that must be among the errors)
CASES: dict[str, tuple[str, set[str]]] = {
    "healthy": ("pass", set()),
    # the deployed target is not the one training recorded: each its own named finding, exit 1
    "other_weights": ("fail", {"target_mismatch"}),
    "other_tokenizer": ("fail", {"tokenizer_mismatch"}),
    "other_chat_template": ("fail", {"chat_template_mismatch"}),
    # a config SGLang crashes on is the deployment's fault: exit 1, with SGLang's own message
    "embedding_plus_layers": ("fail", {"extra_embedding", "missing_source"}) if _serves([-1, 1, 3])
    else ("fail", {"engine_error"}),
    "no_eagle_config": ("fail", {"default_ids_fallback", "off_by_one"}),
    "ids_plus_one": ("fail", {"off_by_one"}),
    "far_layers": ("fail", {"missing_source", "off_by_one"}),  # layer:3, 4, 6: layer:1 gone, two shifted
    "last_layer_id": ("fail", {"capture_count_short"}),
    # before 0.5.12 fc is Linear(3*H_t, H_d) whatever the config says (D5): the 1-aux [H, H] fc cannot load
    "fc_skipped": ("fail", {"engine_error"}) if FC_WIDTH_FIXED_AT_3
    else ("fail", {"fc_not_called", "width_mismatch"}),
    "nan_target": ("fail", {"nonfinite"}),
    # D5: before 0.5.17 SGLang ignores norm_before_fc (its drafter builds no input_norm), so a draft config that
    # sets it still serves the un-normed fc input training used, and a contract that needs it cannot be served
    "norm_before_fc": ("pass", set()) if not NORM_BEFORE_FC_APPLIED else ("fail", {"norm_mismatch"}),
    "norm_before_fc_contract": ("fail", {"norm_mismatch"}) if not NORM_BEFORE_FC_APPLIED else ("pass", set()),
    "vocab_map": ("fail", {"vocab_map_mismatch"}),
    # ids [1,3,5,6] with a 3 x 64 fc: where fc is sized from the ids (4 x 64) the checkpoint cannot load; where
    # it is fixed at 3*H_t it loads, SGLang captures 4 states and its own fc matmul raises on the 256-wide input
    # (measured on 0.5.3 and 0.4.10.post2): the crash and the 4th chunk are both reported
    "unloadable_draft": ("fail", {"engine_error", "width_mismatch", "layout_mismatch"}) if FC_WIDTH_FIXED_AT_3
    else ("fail", {"engine_error"}),
    "self_inconsistent": ("fail", {"contract_self_inconsistent"}),
    "order": ("fail", {"order_mismatch"}),
}
# What the gate checks from the deployment's files alone, with no SGLang answer (deployed.py, compare/target.py,
# diagnosis of the draft's d2t): found at the capture level on family A too, next to the refusal
FOUND_FROM_FILES = frozenset({"tokenizer_mismatch", "chat_template_mismatch", "vocab_map_mismatch"})
if STATIC_ONLY:
    # the capture level is refused (exit 3) unless a file-level miswiring is found as well: that is the deployment's
    # fault (exit 1), refusal included; the static level's findings are test_a_static_only_version_* below
    CASES = {name: ("fail", {*(expected & FOUND_FROM_FILES), "engine_error"}) if expected & FOUND_FROM_FILES
             else ("error", {"engine_error"}) for name, (_, expected) in CASES.items()}


def assert_capture_refused(v: Verdict, *, found: frozenset[str] | set[str] = frozenset()) -> None:
    """Family A at the capture level: the version's typed refusal naming ``--level static``, nothing served claimed.
    Exit 3 (the check cannot run here), or exit 1 where a miswiring was ``found`` from the files alone."""
    want = ("fail", 1) if found else ("error", 3)
    assert (v.status, v.exit_code) == want, [f.to_dict() for f in v.findings]
    assert set(found) <= kinds(v), sorted(kinds(v))
    refusals = [f for f in v.errors if "static level only" in f.message]
    assert refusals and all(SGLANG in f.message and "--level static" in f.message for f in refusals), [
        f.to_dict() for f in v.errors]
    assert v.served_layout is None and all(c.served is None for c in v.chunks)


@pytest.mark.parametrize("name", sorted(CASES))
def test_scenario_gives_its_finding(catalog: dict[str, Any], name: str) -> None:
    status, expected = CASES[name]
    v = gate(catalog, name)
    assert v.status == status, (name, v.status, [f.to_dict() for f in v.findings])
    assert expected <= kinds(v), (name, sorted(kinds(v)))
    if STATIC_ONLY:
        assert_capture_refused(v, found=expected & FOUND_FROM_FILES)
        return
    if status == "pass":
        assert v.served_layout == ["layer:1", "layer:3", "layer:5"] and not v.errors
    else:
        assert v.exit_code == 1, (name, v.exit_code)  # each is the deployment's (or contract's) fault
    if name == "norm_before_fc_contract" and not NORM_BEFORE_FC_APPLIED:
        [f] = [f for f in v.errors if f.kind.value == "norm_mismatch"]
        assert f"sglang {SGLANG} cannot apply" in f.message and f.fix and "0.5.17" in f.fix, f.to_dict()


def test_layout_failures_come_with_a_fix_that_names_the_ids(catalog: dict[str, Any]) -> None:
    for name in ("embedding_plus_layers", "ids_plus_one", "no_eagle_config"):
        if STATIC_ONLY:  # family A never reads the ids: no id fix can help there (draft_ids_ignored says so)
            v = gate(catalog, name, level="static")
            assert "draft_ids_ignored" in kinds(v) or name == "no_eagle_config", (name, sorted(kinds(v)))
            assert v.fix is None or "eagle_aux_hidden_state_layer_ids = [1, 3, 5]" not in v.fix.summary, name
            continue
        v = gate(catalog, name)  # also where this version crashes on the config: the fix is the same ids
        assert v.fix is not None and "eagle_aux_hidden_state_layer_ids = [1, 3, 5]" in v.fix.summary, name


def test_silent_num_draft_tokens_rewrite(catalog: dict[str, Any]) -> None:
    v = gate(catalog, "healthy", level="static", engine_args={
        "speculative_num_steps": 1, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 16})
    assert v.status == "fail" and "spec_config_rewritten" in kinds(v)
    assert v.resolved_spec_config is not None
    assert v.resolved_spec_config["resolved"]["num_draft_tokens"] == 2
    [rewrite] = [f for f in v.errors if f.kind.value == "spec_config_rewritten"]
    assert rewrite.fix is not None and "--speculative-num-steps 15" in rewrite.fix
    if STATIC_ONLY:  # the verdict's fix is the layout's: no draft config serves layer:1,3,5 on family A (D1)
        assert v.fix is not None and "ignores draft-config ids" in v.fix.summary, v.fix
    else:
        assert v.fix is not None and "--speculative-num-steps 15" in v.fix.summary


def test_static_level_sees_the_layout_without_a_forward(catalog: dict[str, Any]) -> None:
    v = gate(catalog, "ids_plus_one", level="static")
    if STATIC_ONLY:  # D1: the configured [2, 4, 6] is never read; SGLang's default [1, L//2-1, L-4] is served
        plan = sglang.capture_plan([2, 4, 6], num_layers=L, architecture="LlamaForCausalLM", version=SGLANG)
        assert plan.used_default and v.served_layout == list(plan.served_sources) == ["layer:1", "layer:3", "layer:4"]
        assert v.exit_code == 1 and v.chunks[0].cosine is None
        # against the contract's layer:1,3,5 only chunk 2 differs, one layer early
        assert {"draft_ids_ignored", "off_by_one"} <= kinds(v), sorted(kinds(v))
        return
    assert v.served_layout == ["layer:2", "layer:4", "layer:6"]
    assert "off_by_one" in kinds(v) and v.chunks[0].cosine is None


def test_static_level_on_the_bundle_as_trained(catalog: dict[str, Any]) -> None:
    """The healthy bundle (trained on layer:1,3,5) at the static level: a pass where the ids are honoured;
    on family A the defaults layer:1,3,4 are served whatever the config says, and the fc bias is random (D4)."""
    v = gate(catalog, "healthy", level="static")
    if GRAPH_IDS_HAZARD:  # the eager layout is right; graph-replayed decode would feed layer:1,3,4 (D3)
        assert (v.status, v.exit_code) == ("fail", 1) and v.served_layout == ["layer:1", "layer:3", "layer:5"]
        hazard = [f for f in v.errors if f.kind.value == "cuda_graph_ids_hazard"]
        assert len(hazard) == 1 and "[1, 3, 4]" in hazard[0].message and "sglang #22836" in hazard[0].message, [
            f.to_dict() for f in v.errors]
        assert kinds(v) == {"cuda_graph_ids_hazard"}, kinds(v)
        # served without CUDA graphs (the finding's own fix), the same deployment passes
        v = gate(catalog, "healthy", level="static", engine_args={"disable_cuda_graph": True})
    if not STATIC_ONLY:
        assert (v.status, v.exit_code) == ("pass", 0), [f.to_dict() for f in v.errors]
        assert v.served_layout == ["layer:1", "layer:3", "layer:5"]
        return
    assert (v.status, v.exit_code) == ("fail", 1) and v.served_layout == ["layer:1", "layer:3", "layer:4"]
    ignored = [f for f in v.errors if f.kind.value == "draft_ids_ignored"]
    assert len(ignored) == 1 and "[1, 3, 4]" in ignored[0].message and SGLANG in ignored[0].message
    assert any(f.kind.value == "config_mismatch" and "fc.bias" in f.message for f in v.errors), [
        f.to_dict() for f in v.errors]


def test_timeout_is_an_environment_error(catalog: dict[str, Any]) -> None:
    # A deadline no run can meet on any machine (1 ms: past before the job's first poll, serving/child/process.py):
    # a warm child finishes the tiny capture within 1 s (seen on 0.4.10), so a looser deadline would be a race.
    # Family A answers a capture with its refusal at once, so there it is the static level that times out.
    v = (gate(catalog, "healthy", level="static", timeout_s=0.001) if STATIC_ONLY
         else gate(catalog, "healthy", timeout_s=0.001))
    assert v.status == "error" and v.exit_code == 3 and "timeout" in kinds(v), [f.to_dict() for f in v.findings]


def test_a_config_sglang_crashes_on_is_reported_as_that_crash(catalog: dict[str, Any]) -> None:
    """[-1,1,3]: where the installed version crashes (llama before 0.5.22), the verdict is that crash alone,
    SGLang's own message quoted, with the fix; no layout finding for a layout SGLang never served."""
    v = gate(catalog, "embedding_plus_layers")
    crash = sglang.capture_plan([-1, 1, 3], num_layers=L, architecture="LlamaForCausalLM", version=SGLANG).crash
    if STATIC_ONLY:  # the ids are never read (D1): no crash, and the capture level is refused
        assert crash is None
        assert_capture_refused(v)
        return
    if crash is None:
        assert v.served_layout == ["embedding", "layer:1", "layer:3"] and v.status == "fail"
        return
    assert (v.status, v.exit_code) == ("fail", 1)  # SGLang refuses the deployment as configured: its fault
    assert kinds(v) == {"engine_error"}, [f.to_dict() for f in v.errors]
    assert crash in v.errors[0].message and " at sglang/srt/models/llama.py:" in v.errors[0].message
    assert v.fix is not None and "eagle_aux_hidden_state_layer_ids = [1, 3, 5]" in v.fix.summary
    assert v.served_layout is None and all(c.served is None for c in v.chunks)  # never served: unknown


# --- family A (0.4.4.post2-0.4.8): the static level is the level it offers, and it must still catch every miswiring
# What its static level finds per scenario beyond what every scenario carries there (the default layout layer:1,3,4
# against the contract's layer:1,3,5, and the random fc bias, D1/D4): what can be read from files and SGLang's own
# resolution. The rest (other weights, NaN, order, ...) show only in served tensors, which family A never gives.
STATIC_ONLY_FINDS: dict[str, set[str]] = {
    "other_tokenizer": {"tokenizer_mismatch"}, "other_chat_template": {"chat_template_mismatch"},
    "vocab_map": {"vocab_map_mismatch"},
    "norm_before_fc_contract": {"norm_mismatch"},  # 0.4.8 builds no norm modules (D5)
    "fc_skipped": {"engine_error"},  # fc is Linear(3*H_t, H_d) (D5): SGLang's loader refuses the [H, H] fc
}
_STATIC_ONLY = pytest.mark.skipif(not STATIC_ONLY, reason=f"sglang {SGLANG} runs the capture level: its static "
                                  "verdicts are covered by the tests above")


@_STATIC_ONLY
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_static_only_version_still_fails_every_scenario_at_the_static_level(catalog: dict[str, Any],
                                                                              name: str) -> None:
    """Never a pass on family A: at its static level every scenario, healthy included, exits 1 (the ids are not
    read and fc's bias is random, D1/D4), and each miswiring the static level can see is named."""
    v = gate(catalog, name, level="static")
    assert (v.status, v.exit_code) == ("fail", 1), (name, [f.to_dict() for f in v.findings])
    extra = STATIC_ONLY_FINDS.get(name, set())
    assert extra <= kinds(v), (name, sorted(kinds(v)))
    if name == "fc_skipped":  # SGLang refuses to build it: no layout is claimed
        assert v.served_layout is None
        return
    assert v.served_layout == ["layer:1", "layer:3", "layer:4"], name
    assert {"off_by_one", "config_mismatch"} <= kinds(v), (name, sorted(kinds(v)))
    ignored = [f for f in v.findings if f.kind.value == "draft_ids_ignored"]
    assert len(ignored) == 1 and ignored[0].severity.value == ("warning" if name == "no_eagle_config" else "error")


# --- one decision, every face: the CLI, the reports and every pytest item are views of one verdict


def _failing_items(v: Verdict, probes: int, name: str) -> dict[str, bool]:
    """The rule, restated from the issue: an item fails iff an error finding is on its check (or on every
    check) and, for a probe item, on no other probe."""
    items: dict[str, tuple[str, int | None]] = {f"parity::{name}::static": ("static", None)}
    if v.level in ("capture", "outcome", "all"):
        items |= {f"parity::{name}::capture[probe-{i}]": ("capture", i) for i in range(probes)}
    out = {}
    for node, (check, probe) in items.items():
        out[node] = any(f.severity.value == "error" and f.details.get("check", "engine") in (check, "engine")
                        and f.details.get("sample") in (None, probe) for f in v.findings)
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_cli_reports_and_pytest_items_are_views_of_one_verdict(catalog: dict[str, Any], name: str,
                                                               pytester: pytest.Pytester,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from click.testing import CliRunner

    import specparity.gate
    from specparity.cli import main

    v = gate(catalog, name)
    contract, target, draft = catalog[name]
    monkeypatch.setattr(specparity.gate, "run_gate", lambda *a, **k: v)
    out = pytester.path / "cli"
    cli = CliRunner().invoke(main, ["gate", "--contract", str(contract), "--target", str(target), "--draft",
                                    str(draft), "--level", "capture", "--json", str(out / "r.json"),
                                    "--html", str(out / "r.html"), "--junit", str(out / "j.xml")])
    assert cli.exit_code == v.exit_code, (name, cli.output)
    assert json.loads((out / "r.json").read_text())["verdict"] == v.status
    import xml.etree.ElementTree as ET

    suite = ET.parse(out / "j.xml").getroot().find("testsuite")
    assert suite is not None
    junit_failed = int(suite.get("failures", "0")) + int(suite.get("errors", "0")) > 0
    assert junit_failed == (v.status != "pass"), (name, ET.tostring(suite)[:400])
    for case in suite.findall("testcase"):  # probe cases: the same per-probe decision as the pytest items
        if case.get("name", "").startswith("capture[probe "):
            i = int(case.get("name", "")[len("capture[probe "):-1])
            assert (case.find("failure") is not None) == (v.probes[i]["status"] != "pass")
    text = cli.stdout
    assert text.splitlines()[0].startswith("PASS") == (v.status == "pass"), text
    if v.status == "pass":
        assert "Fix:" not in text

    rec = pytester.inline_run("-m", "parity", "--parity-contract", str(contract), "--parity-target", str(target),
                              "--parity-draft", str(draft), "--parity-level", "capture", "-p", "no:cacheprovider")
    reports = {r.nodeid: r for r in rec.getreports("pytest_runtest_logreport") if r.when == "call"}
    from specparity.contract import load_contract
    from specparity.plugin_deployments import contract_name

    expected = _failing_items(v, load_contract(contract).probes.num_samples, contract_name(str(contract)))
    assert set(reports) == set(expected), (sorted(reports), sorted(expected))
    for node, fails in expected.items():
        r = reports[node]
        assert r.failed == fails, (name, node, r.longreprtext[:400])
        if r.failed:
            assert not r.longreprtext.lstrip().startswith("PASS"), r.longreprtext[:200]
        if v.status == "pass":
            assert "Fix:" not in r.longreprtext
    session_failed = any(r.failed for r in reports.values())
    assert session_failed == (v.exit_code != 0), (name, v.exit_code)


@pytest.mark.parametrize(("name", "kind"), [("other_weights", "target_mismatch"),
                                            ("other_tokenizer", "tokenizer_mismatch"),
                                            ("other_chat_template", "chat_template_mismatch")])
def test_a_wrong_target_exits_1_with_its_finding_and_a_full_html_report(catalog: dict[str, Any], name: str, kind: str,
                                                                       tmp_path: Any) -> None:
    from specparity.report import write_reports

    v = gate(catalog, name)
    if STATIC_ONLY:
        # other weights under the same config are seen only in the recorded tensors, which family A never serves:
        # there the refusal alone (exit 3); a tokenizer or chat template is read from the files (exit 1)
        found = {kind} & FOUND_FROM_FILES
        assert_capture_refused(v, found=found)
        if not found:
            return
        assert kinds(v) == {kind, "engine_error"}, [f.to_dict() for f in v.errors]
    else:
        assert (v.status, v.exit_code) == ("fail", 1) and kinds(v) == {kind}, [f.to_dict() for f in v.errors]
    if kind == "target_mismatch":
        assert "other weights" in v.errors[0].message
        assert v.served_layout == ["layer:1", "layer:3", "layer:5"]  # SGLang serves the right layers of it
    else:
        assert any(str(catalog[name][1]) in f.message for f in v.errors if f.kind.value == kind)
    write_reports(v, json_path=tmp_path / "r.json", html_path=tmp_path / "r.html")
    html = (tmp_path / "r.html").read_text()
    assert kind in html and "FAIL" in html
