"""Real SGLang (installed version) through specparity's serving adapter: resolve, fc capture, atlas.

Every deployment starts SGLang once per session (``serving_cache``). Expected tensors come from an
independent transformers forward of the same target weights (``hf_hidden_states``).

Resolve tests run on every version, their expectation taken from the conventions model of the installed one
(``sglang.capture_plan``: family A never reads the configured ids, D1). Family A (0.4.4.post2-0.4.8) is served
at the static level only: there :func:`test_a_static_only_version_refuses_the_capture` pins the refusal, and the
capture tests are skipped by name with that reason (``version_facts.needs_capture_level``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from serving_probes import PROBES
from version_facts import (
    SGLANG_VERSION,
    assert_target_loaded_whole,
    capture_level_supported,
    installed_facts,
    needs_capture_level,
)

from specparity.idrules import sglang
from specparity.idrules.sglang import SGLangCapturePlan
from specparity.serving import CaptureResult, ResolvedDeployment, ServingFailure
from specparity.serving.cache import SessionCache
from specparity.serving.results import UNSUPPORTED_VERSION
from specparity.sources import EMBEDDING, FINAL_NORM, layer

pytestmark = [pytest.mark.sglang, pytest.mark.usefixtures("sglang_required")]

TOL = 1e-5
NUM_LAYERS = 8
H = 64
CAPTURE = needs_capture_level("tests/serving/test_sglang_capture.py::test_a_static_only_version_refuses_the_capture")


def _plan(ids: list[int] | None) -> SGLangCapturePlan:
    """What the installed SGLang does with ``ids`` on the bundled llama target (the conventions model)."""
    assert SGLANG_VERSION is not None, "the sglang tests need SGLang installed"
    return sglang.capture_plan(ids, num_layers=NUM_LAYERS, architecture="LlamaForCausalLM", version=SGLANG_VERSION)


def _ids_ignored_note(dep: ResolvedDeployment) -> tuple[str, str, str, str]:
    """Family A's one ``draft_ids_ignored`` note, naming the defaults [1, L//2-1, L-4] = [1, 3, 4] it serves."""
    [note] = [n for n in dep.adapter_notes if n[0] == "draft_ids_ignored"]
    assert "[1, 3, 4]" in note[2] and f"sglang {SGLANG_VERSION}" in note[2], note
    return note


def _capture(
    cache: SessionCache,
    models: dict[str, Path],
    name: str,
    *,
    probes: list[list[int]] = PROBES,
    atlas: bool = True,
) -> CaptureResult:
    d = models[name]
    return cache.capture(d / "target", d / "draft", probes=probes, atlas=atlas, timeout_s=300)


def _resolve(
    cache: SessionCache, models: dict[str, Path], name: str, **server_args: object
) -> ResolvedDeployment:
    d = models[name]
    r = cache.resolve(d / "target", d / "draft", server_args=server_args, timeout_s=200)
    assert isinstance(r, ResolvedDeployment), r
    return r


def _attribute(result: CaptureResult) -> list[str]:
    """Test-local attribution: each fc chunk's nearest atlas boundary (max abs error over all samples)."""
    assert result.fc is not None and result.atlas is not None
    k = result.fc.per_sample[0].shape[-1] // H
    names = []
    for j in range(k):
        errors = {}
        for name in result.atlas.sources():
            errors[name] = max(
                float((fc[:, j * H : (j + 1) * H] - sample[name]).abs().max())
                for fc, sample in zip(result.fc.per_sample, result.atlas.per_sample, strict=True)
            )
        names.append(min(errors, key=errors.__getitem__))
    return names


# ------------------------------------------------------------------------------------------ static only
@pytest.mark.skipif(capture_level_supported(),
                    reason=f"sglang {SGLANG_VERSION} runs the capture level: the capture tests of this module cover it")
def test_a_static_only_version_refuses_the_capture(serving_cache: SessionCache, models: dict[str, Path]) -> None:
    """Family A: every capture, whatever the deployment (healthy, NaN target), is exactly one typed
    unsupported_version failure that names ``--level static``; no fc, no atlas, no layout claimed."""
    for name in ("ids_1_3_5", "nan_target"):
        r = _capture(serving_cache, models, name)
        assert r.failure_kinds() == (UNSUPPORTED_VERSION,), (name, r.failures)
        assert r.fc is None and r.atlas is None and r.deployment is None and not r.ok, name
        message = r.failures[0].message
        assert f"sglang {SGLANG_VERSION}" in message and "static level only" in message, message
        assert "--level static" in message, message


# ------------------------------------------------------------------------------------------ ids [1,3,5]
SPEC_REWRITE = {"speculative_num_steps": 1, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 16}


@CAPTURE
def test_fc_input_equals_hf_layers_1_3_5(
    serving_cache: SessionCache, models: dict[str, Path], hf_hidden_states: list[tuple[torch.Tensor, ...]]
) -> None:
    r = _capture(serving_cache, models, "ids_1_3_5")
    assert r.failures == (), r.failures
    assert r.deployment is not None
    assert_target_loaded_whole(r.deployment)  # no false target_partly_loaded on the bundled target
    assert r.fc is not None and r.fc.dtype == "float32"
    assert r.fc.hook_calls == 1
    assert [t.shape for t in r.fc.per_sample] == [torch.Size([len(p), 3 * H]) for p in PROBES]
    for fc, hs in zip(r.fc.per_sample, hf_hidden_states, strict=True):
        expected = torch.cat([hs[2], hs[4], hs[6]], dim=-1)  # layer:i is HF output_hidden_states[i+1]
        assert float((fc - expected).abs().max()) <= TOL


def test_layout_1_3_5_from_resolve(serving_cache: SessionCache, models: dict[str, Path]) -> None:
    """ids [1,3,5] serve layer:1,3,5 where ids are honoured; family A serves its default layer:1,3,4 (D1)."""
    plan = _plan([1, 3, 5])
    resolved = _resolve(serving_cache, models, "ids_1_3_5", **SPEC_REWRITE)
    assert resolved.served_sources == plan.served_sources
    assert resolved.layers_to_capture == plan.layers_to_capture
    if plan.used_default:  # D1: the configured ids are never read; the finding says so, as an error
        assert plan.served_sources == _plan(None).served_sources == (layer(1), layer(3), layer(4))
        assert resolved.draft_config_ids is None and resolved.ids_fallback_reason is None
        assert _ids_ignored_note(resolved)[1] == "error"
    else:
        assert plan.served_sources == (layer(1), layer(3), layer(5)) and plan.layers_to_capture == (2, 4, 6)
        assert resolved.draft_config_ids == (1, 3, 5) and resolved.ids_fallback_reason is None
    # D4: family A builds fc with a bias whatever the config says; elsewhere only with config.bias (absent here)
    fc = (resolved.fc_in_features, resolved.fc_out_features, resolved.fc_bias)
    assert fc == (3 * H, H, installed_facts().fc_always_biased)
    assert resolved.fc_applied and resolved.num_aux_hidden_states == 3


@CAPTURE
def test_layout_1_3_5_from_capture_equals_resolve(serving_cache: SessionCache, models: dict[str, Path]) -> None:
    resolved = _resolve(serving_cache, models, "ids_1_3_5", **SPEC_REWRITE)
    captured = _capture(serving_cache, models, "ids_1_3_5")
    want = (layer(1), layer(3), layer(5))
    assert resolved.served_sources == want
    assert captured.deployment is not None and captured.deployment.served_sources == want
    assert tuple(_attribute(captured)) == want


def test_num_draft_tokens_rewrite_is_reported(serving_cache: SessionCache, models: dict[str, Path]) -> None:
    r = _resolve(serving_cache, models, "ids_1_3_5", **SPEC_REWRITE)
    assert r.requested_spec.num_draft_tokens == 16
    assert (r.resolved_spec.num_steps, r.resolved_spec.eagle_topk, r.resolved_spec.num_draft_tokens) == (
        1,
        1,
        2,
    )
    assert any("speculative_num_draft_tokens is adjusted" in w for w in r.spec_warnings), r.spec_warnings
    assert r.server_args["speculative_num_draft_tokens"] == 2


@CAPTURE
def test_atlas_equals_hf_hidden_states(
    serving_cache: SessionCache, models: dict[str, Path], hf_hidden_states: list[tuple[torch.Tensor, ...]]
) -> None:
    r = _capture(serving_cache, models, "ids_1_3_5")
    assert r.atlas is not None and r.atlas.num_layers == NUM_LAYERS
    boundaries = [EMBEDDING, *(layer(i) for i in range(NUM_LAYERS - 1))]
    assert r.atlas.sources() == (*boundaries, FINAL_NORM)
    for sample, hs in zip(r.atlas.per_sample, hf_hidden_states, strict=True):
        for b, name in enumerate(boundaries):  # pre-norm boundary b is HF hs[b] for b <= L-1
            assert float((sample[name] - hs[b]).abs().max()) <= TOL, name
        assert float((sample[FINAL_NORM] - hs[NUM_LAYERS]).abs().max()) <= TOL


@CAPTURE
def test_aux_states_and_kernel_stub(serving_cache: SessionCache, models: dict[str, Path]) -> None:
    r = _capture(serving_cache, models, "ids_1_3_5")
    assert r.fc is not None
    assert (r.fc.aux_states_captured, r.fc.aux_states_expected) == (3, 3)
    # no drafter norms here, so fc saw exactly the target's packed aux states
    assert len(r.fc.aux_per_sample) == len(PROBES)
    for fc, aux in zip(r.fc.per_sample, r.fc.aux_per_sample, strict=True):
        assert torch.equal(fc, aux)
    # The stand-in may run only the KV-pool warm-up copy: nothing on the fc-input path touches sgl_kernel.
    # 0.5.23 calls it once at start-up; 0.5.3/0.4.10 never reach it on CPU (version_facts.FACTS).
    assert r.fc.kernel_stub_active
    assert set(r.fc.kernel_stub_calls) <= {"copy_all_layer_kv_cache_cpu"}, r.fc.kernel_stub_calls
    assert set(r.fc.kernel_stub_calls) == installed_facts().kernel_stub_calls, r.fc.kernel_stub_calls


# ------------------------------------------------------------------------------------------ ids [-1,1,3]
def test_layout_m1_1_3_resolves_as_the_version_serves_it(serving_cache: SessionCache, models: dict[str, Path]) -> None:
    """0.5.22+ serves embedding, layer:1, layer:3; older llama forwards crash on boundary 0 (domain.md D9);
    family A never reads the ids, so it serves its default (D1) and never reaches the crash."""
    plan = _plan([-1, 1, 3])
    d = models["ids_m1_1_3"]
    resolved = serving_cache.resolve(d / "target", d / "draft", server_args={}, timeout_s=200)
    if plan.crash is not None:  # the TypeError of models/llama.py (hs + None), quoted as SGLang raised it
        assert isinstance(resolved, ServingFailure) and resolved.kind == "sglang_exception", resolved
        assert plan.crash in resolved.message
    else:
        assert isinstance(resolved, ResolvedDeployment), resolved
        assert resolved.layers_to_capture == plan.layers_to_capture
        assert resolved.served_sources == plan.served_sources
        if plan.used_default:
            assert plan.served_sources == (layer(1), layer(3), layer(4)) and resolved.draft_config_ids is None
            assert _ids_ignored_note(resolved)[1] == "error"
        else:
            assert plan.served_sources == (EMBEDDING, layer(1), layer(3)) and plan.layers_to_capture == (0, 2, 4)


@CAPTURE
def test_layout_m1_1_3_capture_serves_embedding_or_the_crash(serving_cache: SessionCache,
                                                             models: dict[str, Path]) -> None:
    plan = _plan([-1, 1, 3])
    captured = _capture(serving_cache, models, "ids_m1_1_3")
    if plan.crash is not None:
        assert captured.fc is None and captured.failure_kinds() == ("sglang_exception",), captured.failures
        assert plan.crash in captured.failures[0].message and " at sglang/" in captured.failures[0].message
        assert captured.deployment is not None and captured.deployment.layers_to_capture == (0, 2, 4)
    else:
        want = (EMBEDDING, layer(1), layer(3))
        assert plan.served_sources == want
        assert captured.failures == (), captured.failures
        assert captured.deployment is not None and captured.deployment.served_sources == want
        assert tuple(_attribute(captured)) == want


# ------------------------------------------------------------------------------------------ no eagle_config
def test_no_eagle_config_falls_back_to_sglang_default(
    serving_cache: SessionCache, models: dict[str, Path]
) -> None:
    plan = _plan(None)
    r = _resolve(serving_cache, models, "no_eagle_config")
    assert r.draft_config_ids is None
    assert r.layers_to_capture == plan.layers_to_capture == (2, 4, 5)  # [2, L//2, L-3], sglang models/llama.py:934-936
    assert r.served_sources == plan.served_sources == (layer(1), layer(3), layer(4))
    if _plan([1, 3, 5]).used_default:
        # family A reads no ids at all (D1), so there is no fallback to explain: the draft_ids_ignored note names
        # the defaults, a warning only, since this config asks for no ids
        assert r.ids_fallback_reason is None and _ids_ignored_note(r)[1] == "warning"
    else:
        assert r.ids_fallback_reason is not None and "no eagle_config" in r.ids_fallback_reason


# ------------------------------------------------------------------------------------------ failure modes
@CAPTURE
def test_nan_in_target_is_nonfinite_failure(serving_cache: SessionCache, models: dict[str, Path]) -> None:
    r = _capture(serving_cache, models, "nan_target", atlas=False)
    kinds = r.failure_kinds()
    assert "nonfinite" in kinds, r.failures
    assert not r.ok
    assert {f.sample for f in r.failures if f.kind == "nonfinite"} == set(range(len(PROBES)))


def test_one_aux_checkpoint_resolves_as_the_version_builds_fc(
    serving_cache: SessionCache, models: dict[str, Path]
) -> None:
    d = models["one_aux_fc_skipped"]
    resolved = serving_cache.resolve(d / "target", d / "draft", server_args={}, timeout_s=200)
    if installed_facts().fc_width_fixed_at_3:
        # fc is Linear(3*H_t, H_d) whatever the config says (D5): the [H, H] checkpoint fails to load
        assert isinstance(resolved, ServingFailure) and resolved.kind == "sglang_exception", resolved
        assert f"Linear(3*{H}, {H})" in resolved.message
    else:
        # one aux id and H_t == H_d: SGLang never applies fc (llama_eagle3.py:238, domain.md D10)
        assert isinstance(resolved, ResolvedDeployment), resolved
        assert not resolved.fc_applied and resolved.served_sources == (layer(3),)


@CAPTURE
def test_fc_skipped_when_width_equals_draft_hidden_is_fc_not_called(
    serving_cache: SessionCache, models: dict[str, Path]
) -> None:
    r = _capture(serving_cache, models, "one_aux_fc_skipped", atlas=False)
    assert r.fc is None and not r.ok
    if installed_facts().fc_width_fixed_at_3:  # the checkpoint fails to load (D5)
        assert r.failure_kinds() == ("sglang_exception",), r.failures
        assert "during start-up: AssertionError: Attempted to load weight" in r.failures[0].message
        return
    assert r.failure_kinds() == ("fc_not_called",), r.failures
    assert "k*H_t == H_d" in r.failures[0].message
    assert r.deployment is not None and not r.deployment.fc_applied


def test_capture_reuses_child_within_session(serving_cache: SessionCache, models: dict[str, Path]) -> None:
    first = _capture(serving_cache, models, "ids_1_3_5")
    misses = serving_cache.misses
    assert _capture(serving_cache, models, "ids_1_3_5") is first
    assert serving_cache.misses == misses


@CAPTURE
def test_unreachable_layer_is_count_short_and_sglang_raises(
    serving_cache: SessionCache, models: dict[str, Path]
) -> None:
    r = _capture(serving_cache, models, "ids_1_3_7", atlas=False)
    assert r.deployment is not None
    assert r.deployment.layers_to_capture == (2, 4, 8) and r.deployment.unreachable_boundaries == (8,)
    assert r.deployment.served_sources == (layer(1), layer(3))
    kinds = r.failure_kinds()
    assert "capture_count_short" in kinds and "sglang_exception" in kinds, r.failures
    assert not r.ok
    raised = next(f for f in r.failures if f.kind == "sglang_exception")
    # SGLang's own fc matmul fails on the 2*H wide input; the message names SGLang's file:line
    assert "RuntimeError" in raised.message and " at sglang/" in raised.message, raised.message
    assert r.fc is not None and (r.fc.aux_states_captured, r.fc.aux_states_expected) == (2, 3)
    assert r.fc.per_sample[0].shape[-1] == 2 * H
