"""SGLang's live evidence judged: the hook records of one probe run (read by ``serving/sglang/live_records.py``) into
the project's records (:class:`FcCapture`, :class:`LayerAtlas` or its reduced form), or typed failures. Part of the
live check (``serving/sglang/live.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specparity.serving import stand_ins as stand_in_names
from specparity.serving.results import (
    CAPTURE_SHAPE,
    FC_NOT_CALLED,
    HOOKS_MISSING,
    NODE_MISSING,
    PROBE_NOT_ISOLATED,
    RANK_MISSING,
    SGLANG_EXCEPTION,
    CaptureResult,
    FcCapture,
    LayerAtlas,
    ResolvedDeployment,
    ServingFailure,
)
from specparity.serving.sglang import live_wire
from specparity.serving.sglang.live_records import (
    EXTEND_MODES,
    Record,
    _find_probe,
    _rows,
    hooks_ready,
    hooks_registered,
    read_records,
    server_stand_ins,
)
from specparity.serving.sglang.live_static import FIRST_RELEASE_WITH_FORWARD_HOOKS


def evidence_to_capture(evidence_dir: str | Path, probes: Sequence[Sequence[int]], *,
                        deployment: ResolvedDeployment | None = None,
                        node_dirs: Sequence[str | Path] = ()) -> CaptureResult:
    """The hook evidence of one probe run as the project's records: :class:`FcCapture` (fc input per probe, with the
    target's aux states) and :class:`LayerAtlas` (the target's residual boundaries per probe), or typed failures.

    Never a pass on partial evidence: hooks never built, a probe no hook saw, a drafter that never ran fc, an
    empty or misshapen capture, NaN/Inf, and a rank of ``deployment.layout["ranks_expected"]`` without records are
    each a :class:`ServingFailure`. Ranks of one TP group see the same rows: the lowest reporting rank's tensors are
    the evidence; the others must match it (a note gives the largest difference). ``deployment`` (from
    :func:`deployment_from_server_info`) gets the stand-ins and the ranks that reported.

    ``node_dirs``: the evidence directories of the server's other nodes (``--nnodes``), as the user gives them: SGLang's
    hooks write on each node's own disk and SGLang has no route that returns them. A node of the deployment with no
    record in any directory read is :data:`NODE_MISSING` (exit 3, naming the node and its ranks), never a pass on
    the ranks that did report. Reduced records (``live_hooks``: the lead rank's statistics, the others' digests) give
    the atlas as :class:`~specparity.compare.reduced.ReducedSample` per probe."""
    evidence = Path(evidence_dir)
    dirs = [evidence, *(Path(d) for d in node_dirs)]
    registered = hooks_registered(dirs)
    records = read_records(dirs)
    active, calls, failures = _stand_ins(evidence, records)
    by_rank: dict[int, list[Record]] = {}
    for r in records:
        by_rank.setdefault(r.rank, []).append(r)
    dep = deployment
    if dep is not None:
        layout = {**dep.layout, "ranks_reported": sorted(by_rank) or None,
                  "ranks": {str(r): {"records": len(rs), "pids": sorted({x.pid for x in rs})}
                            for r, rs in sorted(by_rank.items())}}
        dep = replace(dep, stand_ins=tuple(active), layout=layout)
    if not registered:
        failures.insert(0, ServingFailure(HOOKS_MISSING, (
            "the server built none of specparity's hooks (no factory call in the evidence directory): start it with "
            f"the switches of `specparity launch-flags --engine sglang` (sglang >= {FIRST_RELEASE_WITH_FORWARD_HOOKS}"
            " has --forward-hooks)")))
        return CaptureResult(dep, None, None, tuple(failures))
    failures += _absent_ranks(dep, by_rank, dirs)
    if not by_rank:
        ready = hooks_ready(evidence)
        why = ("no armed forward reached them (the probes never ran an eager forward of the model)" if ready else
               "they never fired: no forward of either model ran")
        failures.append(ServingFailure(FC_NOT_CALLED, (
            f"the hooks were built in {len(registered)} server process(es) and adopted by "
            f"{sum(len(v) for v in ready.values())} model(s), but no record was written: {why}")))
        return CaptureResult(dep, None, None, tuple(failures))
    run = _Gathered(lead=min(by_rank), failures=failures)
    for i, probe in enumerate(probes):
        _gather_probe(run, i, probe, by_rank, probes, dep)
    if not run.fc_rows or len(run.fc_rows) != len(probes):
        return CaptureResult(dep, None, None, tuple(run.failures) or (ServingFailure(FC_NOT_CALLED, "no probe"),))
    fc, judged, nonfinite = _fc_capture(run, dep, probes, calls)
    atlas, atlas_failures = _atlas_of(run, dep)
    failures = [*judged, *run.failures, *nonfinite, *atlas_failures]
    dep = _with_notes(dep, run, by_rank, probes)
    whole = [r for r in run.reduced if r is not None]
    loop = {"evidence": "reduced" if whole and len(whole) == len(run.reduced) else "full"}
    if run.disagree:
        loop["ranks_differing"] = sorted(run.disagree)  # type: ignore[assignment]
    return CaptureResult(dep, fc, atlas, tuple(failures), loop=loop)


def _stand_ins(evidence: Path, records: Sequence[Record]) -> tuple[list[str], list[str] | None, list[ServingFailure]]:
    """The stand-ins active in the server (the ``sgl_kernel`` one first, with its calls), those calls (None: the
    stand-in is not installed) and a failure for a call outside its allowlist."""
    names, calls = server_stand_ins(evidence, records)
    active = [n for n in names if n != stand_in_names.SGL_KERNEL]
    failures: list[ServingFailure] = []
    if calls is not None:
        active.insert(0, f"{stand_in_names.SGL_KERNEL}: calls {', '.join(sorted(set(calls))) or 'none'}")
        bad = stand_in_names.kernel_stub_violations(calls)
        if bad:
            failures.append(ServingFailure(SGLANG_EXCEPTION, (
                f"the sgl_kernel stand-in was called for {', '.join(bad)}, outside its allowlist "
                f"{sorted(stand_in_names.KERNEL_STUB_ALLOWED)} (nothing measured through a stand-in op is trusted)")))
    elif stand_in_names.SGL_KERNEL in names:
        active.insert(0, f"{stand_in_names.SGL_KERNEL}: never imported")
    return active, (list(calls) if calls is not None else None), failures


def _absent_ranks(dep: ResolvedDeployment | None, by_rank: Mapping[int, Sequence[Record]],
                  dirs: Sequence[Path]) -> list[ServingFailure]:
    """A node of the deployment with no record in any directory read (:data:`NODE_MISSING`, its ranks named), then
    the ranks of ``ranks_expected`` without records on the nodes that did report (:data:`RANK_MISSING`)."""
    failures: list[ServingFailure] = []
    expected = list((dep.layout or {}).get("ranks_expected") or []) if dep is not None else []
    missing = [r for r in expected if r not in by_rank]
    node_map = {int(k): [int(r) for r in v] for k, v in ((dep.layout or {}).get("node_ranks") or {}).items()} \
        if dep is not None else {}
    if len(node_map) > 1 and by_rank:
        for node, ranks in sorted(node_map.items()):
            if ranks and not any(r in by_rank for r in ranks):
                failures.append(ServingFailure(NODE_MISSING, (
                    f"node {node} of {len(node_map)} (ranks {ranks[0]}-{ranks[-1]}) wrote no hook record to any "
                    f"evidence directory the gate read ({', '.join(str(d) for d in dirs)}): SGLang's hooks write on "
                    "each node's own disk and SGLang returns nothing of them over HTTP; give that node's evidence "
                    "directory (shared or copied) with --node-evidence DIR")))
                missing = [r for r in missing if r not in ranks]
    if missing and by_rank:
        failures.append(ServingFailure(RANK_MISSING, f"rank(s) {missing} wrote no hook record; ranks "
                                       f"{sorted(by_rank)} did (every rank of the served world must report)"))
    return failures


@dataclass
class _Gathered:
    """What one probe run's records give, probe by probe: the lead rank's fc input, aux states and atlas rows (or
    their reduced form), and what the other ranks' records say of them."""

    lead: int
    failures: list[ServingFailure]
    fc_rows: list[Any] = field(default_factory=list)
    aux_rows: list[Any] = field(default_factory=list)
    aux_widths: list[int] = field(default_factory=list)  # reduced records keep the aux states' width, not the states
    atlas_rows: list[dict[str, Any]] = field(default_factory=list)
    reduced: list[Any] = field(default_factory=list)  # per probe: its ReducedSample, or None (the full atlas)
    drafts_used: int = 0
    target_seen: bool = False
    graph_notes: set[str] = field(default_factory=set)
    per_rank_diff: float = 0.0
    disagree: set[int] = field(default_factory=set)


def _gather_probe(run: _Gathered, i: int, probe: Sequence[int], by_rank: Mapping[int, Sequence[Record]],
                  probes: Sequence[Sequence[int]], dep: ResolvedDeployment | None) -> None:
    """Probe ``i`` from the lead rank's records into ``run`` (or a failure naming why it cannot be), then the other
    ranks' records of it."""
    match, why = _find_probe(by_rank[run.lead], probe)
    if match is None:
        # a radix-cache hit: the probe's own prefill never ran whole, so fc was never fed every token of it (the
        # machine's state, exit 3 by name); no extend of it at all: the drafter was never reached (fc_not_called)
        kind = PROBE_NOT_ISOLATED if "radix cache" in why else FC_NOT_CALLED
        run.failures.append(ServingFailure(kind, f"probe {i} ({len(probe)} tokens): {why}", sample=i))
        return
    run.target_seen = True
    if not match.draft:
        run.failures.append(ServingFailure(FC_NOT_CALLED, (
            f"probe {i}: the target's extend ran but no draft forward called fc after it "
            "(the drafter's draft extend did not run)"), sample=i))
        return
    run.drafts_used += len(match.draft)
    rows_of_fc = _rows(match.draft, "fc_input")
    if rows_of_fc is None:  # the fc tap did not fire; what fc was handed (live_hooks: a draft body in a graph)
        rows_of_fc = _rows(match.draft, "spec_hidden")
        pre_fc_norm = dep is not None and (dep.norm_before_fc or dep.fc_norm)
        if rows_of_fc is None or pre_fc_norm:
            run.failures.append(ServingFailure(HOOKS_MISSING, (
                f"probe {i}: the drafter's fc tap did not fire (its prefill body ran in a CUDA graph: sglang "
                "0.5.23 turns the breakable prefill graph on by default on CUDA, model_executor/"
                "cuda_graph_config.py:119-123)" + ("; the fc input is normed after the batch's hidden states, "
                                                   "so they are not fc's input" if pre_fc_norm else "")),
                sample=i))
            return
        run.graph_notes.add("the fc input is the draft batch's spec_info.hidden_states (the drafter's body ran in "
                            "a CUDA graph, so its fc tap did not fire; models/llama_eagle3.py:233-247)")
    run.fc_rows.append(rows_of_fc)
    aux = _rows(match.target, "aux")
    if aux is not None:
        run.aux_rows.append(aux)
    elif match.target[0][0].meta.get(live_wire.AUX_WIDTH):  # reduced: the states were not kept, their width was
        run.aux_widths.append(int(match.target[0][0].meta[live_wire.AUX_WIDTH]))
    keys = [k for k in match.target[0][0].tensors if k == "embedding" or k == "final_norm" or k.startswith("layer:")]
    run.atlas_rows.append({k: v for k in keys if (v := _rows(match.target, k)) is not None})
    held = any(rec.meta.get(live_wire.EVIDENCE_KEY) == "reduced" for rec, _, _ in match.target)
    red, why_not = _reduced_of(match.draft, i, probes) if held else (None, "")
    if held and red is None:
        run.failures.append(ServingFailure(HOOKS_MISSING, (
            f"probe {i}: rank {run.lead}'s hooks held the target's boundaries for the reduction but its draft extend "
            f"reduced nothing ({why_not}); gate with --evidence full"), sample=i))
    run.reduced.append(red)
    _compare_ranks(run, i, probe, by_rank, probes)


def _compare_ranks(run: _Gathered, i: int, probe: Sequence[int], by_rank: Mapping[int, Sequence[Record]],
                   probes: Sequence[Sequence[int]]) -> None:
    """Every other rank's fc rows of probe ``i`` against the lead's: its digest (reduced records) or its rows."""
    from specparity.serving.vllm.tap_reduce import fc_digest

    lead_rows = run.fc_rows[-1]
    for rank in sorted(by_rank):
        if rank == run.lead:
            continue
        other, _ = _find_probe(by_rank[rank], probe)
        if other is None or not other.draft:
            run.failures.append(ServingFailure(RANK_MISSING, f"rank {rank} has no record of probe {i}", sample=i))
            continue
        digest = _digest_of(other.draft, i, probes)
        if digest is not None:  # reduced: the rank proves agreement by the digest of its fc rows
            if digest != fc_digest(lead_rows):
                run.disagree.add(rank)
            continue
        o = _rows(other.draft, "fc_input")
        o = o if o is not None else _rows(other.draft, "spec_hidden")
        if o is None or o.shape != lead_rows.shape:
            run.failures.append(ServingFailure(CAPTURE_SHAPE, f"rank {rank}'s fc input of probe {i} is "
                                               f"{None if o is None else tuple(o.shape)}, rank {run.lead}'s "
                                               f"{tuple(lead_rows.shape)}", sample=i))
        else:
            run.per_rank_diff = max(run.per_rank_diff, float((o.float() - lead_rows.float()).abs().max()))


def _fc_capture(run: _Gathered, dep: ResolvedDeployment | None, probes: Sequence[Sequence[int]],
                calls: Sequence[str] | None) -> tuple[FcCapture, list[ServingFailure], list[ServingFailure]]:
    """The fc input of every probe as :class:`FcCapture`, what judging it finds (its shape against the
    deployment's, the aux states) and its NaN/Inf."""
    from specparity.serving.child.worker_common import nonfinite_failures
    from specparity.serving.sglang.child_output import judge_fc_capture

    first = run.fc_rows[0]
    width = int(first.shape[-1])
    rows = sum(int(t.shape[0]) for t in run.fc_rows)
    aux_count = 0
    aux_seen = bool(run.aux_rows) or len(run.aux_widths) == len(probes)
    if aux_seen and dep is not None and dep.target_hidden_size:
        width = int(run.aux_rows[0].shape[-1]) if run.aux_rows else run.aux_widths[0]
        aux_count = width // dep.target_hidden_size
    expected_width = dep.fc_in_features if dep is not None else width
    judged = judge_fc_capture(hook_calls=run.drafts_used, rows=rows, width=width,
                              expected_rows=sum(len(p) for p in probes), expected_width=expected_width,
                              aux_captured=aux_count if aux_seen else 0,
                              aux_expected=dep.num_aux_hidden_states if dep is not None and aux_seen else 0,
                              fc_applied=dep.fc_applied if dep is not None else True, target_ran=run.target_seen)
    fc = FcCapture(per_sample=run.fc_rows, dtype=str(first.dtype).removeprefix("torch."),
                   engine_version=dep.engine_version if dep is not None else "?", hook_calls=run.drafts_used,
                   aux_states_captured=aux_count,
                   aux_states_expected=dep.num_aux_hidden_states if dep is not None else aux_count,
                   kernel_stub_calls=tuple(calls or ()),
                   aux_per_sample=run.aux_rows if len(run.aux_rows) == len(probes) else [],
                   kernel_stub_active=calls is not None)
    return fc, list(judged), nonfinite_failures(run.fc_rows, what="fc input")


def _atlas_of(run: _Gathered, dep: ResolvedDeployment | None) -> tuple[LayerAtlas | None, list[ServingFailure]]:
    """The target's boundaries of every probe as :class:`LayerAtlas` (full, or reduced in the server), or why there
    is none: the two forms mixed, or boundaries not recorded for every probe (both exit 3, never a verdict)."""
    import torch

    from specparity.serving.child.worker_common import nonfinite_failures

    rows = run.atlas_rows
    whole = [r for r in run.reduced if r is not None]
    same_keys = bool(rows) and all(rows) and len({tuple(sorted(a)) for a in rows}) == 1
    if whole and len(whole) != len(run.reduced):
        return None, [ServingFailure(HOOKS_MISSING, (
            "some probes' evidence was reduced in the server and some came as the full atlas (a prefill the hooks "
            "could not match to a whole probe: chunked, or shared with another request), so the chunks cannot be "
            "attributed together; gate with --evidence full"))]
    if whole and same_keys:
        layer_keys = [n for n in whole[0].names if n.startswith("layer:")]
        num_layers = dep.num_layers if dep is not None and dep.num_layers else \
            1 + max(int(k.split(":")[1]) for k in layer_keys)
        return LayerAtlas(per_sample=rows, num_layers=num_layers, reduced=whole), [
            *nonfinite_failures([torch.stack(list(s.values())) for s in rows], what="final norm"),
            *_reduced_nonfinite(whole)]
    if not whole and same_keys:
        num_layers = dep.num_layers if dep is not None and dep.num_layers else \
            1 + max(int(k.split(":")[1]) for k in rows[0] if k.startswith("layer:"))
        return LayerAtlas(per_sample=rows, num_layers=num_layers), nonfinite_failures(
            [torch.stack(list(s.values())) for s in rows], what="layer atlas")
    # the hooks could not see the stream (a graph replay): the machine's setting, never a width finding (exit 3)
    return None, [ServingFailure(HOOKS_MISSING, (
        "the target's residual boundaries were not recorded for every probe: its prefill body ran without the "
        "boundary taps firing (on CUDA, sglang 0.5.23's default breakable prefill graph replays it, "
        "model_executor/cuda_graph_config.py:119-123; the layer atlas needs an eager prefill, "
        "--cuda-graph-backend-prefill disabled on the server)"))]


def _with_notes(dep: ResolvedDeployment | None, run: _Gathered, by_rank: Mapping[int, Sequence[Record]],
                probes: Sequence[Sequence[int]]) -> ResolvedDeployment | None:
    """The deployment with what the run's records say beside the evidence: a CUDA-graph fallback, other requests'
    segments armed with the probes, and how the ranks agreed."""
    if dep is None:
        return None
    notes = list(dep.notes) + sorted(run.graph_notes)
    others = _other_segments(by_rank[run.lead], probes)
    if others:
        notes.append(f"{others} prefill segment(s) of other requests were armed with the probes and ignored (each "
                     "probe is matched by its own token ids)")
    if len(by_rank) > 1:
        notes.append(f"ranks {sorted(by_rank)} reported; fc inputs differ across ranks by at most "
                     f"{run.per_rank_diff:.3g}" + (
                         f"; ranks {sorted(run.disagree)} fed fc other bytes than rank {run.lead} (SHA-256 of the "
                         "prefill's fc rows; --evidence full measures by how much)" if run.disagree else ""))
    return replace(dep, notes=tuple(notes))


def _other_segments(records: Sequence[Record], probes: Sequence[Sequence[int]]) -> int:
    """Target extend segments (one rank's) that start no probe and continue none: other clients' requests (the
    gate's one-token priming request is not counted)."""
    wanted = [[int(t) for t in p] for p in probes]
    count = 0
    for r in records:
        if r.runner != "target" or r.mode not in EXTEND_MODES or "input_ids" not in r.tensors:
            continue
        ids = r.tensors["input_ids"]
        for start, n, prefix, _ in r.segments():
            seg = [int(x) for x in ids[start:start + n].tolist()]
            if n <= 1 and prefix == 0:
                continue  # the priming token
            if not any(w[prefix:prefix + n] == seg for w in wanted):
                count += 1
    return count


def _probe_indices(i: int, probes: Sequence[Sequence[int]]) -> list[int]:
    """Probe ``i`` and every probe with the same tokens (the hooks match an expectation by its tokens)."""
    return [i, *(j for j, p in enumerate(probes) if j != i and list(p) == list(probes[i]))]


def _reduced_of(parts: Sequence[tuple[Record, int, int]], i: int,
                probes: Sequence[Sequence[int]]) -> tuple[Any, str]:
    """Probe ``i``'s reduced sample from its draft record (live_hooks ``_reduce``), or None and why not."""
    from specparity.compare.reduced import META_KEY, from_tensors

    if len(parts) != 1:
        return None, f"its prefill came in {len(parts)} chunks"
    rec = parts[0][0]
    for j in _probe_indices(i, probes):
        meta = rec.meta.get(f"{live_wire.REDUCED_META}{j}")
        if meta is not None:
            prefix = f"{live_wire.REDUCED_PREFIX}{j}/"
            tensors = {"reduced/" + k.removeprefix(prefix): v for k, v in rec.tensors.items() if k.startswith(prefix)}
            return from_tensors(tensors, {META_KEY: meta}), ""
        error = rec.meta.get(f"{live_wire.REDUCE_ERROR}/{j}")
        if error is not None:
            return None, f"the reduction raised {error}"
    return None, "no reduced statistics in its record"


def _digest_of(parts: Sequence[tuple[Record, int, int]], i: int, probes: Sequence[Sequence[int]]) -> str | None:
    """A non-lead rank's SHA-256 of its fc rows of probe ``i`` (reduced records), or None (a full record)."""
    if len(parts) != 1:
        return None
    for j in _probe_indices(i, probes):
        digest = parts[0][0].meta.get(f"{live_wire.DIGEST_META}{j}")
        if digest is not None:
            return digest
    return None


def _reduced_nonfinite(samples: Sequence[Any]) -> list[ServingFailure]:
    """NaN/Inf in the boundaries the server reduced (the Gram sums count them per token)."""
    out = []
    for i, red in enumerate(samples):
        bad = red.tensors.get("gram/nonfinite")
        if bad is not None and bool((bad > 0).any()):
            out.append(ServingFailure("nonfinite", "the layer atlas the server reduced has NaN/Inf", sample=i))
    return out
