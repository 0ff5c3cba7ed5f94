"""Public MLA EAGLE-3, DFlash and DSpark drafter configs through SGLang 0.5.23's static level and ``explain``:
the real target and draft classes built on the meta device, SGLang's own id readers and setters
(tests/unit/data/drafter_families/README.md: the configs and their provenance).

In-process like test_static_public_configs.py (one one-rank world per process)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from meta_static import SKIP, make_0523_adapter

if SKIP:
    pytest.skip(SKIP, allow_module_level=True)

from specparity.serving import ResolvedDeployment
from specparity.serving.sglang.adapter import WorkerRequest
from specparity.serving.sglang.explain import explain_failure, explain_resolved
from specparity.serving.sglang.since_0_5_11.static import resolve_static

pytestmark = pytest.mark.sglang
ADAPTER = make_0523_adapter()
ROOT = Path(__file__).resolve().parents[2]
TARGETS = ROOT / "tests" / "serving" / "configs" / "public" / "targets"
DRAFTS = ROOT / "tests" / "unit" / "data" / "drafter_families"


def _request(tmp: Path, target: str, draft: dict[str, Any], **server_args: object) -> WorkerRequest:
    (tmp / "target").mkdir()
    (tmp / "draft").mkdir()
    shutil.copy(TARGETS / target, tmp / "target" / "config.json")
    (tmp / "draft" / "config.json").write_text(json.dumps(draft))
    return WorkerRequest(op="resolve", target=str(tmp / "target"), draft=str(tmp / "draft"), server_args=server_args)


def _draft(name: str) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads((DRAFTS / name).read_text())
    return cfg


def _warnings(data: dict[str, Any]) -> list[str]:
    return [n["kind"] for n in data["adapter_notes"] if n["severity"] == "warning"]


def test_kimi_mla_eagle3_head_on_kimi_k25(tmp_path: Path) -> None:
    r = resolve_static(ADAPTER, _request(tmp_path, "moonshotai--Kimi-K2.5.json", _draft("kimi_k25_eagle3_moe.json")))
    assert isinstance(r, ResolvedDeployment), r  # no crash of ours on the ColumnParallelLinear fc
    assert r.draft_model_class == "Eagle3DeepseekV2ForCausalLM" and r.drafter_family == "eagle3-mla"
    assert r.served_sources == ("layer:1", "layer:29", "layer:57")  # first id 1: +1 (models/deepseek_v2.py)
    assert r.draft_fc_module == (3 * 7168, 7168, False)  # models/kimi_k25_eagle3.py:208-219, as SGLang built it
    assert (r.resolved_spec.num_steps, r.resolved_spec.eagle_topk, r.resolved_spec.num_draft_tokens) == (3, 1, 4)
    e = explain_resolved(r)
    assert e.exit_code == 0, e.summary
    assert "family   MLA EAGLE-3 head (DeepSeek-style attention), served as EAGLE3" in e.lines
    assert _warnings(e.data) == ["speculative_algorithm_assumed"]  # --strict names it


def test_torchspec_mla_head_is_refused_by_sglang_itself(tmp_path: Path) -> None:
    r = resolve_static(ADAPTER, _request(tmp_path, "Qwen--Qwen3-8B.json", _draft("qwen3_8b_eagle3_mla.json")))
    assert not isinstance(r, ResolvedDeployment), r
    assert r.kind == "sglang_exception" and "'DeepSeekForCausalLMEagle3' is not a registered model" in r.message
    assert "in_features" not in r.message  # never our own crash told as SGLang's verdict
    assert explain_failure(r).exit_code == 1


@pytest.mark.parametrize(("ids", "served", "fallback"), [
    (None, ["layer:1", "layer:9", "layer:17", "layer:25", "layer:33"], True),  # build_target_layer_ids(36, 5)
    ([2, 10, 18, 26, 34], ["layer:2", "layer:10", "layer:18", "layer:26", "layer:34"], False),
])
def test_dflash_drafter_on_qwen3_8b(tmp_path: Path, ids: list[int] | None, served: list[str], fallback: bool) -> None:
    draft = _draft("qwen3_8b_dflash.json")
    draft["dflash_config"]["target_layer_ids"] = ids
    r = resolve_static(ADAPTER, _request(tmp_path, "Qwen--Qwen3-8B.json", draft))
    assert isinstance(r, ResolvedDeployment), r
    assert (r.drafter_family, r.speculative_algorithm, r.draft_model_class) == ("dflash", "DFLASH", "DFlashDraftModel")
    assert list(r.served_sources) == served and r.block_size == 16
    assert list(r.layers_to_capture) == [int(s.split(":")[1]) + 1 for s in served]  # set_dflash_layers_to_capture
    assert r.draft_fc_module == (5 * 4096, 4096, False) and r.num_aux_hidden_states == 5
    assert r.capture_rule_source and r.capture_rule_source[-1][0].endswith("set_dflash_layers_to_capture")
    assert (r.resolved_spec.num_steps, r.resolved_spec.num_draft_tokens) == (1, 16)  # _handle_dflash's rewrite
    e = explain_resolved(r)
    assert e.exit_code == 0, e.summary
    assert ("default_ids_fallback" in _warnings(e.data)) is fallback
    assert e.data["drafter_family"] == "dflash" and e.data["block_size"] == 16


@pytest.mark.parametrize(("ids", "fallback"), [
    ([1, 9, 17, 25, 33], False),  # as published
    (None, True),  # no ids: DFlash's build_target_layer_ids(36, 5), which SGLang's DSpark path keeps
    ([2, 10, 18, 26, 34], False),  # ids other than the default, so that a default served in their place shows
])
def test_dspark_drafter_on_qwen3_8b(tmp_path: Path, ids: list[int] | None, fallback: bool) -> None:
    draft = _draft("dspark_qwen3_8b_block7.json")
    if ids is None:
        del draft["target_layer_ids"]
    else:
        draft["target_layer_ids"] = ids
    r = resolve_static(ADAPTER, _request(tmp_path, "Qwen--Qwen3-8B.json", draft))
    assert isinstance(r, ResolvedDeployment), r
    assert (r.drafter_family, r.speculative_algorithm, r.draft_model_class) == ("dspark", "DSPARK", "Qwen3DSparkModel")
    served = [f"layer:{i}" for i in (ids or [1, 9, 17, 25, 33])]
    assert list(r.served_sources) == served  # id k = layer:k
    # Qwen3 has no set_dspark_layers_to_capture: SGLang calls its DFlash setter, +1 (attention_backend_setup.py:62-66)
    assert list(r.layers_to_capture) == [int(s.split(":")[1]) + 1 for s in served]
    assert r.capture_rule_source and r.capture_rule_source[-1][0].endswith("set_dflash_layers_to_capture")
    assert r.draft_fc_module == (5 * 4096, 4096, False) and r.num_aux_hidden_states == 5
    assert r.block_size == 7  # gamma; _handle_dspark serves gamma + 1 draft tokens
    assert (r.resolved_spec.num_steps, r.resolved_spec.eagle_topk, r.resolved_spec.num_draft_tokens) == (1, 1, 8)
    assert r.draft_vocab_size == 151936  # the target's lm_head
    e = explain_resolved(r)
    assert e.exit_code == 0, e.summary
    assert "family   DSpark, served as DSPARK" in e.lines
    assert _warnings(e.data) == ["speculative_algorithm_assumed"] + (["default_ids_fallback"] if fallback else [])
    assert e.data["drafter_family"] == "dspark" and e.data["block_size"] == 7
    if not fallback:
        assert any("from draft config.json: target_layer_ids" in line for line in e.lines), e.lines


def test_dspark_over_a_target_with_its_own_dspark_setter_is_refused_by_name(tmp_path: Path) -> None:
    """SGLang calls such a target's own set_dspark_layers_to_capture (attention_backend_setup.py:63-64), which stores
    the ids where the read-back does not look: exit 3 naming it, never an answer read as for DFlash's setter."""
    from static_configs import target_config

    (tmp_path / "target").mkdir()
    (tmp_path / "draft").mkdir()
    (tmp_path / "target" / "config.json").write_text(
        json.dumps(target_config("MiniMaxM3SparseForConditionalGeneration")))
    draft = _draft("dspark_qwen3_8b_block7.json")
    draft["target_layer_ids"] = [1, 2, 3]
    (tmp_path / "draft" / "config.json").write_text(json.dumps(draft))
    r = resolve_static(ADAPTER, WorkerRequest(op="resolve", target=str(tmp_path / "target"),
                                              draft=str(tmp_path / "draft"), server_args={}))
    assert not isinstance(r, ResolvedDeployment), r
    assert r.kind == "unsupported_version", r
    assert "MiniMaxM3SparseForConditionalGeneration has its own set_dspark_layers_to_capture" in r.message
    assert "attention_backend_setup.py:63-64" in r.message
    assert explain_failure(r).exit_code == 3
