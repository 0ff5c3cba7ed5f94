"""Config diff: the contract against the deployment, as typed, numbered mismatches."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from specparity.compare.configdiff import (
    ConfigMismatch,
    config_findings,
    contract_view,
    diff_views,
    view_from_configs,
    view_from_resolved,
)
from specparity.compare.findings import FindingKind, Severity
from specparity.contract.io import parse_contract

D2T = "a" * 64


def contract_dict() -> dict[str, Any]:
    return {
        "schema_version": 1,
        "name": "tiny-llama-eagle3",
        "target": {"architecture": "LlamaForCausalLM", "num_hidden_layers": 8, "hidden_size": 64, "vocab_size": 256,
                   "dtype": "float32", "config_fingerprint": "0" * 64, "fingerprint_fields": ["hidden_size"]},
        "fc_input": {"sources": ["layer:1", "layer:3", "layer:5"], "chunk_widths": [64, 64, 64], "total_width": 192,
                     "dtype": "float32"},
        "layer_ids": {"ids": [1, 3, 5], "convention": "specforge_eagle", "origin": "draft_config",
                      "tool": "specforge", "architecture": "LlamaForCausalLM"},
        "drafter": {"hidden_size": 64, "fc_in_features": 192, "fc_out_features": 64, "draft_vocab_size": 128,
                    "vocab_map": {"draft_vocab_size": 128, "d2t_sha256": D2T},
                    "checkpoint_keys": ["fc.weight", "lm_head.weight", "midlayer.self_attn.q_proj.weight"]},
        "serving": {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4},
        "probes": {"file": "t.probes.safetensors", "sha256": "1" * 64, "num_samples": 1, "num_tokens": 3},
        "provenance": {"tool": "specforge", "created_at": "2026-11-29T00:00:00Z", "specparity_version": "0.1.0"},
    }


def resolved_dict(**changes: Any) -> dict[str, Any]:
    """Shaped like serving.results.ResolvedDeployment.to_dict() for a correct deployment."""
    d: dict[str, Any] = {
        "engine_version": "0.5.23", "target_architecture": "LlamaForCausalLM", "num_layers": 8,
        "target_hidden_size": 64, "target_vocab_size": 256, "target_dtype": "float32",
        "draft_architecture": "LlamaForCausalLMEagle3", "draft_hidden_size": 64, "draft_vocab_size": 128,
        "requested_spec": {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4},
        "resolved_spec": {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4},
        "served_sources": ["layer:1", "layer:3", "layer:5"], "fc_in_features": 192, "fc_out_features": 64,
        "fc_bias": False, "norm_before_fc": False, "fc_norm": False, "norm_output": False,
    }
    d.update(changes)
    return d


KEYS = ["fc.weight", "lm_head.weight", "midlayer.self_attn.q_proj.weight"]


def test_matching_deployment_has_no_mismatch() -> None:
    contract = parse_contract(contract_dict())
    actual = view_from_resolved(resolved_dict(), checkpoint_keys=KEYS, d2t_sha256=D2T)
    assert diff_views(contract_view(contract), actual) == []


def test_every_mismatch_is_typed_numbered_and_named() -> None:
    contract = contract_view(parse_contract(contract_dict()))
    actual = view_from_resolved(
        resolved_dict(served_sources=["embedding", "layer:1", "layer:3"], norm_output=True,
                      resolved_spec={"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}, fc_in_features=128),
        checkpoint_keys=["fc.weight", "fc.bias", "midlayer.self_attn.q_proj.weight"], d2t_sha256="b" * 64)
    mismatches = diff_views(contract, actual)
    assert [m.n for m in mismatches] == list(range(1, len(mismatches) + 1))
    by_path = {m.path: m for m in mismatches}
    assert by_path["fc_input.sources"] == ConfigMismatch(
        n=by_path["fc_input.sources"].n, path="fc_input.sources", expected=["layer:1", "layer:3", "layer:5"],
        actual=["embedding", "layer:1", "layer:3"], kind="changed")
    assert by_path["drafter.norm_output"].expected is False and by_path["drafter.norm_output"].actual is True
    assert by_path["drafter.checkpoint_keys[lm_head.weight]"].kind == "missing"
    assert by_path["drafter.checkpoint_keys[fc.bias]"].kind == "unexpected"
    assert by_path["drafter.vocab_map.d2t_sha256"].actual == "b" * 64
    assert by_path["drafter.fc_in_features"].actual == 128
    findings = {f.details["path"]: f for f in config_findings(mismatches)}
    assert findings["fc_input.sources"].kind is FindingKind.LAYOUT_MISMATCH
    assert findings["drafter.norm_output"].kind is FindingKind.NORM_MISMATCH
    assert findings["drafter.vocab_map.d2t_sha256"].kind is FindingKind.VOCAB_MAP_MISMATCH
    assert findings["drafter.fc_in_features"].kind is FindingKind.WIDTH_MISMATCH
    assert findings["drafter.checkpoint_keys[fc.bias]"].severity is Severity.WARNING
    assert findings["drafter.checkpoint_keys[lm_head.weight]"].severity is Severity.ERROR
    msg = findings["drafter.norm_output"].message
    assert msg.endswith("drafter.norm_output: contract False, deployment True")
    json.dumps([m.to_dict() for m in mismatches])


def test_spec_rewrite_is_named() -> None:
    contract = contract_view(parse_contract(contract_dict()))
    actual = view_from_resolved(resolved_dict(resolved_spec={"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 8}),
                                checkpoint_keys=KEYS, d2t_sha256=D2T)
    (m,) = diff_views(contract, actual)
    assert (m.path, m.expected, m.actual) == ("serving.num_draft_tokens", 4, 8)
    assert m.to_finding().kind is FindingKind.SPEC_CONFIG_REWRITTEN


def test_ids_are_exact_but_floats_relative() -> None:
    expected = {"a": {"ids": [1, 29, 57], "theta": 500000.0, "eps": 1e-6, "n": 163840}}
    close = {"a": {"ids": [1, 29, 57], "theta": 500000.0000001, "eps": 1.0000000001e-6, "n": 163840}}
    assert diff_views(expected, close) == []
    off = {"a": {"ids": [1, 29, 58], "theta": 10000.0, "eps": 1e-5, "n": 163841}}
    got = {m.path: m for m in diff_views(expected, off)}
    assert set(got) == {"a.ids", "a.theta", "a.eps", "a.n"}
    assert got["a.ids"].expected == [1, 29, 57] and got["a.ids"].actual == [1, 29, 58]
    assert diff_views({"f": True}, {"f": 1})[0].kind == "type_changed"


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=200), min_size=1, max_size=5),
       st.lists(st.integers(min_value=0, max_value=200), min_size=1, max_size=5))
def test_lists_are_reported_whole_and_only_when_different(a: list[int], b: list[int]) -> None:
    got = diff_views({"ids": a}, {"ids": b})
    if a == b:
        assert got == []
    else:
        assert got == [ConfigMismatch(n=1, path="ids", expected=a, actual=b, kind="changed")]


def test_view_from_configs_follows_sglang_reading_rules() -> None:
    contract = contract_view(parse_contract(contract_dict()))
    target = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 8, "hidden_size": 64, "vocab_size": 256,
              "torch_dtype": "float32"}
    # no eagle_config and no num_aux_hidden_states: k = 3 (llama_eagle3.py:156-161); legacy use_aux_norm = fc_norm
    draft = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64, "draft_vocab_size": 128,
             "use_aux_norm": True}
    actual = view_from_configs(draft, target, resolved_spec={"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4},
                               served_sources=["layer:1", "layer:3", "layer:4"], checkpoint_keys=KEYS,
                               d2t_sha256=D2T)
    got = {m.path: m for m in diff_views(contract, actual)}
    assert set(got) == {"fc_input.sources", "drafter.fc_norm"}
    # two ids in eagle_config: fc is 2 x 64 wide
    draft2 = {**draft, "use_aux_norm": False, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3]}}
    got2 = {m.path: m for m in diff_views(contract, view_from_configs(draft2, target))}
    assert got2["drafter.fc_in_features"].actual == 128 and got2["fc_input.total_width"].actual == 128
    # unknown facts on the deployment side are not claimed as mismatches of value, only as missing
    assert got2["serving"].kind == "missing" and got2["serving"].actual == "<absent>"
