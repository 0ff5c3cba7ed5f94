"""The JUnit XML report (one testcase per check) and the JSON report."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from specparity.compare.findings import Finding, FindingKind, Severity
from specparity.report import render_json, render_junit, render_text, write_junit
from specparity.verdict import ChunkReport, FixSuggestion, Heatmap, OutcomeSummary, Verdict

EXPECTED = ("layer:1", "layer:3", "layer:5")
SERVED = ("embedding", "layer:1", "layer:3")
FIX = "set eagle_config.eagle_aux_hidden_state_layer_ids = [1, 3, 5] in d/config.json"


def verdict(**kw: object) -> Verdict:
    base: dict[str, object] = dict(
        contract_name="tiny-llama-eagle3", contract_hash="ab" * 32, level="all", status="pass",
        engine_version="0.5.23", target_architecture="LlamaForCausalLM", draft_path="d",
        expected_layout=EXPECTED, served_layout=EXPECTED,
    )
    base.update(kw)
    return Verdict(**base)  # type: ignore[arg-type]


def failing() -> Verdict:
    return verdict(
        status="fail", served_layout=SERVED,
        chunks=tuple(ChunkReport(i, e, s, cosine=0.3, max_abs_err=2.0) for i, (e, s) in
                     enumerate(zip(EXPECTED, SERVED, strict=True))),
        findings=(
            Finding(FindingKind.DEFAULT_IDS_FALLBACK, Severity.ERROR, "SGLang used its default ids"),
            Finding(FindingKind.EXTRA_EMBEDDING, Severity.ERROR, "chunk 0 serves embedding", chunk=0),
            Finding(FindingKind.SPEC_CONFIG_REWRITTEN, Severity.WARNING, "num_draft_tokens 16 is served as 4"),
            Finding(FindingKind.ACCEPTANCE_COLLAPSE, Severity.ERROR, "acceptance collapses on the served fc input",
                    details={"check": "outcome"}),
        ),
        fix=FixSuggestion(FIX),
        probes=({"index": 0, "tokens": 32, "status": "pass", "max_abs_err": 0.0},
                {"index": 1, "tokens": 17, "status": "fail", "max_abs_err": 2.0}),
        outcome=OutcomeSummary((0.75, 0.57), (0.04, 0.0), 2.32, 1.04, None, "wiring"),
        timings={"static": 1.5, "capture": 20.25},
    )


def suite_of(v: Verdict) -> ET.Element:
    root = ET.fromstring(render_junit(v))
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert len(suites) == 1 and suites[0].get("name") == "specparity"
    return suites[0]


def props(suite: ET.Element) -> dict[str, str]:
    return {p.get("name", ""): p.get("value", "") for p in suite.iter("property")}


def cases(suite: ET.Element) -> dict[str, ET.Element]:
    return {c.get("name", ""): c for c in suite.findall("testcase")}


def test_failing_verdict_one_testcase_per_check() -> None:
    suite = suite_of(failing())
    cs = cases(suite)
    assert list(cs) == ["static", "capture", "capture[probe 0]", "capture[probe 1]", "outcome"]
    assert {n for n, c in cs.items() if c.find("failure") is not None} == {"static", "capture", "capture[probe 1]",
                                                                            "outcome"}
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("time")) == ("5", "4", "0", "21.750")
    static = cs["static"].find("failure")
    assert static is not None and static.get("type") == "default_ids_fallback"
    assert (static.text or "").splitlines() == [
        "FAIL  fc input does not match contract 'tiny-llama-eagle3' (sglang 0.5.23, LlamaForCausalLM)",
        f"Fix: {FIX}",
        "error   default_ids_fallback: SGLang used its default ids",
        "warning spec_config_rewritten: num_draft_tokens 16 is served as 4",
    ]
    capture = cs["capture"].find("failure")
    assert capture is not None and capture.get("message") == "chunk 0 serves embedding"
    text = (capture.text or "").splitlines()
    assert text[2:] == [ln for ln in render_text(failing()).splitlines() if ln.startswith("chunk ")] + [
        "error   extra_embedding: chunk 0 serves embedding"]
    probe = cs["capture[probe 1]"].find("failure")
    assert probe is not None and probe.get("message") == "probe 1 (17 tokens): fail, max|d| 2.0"
    outcome = cs["outcome"].find("failure")
    assert outcome is not None and outcome.get("type") == "acceptance_collapse"
    assert "wiring" in (outcome.text or "")  # the diagnosis lines come with it


def test_properties_carry_verdict_hash_version_and_every_finding() -> None:
    p = props(suite_of(failing()))
    assert p["verdict"] == "fail" and p["contract_hash"] == "ab" * 32 and p["engine_version"] == "0.5.23"
    assert p["sglang_version"] == "0.5.23"  # engine_version's deprecated alias (until 0.2.0)
    assert p["served_layout"] == "embedding, layer:1, layer:3"
    assert [p[f"finding.{n}"] for n in range(4)] == [
        "default_ids_fallback: SGLang used its default ids",
        "extra_embedding: chunk 0 serves embedding",
        "spec_config_rewritten: num_draft_tokens 16 is served as 4",
        "acceptance_collapse: acceptance collapses on the served fc input",
    ]
    assert "finding.4" not in p


def test_passing_verdict_has_no_failures() -> None:
    v = verdict(probes=({"index": 0, "tokens": 8, "status": "pass", "max_abs_err": 0.0},))
    suite = suite_of(v)
    assert list(cases(suite)) == ["static", "capture", "capture[probe 0]"]
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "0", "0")
    assert props(suite)["verdict"] == "pass"


def test_static_level_has_only_the_static_case() -> None:
    v = verdict(level="static", status="fail", served_layout=SERVED,
                findings=(Finding(FindingKind.EXTRA_EMBEDDING, Severity.ERROR, "served layout starts with embedding"),))
    cs = cases(suite_of(v))
    assert list(cs) == ["static"]
    assert cs["static"].find("failure") is not None


def test_environment_error_is_an_error_element_and_control_chars_are_removed() -> None:
    v = verdict(status="error", served_layout=None, findings=(
        Finding(FindingKind.ENGINE_ERROR, Severity.ERROR, "RuntimeError: captured 2 of 3 aux hidden states \x1b[0m"),))
    suite = suite_of(v)
    err = cases(suite)["sglang"].find("error")
    assert err is not None and err.get("type") == "engine_error"
    assert err.get("message") == "RuntimeError: captured 2 of 3 aux hidden states ?[0m"
    assert (suite.get("errors"), suite.get("failures")) == ("1", "0")
    assert "capture" not in cases(suite)


def test_fail_without_error_findings_still_fails_the_suite() -> None:
    suite = suite_of(verdict(status="fail", level="capture"))
    assert suite.get("failures") == "1"


_findings = st.lists(st.builds(
    Finding, kind=st.sampled_from(list(FindingKind)), severity=st.sampled_from(list(Severity)),
    message=st.text("abcdefgh <>&'\"", min_size=1, max_size=20), chunk=st.none() | st.integers(0, 3)), max_size=6)


@settings(max_examples=60, deadline=None)
@given(findings=_findings, level=st.sampled_from(["static", "capture", "outcome", "all"]))
def test_every_error_finding_is_in_a_failing_testcase(findings: list[Finding], level: str) -> None:
    errors = [f for f in findings if f.severity is Severity.ERROR]
    env = any(f.kind in (FindingKind.ENGINE_ERROR, FindingKind.TIMEOUT) for f in errors)
    status = "error" if env else ("fail" if errors else "pass")
    suite = suite_of(verdict(level=level, status=status, findings=tuple(findings)))
    bodies = [el.text or "" for c in suite.findall("testcase") for el in c if el.tag in ("failure", "error")]
    for f in errors:
        line = f"error   {f.kind.value}: {f.message}"
        assert sum(line in b.splitlines() for b in bodies) >= 1, line
    assert bool(bodies) == (status != "pass")
    assert props(suite)["verdict"] == status
    assert [props(suite)[f"finding.{n}"] for n in range(len(findings))] == [f"{f.kind.value}: {f.message}"
                                                                             for f in findings]


def test_write_junit_creates_parents(tmp_path: Path) -> None:
    out = write_junit(failing(), tmp_path / "reports" / "parity.xml")
    assert out.read_text(encoding="utf-8").startswith('<?xml version="1.0" encoding="utf-8"?>\n<testsuites')
    assert ET.parse(out).getroot().find("testsuite") is not None


def test_render_json_is_to_dict_and_strict_json() -> None:
    v = failing()
    assert json.loads(render_json(v)) == json.loads(json.dumps(v.to_dict()))
    assert render_json(v) == json.dumps(v.to_dict(), indent=2)
    nan = verdict(heatmap=Heatmap(["served 0"], ["embedding", "layer:0"], [[float("nan"), 0.5]]),
                  chunks=(ChunkReport(0, "layer:1", None, cosine=float("nan"), max_abs_err=float("inf")),))
    doc = json.loads(render_json(nan), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert doc["heatmap"]["values"] == [["nan", 0.5]]
    assert (doc["chunks"][0]["cosine"], doc["chunks"][0]["max_abs_err"]) == ("nan", "inf")


def test_the_outcome_testcase_fails_iff_an_error_is_on_the_outcome_check() -> None:
    """JUnit is a view of the verdict; an outcome finding never crashes it."""
    v = verdict(status="fail", served_layout=EXPECTED, findings=(
        Finding(FindingKind.ENGINE_ERROR, Severity.ERROR, "the outcome check could not run: fc_not_called",
                details={"check": "outcome", "cause": "deployment"}),))
    outcome = cases(suite_of(v))["outcome"].find("failure")
    assert outcome is not None and outcome.get("type") == "engine_error"
    healthy = verdict(status="pass", served_layout=EXPECTED,
                      outcome=OutcomeSummary((0.75,), (0.74,), 1.75, 1.74, None, "model_quality"))
    assert cases(suite_of(healthy))["outcome"].find("failure") is None  # no error finding: it passes
