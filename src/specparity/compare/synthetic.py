"""Synthetic residual streams with the correlation structure of real ones.

Used by the unit tests, the benchmark and demos. ``h_{i+1} = h_i + f_i(h_i)`` with a random
low-rank MLP ``f_i`` per layer, so neighbouring boundaries are correlated the way real decoder
layers are (cosine ~0.9-0.99), and ``final_norm = RMSNorm(h_L) * w`` with a learned-looking weight.
Pure torch, deterministic for a given seed.
"""

from __future__ import annotations

import torch

from specparity.sources import EMBEDDING, FINAL_NORM, layer


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, *, eps: float = 1e-6) -> torch.Tensor:
    """Llama-style RMSNorm over the last dim, computed in float32 and returned in ``x``'s dtype."""
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        out = out * weight.float()
    return out.to(x.dtype)


def residual_stream(
    num_layers: int,
    hidden: int,
    *,
    tokens: int,
    seed: int = 0,
    rank: int = 32,
    update_scale: tuple[float, float] = (0.15, 0.45),
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """Every canonical source of a random ``num_layers``-layer target for one ``tokens``-long sample.

    Returns ``{"embedding": [T, H], "layer:0": ..., "layer:{L-1}": ..., "final_norm": ...}`` in
    ``dtype``. Each layer's update has a per-token norm of ``update_scale`` (drawn per layer) times
    the incoming state's norm, so no two boundaries coincide.
    """
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=gen)
    out: dict[str, torch.Tensor] = {EMBEDDING: h.to(dtype)}
    lo, hi = update_scale
    for i in range(num_layers):
        u = torch.randn(hidden, rank, generator=gen) / hidden**0.5
        v = torch.randn(rank, hidden, generator=gen) / rank**0.5
        f = torch.tanh(rms_norm(h) @ u * 2.0) @ v
        scale = lo + (hi - lo) * float(torch.rand((), generator=gen))
        f = f * (scale * h.norm(dim=-1, keepdim=True) / f.norm(dim=-1, keepdim=True).clamp_min(1e-12))
        h = h + f
        out[layer(i)] = h.to(dtype)
    weight = 1.0 + 0.1 * torch.randn(hidden, generator=gen)
    out[FINAL_NORM] = rms_norm(h, weight).to(dtype)
    return out


def concat_sources(states: dict[str, torch.Tensor], sources: list[str] | tuple[str, ...]) -> torch.Tensor:
    """``torch.cat`` of the named states on the feature dim, in the given order: an fc input."""
    return torch.cat([states[s] for s in sources], dim=-1)


def bf16_noise(x: torch.Tensor, *, seed: int = 0, rel: float = 4e-3) -> torch.Tensor:
    """``x`` with relative Gaussian noise of size ``rel``, rounded through bfloat16 (kernel jitter)."""
    gen = torch.Generator().manual_seed(seed)
    xf = x.float()
    noisy = xf + rel * xf.abs() * torch.randn(xf.shape, generator=gen)
    return noisy.to(torch.bfloat16).to(x.dtype)


def growing_stream(
    num_layers: int,
    hidden: int,
    *,
    tokens: int,
    seed: int = 0,
    outliers: int = 2,
    outlier_scale: float = 20.0,
) -> dict[str, torch.Tensor]:
    """Like :func:`residual_stream` (float64), with what real late layers show: every update is added on
    top (the norm grows with depth) and ``outliers`` fixed channels carry values ``outlier_scale`` times
    the bulk, growing with depth too (massive activations)."""
    gen = torch.Generator().manual_seed(seed + 7919)
    base = residual_stream(num_layers, hidden, tokens=tokens, seed=seed)
    channels = torch.randperm(hidden, generator=gen)[:outliers]
    signs = torch.where(torch.rand(outliers, generator=gen) < 0.5, -1.0, 1.0)
    out: dict[str, torch.Tensor] = {}
    for name, h in base.items():
        x = h.double()
        if name != FINAL_NORM:
            depth = 0 if name == EMBEDDING else int(name.split(":")[1]) + 1
            bulk = x.pow(2).mean(-1, keepdim=True).sqrt()
            x = x.clone()
            x[:, channels] += signs * outlier_scale * (1.0 + depth / max(num_layers, 1)) * bulk
        out[name] = x
    out[FINAL_NORM] = rms_norm(out[layer(num_layers - 1)].float()).double()
    return out


def kernel_run(states: dict[str, torch.Tensor], dtype: torch.dtype, *, seed: int, units: float = 2.0) -> dict[str, torch.Tensor]:
    """``states`` as one engine computes them in ``dtype``: relative noise of ``units`` unit roundoffs per
    element at the embedding, growing to twice that at the last layer (error accumulates with depth),
    then rounded to ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    u = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float64: 2.0**-53}[dtype]
    names = list(states)
    out = {}
    for i, name in enumerate(names):
        x = states[name].double()
        rel = units * u * (1.0 + i / max(len(names) - 1, 1))
        out[name] = (x + rel * x.abs() * torch.randn(x.shape, generator=gen, dtype=torch.float64)).to(dtype)
    return out
