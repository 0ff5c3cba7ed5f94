"""Fixes: the draft-config patch re-derives to the contract's layout; spec rewrites get flags."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from specparity.compare.fix import IDS_KEY, apply_json_patch, layout_fix, spec_fix
from specparity.errors import InputError
from specparity.idrules import sglang
from specparity.sources import layer

LLAMA = "LlamaForCausalLM"
DEEPSEEK = "DeepseekV3ForCausalLM"


def _served(config: dict[str, Any], *, num_layers: int, architecture: str, version: str) -> tuple[str, ...]:
    """What SGLang serves for this draft config, per the capture model (D11: only the nested key counts)."""
    eagle = config.get("eagle_config")
    ids = eagle.get(IDS_KEY) if isinstance(eagle, dict) else None
    plan = sglang.capture_plan(ids, num_layers=num_layers, architecture=architecture, version=version)
    assert plan.crash is None
    return plan.served_sources


def test_add_eagle_config_when_absent() -> None:
    config: dict[str, Any] = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64}
    sources = ["layer:1", "layer:3", "layer:5"]
    assert _served(config, num_layers=8, architecture=LLAMA, version="0.5.23") == ("layer:1", "layer:3", "layer:4")
    fix = layout_fix(sources, config, num_layers=8, architecture=LLAMA, version="0.5.23")
    assert fix.summary == "set eagle_config.eagle_aux_hidden_state_layer_ids = [1, 3, 5] in <draft>/config.json"
    assert list(fix.json_patch) == [
        {"op": "add", "path": "/eagle_config", "value": {IDS_KEY: [1, 3, 5], "use_aux_hidden_state": True}}
    ]
    patched = apply_json_patch(config, fix.json_patch)
    assert _served(patched, num_layers=8, architecture=LLAMA, version="0.5.23") == tuple(sources)
    assert "eagle_config" not in config  # the input is not modified
    json.dumps(fix.to_dict())


def test_replace_wrong_ids() -> None:
    config: dict[str, Any] = {"eagle_config": {IDS_KEY: [-1, 1, 3], "use_aux_hidden_state": True}}
    fix = layout_fix(["layer:1", "layer:3", "layer:5"], config, num_layers=8, architecture=LLAMA,
                     version="0.5.23", draft_path="/models/draft/")
    assert list(fix.json_patch) == [{"op": "replace", "path": f"/eagle_config/{IDS_KEY}", "value": [1, 3, 5]}]
    assert fix.summary.endswith("in /models/draft/config.json")
    patched = apply_json_patch(config, fix.json_patch)
    assert _served(patched, num_layers=8, architecture=LLAMA, version="0.5.23") == ("layer:1", "layer:3", "layer:5")


def test_malformed_eagle_config_is_replaced_and_side_keys_kept_consistent() -> None:
    config: dict[str, Any] = {"eagle_config": None, "num_aux_hidden_states": 2, IDS_KEY: [0, 2]}
    fix = layout_fix(["layer:1", "layer:3", "layer:5"], config, num_layers=8, architecture=LLAMA, version="0.5.23")
    patched = apply_json_patch(config, fix.json_patch)
    assert patched["num_aux_hidden_states"] == 3 and patched[IDS_KEY] == [1, 3, 5]
    assert _served(patched, num_layers=8, architecture=LLAMA, version="0.5.23") == ("layer:1", "layer:3", "layer:5")


def test_disabled_aux_capture_is_reenabled() -> None:
    config: dict[str, Any] = {"eagle_config": {IDS_KEY: [1, 3, 5], "use_aux_hidden_state": False}}
    fix = layout_fix(["layer:1", "layer:3", "layer:5"], config, num_layers=8, architecture=LLAMA, version="0.5.23")
    assert list(fix.json_patch) == [{"op": "replace", "path": "/eagle_config/use_aux_hidden_state", "value": True}]


def test_already_right_is_an_empty_patch() -> None:
    config: dict[str, Any] = {"eagle_config": {IDS_KEY: [1, 3, 5]}}
    fix = layout_fix(["layer:1", "layer:3", "layer:5"], config, num_layers=8, architecture=LLAMA, version="0.5.23")
    assert fix.json_patch == () and fix.feasible and "already sets" in fix.summary


def test_deepseek_first_id_rule_is_respected() -> None:
    # 61-layer DeepSeek/Kimi on sglang >= 0.5.13: [2,30,58] is taken raw and serves layer:{1,29,57} (domain §3.2)
    config: dict[str, Any] = {"eagle_config": {IDS_KEY: [2, 30, 58]}}
    sources = ["layer:2", "layer:30", "layer:58"]
    assert _served(config, num_layers=61, architecture=DEEPSEEK, version="0.5.23") == (
        "layer:1", "layer:29", "layer:57")
    fix = layout_fix(sources, config, num_layers=61, architecture=DEEPSEEK, version="0.5.23")
    assert fix.feasible
    patched = apply_json_patch(config, fix.json_patch)
    assert _served(patched, num_layers=61, architecture=DEEPSEEK, version="0.5.23") == tuple(sources)


def test_same_contract_needs_different_ids_on_different_versions() -> None:
    sources = ["layer:2", "layer:30", "layer:58"]
    old = layout_fix(sources, {}, num_layers=61, architecture=DEEPSEEK, version="0.5.10")
    new = layout_fix(sources, {}, num_layers=61, architecture=DEEPSEEK, version="0.5.23")
    for fix, version in ((old, "0.5.10"), (new, "0.5.23")):
        patched = apply_json_patch({}, fix.json_patch)
        assert _served(patched, num_layers=61, architecture=DEEPSEEK, version=version) == tuple(sources)


@pytest.mark.parametrize(
    ("sources", "num_layers", "version", "reason"),
    [
        (["layer:5", "layer:1", "layer:3"], 8, "0.5.23", "ascending"),
        (["layer:1", "final_norm"], 8, "0.5.23", "final_norm cannot be served"),
        (["layer:1", "layer:7"], 8, "0.5.23", "layer:7 is past the last boundary"),
        (["embedding", "layer:1"], 8, "0.5.21", "embedding"),
        (["layer:3", "layer:4", "layer:5"], 8, "0.4.8", "ignores draft-config ids"),
    ],
)
def test_unservable_contracts_say_why(sources: list[str], num_layers: int, version: str, reason: str) -> None:
    fix = layout_fix(sources, {}, num_layers=num_layers, architecture=LLAMA, version=version)
    assert not fix.feasible and fix.json_patch == () and reason in fix.summary
    assert fix.summary.startswith(f"no draft config serves {', '.join(sources)} on sglang {version}")


def test_bad_source_is_an_input_error() -> None:
    with pytest.raises(InputError, match="layer:9 does not exist"):
        layout_fix(["layer:9"], {}, num_layers=8, architecture=LLAMA, version="0.5.23")


ARCHS = [LLAMA, DEEPSEEK, "Qwen3ForCausalLM", "GptOssForCausalLM", "MiniMaxM3SparseForConditionalGeneration"]
VERSIONS = ["0.4.10.post2", "0.5.3", "0.5.10", "0.5.14", "0.5.18", "0.5.21", "0.5.23"]


@settings(max_examples=150, deadline=None)
@given(
    num_layers=st.integers(min_value=4, max_value=64),
    data=st.data(),
    architecture=st.sampled_from(ARCHS),
    version=st.sampled_from(VERSIONS),
    start=st.sampled_from(["absent", "null", "wrong", "empty"]),
)
def test_patch_always_reproduces_the_contract(num_layers: int, data: st.DataObject, architecture: str,
                                              version: str, start: str) -> None:
    k = data.draw(st.integers(min_value=1, max_value=min(4, num_layers)))
    idx = sorted(data.draw(st.lists(st.integers(min_value=0, max_value=num_layers - 1), min_size=k, max_size=k,
                                    unique=True)))
    sources = [layer(i) for i in idx]
    config: dict[str, Any] = {
        "absent": {},
        "null": {"eagle_config": None},
        "wrong": {"eagle_config": {IDS_KEY: [0, 1, 2], "use_aux_hidden_state": True}},
        "empty": {"eagle_config": {}},
    }[start]
    fix = layout_fix(sources, config, num_layers=num_layers, architecture=architecture, version=version)
    assume(fix.feasible)
    patched = apply_json_patch(config, fix.json_patch)
    assert _served(patched, num_layers=num_layers, architecture=architecture, version=version) == tuple(sources)


def test_spec_fixes() -> None:
    assert spec_fix({"num_steps": 1, "eagle_topk": 1, "num_draft_tokens": 16},
                    {"num_steps": 1, "eagle_topk": 1, "num_draft_tokens": 2}) == (
        "pass --speculative-num-steps 15 to get 16 draft tokens with topk 1, or raise --speculative-eagle-topk above 1")
    unset = spec_fix({"num_steps": None, "eagle_topk": 2, "num_draft_tokens": None},
                     {"num_steps": 5, "eagle_topk": 4, "num_draft_tokens": 8})
    assert unset is not None and "auto-chooses" in unset
    assert spec_fix({"num_steps": 3}, {"num_steps": 3}) is None


def test_apply_json_patch_ops() -> None:
    doc = {"a": {"b": [1, 2]}, "c~d": 1, "e/f": 2}
    out = apply_json_patch(doc, [
        {"op": "add", "path": "/a/b/-", "value": 3},
        {"op": "replace", "path": "/c~0d", "value": 5},
        {"op": "remove", "path": "/e~1f"},
        {"op": "test", "path": "/a/b/2", "value": 3},
    ])
    assert out == {"a": {"b": [1, 2, 3]}, "c~d": 5}
    assert doc == {"a": {"b": [1, 2]}, "c~d": 1, "e/f": 2}
    with pytest.raises(InputError, match="test failed"):
        apply_json_patch(doc, [{"op": "test", "path": "/c~0d", "value": 9}])
    with pytest.raises(InputError, match="missing member"):
        apply_json_patch(doc, [{"op": "replace", "path": "/zz", "value": 1}])
