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
    # target architectures this SGLang has but whose setter object family B's static level cannot build (its
    # _setter_model carries a text model's fields only): exit 3, "a gap in specparity", never a verdict
    static_gap_archs: frozenset[str] = frozenset()
    # fc = Linear(..., bias=True) whatever config.bias says (D4: 0.4.8 models/llama_eagle3.py:109-112)
    fc_always_biased: bool = False


# Keyed by matrix env (families.ENVS): an env without a row here fails test_every_family_env_is_wired.
FACTS: dict[str, VersionFacts] = {
    # family A ignores the configured ids (0.4.8 models/llama.py:700-706 takes none), so [-1,1,3] never reaches
    # the layer loop; only the static level is offered
    "sglang-0.4.8": VersionFacts(None, frozenset(), True, capture_supported=False, fc_always_biased=True),
    "sglang-0.4.10": VersionFacts("sglang/srt/models/llama.py:332", frozenset(), True),
    "sglang-0.5.3": VersionFacts("sglang/srt/models/llama.py:340", frozenset(), True),
    # 0.5.10 launches the pool warm-up as a Triton kernel (mem_cache/memory_pool.py:833), routed as on 0.5.14
    "sglang-0.5.10": VersionFacts("sglang/srt/models/llama.py:388", frozenset({"copy_all_layer_kv_cache_cpu"}), True,
                                  qwen35_refusal="is not compatible with radix cache",  # server_args.py, 0.5.10
                                  static_gap_archs=frozenset({"KimiK25ForConditionalGeneration"})),
    # 0.5.14 launches its warm-up as a Triton kernel, routed to the same op (family_e_run.install_kv_copy_stand_in)
    "sglang-0.5.14": VersionFacts("sglang/srt/models/llama.py:409", frozenset({"copy_all_layer_kv_cache_cpu"}), False,
                                  qwen35_asks_gpu_at="sglang/srt/models/qwen3_5.py:270"),
    # 0.5.20 dispatches the warm-up to sgl_kernel's CPU op itself (mem_cache/memory_pool.py:46, :2114)
    "sglang-0.5.20": VersionFacts("sglang/srt/models/llama.py:442", frozenset({"copy_all_layer_kv_cache_cpu"}), False,
                                  qwen35_asks_gpu_at="sglang/srt/models/qwen3_5.py:467"),
    "sglang-0.5.23": VersionFacts(None, frozenset({"copy_all_layer_kv_cache_cpu"}), False),
}

SGLANG_VERSION: str | None
try:
    SGLANG_VERSION = importlib.metadata.version("sglang")
except importlib.metadata.PackageNotFoundError:
    SGLANG_VERSION = None


def installed_entry() -> AdapterEntry:
    """The installed SGLang's registry entry; no or an unsupported sglang is an assertion error, not a skip."""
    assert SGLANG_VERSION is not None, "the sglang tests need SGLang installed (scripts/venv.sh, venv-sglang.sh)"
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


def needs_capture_level(refusal_test: str) -> pytest.MarkDecorator:
    """Skip a capture-premised test where the installed SGLang is static-only, naming the test that pins the
    refusal there (so the skip is reported with its reason and never passes silently)."""
    return pytest.mark.skipif(
        not capture_level_supported(),
        reason=f"sglang {SGLANG_VERSION} (family A) serves the static level only: a capture is refused with "
               f"unsupported_version, asserted by {refusal_test}")


def require_sglang(find_spec: Callable[[str], object | None] = importlib.util.find_spec) -> None:
    """Fail (never skip) a real-SGLang test where sglang cannot be imported (issue 11: no silent skips)."""
    if find_spec("sglang") is None:
        pytest.fail(f"sglang is not importable by {sys.executable}: run the real-SGLang tests in .venv or a "
                    ".tox/sglang-* env, or deselect them with -m 'not sglang'", pytrace=False)
