"""SGLang's live evidence: the hook records of one probe run (``serving/sglang/live_hooks.py``) read back and judged
into the project's records (:class:`FcCapture`, :class:`LayerAtlas` or its reduced form), or typed failures. Part
of the live check (``serving/sglang/live.py``)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specparity.serving import stand_ins as stand_in_names
from specparity.serving.results import (
    CAPTURE_SHAPE,
    FC_NOT_CALLED,
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
from specparity.serving.sglang import live_hooks
from specparity.serving.sglang.live_stand_ins import STAND_INS_DIR

if TYPE_CHECKING:
    pass

from specparity.serving.results import HOOKS_MISSING
from specparity.serving.sglang.live_static import FIRST_RELEASE_WITH_FORWARD_HOOKS

EXTEND_MODES = frozenset({"EXTEND", "MIXED"})


# ---------------------------------------------------------------------------------------------- evidence
@dataclass(frozen=True)
class Record:
    """One hook record: one forward of one model runner on one rank."""

    path: Path
    runner: str
    rank: int
    world_size: int
    mode: str
    call: int
    seq: int
    pid: int
    meta: Mapping[str, str]
    tensors: Mapping[str, Any]

    def segments(self) -> list[tuple[int, int, int, int]]:
        """``(row start, rows, prefix length, req_pool_index)`` per request of the batch."""
        ids = self.tensors.get("input_ids")
        t = self.tensors
        return live_hooks.segments(t.get("extend_seq_lens"), t.get("extend_prefix_lens"), t.get("req_pool_indices"),
                                   int(ids.shape[0]) if ids is not None else 0)


def read_records(evidence_dir: str | Path | Sequence[str | Path]) -> list[Record]:
    """Every hook record in ``<evidence>/records`` (of each directory given: one per node), in each process's order
    (safetensors only; never unpickled)."""
    from safetensors import safe_open

    dirs = [evidence_dir] if isinstance(evidence_dir, (str, Path)) else list(evidence_dir)
    paths = [p for d in dirs if (Path(d) / live_hooks.RECORDS).is_dir()
             for p in sorted((Path(d) / live_hooks.RECORDS).glob("r*.safetensors"))]
    out: list[Record] = []
    for path in paths:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
        if meta.get("format") != live_hooks.RECORD_FORMAT:
            continue
        out.append(Record(path, meta["runner"], int(meta["rank"]), int(meta["world_size"]), meta["forward_mode"],
                          int(meta["call"]), int(meta["seq"]), int(meta["pid"]), meta, tensors))
    out.sort(key=lambda r: (r.rank, r.pid, r.seq))
    return out


def server_stand_ins(evidence_dir: str | Path, records: Sequence[Record] = ()) -> tuple[tuple[str, ...],
                                                                                  tuple[str, ...] | None]:
    """The stand-ins SGLang's server processes recorded (``stand_ins/<pid>.json``, and the records' own list), and
    the ``sgl_kernel`` stand-in's calls over all processes (per process its latest count; None: no process imported
    the stand-in)."""
    folder = Path(evidence_dir) / STAND_INS_DIR
    names: list[str] = []
    per_pid: dict[int, list[str]] = {}
    seen: list[tuple[int, list[str], list[str] | None]] = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            d = json.loads(path.read_text())
            seen.append((int(d["pid"]), [str(n) for n in d.get("stand_ins") or []], d.get("kernel_stub_calls")))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    for r in records:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            seen.append((r.pid, [str(n) for n in json.loads(r.meta.get("stand_ins", "[]"))],
                         json.loads(r.meta.get("kernel_stub_calls", "null"))))
    for pid, active, stub in seen:
        names.extend(n for n in active if n not in names)
        if stub is not None and len(stub) >= len(per_pid.get(pid, [])):
            per_pid[pid] = [str(c) for c in stub]
    if not per_pid:
        return tuple(names), None
    return tuple(names), tuple(c for pid in sorted(per_pid) for c in per_pid[pid])


def _notes(evidence_dir: str | Path, folder_name: str) -> dict[int, list[str]]:
    folder = Path(evidence_dir) / folder_name
    out: dict[int, list[str]] = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            d = json.loads(path.read_text())
            out[int(d["pid"])] = [str(t) for t in d.get("entries", [])]
    return out


def hooks_registered(evidence_dir: str | Path | Sequence[str | Path]) -> dict[int, list[str]]:
    """``{pid: specs}`` of the server processes where SGLang called specparity's hook factory
    (``factory_calls/<pid>.json``: one entry per model runner), over every directory given."""
    dirs = [evidence_dir] if isinstance(evidence_dir, (str, Path)) else list(evidence_dir)
    return {pid: v for d in dirs for pid, v in _notes(d, live_hooks.FACTORY_CALLS).items()}


def hooks_ready(evidence_dir: str | Path) -> dict[int, list[str]]:
    """``{pid: runners}`` whose hook has adopted its model (after that runner's first forward; ``ready/<pid>.json``)."""
    return _notes(evidence_dir, live_hooks.READY)


def settle(evidence_dir: str | Path, *, timeout_s: float = 5.0, quiet_s: float = 0.3) -> None:
    """Wait until no record is being written (no temp file) and the record count held still for ``quiet_s``: a TP
    rank other than the one that answered HTTP may still be writing."""
    folder = Path(evidence_dir) / live_hooks.RECORDS
    deadline = time.monotonic() + timeout_s
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
        busy = any(n.startswith(".tmp-") for n in names)
        if len(names) != last or busy:
            last, since = len(names), time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.05)


@dataclass
class _Match:
    target: list[tuple[Record, int, int]]  # (record, row start, rows) per chunk
    draft: list[tuple[Record, int, int]]


def _find_probe(records: Sequence[Record], probe: Sequence[int]) -> tuple[_Match | None, str]:
    """The target extend rows of ``probe`` (its chunks, chained by req_pool_index and prefix), and the draft
    extend that followed each chunk in the same process; or None and why."""
    want = [int(t) for t in probe]
    cache_hit = ""
    targets = [r for r in records if r.runner == "target" and r.mode in EXTEND_MODES and "input_ids" in r.tensors]
    for r in targets:
        ids = r.tensors["input_ids"]
        for start, n, prefix, pool in r.segments():
            seg = [int(x) for x in ids[start:start + n].tolist()]
            if prefix > 0 and want[prefix:prefix + n] == seg:
                cache_hit = (f"its prefill started at token {prefix} (the radix cache held the rest): flush the "
                             "cache before each probe")
            if prefix != 0 or seg != want[:n] or n == 0:
                continue
            chunks = [(r, start, n)]
            done = n
            for later in (x for x in targets if x.pid == r.pid and x.seq > r.seq):
                if done >= len(want):
                    break
                lids = later.tensors["input_ids"]
                for s2, n2, p2, pool2 in later.segments():
                    if pool2 == pool and p2 == done and [int(x) for x in lids[s2:s2 + n2].tolist()] == \
                            want[done:done + n2]:
                        chunks.append((later, s2, n2))
                        done += n2
                        break
            if done != len(want):
                continue
            drafts = []
            for rec, s, n_rows in chunks:
                seg_index = [x[0] for x in rec.segments()].index(s)
                nxt = next((d for d in records if d.runner == "draft" and d.pid == rec.pid and d.seq > rec.seq
                            and ("fc_input" in d.tensors or "spec_hidden" in d.tensors
                                 or d.meta.get(live_hooks.EVIDENCE_KEY) == "reduced")), None)
                if nxt is None:
                    break
                dsegs = nxt.segments()
                pool = rec.segments()[seg_index][3]
                if seg_index >= len(dsegs) or dsegs[seg_index][1] != n_rows or dsegs[seg_index][3] != pool:
                    break  # not this chunk's draft extend (eagle_worker_v2.py:1593-1600 runs it right after)
                drafts.append((nxt, dsegs[seg_index][0], n_rows))
            return _Match(chunks, drafts if len(drafts) == len(chunks) else []), ""
    return None, cache_hit or "no extend forward of it reached the hooks"


def _rows(parts: Sequence[tuple[Record, int, int]], key: str) -> Any:
    import torch

    pieces = [rec.tensors[key][s:s + n] for rec, s, n in parts if key in rec.tensors]
    if len(pieces) != len(parts):
        return None
    return torch.cat(pieces, dim=0).clone()


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
    import torch

    from specparity.serving.child.worker_common import nonfinite_failures
    from specparity.serving.sglang.common import judge_fc_capture
    from specparity.serving.vllm.tap_reduce import fc_digest

    evidence = Path(evidence_dir)
    dirs = [evidence, *(Path(d) for d in node_dirs)]
    failures: list[ServingFailure] = []
    version = deployment.engine_version if deployment is not None else "?"
    registered = hooks_registered(dirs)
    records = read_records(dirs)
    names, calls = server_stand_ins(evidence, records)
    active = [n for n in names if n != stand_in_names.SGL_KERNEL]
    if calls is not None:
        active.insert(0, f"{stand_in_names.SGL_KERNEL}: calls {', '.join(sorted(set(calls))) or 'none'}")
        bad = stand_in_names.kernel_stub_violations(calls)
        if bad:
            failures.append(ServingFailure(SGLANG_EXCEPTION, (
                f"the sgl_kernel stand-in was called for {', '.join(bad)}, outside its allowlist "
                f"{sorted(stand_in_names.KERNEL_STUB_ALLOWED)} (nothing measured through a stand-in op is trusted)")))
    elif stand_in_names.SGL_KERNEL in names:
        active.insert(0, f"{stand_in_names.SGL_KERNEL}: never imported")
    by_rank: dict[int, list[Record]] = {}
    for r in records:
        by_rank.setdefault(r.rank, []).append(r)
    expected = list((deployment.layout or {}).get("ranks_expected") or []) if deployment is not None else []
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
    if not by_rank:
        ready = hooks_ready(evidence)
        why = ("no armed forward reached them (the probes never ran an eager forward of the model)" if ready else
               "they never fired: no forward of either model ran")
        failures.append(ServingFailure(FC_NOT_CALLED, (
            f"the hooks were built in {len(registered)} server process(es) and adopted by "
            f"{sum(len(v) for v in ready.values())} model(s), but no record was written: {why}")))
        return CaptureResult(dep, None, None, tuple(failures))
    lead = min(by_rank)
    fc_rows: list[Any] = []
    aux_rows: list[Any] = []
    aux_widths: list[int] = []
    atlas_rows: list[dict[str, Any]] = []
    drafts_used = 0
    graph_notes: set[str] = set()
    target_seen = False
    per_rank_diff = 0.0
    reduced: list[Any] = []  # per probe: its ReducedSample, or None (the full atlas)
    disagree: set[int] = set()
    for i, probe in enumerate(probes):
        match, why = _find_probe(by_rank[lead], probe)
        if match is None:
            # a radix-cache hit: the probe's own prefill never ran whole, so fc was never fed every token of it (the
            # machine's state, exit 3 by name); no extend of it at all: the drafter was never reached (fc_not_called)
            kind = PROBE_NOT_ISOLATED if "radix cache" in why else FC_NOT_CALLED
            failures.append(ServingFailure(kind, f"probe {i} ({len(probe)} tokens): {why}", sample=i))
            continue
        target_seen = True
        if not match.draft:
            failures.append(ServingFailure(FC_NOT_CALLED, (
                f"probe {i}: the target's extend ran but no draft forward called fc after it "
                "(the drafter's draft extend did not run)"), sample=i))
            continue
        drafts_used += len(match.draft)
        rows_of_fc = _rows(match.draft, "fc_input")
        if rows_of_fc is None:  # the fc tap did not fire; what fc was handed (live_hooks: a draft body in a graph)
            rows_of_fc = _rows(match.draft, "spec_hidden")
            pre_fc_norm = dep is not None and (dep.norm_before_fc or dep.fc_norm)
            if rows_of_fc is None or pre_fc_norm:
                failures.append(ServingFailure(HOOKS_MISSING, (
                    f"probe {i}: the drafter's fc tap did not fire (its prefill body ran in a CUDA graph: sglang "
                    "0.5.23 turns the breakable prefill graph on by default on CUDA, model_executor/"
                    "cuda_graph_config.py:119-123)" + ("; the fc input is normed after the batch's hidden states, "
                                                       "so they are not fc's input" if pre_fc_norm else "")),
                    sample=i))
                continue
            graph_notes.add("the fc input is the draft batch's spec_info.hidden_states (the drafter's body ran in "
                            "a CUDA graph, so its fc tap did not fire; models/llama_eagle3.py:233-247)")
        fc_rows.append(rows_of_fc)
        aux = _rows(match.target, "aux")
        if aux is not None:
            aux_rows.append(aux)
        elif match.target[0][0].meta.get(live_hooks.AUX_WIDTH):  # reduced: the states were not kept, their width was
            aux_widths.append(int(match.target[0][0].meta[live_hooks.AUX_WIDTH]))
        keys = [k for k in match.target[0][0].tensors if k == "embedding" or k == "final_norm" or
                k.startswith("layer:")]
        atlas_rows.append({k: v for k in keys if (v := _rows(match.target, k)) is not None})
        held = any(rec.meta.get(live_hooks.EVIDENCE_KEY) == "reduced" for rec, _, _ in match.target)
        red, why_not = _reduced_of(match.draft, i, probes) if held else (None, "")
        if held and red is None:
            failures.append(ServingFailure(HOOKS_MISSING, (
                f"probe {i}: rank {lead}'s hooks held the target's boundaries for the reduction but its draft extend "
                f"reduced nothing ({why_not}); gate with --evidence full"), sample=i))
        reduced.append(red)
        for rank in sorted(by_rank):
            if rank == lead:
                continue
            other, _ = _find_probe(by_rank[rank], probe)
            if other is None or not other.draft:
                failures.append(ServingFailure(RANK_MISSING, f"rank {rank} has no record of probe {i}", sample=i))
                continue
            digest = _digest_of(other.draft, i, probes)
            if digest is not None:  # reduced: the rank proves agreement by the digest of its fc rows
                if digest != fc_digest(fc_rows[-1]):
                    disagree.add(rank)
                continue
            o = _rows(other.draft, "fc_input")
            o = o if o is not None else _rows(other.draft, "spec_hidden")
            if o is None or o.shape != fc_rows[-1].shape:
                failures.append(ServingFailure(CAPTURE_SHAPE, f"rank {rank}'s fc input of probe {i} is "
                                               f"{None if o is None else tuple(o.shape)}, rank {lead}'s "
                                               f"{tuple(fc_rows[-1].shape)}", sample=i))
            else:
                per_rank_diff = max(per_rank_diff, float((o.float() - fc_rows[-1].float()).abs().max()))
    lengths = [len(p) for p in probes]
    if not fc_rows or len(fc_rows) != len(probes):
        return CaptureResult(dep, None, None, tuple(failures) or (ServingFailure(FC_NOT_CALLED, "no probe"),))
    first = fc_rows[0]
    width = int(first.shape[-1])
    rows = sum(int(t.shape[0]) for t in fc_rows)
    aux_count = 0
    aux_seen = bool(aux_rows) or len(aux_widths) == len(probes)
    if aux_seen and dep is not None and dep.target_hidden_size:
        width = int(aux_rows[0].shape[-1]) if aux_rows else aux_widths[0]
        aux_count = width // dep.target_hidden_size
    expected_width = dep.fc_in_features if dep is not None else width
    judged = judge_fc_capture(hook_calls=drafts_used, rows=rows, width=width, expected_rows=sum(lengths),
                              expected_width=expected_width, aux_captured=aux_count if aux_seen else 0,
                              aux_expected=dep.num_aux_hidden_states if dep is not None and aux_seen else 0,
                              fc_applied=dep.fc_applied if dep is not None else True, target_ran=target_seen)
    failures = [*judged, *failures]
    failures.extend(nonfinite_failures(fc_rows, what="fc input"))
    stub_active = calls is not None
    fc = FcCapture(per_sample=fc_rows, dtype=str(first.dtype).removeprefix("torch."), engine_version=version,
                   hook_calls=drafts_used, aux_states_captured=aux_count,
                   aux_states_expected=dep.num_aux_hidden_states if dep is not None else aux_count,
                   kernel_stub_calls=tuple(calls or ()), aux_per_sample=aux_rows if len(aux_rows) == len(probes)
                   else [], kernel_stub_active=stub_active)
    atlas: LayerAtlas | None = None
    whole = [r for r in reduced if r is not None]
    if whole and len(whole) != len(reduced):  # the two forms cannot be attributed together: exit 3, never a verdict
        failures.append(ServingFailure(HOOKS_MISSING, (
            "some probes' evidence was reduced in the server and some came as the full atlas (a prefill the hooks "
            "could not match to a whole probe: chunked, or shared with another request), so the chunks cannot be "
            "attributed together; gate with --evidence full")))
    elif whole and all(atlas_rows) and len({tuple(sorted(a)) for a in atlas_rows}) == 1:
        layer_keys = [n for n in whole[0].names if n.startswith("layer:")]
        num_layers = dep.num_layers if dep is not None and dep.num_layers else \
            1 + max(int(k.split(":")[1]) for k in layer_keys)
        atlas = LayerAtlas(per_sample=atlas_rows, num_layers=num_layers, reduced=whole)
        failures.extend(nonfinite_failures([torch.stack(list(s.values())) for s in atlas_rows], what="final norm"))
        failures.extend(_reduced_nonfinite(whole))
    elif not whole and atlas_rows and all(atlas_rows) and len({tuple(sorted(a)) for a in atlas_rows}) == 1:
        num_layers = dep.num_layers if dep is not None and dep.num_layers else \
            1 + max(int(k.split(":")[1]) for k in atlas_rows[0] if k.startswith("layer:"))
        atlas = LayerAtlas(per_sample=atlas_rows, num_layers=num_layers)
        failures.extend(nonfinite_failures([torch.stack(list(s.values())) for s in atlas_rows], what="layer atlas"))
    else:  # the hooks could not see the stream (a graph replay): the machine's setting, never a width finding (exit 3)
        failures.append(ServingFailure(HOOKS_MISSING, (
            "the target's residual boundaries were not recorded for every probe: its prefill body ran without the "
            "boundary taps firing (on CUDA, sglang 0.5.23's default breakable prefill graph replays it, "
            "model_executor/cuda_graph_config.py:119-123; the layer atlas needs an eager prefill, "
            "--cuda-graph-backend-prefill disabled on the server)")))
    if dep is not None and graph_notes:
        dep = replace(dep, notes=(*dep.notes, *sorted(graph_notes)))
    others = _other_segments(by_rank[lead], probes)
    if dep is not None and others:
        dep = replace(dep, notes=(*dep.notes, f"{others} prefill segment(s) of other requests were armed with the "
                                               "probes and ignored (each probe is matched by its own token ids)"))
    if dep is not None and len(by_rank) > 1:
        dep = replace(dep, notes=(*dep.notes, f"ranks {sorted(by_rank)} reported; fc inputs differ across ranks by "
                                               f"at most {per_rank_diff:.3g}" + (
                                                   f"; ranks {sorted(disagree)} fed fc other bytes than rank {lead} "
                                                   "(SHA-256 of the prefill's fc rows; --evidence full measures by "
                                                   "how much)" if disagree else "")))
    loop = {"evidence": "reduced" if whole and len(whole) == len(reduced) else "full"}
    if disagree:
        loop["ranks_differing"] = sorted(disagree)  # type: ignore[assignment]
    return CaptureResult(dep, fc, atlas, tuple(failures), loop=loop)


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
        meta = rec.meta.get(f"{live_hooks.REDUCED_META}{j}")
        if meta is not None:
            prefix = f"{live_hooks.REDUCED_PREFIX}{j}/"
            tensors = {"reduced/" + k.removeprefix(prefix): v for k, v in rec.tensors.items() if k.startswith(prefix)}
            return from_tensors(tensors, {META_KEY: meta}), ""
        error = rec.meta.get(f"{live_hooks.REDUCE_ERROR}/{j}")
        if error is not None:
            return None, f"the reduction raised {error}"
    return None, "no reduced statistics in its record"


def _digest_of(parts: Sequence[tuple[Record, int, int]], i: int, probes: Sequence[Sequence[int]]) -> str | None:
    """A non-lead rank's SHA-256 of its fc rows of probe ``i`` (reduced records), or None (a full record)."""
    if len(parts) != 1:
        return None
    for j in _probe_indices(i, probes):
        digest = parts[0][0].meta.get(f"{live_hooks.DIGEST_META}{j}")
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
