"""``specparity.serving.sglang.explain`` on resolved deployments (no SGLang): the wording, the JSON keys, the exit codes."""

from __future__ import annotations

import dataclasses
import json

import pytest

from specparity.serving import ResolvedDeployment, ServingFailure, SpecSettings
from specparity.serving.sglang.explain import explain_failure, explain_resolved

KEYS = {"engine", "engine_version", "target_architecture", "num_layers", "draft_ids", "ids_source",
        "layers_to_capture", "served_sources", "ids_fallback", "fc_in_features", "resolved_spec"}


def dep(**kw: object) -> ResolvedDeployment:
    base = ResolvedDeployment(
        engine_version="0.5.23", adapter="sglang-family-E", target_path="/t", draft_path="/d", device="cpu",
        target_architecture="LlamaForCausalLM", num_layers=8, target_hidden_size=64, target_vocab_size=512,
        target_dtype="bfloat16", draft_architecture="LlamaForCausalLMEagle3", draft_hidden_size=64,
        draft_vocab_size=256, requested_spec=SpecSettings(None, None, None), resolved_spec=SpecSettings(5, 4, 8),
        spec_warnings=(), draft_config_ids=(1, 3, 5), ids_fallback_reason=None, layers_to_capture=(2, 4, 6),
        served_sources=("layer:1", "layer:3", "layer:5"), fc_in_features=192, fc_out_features=64, fc_bias=False,
        num_aux_hidden_states=3, fc_applied=True, norm_before_fc=False, fc_norm=False, norm_output=False,
        fc_bias_in_config=False, server_args={}, timings={}, capture_owner="model",
        draft_model_class="LlamaForCausalLMEagle3", draft_fc_module=(192, 64, False))
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def test_resolved_deployment_explains_with_the_issue_keys() -> None:
    e = explain_resolved(dep())
    assert e.exit_code == 0 and set(e.data) >= KEYS
    assert e.data["served_sources"] == ["layer:1", "layer:3", "layer:5"]
    assert "models/llama.py:929-941" in "\n".join(e.lines) and "+1 applied" in e.data["convention"]["applied"]  # type: ignore[index]


def test_default_ids_name_the_fallback_reason() -> None:
    e = explain_resolved(dep(draft_config_ids=None, ids_fallback_reason="draft config has no eagle_config",
                             layers_to_capture=(2, 4, 5), served_sources=("layer:1", "layer:3", "layer:4")))
    assert e.exit_code == 0 and e.data["ids_fallback"] == "draft config has no eagle_config"
    assert e.data["ids_source"] == "SGLang default: draft config has no eagle_config"


def test_deepseek_raw_branch_is_named() -> None:
    e = explain_resolved(dep(target_architecture="DeepseekV3ForCausalLM", num_layers=61, draft_config_ids=(2, 30, 58),
                             layers_to_capture=(2, 30, 58), served_sources=("layer:1", "layer:29", "layer:57")))
    assert "no +1" in e.data["convention"]["applied"] and "deepseek_v2.py:3458-3473" in e.data["convention"]["rule"]  # type: ignore[index]


@pytest.mark.parametrize(("change", "needle"), [
    ({"unreachable_boundaries": (8,), "served_sources": ("layer:1", "layer:3")}, "never reached"),
    ({"fc_in_features": 256, "fc_out_features": 64}, "loader refuses the weight"),
    ({"fc_applied": False}, "skips fc entirely"),
])
def test_a_deployment_sglang_would_not_serve_is_exit_1(change: dict[str, object], needle: str) -> None:
    e = explain_resolved(dep(**change))
    assert e.exit_code == 1 and any(needle in p for p in e.data["problems"])  # type: ignore[union-attr]


@pytest.mark.parametrize(("kind", "code"), [("sglang_exception", 1), ("draft_unreadable", 1), ("bad_deployment", 2),
                                            ("timeout", 3), ("sglang_missing", 3), ("child_crashed", 3),
                                            ("needs_hardware", 3)])
def test_failures_map_to_exit_codes(kind: str, code: int) -> None:
    e = explain_failure(ServingFailure(kind, "why"))
    assert e.exit_code == code and e.data["error"] == {"kind": kind, "message": "why", "sample": None}


def test_needs_hardware_is_a_note_with_what_to_do_not_a_verdict() -> None:
    e = explain_failure(ServingFailure("needs_hardware", "SGLang asks for a GPU at sglang/srt/x.py:1"))
    assert e.exit_code == 3 and e.data["notes"] == ["SGLang asks for a GPU at sglang/srt/x.py:1"]
    assert "served_sources" not in e.data and any(line.startswith("note") for line in e.lines)


def test_a_cuda_query_without_a_gpu_is_needs_hardware_and_other_errors_are_not() -> None:
    """gpu_query_failure keys on torch's own CUDA module raising, on a machine where CUDA is not available."""
    import torch

    from specparity.serving.sglang.engine_messages import gpu_query_failure

    try:
        torch.cuda.get_device_capability()
        raised: BaseException | None = None
    except (RuntimeError, AssertionError) as exc:
        raised = exc
    if torch.cuda.is_available():
        assert raised is None
    else:
        assert raised is not None
        f = gpu_query_failure(raised, stage="while testing")
        assert f is not None and f.kind == "needs_hardware" and f.message.startswith("while testing")
    try:
        raise ValueError("not about hardware")
    except ValueError as exc:
        assert gpu_query_failure(exc, stage="while testing") is None


# ------------------------------------------------- exit codes follow what explain prints
def _family_a(**kw: object) -> ResolvedDeployment:
    """What family A (0.4.8) resolves for the bundled default: ids [1, 3, 5] ignored, defaults served."""
    base = dep(engine_version="0.4.8", adapter="sglang-family-A", target_dtype="float16", draft_vocab_size=512,
               draft_config_ids=None, layers_to_capture=(2, 4, 5), served_sources=("layer:1", "layer:3", "layer:4"),
               fc_bias=True, draft_fc_module=(192, 64, True), ids_read=False, ignored_config_ids=(1, 3, 5),
               adapter_notes=(("draft_ids_ignored", "error", "sglang 0.4.8 ignores the draft's ids", "cite"),),
               capture_rule_source=(("LlamaForCausalLM.set_eagle3_layers_to_capture", "sglang/srt/models/llama.py",
                                     700, 706, "    def set_eagle3_layers_to_capture(self):\n"),))
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def test_an_error_note_is_exit_1_and_a_warning_is_not() -> None:
    assert explain_resolved(_family_a()).exit_code == 1
    warned = _family_a(adapter_notes=(("draft_ids_ignored", "warning", "defaults configured", "cite"),))
    assert explain_resolved(warned).exit_code == 0


def test_a_default_with_no_recorded_reason_is_exit_3_and_says_so() -> None:
    e = explain_resolved(_family_a(engine_version="0.5.10", ids_read=True, ignored_config_ids=None, adapter_notes=()))
    assert e.exit_code == 3 and "recorded no reason" in e.summary, e.summary
    assert any(line.startswith("unknown") for line in e.lines) and e.data["unknown"]


def test_an_environmental_error_note_is_exit_3_as_in_the_gate() -> None:
    e = explain_resolved(_family_a(adapter_notes=(("engine_error", "error", "the engine died", "cite"),)))
    assert e.exit_code == 3, e.summary


def test_without_a_recorded_setter_the_rule_is_labelled_as_0_5_23s() -> None:
    e = explain_resolved(_family_a(capture_rule_source=()))
    rule = next(line for line in e.lines if line.startswith("rule"))
    assert "as read in sglang 0.5.23: models/llama.py:929-941" in rule and "not sglang 0.4.8's own lines" in rule
    assert e.data["convention"]["cited_release"] == "0.5.23"  # type: ignore[index]


def test_the_citation_survives_the_child_to_parent_json() -> None:
    d = _family_a()
    assert ResolvedDeployment.from_dict(json.loads(json.dumps(d.to_dict()))) == d
    older = {("sglang_version" if k == "engine_version" else k): x for k, x in d.to_dict().items()}
    assert ResolvedDeployment.from_dict(older) == d  # the field's old name, from a child of an older specparity
