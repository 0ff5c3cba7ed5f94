"""fixtures/real/sf_trainer.py: SpecForge 0.2.0's own EAGLE-3 training step on CPU.

1. The loss substitute matches SpecForge's torch reference and the Triton kernel's backward formula.
2. A tiny drafter trained on a learnable synthetic task gets a lower loss and a first-position
   accuracy far above chance.
3. The returned weights are what SpecForge's own SGLang export writes.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

pytest.importorskip("specforge")

from fixtures.real.sf_trainer import TorchLogSoftmaxLoss, TrainConfig, specforge_cpu, train_drafter  # noqa: E402

H, V, DRAFT_V, STEPS = 64, 128, 64, 30
LOSS_ATOL = 1e-5  # float32 value and gradient: the same ops in a different order
EVEN = torch.arange(0, V, 2)  # the draft vocab: the even target ids


def _next_token(ids: torch.Tensor) -> torch.Tensor:
    """The synthetic target's greedy rule: a permutation of the even ids (k -> 5k+3 mod 64)."""
    return 2 * ((5 * (ids // 2) + 3) % DRAFT_V)


def _draft_config() -> dict:
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": H,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "hidden_act": "silu",
        "num_hidden_layers": 1,
        "vocab_size": V,
        "draft_vocab_size": DRAFT_V,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5]},
    }


@functools.cache
def _task() -> dict:
    """16 records; token t+1 = rule(token t). The teacher's logits peak on the rule's token."""
    g = torch.Generator().manual_seed(0)
    embed = torch.randn(V, H, generator=g)
    lm_head = torch.randn(V, H, generator=g)
    proj = torch.randn(3, H, H, generator=g) / math.sqrt(H)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[EVEN] = True
    d2t = EVEN - torch.arange(DRAFT_V)  # offsets: target id = draft id + d2t[draft id]
    records = []
    for _ in range(16):
        seq = int(torch.randint(16, 25, (1,), generator=g))  # unequal lengths: the collator pads
        ids = [2 * int(torch.randint(0, DRAFT_V, (1,), generator=g))]
        for _ in range(seq - 1):
            ids.append(int(_next_token(torch.tensor(ids[-1]))))
        ids_t = torch.tensor(ids)
        loss_mask = torch.zeros(seq, dtype=torch.long)
        loss_mask[4:] = 1
        records.append(
            {
                "input_ids": ids_t,
                "loss_mask": loss_mask,
                "hidden_state": (lm_head[_next_token(ids_t)] * 3 / math.sqrt(H))[None],
                "aux_hidden_state": torch.cat([embed[ids_t] @ proj[k] for k in range(3)], dim=-1)[None].to(
                    torch.bfloat16
                ),
            }
        )
    return {"records": records, "embed": embed, "lm_head": lm_head, "t2d": t2d, "d2t": d2t}


@functools.cache
def _trained() -> tuple[dict[str, torch.Tensor], tuple[dict, ...]]:
    task = _task()
    logs: list[dict] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        weights = train_drafter(
            task["records"],
            _draft_config(),
            task["embed"],
            task["lm_head"],
            task["t2d"],
            task["d2t"],
            TrainConfig(steps=STEPS, lr=3e-3, batch_size=4, ttt_length=3, seed=0, max_len=64, log_every=1),
            log=logs.append,
        )
    finally:
        torch.set_num_threads(threads)
    return weights, tuple(logs)


def _random_loss_inputs(
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    b, t, v = 3, 7, 33
    logits = (4 * torch.randn(b, t, v, generator=g)).to(dtype).requires_grad_(True)
    target = torch.softmax(2 * torch.randn(b, t, v, generator=g), dim=-1)
    target[0, -2:] = 1 / v  # the padded rows of _compute_target_p_padded hold the uniform 1/V
    position_mask = (torch.rand(b, t, 1, generator=g) > 0.35).int()  # masked rows included
    position_mask[1] = 0  # one row fully masked
    assert 0 < int(position_mask.sum()) < b * t
    return logits, target, position_mask


def test_loss_substitute_matches_specforge_reference() -> None:
    from specforge.core.loss import _compute_loss  # SpecForge's own torch reference (core/loss.py:14-21)

    logits, target, mask = _random_loss_inputs()
    ours = TorchLogSoftmaxLoss.apply(logits, target, mask)
    (grad_ours,) = torch.autograd.grad(ours, logits)
    ref_logits = logits.detach().clone().requires_grad_(True)
    with torch.compiler.set_stance("force_eager"):  # the reference is @torch.compile'd; its body, run eagerly
        ref = _compute_loss(ref_logits, target, mask)
    (grad_ref,) = torch.autograd.grad(ref, ref_logits)
    assert ours.dtype == torch.float32 and ours.shape == ()
    torch.testing.assert_close(ours, ref, atol=LOSS_ATOL, rtol=0)
    torch.testing.assert_close(grad_ours, grad_ref, atol=LOSS_ATOL, rtol=0)
    assert torch.all(grad_ours[mask.squeeze(-1) == 0] == 0)


def test_loss_substitute_matches_kernel_formulas() -> None:
    """The Triton kernel's own per-row math (core/loss.py:72-110 forward, :140-170 backward), in torch."""
    logits, target, mask = _random_loss_inputs()
    b, t, v = logits.shape
    ours = TorchLogSoftmaxLoss.apply(logits, target, mask)
    grad_out = torch.tensor(0.7)
    (grad_ours,) = torch.autograd.grad(ours, logits, grad_out)

    x = logits.detach().reshape(b * t, v).double()
    p = target.reshape(b * t, v).double()
    keep = mask.reshape(b * t).bool()
    m = x.max(dim=-1, keepdim=True).values
    d = torch.exp(x - m).sum(-1, keepdim=True)
    row = -(p * (x - m - torch.log(d))).sum(-1)
    loss = torch.where(keep, row, 0).mean()  # masked rows stay 0; mean over all B*T rows
    g = grad_out.double() / (b * t)
    grad = -(p * g - torch.exp(x - m) / d * (p * g).sum(-1, keepdim=True))
    grad = torch.where(keep[:, None], grad, 0).reshape(b, t, v)
    torch.testing.assert_close(ours.double(), loss, atol=LOSS_ATOL, rtol=0)
    torch.testing.assert_close(grad_ours.double(), grad, atol=LOSS_ATOL, rtol=0)


def test_loss_substitute_keeps_bf16_gradient_dtype() -> None:
    logits, target, mask = _random_loss_inputs(torch.bfloat16)
    loss = TorchLogSoftmaxLoss.apply(logits, target, mask)
    (grad,) = torch.autograd.grad(loss, logits)
    # the kernel's backward writes the gradient into a buffer of the logits' dtype
    assert loss.dtype == torch.float32 and grad.dtype == torch.bfloat16


def test_substitute_is_installed_only_inside_the_context() -> None:
    import specforge.algorithms.eagle3.model as eagle3_model
    from specforge.core.loss import LogSoftmaxLoss

    assert eagle3_model.LogSoftmaxLoss is LogSoftmaxLoss
    with specforge_cpu():
        assert eagle3_model.LogSoftmaxLoss is TorchLogSoftmaxLoss
    assert eagle3_model.LogSoftmaxLoss is LogSoftmaxLoss
    with pytest.raises(RuntimeError), specforge_cpu():
        raise RuntimeError
    assert eagle3_model.LogSoftmaxLoss is LogSoftmaxLoss


def test_training_learns_the_synthetic_rule() -> None:
    _, logs = _trained()
    assert [entry["step"] for entry in logs] == list(range(1, STEPS + 1))
    assert set(logs[0]) >= {"step", "loss", "acc_0", "acc_1", "acc_2", "lr"}
    first, last = logs[:5], logs[-5:]
    loss_first = sum(e["loss"] for e in first) / 5
    loss_last = sum(e["loss"] for e in last) / 5
    acc_first = sum(e["acc_0"] for e in first) / 5
    acc_last = sum(e["acc_0"] for e in last) / 5
    assert loss_last < 0.8 * loss_first, (loss_first, loss_last)
    assert acc_last > 0.4 > acc_first, (acc_first, acc_last)  # chance is 1/64
    assert acc_last > 20 / DRAFT_V
    # SpecForge's CosineAnnealingWarmupLR, int(0.02 * 30) = 0 warmup steps: the lr logged after each step
    # (as the controller logs it) starts at the base lr and falls to 0 at the last step
    lrs = [e["lr"] for e in logs]
    assert lrs[0] == pytest.approx(3e-3) and lrs[-1] == pytest.approx(0.0, abs=1e-12)
    assert all(a >= b for a, b in itertools.pairwise(lrs))


def test_training_is_deterministic_for_a_seed() -> None:
    task = _task()
    cfg = TrainConfig(steps=3, lr=3e-3, batch_size=4, ttt_length=2, seed=5, max_len=20)
    args = (task["records"], _draft_config(), task["embed"], task["lm_head"], task["t2d"], task["d2t"], cfg)
    torch.manual_seed(123)
    a = train_drafter(*args)
    state = torch.get_rng_state()
    b = train_drafter(*args)
    assert torch.equal(state, torch.get_rng_state())  # the caller's RNG is left alone
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_weights_are_what_specforge_export_writes(tmp_path: Path) -> None:
    """Run SpecForge's own `export_to_sglang` on the weights and compare its model.safetensors."""
    from specforge.export.to_sglang import export_to_sglang

    weights, _ = _trained()
    task = _task()
    assert all(v.dtype == torch.float32 for k, v in weights.items() if k not in ("t2d", "d2t"))
    assert not any("embed" in k for k in weights)
    torch.save({"strategy": "eagle3", "draft_state_dict": weights}, tmp_path / "training_state.pt")
    (tmp_path / "config.json").write_text(json.dumps(_draft_config()))
    out = export_to_sglang(
        str(tmp_path / "training_state.pt"), str(tmp_path / "config.json"), str(tmp_path / "out")
    )
    exported = load_file(str(Path(out) / "model.safetensors"))

    assert exported.keys() == weights.keys()
    for name, tensor in exported.items():
        assert tensor.shape == weights[name].shape, name
    assert torch.equal(exported["t2d"], task["t2d"]) and torch.equal(weights["t2d"], task["t2d"])
    assert torch.equal(exported["d2t"], task["d2t"]) and torch.equal(weights["d2t"], task["d2t"])
    for name, tensor in exported.items():  # the exporter materialises the draft in bfloat16
        if tensor.is_floating_point():
            torch.testing.assert_close(tensor.float(), weights[name], atol=0, rtol=2**-8)
    expected = {
        "fc.weight": (H, 3 * H),
        "norm.weight": (H,),
        "lm_head.weight": (DRAFT_V, H),
        "midlayer.self_attn.q_proj.weight": (4 * 16, 2 * H),
        "midlayer.self_attn.k_proj.weight": (2 * 16, 2 * H),
        "midlayer.self_attn.v_proj.weight": (2 * 16, 2 * H),
        "midlayer.self_attn.o_proj.weight": (H, 4 * 16),
        "midlayer.mlp.gate_proj.weight": (128, H),
        "midlayer.mlp.up_proj.weight": (128, H),
        "midlayer.mlp.down_proj.weight": (H, 128),
        "midlayer.hidden_norm.weight": (H,),
        "midlayer.input_layernorm.weight": (H,),
        "midlayer.post_attention_layernorm.weight": (H,),
        "t2d": (V,),
        "d2t": (DRAFT_V,),
    }
    assert {k: tuple(v.shape) for k, v in weights.items()} == expected
