"""Reduced evidence: the attribution scan's own per-token statistics, computed where the atlas is (the server's
worker), so that the atlas itself never leaves it.

Attribution (compare/attribution.py) reads the layer atlas only through one pass per sample (compare/scan.py
:func:`~specparity.compare.scan.scan`): Gram sums of every chunk row against every boundary, the exact per-token
statistics of chosen (chunk row, boundary) pairs, and served-vs-recorded token statistics. The second, exact look
(attribution_scan ``_exact_rel``) only ever asks for pairs outside the first pass, without maxima. So a worker
that runs that same :func:`scan` once on its own probe with

- the first pass's pairs exactly as the gate builds them (``scan.expected_pairs``: each chunk against its expected
  source, with maxima at the chunk's rtol, and the two boundaries next to it), then
- every other (chunk row, boundary) pair, without maxima (the exact look's candidates, whichever it picks),

holds every number the gate's attribution can read from the atlas. :class:`ReducedSample` carries them (about
``T x rows x boundaries`` floats: 1.8 MB for a 512-token probe of a 61-layer target with 3 chunks, against
460 MB of bf16 atlas), and :meth:`ReducedSample.stats` answers the gate's scans from them, so the same code judges
both forms. Computed by the same backend as the gate's own scan (numba on CPU), the numbers are the same bits;
on a GPU worker the torch backend computes them in float32 like the gate's torch path.

What the worker needs from the gate, per probe: the recorded fc input (cast to the served dtype, as the gate
casts it), the contract's sources in fc order, and the rtol of each served chunk, which depends on the served
and atlas dtypes the worker sees: the gate sends a table for every pair of dtypes (:func:`rtol_table`). The gate
checks that the sample was reduced with the sources and rtol it would use itself, and refuses it otherwise.
Every token is valid: the gate compares every row of a probe (gate.py passes no masks).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specparity.compare.scan import Backend, GramSums, Pairs, TokenPairStats, TokenStats, expected_pairs, scan
from specparity.sources import order_key

META_KEY = "specparity_reduced"  # the safetensors metadata key of a reduced sample's meta (JSON)
DTYPES = ("float32", "bfloat16", "float16", "float64")
RTOL_CHUNKS = 64  # rtol entries sent per dtype pair: more fc chunks than any EAGLE-3 drafter has
_GRAM = ("cos", "count", "diff2", "rel", "ref2", "nonfinite")
_PAIR = ("pair_b2", "pair_d2", "pair_max", "pair_excess")
_EVIDENCE = ("served_norm2", "recorded_norm2", "dots", "diff_norm2", "max_abs", "max_excess")


def first_pass_pairs(names: Sequence[str], expected: Sequence[str], rtol: Sequence[float], *, k_s: int,
                     k_r: int) -> Pairs:
    """The pairs of the gate's first pass (compare/scan.py :func:`~specparity.compare.scan.expected_pairs`)."""
    return expected_pairs(names, k_s, k_r, expected, rtol)


@dataclass(frozen=True)
class ReducedSample:
    """One probe's reduced evidence: ``tensors`` (per-token statistics, CPU) and ``meta`` (names, shapes, the
    sources and rtol it was reduced with, the atlas dtype, the pair table)."""

    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.meta["names"])

    @property
    def tokens(self) -> int:
        return int(self.meta["tokens"])

    def stats(self, pairs: Pairs, columns: Sequence[int], *, evidence_rtol: Sequence[float],
              gram: bool) -> TokenStats:
        """What :func:`scan` would give for these ``pairs`` (columns local to ``columns``, the atlas columns the
        gate scans), read from the reduced statistics. A pair it does not hold is a :class:`KeyError`."""
        m, t = self.meta, self.tensors
        first = Pairs(rows=tuple(m["first"]["rows"]), cols=tuple(m["first"]["cols"]),
                      rtol=tuple(float(x) for x in m["first"]["rtol"]), full=tuple(m["first"]["full"]))
        glob = tuple(columns[c] for c in pairs.cols)
        if (pairs.rows, glob, tuple(float(x) for x in pairs.rtol), pairs.wants_maxima()) == \
                (first.rows, first.cols, first.rtol, first.wants_maxima()):
            idx = list(range(len(first)))
        else:  # the exact look: pairs without maxima
            where = {(r, c): i for i, (r, c) in enumerate(zip(m["all_rows"], m["all_cols"], strict=True))}
            idx = [where[(r, c)] for r, c in zip(pairs.rows, glob, strict=True)]
            if any(pairs.wants_maxima()):
                raise KeyError("the reduced evidence holds maxima for the first pass's pairs only")
        pick = torch.tensor(idx, dtype=torch.long)
        if list(evidence_rtol) not in ([], [float(x) for x in m["rtol"][:len(evidence_rtol)]]):
            raise KeyError("the served-vs-recorded statistics were reduced at another rtol")
        evidence = tuple(TokenPairStats(**{k: t[f"ev{c}/{k}"] for k in _EVIDENCE}) for c in range(len(evidence_rtol)))
        sums = GramSums(**{k: t[f"gram/{k}"] for k in _GRAM}) if gram else None
        if sums is not None and len(columns) != len(self.names):
            raise KeyError("the reduced Gram sums cover every boundary")
        b2, d2 = t["all/pair_b2"].index_select(1, pick), t["all/pair_d2"].index_select(1, pick)
        first_idx = idx == list(range(len(first)))
        zeros = torch.zeros_like(b2)
        return TokenStats(gram=sums, na2=t["na2"],
                          pair_b2=t["first/pair_b2"] if first_idx else b2,
                          pair_d2=t["first/pair_d2"] if first_idx else d2,
                          pair_max=t["first/pair_max"] if first_idx else zeros,
                          pair_excess=t["first/pair_excess"] if first_idx else zeros, evidence=evidence)

    def to_blob(self, extra: Mapping[str, torch.Tensor] | None = None) -> bytes:
        """One safetensors blob: the statistics under ``reduced/``, ``extra`` tensors as named, the meta as JSON."""
        from safetensors.torch import save

        tensors = {f"reduced/{k}": v.contiguous() for k, v in self.tensors.items()}
        tensors.update({k: v.contiguous() for k, v in (extra or {}).items()})
        return save(tensors, metadata={META_KEY: json.dumps(self.meta)})


def from_tensors(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None) -> ReducedSample | None:
    """The reduced sample held in a blob's tensors and metadata (:meth:`ReducedSample.to_blob`), or None."""
    if not metadata or META_KEY not in metadata:
        return None
    return ReducedSample({k.removeprefix("reduced/"): v for k, v in tensors.items() if k.startswith("reduced/")},
                         json.loads(metadata[META_KEY]))


def reduce_sample(served: torch.Tensor, recorded: torch.Tensor, atlas: Mapping[str, torch.Tensor], *,
                  expected: Sequence[str], rtol: Sequence[float], backend: Backend = "auto") -> ReducedSample:
    """One probe reduced where its atlas is: ``served`` ``[T, k_s*H]`` (what fc was fed), ``recorded``
    ``[T, k_r*H]`` in the served dtype, ``atlas`` ``{source: [T, H]}``, ``rtol`` per chunk (``max(k_s, k_r)`` of
    them, as attribution resolves them)."""
    names = sorted(atlas, key=order_key)
    hidden = int(atlas[names[0]].shape[-1])
    k_s, k_r, tokens = int(served.shape[-1]) // hidden, int(recorded.shape[-1]) // hidden, int(served.shape[0])
    first = first_pass_pairs(names, expected, rtol, k_s=k_s, k_r=k_r)
    seen = set(zip(first.rows, first.cols, strict=True))
    rest = [(r, j) for r in range(k_s + k_r) for j in range(len(names)) if (r, j) not in seen]
    pairs = Pairs(rows=first.rows + tuple(r for r, _ in rest), cols=first.cols + tuple(j for _, j in rest),
                  rtol=first.rtol + tuple(0.0 for _ in rest),
                  full=first.wants_maxima() + tuple(False for _ in rest))
    ev_rtol = [float(x) for x in rtol[:min(k_s, k_r)]]
    valid = torch.ones(tokens, dtype=torch.bool)
    st = scan(served, recorded, [atlas[n] for n in names], valid, hidden=hidden, pairs=pairs, evidence_rtol=ev_rtol,
              gram=True, backend=backend)
    assert st.gram is not None
    n1 = len(first)
    t: dict[str, torch.Tensor] = {f"gram/{k}": getattr(st.gram, k).cpu() for k in _GRAM}
    t["na2"] = st.na2.cpu()
    for k in _PAIR:
        t[f"first/{k}"] = getattr(st, k)[:, :n1].cpu()
    # every pair's squared norms (the exact look's candidates); the first pass's are listed there too
    t["all/pair_b2"], t["all/pair_d2"] = st.pair_b2.cpu(), st.pair_d2.cpu()
    for c, ev in enumerate(st.evidence):
        t.update({f"ev{c}/{k}": getattr(ev, k).cpu() for k in _EVIDENCE})
    meta = {"names": names, "hidden": hidden, "k_s": k_s, "k_r": k_r, "tokens": tokens, "expected": list(expected),
            "rtol": [float(x) for x in rtol[:max(k_s, k_r)]],  # attribution's rtol list: one per chunk of either side
            "atlas_dtype": str(atlas[names[0]].dtype).removeprefix("torch."),
            "served_dtype": str(served.dtype).removeprefix("torch."),
            "first": {"rows": list(first.rows), "cols": list(first.cols), "rtol": [float(x) for x in first.rtol],
                      "full": list(first.wants_maxima())},
            "all_rows": list(pairs.rows), "all_cols": list(pairs.cols)}
    return ReducedSample({k: v.contiguous().clone() for k, v in t.items()}, meta)  # no shared storage


def rtol_table(rtol_for: Callable[[str, str], Sequence[float]]) -> dict[str, list[float]]:
    """``{"<served dtype>/<atlas dtype>": rtol per served chunk}`` for every pair of :data:`DTYPES`, from the gate's
    own rule ``rtol_for(served, atlas)`` (the worker picks the entry of the dtypes it sees)."""
    return {f"{s}/{a}": [float(x) for x in rtol_for(s, a)][:RTOL_CHUNKS] for s in DTYPES for a in DTYPES}


def check_reduced_rtol(reduced: Sequence[ReducedSample], rtol: Sequence[float]) -> None:
    """:class:`InputError` unless every sample was reduced at the gate's own rtol for its served chunks."""
    from specparity.errors import InputError

    want = [float(x) for x in rtol]
    for i, red in enumerate(reduced):
        if [float(x) for x in red.meta["rtol"]] != want:
            raise InputError(f"sample {i} was reduced at rtol {red.meta['rtol']}, the gate judges at {want}: the "
                             "worker was sent other tolerances", field="reduced")


@dataclass(frozen=True)
class Reduction:
    """What the gate sends a worker to reduce its evidence (an engine that can: vLLM's tap): per probe the recorded
    fc input ``[T_i, k*H]`` (as recorded; the worker casts it to the served dtype), the contract's sources, and the
    rtol table (:func:`rtol_table`)."""

    recorded: tuple[torch.Tensor, ...]
    expected: tuple[str, ...]
    rtol: dict[str, list[float]]
    # what the gate compares with the recording: fc's input ("fc"), or the target's aux states ("aux") for a drafter
    # that norms them before fc (norm_before_fc / fc_norm: gate.py _attribute)
    served: str = "fc"
