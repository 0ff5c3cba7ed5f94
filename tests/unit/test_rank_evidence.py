"""Per-rank evidence and the layout block (serving/vllm/ranks.py, report/layout.py).

The judging is engine-neutral, so it is held here for every world and every subset of ranks that answer; the real
engine's replies (vLLM's collective_rpc at TP=1, TP=2, the Ray executor) are in tests/vllm_engine.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from specparity.compare.findings import FindingKind
from specparity.report import render_text
from specparity.report.junit import render_junit
from specparity.report.layout import layout_line, layout_rows
from specparity.serving.results import ServingFailure
from specparity.serving.vllm.ranks import RPC, RankEvidence, layout, rank_failures
from specparity.verdict import Verdict, rules, verdict_from_dict


class _Workers:
    """What ``LLM.collective_rpc(RPC)`` returns: one reply per rank that answers, each with its pending calls."""

    def __init__(self, ranks: list[int], *, tp: int, tapped: bool = True) -> None:
        self.ranks, self.tp, self.tapped = ranks, tp, tapped
        self.pending: dict[int, list[bytes]] = {r: [] for r in ranks}
        self.names: list[str] = []

    def collective_rpc(self, method: str) -> list[dict[str, Any]]:
        self.names.append(method)
        out = []
        for r in self.ranks:
            meta = {"rank": r, "drafter": "EagleProposer", "fc": {"in_features": 192}} if self.tapped else None
            out.append({"rank": r, "tp_rank": r % self.tp, "pp_rank": r // self.tp, "host": "h", "pid": 100 + r,
                        "ray_node_id": f"node{r % 2}", "meta": meta, "calls": self.pending[r]})
            self.pending[r] = []
        return out


def _served(workers: _Workers, probes: int) -> RankEvidence:
    ev = RankEvidence(workers)
    ev.discard()
    for i in range(probes):
        for r in workers.ranks:
            workers.pending[r] = [b"prefill-%d" % i, b"verify"]
        ev.end_probe()
    return ev


@given(tp=st.integers(1, 4), pp=st.integers(1, 2), data=st.data())
def test_every_rank_that_did_not_report_is_rank_missing_and_a_whole_world_passes(tp: int, pp: int,
                                                                                 data: st.DataObject) -> None:
    world = tp * pp
    answering = sorted(data.draw(st.sets(st.integers(0, world - 1), max_size=world)))
    ev = _served(_Workers(answering, tp=tp), probes=2)
    failures = rank_failures(ev, world_size=world, pp=pp)
    missing = [r for r in range(world) if r not in answering]
    assert [f.kind for f in failures] == ["rank_missing"] * len(missing)
    assert [int(f.message.split()[1]) for f in failures] == missing
    if not missing:
        assert failures == []


def test_the_gate_asks_by_method_name_and_drops_what_start_up_saw() -> None:
    w = _Workers([0, 1], tp=2)
    w.pending[0] = [b"warm-up"]
    ev = _served(w, probes=1)
    assert set(w.names) == {RPC}  # a name: vLLM's front end refuses to serialise a function
    assert ev.calls(0, 0) == [b"prefill-0", b"verify"] and ev.probes == 1


def test_a_drafter_rank_with_no_fc_call_in_a_probe_is_fc_not_called() -> None:
    w = _Workers([0, 1], tp=2)
    ev = RankEvidence(w)
    ev.discard()
    w.pending[0] = [b"prefill"]  # rank 1 saw nothing
    ev.end_probe()
    [f] = rank_failures(ev, world_size=2, pp=1)
    assert (f.kind, f.sample) == ("fc_not_called", 0) and f.message.startswith("rank 1:")


def test_a_rank_without_the_tap_is_rank_missing_naming_the_entry_point() -> None:
    ev = _served(_Workers([0], tp=1, tapped=False), probes=1)
    [f] = rank_failures(ev, world_size=1, pp=1)
    assert f.kind == "rank_missing" and "vllm.general_plugins" in f.message


def test_rank_missing_is_its_own_kind_and_exit_1() -> None:
    [f] = rules.serving_findings([ServingFailure("rank_missing", "rank 1 of 2 never reported")], engine="vllm")
    assert f.kind is FindingKind.RANK_MISSING and f.kind.value == "rank_missing"
    assert rules.status_of([f]) == "fail" and f.details["cause"] == "deployment"


def _pc(**kw: Any) -> SimpleNamespace:
    base = {"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "data_parallel_size": 1,
            "enable_expert_parallel": False, "world_size": 2, "distributed_executor_backend": "ray"}
    return SimpleNamespace(**(base | kw))


def _verdict(lay: dict[str, Any]) -> Verdict:
    return Verdict(contract_name="c", contract_hash=None, level="capture", status="pass", engine_version="0.32.0",
                   target_architecture="LlamaForCausalLM", draft_path="d", expected_layout=["layer:1"],
                   served_layout=["layer:1"], engine="vllm", layout=lay)


def test_the_layout_names_sizes_nodes_and_ranks_in_every_report() -> None:
    ev = _served(_Workers([0, 1], tp=2), probes=1)
    lay = layout(_pc(enable_expert_parallel=True), ev)
    assert (lay["expert_parallel_size"], lay["nodes"], lay["ranks_reported"]) == (2, 2, [0, 1])
    assert lay["ranks"]["1"]["fc_calls"] == 2 and lay["ranks"]["1"]["ray_node_id"] == "node1"
    v = _verdict(lay)
    assert layout_line(v) == "Layout: vllm (ray) TP=2 PP=1 DP=1 EP=2, 2 nodes, ranks reported 2 of 2 (ranks 0, 1)"
    assert layout_line(v) in render_text(v)
    assert 'name="layout.sizes" value="TP=2 PP=1 DP=1 EP=2"' in render_junit(v)
    again = verdict_from_dict(json.loads(json.dumps(v.to_dict())))
    assert again.layout == v.layout
    older = {k: x for k, x in v.to_dict().items() if k != "engine_version"}  # a report from before engine_version
    assert verdict_from_dict(older).engine_version == v.engine_version == "0.32.0"


def test_a_missing_rank_is_named_in_the_layout_and_no_layout_is_no_line() -> None:
    ev = _served(_Workers([0], tp=2), probes=1)
    rows = dict(layout_rows(_verdict(layout(_pc(world_size=2), ev))))
    assert rows["ranks reported"] == "1 of 2 (rank 0); missing: 1"
    assert "none of 0, 1 (no rank started)" in str(layout_line(_verdict(layout(_pc(), None))))
    assert layout_line(_verdict({})) is None and "Layout:" not in render_text(_verdict({}))


def test_sglangs_layout_is_its_server_arguments_with_rank_0_reporting_when_a_capture_ran() -> None:
    from test_explain_unit import (
        dep,  # the unit tests' ResolvedDeployment builder (tests/unit is on the path)
    )

    from specparity.serving.layout import served_layout

    lay = served_layout("sglang", dep(server_args={"tp_size": 1, "ep_size": 1}), captured=True)
    assert (lay["executor"], lay["tensor_parallel_size"], lay["ranks_expected"], lay["ranks_reported"]) == (
        "in-process", 1, [0], [0])
    assert served_layout("sglang", dep(), captured=False)["ranks_reported"] is None
    assert served_layout("sglang", None, captured=False) == {}
    vllm_own = {"engine": "vllm", "ranks_reported": [0, 1]}
    assert served_layout("vllm", dep(layout=vllm_own), captured=True) == vllm_own
