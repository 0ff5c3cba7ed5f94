"""Probe packs: a few samples' token ids and their recorded fc-input chunks, beside the contract.

A probe pack lets the serving side check parity with neither the training data nor the training
machine. It is one safetensors file (never pickle), lossless for bfloat16, with these tensors per
sample ``i``:

- ``sample_{i}.input_ids``  int64 ``[T]``
- ``sample_{i}.fc_input``   ``[T, k*H]`` the recorded aux hidden states (row t = token t)
- ``sample_{i}.loss_mask``  int64 ``[T]`` (optional)
- ``sample_{i}.final_norm`` ``[T, H]`` the target's final-norm state (optional; SpecForge ``hidden_state``)

and one metadata entry ``specparity``: JSON with ``format``, ``num_samples``, ``sources``, ``hidden_size``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from safetensors import SafetensorError

from specparity.errors import InputError

if TYPE_CHECKING:  # torch is imported where a pack is read or written: the contract alone (watch) needs none
    import torch

FORMAT = "specparity-probes-v1"


@dataclass(frozen=True)
class ProbeSample:
    input_ids: torch.Tensor
    fc_input: torch.Tensor
    loss_mask: torch.Tensor | None = None
    final_norm: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass(frozen=True)
class ProbePack:
    samples: list[ProbeSample]
    sources: list[str]
    hidden_size: int

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.samples)

    @property
    def dtype(self) -> str:
        return str(self.samples[0].fc_input.dtype).removeprefix("torch.")

    def chunk(self, sample: int, index: int) -> torch.Tensor:
        """Recorded chunk ``index`` of sample ``sample``: ``[T, H]``."""
        h = self.hidden_size
        return self.samples[sample].fc_input[:, index * h : (index + 1) * h]


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_probe_pack(pack: ProbePack, path: str | Path) -> str:
    """Write ``pack`` to ``path``; returns the file's sha256."""
    import torch
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for i, s in enumerate(pack.samples):
        tensors[f"sample_{i}.input_ids"] = s.input_ids.to(torch.int64).contiguous()
        tensors[f"sample_{i}.fc_input"] = s.fc_input.contiguous()
        if s.loss_mask is not None:
            tensors[f"sample_{i}.loss_mask"] = s.loss_mask.to(torch.int64).contiguous()
        if s.final_norm is not None:
            tensors[f"sample_{i}.final_norm"] = s.final_norm.contiguous()
    # one metadata key: safetensors writes its metadata map in hash order, so several keys would make
    # the file's bytes (and the contract's probes.sha256) differ from run to run
    meta = {"specparity": json.dumps(
        {"format": FORMAT, "num_samples": len(pack.samples), "sources": pack.sources, "hidden_size": pack.hidden_size},
        sort_keys=True)}
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(p), metadata=meta)
    return file_sha256(p)


def _meta(path: Path) -> dict[str, object]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        raw = (f.metadata() or {}).get("specparity")
    try:
        meta = json.loads(raw) if raw is not None else {}
    except ValueError:
        meta = {}
    return meta if isinstance(meta, dict) else {}


def _nonfinite(t: torch.Tensor) -> str | None:
    """``"2 NaN/Inf values, the first at token 3"``, or None when every value is finite."""
    import torch

    bad = ~torch.isfinite(t)
    if not bool(bad.any()):
        return None
    first = int(bad.reshape(t.shape[0], -1).any(dim=1).nonzero()[0, 0])
    nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
    kinds = " and ".join(w for w, n in (("NaN", nan), ("Inf", inf)) if n)
    return f"{nan + inf} {kinds} value{'s' if nan + inf != 1 else ''}, the first at token {first}"


def _check_sample(i: int, ids: torch.Tensor, fc: torch.Tensor, mask: torch.Tensor | None, norm: torch.Tensor | None,
                  *, hidden: int, path: Path) -> None:
    """One sample is something an engine can be run on and compared with: at least one token, integer ids,
    floating recordings of the right shapes, every value finite (a NaN in a recording would poison the replay and
    be blamed on the deployment)."""
    import torch

    if ids.shape[0] == 0:
        raise InputError("0 tokens: every probe sample needs at least one token to run", path=path,
                         field=f"sample_{i}.input_ids")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise InputError(f"token ids must be integers, got {ids.dtype}", path=path, field=f"sample_{i}.input_ids")
    if int(ids.min()) < 0:
        raise InputError(f"negative token id {int(ids.min())}", path=path, field=f"sample_{i}.input_ids")
    for name, t, width in (("fc_input", fc, fc.shape[1]), ("final_norm", norm, hidden)):
        if t is None:
            continue
        if not t.dtype.is_floating_point:
            raise InputError(f"must be floating point, got {t.dtype}", path=path, field=f"sample_{i}.{name}")
        if t.dim() != 2 or tuple(t.shape) != (ids.shape[0], width):
            raise InputError(f"shape {tuple(t.shape)}, expected {(int(ids.shape[0]), int(width))}", path=path,
                             field=f"sample_{i}.{name}")
        bad = _nonfinite(t)
        if bad is not None:
            raise InputError(f"the recording holds {bad}: re-export the probes from a clean run", path=path,
                             field=f"sample_{i}.{name}")
    if mask is not None and tuple(mask.shape) != (ids.shape[0],):
        raise InputError(f"shape {tuple(mask.shape)}, expected ({int(ids.shape[0])},)", path=path,
                         field=f"sample_{i}.loss_mask")


def read_probe_pack(path: str | Path, *, expected_sha256: str | None = None) -> ProbePack:
    """Read and check a probe pack. A missing, altered or inconsistent pack is an :class:`InputError`."""
    from safetensors.torch import load_file

    p = Path(path)
    if not p.is_file():
        raise InputError("probe pack not found (it must lie beside the contract)", path=p, field="probes.file")
    if expected_sha256 is not None:
        actual = file_sha256(p)
        if actual != expected_sha256:
            raise InputError(
                f"probe pack sha256 {actual[:12]}… differs from the contract's probes.sha256 {expected_sha256[:12]}…",
                path=p,
                field="probes.sha256",
            )
    try:
        meta = _meta(p)
        tensors = load_file(str(p))
    except (SafetensorError, OSError, ValueError) as e:
        raise InputError(f"not a readable safetensors file: {e}", path=p) from None
    if meta.get("format") != FORMAT:
        raise InputError(f"format is {meta.get('format')!r}, expected {FORMAT!r}", path=p, field="format")
    n, sources, hidden = meta.get("num_samples"), meta.get("sources"), meta.get("hidden_size")
    if not (isinstance(n, int) and isinstance(hidden, int) and isinstance(sources, list)
            and all(isinstance(x, str) for x in sources)):
        raise InputError("bad or missing specparity metadata (num_samples, sources, hidden_size)", path=p,
                         field="metadata")
    samples: list[ProbeSample] = []
    for i in range(n):
        ids = tensors.get(f"sample_{i}.input_ids")
        fc = tensors.get(f"sample_{i}.fc_input")
        if ids is None or fc is None:
            raise InputError("missing tensors", path=p, field=f"sample_{i}")
        if ids.dim() != 1 or fc.dim() != 2 or fc.shape[0] != ids.shape[0] or fc.shape[1] != hidden * len(sources):
            raise InputError(
                f"shapes input_ids {tuple(ids.shape)}, fc_input {tuple(fc.shape)} do not fit "
                f"{len(sources)} sources x hidden {hidden}",
                path=p,
                field=f"sample_{i}.fc_input",
            )
        mask, norm = tensors.get(f"sample_{i}.loss_mask"), tensors.get(f"sample_{i}.final_norm")
        _check_sample(i, ids, fc, mask, norm, hidden=hidden, path=p)
        samples.append(ProbeSample(ids, fc, mask, norm))
    if not samples:
        raise InputError("the probe pack holds no samples", path=p, field="num_samples")
    return ProbePack(samples=samples, sources=list(sources), hidden_size=hidden)
