"""The server's own acceptance in the verdict (replay/server_acceptance.py): the four cases of capture x server, the
unmeasurable ones (exit 3 by name, never a pass), and the per-request figure rebuilt from vLLM's histograms."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from specparity.compare.findings import FindingKind, Severity, is_environmental, status_of
from specparity.intervals import wilson_interval
from specparity.replay.server_acceptance import BELOW, INCONCLUSIVE, INSIDE, UNMEASURED, band, judge, state_of
from specparity.serving.vllm.live import acceptance_window
from specparity.watch.band import FLOOR_RATIO

CONTRACT = [0.60, 0.37, 0.22]  # SmolLM2's drafter contract (contracts/smollm2-135m-eagle3.json), rounded


def loop(first: float, drafts: int = 400, *, other: int | None = 0, source: str = "server_counters") -> dict[str, Any]:
    accepted = [round(first * drafts), round(first * drafts / 2), round(first * drafts / 4)]
    return {"drafts": drafts, "accepted_per_position": accepted, "source": source, "other_requests": other}


def run(first: float, *, matches: bool, **kw: Any) -> tuple[dict[str, Any], list[Any]]:
    return judge(loop(first, **kw), reference=CONTRACT, reference_from="contract", capture_matches=matches,
                 replay_diagnosis="healthy" if matches else "wiring", engine="vLLM")


def test_the_band_is_watchs_floor_of_the_contract() -> None:
    assert band(CONTRACT) == [FLOOR_RATIO * x for x in CONTRACT]


def test_healthy_server_with_a_clean_capture_passes() -> None:
    # measured with watch on SmolLM2's vLLM server, held-out questions: 0.50 [0.45, 0.54] healthy
    judged, found = run(0.50, matches=True)
    assert found == [] and judged["state"] == INSIDE and judged["confirms"] == "healthy"


def test_the_seeds_wiring_is_confirmed_by_the_servers_own_acceptance() -> None:
    # the seed's wiring on the same server: 0.20 [0.17, 0.23]
    judged, found = run(0.20, matches=False)
    assert judged["state"] == BELOW and judged["confirms"] == "wiring"
    (f,) = found
    assert f.kind is FindingKind.SERVED_ACCEPTANCE_COLLAPSE and f.severity is Severity.ERROR
    assert not is_environmental(f) and status_of(found) == "fail"
    assert "confirms the wiring fault" in f.message and "20.0%" in f.message and "floor 36.0%" in f.message


def test_a_collapse_the_capture_cannot_explain_is_named_with_what_was_ruled_out() -> None:
    judged, found = run(0.15, matches=True)
    (f,) = found
    assert f.kind is FindingKind.SERVED_ACCEPTANCE_COLLAPSE and judged["confirms"] == "beyond_capture"
    for cause in ("draft weights", "sampling", "speculative setting", "tokenizer"):
        assert cause in f.message
    assert len(f.details["ruled_out"]) == 2 and status_of(found) == "fail"


def test_a_mismatched_capture_with_the_server_in_band_adds_nothing() -> None:
    # the capture's own findings fail it; the server's figure neither confirms nor clears the wiring
    judged, found = run(0.55, matches=False)
    assert found == [] and judged["state"] == INSIDE


def test_other_clients_requests_make_the_global_figure_unmeasured() -> None:
    judged, found = run(0.50, matches=True, other=3)
    (f,) = found
    assert f.kind is FindingKind.SERVER_ACCEPTANCE_UNMEASURED and is_environmental(f) and status_of(found) == "error"
    assert "served 3 other request(s) while the gate measured" in f.message
    assert judged["state"] == UNMEASURED and "per_position" not in judged  # never a mixed figure


def test_per_request_counts_are_immune_to_other_traffic() -> None:
    judged, found = run(0.50, matches=True, other=3, source="per_request")
    assert found == [] and judged["state"] == INSIDE


def test_no_drafts_and_no_reference_are_unmeasured_never_a_pass() -> None:
    for figures, reference in ((loop(0.5, drafts=0), CONTRACT), (loop(0.5), [])):
        judged, found = judge(figures, reference=reference, reference_from="contract", capture_matches=True,
                              replay_diagnosis="healthy", engine="vLLM")
        assert judged["state"] == UNMEASURED and status_of(found) == "error"


def test_a_thin_window_is_inconclusive_not_a_verdict() -> None:
    judged, found = run(0.30, matches=True, drafts=12)  # point under the floor, interval reaching it
    assert judged["state"] == INCONCLUSIVE and status_of(found) == "error"


@given(accepted=st.integers(0, 2000), drafts=st.integers(1, 2000), floor=st.floats(0.0, 1.0))
def test_the_state_follows_the_interval_for_every_count(accepted: int, drafts: int, floor: float) -> None:
    accepted = min(accepted, drafts)
    state = state_of(accepted, drafts, floor)
    high = wilson_interval(accepted, drafts)[1]
    if state == BELOW:
        assert high < floor  # never fires while the interval still reaches the floor
    elif state == INSIDE:
        assert accepted / drafts >= floor
    else:
        assert state == INCONCLUSIVE and accepted / drafts < floor <= high


@given(st.lists(st.lists(st.integers(0, 50), min_size=4, max_size=4), min_size=1, max_size=6))
def test_per_request_histograms_rebuild_vllms_per_position_counter(hists: list[list[int]]) -> None:
    """Position k is accepted in the verify steps that accepted more than k drafts (v1/spec_decode/metrics.py)."""
    answers = [{"acceptance_histogram": h, "num_draft_tokens": 3 * sum(h)} for h in hists]
    window = acceptance_window({"request_success": 99}, answers, sent=len(answers))
    total = [sum(h[j] for h in hists) for j in range(4)]
    c = window["counters"]
    assert window["acceptance_source"] == "per_request" and window["other_requests"] is None
    assert c["spec_decode_num_drafts"] == sum(total)
    assert c["spec_decode_num_accepted_tokens_per_pos"] == [total[1] + total[2] + total[3], total[2] + total[3],
                                                             total[3]]
    assert c["spec_decode_num_accepted_tokens"] == sum(j * total[j] for j in range(4))


def test_without_per_request_counts_the_window_counts_other_requests() -> None:
    assert acceptance_window({"request_success": 9}, [None, None], sent=6) == {
        "acceptance_source": "server_counters", "other_requests": 3}
    assert acceptance_window({"request_success": 6}, [{"acceptance_histogram": [1]}, None], sent=6)[
        "other_requests"] == 0


def test_launch_flags_for_vllm_name_every_switch_a_verdict_needs() -> None:
    """`specparity launch-flags --engine vllm` prints --enforce-eager (a compiled target hides its boundaries: exit 3
    without it), says where the per-request counts come from, and warns against --disable-log-stats."""
    import json
    import subprocess
    import sys

    out = json.loads(subprocess.run([sys.executable, "-m", "specparity.cli", "launch-flags", "--engine", "vllm", "--json"],
                                    capture_output=True, text=True, check=True).stdout)
    assert "--enforce-eager" in out["flags"] and "specparity.serving.vllm.tap.TapWorkerExtension" in out["flags"]
    notes = " ".join(out.get("notes") or [])
    assert "--per-request-spec-decode-metrics summary" in notes and "--disable-log-stats" in notes


def test_an_attached_static_level_resolved_here_says_so_and_warns_on_another_release() -> None:
    from pathlib import Path

    from tests.resolved_deployments import tiny_deployment

    from specparity.compare.findings import adapter_findings
    from specparity.serving.vllm.live import resolved_here

    dep = tiny_deployment(Path("fixtures/vllm"), engine="vllm", engine_version="0.32.0")
    same = resolved_here(dep, "0.32.0", "http://127.0.0.1:8000")
    assert [f.severity for f in adapter_findings(same)] == [Severity.INFO]
    assert "resolved on the gate's host by vllm 0.32.0" in adapter_findings(same)[0].message
    other = adapter_findings(resolved_here(dep, "0.34.0", "http://127.0.0.1:8000"))
    assert [f.severity for f in other] == [Severity.INFO, Severity.WARNING]
    assert "the server runs vllm 0.34.0, the gate resolved with vllm 0.32.0" in other[1].message
