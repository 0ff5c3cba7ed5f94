"""Child process of test_static_registry_families.py: the installed SGLang's static level on every registry class.

For each class in the installed SGLang's model registry that defines or inherits ``set_eagle3_layers_to_capture``
(drafts and other runtimes excepted, static_configs.NOT_TARGETS), a target config with that architecture's real
field names (static_configs) and a draft whose ids distinguish the id conventions go through the installed
family's own adapter ``resolve`` (the product's static level: SGLang's ServerArgs, ModelConfig, registry and
``_initialize_model`` on the meta device, then the real setter). One JSON object per class on stdout's last line.

Run as ``python registry_sweep.py`` with the env's interpreter, in its own process: the static level keeps one
one-rank world per process and installs the family's CPU shims before the first sglang import.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ["SGLANG_USE_CPU_ENGINE"] = "1"  # before the first sglang import, as the serving child does
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import static_configs  # noqa: E402
from version_facts import SGLANG_VERSION  # noqa: E402

from specparity.serving import ResolvedDeployment  # noqa: E402
from specparity.serving.sglang.adapter import AdapterEntry, WorkerRequest, load_adapter, select_adapter  # noqa: E402
from specparity.serving.sglang.worker import install_kernel_stub_if_needed  # noqa: E402

# Configs that describe the architecture better than 0.5.23's table does for releases whose model file reads the
# text model's own config class (a text-only Llama-4 checkpoint is model_type llama4_text), and registry classes of
# older releases that 0.5.23 no longer has
FAMILY_TARGETS: dict[str, tuple[str, dict[str, Any]]] = {
    "Llama4ForCausalLM": ("llama4_text", {}),
    # openai/gpt-oss-20b's config.json sets swiglu_limit, which older transformers' GptOssConfig does not default
    "GptOssForCausalLM": ("gpt_oss", {"swiglu_limit": 7.0}),
    # Qwen/Qwen2.5-VL-7B-Instruct's config.json: the text keys at the top level, as older transformers wrote it
    "Qwen2_5_VLForConditionalGeneration": ("hf-flat:qwen2_5_vl", {
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}),
    # THUDM/GLM-4.1V-9B-Thinking and zai-org/GLM-4.5V as older releases read them: text keys at the top level
    "Glm4vForConditionalGeneration": ("hf-flat:glm4v", {
        "attention_bias": True, "rope_scaling": {"type": "default", "mrope_section": [8, 12, 12]}}),
    "Glm4vMoeForConditionalGeneration": ("hf-flat:glm4v_moe", {
        "attention_bias": True, "use_qk_norm": False, "rope_scaling": {"type": "default", "mrope_section": [8, 12, 12]}}),
}

DRAFT = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64,
         "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 512, "draft_vocab_size": 256, "max_position_embeddings": 512, "torch_dtype": "bfloat16"}


def sweep() -> dict[str, dict[str, Any]]:
    assert SGLANG_VERSION is not None, "no sglang installed"
    entry = select_adapter(SGLANG_VERSION)
    assert isinstance(entry, AdapterEntry), entry
    install_kernel_stub_if_needed("cpu")
    adapter = load_adapter(entry, sglang_version=SGLANG_VERSION)
    getattr(adapter, "warm", lambda device: None)("cpu")  # the family's CPU shims, before the registry import
    from sglang.srt.models.registry import ModelRegistry

    static_configs.TARGETS.update(FAMILY_TARGETS)
    out: dict[str, dict[str, Any]] = {}
    for arch in sorted(ModelRegistry.models):
        if not hasattr(ModelRegistry.models[arch], "set_eagle3_layers_to_capture") or arch in static_configs.NOT_TARGETS:
            continue
        if arch not in static_configs.TARGETS:
            out[arch] = {"kind": "no_config", "message": "not in static_configs.TARGETS"}
            continue
        try:
            cfg = static_configs.target_config(arch)
        except Exception as exc:  # the table's config needs what this release or its transformers lacks
            out[arch] = {"kind": "no_config", "message": f"{type(exc).__name__}: {exc}"}
            continue
        root = Path(tempfile.mkdtemp(prefix="sweep-"))
        (root / "target").mkdir()
        (root / "target" / "config.json").write_text(json.dumps(cfg))
        for name, text in static_configs.target_files(arch).items():
            (root / "target" / name).write_text(text)
        text_cfg = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg
        num_layers = int(text_cfg["num_hidden_layers"])
        ids = [2, num_layers // 2, num_layers - 3]  # first id not 1: tells the +1 rule from the DeepSeek rule
        (root / "draft").mkdir()
        (root / "draft" / "config.json").write_text(json.dumps(
            {**DRAFT, "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}}))
        r = adapter.resolve(WorkerRequest(op="resolve", target=str(root / "target"), draft=str(root / "draft"),
                                          server_args=static_configs.server_args_for(arch)))
        if isinstance(r, ResolvedDeployment):
            out[arch] = {"kind": "resolved", "ids": ids, "num_layers": num_layers,
                         "architecture": r.target_architecture, "layers_to_capture": list(r.layers_to_capture),
                         "served_sources": list(r.served_sources), "capture_owner": r.capture_owner}
        else:
            out[arch] = {"kind": r.kind, "message": r.message}
        out[arch]["stand_ins"] = static_configs.stand_ins(arch)  # files written here in place of a checkpoint's
    return out


if __name__ == "__main__":
    result = sweep()
    sys.stdout.flush()
    print("\n" + json.dumps(result))
