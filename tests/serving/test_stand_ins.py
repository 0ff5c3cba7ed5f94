"""Every stand-in is recorded, bounded, and listed in the reports (docs/development.md "Stand-ins")."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from specparity.serving import stand_ins
from specparity.serving.results import ResolvedDeployment, ServingFailure, SpecSettings

STUB_DIR = Path(__file__).resolve().parents[2] / "src" / "specparity" / "serving" / "sglang" / "kernel_stub"


def _deployment() -> ResolvedDeployment:
    spec = SpecSettings(3, 1, 4)
    return ResolvedDeployment(
        engine_version="0.5.23", adapter="sglang-0.5.23", target_path="/t", draft_path="/d", device="cpu",
        target_architecture="LlamaForCausalLM", num_layers=8, target_hidden_size=64, target_vocab_size=512,
        target_dtype="float32", draft_architecture="LlamaForCausalLMEagle3", draft_hidden_size=64,
        draft_vocab_size=256, requested_spec=spec, resolved_spec=spec, spec_warnings=(), draft_config_ids=(1, 3, 5),
        ids_fallback_reason=None, layers_to_capture=(2, 4, 6), served_sources=("layer:1", "layer:3", "layer:5"),
        fc_in_features=192, fc_out_features=64, fc_bias=False, num_aux_hidden_states=3, fc_applied=True,
        norm_before_fc=False, fc_norm=False, norm_output=False, fc_bias_in_config=False, server_args={}, timings={})


def test_kv_copy_stand_in_refuses_a_real_move() -> None:
    """Before: any slots were memmoved by the stand-in; now only the warm-up copy of slots onto themselves."""
    code = f"""
import sys; sys.path.insert(0, {str(STUB_DIR)!r})
import torch, sgl_kernel
kv = torch.arange(8, dtype=torch.float32).reshape(4, 2)
ptrs, strides = torch.tensor([kv.data_ptr()]), torch.tensor([kv.stride(0) * kv.element_size()])
sgl_kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([0]), torch.tensor([0]))
try:
    sgl_kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([1]), torch.tensor([2]))
    print("MOVED", kv.tolist())
except NotImplementedError as e:
    print("REFUSED", "(2, 1)" in str(e), kv.tolist() == torch.arange(8.).reshape(4, 2).tolist(), sgl_kernel.CALLED)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "REFUSED True True ['copy_all_layer_kv_cache_cpu', 'copy_all_layer_kv_cache_cpu']", out


def _fake_stub(monkeypatch: pytest.MonkeyPatch, calls: list[str]) -> None:
    stub = types.ModuleType("sgl_kernel")
    stub.SPECPARITY_STUB = True  # type: ignore[attr-defined]
    stub.CALLED = calls  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sgl_kernel", stub)


def test_a_stand_in_call_outside_the_allowlist_is_an_environment_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    from specparity.serving.sglang.worker import with_environment

    _fake_stub(monkeypatch, ["copy_all_layer_kv_cache_cpu", "ops.rmsnorm_cpu"])
    got = with_environment(_deployment(), "cpu")
    assert isinstance(got, ServingFailure) and got.kind == "sglang_exception"
    assert "ops.rmsnorm_cpu" in got.message and "allowlist" in got.message


def test_active_stand_ins_ride_on_the_deployment_into_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    from specparity.report.terminal import environment_lines
    from specparity.serving.sglang.worker import with_environment
    from specparity.verdict import Verdict

    _fake_stub(monkeypatch, ["copy_all_layer_kv_cache_cpu"] * 3)
    monkeypatch.setattr(stand_ins, "_ACTIVE", [stand_ins.CUDA_SYNC_NOOP])
    dep = with_environment(_deployment(), "cpu")
    assert isinstance(dep, ResolvedDeployment)
    assert dep.stand_ins == (f"{stand_ins.SGL_KERNEL}: calls copy_all_layer_kv_cache_cpu", stand_ins.CUDA_SYNC_NOOP)
    assert (dep.environment["device"] == "cpu" and dep.environment["torch"] == torch.__version__.split("+")[0]) \
        or dep.environment["torch"] == torch.__version__
    assert ResolvedDeployment.from_dict(dep.to_dict()).stand_ins == dep.stand_ins  # crosses the process boundary
    v = Verdict(contract_name="c", contract_hash=None, level="static", status="pass", engine_version="0.5.23",
                target_architecture="LlamaForCausalLM", draft_path="/d", expected_layout=[], served_layout=None,
                environment=dep.environment, stand_ins=dep.stand_ins)
    assert v.to_dict()["stand_ins"] == list(dep.stand_ins)
    [measured, listed] = environment_lines(v)
    assert measured.startswith("Measured with: sglang ") and "device cpu" in measured
    assert listed.startswith("Stand-ins active: sgl_kernel import stand-in") and "torch.cuda" in listed


class _Worker:
    def __init__(self, error: Exception | None) -> None:
        self.error, self.calls = error, 0
        self.draft_worker = types.SimpleNamespace(draft_worker=self)

    def init_attention_backends(self) -> None:
        self.calls += 1
        if self.error is not None and self.calls == 1:
            raise self.error


def test_draft_attention_fallback_only_for_the_missing_eagle_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: any ValueError from the spec worker's backends was swallowed; now only SGLang's 'EAGLE is not
    supported' (speculative/draft_utils.py:64) falls back, and the fallback is recorded."""
    from specparity.serving.sglang.since_0_5_11.run import init_draft_attention

    monkeypatch.setattr(stand_ins, "_ACTIVE", [])
    w = _Worker(ValueError("EAGLE is not supported in decode attention backend torch_native"))
    init_draft_attention(w)
    assert w.calls == 2 and stand_ins.active()[0].startswith(stand_ins.DRAFT_ATTENTION_FALLBACK)
    other = _Worker(ValueError("page_size must divide the context length"))
    with pytest.raises(ValueError, match="page_size"):
        init_draft_attention(other)
    ok = _Worker(None)
    init_draft_attention(ok)
    assert ok.calls == 1


def test_cuda_sync_noop_is_scoped_restored_and_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    from specparity.serving.sglang.run_common import _cuda_sync_noop_on_cpu

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the patch is not applied there")  # never on this project's CPUs
    monkeypatch.setattr(stand_ins, "_ACTIVE", [])
    before: tuple[Any, Any] = (torch.cuda.empty_cache, torch.cuda.synchronize)
    with _cuda_sync_noop_on_cpu():
        assert torch.cuda.synchronize() is None and torch.cuda.empty_cache() is None
        assert torch.cuda.synchronize is not before[1]
    assert (torch.cuda.empty_cache, torch.cuda.synchronize) == before
    assert stand_ins.active() == (stand_ins.CUDA_SYNC_NOOP,)
