"""SGLang's live evidence as written: the hook records of one probe run (``serving/sglang/live_hooks.py``) read back
from the evidence directories, the server's stand-ins and hook notes, and each probe found in one rank's records.
Judging them is ``serving/sglang/live_evidence.py``; both are parts of the live check (``serving/sglang/live.py``)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specparity.serving.sglang import live_wire
from specparity.serving.sglang.live_stand_ins import STAND_INS_DIR

EXTEND_MODES = frozenset({"EXTEND", "MIXED"})


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
        return live_wire.segments(t.get("extend_seq_lens"), t.get("extend_prefix_lens"), t.get("req_pool_indices"),
                                   int(ids.shape[0]) if ids is not None else 0)


def read_records(evidence_dir: str | Path | Sequence[str | Path]) -> list[Record]:
    """Every hook record in ``<evidence>/records`` (of each directory given: one per node), in each process's order
    (safetensors only; never unpickled)."""
    from safetensors import safe_open

    dirs = [evidence_dir] if isinstance(evidence_dir, (str, Path)) else list(evidence_dir)
    paths = [p for d in dirs if (Path(d) / live_wire.RECORDS).is_dir()
             for p in sorted((Path(d) / live_wire.RECORDS).glob("r*.safetensors"))]
    out: list[Record] = []
    for path in paths:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
        if meta.get("format") != live_wire.RECORD_FORMAT:
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
    return {pid: v for d in dirs for pid, v in _notes(d, live_wire.FACTORY_CALLS).items()}


def hooks_ready(evidence_dir: str | Path) -> dict[int, list[str]]:
    """``{pid: runners}`` whose hook has adopted its model (after that runner's first forward; ``ready/<pid>.json``)."""
    return _notes(evidence_dir, live_wire.READY)


def settle(evidence_dir: str | Path, *, timeout_s: float = 5.0, quiet_s: float = 0.3) -> None:
    """Wait until no record is being written (no temp file) and the record count held still for ``quiet_s``: a TP
    rank other than the one that answered HTTP may still be writing."""
    folder = Path(evidence_dir) / live_wire.RECORDS
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
                                 or d.meta.get(live_wire.EVIDENCE_KEY) == "reduced")), None)
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
