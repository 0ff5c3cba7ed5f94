"""The served layout of a resolved deployment, for the report (report/layout.py renders it).

vLLM's child reports its own (``ResolvedDeployment.layout``: its ``ParallelConfig`` and the ranks that answered,
serving/vllm/ranks.py); SGLang's is read from its server arguments, its capture running in-process at rank 0.
"""

from __future__ import annotations

from typing import Any

from specparity.serving.results import ResolvedDeployment


def served_layout(engine: str, dep: ResolvedDeployment | None, *, captured: bool) -> dict[str, Any]:
    """The layout block: the engine's own (vLLM reports it per rank), or SGLang's sizes from its server arguments
    (its capture runs in-process: rank 0 is the one rank, and it reported when a capture ran)."""
    if dep is None:
        return {}
    if dep.layout:
        return dict(dep.layout)

    def size(key: str) -> int:
        return int(str(dep.server_args.get(key) or 1))

    tp, pp = size("tp_size"), size("pp_size")
    return {"engine": engine, "executor": "in-process", "tensor_parallel_size": tp, "pipeline_parallel_size": pp,
            "data_parallel_size": size("dp_size"), "expert_parallel_size": size("ep_size"),
            "ranks_expected": list(range(tp * pp)), "ranks_reported": [0] if captured else None,
            "nodes": 1 if captured else None, "ranks": None}
