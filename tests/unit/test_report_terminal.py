"""Golden tests for the terminal report (house failure shape), built from hand-made Verdicts."""

from __future__ import annotations

import dataclasses
import io
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specparity.compare.findings import Finding, FindingKind, Severity
from specparity.report import render_text
from specparity.report.terminal import fmt_cosine, fmt_num, use_color
from specparity.verdict import ChunkReport, FixSuggestion, OutcomeSummary, Verdict

DRAFT = "fixtures/default/draft"
FIX = f"set eagle_config.eagle_aux_hidden_state_layer_ids = [1, 3, 5] in {DRAFT}/config.json"
EXPECTED = ("layer:1", "layer:3", "layer:5")


def verdict(**kw: object) -> Verdict:
    base: dict[str, object] = dict(
        contract_name="tiny-llama-eagle3", contract_hash="ab" * 32, level="all", status="pass",
        engine_version="0.5.23", target_architecture="LlamaForCausalLM", draft_path=DRAFT,
        expected_layout=EXPECTED, served_layout=EXPECTED,
    )
    base.update(kw)
    return Verdict(**base)  # type: ignore[arg-type]


def embedding_first_fail() -> Verdict:
    """Served [-1,1,3] (embedding, layer:1, layer:3) against a contract of layer:1, layer:3, layer:5."""
    return verdict(
        status="fail",
        served_layout=("embedding", "layer:1", "layer:3"),
        chunks=(
            ChunkReport(0, "layer:1", "embedding", cosine=0.02, max_abs_err=3.1, recorded="layer:1", min_passing_atol=3.1),
            ChunkReport(1, "layer:3", "layer:1", cosine=0.41, max_abs_err=1.7, recorded="layer:3", min_passing_atol=1.7),
            ChunkReport(2, "layer:5", "layer:3", cosine=0.38, max_abs_err=2.2, recorded="layer:5", min_passing_atol=2.2),
        ),
        findings=(
            Finding(FindingKind.EXTRA_EMBEDDING, Severity.ERROR,
                    "chunk 0 serves embedding, which the contract does not contain", chunk=0),
            Finding(FindingKind.MISSING_SOURCE, Severity.ERROR, "layer:5 is never served", fix=FIX),
            Finding(FindingKind.SPEC_CONFIG_REWRITTEN, Severity.WARNING,
                    "num_draft_tokens 16 is served as 4 (topk 1 forces steps + 1)"),
        ),
        fix=FixSuggestion(FIX, file=f"{DRAFT}/config.json", json_patch=(
            {"op": "replace", "path": "/eagle_config/eagle_aux_hidden_state_layer_ids", "value": [1, 3, 5]},)),
        resolved_spec_config={"requested": {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 16},
                              "resolved": {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}},
    )


def test_fail_golden() -> None:
    assert render_text(embedding_first_fail()).splitlines() == [
        "FAIL  fc input does not match contract 'tiny-llama-eagle3' (sglang 0.5.23, LlamaForCausalLM)",
        f"Fix: {FIX}",
        "Spec config: SGLang serves num_steps 3, eagle_topk 1, num_draft_tokens 4 (requested num_draft_tokens 16)",
        "chunk 0: served embedding      expected layer:1   cosine 0.02  max|d| 3.1",
        "chunk 1: served layer:1        expected layer:3   cosine 0.41  max|d| 1.7",
        "chunk 2: served layer:3        expected layer:5   cosine 0.38  max|d| 2.2",
        "error   extra_embedding: chunk 0 serves embedding, which the contract does not contain",
        "error   missing_source: layer:5 is never served",
        "warning spec_config_rewritten: num_draft_tokens 16 is served as 4 (topk 1 forces steps + 1)",
        "Note: chunk 0 would need atol >= 3.1 to pass, but it serves embedding instead of layer:1: "
        "fix the layout, not the tolerance",
        "Note: chunk 1 would need atol >= 1.7 to pass, but it serves layer:1 instead of layer:3: "
        "fix the layout, not the tolerance",
        "Note: chunk 2 would need atol >= 2.2 to pass, but it serves layer:3 instead of layer:5: "
        "fix the layout, not the tolerance",
        f"Note: a JSON patch for {DRAFT}/config.json is in the JSON and HTML reports (fix.json_patch)",
    ]


def test_pass_golden() -> None:
    v = verdict(
        chunks=tuple(ChunkReport(i, s, s, cosine=1.0, max_abs_err=0.0, recorded=s) for i, s in enumerate(EXPECTED)),
        probes=tuple({"index": i, "tokens": 32, "status": "pass", "max_abs_err": 0.0} for i in range(4)),
    )
    assert render_text(v) == (
        "PASS  fc input matches contract 'tiny-llama-eagle3' (sglang 0.5.23, LlamaForCausalLM): "
        "layer:1, layer:3, layer:5; 4 probes, max|d| 0.0\n"
    )


def test_static_pass_says_no_tensors_were_captured() -> None:
    assert render_text(verdict(level="static")) == (
        "PASS  fc input matches contract 'tiny-llama-eagle3' (sglang 0.5.23, LlamaForCausalLM): "
        "layer:1, layer:3, layer:5; static check only, no tensors captured\n"
    )


def test_pass_with_rewritten_spec_config_shows_resolved_settings_and_warning() -> None:
    v = verdict(
        level="static",
        findings=(Finding(FindingKind.SPEC_CONFIG_REWRITTEN, Severity.WARNING, "num_draft_tokens 8 is served as 4"),),
        resolved_spec_config={"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4},
    )
    assert render_text(v).splitlines()[1:] == [
        "Spec config: SGLang serves num_steps 3, eagle_topk 1, num_draft_tokens 4",
        "warning spec_config_rewritten: num_draft_tokens 8 is served as 4",
    ]


def test_error_golden_quotes_the_sglang_exception() -> None:
    v = verdict(
        status="error", served_layout=None,
        findings=(Finding(FindingKind.ENGINE_ERROR, Severity.ERROR,
                          "SGLang raised TypeError: unsupported operand type(s) for +: 'Tensor' and 'NoneType'",
                          fix="upgrade sglang to >= 0.5.22, or remove -1 from eagle_aux_hidden_state_layer_ids"),),
    )
    assert render_text(v).splitlines() == [
        "ERROR  could not check fc input against contract 'tiny-llama-eagle3' (sglang 0.5.23, LlamaForCausalLM) on this "
        "machine: SGLang failed",
        "Fix: upgrade sglang to >= 0.5.22, or remove -1 from eagle_aux_hidden_state_layer_ids",
        "error   engine_error: SGLang raised TypeError: unsupported operand type(s) for +: 'Tensor' and 'NoneType'",
    ]


def test_an_outcome_that_cannot_run_here_does_not_hide_a_matching_capture() -> None:
    """A live SGLang server on a CPU at --level all: the fc input was captured and matches; only the server's own
    acceptance could not be counted (exit 3). The headline says both."""
    refusal = Finding(FindingKind.ENGINE_ERROR, Severity.ERROR, "sglang 0.5.23 refuses the EAGLE decode step on this "
                      "CPU at mem_cache/allocation.py:746", details={"check": "outcome", "engine": "sglang"})
    chunks = tuple(ChunkReport(i, s, s, cosine=1.0, max_abs_err=0.0) for i, s in enumerate(EXPECTED))
    v = verdict(status="error", chunks=chunks, findings=(refusal,))
    assert render_text(v).splitlines()[0] == (
        "ERROR  fc input matches contract 'tiny-llama-eagle3' (sglang 0.5.23, LlamaForCausalLM): layer:1, layer:3, "
        "layer:5; the outcome could not be checked on this machine: SGLang failed")
    # without a capture, or with a capture-level error too, the headline stays the one for an unchecked fc input
    for other in (verdict(status="error", findings=(refusal,)), verdict(status="error", chunks=chunks, findings=(
            refusal, dataclasses.replace(refusal, details={"check": "capture"})))):
        assert render_text(other).startswith("ERROR  could not check fc input against")


def test_timeout_without_fix_points_at_debug_traceback() -> None:
    v = verdict(status="error", engine_version=None, target_architecture=None, served_layout=None,
                findings=(Finding(FindingKind.TIMEOUT, Severity.ERROR, "SGLang did not finish within 600 s"),))
    assert render_text(v).splitlines()[:2] == [
        "ERROR  could not check fc input against contract 'tiny-llama-eagle3' (serving engine unknown) on this machine: "
        "SGLang timed out",
        "Fix: nothing here says the deployment is wrong: run the check where SGLang can serve it (cause below)",
    ]


def test_non_layout_failure_says_deployment_and_uses_finding_fix() -> None:
    v = verdict(status="fail", findings=(
        Finding(FindingKind.VOCAB_MAP_MISMATCH, Severity.ERROR, "d2t hash differs from the contract",
                fix="ship the vocab_mapping.pt the drafter was trained with"),))
    assert render_text(v).splitlines() == [
        "FAIL  deployment does not match contract 'tiny-llama-eagle3' (sglang 0.5.23, LlamaForCausalLM)",
        "Fix: ship the vocab_mapping.pt the drafter was trained with",
        "error   vocab_map_mismatch: d2t hash differs from the contract",
    ]


def test_unknown_source_and_numeric_drift_notes() -> None:
    v = verdict(status="fail", chunks=(
        ChunkReport(0, "layer:1", None, cosine=0.5, max_abs_err=0.9),
        ChunkReport(1, "layer:3", "layer:3", cosine=0.9987, max_abs_err=0.07, min_passing_atol=0.07),
    ))
    lines = render_text(v).splitlines()
    assert lines[1] == "Fix: no automatic fix is known; see the findings below"
    assert lines[2:] == [
        "chunk 0: served unknown        expected layer:1   cosine 0.50  max|d| 0.9",
        "chunk 1: served layer:3        expected layer:3   cosine 0.9987  max|d| 0.07",
        "Note: chunk 0 matches no residual-stream boundary of the target; check norm flags "
        "(norm_before_fc, fc_norm) and the capture point",
        "Note: chunk 1 would have passed with atol >= 0.07",
    ]


def test_outcome_block_golden() -> None:
    v = dataclasses.replace(embedding_first_fail(), outcome=OutcomeSummary(
        recorded_acceptance=(0.75, 0.57, 0.45), served_acceptance=(0.04, 0.0, 0.0),
        recorded_acceptance_length=2.77, served_acceptance_length=1.04,
        expected_acceptance=(0.751, 0.567, 0.453), diagnosis="wiring"))
    lines = render_text(v).splitlines()
    start = lines.index(next(x for x in lines if x.startswith("Outcome:")))
    assert lines[start:start + 6] == [
        "Outcome: wiring; acceptance drops on the served fc input, so the serving path (not the model) is at fault",
        "  position        0      1      2",
        "  recorded     0.75   0.57   0.45",
        "  served       0.04   0.00   0.00",
        "  expected     0.75   0.57   0.45",
        "  acceptance length: recorded 2.77, served 1.04",
    ]
    assert lines[start - 1].startswith("warning spec_config_rewritten")


def test_color_only_adds_ansi_codes() -> None:
    v = embedding_first_fail()
    colored = render_text(v, color=True)
    assert "\x1b[1;31mFAIL\x1b[0m" in colored
    assert "\x1b[" not in render_text(v)
    assert re.sub(r"\x1b\[[0-9;]*m", "", colored) == render_text(v)


class _TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_use_color_only_on_a_terminal_without_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert use_color(_TTY()) and not use_color(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_color(_TTY())
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert not use_color(_TTY())


NUMBER_CASES = [(3.1, "3.1"), (0.02, "0.02"), (0.0, "0.0"), (1.23e-6, "1.2e-06"), (12.0, "12.0"),
                (None, "n/a"), (float("nan"), "nan")]


def test_number_formats() -> None:
    assert [fmt_num(v) for v, _ in NUMBER_CASES] == [s for _, s in NUMBER_CASES]
    assert [fmt_cosine(c) for c in (0.02, 0.989, 0.99, 1.0)] == ["0.02", "0.99", "0.9900", "1.0000"]


_kinds = st.sampled_from(list(FindingKind))
_sevs = st.sampled_from(list(Severity))
_findings = st.lists(
    st.builds(Finding, kind=_kinds, severity=_sevs,
              message=st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs", "Zl", "Zp")),
                              min_size=1, max_size=30),
              chunk=st.none() | st.integers(0, 5), fix=st.none() | st.text("abcxyz =[]", min_size=1, max_size=20)),
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(findings=_findings, n_chunks=st.integers(0, 6), status=st.sampled_from(["pass", "fail", "error"]))
def test_every_finding_and_every_chunk_is_rendered(findings: list[Finding], n_chunks: int, status: str) -> None:
    chunks = tuple(ChunkReport(i, f"layer:{i}", f"layer:{i + 1}", cosine=0.5, max_abs_err=1.0) for i in range(n_chunks))
    lines = render_text(verdict(status=status, findings=tuple(findings), chunks=chunks)).splitlines()
    finding_lines = [ln for ln in lines if re.match(r"^(error|warning|info) +[a-z0-9_]+: ", ln)]
    assert finding_lines == [f"{f.severity.value.ljust(7)} {f.kind.value}: {f.message}" for f in findings]
    chunk_lines = [ln for ln in lines if ln.startswith("chunk ") and ": served " in ln]
    assert len(chunk_lines) == (n_chunks if status != "pass" else 0)
    assert lines[0].split()[0] == status.upper()
    assert any(ln.startswith("Fix: ") for ln in lines[1:2]) == (status != "pass")


# --- drawn by rich ---------------------------------------------------------------------------------

def _long_line_fail() -> Verdict:
    long = "RuntimeError: " + "x" * 300  # longer than any terminal: never wrapped or cropped
    return dataclasses.replace(embedding_first_fail(), findings=(
        *embedding_first_fail().findings, Finding(FindingKind.ENGINE_ERROR, Severity.WARNING, long)))


def test_rich_lines_are_the_plain_lines_styled() -> None:
    from specparity.report.console import styled_lines
    from specparity.report.terminal import render_lines

    v = embedding_first_fail()
    texts = styled_lines(v)
    assert [t.plain for t in texts] == render_lines(v)
    styles = {(str(s.style), t.plain[s.start:s.end]) for t in texts for s in t.spans}
    assert ("bold red", "FAIL") in styles and ("bold", "Fix:") in styles
    assert ("bold red", "embedding") in styles  # chunk 0 serves the wrong source
    assert ("bold red", "error") in styles


def test_print_verdict_in_a_pipe_is_exactly_the_plain_text(monkeypatch: pytest.MonkeyPatch) -> None:
    from specparity.report.console import print_verdict

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    v = _long_line_fail()
    pipe = io.StringIO()
    print_verdict(v, pipe)
    assert pipe.getvalue() == render_text(v)  # CI logs: no ANSI, no wrapping at 80 columns
    tty = _TTY()
    print_verdict(v, tty)
    assert "\x1b[1;31mFAIL\x1b[0m" in tty.getvalue()
    assert re.sub(r"\x1b\[[0-9;]*m", "", tty.getvalue()) == render_text(v)
    monkeypatch.setenv("NO_COLOR", "1")
    plain_tty = _TTY()
    print_verdict(v, plain_tty)
    params = {p for codes in re.findall(r"\x1b\[([0-9;]*)m", plain_tty.getvalue()) for p in codes.split(";")}
    assert not params & {str(n) for n in (*range(30, 38), *range(90, 98))}  # bold stays; no colour (no-color.org)


@settings(max_examples=30, deadline=None)
@given(findings=_findings, status=st.sampled_from(["pass", "fail", "error"]))
def test_colour_never_changes_the_words(findings: list[Finding], status: str) -> None:
    v = verdict(status=status, findings=tuple(findings), chunks=embedding_first_fail().chunks)
    assert re.sub(r"\x1b\[[0-9;]*m", "", render_text(v, color=True)) == render_text(v)
