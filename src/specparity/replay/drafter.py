"""The training-side EAGLE-3 drafter: plain torch, computing exactly what SGLang 0.5.23 computes.

One implementation serves both the bundled fixture (``fixtures/eagle3_draft.py`` trains through
:func:`draft_logits`) and the outcome check (:class:`Eagle3Drafter` loads a draft dir in SGLang-export or
speculators format, :mod:`specparity.replay.draft_config`). The weights live in a flat dict keyed by the names
SpecForge's export writes (legacy ``midlayer.*``; ``# sglang 0.5.23 models/llama_eagle3.py:338-348`` renames
midlayer -> layers.0, the name speculators writes).

Forward (``# sglang 0.5.23 models/llama_eagle3.py``), for the one-layer drafters it supports:

- ``fc(g_t)`` only when the hidden width differs from the embedding width (:236-247); so a draft-decode
  step, which feeds back the drafter's own ``H_d``-wide state, skips fc.
- layer 0: ``residual = fc out`` (``hidden_norm(fc out)`` with speculators' ``norm_before_residual``, as vLLM
  0.32 serves it); ``cat(input_layernorm(embed(x_{t+1})), hidden_norm(fc out))`` -> 2H into q/k/v (:97-102);
  attention with neox RoPE at the token positions; o_proj; fused add +
  post_attention_layernorm (:114); SiLU-gated MLP (:117).
- final fused add + ``norm`` (:263-265): logits always come from the normed state; the state fed back to
  the next draft step is the pre-norm sum unless ``norm_output`` (:207, :268).
- ``lm_head`` over the draft vocab; draft id -> target id via ``hot_token_id = d2t + arange`` (:350-353,
  applied in ``speculative/eagle_worker_v2.py:757-758``).

Configs it does not implement (``norm_before_fc``, ``fc_norm``/``use_aux_norm``, more than one layer,
rope scaling, biases in attention/MLP, tied embeddings, a non-llama decoder layer) are refused with
:class:`UnsupportedDrafter` naming the key.
Only safetensors are read (never pickle; :mod:`specparity.replay.checkpoint`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn import functional as F

from specparity.errors import InputError
from specparity.replay.checkpoint import TARGET_EMBED, SafetensorsDir, read_target_lm_head, read_target_tensor
from specparity.replay.draft_config import (
    ARCHITECTURE,
    DraftShape,
    UnsupportedDrafter,
    read_draft_config,
    shape_from_config,
)

__all__ = [
    "ARCHITECTURE",
    "MIDLAYER_NAMES",
    "REQUIRED_NAMES",
    "DraftShape",
    "Eagle3Drafter",
    "ExtendOutput",
    "UnsupportedDrafter",
    "decode_step",
    "draft_logits",
    "extend",
    "rms_norm",
    "rope",
    "shape_from_config",
]

# Checkpoint names written by SpecForge's export (`SF specforge/export/to_sglang.py:38, 85`): no embed_*;
# SGLang shares the target's embedding (`# sglang 0.5.23 speculative/eagle_worker_v2.py:376-378`).
MIDLAYER_NAMES = (
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight",
)
REQUIRED_NAMES = ("fc.weight", *MIDLAYER_NAMES, "norm.weight")


@dataclass(frozen=True)
class ExtendOutput:
    """One drafter forward over rows ``0..S-1`` (the draft extend after prefill)."""

    logits: torch.Tensor  # [..., S, draft_vocab], from the normed state
    hidden: torch.Tensor  # [..., S, H_d] the state SGLang feeds back to the next draft step
    keys: torch.Tensor  # [..., kv_heads, S, head_dim], after RoPE (the draft KV cache)
    values: torch.Tensor  # [..., kv_heads, S, head_dim]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as SGLang's native path computes it (`# sglang 0.5.23 layers/layernorm.py:828-860`)."""
    variance = x.pow(2).mean(dim=-1, keepdim=True)
    return x * torch.rsqrt(variance + eps) * weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding on ``[..., S, head_dim]`` at ``positions`` ``[S]``.

    `# sglang 0.5.23 layers/rotary_embedding/base.py:233-265` (inv_freq, cos/sin cache); llama's default
    is_neox_style=True (`models/llama.py:335`).
    """
    dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos(), freqs.sin()
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _split_heads(x: torch.Tensor, n: int, hd: int) -> torch.Tensor:
    return x.reshape(*x.shape[:-1], n, hd).transpose(-2, -3)  # [..., S, n*hd] -> [..., n, S, hd]


def _layer_in(
    w: dict[str, torch.Tensor], shape: DraftShape, *, hidden: torch.Tensor, embeds: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """fc when the width differs (`llama_eagle3.py:238`), then the 2H input of layer 0 (`:97-102`) and the
    residual: the raw hidden state, or the normed one with ``norm_before_residual`` (vLLM 0.32
    ``models/llama_eagle3.py:110-122``)."""
    if hidden.shape[-1] != embeds.shape[-1]:
        hidden = hidden @ w["fc.weight"].T
        if "fc.bias" in w:
            hidden = hidden + w["fc.bias"]
    normed = rms_norm(hidden, w["midlayer.hidden_norm.weight"], shape.rms_eps)
    x = torch.cat([rms_norm(embeds, w["midlayer.input_layernorm.weight"], shape.rms_eps), normed], dim=-1)
    return x, (normed if shape.norm_before_residual else hidden)


def _qkv(
    w: dict[str, torch.Tensor], shape: DraftShape, x: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    hd = shape.head_dim
    q = _split_heads(x @ w["midlayer.self_attn.q_proj.weight"].T, shape.heads, hd)
    k = _split_heads(x @ w["midlayer.self_attn.k_proj.weight"].T, shape.kv_heads, hd)
    v = _split_heads(x @ w["midlayer.self_attn.v_proj.weight"].T, shape.kv_heads, hd)
    return rope(q, positions, shape.rope_theta), rope(k, positions, shape.rope_theta), v


def _layer_out(
    w: dict[str, torch.Tensor], shape: DraftShape, attn: torch.Tensor, residual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """o_proj, fused add+norm, MLP, final fused add+norm, lm_head; returns (logits, fed-back state)."""
    eps = shape.rms_eps
    merged = attn.transpose(-2, -3).reshape(*residual.shape[:-1], shape.heads * shape.head_dim)
    residual = merged @ w["midlayer.self_attn.o_proj.weight"].T + residual
    x = rms_norm(residual, w["midlayer.post_attention_layernorm.weight"], eps)
    gate = F.silu(x @ w["midlayer.mlp.gate_proj.weight"].T) * (x @ w["midlayer.mlp.up_proj.weight"].T)
    summed = gate @ w["midlayer.mlp.down_proj.weight"].T + residual
    normed = rms_norm(summed, w["norm.weight"], eps)
    # llama_eagle3.py:263-268: logits from the normed state; aux (fed back) pre-norm unless norm_output.
    return normed @ w["lm_head.weight"].T, (normed if shape.norm_output else summed)


def extend(
    weights: dict[str, torch.Tensor], shape: DraftShape, *, aux: torch.Tensor, next_ids: torch.Tensor,
    embed: torch.Tensor,
) -> ExtendOutput:
    """Draft extend over ``aux`` ``[..., S, k*H_t]`` paired with ``next_ids`` ``[..., S]`` (row t: g_t, x_{t+1}).

    Positions are 0..S-1 and attention is causal, as in `speculative/eagle_worker_v2.py:961-1030`
    (input ids shifted left by one, target hidden states unshifted, same positions as the target).
    """
    s = aux.shape[-2]
    x, residual = _layer_in(weights, shape, hidden=aux, embeds=F.embedding(next_ids, embed))
    q, k, v = _qkv(weights, shape, x, torch.arange(s))
    groups = shape.heads // shape.kv_heads
    kk, vv = k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)
    scores = (q @ kk.transpose(-1, -2)) * (shape.head_dim**-0.5)
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    attn = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1) @ vv
    logits, hidden = _layer_out(weights, shape, attn, residual)
    return ExtendOutput(logits=logits, hidden=hidden, keys=k, values=v)


def draft_logits(
    weights: dict[str, torch.Tensor], shape: DraftShape, *, aux: torch.Tensor, next_ids: torch.Tensor,
    embed: torch.Tensor,
) -> torch.Tensor:
    """Draft-vocab logits ``[..., S, draft_vocab]`` of :func:`extend` (differentiable; used for training)."""
    return extend(weights, shape, aux=aux, next_ids=next_ids, embed=embed).logits


def decode_step(
    weights: dict[str, torch.Tensor], shape: DraftShape, *, prefix: ExtendOutput, hidden: torch.Tensor,
    token_ids: torch.Tensor, step: int, chain: list[tuple[torch.Tensor, torch.Tensor]], embed: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One draft-decode step for every row of ONE sample at once (topk 1); returns (logits, fed-back state).

    Row t continues the chain started at extend row t: input ``hidden[t]`` (H_d wide, so fc is skipped)
    and ``embed(token_ids[t])`` at position ``t + step``; it attends to the extend KV of rows ``0..t`` and
    to its own earlier chain steps. ``chain`` collects this row-wise KV and is extended in place.
    """
    s = hidden.shape[0]
    x, residual = _layer_in(weights, shape, hidden=hidden, embeds=F.embedding(token_ids, embed))
    q, k, v = _qkv(weights, shape, x, torch.arange(s) + step)
    chain.append((k, v))
    groups = shape.heads // shape.kv_heads
    scale = shape.head_dim**-0.5

    def rep(t: torch.Tensor) -> torch.Tensor:
        return t.repeat_interleave(groups, dim=-3)

    scores_prefix = (q @ rep(prefix.keys).transpose(-1, -2)) * scale  # [heads, S, S]
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    scores_prefix = scores_prefix.masked_fill(~causal, float("-inf"))
    scores_chain = torch.stack([(q * rep(ck)).sum(-1) * scale for ck, _ in chain], dim=-1)  # [heads, S, m]
    probs = torch.cat([scores_prefix, scores_chain], dim=-1).softmax(dim=-1)
    attn = probs[..., :s] @ rep(prefix.values)
    for i, (_, cv) in enumerate(chain):
        attn = attn + probs[..., s + i : s + i + 1] * rep(cv)
    return _layer_out(weights, shape, attn, residual)


def _canonical(name: str) -> str:
    """Checkpoint name -> midlayer.* naming (SGLang accepts an optional ``model.`` prefix, :362, :372)."""
    name = name.removeprefix("model.")
    return "midlayer." + name.removeprefix("layers.0.") if name.startswith("layers.0.") else name


@dataclass
class Eagle3Drafter:
    """A loaded drafter (float32) with the target's embedding, ready to replay fc inputs."""

    shape: DraftShape
    weights: dict[str, torch.Tensor]  # midlayer.* naming, plus embed_tokens.weight (the target's)
    hot_token_id: torch.Tensor | None  # draft id -> target id; None when the checkpoint has no d2t
    source: str

    @classmethod
    def load(cls, draft_dir: str | Path, *, target_dir: str | Path) -> Eagle3Drafter:
        """Load a draft dir (config.json + safetensors) in SGLang-export or speculators format.

        Weight names: ``midlayer.*`` (SpecForge's export) or ``layers.0.*`` (speculators; SGLang's and vLLM's
        loaders accept both, `# sglang 0.5.23 models/llama_eagle3.py:338-348`, vLLM 0.32
        ``models/llama_eagle3.py:290-299``), optionally ``model.``-prefixed; ``d2t`` offsets (both formats,
        draft id + d2t[draft id] = target id).
        """
        d = Path(draft_dir)
        cfg_path = d / "config.json"
        try:
            cfg = json.loads(cfg_path.read_text())
        except (OSError, ValueError) as e:
            raise InputError(f"unreadable draft config: {e}", path=cfg_path) from None
        read = read_draft_config(cfg, path=cfg_path)
        shape = read.shape
        st = SafetensorsDir(d)
        by_name = {_canonical(n): n for n in st.names()}
        missing = [n for n in REQUIRED_NAMES if n not in by_name]
        if missing:
            raise InputError(f"draft checkpoint lacks {missing}", path=d)
        w = {n: st.read(by_name[n]).to(torch.float32) for n in REQUIRED_NAMES}
        if shape.fc_bias and "fc.bias" in by_name:
            w["fc.bias"] = st.read(by_name["fc.bias"]).to(torch.float32)
        if read.draft_vocab_size is None and "lm_head.weight" not in by_name:
            w["lm_head.weight"] = read_target_lm_head(target_dir)  # llama_eagle3.py:306-308; eagle_worker_v2.py:357-361
        elif "lm_head.weight" in by_name:
            w["lm_head.weight"] = st.read(by_name["lm_head.weight"]).to(torch.float32)
        else:
            raise InputError("draft checkpoint lacks lm_head.weight", path=d)
        own = read.own_embedding and "embed_tokens.weight" in by_name
        w["embed_tokens.weight"] = (st.read(by_name["embed_tokens.weight"]) if own
                                    else read_target_tensor(target_dir, [TARGET_EMBED])).to(torch.float32)
        if tuple(w["fc.weight"].shape) != (shape.hidden, shape.fc_in_features):
            raise InputError(f"fc.weight is {tuple(w['fc.weight'].shape)}, config implies "
                             f"({shape.hidden}, {shape.fc_in_features})", path=d, field="fc.weight")
        hot = None
        if "d2t" in by_name:
            d2t = st.read(by_name["d2t"]).to(torch.int64)
            hot = d2t + torch.arange(d2t.shape[0])  # llama_eagle3.py:350-353 (offsets)
        return cls(shape=shape, weights=w, hot_token_id=hot, source=str(d))

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocab ids -> target ids (`# sglang 0.5.23 speculative/eagle_worker_v2.py:757-758`)."""
        if self.hot_token_id is None:
            return draft_ids
        mapped: torch.Tensor = self.hot_token_id[draft_ids]
        return mapped

    def extend(self, fc_input: torch.Tensor, next_ids: torch.Tensor) -> ExtendOutput:
        """:func:`extend` for one sample: ``fc_input`` ``[S, k*H_t]``, ``next_ids`` ``[S]`` (target ids)."""
        with torch.no_grad():
            return extend(self.weights, self.shape, aux=fc_input.to(torch.float32), next_ids=next_ids,
                          embed=self.weights["embed_tokens.weight"])

    def draft_chain(self, fc_input: torch.Tensor, next_ids: torch.Tensor, *, num_steps: int,
                    first_draft: torch.Tensor | None = None) -> torch.Tensor:
        """Greedy topk-1 chain from every row: ``[S, num_steps]`` target ids ``d_1..d_n``.

        Step 1 is the extend row; step j>1 feeds back the drafter's own state and ``embed(d_{j-1})`` as
        SGLang's draft decode does. ``first_draft`` replaces ``d_1`` (e.g. SGLang's own first drafts).
        """
        prefix = self.extend(fc_input, next_ids)
        d = self.to_target(prefix.logits.argmax(dim=-1)) if first_draft is None else first_draft
        drafts: list[torch.Tensor] = [d]
        hidden = prefix.hidden
        chain: list[tuple[torch.Tensor, torch.Tensor]] = []
        with torch.no_grad():
            for step in range(1, num_steps):
                logits, hidden = decode_step(self.weights, self.shape, prefix=prefix, hidden=hidden,
                                             token_ids=drafts[-1], step=step, chain=chain,
                                             embed=self.weights["embed_tokens.weight"])
                drafts.append(self.to_target(logits.argmax(dim=-1)))
        return torch.stack(drafts, dim=-1)
