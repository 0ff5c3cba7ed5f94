"""SGLang's own acceptance on a live server: each probe request's ``meta_info`` histogram, judged
against the contract's band as vLLM's per-request counts are; where the server cannot decode, the refusal is its own.

The answers are ``/generate`` bodies shaped as sglang 0.5.23 writes them (``managers/tokenizer_manager.py:3148-3201``:
``spec_verify_ct``, ``spec_accept_length``, ``spec_num_correct_drafts``, ``spec_correct_drafts_histogram``); a GPU
server's real answers cannot be had on this CPU. The decode refusal on this CPU runs on the real server in
tests/serving/test_sglang_live_server.py (the seed's wiring at ``--level all``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from specparity.compare.findings import FindingKind
from specparity.replay.server_acceptance import judge
from specparity.serving.live.server import ServerError
from specparity.serving.results import (
    NEEDS_HARDWARE,
    UNSUPPORTED_VERSION,
    CaptureResult,
    FcCapture,
    OutcomeRequest,
)
from specparity.serving.sglang import engine as sglang_engine
from specparity.serving.sglang.live import acceptance_from_meta


def _meta(hist: list[int], steps: int = 3) -> dict[str, Any]:
    """One request's meta_info as 0.5.23 fills it at finish (tokenizer_manager.py:3155-3201)."""
    verify = sum(hist)
    correct = sum(j * n for j, n in enumerate(hist))
    return {"completion_tokens": correct + verify, "spec_verify_ct": verify,
            "spec_accept_rate": correct / (verify * steps), "spec_accept_length": (correct + verify) / verify,
            "spec_num_correct_drafts": correct, "spec_num_proposed_drafts": verify * steps,
            "spec_correct_drafts_histogram": hist}


def test_the_histogram_gives_per_position_acceptance() -> None:
    """Entry j counts the verify steps that accepted exactly j drafts; position k is accepted in those with > k."""
    acc, why = acceptance_from_meta([_meta([2, 3, 1, 4]), _meta([1, 0, 0, 5]), {}])  # the last ended at prefill
    assert why is None and acc is not None
    assert acc.drafts == 16 and acc.accepted_per_position == (13, 10, 9)
    assert acc.accepted == 32 == sum(j * n for j, n in enumerate([3, 3, 1, 9]))


def test_a_release_with_pooled_figures_only_is_named() -> None:
    pooled = {k: v for k, v in _meta([1, 2]).items() if k != "spec_correct_drafts_histogram"}
    acc, why = acceptance_from_meta([pooled])
    assert acc is None and why is not None and "pooled per request" in why
    acc, why = acceptance_from_meta([{}, {}])
    assert acc is None and why is not None and "verified no draft" in why


@pytest.mark.parametrize(("hist", "capture_matches", "state", "kinds"), [
    ([10, 10, 10, 70], True, "inside", []),  # healthy: 80% at the first position against 0.6
    ([85, 10, 5, 0], False, "below", [FindingKind.SERVED_ACCEPTANCE_COLLAPSE]),  # the seed: 15%
    ([85, 10, 5, 0], True, "below", [FindingKind.SERVED_ACCEPTANCE_COLLAPSE]),  # beyond what the capture sees
    ([3, 1, 0, 0], True, "inconclusive", [FindingKind.SERVER_ACCEPTANCE_UNMEASURED]),  # 1 of 4: cannot tell
])
def test_the_four_cases_from_sglangs_own_counts(hist: list[int], capture_matches: bool, state: str,
                                                kinds: list[FindingKind]) -> None:
    acc, _ = acceptance_from_meta([_meta(hist)])
    assert acc is not None
    figures = {"drafts": acc.drafts, "accepted_per_position": list(acc.accepted_per_position),
               "source": "per_request", "other_requests": None}
    out, findings = judge(figures, reference=[0.6, 0.4, 0.3], reference_from="contract",
                          capture_matches=capture_matches, replay_diagnosis="healthy", engine="SGLang")
    assert out["state"] == state and [f.kind for f in findings] == kinds
    if state == "below":
        assert out["confirms"] == ("beyond_capture" if capture_matches else "wiring")


class _Client:
    def __init__(self, answers: list[Any] | Exception) -> None:
        self.answers, self.sent = answers, []

    def post(self, path: str, **kw: Any) -> None:  # /flush_cache
        return None

    def post_json(self, path: str, body: dict[str, Any]) -> Any:
        self.sent.append(body)
        if isinstance(self.answers, Exception):
            raise self.answers
        return self.answers.pop(0)


def _capture(device: str) -> CaptureResult:
    from tests.resolved_deployments import tiny_deployment

    dep = tiny_deployment(Path("fixtures/default"), device=device)
    fc = FcCapture(per_sample=[torch.zeros(3, 192)], dtype="float32", engine_version="0.5.23", hook_calls=1,
                   aux_states_captured=3, aux_states_expected=3, kernel_stub_calls=())
    return CaptureResult(dep, fc, None, ())


REQUEST = OutcomeRequest(recorded_fc=(torch.zeros(3, 192),), prompt_lengths=(2,))


def test_a_gpu_server_is_asked_and_its_counts_are_the_figure() -> None:
    client = _Client([{"text": "x", "meta_info": _meta([1, 2, 3, 4])}])
    refusal, acc, loop = sglang_engine._served_acceptance(client, _capture("cuda"), REQUEST, [[5, 6, 7]],
                                                          launched_in=None)
    assert refusal is None and acc is not None and acc.accepted_per_position == (9, 7, 4)
    assert loop["source"] == "server_metrics" and loop["acceptance_source"] == "per_request"
    assert client.sent[0]["input_ids"] == [5, 6]  # the prompt up to the assistant's first token
    assert client.sent[0]["sampling_params"]["temperature"] == 0


def test_a_release_without_the_histogram_is_exit_3_by_name() -> None:
    pooled = {k: v for k, v in _meta([1, 2]).items() if k != "spec_correct_drafts_histogram"}
    refusal, acc, _ = sglang_engine._served_acceptance(_Client([{"meta_info": pooled}]), _capture("cuda"), REQUEST,
                                                       [[5, 6, 7]], launched_in=None)
    assert acc is None and refusal is not None and refusal.kind == UNSUPPORTED_VERSION


def test_an_attached_cpu_server_is_sent_no_decode() -> None:
    client = _Client([])
    refusal, acc, _ = sglang_engine._served_acceptance(client, _capture("cpu"), REQUEST, [[5, 6, 7]],
                                                       launched_in=None)
    assert client.sent == [] and acc is None and refusal is not None and refusal.kind == NEEDS_HARDWARE
    assert "mem_cache/allocation.py:746" in refusal.message and "did not start" in refusal.message


def test_a_launched_server_that_refuses_the_decode_is_named_from_its_own_log(tmp_path: Path) -> None:
    """The server is asked; its scheduler's traceback (this CPU's, as 0.5.23 writes it) names the call and the
    installed release's frames, and the outcome is exit 3 (needs_hardware), never a verdict."""
    (tmp_path / "server.log").write_text("\n".join([
        "Traceback (most recent call last):",
        '  File "/venv/lib/python3.11/site-packages/sglang/srt/speculative/eagle_utils.py", line 910, in '
        "eagle_prepare_for_decode",
        '  File "/venv/lib/python3.11/site-packages/sglang/srt/mem_cache/allocation.py", line 746, in '
        "assign_req_to_token_pool_func",
        "NotImplementedError: sgl_kernel.assign_req_to_token_pool_cpu was called, but only the allowlisted ops run",
    ]))
    refusal, acc, _ = sglang_engine._served_acceptance(_Client(ServerError("connection reset")), _capture("cpu"),
                                                       REQUEST, [[5, 6, 7]], launched_in=tmp_path)
    assert acc is None and refusal is not None and refusal.kind == NEEDS_HARDWARE
    assert "eagle_utils.py:910" in refusal.message and "allocation.py:746" in refusal.message
