"""vLLM's silent default fallback by its exact shape, the cross-engine shift hints (idrules/vllm_shapes.py), and the
vLLM worker's config readers on generated config shapes. No vLLM needed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specparity.idrules.vllm import READ_PATHS, drafter_aux_count, read_ids
from specparity.idrules.vllm_shapes import (
    FALLBACK_SHAPES,
    IdsFallback,
    fallback_shape,
    sglang_shift_hint,
    vllm_shift_hint,
)
from specparity.serving.vllm.deployment import fallback_reason, text_config_of
from specparity.serving.vllm.worker_failures import raised_in_specparity, target_quantization

IDS = "eagle_aux_hidden_state_layer_ids"
BASE = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 8192}


@pytest.mark.parametrize(("edit", "shape", "where"), [
    ({}, "no_eagle_config", "eagle_config"),
    ({"eagle_config": {"use_aux_hidden_state": True}}, "eagle_config_without_key", "eagle_config"),
    ({"eagle_config": {IDS: None}}, "ids_null", f"eagle_config.{IDS}"),
    ({"eagle_config": {IDS: []}}, "ids_empty", f"eagle_config.{IDS}"),
    ({IDS: None}, "ids_null", IDS),
    ({IDS: []}, "ids_empty", IDS),
    ({IDS: "1,29,57"}, "ids_not_a_list", IDS),
    ({"eagle_config": [1, 29, 57]}, "eagle_config_not_object", "eagle_config"),
    ({"transformer_layer_config": {IDS: [2, 40, 77]}}, "key_at_wrong_level", f"transformer_layer_config.{IDS}"),
    ({"target_layer_ids": [1, 17, 33]}, "key_at_wrong_level", "target_layer_ids"),
])
def test_every_fallback_shape_is_named(edit: dict[str, Any], shape: str, where: str) -> None:
    cfg = {**BASE, **edit}
    assert read_ids(cfg, num_layers=80).ids is None  # vLLM reads nothing from any of them: its default serves
    found = fallback_shape(cfg)
    assert found is not None and (found.shape, found.where) == (shape, where), found
    assert found.shape in FALLBACK_SHAPES
    reason = fallback_reason(cfg, {}, [2, 40, 77])
    assert shape in reason and "[2, 40, 77]" in reason and "interfaces.py" in reason


@pytest.mark.parametrize("cfg", [{IDS: [2, 40, 77]}, {"eagle_config": {IDS: [1, 39, 76]}},
                                 {"dflash_config": {"target_layer_ids": [1, 39, 76]}}])
def test_no_fallback_where_vllm_reads_ids(cfg: dict[str, Any]) -> None:
    assert fallback_shape({**BASE, **cfg}) is None
    assert read_ids({**BASE, **cfg}, num_layers=80).ids is not None


def test_each_release_reads_its_own_keys() -> None:
    nested = {**BASE, "eagle_config": {IDS: [1, 39, 76]}}
    # 0.11.1-0.19 read the top level only: SpecForge's nested key is at the wrong level there
    found = fallback_shape(nested, reads=READ_PATHS["top_level"])
    assert found is not None and (found.shape, found.where) == ("key_at_wrong_level", f"eagle_config.{IDS}")
    assert read_ids(nested, num_layers=80, version="0.19.1").ids is None
    assert read_ids(nested, num_layers=80, version="0.22.1").ids == (1, 39, 76)
    # 0.34 reads eagle_config.layer_ids, no longer eagle_config's eagle_aux_hidden_state_layer_ids
    assert read_ids(nested, num_layers=80, version="0.34.0").ids is None
    assert read_ids({**BASE, "eagle_config": {"layer_ids": [1, 39, 76]}}, num_layers=80, version="0.34.0").ids == (
        1, 39, 76)
    # before 0.11.1 no reader: any ids are ignored
    top = {**BASE, IDS: [2, 40, 77]}
    assert read_ids(top, num_layers=80, version="0.10.2").ids is None
    found = fallback_shape(top, reads=READ_PATHS["model_default"])
    assert found is not None and found.shape == "release_reads_no_ids"
    # before 0.18 boundary L is never reached (the loop captures before each layer)
    last = read_ids({**BASE, IDS: [2, 40, 80]}, num_layers=80, version="0.17.1")
    assert last.sources[-1].startswith("<boundary 80: never reached")
    assert read_ids({**BASE, IDS: [2, 40, 80]}, num_layers=80, version="0.18.1").sources[-1] == "layer:79"


def test_specforge_ids_on_vllm_name_the_shift_both_ways() -> None:
    # SpecForge's DeepSeek-V3 drafter: nested [1, 29, 57]; vLLM serves boundaries 1, 29, 57
    hint = vllm_shift_hint([1, 29, 57], f"eagle_config.{IDS}", ["layer:0", "layer:28", "layer:56"], num_layers=61)
    assert hint is not None
    assert "read with SGLang's/SpecForge's +1 these would be layer:1, layer:29, layer:57" in hint
    assert "vLLM feeds layer:0, layer:28, layer:56" in hint and "[2, 30, 58]" in hint
    # speculators' own top-level ids: no hint
    assert vllm_shift_hint([2, 30, 58], IDS, ["layer:1", "layer:29", "layer:57"], num_layers=61) is None
    # on SGLang, speculators' top-level ids read as SGLang's +1 would be one layer later than vLLM's meaning
    cfg = {IDS: [2, 30, 58], "eagle_config": {IDS: [2, 30, 58]}}
    back = sglang_shift_hint(cfg, [2, 30, 58], ["layer:2", "layer:30", "layer:58"], num_layers=61)
    assert back is not None and "these would be layer:1, layer:29, layer:57; SGLang feeds layer:2" in back
    assert sglang_shift_hint({}, [1, 29, 57], ["layer:1", "layer:29", "layer:57"], num_layers=61) is None


def test_raised_in_specparity_names_our_file_not_vllms() -> None:
    try:
        text_config_of(SimpleNamespace())  # no hf_config: an AttributeError raised in specparity's code
    except AttributeError as exc:
        where = raised_in_specparity(exc)
    assert where is not None and where.startswith("specparity/serving/vllm/deployment.py:")


# --- the worker's config readers on generated shapes: a typed answer, never an exception ---------------------------

JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 200) | st.text(max_size=4),
                    lambda children: st.lists(children, max_size=4)
                    | st.dictionaries(st.sampled_from([IDS, "eagle_config", "dflash_config", "target_layer_ids",
                                                       "num_aux_hidden_states", "text_config", "hidden_size", "x"]),
                                      children, max_size=4), max_leaves=12)
CONFIGS = st.dictionaries(st.sampled_from([IDS, "eagle_config", "dflash_config", "num_aux_hidden_states",
                                           "transformer_layer_config", "text_config", "quantization_config",
                                           "hidden_size", "architectures"]), JSON, max_size=6)


@settings(max_examples=300, deadline=None)
@given(cfg=CONFIGS, num_layers=st.integers(1, 128))
def test_config_readers_answer_every_shape(cfg: dict[str, Any], num_layers: int) -> None:
    read = read_ids(cfg, num_layers=num_layers)
    assert read.ids is None or all(isinstance(i, int) for i in read.ids)
    assert isinstance(drafter_aux_count(cfg), int)
    found = fallback_shape(cfg)
    assert found is None or (isinstance(found, IdsFallback) and found.shape in FALLBACK_SHAPES)
    if read.ids is None:
        assert isinstance(fallback_reason(cfg, {}, [2]), str)
    else:
        hint = vllm_shift_hint(list(read.ids), read.key, list(read.sources), num_layers=num_layers)
        assert hint is None or isinstance(hint, str)
    assert sglang_shift_hint(cfg, read.ids, list(read.sources), num_layers=num_layers) is None or True


@settings(max_examples=200, deadline=None)
@given(top=CONFIGS, text=st.none() | CONFIGS)
def test_target_readers_take_the_text_config_of_any_nesting(top: dict[str, Any], text: dict[str, Any] | None,
                                                             tmp_path_factory: pytest.TempPathFactory) -> None:
    import json

    cfg = {**top, "text_config": text} if text is not None else top
    d = tmp_path_factory.mktemp("t")
    (d / "config.json").write_text(json.dumps(cfg))
    q = target_quantization(str(d))
    assert q is None or isinstance(q, str)
    mc = SimpleNamespace(hf_config=SimpleNamespace(**cfg), hf_text_config=SimpleNamespace(**(text or top)))
    assert text_config_of(mc) is mc.hf_text_config
    assert text_config_of(SimpleNamespace(hf_config=mc.hf_config)) is mc.hf_config


def test_an_exception_in_specparitys_vllm_folder_is_never_quoted_as_vllms_code() -> None:
    from specparity.serving.vllm.worker_failures import exception_failure, innermost_vllm_frame

    try:
        text_config_of(SimpleNamespace())
    except AttributeError as exc:
        assert innermost_vllm_frame(exc) == ""  # serving/vllm/deployment.py is ours, not vllm/deployment.py
        failure = exception_failure(exc)
    assert failure.kind == "internal_error" and "specparity/serving/vllm/deployment.py:" in failure.message
    assert "bug in specparity" in failure.message
