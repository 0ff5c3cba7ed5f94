"""Per-rank evidence from vLLM's workers, gathered through vLLM's own channel, and the layout it proves.

:class:`RankEvidence` calls the tap's :func:`~specparity.serving.vllm.tap.drain` in every worker with
``LLM.collective_rpc`` (``vllm/entrypoints/llm.py:574``; each executor implements it: in-process
``uniproc_executor.py:90``, multiprocessing ``multiproc_executor.py:382``, Ray ``ray_executor.py:486``), once after
start-up and once after each probe. Nothing is read from a file, so a rank on another node reports like a local
one. :func:`rank_failures` turns a rank that should have reported and did not into ``rank_missing`` (exit 1: never
a pass on partial evidence), and :func:`layout` says what was served: engine, executor, TP/PP/DP/EP sizes, nodes
and which ranks reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specparity.serving.results import FC_NOT_CALLED, RANK_MISSING, ServingFailure
from specparity.serving.vllm.tap_wire import EXPECT, RPC  # the worker methods the gate calls by name


class TapMissing(RuntimeError):
    """A worker cannot answer the tap's RPC at all: its rank's evidence is missing."""


_IDENTITY = ("rank", "tp_rank", "pp_rank", "host", "pid", "ray_node_id")


@dataclass
class RankEvidence:
    """What each rank reported: its identity and tap meta (latest reply) and its fc calls, probe by probe."""

    llm: Any
    identity: dict[int, dict[str, Any]] = field(default_factory=dict)
    per_probe: dict[int, list[list[bytes]]] = field(default_factory=dict)
    probes: int = 0
    # ranks whose tap disarmed itself since it was armed, and why (serving/vllm/tap.py: overflow, lease)
    disarmed: dict[int, dict[str, Any]] = field(default_factory=dict)

    def _drain(self) -> dict[int, list[bytes]]:
        out: dict[int, list[bytes]] = {}
        try:
            replies = self.llm.collective_rpc(RPC)
        except Exception as exc:  # a worker without the plugin has no such method: its evidence cannot come
            if RPC not in str(exc):
                raise
            raise TapMissing(f"a worker has no {RPC} method (the specparity vllm.general_plugins entry point is not "
                             f"installed in its environment), so its rank cannot report: {exc}") from exc
        for reply in replies:
            rank = int(reply["rank"])
            self.identity[rank] = {k: v for k, v in reply.items() if k != "calls"}
            out[rank] = [bytes(b) for b in reply.get("calls") or ()]
            if isinstance(reply.get("disarmed"), dict):
                self.disarmed[rank] = dict(reply["disarmed"])
        return out

    def discard(self) -> None:
        """Drop what the workers saw so far (start-up warm-up, or calls that are not a probe's)."""
        self._drain()

    def end_probe(self) -> None:
        """Record every rank's fc calls since the last drain as the next probe's."""
        calls = self._drain()
        for rank in set(calls) | set(self.per_probe):
            self.per_probe.setdefault(rank, [[] for _ in range(self.probes)]).append(calls.get(rank, []))
        self.probes += 1

    def expect(self, recorded: Any, *, expected: list[str], rtol: dict[str, list[float]],
               ids: Any = None) -> None:
        """Tell every rank the next probe's recorded fc input, token ids (``ids``: how the tap finds its rows in a
        batch shared with other requests), sources and rtol table (the tap's reduced evidence:
        serving/vllm/tap_reduce.py); the lead is the first rank holding the drafter's fc."""
        from specparity.serving.vllm.tap_reduce import expect_kwargs

        fc = self.fc_ranks()
        self.llm.collective_rpc(EXPECT, kwargs=expect_kwargs(recorded, expected=expected, rtol=rtol,
                                                             lead=fc[0] if fc else 0, ids=ids))

    def meta(self, rank: int) -> dict[str, Any] | None:
        m = self.identity.get(rank, {}).get("meta")
        return m if isinstance(m, dict) else None

    def fc_ranks(self) -> list[int]:
        """Ranks whose tap found the drafter's fc (under PP only the last stage builds the drafter)."""
        return sorted(r for r in self.identity if (self.meta(r) or {}).get("fc"))

    def calls(self, rank: int, probe: int) -> list[bytes]:
        rows = self.per_probe.get(rank, [])
        return rows[probe] if probe < len(rows) else []


def expected_fc_ranks(evidence: RankEvidence, pp: int) -> list[int]:
    """The ranks that must hold the drafter: every rank of the last pipeline stage (vLLM builds the drafter only
    there: ``gpu_model_runner.py``, ``get_pp_group().is_last_rank``)."""
    return sorted(r for r, ident in evidence.identity.items() if int(ident.get("pp_rank", 0) or 0) == pp - 1)


def rank_failures(evidence: RankEvidence, *, world_size: int, pp: int) -> list[ServingFailure]:
    """``rank_missing`` for each rank of the world that never answered, or answered without the tap (or without the
    drafter's fc where its stage holds one); ``fc_not_called`` for a drafter rank that saw no fc call in a probe."""
    out: list[ServingFailure] = []
    for r in range(world_size):
        ident = evidence.identity.get(r)
        if ident is None:
            out.append(ServingFailure(RANK_MISSING, f"rank {r} of {world_size} never reported through vLLM's "
                                      "collective_rpc: its evidence is missing, so the fc input cannot be compared "
                                      "whole"))
        elif ident.get("meta") is None:
            out.append(ServingFailure(RANK_MISSING, f"rank {r} of {world_size} (host {ident.get('host')}, pid "
                                      f"{ident.get('pid')}) reported without the specparity tap: the "
                                      "vllm.general_plugins entry point is not installed in its environment"))
    if out:
        return out
    have = set(evidence.fc_ranks())
    for r in expected_fc_ranks(evidence, pp):
        if r not in have and have:
            out.append(ServingFailure(RANK_MISSING, f"rank {r} of {world_size} is on the last pipeline stage but "
                                      "reported no drafter fc, while ranks " + ", ".join(map(str, sorted(have)))
                                      + " did"))
    for r in sorted(have):
        for i in range(evidence.probes):
            if not evidence.calls(r, i):
                out.append(ServingFailure(FC_NOT_CALLED, f"rank {r}: the drafter's fc was never called while vLLM "
                                          "generated this probe", sample=i))
                break
    return out


def layout(parallel_config: Any, evidence: RankEvidence | None) -> dict[str, Any]:
    """The served layout as vLLM resolved it (``ParallelConfig``), and which ranks reported (None: not run)."""
    pc = parallel_config
    tp, pp = int(pc.tensor_parallel_size), int(pc.pipeline_parallel_size)
    dp = int(getattr(pc, "data_parallel_size", 1) or 1)
    ep = bool(getattr(pc, "enable_expert_parallel", False))
    world = int(getattr(pc, "world_size", tp * pp) or tp * pp)
    out: dict[str, Any] = {
        "engine": "vllm", "executor": str(getattr(pc, "distributed_executor_backend", None) or "uni"),
        "tensor_parallel_size": tp, "pipeline_parallel_size": pp, "data_parallel_size": dp,
        # vLLM's expert-parallel group spans TP x DP when enabled (config/parallel.py)
        "expert_parallel_size": tp * dp if ep else 1,
        "ranks_expected": list(range(world)),
        "ranks_reported": None, "nodes": None, "ranks": None,
    }
    if evidence is not None:
        out["ranks_reported"] = sorted(evidence.identity)
        out["nodes"] = len({str(i.get("ray_node_id") or i.get("host")) for i in evidence.identity.values()})
        out["ranks"] = {str(r): {**{k: i.get(k) for k in _IDENTITY if k != "rank"},
                                 "drafter": (evidence.meta(r) or {}).get("drafter"),
                                 "fc_calls": sum(len(c) for c in evidence.per_probe.get(r, []))}
                        for r, i in sorted(evidence.identity.items())}
    return out
