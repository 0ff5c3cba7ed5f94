"""The target's load measured around the model's own ``load_weights`` (serving/sglang/load_check.py), on plain torch
modules standing for an engine's model class: what was never loaded, what was skipped, and that the measurement
leaves the model exactly as the loader made it. The real SGLang load: tests/serving/test_real_class_capture.py."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import pytest
import torch

from specparity.serving.results import ResolvedDeployment
from specparity.serving.sglang.load_check import TargetLoadWatch


def _copy(param: torch.Tensor, loaded: torch.Tensor) -> None:
    param.data.copy_(loaded)


class _Model(torch.nn.Module):
    """Two linears and a tied embedding/head; ``load_weights`` skips names it has no parameter for, as SGLang's do."""

    def __init__(self, *, dtype: torch.dtype = torch.float32, loaders: bool = True) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4, dtype=dtype)
        self.b = torch.nn.Linear(4, 4, bias=False, dtype=dtype)
        self.emb = torch.nn.Embedding(6, 4, dtype=dtype)
        self.head = torch.nn.Linear(4, 6, bias=False, dtype=dtype)
        self.head.weight = self.emb.weight
        self.register_buffer("buf", torch.full((3,), 7.0))
        self.loaders = loaders
        for p in self.parameters():
            if loaders:
                p.weight_loader = _copy  # type: ignore[attr-defined]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> str:
        params = dict(self.named_parameters())
        for name, w in weights:
            if name not in params:
                continue
            if self.loaders:
                params[name].weight_loader(params[name], w)  # type: ignore[operator]
            else:
                params[name].data.copy_(w)
        return "done"


def _load(model: _Model, checkpoint: list[tuple[str, torch.Tensor]]) -> dict[str, Any]:
    watch = TargetLoadWatch()
    watch.instrument(model)
    assert model.load_weights(iter(checkpoint)) == "done"
    assert "load_weights" not in vars(model)  # later calls are the model's own
    assert watch.record is not None
    return watch.record


def test_a_parameter_no_tensor_reaches_is_never_loaded_and_keeps_what_the_engine_built() -> None:
    model = _Model()
    built = model.b.weight.detach().clone()
    rec = _load(model, [("a.weight", torch.ones(4, 4)), ("a.bias", torch.zeros(4)), ("emb.weight", torch.ones(6, 4)),
                        ("dense.up_proj.weight", torch.ones(8, 4))])
    assert rec["never_loaded"] == ["b.weight"] and rec["never_loaded_count"] == 1
    assert rec["skipped"] == ["dense.up_proj.weight"] and rec["skipped_count"] == 1
    assert (rec["parameters"], rec["parameters_checked"], rec["checkpoint_tensors"]) == (4, 4, 4)
    assert rec["function"] == "_Model.load_weights" and rec["engine_file_line"].endswith(
        f"test_target_load.py:{inspect.getsourcelines(_Model.load_weights)[1]}")
    assert rec["modules"][0].startswith("b (Linear, ")
    assert torch.equal(model.b.weight, built)  # the sentinel is gone: the model is the loader's
    assert torch.equal(model.buf, torch.full((3,), 7.0))  # buffers are not touched
    assert torch.equal(model.head.weight, torch.ones(6, 4))  # tied: loaded through the embedding


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_a_whole_load_is_whole_and_a_nan_the_checkpoint_holds_is_loaded(dtype: torch.dtype) -> None:
    model = _Model(dtype=dtype)
    nan = torch.full((4,), float("nan"))
    rec = _load(model, [("a.weight", torch.ones(4, 4)), ("a.bias", nan), ("b.weight", torch.ones(4, 4)),
                        ("emb.weight", torch.ones(6, 4))])
    assert (rec["never_loaded_count"], rec["partly_loaded_count"], rec["skipped"]) == (0, 0, []), rec
    assert torch.isnan(model.a.bias).all()  # the checkpoint's own NaN is kept, never taken for the sentinel


def test_a_part_no_tensor_reaches_is_put_back() -> None:
    class _Half(_Model):
        def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> str:
            for name, w in weights:
                if name == "b.weight":
                    self.b.weight.weight_loader(self.b.weight[:2], w[:2])  # type: ignore[operator]
            return "done"

    model = _Half()
    built = model.b.weight.detach().clone()
    rec = _load(model, [("b.weight", torch.ones(4, 4))])
    assert rec["partly_loaded"] == ["b.weight"] and "b.weight" not in rec["never_loaded"]
    assert torch.equal(model.b.weight[:2], torch.ones(2, 4)) and torch.equal(model.b.weight[2:], built[2:])


def test_skipped_tensors_are_not_claimed_when_a_parameter_was_loaded_without_a_weight_loader() -> None:
    rec = _load(_Model(loaders=False), [("a.weight", torch.ones(4, 4)), ("extra", torch.ones(1))])
    assert rec["skipped"] is None and rec["skipped_count"] is None
    assert "b.weight" in rec["never_loaded"]


def test_the_record_travels_on_the_deployment() -> None:
    rec = _load(_Model(), [("a.weight", torch.ones(4, 4))])
    dep = ResolvedDeployment.from_dict({**_deployment().to_dict(), "target_load": rec})
    assert ResolvedDeployment.from_dict(dep.to_dict()).target_load == rec
    assert _deployment().target_load == {}  # older children: not measured


def _deployment() -> ResolvedDeployment:
    from specparity.serving.results import SpecSettings

    spec = SpecSettings(None, None, None)
    return ResolvedDeployment(
        engine_version="0.5.23", adapter="x", target_path="t", draft_path="d", device="cpu",
        target_architecture="Qwen3MoeForCausalLM", num_layers=8, target_hidden_size=64, target_vocab_size=512,
        target_dtype="float32", draft_architecture="LlamaForCausalLMEagle3", draft_hidden_size=64,
        draft_vocab_size=None, requested_spec=spec, resolved_spec=spec, spec_warnings=(), draft_config_ids=(1, 3, 5),
        ids_fallback_reason=None, layers_to_capture=(2, 4, 6), served_sources=("layer:1", "layer:3", "layer:5"),
        fc_in_features=192, fc_out_features=64, fc_bias=False, num_aux_hidden_states=3, fc_applied=True,
        norm_before_fc=False, fc_norm=False, norm_output=False, fc_bias_in_config=False, server_args={}, timings={})
