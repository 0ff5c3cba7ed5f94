"""The served layout as one report line and as rows: engine, executor, TP/PP/DP/EP sizes, nodes, ranks reported.

Read from ``Verdict.layout`` (the engine's own resolution: vLLM's ``ParallelConfig`` and the ranks that answered
its ``collective_rpc``, serving/vllm/ranks.py; SGLang's server arguments, gate.served_layout_of). A rank expected
but absent is listed by name; the failure itself is the ``rank_missing`` finding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specparity.verdict import Verdict


def _ranks(values: Sequence[Any] | None) -> str:
    return ", ".join(str(v) for v in values) if values else "none"


def layout_rows(verdict: Verdict) -> list[tuple[str, str]]:
    """``(label, value)`` rows; empty when the verdict carries no layout (older reports, no engine run)."""
    lay: Mapping[str, Any] = verdict.layout
    if not lay:
        return []
    sizes = (f"TP={lay.get('tensor_parallel_size', 1)} PP={lay.get('pipeline_parallel_size', 1)} "
             f"DP={lay.get('data_parallel_size', 1)} EP={lay.get('expert_parallel_size', 1)}")
    expected = list(lay.get("ranks_expected") or [])
    reported = lay.get("ranks_reported")
    if lay.get("executor") == "in-process":
        # one process runs the capture (SGLang's in-process adapter): say so, never "0 of 0" (rank 0 of ranks [0])
        ranks = ("none: no capture ran in-process" if reported is None else
                 f"{len(reported)} of {len(expected)} (rank {_ranks(reported)}, in-process)")
    elif reported is None:
        ranks = f"none of {_ranks(expected)} (no rank started)"
    else:  # a count and the ids, never "0 of 0" (rank 0 of ranks [0])
        missing = [r for r in expected if r not in reported]
        ranks = (f"{len(reported)} of {len(expected)} (rank{'s' if len(reported) != 1 else ''} "
                 f"{_ranks(reported)})" + (f"; missing: {_ranks(missing)}" if missing else ""))
    rows = [("engine", str(lay.get("engine", verdict.engine))), ("executor", str(lay.get("executor", "?"))),
            ("sizes", sizes), ("nodes", "none reported" if lay.get("nodes") is None else str(lay["nodes"])),
            ("ranks reported", ranks)]
    per_rank = lay.get("ranks")
    if isinstance(per_rank, Mapping):
        for r, info in per_rank.items():
            if isinstance(info, Mapping):
                where = info.get("ray_node_id") or info.get("host")
                rows.append((f"rank {r}", f"tp {info.get('tp_rank', '?')}, pp {info.get('pp_rank', '?')}, {where} "
                                          f"pid {info.get('pid')}, fc calls {info.get('fc_calls')}"))
    return rows


def layout_line(verdict: Verdict) -> str | None:
    """``Layout: vllm (mp) TP=2 PP=1 DP=1 EP=1, 1 node, ranks reported 2 of 2 (ranks 0, 1)``, or None."""
    rows = dict(layout_rows(verdict))
    if not rows:
        return None
    nodes = rows["nodes"]
    nodes_text = "no node reported" if nodes == "none reported" else f"{nodes} node{'s' if nodes != '1' else ''}"
    return (f"Layout: {rows['engine']} ({rows['executor']}) {rows['sizes']}, {nodes_text}, "
            f"ranks reported {rows['ranks reported']}")
