"""The failure catalog: each miswiring, served by the installed SGLang's real code, gives its named finding.

Runs in every SGLang env of the matrix. Where the installed version cannot serve a scenario (e.g. an id
of -1 crashes llama targets before 0.5.22), the expectation comes from the conventions module's model
of that version, so the same scenario gives the same finding kinds on every version that serves it.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import pytest

from specparity.contract.conventions import sglang_capture_plan
from specparity.gate import run_gate
from specparity.serving.sglang.adapter import parse_version
from specparity.verdict import Verdict

pytestmark = pytest.mark.sglang
SGLANG = version("sglang")
L = 8

_verdicts: dict[tuple[str, str], Verdict] = {}


def gate(catalog: dict[str, Any], name: str, *, level: str = "capture", **kw: Any) -> Verdict:
    key = (name, level + repr(sorted(kw.items())))
    if key not in _verdicts:
        contract, target, draft = catalog[name]
        _verdicts[key] = run_gate(contract, target, draft, level=level, **kw)
    return _verdicts[key]


def kinds(v: Verdict) -> set[str]:
    return {f.kind.value for f in v.errors}


def _serves(ids: list[int]) -> bool:
    return sglang_capture_plan(ids, num_layers=L, architecture="LlamaForCausalLM", version=SGLANG).crash is None


# D5 (domain.md §7): before 0.5.12 the drafter builds fc = Linear(3*H_t, H_d) whatever the config says
# (sglang 0.5.3 models/llama_eagle3.py:134-138); tests/serving/version_facts.py pins the same per adapter family.
FC_WIDTH_FIXED_AT_3 = parse_version(SGLANG) < (0, 5, 12)


# scenario -> (status, finding kinds that must be among the errors)
CASES: dict[str, tuple[str, set[str]]] = {
    "healthy": ("pass", set()),
    "embedding_plus_layers": ("fail", {"extra_embedding", "missing_source"}) if _serves([-1, 1, 3])
    else ("error", {"sglang_error"}),
    "no_eagle_config": ("fail", {"default_ids_fallback", "off_by_one"}),
    "ids_plus_one": ("fail", {"off_by_one"}),
    "far_layers": ("fail", {"missing_source", "off_by_one"}),  # layer:3, 4, 6: layer:1 gone, two shifted
    "last_layer_id": ("fail", {"capture_count_short"}),
    # before 0.5.12 fc is Linear(3*H_t, H_d) whatever the config says (D5): the 1-aux [H, H] fc cannot load
    "fc_skipped": ("error", {"sglang_error"}) if FC_WIDTH_FIXED_AT_3
    else ("fail", {"fc_not_called", "width_mismatch"}),
    "nan_target": ("fail", {"nonfinite"}),
    "norm_before_fc": ("fail", {"norm_mismatch"}),
    "vocab_map": ("fail", {"vocab_map_mismatch"}),
    # ids [1,3,5,6] with a 3 x 64 fc: where fc is sized from the ids (4 x 64) the checkpoint cannot load; where
    # it is fixed at 3*H_t it loads, SGLang captures 4 states and its own fc matmul raises on the 256-wide input
    # (measured on 0.5.3 and 0.4.10.post2): the crash and the 4th chunk are both reported
    "unloadable_draft": ("fail", {"sglang_error", "width_mismatch", "layout_mismatch"}) if FC_WIDTH_FIXED_AT_3
    else ("error", {"sglang_error"}),
    "self_inconsistent": ("fail", {"contract_self_inconsistent"}),
    "order": ("fail", {"order_mismatch"}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_scenario_gives_its_finding(catalog: dict[str, Any], name: str) -> None:
    status, expected = CASES[name]
    v = gate(catalog, name)
    assert v.status == status, (name, v.status, [f.to_dict() for f in v.findings])
    assert expected <= kinds(v), (name, sorted(kinds(v)))
    if status == "pass":
        assert v.served_layout == ["layer:1", "layer:3", "layer:5"] and not v.errors
    else:
        assert v.exit_code in (1, 3)


def test_layout_failures_come_with_a_fix_that_names_the_ids(catalog: dict[str, Any]) -> None:
    for name in ("embedding_plus_layers", "ids_plus_one", "no_eagle_config"):
        v = gate(catalog, name)  # also where this version crashes on the config: the fix is the same ids
        assert v.fix is not None and "eagle_aux_hidden_state_layer_ids = [1, 3, 5]" in v.fix.summary, name


def test_silent_num_draft_tokens_rewrite(catalog: dict[str, Any]) -> None:
    v = gate(catalog, "healthy", level="static", sglang_args={
        "speculative_num_steps": 1, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 16})
    assert v.status == "fail" and "spec_config_rewritten" in kinds(v)
    assert v.resolved_spec_config is not None
    assert v.resolved_spec_config["resolved"]["num_draft_tokens"] == 2
    assert v.fix is not None and "--speculative-num-steps 15" in v.fix.summary


def test_static_level_sees_the_layout_without_a_forward(catalog: dict[str, Any]) -> None:
    v = gate(catalog, "ids_plus_one", level="static")
    assert v.served_layout == ["layer:2", "layer:4", "layer:6"]
    assert "off_by_one" in kinds(v) and v.chunks[0].cosine is None


def test_timeout_is_an_environment_error(catalog: dict[str, Any]) -> None:
    v = gate(catalog, "healthy", timeout_s=1)
    assert v.status == "error" and v.exit_code == 3 and "timeout" in kinds(v)


def test_a_config_sglang_crashes_on_is_reported_as_that_crash(catalog: dict[str, Any]) -> None:
    """[-1,1,3]: where the installed version crashes (llama before 0.5.22), the verdict is that crash alone,
    SGLang's own message quoted, with the fix; no layout finding for a layout SGLang never served."""
    v = gate(catalog, "embedding_plus_layers")
    crash = sglang_capture_plan([-1, 1, 3], num_layers=L, architecture="LlamaForCausalLM", version=SGLANG).crash
    if crash is None:
        assert v.served_layout == ["embedding", "layer:1", "layer:3"] and v.status == "fail"
        return
    assert (v.status, v.exit_code) == ("error", 3)
    assert kinds(v) == {"sglang_error"}, [f.to_dict() for f in v.errors]
    assert crash in v.errors[0].message and " at sglang/srt/models/llama.py:" in v.errors[0].message
    assert v.fix is not None and "eagle_aux_hidden_state_layer_ids = [1, 3, 5]" in v.fix.summary
    assert v.served_layout is None and all(c.served is None for c in v.chunks)  # never served: unknown
