"""vLLM 0.32's id rules (idrules/vllm.py) and the vLLM engine's layout fix, without vLLM.

tests/vllm_engine/test_vllm_conventions_vs_vllm.py checks the same reader against vLLM's own function."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specparity.compare.fix import apply_json_patch
from specparity.contract.conventions import sources_to_specforge_ids
from specparity.idrules.vllm import drafter_aux_count, fix_ops, read_ids, vllm_ids_to_sources
from specparity.serving.engine import get_engine

L = 8
SPECFORGE_STYLE = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5], "use_aux_hidden_state": True}}


def test_nested_specforge_ids_are_boundaries_on_vllm() -> None:
    r = read_ids(SPECFORGE_STYLE, num_layers=L)
    assert r.ids == (1, 3, 5) and r.key == "eagle_config.eagle_aux_hidden_state_layer_ids"
    assert r.sources == ("layer:0", "layer:2", "layer:4")  # hidden_states[1, 3, 5]


def test_top_level_key_wins_over_nested() -> None:
    cfg = {**SPECFORGE_STYLE, "eagle_aux_hidden_state_layer_ids": [2, 4, 6]}
    r = read_ids(cfg, num_layers=L)
    assert r.key == "eagle_aux_hidden_state_layer_ids" and r.sources == ("layer:1", "layer:3", "layer:5")


@pytest.mark.parametrize("cfg", [{}, {"eagle_aux_hidden_state_layer_ids": []}, {"eagle_config": None},
                                 {"eagle_config": {"eagle_aux_hidden_state_layer_ids": None}}])
def test_no_ids_is_the_model_default(cfg: dict[str, object]) -> None:
    r = read_ids(cfg, num_layers=L)
    assert r.default and r.boundaries == (2, 4, 5)


def test_dflash_ids_get_plus_one_and_nested_eagle_wins_over_them() -> None:
    assert read_ids({"dflash_config": {"target_layer_ids": [0, 2]}}, num_layers=L).boundaries == (1, 3)
    both = {"dflash_config": {"target_layer_ids": [0, 2]}, **SPECFORGE_STYLE}
    assert read_ids(both, num_layers=L).boundaries == (1, 3, 5)


def test_a_release_before_eagle3_is_refused_and_a_newer_one_takes_the_newest_rules() -> None:
    with pytest.raises(ValueError, match="predates EAGLE-3"):
        read_ids({}, num_layers=L, version="0.8.4")
    assert read_ids({}, num_layers=L, version="0.99.0").reader == "v2"  # untested: the newest rules


def test_drafter_width_counts_nested_ids_only() -> None:
    assert drafter_aux_count(SPECFORGE_STYLE) == 3
    assert drafter_aux_count({"eagle_aux_hidden_state_layer_ids": [1, 2]}) == 3  # top level is not read here
    assert drafter_aux_count({"num_aux_hidden_states": 4}) == 4


def test_fix_for_the_specforge_drafter_is_2_4_6_in_the_nested_key() -> None:
    fix = get_engine("vllm").layout_fix(["layer:1", "layer:3", "layer:5"], SPECFORGE_STYLE, num_layers=L,
                                        architecture="LlamaForCausalLM", version="0.32.0", draft_path="d")
    assert fix.ids == (2, 4, 6)
    assert list(fix.json_patch) == [{"op": "replace", "path": "/eagle_config/eagle_aux_hidden_state_layer_ids",
                                     "value": [2, 4, 6]}]


def test_fix_of_a_config_without_ids_adds_the_top_level_key() -> None:
    ids, key, ops = fix_ops(["layer:1", "layer:3", "layer:5"], {}, num_layers=L)
    assert ids == [2, 4, 6] and key == "eagle_aux_hidden_state_layer_ids" and ops == [{"op": "add", "path": f"/{key}", "value": [2, 4, 6]}]


def test_final_norm_has_no_vllm_ids() -> None:
    fix = get_engine("vllm").layout_fix(["layer:1", "final_norm"], {}, num_layers=L, architecture="x",
                                        version="0.32.0", draft_path="d")
    assert not fix.feasible


sources_strategy = st.lists(st.integers(min_value=0, max_value=L), min_size=1, max_size=4, unique=True).map(sorted)


@given(boundaries=sources_strategy, nested=st.booleans(), top=st.booleans())
def test_the_patched_config_serves_exactly_the_wanted_sources(boundaries: list[int], nested: bool, top: bool) -> None:
    """For every servable source list and every config shape, vLLM reads the patched config as asked."""
    wanted = vllm_ids_to_sources(boundaries, num_layers=L)
    cfg: dict[str, object] = {}
    if nested:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 3, 5]}
    if top:
        cfg["eagle_aux_hidden_state_layer_ids"] = [0, 1]
    _, _, ops = fix_ops(wanted, cfg, num_layers=L)
    assert list(read_ids(apply_json_patch(cfg, ops), num_layers=L).sources) == wanted


@given(st.lists(st.integers(min_value=1, max_value=L - 2), min_size=1, max_size=4, unique=True).map(sorted))
def test_specforge_ids_are_one_layer_early_on_vllm(ids: list[int]) -> None:
    """SpecForge id v means layer:v; vLLM serves the same number as layer:v-1, always."""
    sources = [f"layer:{v}" for v in ids]
    assert sources_to_specforge_ids(sources, num_layers=L) == ids
    served = read_ids({"eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}}, num_layers=L).sources
    assert list(served) == [f"layer:{v - 1}" if v else "embedding" for v in ids]
