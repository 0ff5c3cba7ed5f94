"""The tap's evidence, every rank's, turned into one :class:`CaptureResult`: wherever vLLM ran (``vllm.LLM`` in the
gate's child, ``serving/vllm/worker.py``; or a server, ``serving/vllm/live.py``), the same rules judge it.

Per probe, the first drafter rank's prefill fc rows (the fc calls from the probe's start until their rows cover the
probe: one call, or one per chunk where vLLM chunks the prefill) and the target's boundaries recorded with its first
call; every other drafter rank must agree; a verify step's NaN/Inf is a failure too; and a rank that should have
reported and did not is ``rank_missing`` (never a pass on partial evidence).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from specparity.serving.results import (
    CAPTURE_SHAPE,
    FC_NOT_CALLED,
    HOOKS_MISSING,
    CaptureResult,
    FcCapture,
    LayerAtlas,
    ResolvedDeployment,
    ServingFailure,
)
from specparity.serving.vllm.ranks import RankEvidence, layout, rank_failures
from specparity.serving.vllm.tap_reduce import DIGEST_KEY, fc_digest, read_blob

if TYPE_CHECKING:
    from specparity.compare.reduced import ReducedSample


def prefill_rows(blobs: Sequence[bytes], n: int) -> tuple[Any, dict[str, Any], int]:
    """(fc rows of the prefill, the first call's tensors, calls used): leading fc calls until they hold ``n`` rows."""
    import torch
    from safetensors.torch import load

    first = load(blobs[0])
    parts, rows, used = [first["fc"]], int(first["fc"].shape[0]), 1
    while rows < n and used < len(blobs):
        nxt = load(blobs[used])["fc"]
        if rows + int(nxt.shape[0]) > n:
            break
        parts.append(nxt)
        rows += int(nxt.shape[0])
        used += 1
    return (parts[0] if len(parts) == 1 else torch.cat(parts)), first, used


def assemble_capture(dep: ResolvedDeployment, evidence: RankEvidence, probes: Sequence[Sequence[int]], *,
                     atlas: bool, loop: dict[str, Any], failures: Sequence[ServingFailure] = ()) -> CaptureResult:
    """The capture from every rank's evidence (``dep`` as vLLM resolved it; ``loop`` the serving loop's facts)."""
    import torch

    from specparity.compare.reduced import from_tensors
    from specparity.serving.worker_common import nonfinite_failures
    from specparity.sources import FINAL_NORM, boundary_to_source

    expected = list((dep.layout or {}).get("ranks_expected") or [0])
    pp = int((dep.layout or {}).get("pipeline_parallel_size") or 1)
    served = {**dep.layout, **_reported(dep.layout, evidence)}
    fc_ranks = evidence.fc_ranks()
    fc_meta = (evidence.meta(fc_ranks[0]) or {}).get("fc") if fc_ranks else None
    if fc_meta is not None:
        dep = replace(dep, fc_in_features=int(fc_meta["in_features"]), fc_out_features=int(fc_meta["out_features"]),
                      fc_bias=bool(fc_meta["bias"]), fc_source="vllm_module")
    dep = replace(dep, layout=served)
    loop = {**loop, "ranks": served.get("ranks")}
    out = list(failures) + rank_failures(evidence, world_size=len(expected), pp=pp)
    if out:
        return CaptureResult(dep, None, None, tuple(out), loop=loop)
    if fc_meta is None:
        metas = [evidence.meta(r) or {} for r in evidence.identity]
        why = ("vLLM built no drafter: speculative decoding is off" if not any(m.get("drafter") for m in metas)
               else "the drafter has no fc module (use_aux_hidden_state is off)")
        return CaptureResult(dep, None, None, (ServingFailure(FC_NOT_CALLED, f"{why}; no fc input was captured"),),
                             loop=loop)
    lead = fc_ranks[0]
    fc_rows: list[torch.Tensor] = []
    samples: list[dict[str, torch.Tensor]] = []
    reduced: list[ReducedSample | None] = []
    rank_diff, verify_bad, verify_calls, disagree = 0.0, [], [], set()
    for i, ids in enumerate(probes):
        first, meta = read_blob(evidence.calls(lead, i)[0])
        red = from_tensors(first, meta)
        if "fc" not in first:  # the tap's reduced mode, without the probe it expected: nothing to compare
            out.append(ServingFailure(HOOKS_MISSING, f"rank {lead} sent no fc input for the probe's prefill (the "
                                      "tap was not told which probe to expect)", sample=i))
            return CaptureResult(dep, None, None, tuple(out), loop=loop)
        if red is not None:
            fc, used = first["fc"], 1
        else:
            fc, _, used = prefill_rows(evidence.calls(lead, i), len(ids))
        if fc.shape[0] != len(ids):
            out.append(ServingFailure(CAPTURE_SHAPE, f"the prefill fc call had {fc.shape[0]} rows for a "
                                      f"{len(ids)}-token probe", sample=i))
        fc_rows.append(fc)
        reduced.append(red)
        sample = {}
        for key, t in first.items():
            if key.startswith("atlas/b"):
                sample[boundary_to_source(int(key.removeprefix("atlas/b")), dep.num_layers)] = t
            elif key == "atlas/final_norm":
                sample[FINAL_NORM] = t
        samples.append(sample)
        for r in fc_ranks[1:]:
            _, o_meta = read_blob(evidence.calls(r, i)[0])
            if DIGEST_KEY in o_meta:  # reduced: the rank proves agreement by the digest of its fc input
                if o_meta[DIGEST_KEY] != fc_digest(fc):
                    disagree.add(r)
                continue
            other = prefill_rows(evidence.calls(r, i), len(ids))[0]
            rank_diff = max(rank_diff, float((other.float() - fc.float()).abs().max()) if other.shape == fc.shape
                            else float("inf"))
        for r in fc_ranks:
            if not all(_finite(b) for b in evidence.calls(r, i)[used:]):
                verify_bad.append(i)
        verify_calls.append(len(evidence.calls(lead, i)) - used)
    # a digest says whether the bytes are the same, not by how much they differ: unknown (None) then, and named
    loop["rank_max_abs_diff"] = None if disagree else rank_diff
    loop["verify_calls"] = verify_calls
    if any(r is not None for r in reduced):
        loop["evidence"] = "reduced"
    if disagree:
        # reported, as the full atlas's difference is (the lead rank's fc input is the one judged, as with the full
        # atlas); --evidence full measures the difference
        loop["ranks_differing"] = sorted(disagree)
        dep = replace(dep, notes=(*dep.notes, f"ranks {sorted(disagree)} fed fc other bytes than rank {lead} "
                                              "(SHA-256 of the prefill's fc input); gate with --evidence full to "
                                              "see by how much"))
    mixed = any(r is not None for r in reduced) and not all(r is not None for r in reduced)
    if mixed:  # the two forms cannot be attributed together: the machine's limit (exit 3), never a verdict
        out.append(ServingFailure(HOOKS_MISSING, "some probes' evidence was reduced in the worker and some came as "
                                  "the full atlas (a prefill that did not fit: chunked, or dtypes the gate's table "
                                  "lacks), so the chunks cannot be attributed together; gate with --evidence full"))
    if atlas and not any(samples):
        # the tap's boundary wrapper never ran: the target's layer loop is inside a graph torch.compile traced at
        # start-up (vLLM's default without --enforce-eager: models/llama.py:337 @support_torch_compile), where a
        # Python hook added later is never called. The fc input is the server's own; which layer each chunk is
        # cannot be told without the target's boundaries: the machine's limit (exit 3), never a verdict
        out.append(ServingFailure(HOOKS_MISSING, "vLLM ran the target compiled (torch.compile), so its layer "
                                  "boundaries are not observable from a hook and the fc chunks cannot be attributed; "
                                  "gate a server started with --enforce-eager (a staging copy of the command)"))
    out += nonfinite_failures(fc_rows, what="the fc input vLLM served at prefill")
    out += [ServingFailure("nonfinite", "the fc input vLLM served at a verify step has NaN/Inf", sample=i)
            for i in sorted(set(verify_bad)) if not any(f.sample == i and f.kind == "nonfinite" for f in out)]
    capture = FcCapture(
        per_sample=fc_rows, dtype=str(fc_rows[0].dtype).removeprefix("torch."), engine_version=dep.engine_version,
        hook_calls=sum(len(c) for c in evidence.per_probe.get(lead, [])),
        aux_states_captured=len((evidence.meta(lead) or {}).get("aux_layers") or ()),
        aux_states_expected=dep.fc_in_features // max(dep.target_hidden_size, 1), kernel_stub_calls=(),
        aux_per_sample=[],
    )
    whole = [r for r in reduced if r is not None] if all(r is not None for r in reduced) else None
    return CaptureResult(dep, capture, LayerAtlas(per_sample=samples, num_layers=dep.num_layers, reduced=whole)
                         if atlas and not mixed else None, tuple(out), loop=loop)


def _finite(blob: bytes) -> bool:
    """Whether a call's fc input was finite (the full form's tensor, or the reduced form's flag)."""
    import torch
    from safetensors.torch import load

    t = load(blob)
    return bool(t["finite"].all()) if "fc" not in t else bool(torch.isfinite(t["fc"]).all())


def _reported(resolved: dict[str, Any], evidence: RankEvidence) -> dict[str, Any]:
    """The layout's ranks_reported, nodes and ranks from the evidence (:func:`ranks.layout`'s second half)."""

    class _Sizes:  # the sizes layout() reads, as the deployment already resolved them
        tensor_parallel_size = resolved.get("tensor_parallel_size") or 1
        pipeline_parallel_size = resolved.get("pipeline_parallel_size") or 1

    full = layout(_Sizes(), evidence)
    return {k: full[k] for k in ("ranks_reported", "nodes", "ranks")}


def counter_delta(after: Mapping[str, Any], before: Mapping[str, Any]) -> dict[str, Any]:
    """What vLLM's counters moved by between two reads (lists position by position)."""
    out: dict[str, Any] = {}
    for k, v in after.items():
        b = before.get(k)
        if isinstance(v, list):
            prev = list(b or [])
            out[k] = [a - (prev[i] if i < len(prev) else 0) for i, a in enumerate(v)]
        else:
            out[k] = None if v is None else v - (b or 0)
    return out

