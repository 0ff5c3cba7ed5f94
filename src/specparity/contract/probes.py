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

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from specparity.errors import InputError

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


def read_probe_pack(path: str | Path, *, expected_sha256: str | None = None) -> ProbePack:
    """Read and check a probe pack. A missing, altered or inconsistent pack is an :class:`InputError`."""
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
        samples.append(
            ProbeSample(ids, fc, tensors.get(f"sample_{i}.loss_mask"), tensors.get(f"sample_{i}.final_norm"))
        )
    if not samples:
        raise InputError("the probe pack holds no samples", path=p, field="num_samples")
    return ProbePack(samples=samples, sources=list(sources), hidden_size=hidden)
