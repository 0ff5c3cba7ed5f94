"""The tap's default evidence: each fc call reduced in the worker, on the server's device, before it leaves.

The full atlas (every residual boundary ``b0..bL`` and the final norm at full hidden size, for every token, from
every rank) is what attribution reads, but attribution reads it only through the per-token statistics of one scan
(compare/reduced.py). So, per probe, the gate first sends the probe's recorded fc input, the contract's sources and
its rtol table (:data:`~specparity.serving.vllm.tap.EXPECT`), and at the probe's first fc call (its prefill, every
row of the probe in one call: the gate resets the prefix cache before each probe):

- the lead rank (the first rank holding the drafter's fc, the one whose fc input the gate compares) sends the fc
  input in full (the contract diff needs it), the target's final norm in full (the outcome's served-side greedy
  tokens come from it), and the scan's statistics of every fc chunk and recorded chunk against every boundary;
- every other rank sends a SHA-256 digest of its own fc input: identical bytes prove agreement, and a rank whose
  digest differs is named by the gate;
- every later fc call of the probe (verify steps) is its row count and whether it was finite, from every rank.

Where the prefill does not fit (no boundaries recorded, rows that are not the probe's: a chunked prefill, dtypes the
table does not hold), that probe's calls go as the full atlas, exactly as without reduction, and the gate judges
them the same way. Boundaries are recorded only for the probe's first target forward (none at verify steps) and
kept on the worker's device; nothing is copied to the host but what is sent.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

DIGEST_KEY = "specparity_fc_digest"
ROWS_KEY = "specparity_rows"


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
    return {"recorded": load(base64.b64decode(recorded))["recorded"], "expected": list(s["expected"]),
            "rtol": dict(s["rtol"]), "lead": int(s["lead"])}


def expect_kwargs(recorded: Any, *, expected: list[str], rtol: dict[str, list[float]], lead: int) -> dict[str, str]:
    """What the gate sends with :data:`EXPECT` for one probe (strings: the HTTP route's rule)."""
    from safetensors.torch import save

    blob = save({"recorded": recorded.detach().to("cpu").contiguous()})
    return {"recorded": base64.b64encode(blob).decode("ascii"),
            "spec": json.dumps({"expected": expected, "rtol": rtol, "lead": lead})}


def _small(x: Any, digest: str | None = None) -> bytes:
    """A call's row count and finiteness (and, for a prefill on a rank that is not the lead, its digest)."""
    import torch
    from safetensors.torch import save

    meta = {ROWS_KEY: str(int(x.shape[0]))}
    if digest is not None:
        meta[DIGEST_KEY] = digest
    return save({"finite": torch.tensor([int(bool(torch.isfinite(x).all()))], dtype=torch.uint8)}, metadata=meta)


def _full(x: Any, atlas: dict[str, Any]) -> bytes:
    """The call as the full atlas sends it (serving/vllm/tap.py ``_Tap.fc_call``)."""
    from safetensors.torch import save

    tensors = {"fc": x.detach().to("cpu").contiguous().clone()}
    tensors.update({f"atlas/{k}": v.detach().to("cpu").contiguous().clone() for k, v in atlas.items()})
    return save(tensors)


def reduced_call(tap: Any, x: Any) -> bytes:
    """One fc call of an armed tap in reduced mode (``tap``: serving/vllm/tap.py ``_Tap``): what goes to the gate."""
    exp, tap.expect = tap.expect, None
    atlas, tap.atlas = tap.atlas, {}
    if exp is None:  # a later call of the probe: a verify step, or the rest of a prefill sent in full
        return _full(x, {}) if tap.probe == "full" else _small(x)
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
    if not fits:  # the probe goes as the full atlas (the gate judges it as it always did)
        tap.probe = "full"
        return _full(x, atlas)
    tap.probe = "reduced"
    assert rtol is not None
    if int(tap.meta.get("rank", 0)) != exp["lead"]:
        return _small(x, fc_digest(x))
    red = reduce_sample(x.detach(), rec.to(device=x.device, dtype=x.dtype), named, expected=exp["expected"],
                        rtol=[float(r) for r in rtol[:chunks]])
    extra = {"fc": x.detach().to("cpu").contiguous().clone()}
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
