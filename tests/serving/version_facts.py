"""What each adapter family's SGLang really does with the bundled llama target (measured, sglang-cpu.md §9).

Shared by the real-SGLang tests (tests/serving, tests/catalog): they pick their expectation for the
installed version from here, never by skipping. ``test_versions.py`` checks every registry entry has a row.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

import pytest

from specparity.serving.sglang.adapter import AdapterEntry, select_adapter
from specparity.serving.sglang.families import env_for


@dataclasses.dataclass(frozen=True)
class VersionFacts:
    """One adapter family's measured behaviour."""

    minus_one_crash_at: str | None  # innermost sglang file:line of the [-1,1,3] TypeError; None = serves
    kernel_stub_calls: frozenset[str]  # sgl_kernel stand-in ops the capture may call (CPU)
    fc_width_fixed_at_3: bool  # fc = Linear(3*H_t, H_d) whatever the config says (before 0.5.12, D5)
    # the capture level runs (False: family A, static level only; a capture is an unsupported_version failure)
    capture_supported: bool = True
    # where building Qwen3.5's gated-delta-net layer asks torch for the current CUDA device (RMSNormGated's
    # device=torch.get_device_module().current_device()); on a machine with no GPU the static level then
    # stops there with needs_hardware (exit 3). None: the version has no Qwen3.5 or builds it without asking.
    qwen35_asks_gpu_at: str | None = None
    # SGLang's own refusal of speculative decoding on Qwen3.5 with the default server args (a quote), if any
    qwen35_refusal: str | None = None
    # fc = Linear(..., bias=True) whatever config.bias says (D4: 0.4.8 models/llama_eagle3.py:109-112)
    fc_always_biased: bool = False
    # D3 (family B, 0.4.9-0.5.10): CUDA graphs capture the default ids; the static level, which resolves the
    # deployment on device=cuda with graphs on unless told otherwise, reports cuda_graph_ids_hazard (an error) for
    # any other ids, e.g. the bundle's [1, 3, 5] against the default [1, 3, 4]
    graph_ids_hazard: bool = False
    # registry classes the static level answers with a failure on this machine (test_static_registry_families.py):
    # architecture -> (failure kind, a quote of the message); every other class with a setter must resolve
    static_refusals: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)


# What test_static_registry_families.py pins per env (architecture -> (kind, quote)); every other registry class with
# a setter resolves and equals the conventions module. Kinds: needs_hardware (SGLang asks torch.cuda at the quoted
# line, exit 3; resolves on a GPU machine), unsupported_version (the constructor reads a tensor value, which the
# meta device has none of: a gap of the static level, exit 3), sglang_exception (SGLang's own code raises on the
# architecture's config, exit 1, as 0.5.23's static_configs.SGLANG_REFUSES), no_config (the test table cannot write
# a config this release's transformers reads). Ling/Sarvam: where SGLang ships its BailingMoeV2Config (0.5.23), a
# module written here in place of the hub's remote code provides it, a stand-in named with the fields it assumes
# (static_configs.stand_ins); a release without the class gets no stand-in and these architectures go unchecked.
_NO_BAILING_CONFIG = {arch: ("no_config", "sglang.srt.configs.bailing_moe_v2") for arch in (
    "BailingMoEForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM", "SarvamMoEForCausalLM")}


def _dsa_and_hybrids(dsa_at: str, qwen35_at: str, qwen3_next_at: str, *hybrids: str) -> dict[str, tuple[str, str]]:
    """DSA models ask the GPU while resolving their server args; Qwen3.5-style gated-delta-net and Qwen3-Next layers
    build their norms on the current CUDA device."""
    return {"DeepseekV32ForCausalLM": ("needs_hardware", dsa_at), "GlmMoeDsaForCausalLM": ("needs_hardware", dsa_at),
            "Qwen3NextForCausalLM": ("needs_hardware", qwen3_next_at),
            **{arch: ("needs_hardware", qwen35_at) for arch in hybrids}}


# Keyed by matrix env (families.ENVS): an env without a row here fails test_every_family_env_is_wired.
FACTS: dict[str, VersionFacts] = {
    # family A ignores the configured ids (0.4.8 models/llama.py:700-706 takes none), so [-1,1,3] never reaches
    # the layer loop; only the static level is offered
    "sglang-0.4.8": VersionFacts(None, frozenset(), True, capture_supported=False, fc_always_biased=True),
    "sglang-0.4.10": VersionFacts("sglang/srt/models/llama.py:332", frozenset(), True, graph_ids_hazard=True),
    "sglang-0.5.3": VersionFacts("sglang/srt/models/llama.py:340", frozenset(), True, graph_ids_hazard=True,
                                 static_refusals={
        "ApertusForCausalLM": ("unsupported_version", "layers/activation.py:205")}),
    # 0.5.10 launches the pool warm-up as a Triton kernel (mem_cache/memory_pool.py:833), routed as on 0.5.14
    "sglang-0.5.10": VersionFacts("sglang/srt/models/llama.py:388", frozenset({"copy_all_layer_kv_cache_cpu"}), True,
                                  qwen35_refusal="is not compatible with radix cache",  # server_args.py, 0.5.10
                                  graph_ids_hazard=True,
                                  static_refusals={
                                      **_NO_BAILING_CONFIG,
                                      "ApertusForCausalLM": ("unsupported_version", "layers/activation.py:214"),
                                      "DeepseekV32ForCausalLM": ("needs_hardware", "server_args.py:1588"),
                                      "GlmMoeDsaForCausalLM": ("needs_hardware", "server_args.py:1588"),
                                      "LongcatFlashForCausalLM": ("needs_hardware", "models/longcat_flash.py:521"),
                                      # radix cache with mamba no_buffer, as for Qwen3.5 (qwen35_refusal)
                                      "Qwen3NextForCausalLM": ("sglang_exception", "is not compatible with radix cache"),
                                  }),
    # 0.5.14 launches its warm-up as a Triton kernel, routed to the same op (family_e_run.install_kv_copy_stand_in)
    "sglang-0.5.14": VersionFacts("sglang/srt/models/llama.py:409", frozenset({"copy_all_layer_kv_cache_cpu"}), False,
                                  qwen35_asks_gpu_at="sglang/srt/models/qwen3_5.py:270", static_refusals={
                                      **_NO_BAILING_CONFIG,
                                      **_dsa_and_hybrids("server_args.py:3627", "models/qwen3_5.py:270",
                                                         "models/qwen3_next.py:213", "Qwen3_5ForConditionalGeneration",
                                                         "Qwen3_5MoeForConditionalGeneration",
                                                         "InternS2PreviewForConditionalGeneration"),
                                      "ApertusForCausalLM": ("unsupported_version", "layers/activation.py:262"),
                                      "Gemma4UnifiedForConditionalGeneration": ("no_config", "gemma4_unified"),
                                      "LongcatFlashForCausalLM": ("needs_hardware", "models/longcat_flash.py:519"),
                                      # as on 0.5.23 (static_configs.SGLANG_REFUSES): start_layer= not taken
                                      "InternS1ProForConditionalGeneration": ("sglang_exception",
                                                                              "models/qwen2_moe.py:851"),
                                      # the model file hands its prefix string on as the quant_config
                                      "Ministral3ForCausalLM": ("sglang_exception", "layers/linear.py:181"),
                                  }),
    # 0.5.20 dispatches the warm-up to sgl_kernel's CPU op itself (mem_cache/memory_pool.py:46, :2114)
    "sglang-0.5.20": VersionFacts("sglang/srt/models/llama.py:442", frozenset({"copy_all_layer_kv_cache_cpu"}), False,
                                  qwen35_asks_gpu_at="sglang/srt/models/qwen3_5.py:467", static_refusals={
                                      **_NO_BAILING_CONFIG,
                                      **_dsa_and_hybrids("arg_groups/model_hook.py:243", "models/qwen3_5.py:467",
                                                         "models/qwen3_next.py:214", "Qwen3_5ForConditionalGeneration",
                                                         "Qwen3_5MoeForConditionalGeneration",
                                                         "InternS2PreviewForConditionalGeneration",
                                                         "InternS2MobiusForConditionalGeneration",
                                                         "Qwen4ExpForConditionalGeneration"),
                                      "ApertusForCausalLM": ("unsupported_version", "layers/activation.py:341"),
                                      "InternS1ProForConditionalGeneration": ("sglang_exception",
                                                                              "models/qwen2_moe.py:1082"),
                                      # as on 0.5.23 (SGLANG_REFUSES): the config class never sets rope_parameters
                                      "LongcatFlashForCausalLM": ("sglang_exception", "models/longcat_flash.py:384"),
                                      # the model reads a vision config the text-only config.json does not carry
                                      "Glm5NextForConditionalGeneration": ("sglang_exception",
                                                                           "layers/attention/vision_utils.py:16"),
                                  }),
    "sglang-0.5.23": VersionFacts(None, frozenset({"copy_all_layer_kv_cache_cpu"}), False),
}

SGLANG_VERSION: str | None
try:
    SGLANG_VERSION = importlib.metadata.version("sglang")
except importlib.metadata.PackageNotFoundError:
    SGLANG_VERSION = None


def installed_entry() -> AdapterEntry:
    """The installed SGLang's registry entry; no or an unsupported sglang is an assertion error, not a skip."""
    assert SGLANG_VERSION is not None, "the sglang tests need SGLang installed (scripts/venv.sh, venv-engine.sh sglang)"
    entry = select_adapter(SGLANG_VERSION)
    assert isinstance(entry, AdapterEntry), entry
    return entry


def facts_for(version: str) -> VersionFacts:
    """The pinned facts of the env installing ``version`` (else its family's representative env)."""
    env = env_for(version)
    assert env is not None and env.name in FACTS, f"sglang {version}: no matrix env with pinned facts"
    return FACTS[env.name]


def installed_facts() -> VersionFacts:
    """The pinned facts of the installed SGLang (its matrix env, else its family's representative)."""
    installed_entry()
    assert SGLANG_VERSION is not None
    return facts_for(SGLANG_VERSION)


def capture_level_supported() -> bool:
    """Whether the installed SGLang runs the capture level (False: family A, static level only).

    True where sglang is not installed, so the real-SGLang tests run and fail in ``sglang_required``: the
    static-only skip below never hides a missing SGLang.
    """
    if SGLANG_VERSION is None:
        return True
    return installed_facts().capture_supported


def assert_target_loaded_whole(deployment: Any) -> None:
    """SGLang's load of the target left no parameter unloaded, as measured around its own ``load_weights`` while it
    ran (serving/sglang/load_check.py: the since_0_5_11 capture of families C-E; family B's does not measure it)."""
    load = deployment.target_load
    if installed_entry().family not in ("C", "D", "E"):
        assert load == {}, load
        return
    assert load, "the target's load was not measured"
    assert load["never_loaded_count"] == 0 and load["partly_loaded_count"] == 0, load
    assert 0 < load["parameters_checked"] == load["parameters"] and load["checkpoint_tensors"] > 0, load


def needs_capture_level(refusal_test: str) -> pytest.MarkDecorator:
    """Skip a capture-premised test where the installed SGLang is static-only, naming the test that pins the
    refusal there (so the skip is reported with its reason and never passes silently)."""
    return pytest.mark.skipif(
        not capture_level_supported(),
        reason=f"sglang {SGLANG_VERSION} (family A) serves the static level only: a capture is refused with "
               f"unsupported_version, asserted by {refusal_test}")


def require_sglang(find_spec: Callable[[str], object | None] = importlib.util.find_spec) -> None:
    """Fail (never skip) a real-SGLang test where sglang cannot be imported (no silent skips)."""
    if find_spec("sglang") is None:
        pytest.fail(f"sglang is not importable by {sys.executable}: run the real-SGLang tests in .venv or a "
                    ".tox/sglang-* env, or deselect them with -m 'not sglang'", pytrace=False)
