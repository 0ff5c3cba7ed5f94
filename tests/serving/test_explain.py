"""``specparity explain`` end to end: real SGLang in the child, real classes on the meta device, no contract.

The 61-layer Kimi-K2.5 target (moonshotai/Kimi-K2.5's hub config.json, verbatim: tests/serving/configs/public,
sources in its SOURCES.json; DeepSeek-V3 text model, H=7168) with
draft ids [2, 30, 58] is the seed incident's shape: sglang 0.5.23's DeepSeek rule reads the ids raw because
the first id is not 1 (models/deepseek_v2.py:3458-3473), so fc is fed layer:1, layer:29, layer:57.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from packaging.version import Version
from setter_sources import cited, installed_setters
from version_facts import SGLANG_VERSION, installed_facts

from specparity.cli import main
from specparity.idrules import sglang
from specparity.idrules.sglang import SGLangCapturePlan

pytestmark = pytest.mark.sglang

# Family B and older (sglang < 0.5.11, transformers <= 4.57) have no Kimi-K2.5 or Qwen3.5 model: there the
# expected answer is SGLang's own refusal (exit 1), and a speculators draft is refused by transformers'
# config reader before specparity's draft_unreadable check (which reads 0.5.23's static path) can name it.
NEW_ARCHS = SGLANG_VERSION is not None and Version(SGLANG_VERSION) >= Version("0.5.11")
# Kimi-K2.5 (KimiK25ForConditionalGeneration) is registered by the matrix's 0.5.10 as well (family B's last env);
# 0.5.3 and older refuse its model_type
HAS_KIMI_K25 = SGLANG_VERSION is not None and Version(SGLANG_VERSION) >= Version("0.5.10")


# What an SGLang without the architecture says (serving/sglang/engine_messages.unknown_architecture_failure, on every
# version, before transformers' own words: for Kimi-K2.5's hub config with its auto_map those are "contains
# custom code which must be executed"); a draft config with no model_type at all is "Unrecognized model".
UNKNOWN_ARCH = ("does not recognize this architecture", "Unrecognized model")


def qwen35_refused_here(code: int, text: str) -> bool:
    """Where the installed SGLang itself refuses speculative decoding on Qwen3.5 with the default server args."""
    refusal = installed_facts().qwen35_refusal
    if refusal is None:
        return False
    assert code == 1 and refusal in text, text
    return True


def assert_refused_as_unknown(code: int, text: str) -> None:
    """What an SGLang without the architecture says: exit 1 with transformers' own message."""
    assert code == 1, text
    assert any(m in text for m in UNKNOWN_ARCH), text


def qwen35_needs_the_absent_gpu(code: int, text: str, data: dict[str, object]) -> bool:
    """Families C/D build Qwen3.5's gated-delta-net norm on ``current_device()`` (version_facts): with no GPU here
    that is exit 3 with a needs_hardware note naming SGLang's line, and nothing about the deployment is judged.
    Returns True when that is the installed version's expected answer (and checks it), False otherwise."""
    import torch

    asks = installed_facts().qwen35_asks_gpu_at
    if asks is None or torch.cuda.is_available():
        return False
    assert code == 3, text
    assert data["error"]["kind"] == "needs_hardware", text  # type: ignore[index]
    assert asks.removeprefix("sglang/srt/models/") in text and "Traceback" not in text, text
    return True


REPO = Path(__file__).resolve().parents[2]
CONFIGS = Path(__file__).resolve().parent / "configs"
DEFAULT = REPO / "fixtures" / "default"
KIMI_K25 = "public/targets/moonshotai--Kimi-K2.5.json"
QWEN35_MOE = "public/targets/Qwen--Qwen3.5-35B-A3B.json"
DEEPSEEK_V32 = "public/targets/deepseek-ai--DeepSeek-V3.2.json"


def eagle3_draft(hidden: int, vocab: int, ids: list[int] | None) -> dict[str, object]:
    """A SpecForge-style LlamaForCausalLMEagle3 draft config (SpecForge configs/*-eagle3.json field names)."""
    cfg: dict[str, object] = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": hidden, "intermediate_size": 4 * hidden, "max_position_embeddings": 4096,
        "num_attention_heads": max(1, hidden // 128), "num_key_value_heads": max(1, hidden // 1024),
        "num_hidden_layers": 1, "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "vocab_size": vocab, "draft_vocab_size": 32000,
    }
    if ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
    return cfg


def deployment(root: Path, target_config: str, draft: dict[str, object]) -> tuple[Path, Path]:
    (root / "target").mkdir(parents=True)
    (root / "draft").mkdir()
    shutil.copy(CONFIGS / target_config, root / "target" / "config.json")
    (root / "draft" / "config.json").write_text(json.dumps(draft))
    return root / "target", root / "draft"


def run_explain(tmp_path: Path, target: Path, draft: Path, *args: str) -> tuple[int, str, dict[str, object]]:
    out = tmp_path / "explain.json"
    r = CliRunner().invoke(main, ["explain", "--target", str(target), "--draft", str(draft), "--json", str(out),
                                  *args])
    return r.exit_code, r.output, json.loads(out.read_text()) if out.is_file() else {}


def explain_qwen35(tmp_path: Path, draft: dict[str, object]) -> tuple[int, str, dict[str, object]] | None:
    """``explain`` on Qwen3.5-MoE (40 layers, H=2048) with ``draft``; None where the installed SGLang answers before
    the deployment is judged (its own refusal, no such architecture, the absent GPU), each answer checked here."""
    target, draft_dir = deployment(tmp_path, QWEN35_MOE, draft)
    code, text, data = run_explain(tmp_path, target, draft_dir)
    if qwen35_refused_here(code, text):
        return None
    if not NEW_ARCHS:
        assert_refused_as_unknown(code, text)
        return None
    if qwen35_needs_the_absent_gpu(code, text, data):
        return None
    return code, text, data


def test_kimi_k25_61_layers_ids_2_30_58_serve_layers_1_29_57(tmp_path: Path) -> None:
    target, draft = deployment(tmp_path, KIMI_K25, eagle3_draft(7168, 163840, [2, 30, 58]))
    code, text, data = run_explain(tmp_path, target, draft, "--sglang-arg", "tp_size=8")
    if not HAS_KIMI_K25:
        assert_refused_as_unknown(code, text)
        return
    errors = {n["kind"] for n in data["adapter_notes"] if n["severity"] == "error"}  # type: ignore[attr-defined]
    if installed_facts().graph_ids_hazard:  # family B (0.5.10): graphs capture the default [1, 29, 57] (D3)
        assert code == 1 and errors == {"cuda_graph_ids_hazard"}, text
    else:
        assert code == 0 and not errors, text
    # the wrapper delegates to its DeepSeek-V3 language model (models/kimi_k25.py:928-939): resolved on the object
    # SGLang builds, never on a hand-built one (0.5.10 included, family B's meta-device build)
    plan = sglang.capture_plan([2, 30, 58], num_layers=61, architecture="KimiK25ForConditionalGeneration",
                               version=str(SGLANG_VERSION))
    assert tuple(data["served_sources"]) == plan.served_sources  # type: ignore[arg-type]
    assert tuple(data["layers_to_capture"]) == plan.layers_to_capture  # type: ignore[arg-type]
    assert data["capture_owner"] == "language_model.model", data
    assert data["target_architecture"] == "KimiK25ForConditionalGeneration" and data["num_layers"] == 61
    assert data["draft_ids"] == [2, 30, 58] and data["ids_fallback"] is None
    assert data["ids_source"] == "draft config.json: eagle_config.eagle_aux_hidden_state_layer_ids"
    assert data["fc_in_features"] == 3 * 7168
    if NEW_ARCHS:  # the DeepSeek rule of 0.5.13+ reads ids whose first is not 1 raw: the seed incident's figures
        assert data["served_sources"] == ["layer:1", "layer:29", "layer:57"]
        assert data["layers_to_capture"] == [2, 30, 58]
    # the rule quoted is this release's own: the wrapper's setter, then the DeepSeek setter it delegates to, with the
    # file, lines and code inspect reads from the installed sglang (0.5.23 kimi_k25.py:928-939, deepseek_v2.py:3458-3473)
    wrapper, rule = installed_setters(("sglang.srt.models.kimi_k25", "KimiK25ForConditionalGeneration"),
                                      ("sglang.srt.models.deepseek_v2", "DeepseekV3ForCausalLM"))
    assert f"sglang {SGLANG_VERSION} {cited(wrapper)} delegates to {cited(rule)}" in text, text
    assert data["convention"]["sources"] == [{**wrapper, "role": "delegates"}, {**rule, "role": "rule"}]  # type: ignore[index]
    for key in ("engine", "engine_version", "resolved_spec"):
        assert key in data


def _bundled_plan(ids: list[int]) -> SGLangCapturePlan:
    """What the installed SGLang does with ``ids`` on the bundled 8-layer llama target."""
    return sglang.capture_plan(ids, num_layers=8, architecture="LlamaForCausalLM", version=str(SGLANG_VERSION))


def test_speculators_draft_is_refused_with_how_to_convert(tmp_path: Path) -> None:
    spec_draft = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                  "eagle_aux_hidden_state_layer_ids": [2, 4, 6], "transformer_layer_config": {"model_type": "llama"}}
    code, text, data = run_explain(tmp_path, DEFAULT / "target", _draft_dir(tmp_path, spec_draft))
    if not NEW_ARCHS:
        assert_refused_as_unknown(code, text)
        return
    assert code == 1, text
    assert "model_type is missing" in text and "speculators" in text
    assert "LlamaForCausalLMEagle3" in text and "eagle_config" in text and "[1, 3, 5]" in text
    assert data["error"]["kind"] == "draft_unreadable"  # type: ignore[index]


def test_missing_config_is_exit_2(tmp_path: Path) -> None:
    code, text, _ = run_explain(tmp_path, tmp_path, DEFAULT / "draft")
    assert code == 2 and "no config.json" in text


def _draft_dir(tmp_path: Path, cfg: dict[str, object]) -> Path:
    d = tmp_path / "spec_draft"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


# ------------------------------------------------------------------------------ contract from-config + static gate
def _from_config(tmp_path: Path, draft: Path, target: Path, *args: str) -> Path:
    out = tmp_path / "from-config.json"
    r = CliRunner().invoke(main, ["contract", "from-config", "--draft", str(draft), "--target", str(target),
                                  "--trainer", "specforge", "-o", str(out), *args])
    assert r.exit_code == 0, r.output
    return out


def _gate_static(contract: Path, target: Path, draft: Path, tmp_path: Path) -> tuple[int, str, dict[str, object]]:
    report = tmp_path / "report.json"
    r = CliRunner().invoke(main, ["gate", "--contract", str(contract), "--target", str(target), "--draft", str(draft),
                                  "--level", "static", "--json", str(report)])
    return r.exit_code, r.output, json.loads(report.read_text()) if report.is_file() else {}


def test_from_config_contract_gets_the_static_verdict_and_says_it_is_assumed(tmp_path: Path) -> None:
    """A pass where the ids are read. Family A serves layer:1,3,4 whatever the config says (D1) and builds fc
    with a bias the checkpoint lacks (D4): the same contract fails there (exit 1), with both findings."""
    contract = _from_config(tmp_path, DEFAULT / "draft", DEFAULT / "target", "--trainer-sglang-version", "0.5.23")
    code, text, report = _gate_static(contract, DEFAULT / "target", DEFAULT / "draft", tmp_path)
    assert "layout_assumed" in text and "assumed, not recorded" in text
    findings: list[dict[str, str]] = report["findings"]  # type: ignore[assignment]
    assert any(f["kind"] == "layout_assumed" for f in findings)
    plan = _bundled_plan([1, 3, 5])
    assert report["served_layout"] == list(plan.served_sources)
    if installed_facts().graph_ids_hazard:  # family B on CUDA with graphs (D3): decode would feed [1, 3, 4]
        assert code == 1 and {f["kind"] for f in findings if f["severity"] == "error"} == {"cuda_graph_ids_hazard"}
        return
    if not plan.used_default:
        assert code == 0, text
        return
    assert code == 1 and report["verdict"] == "fail", text
    errors = [f for f in findings if f["severity"] == "error"]
    assert {"draft_ids_ignored", "off_by_one"} <= {f["kind"] for f in errors}, errors
    assert any(f["kind"] == "config_mismatch" and "fc.bias" in f["message"] for f in errors), errors


def test_kimi_drafter_trained_before_0_5_13_fails_the_static_gate_on_0_5_23(tmp_path: Path) -> None:
    """The seed incident's shape: ids [2, 30, 58] captured by SpecForge on sglang 0.5.12 mean layer:{2,30,58};
    0.5.23 serves the same config as layer:{1,29,57}."""
    target, draft = deployment(tmp_path, KIMI_K25, eagle3_draft(7168, 163840, [2, 30, 58]))
    contract = _from_config(tmp_path, draft, target, "--trainer-sglang-version", "0.5.12")
    assert json.loads(contract.read_text())["fc_input"]["sources"] == ["layer:2", "layer:30", "layer:58"]
    code, text, report = _gate_static(contract, target, draft, tmp_path)
    if not HAS_KIMI_K25:
        assert code == 1 and any(m in text for m in UNKNOWN_ARCH), text
        return
    plan = sglang.capture_plan([2, 30, 58], num_layers=61, architecture="KimiK25ForConditionalGeneration",
                               version=str(SGLANG_VERSION))
    if not NEW_ARCHS:  # before 0.5.13 SGLang serves these ids as the trainer's 0.5.12 captured them (eager)...
        assert plan.served_sources == ("layer:2", "layer:30", "layer:58"), plan
        assert report["served_layout"] == ["layer:2", "layer:30", "layer:58"], text
        # ...but 0.5.10's CUDA graphs capture the default ids [1, 29, 57] (D3): the static verdict says so
        assert installed_facts().graph_ids_hazard and code == 1, text
        errors = {f["kind"] for f in report["findings"] if f["severity"] == "error"}  # type: ignore[attr-defined]
        assert errors == {"cuda_graph_ids_hazard"}, report
        return
    assert code == 1, text
    assert report["served_layout"] == ["layer:1", "layer:29", "layer:57"]
    assert report["expected_layout"] == ["layer:2", "layer:30", "layer:58"]


def test_qwen35_hybrid_resolves_with_the_hardware_check_as_a_note(tmp_path: Path) -> None:
    """Qwen3.5-MoE (hybrid linear/full attention): on device=cuda SGLang's Mamba-cache check asks this machine's
    platform (arg_groups/mamba_hook.py:113-121); with no GPU here that is a note, and the layout still resolves."""
    explained = explain_qwen35(tmp_path, eagle3_draft(2048, 248320, [1, 19, 35]))
    if explained is None:
        return
    code, text, data = explained
    assert code == 0, text
    assert data["target_architecture"] == "Qwen3_5MoeForConditionalGeneration" and data["num_layers"] == 40
    assert data["served_sources"] == ["layer:1", "layer:19", "layer:35"]
    assert any("hardware check skipped" in n and "mamba_hook.py" in n for n in data["notes"])  # type: ignore[union-attr]
    plan = sglang.capture_plan([1, 19, 35], num_layers=40, architecture="Qwen3_5MoeForConditionalGeneration",
                               version=str(SGLANG_VERSION))
    assert tuple(data["served_sources"]) == plan.served_sources  # type: ignore[arg-type]


def test_draft_sized_for_another_target_is_refused(tmp_path: Path) -> None:
    """fc takes 3 x 64 but the 40-layer H=2048 target serves 3 x 2048: SGLang would fail; exit 1 names it."""
    explained = explain_qwen35(tmp_path, eagle3_draft(64, 512, [1, 3, 5]))
    if explained is None:
        return
    code, text, data = explained
    assert code == 1, text
    assert "6144" in text and "fc takes 192" in text and data["problems"]


def test_gate_on_a_speculators_draft_is_a_parity_failure_not_an_environment_error(tmp_path: Path) -> None:
    spec_draft = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                  "eagle_aux_hidden_state_layer_ids": [2, 4, 6], "transformer_layer_config": {"model_type": "llama"}}
    code, text, report = _gate_static(REPO / "contracts" / "tiny-llama-eagle3.json", DEFAULT / "target",
                                      _draft_dir(tmp_path, spec_draft), tmp_path)
    assert code == 1, text
    assert report["verdict"] == "fail"
    if not NEW_ARCHS:
        return  # exit 1 and a FAIL report; the how-to-convert text comes from 0.5.23's static path
    assert "model_type is missing" in text and "LlamaForCausalLMEagle3" in text
    assert report["verdict"] == "fail"


def test_a_validation_that_needs_the_absent_gpu_is_a_note_with_exit_3(tmp_path: Path) -> None:
    """DeepSeek-V3.2 (DSA attention): SGLang 0.5.23 reads torch.cuda.get_device_capability() while it resolves the
    server args (arg_groups/model_hook.py:341). Without a GPU that is not the deployment's fault: exit 3, a note
    naming where SGLang asked, never a traceback or a verdict on the layout."""
    import torch

    target, draft = deployment(tmp_path, DEEPSEEK_V32, eagle3_draft(7168, 129280, [1, 29, 57]))
    code, text, data = run_explain(tmp_path, target, draft)
    assert "Traceback" not in text
    if SGLANG_VERSION != "0.5.23":  # older families: the same note where they ask torch.cuda, else their refusal
        assert code in (1, 3), text
        assert code == 1 or data["error"]["kind"] == "needs_hardware", text  # type: ignore[index]
        return
    if torch.cuda.is_available():  # on a GPU machine SGLang's own check passes and the layout resolves
        assert code == 0, text
        assert data["served_sources"] == ["layer:1", "layer:29", "layer:57"]
        return
    assert code == 3, text
    assert data["error"]["kind"] == "needs_hardware"  # type: ignore[index]
    assert "arg_groups/model_hook.py" in data["error"]["message"] and "GPU" in text  # type: ignore[index]
