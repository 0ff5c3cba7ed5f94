"""The tap's default evidence: each fc call reduced in the worker, on the server's device, before it leaves.

The full atlas (every residual boundary ``b0..bL`` and the final norm at full hidden size, for every token, from
every rank) is what attribution reads, but attribution reads it only through the per-token statistics of one scan
(compare/reduced.py). So, per probe, the gate first sends the probe's recorded fc input, the contract's sources and
its rtol table (:data:`~specparity.serving.vllm.tap_wire.EXPECT`), and at the probe's first fc call (its prefill, every
row of the probe in one call: the gate resets the prefix cache before each probe):

- the lead rank (the first rank holding the drafter's fc, the one whose fc input the gate compares) sends the fc
  input in full (the contract diff needs it), the target's final norm in full (the outcome's served-side greedy
  tokens come from it), and the scan's statistics of every fc chunk and recorded chunk against every boundary;
- every other rank sends a SHA-256 digest of its own fc input: identical bytes prove agreement, and a rank whose
  digest differs is named by the gate;
- every later fc call of the probe (verify steps) is its row count and whether it was finite, from every rank.

The probe's rows are found by their token ids and positions (the batch facts the tap records with each call,
serving/vllm/tap.py): a call that holds none of the probe's prefill (another client's request) goes as its batch
facts only and the tap keeps waiting for the probe; in a batch shared with other requests only the probe's rows are
reduced. Where the prefill does not fit (no boundaries recorded, rows that are not the whole probe: a chunked
prefill, dtypes the table does not hold), that probe's calls go as the full atlas, exactly as without reduction, and
the gate judges them the same way. Boundaries are recorded only for the probe's first target forward (none at verify steps) and
kept on the worker's device; nothing is copied to the host but what is sent.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from specparity.serving.vllm.tap_wire import IDS_KEY, POSITIONS_KEY, QSL_KEY

DIGEST_KEY = "specparity_fc_digest"
ROWS_KEY = "specparity_rows"
PROBE_ROWS_KEY = "tap/probe_rows"  # [first, end) rows of the call the reduced blob's fc holds (the probe's)


def fc_digest(t: Any) -> str:
    """SHA-256 of a tensor's dtype, shape and bytes (the same on every rank that holds the same tensor)."""
    import torch

    flat = t.detach().contiguous().to("cpu").reshape(-1).view(torch.uint8)
    h = hashlib.sha256(f"{str(t.dtype).removeprefix('torch.')}:{tuple(t.shape)}:".encode())
    h.update(flat.numpy().tobytes())
    return h.hexdigest()


def expectation(recorded: str, spec: str) -> dict[str, Any]:
    """The gate's :data:`EXPECT` arguments as the tap keeps them (base64 safetensors with ``recorded``; JSON)."""
    from safetensors.torch import load

    s = json.loads(spec)
    ids = s.get("ids")
    return {"recorded": load(base64.b64decode(recorded))["recorded"], "expected": list(s["expected"]),
            "rtol": dict(s["rtol"]), "lead": int(s["lead"]), "ids": [int(t) for t in ids] if ids else None}


def expect_kwargs(recorded: Any, *, expected: list[str], rtol: dict[str, list[float]], lead: int,
                  ids: Sequence[int] | None = None) -> dict[str, str]:
    """What the gate sends with :data:`EXPECT` for one probe (strings: the HTTP route's rule); ``ids``: the probe's
    token ids, by which the tap finds its rows in a shared batch."""
    from safetensors.torch import save

    blob = save({"recorded": recorded.detach().to("cpu").contiguous()})
    return {"recorded": base64.b64encode(blob).decode("ascii"),
            "spec": json.dumps({"expected": expected, "rtol": rtol, "lead": lead,
                                "ids": [int(t) for t in ids] if ids is not None else None})}


def segments(rows: int, positions: Sequence[int] | None, qsl: Sequence[int] | None) -> list[tuple[int, int]]:
    """The row ranges ``[a, b)`` of the requests in one fc call of ``rows`` rows: from vLLM's ``query_start_loc``
    where recorded (rows past its last entry are padding, none of a request), else where the positions stop running
    on (each request's rows are consecutive positions: ``v1/worker/gpu_model_runner.py`` ``_prepare_inputs``)."""
    if qsl is not None and len(qsl) >= 2:
        cuts = sorted({min(max(int(q), 0), rows) for q in qsl})
    elif positions is not None and len(positions) == rows:
        cuts = [0, *(i for i in range(1, rows) if int(positions[i]) != int(positions[i - 1]) + 1), rows]
    else:
        cuts = [0, rows]
    return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]


def prefill_part(ids: Sequence[int], positions: Sequence[int], probe: Sequence[int]) -> int | None:
    """Where one request's rows sit in the probe's prompt (their first position), when they are a run of it: the
    same token ids at consecutive positions inside the prompt; else None."""
    if not ids or len(ids) != len(positions):
        return None
    p0 = int(positions[0])
    if p0 < 0 or p0 + len(ids) > len(probe):
        return None
    if any(int(positions[k]) != p0 + k for k in range(len(ids))):
        return None
    return p0 if [int(t) for t in ids] == [int(t) for t in probe[p0:p0 + len(ids)]] else None


def batch_lists(tensors: Mapping[str, Any]) -> tuple[list[int], list[int], list[int] | None] | None:
    """A recorded call's token ids, positions and request boundaries as lists (None: the call carries none)."""

    if IDS_KEY not in tensors or POSITIONS_KEY not in tensors:
        return None
    qsl = tensors.get(QSL_KEY)
    return ([int(t) for t in tensors[IDS_KEY].tolist()], [int(t) for t in tensors[POSITIONS_KEY].tolist()],
            [int(t) for t in qsl.tolist()] if qsl is not None else None)


def whole_prefill(batch: Mapping[str, Any], probe: Sequence[int]) -> tuple[int, int] | bool | None:
    """In one call's batch facts (the tap's ``batch_tensors``), the rows of the probe's whole prefill ``[a, b)``;
    True where the call holds part of the prompt only (a chunked prefill, or a prefix another request cached); None
    where it holds none of it (other requests' rows)."""

    ids, pos = batch.get(IDS_KEY), batch.get(POSITIONS_KEY)
    if ids is None or pos is None:
        return True  # nothing to tell the rows apart by: the whole call, as before
    id_list, pos_list = ids.tolist(), pos.tolist()
    qsl = batch.get(QSL_KEY)
    part = False
    for a, b in segments(len(id_list), pos_list, qsl.tolist() if qsl is not None else None):
        p0 = prefill_part(id_list[a:b], pos_list[a:b], probe)
        if p0 is None:
            continue
        if p0 == 0 and b - a == len(probe):
            return a, b
        part = True
    return True if part else None


def _small(x: Any, digest: str | None = None, batch: Mapping[str, Any] | None = None) -> bytes:
    """A call's row count, each row's finiteness and its batch facts (and, for a prefill on a rank that is not the
    lead, the digest of the probe's rows)."""
    import torch
    from safetensors.torch import save

    meta = {ROWS_KEY: str(int(x.shape[0]))}
    if digest is not None:
        meta[DIGEST_KEY] = digest
    finite = torch.isfinite(x.detach()).reshape(int(x.shape[0]), -1).all(dim=-1).to("cpu", torch.uint8)
    return save({"finite": finite.contiguous(), **dict(batch or {})}, metadata=meta)


def _full(x: Any, atlas: dict[str, Any], batch: Mapping[str, Any] | None = None) -> bytes:
    """The call as the full atlas sends it (serving/vllm/tap.py ``_Tap.fc_call``)."""
    from safetensors.torch import save

    tensors = {"fc": x.detach().to("cpu").contiguous().clone(), **dict(batch or {})}
    tensors.update({f"atlas/{k}": v.detach().to("cpu").contiguous().clone() for k, v in atlas.items()})
    return save(tensors)


def reduced_call(tap: Any, x: Any) -> bytes:
    """One fc call of an armed tap in reduced mode (``tap``: serving/vllm/tap.py ``_Tap``): what goes to the gate."""
    import torch

    batch = tap.batch_tensors()
    if tap.expect is None:  # a later call of the probe: a verify step, or the rest of a prefill sent in full
        tap.atlas = {}
        return _full(x, {}, batch) if tap.probe == "full" else _small(x, batch=batch)
    rows = whole_prefill(batch, tap.expect["ids"]) if tap.expect.get("ids") else True
    if rows is None:  # other requests' rows only: the probe's prefill is still to come
        tap.atlas = {}
        return _small(x, batch=batch)
    exp, tap.expect = tap.expect, None
    atlas, tap.atlas = tap.atlas, {}
    whole_x, whole_atlas = x, atlas
    if isinstance(rows, tuple):  # the probe's rows of a batch (other requests' rows beside them are not reduced)
        a, b = rows
        x = x[a:b]
        atlas = {k: v[a:b] if int(v.shape[0]) >= b else v for k, v in atlas.items()}  # short: does not fit
        batch = {**batch, PROBE_ROWS_KEY: torch.tensor([a, b], dtype=torch.int64)}
    from specparity.compare.reduced import reduce_sample
    from specparity.sources import FINAL_NORM, boundary_to_source

    num_layers = int(tap.meta.get("num_layers") or 0)
    named = {(FINAL_NORM if k == "final_norm" else boundary_to_source(int(k.removeprefix("b")), num_layers)): v
             for k, v in atlas.items()}
    rec = exp["recorded"]
    first = next(iter(named.values()), None)
    hidden = int(first.shape[-1]) if first is not None else 0
    rtol = exp["rtol"].get(f"{_dt(x)}/{_dt(first)}") if first is not None else None
    k_s = int(x.shape[-1]) // hidden if hidden else 0
    chunks = max(k_s, int(rec.shape[-1]) // hidden if hidden else 0)
    fits = (first is not None and x.ndim == 2 and int(x.shape[-1]) == k_s * hidden > 0
            and int(rec.shape[-1]) % hidden == 0 and rtol is not None and len(rtol) >= chunks
            and all(tuple(v.shape) == (int(x.shape[0]), hidden) for v in named.values())
            and int(rec.shape[0]) == int(x.shape[0]))
    if not fits:  # the probe goes as the full atlas, the whole call (the gate finds its rows and judges it as always)
        tap.probe = "full"
        return _full(whole_x, whole_atlas, {k: v for k, v in batch.items() if k != PROBE_ROWS_KEY})
    tap.probe = "reduced"
    assert rtol is not None
    if int(tap.meta.get("rank", 0)) != exp["lead"]:
        return _small(whole_x, fc_digest(x), batch)
    red = reduce_sample(x.detach(), rec.to(device=x.device, dtype=x.dtype), named, expected=exp["expected"],
                        rtol=[float(r) for r in rtol[:chunks]])
    extra = {"fc": x.detach().to("cpu").contiguous().clone(), **batch}
    if FINAL_NORM in named:
        extra["atlas/final_norm"] = named[FINAL_NORM].detach().to("cpu").contiguous().clone()
    return red.to_blob(extra)


def _dt(t: Any) -> str:
    return str(t.dtype).removeprefix("torch.")


def read_blob(blob: bytes) -> tuple[dict[str, Any], dict[str, str]]:
    """A call's tensors and its safetensors metadata."""
    import struct

    from safetensors.torch import load

    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    return load(blob), dict(header.get("__metadata__") or {})
