"""The tap's evidence, every rank's, turned into one :class:`CaptureResult`: wherever vLLM ran (``vllm.LLM`` in the
gate's child, ``serving/vllm/worker.py``; or a server, ``serving/vllm/live.py``), the same rules judge it.

Per probe, the first drafter rank's prefill fc rows and the target's boundaries recorded with them; every other
drafter rank must agree; a verify step's NaN/Inf is a failure too; and a rank that should have reported and did not
is ``rank_missing`` (never a pass on partial evidence).

The probe's rows are found by their token ids (:func:`locate`): each recorded fc call carries the token ids,
positions and request boundaries of its batch (serving/vllm/tap.py), so in a batch vLLM shares with other clients'
requests only the rows whose ids are the probe's prompt at its positions (from 0, chunk after chunk where vLLM
chunks the prefill) are the probe's prefill, and only the rows that continue the probe's own output are its verify
steps. Other requests' rows are ignored and counted (a note). Where the probe's prefill cannot be isolated (a prefix
another request cached after the gate's reset, a prompt never seen whole, calls without token ids in a shared
server) the capture is ``probe_not_isolated``: exit 3, never a finding on someone else's rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from specparity.serving.results import (
    CAPTURE_SHAPE,
    FC_NOT_CALLED,
    HOOKS_MISSING,
    PROBE_NOT_ISOLATED,
    TAP_LEASE_EXPIRED,
    TAP_OVERFLOW,
    CaptureResult,
    FcCapture,
    LayerAtlas,
    ResolvedDeployment,
    ServingFailure,
)
from specparity.serving.vllm.ranks import RankEvidence, layout, rank_failures
from specparity.serving.vllm.tap_reduce import (
    DIGEST_KEY,
    PROBE_ROWS_KEY,
    batch_lists,
    fc_digest,
    prefill_part,
    read_blob,
    segments,
)

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


@dataclass
class Located:
    """Where one probe's rows are in one rank's fc calls (:func:`locate`)."""

    parts: list[tuple[int, int, int]] = field(default_factory=list)  # (call, first row, end row) of its prefill
    verify: list[tuple[int, int, int]] = field(default_factory=list)  # (call, first row, end row) of its verify steps
    others: int = 0  # other requests' row runs (one per request and step) in the same calls, ignored
    why: str | None = None  # why its prefill could not be isolated


def locate(blobs: Sequence[bytes], probe: Sequence[int], output: Sequence[int] = ()) -> Located | None:
    """The probe's prefill and verify rows in one rank's fc calls, told from other requests' rows by token ids and
    positions (module docstring; the prompt from position 0, whole, in order); ``output``: the tokens the server
    answered the probe with, whose positions the verify steps run on. None where the calls carry no token ids."""
    n, seq = len(probe), [*map(int, probe), *map(int, output)]
    out, covered = Located(), 0
    for c, blob in enumerate(blobs):
        tensors, _ = read_blob(blob)
        facts = batch_lists(tensors)
        if facts is None:
            return None
        ids, pos, qsl = facts
        probe_rows = tensors.get(PROBE_ROWS_KEY)
        if probe_rows is not None and covered == 0:  # the tap isolated it already (reduced evidence)
            a, b = (int(v) for v in probe_rows.tolist())
            if prefill_part(ids[a:b], pos[a:b], probe) == 0 and b - a == n:
                out.parts.append((c, a, b))
                covered = n
                out.others += sum(1 for s in segments(len(ids), pos, qsl) if s != (a, b))
                continue
        for a, b in segments(len(ids), pos, qsl):
            p0 = prefill_part(ids[a:b], pos[a:b], probe) if covered < n else None
            if p0 is not None and p0 == covered:
                out.parts.append((c, a, b))
                covered += b - a
            elif p0 is not None and out.why is None:
                out.why = (f"the probe's prompt came from position {p0} in fc call {c}, where position {covered} was "
                           "due: " + ("a prefix of it was served from vLLM's prefix cache (another request cached "
                                      "it after the gate's reset)" if covered == 0 else "its prefill was not fed "
                                      "to fc in order"))
            elif covered >= n and n <= pos[a] < len(seq) and ids[a] == seq[pos[a]]:
                out.verify.append((c, a, b))  # a verify step of the probe: it starts on the probe's own token
            else:
                out.others += 1
    if covered < n and out.why is None:
        out.why = (f"the fc calls held {covered} of the probe's {n} prompt rows from position 0" if covered else
                   "no fc call held the probe's prompt from position 0 (a prefix cache hit, or the request was not "
                   "served while the tap was armed)")
    return out


def _rows(blobs: Sequence[bytes], where: Located) -> tuple[Any, dict[str, Any], dict[str, str]]:
    """(the prefill's fc rows, its boundaries ``atlas/...`` sliced to them, the first part's metadata)."""
    import torch

    from specparity.compare.reduced import from_tensors

    fcs, atlases, meta0 = [], [], {}
    for k, (c, a, b) in enumerate(where.parts):
        t, meta = read_blob(blobs[c])
        if k == 0:
            meta0 = meta
        sliced = from_tensors(t, meta) is not None or PROBE_ROWS_KEY in t  # the tap sent the probe's rows alone
        if "fc" in t:
            fcs.append(t["fc"] if sliced else t["fc"][a:b])
        atlases.append({key: (v if sliced else v[a:b]) for key, v in t.items()
                        if key.startswith("atlas/") and int(v.shape[0]) >= (b - a if sliced else b)})
    fc = (fcs[0] if len(fcs) == 1 else torch.cat(fcs)) if fcs else None
    atlas = atlases[0] if atlases else {}
    if len(atlases) > 1 and all(set(x) == set(atlas) for x in atlases):  # a chunked prefill: every chunk's rows
        atlas = {key: torch.cat([x[key] for x in atlases]) for key in atlas}
    return fc, atlas, meta0


def _verify_finite(blobs: Sequence[bytes], rows: Sequence[tuple[int, int, int]]) -> bool:
    """Whether the probe's verify-step rows were finite (the full form's fc, or the reduced form's per-row flags)."""
    import torch

    for c, a, b in rows:
        t, _ = read_blob(blobs[c])
        if "fc" in t and not bool(torch.isfinite(t["fc"][a:b]).all()):
            return False
        flags = t.get("finite")
        if "fc" not in t and flags is not None and not bool((flags[a:b] if int(flags.numel()) > 1 else flags).all()):
            return False
    return True


def _disarmed_failures(evidence: RankEvidence) -> list[ServingFailure]:
    """A tap that disarmed itself during the run (serving/vllm/tap.py): the evidence is incomplete, the machine's."""
    out = []
    for rank, why in sorted(evidence.disarmed.items()):
        if why.get("why") == "overflow":
            out.append(ServingFailure(TAP_OVERFLOW, f"rank {rank}: vLLM's tap held {why.get('calls')} fc calls and "
                                      f"{why.get('bytes')} bytes between two drains, past its bound "
                                      f"({why.get('max_calls')} calls, {why.get('max_bytes')} bytes), and disarmed "
                                      "itself, dropping them (other traffic on the server, or a probe far longer "
                                      "than usual); gate a server without other traffic"))
        else:
            out.append(ServingFailure(TAP_LEASE_EXPIRED, f"rank {rank}: vLLM's tap was not drained within its lease "
                                      f"({why.get('lease_s')} s) and disarmed itself, dropping what it held (a probe "
                                      "that took longer than the gate's timeout); raise --timeout"))
    return out


def assemble_capture(dep: ResolvedDeployment, evidence: RankEvidence, probes: Sequence[Sequence[int]], *,
                     atlas: bool, loop: dict[str, Any], failures: Sequence[ServingFailure] = (),
                     shared: bool = False) -> CaptureResult:
    """The capture from every rank's evidence (``dep`` as vLLM resolved it; ``loop`` the serving loop's facts, its
    ``outputs`` the probes' answers). ``shared``: a server other clients may use, where calls without token ids
    cannot be told from theirs (``probe_not_isolated``); in the gate's own ``vllm.LLM`` only the probe runs."""
    from specparity.serving.child.worker_common import nonfinite_failures

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
    out = list(failures) + _disarmed_failures(evidence)
    if out:  # a tap that disarmed itself leaves later probes without calls: not the deployment's fc_not_called
        return CaptureResult(dep, None, None, tuple(out), loop=loop)
    out = rank_failures(evidence, world_size=len(expected), pp=pp)
    if out:
        return CaptureResult(dep, None, None, tuple(out), loop=loop)
    if fc_meta is None:
        metas = [evidence.meta(r) or {} for r in evidence.identity]
        why = ("vLLM built no drafter: speculative decoding is off" if not any(m.get("drafter") for m in metas)
               else "the drafter has no fc module (use_aux_hidden_state is off)")
        return CaptureResult(dep, None, None, (ServingFailure(FC_NOT_CALLED, f"{why}; no fc input was captured"),),
                             loop=loop)
    run = _Assembly(evidence=evidence, fc_ranks=fc_ranks, outputs=list(loop.get("outputs") or []), out=out)
    for i, ids in enumerate(probes):
        if not _assemble_probe(run, dep, i, ids, shared=shared):  # the probe cannot be told apart: no capture
            return CaptureResult(dep, None, None, tuple(run.out), loop=loop)
    dep = _loop_facts(run, dep, loop)
    out = run.out
    reduced = run.reduced
    mixed = any(r is not None for r in reduced) and not all(r is not None for r in reduced)
    if mixed:  # the two forms cannot be attributed together: the machine's limit (exit 3), never a verdict
        out.append(ServingFailure(HOOKS_MISSING, "some probes' evidence was reduced in the worker and some came as "
                                  "the full atlas (a prefill that did not fit: chunked, or dtypes the gate's table "
                                  "lacks), so the chunks cannot be attributed together; gate with --evidence full"))
    if atlas and not any(run.samples):
        # the tap's boundary wrapper never ran: the target's layer loop is inside a graph torch.compile traced at
        # start-up (vLLM's default without --enforce-eager: models/llama.py:337 @support_torch_compile), where a
        # Python hook added later is never called. The fc input is the server's own; which layer each chunk is
        # cannot be told without the target's boundaries: the machine's limit (exit 3), never a verdict
        out.append(ServingFailure(HOOKS_MISSING, "vLLM ran the target compiled (torch.compile), so its layer "
                                  "boundaries are not observable from a hook and the fc chunks cannot be attributed; "
                                  "gate a server started with --enforce-eager (a staging copy of the command)"))
    out += nonfinite_failures(run.fc_rows, what="the fc input vLLM served at prefill")
    out += [ServingFailure("nonfinite", "the fc input vLLM served at a verify step has NaN/Inf", sample=i)
            for i in sorted(set(run.verify_bad)) if not any(f.sample == i and f.kind == "nonfinite" for f in out)]
    lead = run.fc_ranks[0]
    capture = FcCapture(
        per_sample=run.fc_rows, dtype=str(run.fc_rows[0].dtype).removeprefix("torch."),
        engine_version=dep.engine_version, hook_calls=sum(len(c) for c in evidence.per_probe.get(lead, [])),
        aux_states_captured=len((evidence.meta(lead) or {}).get("aux_layers") or ()),
        aux_states_expected=dep.fc_in_features // max(dep.target_hidden_size, 1), kernel_stub_calls=(),
        aux_per_sample=[],
    )
    whole = [r for r in reduced if r is not None] if all(r is not None for r in reduced) else None
    return CaptureResult(dep, capture, LayerAtlas(per_sample=run.samples, num_layers=dep.num_layers, reduced=whole)
                         if atlas and not mixed else None, tuple(out), loop=loop)


@dataclass
class _Assembly:
    """What the fc ranks' calls give, probe by probe: the lead rank's (the first fc rank's) fc input, atlas or reduced
    sample, and what the other fc ranks' calls say of them."""

    evidence: RankEvidence
    fc_ranks: list[int]
    outputs: list[Any]
    out: list[ServingFailure]
    fc_rows: list[Any] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    reduced: list[ReducedSample | None] = field(default_factory=list)
    rank_diff: float = 0.0
    verify_bad: list[int] = field(default_factory=list)
    verify_calls: list[int] = field(default_factory=list)
    disagree: set[int] = field(default_factory=set)
    others: int = 0


def _assemble_probe(run: _Assembly, dep: ResolvedDeployment, i: int, ids: Sequence[int], *, shared: bool) -> bool:
    """Probe ``i`` from the lead rank's calls into ``run``, then the other fc ranks' calls of it; False (a failure
    in ``run.out``) where its rows cannot be told from other requests' or were never sent."""
    from specparity.compare.reduced import from_tensors
    from specparity.sources import FINAL_NORM, boundary_to_source

    lead = run.fc_ranks[0]
    calls = run.evidence.calls(lead, i)
    output = run.outputs[i] if i < len(run.outputs) else ()
    where = locate(calls, ids, output)
    if where is None and shared:
        run.out.append(ServingFailure(PROBE_NOT_ISOLATED, f"rank {lead} recorded no token ids with its fc calls (the "
                                      "tap did not see the drafter's propose on this vLLM release), so the probe's "
                                      "rows cannot be told from other requests' on a server", sample=i))
        return False
    if where is not None and where.why is not None:
        run.out.append(ServingFailure(PROBE_NOT_ISOLATED, f"probe {i}: {where.why}; its fc input cannot be told "
                                      "from other requests' (gate a server without other traffic)", sample=i))
        return False
    if where is None:  # the gate's own vllm.LLM (nothing else runs there): the leading calls, by row count
        first, meta = read_blob(calls[0])
        fc, used = prefill_rows(calls, len(ids))[::2] if "fc" in first else (None, 1)
        where = Located(parts=[(c, 0, 0) for c in range(used)], verify=[(c, 0, 0) for c in range(used, len(calls))])
        part_atlas = {k: v for k, v in first.items() if k.startswith("atlas/")}
        legacy = True
    else:
        fc, part_atlas, meta = _rows(calls, where)
        first, _ = read_blob(calls[where.parts[0][0]])
        run.others += where.others
        legacy = False
    red = from_tensors(first, meta)
    if fc is None:  # the tap's reduced mode, without the probe it expected: nothing to compare
        run.out.append(ServingFailure(HOOKS_MISSING, f"rank {lead} sent no fc input for the probe's prefill (the "
                                      "tap was not told which probe to expect)", sample=i))
        return False
    if fc.shape[0] != len(ids):
        run.out.append(ServingFailure(CAPTURE_SHAPE, f"the prefill fc call had {fc.shape[0]} rows for a "
                                      f"{len(ids)}-token probe", sample=i))
    run.fc_rows.append(fc)
    run.reduced.append(red)
    sample = {}
    for key, t in part_atlas.items():
        if key.startswith("atlas/b"):
            sample[boundary_to_source(int(key.removeprefix("atlas/b")), dep.num_layers)] = t
        elif key == "atlas/final_norm":
            sample[FINAL_NORM] = t
    run.samples.append(sample)
    _other_ranks(run, i, ids, fc, output, legacy=legacy)
    _verify_steps(run, i, ids, where, output, legacy=legacy)
    return True


def _other_ranks(run: _Assembly, i: int, ids: Sequence[int], fc: Any, output: Sequence[int], *,
                 legacy: bool) -> None:
    """Every other fc rank's prefill fc input of probe ``i`` against the lead's: its digest, or its rows."""
    for r in run.fc_ranks[1:]:
        r_calls = run.evidence.calls(r, i)
        r_where = None if legacy else locate(r_calls, ids, output)
        if r_where is not None and r_where.why is None:
            other, _, o_meta = _rows(r_calls, r_where)
        else:
            _, o_meta = read_blob(r_calls[0])
            other = prefill_rows(r_calls, len(ids))[0] if DIGEST_KEY not in o_meta else None
        if DIGEST_KEY in o_meta:  # reduced: the rank proves agreement by the digest of its fc input
            if o_meta[DIGEST_KEY] != fc_digest(fc):
                run.disagree.add(r)
            continue
        run.rank_diff = max(run.rank_diff, float((other.float() - fc.float()).abs().max())
                            if other is not None and other.shape == fc.shape else float("inf"))


def _verify_steps(run: _Assembly, i: int, ids: Sequence[int], where: Located, output: Sequence[int], *,
                  legacy: bool) -> None:
    """Whether every fc rank's verify-step fc inputs of probe ``i`` were finite, and how many the lead saw."""
    lead = run.fc_ranks[0]
    for r in run.fc_ranks:
        r_calls = run.evidence.calls(r, i)
        r_where = where if r == lead else (None if legacy else locate(r_calls, ids, output))
        if legacy or r_where is None:
            if not all(_finite(b) for b in r_calls[len(where.parts):]):
                run.verify_bad.append(i)
        elif not _verify_finite(r_calls, r_where.verify):
            run.verify_bad.append(i)
    run.verify_calls.append(len(where.verify))


def _loop_facts(run: _Assembly, dep: ResolvedDeployment, loop: dict[str, Any]) -> ResolvedDeployment:
    """The run's facts into ``loop`` (how the ranks agreed, verify calls, other requests' rows, the evidence's form),
    and the deployment with a note where ranks fed fc other bytes."""
    # a digest says whether the bytes are the same, not by how much they differ: unknown (None) then, and named
    loop["rank_max_abs_diff"] = None if run.disagree else run.rank_diff
    loop["verify_calls"] = run.verify_calls
    loop["other_request_rows"] = run.others  # the report's note: serving/live/capture.py _with_live
    if any(r is not None for r in run.reduced):
        loop["evidence"] = "reduced"
    if run.disagree:
        # reported, as the full atlas's difference is (the lead rank's fc input is the one judged, as with the full
        # atlas); --evidence full measures the difference
        loop["ranks_differing"] = sorted(run.disagree)
        dep = replace(dep, notes=(*dep.notes, f"ranks {sorted(run.disagree)} fed fc other bytes than rank "
                                              f"{run.fc_ranks[0]} (SHA-256 of the prefill's fc input); gate with "
                                              "--evidence full to see by how much"))
    return dep


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

