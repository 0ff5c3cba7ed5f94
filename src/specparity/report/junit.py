"""The JUnit XML report: one ``specparity`` testsuite, one testcase per check.

Testcases: ``static`` (what SGLang resolved, no tensors), ``capture`` (the fc-input layout over all
probes), ``capture[probe <i>]`` (one per probe sample), ``outcome`` (drafter acceptance) and, when
the environment failed, ``sglang`` as an ``<error>``. Every finding is also a ``finding.<n>``
property (``"kind: message"``), so a CI summary shows all of them, and every error finding appears
in the body of a failing testcase. Failure bodies are the house-style text report lines.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from specparity.compare.findings import ENVIRONMENT_KINDS, Finding, FindingKind, engine_label
from specparity.report.layout import layout_rows
from specparity.report.terminal import (
    chunk_lines,
    finding_lines,
    fix_text,
    fmt_num,
    outcome_lines,
    spec_config_line,
    summary_line,
)
from specparity.verdict import Verdict

SUITE_NAME = "specparity"

# Findings that only a tensor capture can produce; everything else (layout read from SGLang's
# resolved capture list, config and vocab checks) belongs to the static check.
CAPTURE_KINDS = frozenset(
    {
        FindingKind.NORM_MISMATCH,
        FindingKind.POSITION_SHIFT,
        FindingKind.NONFINITE,
        FindingKind.NUMERIC_DRIFT,
        FindingKind.FC_NOT_CALLED,
        FindingKind.RANK_MISSING,
        FindingKind.CAPTURE_COUNT_SHORT,
    }
)

_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _clean(text: str) -> str:
    """XML 1.0 cannot carry most control characters (SGLang exceptions may hold ANSI escapes)."""
    return _XML_ILLEGAL.sub("?", text)


def check_of(finding: Finding, verdict: Verdict) -> str:
    """Which testcase a finding belongs to: ``engine`` (every check: the testcase is named after the verdict's
    engine), ``static``, ``capture`` or ``outcome``.

    The gate tags each finding with the check that produced it (``details["check"]``; ``sglang`` in reports
    written before ``engine``); findings built elsewhere fall back to a guess from their kind.
    """
    check = finding.details.get("check")
    if check in ("static", "capture", "outcome"):
        return str(check)
    if check in ("engine", "sglang") or finding.kind in ENVIRONMENT_KINDS:
        return "engine"
    if verdict.level == "static":
        return "static"
    if finding.kind in CAPTURE_KINDS or finding.chunk is not None:
        return "capture"
    return "static"


def _case(suite: ET.Element, name: str, *, verdict: Verdict, time: float = 0.0) -> ET.Element:
    return ET.SubElement(suite, "testcase", {"classname": f"{SUITE_NAME}.{verdict.contract_name}", "name": name,
                                             "time": f"{time:.3f}"})


def _fail(case: ET.Element, tag: str, *, message: str, kind: str, lines: list[str]) -> None:
    el = ET.SubElement(case, tag, {"message": _clean(message), "type": kind})
    el.text = _clean("\n".join(lines) + "\n")


def _header(verdict: Verdict) -> list[str]:
    lines = [summary_line(verdict)]
    if verdict.status != "pass":
        lines.append(f"Fix: {fix_text(verdict)}")
    return lines


def build_junit(verdict: Verdict) -> ET.Element:
    """The ``<testsuites>`` element for ``verdict``."""
    timings = dict(verdict.timings)
    # the run's wall time: "total" when the gate measured it (its phases are parts of it, never added to it)
    total = timings["total"] if "total" in timings else sum(v for v in timings.values() if v == v)
    total = total if total == total else 0.0
    root = ET.Element("testsuites", {"name": SUITE_NAME})
    suite = ET.SubElement(root, "testsuite", {"name": SUITE_NAME})
    props = ET.SubElement(suite, "properties")
    prop_values: list[tuple[str, str]] = [
        ("verdict", verdict.status),
        ("contract", verdict.contract_name),
        ("contract_hash", verdict.contract_hash or ""),
        ("level", verdict.level),
        ("sglang_version", verdict.engine_version or ""),  # engine_version's deprecated alias, removed in 0.2.0
        ("engine", verdict.engine),
        ("engine_version", verdict.engine_version or ""),
        ("target_architecture", verdict.target_architecture or ""),
        ("expected_layout", ", ".join(verdict.expected_layout)),
    ]
    if verdict.served_layout is not None:
        prop_values.append(("served_layout", ", ".join(s or "unknown" for s in verdict.served_layout)))
    prop_values += [(f"layout.{k.replace(' ', '_')}", v) for k, v in layout_rows(verdict)]
    prop_values += [(f"finding.{n}", f"{f.kind.value}: {f.message}") for n, f in enumerate(verdict.findings)]
    for name, value in prop_values:
        ET.SubElement(props, "property", {"name": name, "value": _clean(value)})

    by_check: dict[str, list[Finding]] = {"engine": [], "static": [], "capture": [], "outcome": []}
    for f in verdict.findings:
        by_check[check_of(f, verdict)].append(f)

    if verdict.status == "error" or any(f.is_failure for f in by_check["engine"]):
        case = _case(suite, verdict.engine, verdict=verdict)
        env = by_check["engine"]
        _fail(case, "error", message=env[0].message if env else f"{engine_label(verdict.engine)} could not run the check",
              kind=env[0].kind.value if env else FindingKind.ENGINE_ERROR.value,
              lines=_header(verdict) + finding_lines(verdict.findings))

    static_errors = [f for f in by_check["static"] if f.is_failure]
    if verdict.level in ("static", "all") or by_check["static"]:
        case = _case(suite, "static", verdict=verdict, time=timings.get("static", 0.0))
        if static_errors:
            lines = _header(verdict)
            if verdict.resolved_spec_config is not None:
                lines.append(spec_config_line(verdict.resolved_spec_config))
            if verdict.level == "static":
                lines += chunk_lines(verdict.chunks)
            _fail(case, "failure", message=static_errors[0].message, kind=static_errors[0].kind.value,
                  lines=lines + finding_lines(by_check["static"]))

    if verdict.status != "error" and (verdict.level != "static" or by_check["capture"]):
        capture_errors = [f for f in by_check["capture"] if f.is_failure]
        case = _case(suite, "capture", verdict=verdict, time=timings.get("capture", 0.0))
        if capture_errors:
            _fail(case, "failure", message=capture_errors[0].message, kind=capture_errors[0].kind.value,
                  lines=_header(verdict) + chunk_lines(verdict.chunks) + finding_lines(by_check["capture"]))
        for n, probe in enumerate(verdict.probes):
            index = probe.get("index", n)
            case = _case(suite, f"capture[probe {index}]", verdict=verdict)
            status = str(probe.get("status", "pass"))
            if status != "pass":
                err = probe.get("max_abs_err")
                detail = f"probe {index} ({probe.get('tokens', '?')} tokens): {status}"
                if isinstance(err, int | float):
                    detail += f", max|d| {fmt_num(float(err))}"
                _fail(case, "failure", message=detail, kind=status, lines=[detail, "the fc-input layout over all probes is in testcase 'capture'"])

    if verdict.outcome is not None or by_check["outcome"]:
        # fails iff the verdict puts an error on the outcome check (every face is a view of one decision)
        case = _case(suite, "outcome", verdict=verdict, time=timings.get("outcome", 0.0))
        outcome_errors = [f for f in by_check["outcome"] if f.is_failure]
        if outcome_errors:
            lines = outcome_lines(verdict.outcome) if verdict.outcome is not None else []
            _fail(case, "failure", message=outcome_errors[0].message, kind=outcome_errors[0].kind.value,
                  lines=_header(verdict) + lines + finding_lines(by_check["outcome"]))

    if verdict.status == "fail" and not any(c.find("failure") is not None for c in suite.findall("testcase")):
        # A failing verdict must never read as a green suite, whatever check produced it.
        case = _case(suite, "verdict", verdict=verdict)
        _fail(case, "failure", message=summary_line(verdict), kind="fail",
              lines=_header(verdict) + chunk_lines(verdict.chunks) + finding_lines(verdict.findings))

    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(1 for c in cases if c.find("failure") is not None)))
    suite.set("errors", str(sum(1 for c in cases if c.find("error") is not None)))
    suite.set("skipped", "0")
    suite.set("time", f"{total:.3f}")
    return root


def render_junit(verdict: Verdict) -> str:
    """The JUnit XML document as text (UTF-8, with an XML declaration)."""
    root = build_junit(verdict)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(verdict: Verdict, path: str | Path) -> Path:
    """Write the JUnit XML report to ``path`` (parents created, the file whole or not at all: report/writing.py)
    and return the path."""
    from specparity.report.writing import ReportFile, write_files

    return write_files([ReportFile("JUnit report", Path(path), render_junit(verdict))])[0]
