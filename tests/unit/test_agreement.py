"""Static against capture (compare/agreement.py): a finding exactly when both are complete and differ."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from specparity.compare.agreement import static_capture_findings
from specparity.compare.findings import FindingKind, Severity

SOURCES = st.sampled_from(["embedding", *(f"layer:{i}" for i in range(6)), "final_norm"])


@given(static=st.lists(SOURCES, max_size=4), captured=st.lists(st.one_of(st.none(), SOURCES), max_size=4),
       engine=st.sampled_from(["sglang", "vllm"]))
def test_a_finding_iff_both_are_complete_and_differ(static: list[str], captured: list[str | None],
                                                    engine: str) -> None:
    found = static_capture_findings(static, captured, engine=engine, version="1.2.3", architecture="X")
    complete = len(static) == len(captured) and None not in captured
    assert bool(found) == (complete and static != captured)
    for f in found:
        assert (f.kind, f.severity, f.details["check"], f.details["engine"]) == (
            FindingKind.STATIC_CAPTURE_DISAGREEMENT, Severity.ERROR, "static", engine)
        assert f.details["chunks"] == [i for i, (s, c) in enumerate(zip(static, captured, strict=True)) if s != c]
        assert str(static) in f.message and str(captured) in f.message and "1.2.3" in f.message
