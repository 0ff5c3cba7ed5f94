"""Every face tells the same story. For any verdict the gate can make (engine, level, finding
kinds, checks and causes, evidence present or missing), the terminal, JSON, HTML, JUnit and pytest faces agree on
the decision, and name the same engine and the same kinds."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

from hypothesis import given, settings
from hypothesis import strategies as st

from specparity.compare.findings import ENVIRONMENT_KINDS, Finding, FindingKind, Severity, engine_label
from specparity.report import render_html, render_json, render_junit, render_text
from specparity.report.items import item_report
from specparity.verdict import ChunkReport, Verdict, rules

VERSIONS = {"sglang": ("0.4.8", "0.5.10", "0.5.23"), "vllm": ("0.32.0", "0.33.0")}
CHECKS_OF_LEVEL = {"static": ("static",), "capture": ("static", "capture"),
                   "outcome": ("static", "capture", "outcome"), "all": ("static", "capture", "outcome")}
EXPECTED = ("layer:1", "layer:3", "layer:5")
EMITTED = [k for k in FindingKind if k is not FindingKind.SGLANG_ERROR]  # the legacy kind is read, never made
WORD = {"pass": "PASS", "fail": "FAIL", "error": "ERROR"}
# words that name no engine, so that any engine name in a report comes from the verdict itself
_TEXT = st.text(alphabet="abcdefhijkmnopqrtuwxyz ", min_size=1, max_size=20).map(str.strip).filter(bool)


@st.composite
def verdicts(draw: st.DrawFn) -> Verdict:
    engine = draw(st.sampled_from(sorted(VERSIONS)))
    level = draw(st.sampled_from(sorted(CHECKS_OF_LEVEL)))
    checks = (*CHECKS_OF_LEVEL[level], rules.ALL_CHECKS)
    findings = []
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(EMITTED))
        details: dict[str, object] = {"check": draw(st.sampled_from(checks))}
        if kind in ENVIRONMENT_KINDS:
            details.update(engine=engine, cause=draw(st.sampled_from(["deployment", "environment"])))
        severity = Severity.ERROR if kind in ENVIRONMENT_KINDS else draw(st.sampled_from(list(Severity)))
        findings.append(Finding(kind, severity, draw(_TEXT), details=details))
    captured = draw(st.booleans())  # missing evidence: nothing captured, or chunks with their numbers
    chunks = tuple(ChunkReport(i, s, s if captured else None, cosine=0.99 if captured else None,
                               max_abs_err=0.01 if captured else None) for i, s in enumerate(EXPECTED))
    return Verdict(contract_name="c", contract_hash="ab" * 32, level=level,  # type: ignore[arg-type]
                   status=rules.status_of(findings),  # type: ignore[arg-type]
                   engine_version=draw(st.sampled_from(VERSIONS[engine])), target_architecture="LlamaForCausalLM",
                   draft_path="d", expected_layout=EXPECTED, served_layout=EXPECTED if captured else None,
                   chunks=chunks, findings=tuple(findings), engine=engine)


class _Html(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.status: str | None = None
        self.kinds: list[str] = []
        self._in_code = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id") == "verdict":
            self.status = a.get("data-status")
        self._in_code = tag == "code"

    def handle_data(self, data: str) -> None:
        if self._in_code and data in {k.value for k in FindingKind}:
            self.kinds.append(data)
        self._in_code = False


def _other(engine: str) -> str:
    return next(e for e in VERSIONS if e != engine)


@settings(max_examples=80, deadline=None)
@given(v=verdicts())
def test_every_face_agrees_on_the_decision_the_engine_and_the_kinds(v: Verdict) -> None:
    kinds = [f.kind.value for f in v.findings]
    label, other = engine_label(v.engine), _other(v.engine)

    # terminal: the status word, the engine and its release, every finding by kind; no other engine named
    text = render_text(v)
    assert text.split()[0] == WORD[v.status]
    assert f"({v.engine} {v.engine_version}, LlamaForCausalLM)" in text.splitlines()[0]
    assert [k for k in kinds if f" {k}: " in text] == kinds
    assert other not in text.lower(), text
    if not any(c.captured for c in v.chunks):
        assert "residual-stream boundary" not in text
    if v.status == "error":
        assert f"on this machine: {label}" in text.splitlines()[0]

    # JSON: the same decision, engine and kinds
    doc = json.loads(render_json(v))
    assert (doc["verdict"], doc["engine"], doc["engine_version"]) == (v.status, v.engine, v.engine_version)
    assert doc["sglang_version"] == doc["engine_version"]  # the deprecated alias, whichever engine (until 0.2.0)
    assert [f["kind"] for f in doc["findings"]] == kinds

    # HTML: the banner's status, every finding's kind, the engine in the environment table; no other engine
    page = render_html(v)
    parsed = _Html()
    parsed.feed(page)
    assert parsed.status == v.status and parsed.kinds == kinds
    assert other not in re.sub(r"<style.*?</style>", "", page, flags=re.S).lower()

    # JUnit: failing testcases iff the verdict fails, every error finding in one of them, the engine-wide case
    # named after the verdict's engine, the engine in the properties
    suite = ET.fromstring(render_junit(v)).find("testsuite")
    assert suite is not None
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert (props["verdict"], props["engine"], props["engine_version"]) == (v.status, v.engine, v.engine_version)
    failed = [(c.get("name"), el) for c in suite.findall("testcase") for el in c if el.tag in ("failure", "error")]
    assert bool(failed) == (v.status != "pass")
    assert {n for n, _ in failed} <= {v.engine, "static", "capture", "outcome", "verdict"}
    bodies = "\n".join(el.text or "" for _, el in failed)
    for f in v.errors:
        assert f"error   {f.kind.value}: {f.message}" in bodies.splitlines()
    assert other not in bodies.lower()

    # pytest: an item fails iff an error is on its check; some item fails iff the verdict does not pass
    reports = {check: item_report(v, check) for check in CHECKS_OF_LEVEL[v.level]}
    assert any(r is not None for r in reports.values()) == (v.status != "pass")
    for check, report in reports.items():
        assert (report is not None) == bool(rules.item_findings(v.findings, check))
        if report is not None:
            assert report.splitlines()[0] == text.splitlines()[0]  # the same summary line as the terminal
            assert other not in report.lower()
    assert v.exit_code == {"pass": 0, "fail": 1, "error": 3}[v.status]
