"""Outcome orchestration without SGLang: the replay transport, server-arg sizing, and the wiring of sides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from replay_builders import VOCAB, tiny_drafter
from safetensors.torch import save_file

from specparity.contract.probes import ProbePack, ProbeSample
from specparity.replay.outcome import outcome_from_capture
from specparity.replay.served import SglangReplay, _read_replay, _sized_server_args, capture_with_replay
from specparity.serving.results import (
    BAD_DEPLOYMENT,
    SGLANG_EXCEPTION,
    UNSUPPORTED_VERSION,
    CaptureResult,
    FcCapture,
    ServingFailure,
)

T = 12


def test_replay_transport_failures_are_typed(tmp_path: Path) -> None:
    out = tmp_path / "replay.safetensors"
    missing = _read_replay(out, 1)
    assert isinstance(missing, ServingFailure) and missing.kind == UNSUPPORTED_VERSION
    Path(str(out) + ".json").write_text(json.dumps({"ok": False, "error": "RuntimeError: boom", "traceback": "tb"}))
    failed = _read_replay(out, 1)
    assert isinstance(failed, ServingFailure) and failed.kind == SGLANG_EXCEPTION and "boom" in failed.message


def test_replay_transport_reads_logits_and_maps_draft_ids(tmp_path: Path) -> None:
    out = tmp_path / "replay.safetensors"
    logits = torch.zeros(3, 4)
    logits[torch.arange(3), torch.tensor([0, 2, 3])] = 1.0
    save_file({"served/0": logits, "recorded/0": logits.flip(0).contiguous(),
               "hot_token_id": torch.tensor([10, 11, 12, 13])}, str(out))
    Path(str(out) + ".json").write_text(json.dumps({"ok": True, "passes": {"served": {"fc_calls": 1}}}))
    replay = _read_replay(out, 1)
    assert isinstance(replay, SglangReplay)
    assert replay.first_drafts("served")[0].tolist() == [10, 12, 13]
    assert replay.first_drafts("recorded")[0].tolist() == [13, 12, 10]
    assert replay.passes == {"served": {"fc_calls": 1}}


def test_server_args_get_room_for_the_replay_but_user_values_win() -> None:
    probes = [[1] * 100, [2] * 50]
    cpu = _sized_server_args(None, device="cpu", probes=probes)
    assert cpu == {"max_running_requests": 48, "max_total_tokens": 4096}
    big = _sized_server_args(None, device="cpu", probes=[[1] * 1000] * 20)
    assert big == {"max_running_requests": 108, "max_total_tokens": 6 * 20000 + 256}
    assert _sized_server_args({"max_total_tokens": 99}, device="cpu", probes=probes)["max_total_tokens"] == 99
    assert "max_total_tokens" not in _sized_server_args(None, device="cuda", probes=probes)


def test_mismatched_recorded_rows_fail_before_any_child(tmp_path: Path) -> None:
    capture, replay = capture_with_replay(tmp_path, tmp_path, probes=[[1, 2, 3]], recorded_fc=[torch.zeros(2, 4)])
    assert isinstance(replay, ServingFailure) and replay.kind == BAD_DEPLOYMENT
    assert capture.fc is None and capture.failures == (replay,)


def _pack_and_head(seed: int) -> tuple[ProbePack, torch.Tensor]:
    d = tiny_drafter(seed=seed)
    gen = torch.Generator().manual_seed(seed)
    head = torch.randn(VOCAB, 8, generator=gen)
    samples = [ProbeSample(input_ids=torch.randint(0, VOCAB, (T,), generator=gen),
                           fc_input=torch.randn(T, d.shape.fc_in_features, generator=gen),
                           loss_mask=torch.tensor([0] * 4 + [1] * (T - 4)),
                           final_norm=torch.randn(T, 8, generator=gen)) for _ in range(3)]
    return ProbePack(samples=samples, sources=["layer:1", "layer:3", "layer:5"], hidden_size=16), head


def _capture(fc: list[torch.Tensor]) -> CaptureResult:
    return CaptureResult(deployment=None, atlas=None, failures=(), fc=FcCapture(
        per_sample=fc, dtype="float32", sglang_version="test", hook_calls=1, aux_states_captured=3,
        aux_states_expected=3, kernel_stub_calls=()))


def test_identical_served_input_gives_identical_acceptance() -> None:
    pack, head = _pack_and_head(1)
    d = tiny_drafter(seed=1)
    report = outcome_from_capture(drafter=d, target_lm_head=head, probes=pack, num_steps=2, sglang=None,
                                  capture=_capture([s.fc_input.clone() for s in pack.samples]))
    assert report.recorded == report.served
    assert report.recorded.rows == 3 * (T - 4)  # rows 3..T-2: x_{t+1} is an answer token
    assert report.first_draft_source == "training_side" and report.sglang_agreement is None


def test_sglang_first_drafts_drive_position_one_and_agreement_is_measured() -> None:
    pack, head = _pack_and_head(2)
    d = tiny_drafter(seed=2)
    greedy = [(s.final_norm @ head.T).argmax(-1) for s in pack.samples if s.final_norm is not None]
    # logits whose argmax is G_{t+1} in draft ids: the drafter's hot map is draft + (draft % 3)
    assert d.hot_token_id is not None
    draft_of = {int(t): i for i, t in enumerate(d.hot_token_id.tolist())}

    def perfect(g: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(T, d.shape.draft_vocab)
        for t in range(T - 1):
            logits[t, draft_of.get(int(g[t + 1]), 0)] = 1.0
        return logits

    fake = SglangReplay(served_logits=[perfect(g) for g in greedy], recorded_logits=[perfect(g) for g in greedy],
                        hot_token_id=d.hot_token_id, passes={})
    report = outcome_from_capture(drafter=d, target_lm_head=head, probes=pack, num_steps=1, sglang=fake,
                                  capture=_capture([s.fc_input for s in pack.samples]))
    reachable = sum(int(g[t + 1]) in draft_of for g in greedy for t in range(4 - 1, T - 1))
    assert report.recorded.accepted[0] == reachable
    assert report.sglang_agreement is not None and 0.0 <= report.sglang_agreement["served"] < 1.0


def test_missing_capture_or_final_norm_is_an_error_not_a_pass() -> None:
    pack, head = _pack_and_head(3)
    d = tiny_drafter(seed=3)
    failed = CaptureResult(None, None, None, (ServingFailure(SGLANG_EXCEPTION, "x"),))
    with pytest.raises(ValueError, match="no fc input"):
        outcome_from_capture(drafter=d, target_lm_head=head, probes=pack, capture=failed, sglang=None, num_steps=1)
    bare = ProbePack(samples=[ProbeSample(s.input_ids, s.fc_input) for s in pack.samples], sources=pack.sources,
                     hidden_size=16)
    with pytest.raises(ValueError, match="final_norm"):
        outcome_from_capture(drafter=d, target_lm_head=head, probes=bare, sglang=None, num_steps=1,
                             capture=_capture([s.fc_input for s in pack.samples]))


def test_unsupported_drafter_still_returns_the_capture_and_says_why(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from typing import Any, cast

    from replay_builders import write_dirs

    from specparity.replay import outcome

    draft, target, _ = write_dirs(tmp_path, cfg_extra={"fc_norm": True})
    pack, _ = _pack_and_head(4)
    sentinel = _capture([s.fc_input for s in pack.samples])
    calls: list[dict[str, Any]] = []

    def fake_capture(*args: Any, **kw: Any) -> CaptureResult:
        calls.append(kw)
        return sentinel

    monkeypatch.setattr(outcome, "capture_deployment", fake_capture)
    run = outcome.check_outcome(cast(Any, None), pack, target=target, draft=draft)
    assert run.capture is sentinel and run.report is None and len(calls) == 1 and calls[0]["atlas"] is True
    assert [f.kind for f in run.failures] == [UNSUPPORTED_VERSION]
    assert "fc_norm" in run.failures[0].message
