"""Public MLA EAGLE-3, DFlash and DSpark drafter configs through vLLM's static level and ``explain --engine vllm`` (the configs
and their provenance: tests/unit/data/drafter_families/README.md): vLLM's own EngineArgs and
SpeculativeConfig, its reader and, for DFlash, its own fc-width function, in this interpreter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from public_pairs import explain_in_process

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]
TARGETS = ROOT / "tests" / "serving" / "configs" / "public" / "targets"
DRAFTS = ROOT / "tests" / "unit" / "data" / "drafter_families"


def _deployment(tmp: Path, target: str, draft: dict[str, Any]) -> tuple[Path, Path]:
    (tmp / "target").mkdir()
    (tmp / "draft").mkdir()
    shutil.copy(TARGETS / target, tmp / "target" / "config.json")
    (tmp / "draft" / "config.json").write_text(json.dumps(draft))
    return tmp / "target", tmp / "draft"


def _draft(name: str) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads((DRAFTS / name).read_text())
    return cfg


def _warnings(data: dict[str, Any]) -> list[str]:
    return [n["kind"] for n in data["adapter_notes"] if n["severity"] == "warning"]


def _vllm_minor() -> tuple[int, int]:
    import vllm

    major, minor = str(vllm.__version__).split(".")[:2]
    return int(major), int(minor)


pytestmark = [pytest.mark.vllm, pytest.mark.skipif(_vllm_minor() != (0, 32), reason="read at vLLM 0.32's lines")]


@pytest.mark.parametrize(("ids", "code", "served"), [
    # no ids: the target serves the EAGLE-3 default while fc is sized for the draft's 5 layers (qwen3_dflash.py:108-117)
    (None, 1, ["layer:1", "layer:17", "layer:32"]),
    # dflash ids + 1 (gpu_model_runner.py:5270-5277): id k = layer:k, as SGLang serves them
    ([2, 10, 18, 26, 34], 0, ["layer:2", "layer:10", "layer:18", "layer:26", "layer:34"]),
])
def test_dflash_drafter_on_qwen3_8b(tmp_path: Path, ids: list[int] | None, code: int, served: list[str]) -> None:
    draft = _draft("qwen3_8b_dflash.json")
    draft["dflash_config"]["target_layer_ids"] = ids
    e = explain_in_process(*_deployment(tmp_path, "Qwen--Qwen3-8B.json", draft))
    assert e.exit_code == code, e.summary
    assert e.data["served_sources"] == served
    assert (e.data["drafter_family"], e.data["speculative_algorithm"]) == ("dflash", "dflash")
    assert e.data["fc_in_features"] == 5 * 4096
    assert ("default_ids_fallback" in _warnings(e.data)) is (ids is None)
    assert "VLLM_KIMI_K3_AUX_ATTN_RES_STREAM" in e.data["aux_env"]  # the switch as vLLM reads it, not read here
    assert e.data["aux_env"]["VLLM_KIMI_K3_AUX_ATTN_RES_STREAM"]["applies"] is False


def test_torchspec_mla_head_is_refused_by_vllm_itself(tmp_path: Path) -> None:
    # vLLM rewrites a deepseek_v3 draft to DeepSeekMTPModel (config/speculative.py:679-693), then EAGLE-3 prefixes it
    # (transformers_utils/configs/eagle.py:55-64): `vllm serve` refuses it the same way
    e = explain_in_process(*_deployment(tmp_path, "Qwen--Qwen3-8B.json", _draft("qwen3_8b_eagle3_mla.json")))
    assert e.exit_code == 1 and "Eagle3DeepSeekMTPModel" in e.summary, e.summary


def test_kimi_mla_eagle3_head_on_kimi_k25(tmp_path: Path) -> None:
    e = explain_in_process(*_deployment(tmp_path, "moonshotai--Kimi-K2.5.json", _draft("kimi_k25_eagle3_moe.json")))
    assert e.exit_code == 0, e.summary
    # vLLM reads the nested ids as boundaries, no +1 (one layer earlier than SGLang serves them), and says so
    assert e.data["served_sources"] == ["layer:0", "layer:28", "layer:56"]
    assert (e.data["drafter_family"], e.data["speculative_algorithm"]) == ("eagle3-mla", "eagle3")
    assert e.data["fc_in_features"] == 3 * 7168  # deepseek_eagle3.py:189-209
    assert _warnings(e.data) == ["speculative_algorithm_assumed", "engine_convention_mismatch"]


def test_dspark_static_is_refused_by_name_where_vllm_has_no_triton(tmp_path: Path) -> None:
    # vLLM implements DSpark only in its V2 model runner (config/vllm.py:2976-2979), which needs Triton
    # (:724-728); this CPU build has none, so vLLM takes V1 and refuses the deployment (:3198-3203)
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON:
        pytest.skip("this vLLM has Triton: its V2 runner resolves DSpark")
    e = explain_in_process(*_deployment(tmp_path, "Qwen--Qwen3-8B.json", _draft("dspark_qwen3_8b_block7.json")))
    assert e.exit_code == 3, e.summary
    assert "DSpark only on its V2 model runner" in e.summary and "config/vllm.py:2976-2979" in e.summary

