"""The training-side drafter: causality, the draft-decode KV logic, loading and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from replay_builders import VOCAB, tiny_drafter, write_dirs
from torch.nn import functional as F

from specparity.errors import InputError
from specparity.replay.drafter import (
    Eagle3Drafter,
    UnsupportedDrafter,
    draft_logits,
    rms_norm,
    rope,
)

S = 9


def _inputs(drafter: Eagle3Drafter, *, seed: int, s: int = S) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    fc = torch.randn(s, drafter.shape.fc_in_features, generator=gen)
    ids = torch.randint(0, VOCAB, (s,), generator=gen)
    return fc, ids


@settings(max_examples=15, deadline=None)
@given(t=st.integers(0, S - 2), seed=st.integers(0, 10_000))
def test_extend_is_causal(t: int, seed: int) -> None:
    """Row t's logits depend on rows 0..t only (the draft extend attends causally)."""
    d = tiny_drafter(seed=3)
    fc, ids = _inputs(d, seed=seed)
    base = d.extend(fc, ids).logits
    fc2, ids2 = fc.clone(), ids.clone()
    fc2[t + 1 :] += 5.0
    ids2[t + 1 :] = (ids2[t + 1 :] + 1) % VOCAB
    other = d.extend(fc2, ids2).logits
    torch.testing.assert_close(other[: t + 1], base[: t + 1], rtol=0, atol=1e-5)
    assert not torch.allclose(other[t + 1 :], base[t + 1 :])


def test_batched_extend_equals_per_sample() -> None:
    d = tiny_drafter(seed=4)
    (fa, ia), (fb, ib) = _inputs(d, seed=1), _inputs(d, seed=2)
    batch = draft_logits(d.weights, d.shape, aux=torch.stack([fa, fb]), next_ids=torch.stack([ia, ib]),
                         embed=d.weights["embed_tokens.weight"])
    torch.testing.assert_close(batch[0], d.extend(fa, ia).logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(batch[1], d.extend(fb, ib).logits, rtol=0, atol=1e-5)


def _naive_chain(d: Eagle3Drafter, fc: torch.Tensor, ids: torch.Tensor, steps: int) -> torch.Tensor:
    """Row by row: one query per step over an explicit KV list (extend rows 0..t + own earlier steps)."""
    w, sh = d.weights, d.shape
    hd, g = sh.head_dim, sh.heads // sh.kv_heads
    embed = w["embed_tokens.weight"]

    def step_inputs(hidden: torch.Tensor, tok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if hidden.shape[-1] != sh.hidden:
            hidden = hidden @ w["fc.weight"].T
        x = torch.cat([rms_norm(F.embedding(tok, embed), w["midlayer.input_layernorm.weight"], sh.rms_eps),
                       rms_norm(hidden, w["midlayer.hidden_norm.weight"], sh.rms_eps)], -1)
        return x, hidden

    def proj(x: torch.Tensor, name: str, n: int, pos: torch.Tensor) -> torch.Tensor:
        y = (x @ w[f"midlayer.self_attn.{name}_proj.weight"].T).view(-1, n, hd).transpose(0, 1)
        return y if name == "v" else rope(y, pos, sh.rope_theta)

    def tail(attn: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = attn @ w["midlayer.self_attn.o_proj.weight"].T + residual
        x = rms_norm(r, w["midlayer.post_attention_layernorm.weight"], sh.rms_eps)
        summed = (F.silu(x @ w["midlayer.mlp.gate_proj.weight"].T) * (x @ w["midlayer.mlp.up_proj.weight"].T)) @ w[
            "midlayer.mlp.down_proj.weight"].T + r
        return rms_norm(summed, w["norm.weight"], sh.rms_eps) @ w["lm_head.weight"].T, summed

    x, res = step_inputs(fc, ids)
    pos = torch.arange(fc.shape[0])
    ks, vs = proj(x, "k", sh.kv_heads, pos), proj(x, "v", sh.kv_heads, pos)
    out = torch.zeros(fc.shape[0], steps, dtype=torch.int64)
    for t in range(fc.shape[0]):
        keys, vals = [ks[:, : t + 1]], [vs[:, : t + 1]]
        hidden, tok, residual, xi = None, ids[t : t + 1], res[t : t + 1], x[t : t + 1]
        for j in range(steps):
            p = torch.tensor([t + j])
            if j > 0:
                xi, residual = step_inputs(hidden, tok)  # type: ignore[arg-type]
                keys.append(proj(xi, "k", sh.kv_heads, p))
                vals.append(proj(xi, "v", sh.kv_heads, p))
            q = proj(xi, "q", sh.heads, p)
            kk = torch.cat(keys, 1).repeat_interleave(g, 0)
            vv = torch.cat(vals, 1).repeat_interleave(g, 0)
            a = ((q @ kk.transpose(-1, -2)) * hd**-0.5).softmax(-1) @ vv
            logits, hidden = tail(a.transpose(0, 1).reshape(1, -1), residual)
            tok = d.to_target(logits.argmax(-1))
            out[t, j] = tok[0]
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_draft_chain_matches_row_by_row_reference(seed: int) -> None:
    """The batched draft-decode (masking + per-row chain KV + positions t+j) equals a naive per-row loop."""
    d = tiny_drafter(seed=seed)
    fc, ids = _inputs(d, seed=seed + 100)
    got = d.draft_chain(fc, ids, num_steps=4)
    want = _naive_chain(d, fc, ids, 4)
    assert got.shape == (S, 4)
    assert torch.equal(got, want)
    assert len(set(got[:, 1:].flatten().tolist())) > 1  # later steps are not degenerate


def test_first_draft_override_feeds_the_chain() -> None:
    d = tiny_drafter(seed=5)
    fc, ids = _inputs(d, seed=7)
    own = d.draft_chain(fc, ids, num_steps=3)
    forced = torch.full((S,), 11)
    other = d.draft_chain(fc, ids, num_steps=3, first_draft=forced)
    assert torch.equal(other[:, 0], forced)
    assert not torch.equal(other[:, 1:], own[:, 1:])


def test_load_round_trip_and_d2t_offsets(tmp_path: Path) -> None:
    draft, target, ref = write_dirs(tmp_path, seed=6)
    d = Eagle3Drafter.load(draft, target_dir=target)
    fc, ids = _inputs(d, seed=8)
    torch.testing.assert_close(d.extend(fc, ids).logits, ref.extend(fc, ids).logits, rtol=0, atol=0)
    assert d.hot_token_id is not None and ref.hot_token_id is not None
    assert torch.equal(d.hot_token_id, ref.hot_token_id)
    assert torch.equal(d.to_target(torch.tensor([0, 1, 2, 3])), torch.tensor([0, 2, 4, 3]))


def test_load_accepts_model_prefixed_and_layers0_names_and_sharded_target(tmp_path: Path) -> None:
    rename = {"fc.weight": "model.fc.weight",
              "midlayer.mlp.up_proj.weight": "model.layers.0.mlp.up_proj.weight",
              "midlayer.hidden_norm.weight": "layers.0.hidden_norm.weight"}
    draft, target, ref = write_dirs(tmp_path, seed=9, rename=rename, shard_target=True)
    d = Eagle3Drafter.load(draft, target_dir=target)
    fc, ids = _inputs(d, seed=1)
    torch.testing.assert_close(d.extend(fc, ids).logits, ref.extend(fc, ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize(("extra", "field"), [
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5], "norm_before_fc": True}}, "norm_before_fc"),
    ({"norm_before_fc": True}, "norm_before_fc"),
    ({"fc_norm": True}, "fc_norm"),
    ({"use_aux_norm": True}, "fc_norm"),
    ({"num_hidden_layers": 2}, "num_hidden_layers"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling"),
    ({"tie_word_embeddings": True}, "tie_word_embeddings"),
    ({"architectures": ["LlamaForCausalLMEagle"]}, "architectures"),
])
def test_refuses_what_it_does_not_implement(tmp_path: Path, extra: dict[str, object], field: str) -> None:
    draft, target, _ = write_dirs(tmp_path, cfg_extra=extra)
    with pytest.raises(UnsupportedDrafter) as info:
        Eagle3Drafter.load(draft, target_dir=target)
    assert info.value.field == field
    assert "config.json" in str(info.value)


def test_missing_tensor_and_pickle_only_dirs_are_input_errors(tmp_path: Path) -> None:
    draft, target, _ = write_dirs(tmp_path / "a")
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(draft / "model.safetensors"))
    del tensors["midlayer.hidden_norm.weight"]
    save_file(tensors, str(draft / "model.safetensors"))
    with pytest.raises(InputError, match=r"midlayer\.hidden_norm\.weight"):
        Eagle3Drafter.load(draft, target_dir=target)
    draft_b, target_b, _ = write_dirs(tmp_path / "b")
    (draft_b / "model.safetensors").unlink()
    torch.save({"fc.weight": torch.zeros(1)}, draft_b / "pytorch_model.bin")
    with pytest.raises(InputError, match="never pickle"):
        Eagle3Drafter.load(draft_b, target_dir=target_b)


def test_fc_width_must_match_config(tmp_path: Path) -> None:
    cfg_extra = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3]}}  # k = 2, checkpoint has 3*H
    draft, target, _ = write_dirs(tmp_path, cfg_extra=cfg_extra)
    with pytest.raises(InputError, match=r"fc\.weight"):
        Eagle3Drafter.load(draft, target_dir=target)
    json.loads((draft / "config.json").read_text())  # still a valid file


# speculators format (`speculators_model_type: eagle3`): the same drafter, read as vLLM 0.32 serves it

BUNDLE = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"


def _speculators_dir(tmp_path: Path, *, seed: int = 0, top: dict[str, object] | None = None,
                     layer: dict[str, object] | None = None, embed: torch.Tensor | None = None) -> tuple[Path, Path]:
    """write_dirs' drafter re-written in speculators' layout: config schema and ``layers.0.*`` names."""
    from safetensors.torch import load_file, save_file

    draft, target, ref = write_dirs(tmp_path, seed=seed)
    sg = json.loads((draft / "config.json").read_text())
    tl = {k: sg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                             "hidden_act", "rms_norm_eps", "rope_theta", "vocab_size")}
    tl.update({"model_type": "llama", "num_hidden_layers": 1, "tie_word_embeddings": False, **(layer or {})})
    cfg: dict[str, object] = {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
        "speculators_config": {"algorithm": "eagle3", "proposal_methods": [{"proposal_type": "greedy",
                                                                              "speculative_tokens": 3}],
                               "verifier": {"name_or_path": str(target)}},
        "transformer_layer_config": tl, "draft_vocab_size": ref.shape.draft_vocab, "norm_before_residual": False,
        "eagle_aux_hidden_state_layer_ids": [2, 4, 6], **(top or {})}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    (draft / "config.json").write_text(json.dumps(cfg))
    tensors = {k.replace("midlayer.", "layers.0."): v for k, v in load_file(str(draft / "model.safetensors")).items()}
    if embed is not None:
        tensors["embed_tokens.weight"] = embed
    save_file(tensors, str(draft / "model.safetensors"))
    return draft, target


def test_speculators_format_loads_the_same_drafter(tmp_path: Path) -> None:
    _, target, ref = write_dirs(tmp_path / "sg", seed=12)
    sp_draft, _ = _speculators_dir(tmp_path / "sp", seed=12)
    d = Eagle3Drafter.load(sp_draft, target_dir=target)
    fc, ids = _inputs(d, seed=3)
    torch.testing.assert_close(d.extend(fc, ids).logits, ref.extend(fc, ids).logits, rtol=0, atol=0)
    assert torch.equal(d.draft_chain(fc, ids, num_steps=3), ref.draft_chain(fc, ids, num_steps=3))
    assert d.hot_token_id is not None and ref.hot_token_id is not None
    assert torch.equal(d.hot_token_id, ref.hot_token_id)


def test_the_bundled_speculators_drafter_is_the_bundled_sglang_export() -> None:
    """fixtures/vllm/speculators/draft is fixtures/vllm/draft in speculators' layout: one drafter, two formats."""
    a = Eagle3Drafter.load(BUNDLE / "draft", target_dir=BUNDLE / "target")
    b = Eagle3Drafter.load(BUNDLE / "speculators" / "draft", target_dir=BUNDLE / "target")
    assert set(a.weights) == set(b.weights)
    assert all(torch.equal(a.weights[k], b.weights[k]) for k in a.weights)
    assert a.shape.fc_in_features == b.shape.fc_in_features == 192 and b.shape.head_dim == 32


def test_speculators_own_embedding_is_the_drafters(tmp_path: Path) -> None:
    """A speculators checkpoint carries embed_tokens (trained with it); vLLM keeps it when it differs from the
    target's, so the replay uses it too."""
    own = torch.randn(VOCAB, 16, generator=torch.Generator().manual_seed(4))
    draft, target = _speculators_dir(tmp_path, seed=13, embed=own)
    d = Eagle3Drafter.load(draft, target_dir=target)
    assert torch.equal(d.weights["embed_tokens.weight"], own)


def test_norm_before_residual_makes_the_normed_hidden_the_residual(tmp_path: Path) -> None:
    from specparity.replay.drafter import _layer_in

    draft, target = _speculators_dir(tmp_path, seed=14, top={"norm_before_residual": True})
    d = Eagle3Drafter.load(draft, target_dir=target)
    assert d.shape.norm_before_residual
    fc, ids = _inputs(d, seed=5)
    embeds = F.embedding(ids, d.weights["embed_tokens.weight"])
    x, residual = _layer_in(d.weights, d.shape, hidden=fc, embeds=embeds)
    fc_out = fc @ d.weights["fc.weight"].T
    normed = rms_norm(fc_out, d.weights["midlayer.hidden_norm.weight"], d.shape.rms_eps)
    torch.testing.assert_close(residual, normed, rtol=0, atol=0)
    torch.testing.assert_close(x[..., 16:], normed, rtol=0, atol=0)
    plain = Eagle3Drafter.load(_speculators_dir(tmp_path / "plain", seed=14)[0], target_dir=target)
    assert not torch.allclose(plain.extend(fc, ids).logits, d.extend(fc, ids).logits)


@pytest.mark.parametrize(("top", "layer", "field"), [
    ({"speculators_model_type": "eagle"}, None, "speculators_model_type"),
    ({"norm_before_fc": True}, None, "norm_before_fc"),
    ({"fc_norm": True}, None, "fc_norm"),
    ({"norm_before_residual": None}, None, "norm_before_residual"),
    (None, {"model_type": "qwen3"}, "transformer_layer_config.model_type"),
    (None, {"num_hidden_layers": 2}, "transformer_layer_config.num_hidden_layers"),
    (None, {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "transformer_layer_config.rope_scaling"),
    (None, {"layer_types": ["sliding_attention"]}, "transformer_layer_config.layer_types"),
    (None, {"attention_bias": True}, "transformer_layer_config.attention_bias"),
])
def test_speculators_features_it_does_not_implement_are_refused_by_key(
        tmp_path: Path, top: dict[str, object] | None, layer: dict[str, object] | None, field: str) -> None:
    draft, target = _speculators_dir(tmp_path, top=top, layer=layer)
    with pytest.raises(UnsupportedDrafter) as info:
        Eagle3Drafter.load(draft, target_dir=target)
    assert info.value.field == field
    assert "config.json" in str(info.value)


def test_speculators_config_without_a_layer_config_is_bad_input(tmp_path: Path) -> None:
    draft, target = _speculators_dir(tmp_path)
    cfg = json.loads((draft / "config.json").read_text())
    del cfg["transformer_layer_config"]
    (draft / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError) as info:
        Eagle3Drafter.load(draft, target_dir=target)
    assert info.value.field == "transformer_layer_config"
