"""Layer-id conventions: domain.md's worked tables 3.2-3.4, version boundaries (§6-7), and round-trips."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specparity.contract.conventions import (
    IdConvention,
    hf_index_to_source,
    ids_to_sources,
    source_to_hf_index,
    sources_to_ids,
    sources_to_specforge_ids,
    specforge_default_ids,
    specforge_ids_to_sources,
)
from specparity.idrules import sglang
from specparity.idrules.sglang import (
    TYPE_ERROR_HS_NONE,
    ArchFamily,
    arch_family,
    parse_version,
)
from specparity.idrules.vllm import sources_to_vllm_ids, vllm_ids_to_sources
from specparity.sources import EMBEDDING, FINAL_NORM, boundary_to_source, layer

LLAMA = "LlamaForCausalLM"
DEEPSEEK = "DeepseekV3ForCausalLM"
KIMI = "KimiK25ForConditionalGeneration"
GPT_OSS = "GptOssForCausalLM"
MINIMAX_VL = "MiniMaxM3SparseForConditionalGeneration"
MINIMAX_TEXT = "MiniMaxM3SparseForCausalLM"


def L(*i: int) -> tuple[str, ...]:
    return tuple(layer(x) for x in i)


def served(ids: list[int] | None, *, n: int, arch: str, version: str) -> tuple[str, ...]:
    plan = sglang.capture_plan(ids, num_layers=n, architecture=arch, version=version)
    assert plan.crash is None, plan.crash
    return plan.served_sources


# --- domain.md table 3.2: 61-layer target ------------------------------------------------------------------

T32 = [  # ids, SpecForge training, SGLang llama-style (>=0.5.22), DeepSeek/Kimi >=0.5.13, vLLM
    ([1, 29, 57], L(1, 29, 57), L(1, 29, 57), L(1, 29, 57), L(0, 28, 56)),
    ([2, 30, 58], L(2, 30, 58), L(2, 30, 58), L(1, 29, 57), L(1, 29, 57)),
    ([-1, 2, 30], None, (EMBEDDING, *L(2, 30)), L(1, 29), None),
    (None, L(1, 29, 57), L(1, 29, 57), L(1, 29, 57), L(1, 29, 57)),
]


@pytest.mark.parametrize(("ids", "training", "_llama", "_ds", "_vllm"), T32)
def test_table_3_2_specforge_training(ids, training, _llama, _ds, _vllm) -> None:
    if training is None:
        with pytest.raises(ValueError, match=r"layer id -1 \(position 0\)"):
            specforge_ids_to_sources(ids, num_layers=61)
    else:
        assert tuple(specforge_ids_to_sources(ids, num_layers=61)) == training


@pytest.mark.parametrize(("ids", "_training", "llama", "_ds", "_vllm"), T32)
@pytest.mark.parametrize("version", ["0.5.22", "0.5.23"])
def test_table_3_2_sglang_llama(ids, _training, llama, _ds, _vllm, version) -> None:
    assert served(ids, n=61, arch=LLAMA, version=version) == llama


@pytest.mark.parametrize("version", ["0.4.10.post2", "0.5.3", "0.5.21"])
def test_table_3_2_llama_minus_one_crashes_up_to_0_5_21(version) -> None:
    plan = sglang.capture_plan([-1, 2, 30], num_layers=61, architecture=LLAMA, version=version)
    assert plan.layers_to_capture == (0, 3, 31)
    assert plan.crash == TYPE_ERROR_HS_NONE
    assert plan.served_sources == ()


@pytest.mark.parametrize(("ids", "_training", "_llama", "ds", "_vllm"), T32)
@pytest.mark.parametrize("arch", [DEEPSEEK, KIMI, "Glm4MoeLiteForCausalLM"])
@pytest.mark.parametrize("version", ["0.5.13", "0.5.14", "0.5.22"])
def test_table_3_2_sglang_deepseek(ids, _training, _llama, ds, _vllm, arch, version) -> None:
    assert served(ids, n=61, arch=arch, version=version) == ds


@pytest.mark.parametrize(("ids", "_training", "_llama", "ds", "_vllm"), T32[:2] + T32[3:])
def test_table_3_2_sglang_deepseek_0_5_23(ids, _training, _llama, ds, _vllm) -> None:
    assert served(ids, n=61, arch=DEEPSEEK, version="0.5.23") == ds


def test_table_3_2_deepseek_minus_one_raises_on_0_5_23_packer() -> None:
    plan = sglang.capture_plan([-1, 2, 30], num_layers=61, architecture=KIMI, version="0.5.23")
    assert plan.layers_to_capture == (-1, 2, 30)
    assert plan.unreachable == (-1,)
    assert plan.crash == "RuntimeError: captured 2 of 3 aux hidden states"
    # glm4_moe_lite keeps a plain list (glm4_moe_lite.py:647): one state fewer, silently
    assert served([-1, 2, 30], n=61, arch="Glm4MoeLiteForCausalLM", version="0.5.23") == L(1, 29)


@pytest.mark.parametrize(("ids", "_training", "_llama", "_ds", "vllm"), T32)
def test_table_3_2_vllm(ids, _training, _llama, _ds, vllm) -> None:
    if vllm is None:
        with pytest.raises(ValueError, match="-1"):
            vllm_ids_to_sources(ids, num_layers=61)
    else:
        assert tuple(vllm_ids_to_sources(ids, num_layers=61)) == vllm


def test_table_3_2_one_config_two_tensor_sets() -> None:
    """0.5.6-0.5.12 DeepSeek/Kimi behaves llama-style; 0.5.13 flips [2,30,58] (D6)."""
    assert served([2, 30, 58], n=61, arch=KIMI, version="0.5.12") == L(2, 30, 58)
    assert served([2, 30, 58], n=61, arch=KIMI, version="0.5.13") == L(1, 29, 57)


def test_table_3_2_last_layer_per_tool() -> None:
    plan = sglang.capture_plan([1, 29, 60], num_layers=61, architecture=LLAMA, version="0.5.23")
    assert plan.layers_to_capture == (2, 30, 61)
    assert plan.unreachable == (61,)
    assert plan.served_sources == L(1, 29)  # one state fewer
    assert vllm_ids_to_sources([60, 61], num_layers=61) == [layer(59), layer(60)]
    assert hf_index_to_source(61, num_layers=61) == FINAL_NORM


# --- domain.md table 3.3: 4-layer target -------------------------------------------------------------------

T33 = [  # ids, SpecForge training, SGLang llama-style, DeepSeek >=0.5.13 (list-based, e.g. 0.5.14), vLLM
    ([1, 1, 0], L(0, 1), L(0, 1), L(0, 1), (EMBEDDING, layer(0))),
    ([0, 1, 2], L(0, 1, 2), L(0, 1, 2), (EMBEDDING, *L(0, 1)), (EMBEDDING, *L(0, 1))),
    (None, L(0, 1), L(0, 1), L(0, 1), L(0, 1)),
]


@pytest.mark.parametrize(("ids", "training", "llama", "ds", "vllm"), T33)
def test_table_3_3(ids, training, llama, ds, vllm) -> None:
    assert tuple(specforge_ids_to_sources(ids, num_layers=4)) == training
    assert served(ids, n=4, arch=LLAMA, version="0.5.23") == llama
    assert served(ids, n=4, arch=DEEPSEEK, version="0.5.14") == ds
    assert tuple(vllm_ids_to_sources(ids, num_layers=4)) == vllm


def test_table_3_3_specforge_default_has_two_states() -> None:
    assert specforge_default_ids(4) == [1, 1, 0]
    plan = sglang.capture_plan(None, num_layers=4, architecture=LLAMA, version="0.5.23")
    assert plan.layers_to_capture == (2, 2, 1)  # stored as SGLang has it, duplicate included
    assert plan.served_sources == L(0, 1)


@pytest.mark.parametrize("ids", [[1, 1, 0], None])
def test_table_3_3_duplicates_crash_deepseek_0_5_23_packer(ids) -> None:
    """Beyond domain.md: the 0.5.23 packer is sized by len(layers_to_capture), duplicates included
    (deepseek_v2.py:3175), so a duplicated boundary raises instead of serving two states."""
    plan = sglang.capture_plan(ids, num_layers=4, architecture=DEEPSEEK, version="0.5.23")
    assert plan.layers_to_capture == (2, 2, 1)
    assert plan.crash == "RuntimeError: captured 2 of 3 aux hidden states"


def test_table_3_3_deepseek_first_id_zero_is_raw() -> None:
    assert served([0, 1, 2], n=4, arch=DEEPSEEK, version="0.5.23") == (EMBEDDING, *L(0, 1))


# --- domain.md table 3.4: 8-layer Llama target measured on sglang 0.5.23 --------------------------------

T34 = [  # draft config ids, layers_to_capture, fc chunks, verdict vs training layer:{1,3,5}
    ([1, 3, 5], (2, 4, 6), L(1, 3, 5), True),
    ([-1, 1, 3], (0, 2, 4), (EMBEDDING, *L(1, 3)), False),
    (None, (2, 4, 5), L(1, 3, 4), False),
]


@pytest.mark.parametrize(("ids", "ltc", "chunks", "passes"), T34)
def test_table_3_4_measured(ids, ltc, chunks, passes) -> None:
    plan = sglang.capture_plan(ids, num_layers=8, architecture=LLAMA, version="0.5.23")
    assert plan.layers_to_capture == ltc
    assert plan.served_sources == chunks
    assert plan.used_default is (ids is None)
    training = tuple(specforge_ids_to_sources([1, 3, 5], num_layers=8))
    assert (plan.served_sources == training) is passes


@pytest.mark.parametrize("version", ["0.5.3", "0.4.10.post2"])
def test_table_3_4_old_versions_crash_on_minus_one(version) -> None:
    plan = sglang.capture_plan([-1, 1, 3], num_layers=8, architecture=LLAMA, version=version)
    assert plan.crash == TYPE_ERROR_HS_NONE


# --- version boundaries (domain.md §6-7) ----------------------------------------------------------------


def test_0_4_8_ignores_ids_0_4_9_adds_one() -> None:
    old = sglang.capture_plan([1, 3, 5], num_layers=8, architecture=LLAMA, version="0.4.8")
    new = sglang.capture_plan([1, 3, 5], num_layers=8, architecture=LLAMA, version="0.4.9")
    assert (old.used_default, old.ids_used, old.layers_to_capture) == (True, None, (2, 4, 5))
    assert old.served_sources == L(1, 3, 4) and old.notes
    assert (new.used_default, new.ids_used, new.layers_to_capture) == (False, (1, 3, 5), (2, 4, 6))
    assert any("D3" in n for n in new.notes)  # eager vs graph disagreement until 0.5.10
    assert not sglang.capture_plan([1, 3, 5], num_layers=8, architecture=LLAMA, version="0.5.11").notes


def test_deepseek_0_5_12_plus_one_0_5_13_raw() -> None:
    assert sglang.capture_plan([2, 4, 6], num_layers=8, architecture=DEEPSEEK, version="0.5.12").layers_to_capture == (
        3, 5, 7,
    )
    assert sglang.capture_plan([2, 4, 6], num_layers=8, architecture=DEEPSEEK, version="0.5.13").layers_to_capture == (
        2, 4, 6,
    )


def test_deepseek_before_0_5_6_has_no_setter() -> None:
    plan = sglang.capture_plan([1, 3, 5], num_layers=8, architecture=DEEPSEEK, version="0.5.5")
    assert plan.crash is not None and "0.5.6" in plan.crash
    assert sglang.ids_for_sources(L(1, 3, 5), num_layers=8, architecture=DEEPSEEK, version="0.5.5") is None


def test_gpt_oss_0_5_16_vs_0_5_17_incident_i2() -> None:
    """sglang #32334: gpt-oss-120b-Eagle3-v3 ids [24,30,36] on a 36-layer target."""
    old = sglang.capture_plan([24, 30, 36], num_layers=36, architecture=GPT_OSS, version="0.5.16")
    assert old.layers_to_capture == (25, 31, 37) and old.unreachable == (37,)
    assert old.served_sources == L(24, 30)
    new = sglang.capture_plan([24, 30, 36], num_layers=36, architecture=GPT_OSS, version="0.5.17")
    assert new.layers_to_capture == (24, 30, 36) and new.unreachable == ()
    assert new.served_sources == L(23, 29, 35)  # layer:L-1 is capturable (pre-norm)
    assert served([1, 3, 5], n=8, arch=GPT_OSS, version="0.5.17") == L(1, 3, 5)  # max != L: +1


@pytest.mark.parametrize(("version", "crashes"), [("0.5.16", True), ("0.5.17", False)])
def test_gpt_oss_boundary_zero(version, crashes) -> None:
    plan = sglang.capture_plan([-1, 1, 3], num_layers=8, architecture=GPT_OSS, version=version)
    assert (plan.crash == TYPE_ERROR_HS_NONE) is crashes
    assert plan.served_sources == (() if crashes else (EMBEDDING, *L(1, 3)))


@pytest.mark.parametrize(("version", "crashes"), [("0.5.21", True), ("0.5.22", False)])
def test_llama_minus_one_0_5_21_vs_0_5_22(version, crashes) -> None:
    plan = sglang.capture_plan([-1, 1, 3], num_layers=8, architecture="MistralForCausalLM", version=version)
    assert (plan.crash == TYPE_ERROR_HS_NONE) is crashes


@pytest.mark.parametrize("arch", ["Qwen2ForCausalLM", "Qwen3ForCausalLM"])
def test_qwen_serves_embedding_since_0_4_9(arch) -> None:
    assert served([-1, 1, 3], n=8, arch=arch, version="0.4.9") == (EMBEDDING, *L(1, 3))


def test_minimax_default_plus_one_from_0_5_18() -> None:
    assert sglang.default_boundaries(62, architecture=MINIMAX_VL, version="0.5.17") == (2, 31, 59)
    assert sglang.default_boundaries(62, architecture=MINIMAX_VL, version="0.5.18") == (3, 32, 60)
    assert served(None, n=62, arch=MINIMAX_VL, version="0.5.23") == L(2, 31, 59)
    # 0.5.23 minimax_m3.py:2062-2067: the text-only class keeps the plain default (domain.md D8 says both)
    assert sglang.default_boundaries(62, architecture=MINIMAX_TEXT, version="0.5.23") == (2, 31, 59)
    assert served([1, 30, 58], n=62, arch=MINIMAX_TEXT, version="0.5.23") == L(1, 30, 58)


def test_version_before_eagle3_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"0\.4\.4\.post2"):
        sglang.capture_plan(None, num_layers=8, architecture=LLAMA, version="0.4.4.post1")


def test_empty_ids_capture_nothing_and_say_so() -> None:
    plan = sglang.capture_plan([], num_layers=8, architecture=LLAMA, version="0.5.23")
    assert plan.layers_to_capture == () and plan.served_sources == ()
    assert plan.crash is not None and "no aux hidden state" in plan.crash


# --- families, versions, HF, SpecForge validation -------------------------------------------------------


@pytest.mark.parametrize(
    ("arch", "family"),
    [
        (LLAMA, ArchFamily.LLAMA), ("Qwen2ForCausalLM", ArchFamily.LLAMA), ("Qwen3ForCausalLM", ArchFamily.LLAMA),
        ("MistralForCausalLM", ArchFamily.LLAMA), ("SomethingNewForCausalLM", ArchFamily.LLAMA),
        ("DeepseekV2ForCausalLM", ArchFamily.DEEPSEEK), (DEEPSEEK, ArchFamily.DEEPSEEK),
        (KIMI, ArchFamily.DEEPSEEK), ("Glm4MoeLiteForCausalLM", ArchFamily.DEEPSEEK),
        ("Glm4MoeForCausalLM", ArchFamily.LLAMA), (GPT_OSS, ArchFamily.GPT_OSS),
        (MINIMAX_VL, ArchFamily.MINIMAX_M3), (MINIMAX_TEXT, ArchFamily.MINIMAX_M3),
    ],
)
def test_arch_family(arch, family) -> None:
    assert arch_family(arch) is family


def test_parse_version_orders_sglang_releases() -> None:
    order = ["0.4.4.post2", "0.4.8", "0.4.10.post2", "0.5.0rc0", "0.5.0", "0.5.3", "0.5.13", "0.5.23"]
    parsed = [parse_version(v) for v in order]
    assert parsed == sorted(parsed) and len(set(parsed)) == len(parsed)
    assert parse_version("0.5.23") == (0, 5, 23, 0, 0)
    assert parse_version("v0.5.23+cpu") == parse_version("0.5.23")
    with pytest.raises(ValueError):
        parse_version("latest")


@pytest.mark.parametrize(("index", "source"), [(0, EMBEDDING), (1, layer(0)), (7, layer(6)), (8, FINAL_NORM)])
def test_hf_index(index, source) -> None:
    assert hf_index_to_source(index, num_layers=8) == source
    assert source_to_hf_index(source, num_layers=8) == index


def test_hf_has_no_index_for_last_pre_norm_layer() -> None:
    with pytest.raises(ValueError, match="layer:7 has no HF"):
        source_to_hf_index(layer(7), num_layers=8)
    with pytest.raises(ValueError):
        hf_index_to_source(9, num_layers=8)


@pytest.mark.parametrize("bad", [-1, 1.0, True, "2"])
def test_specforge_rejects_non_negative_int_violations(bad) -> None:
    with pytest.raises(ValueError, match=rf"layer id {bad!r} \(position 1\)"):
        specforge_ids_to_sources([1, bad, 5], num_layers=8)  # type: ignore[list-item]


def test_specforge_on_deepseek_first_id_rule() -> None:
    """SpecForge hands ids to the target's own setter (domain.md §3.1, [inferred])."""
    assert specforge_ids_to_sources([2, 4, 6], num_layers=8, architecture=DEEPSEEK) == list(L(1, 3, 5))
    assert sources_to_specforge_ids((EMBEDDING, *L(1, 3)), num_layers=8, architecture=DEEPSEEK) == [0, 2, 4]
    with pytest.raises(ValueError, match="rejects negative ids"):
        sources_to_specforge_ids((EMBEDDING, *L(1, 3)), num_layers=8, sglang_version="0.5.23")


def test_deepseek_layer0_first_needs_a_non_ascending_config() -> None:
    """On DeepSeek >= 0.5.13 a layer:0-first layout is only reachable with first id != 1 (D6, D12)."""
    ids = sglang.ids_for_sources(L(0, 5), num_layers=8, architecture=DEEPSEEK, version="0.5.23")
    assert ids == [6, 1]
    assert served(ids, n=8, arch=DEEPSEEK, version="0.5.23") == L(0, 5)
    assert sglang.ids_for_sources(L(0), num_layers=8, architecture=DEEPSEEK, version="0.5.23") is None
    assert sglang.ids_for_sources(L(0), num_layers=8, architecture=DEEPSEEK, version="0.5.12") == [0]


@pytest.mark.parametrize(
    ("sources", "arch", "version"),
    [
        (L(1, 3, 7), LLAMA, "0.5.23"),  # layer:L-1: boundary L never reached on llama
        ((EMBEDDING, *L(1)), LLAMA, "0.5.21"),  # boundary 0 crashes
        (L(1, 3, 5), LLAMA, "0.4.8"),  # not the default, ids ignored
        (L(3, 1), LLAMA, "0.5.23"),  # not ascending
        ((*L(1, 3), FINAL_NORM), LLAMA, "0.5.23"),
        ((), LLAMA, "0.5.23"),
        (L(1, 3, 7), GPT_OSS, "0.5.16"),
    ],
)
def test_sglang_ids_for_sources_impossible(sources, arch, version) -> None:
    assert sglang.ids_for_sources(sources, num_layers=8, architecture=arch, version=version) is None


@pytest.mark.parametrize(
    ("sources", "arch", "version", "ids"),
    [
        (L(1, 3, 4), LLAMA, "0.4.8", [1, 3, 4]),  # the default is all <=0.4.8 can serve
        ((EMBEDDING, *L(1, 3)), LLAMA, "0.5.22", [-1, 1, 3]),
        (L(1, 3, 7), GPT_OSS, "0.5.17", [1, 3, 7]),  # +1 form: boundary L is reached (gpt_oss.py:730-737)
        ((EMBEDDING, *L(1, 3)), DEEPSEEK, "0.5.23", [0, 2, 4]),  # raw form
        (L(1, 3, 5), DEEPSEEK, "0.5.23", [1, 3, 5]),  # +1 form preferred (first id 1)
        (L(1, 3, 7), MINIMAX_TEXT, "0.5.23", [1, 3, 7]),  # minimax_m3.py:1960-1963 captures boundary L
    ],
)
def test_sglang_ids_for_sources_examples(sources, arch, version, ids) -> None:
    assert sglang.ids_for_sources(sources, num_layers=8, architecture=arch, version=version) == ids


def test_dispatcher_accepts_enum_and_string() -> None:
    for conv in (IdConvention.SGLANG, "sglang_draft_config"):
        assert ids_to_sources([1, 3, 5], conv, num_layers=8, version="0.5.23") == list(L(1, 3, 5))  # type: ignore[arg-type]
    assert ids_to_sources([0, 8], IdConvention.HF, num_layers=8) == [EMBEDDING, FINAL_NORM]
    assert ids_to_sources(None, IdConvention.VLLM, num_layers=8) == list(L(1, 3, 4))
    assert ids_to_sources(None, IdConvention.SPECFORGE, num_layers=8) == list(L(1, 3, 4))
    with pytest.raises(ValueError, match="version"):
        ids_to_sources([1], IdConvention.SGLANG, num_layers=8)
    with pytest.raises(ValueError, match="TypeError"):
        ids_to_sources([-1, 1], IdConvention.SGLANG, num_layers=8, version="0.5.21")
    assert sources_to_ids(L(1, 3, 5), IdConvention.SGLANG, num_layers=8, version="0.5.23") == [1, 3, 5]


# --- round-trips (hypothesis) ---------------------------------------------------------------------------


@st.composite
def ascending_boundaries(draw: st.DrawFn, *, low: int = 0, top_offset: int = 0) -> tuple[int, list[int]]:
    """(L, strictly ascending boundaries within low..L-top_offset, 1-5 of them)."""
    n = draw(st.integers(min_value=2, max_value=96))
    pool = list(range(low, n - top_offset + 1))
    picked = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=min(5, len(pool)), unique=True))
    return n, sorted(picked)


@settings(max_examples=150, deadline=None)
@given(ascending_boundaries())
def test_vllm_round_trip(case: tuple[int, list[int]]) -> None:
    n, bs = case
    sources = [boundary_to_source(b, n) for b in bs]
    ids = sources_to_vllm_ids(sources, num_layers=n)
    assert ids == bs
    assert vllm_ids_to_sources(ids, num_layers=n) == sources


@settings(max_examples=150, deadline=None)
@given(ascending_boundaries(), st.booleans())
def test_hf_round_trip(case: tuple[int, list[int]], with_final_norm: bool) -> None:
    n, bs = case
    sources = [boundary_to_source(b, n) for b in bs if b != n] + ([FINAL_NORM] if with_final_norm else [])
    indices = [source_to_hf_index(s, num_layers=n) for s in sources]
    assert [hf_index_to_source(i, num_layers=n) for i in indices] == sources


@settings(max_examples=150, deadline=None)
@given(ascending_boundaries(low=1, top_offset=1))
def test_specforge_round_trip_llama(case: tuple[int, list[int]]) -> None:
    """Any ascending layer:0..layer:L-2 list is expressible in SpecForge ids on a llama-style target."""
    n, bs = case
    sources = [boundary_to_source(b, n) for b in bs]
    ids = sources_to_specforge_ids(sources, num_layers=n)
    assert ids == [b - 1 for b in bs]
    assert specforge_ids_to_sources(ids, num_layers=n) == sources


ARCHS = [LLAMA, "Qwen3ForCausalLM", DEEPSEEK, "Glm4MoeLiteForCausalLM", GPT_OSS, MINIMAX_TEXT, MINIMAX_VL]
VERSIONS = ["0.4.4.post2", "0.4.8", "0.4.9", "0.5.3", "0.5.6", "0.5.10", "0.5.11", "0.5.12", "0.5.13",
            "0.5.16", "0.5.17", "0.5.18", "0.5.21", "0.5.22", "0.5.23"]


@settings(max_examples=300, deadline=None)
@given(ascending_boundaries(), st.sampled_from(ARCHS), st.sampled_from(VERSIONS))
def test_sglang_ids_for_sources_round_trip(case: tuple[int, list[int]], arch: str, version: str) -> None:
    n, bs = case
    sources = [boundary_to_source(b, n) for b in bs]
    ids = sglang.ids_for_sources(sources, num_layers=n, architecture=arch, version=version)
    family = arch_family(arch)
    v = parse_version(version)
    honoured = v >= (0, 4, 9) and not (family is ArchFamily.DEEPSEEK and v < (0, 5, 6))
    # DeepSeek >= 0.5.13 cannot serve layer:0 alone: [1] triggers +1 and [0] is read raw (embedding)
    lone_layer0 = family is ArchFamily.DEEPSEEK and v >= (0, 5, 13) and bs == [1]
    if honoured and all(1 <= b <= n - 1 for b in bs) and not lone_layer0:
        assert ids is not None  # layer:0..layer:L-2 is servable wherever ids are read at all
    if ids is not None:
        assert len(ids) == len(sources)  # SGLang >= 0.5.12 sizes fc from len(ids) (llama_eagle3.py:151-167)
        plan = sglang.capture_plan(ids, num_layers=n, architecture=arch, version=version)
        assert plan.crash is None
        assert plan.served_sources == tuple(sources)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=1, max_value=64).flatmap(
        lambda n: st.tuples(st.just(n), st.lists(st.integers(min_value=-2, max_value=n + 2), max_size=5))
    ),
    st.sampled_from(ARCHS),
    st.sampled_from(VERSIONS),
)
def test_plan_invariants(case: tuple[int, list[int]], arch: str, version: str) -> None:
    """For any ids: served is ascending and deduplicated (D12), a subset of what the setter stored."""
    n, ids = case
    plan = sglang.capture_plan(ids, num_layers=n, architecture=arch, version=version)
    positions = [
        -1 if s == EMBEDDING else int(s.split(":")[1]) for s in plan.served_sources
    ]
    assert positions == sorted(set(positions))
    stored_sources = {boundary_to_source(b, n) for b in plan.layers_to_capture if 0 <= b <= n}
    assert set(plan.served_sources) <= stored_sources
    assert set(plan.unreachable) <= set(plan.layers_to_capture)
    assert (plan.crash is None) or plan.served_sources == ()
    if plan.crash is None:
        assert plan.served_sources  # a plan without a crash always serves something


@settings(max_examples=100, deadline=None)
@given(st.permutations([1, 3, 5]), st.sampled_from([LLAMA, GPT_OSS, MINIMAX_VL]))
def test_order_of_ids_does_not_change_the_layout(ids: list[int], arch: str) -> None:
    """D12: a non-ascending config is served ascending on every +1 family."""
    assert served(ids, n=8, arch=arch, version="0.5.23") == L(1, 3, 5)


@settings(max_examples=150, deadline=None)
@given(ascending_boundaries(), st.sampled_from([LLAMA, DEEPSEEK, GPT_OSS]), st.sampled_from(["0.5.14", "0.5.23"]))
def test_specforge_round_trip_any_list(case: tuple[int, list[int]], arch: str, version: str) -> None:
    """Every ascending list either has SpecForge ids that record exactly it, or is refused with ValueError."""
    n, bs = case
    sources = [boundary_to_source(b, n) for b in bs]
    try:
        ids = sources_to_specforge_ids(sources, num_layers=n, architecture=arch, sglang_version=version)
    except ValueError as e:
        assert "no SpecForge layer ids record" in str(e)
        return
    assert all(i >= 0 for i in ids)
    assert specforge_ids_to_sources(ids, num_layers=n, architecture=arch, sglang_version=version) == sources
