"""The outcome level without an engine: the replay transport, server-arg sizing, the wiring of sides, and the
rule that the outcome never passes without the engine's own figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from replay_builders import VOCAB, tiny_drafter
from safetensors.torch import save_file

from specparity.compare.findings import FindingKind, Severity
from specparity.contract.probes import ProbePack, ProbeSample
from specparity.replay.outcome import outcome_from_capture
from specparity.serving.drafter_replay import read_replay, sized_server_args
from specparity.serving.results import (
    BAD_DEPLOYMENT,
    NONFINITE,
    SGLANG_EXCEPTION,
    UNSUPPORTED_VERSION,
    CaptureResult,
    DrafterReplay,
    FcCapture,
    LoopAcceptance,
    ServingFailure,
)
from specparity.serving.sglang.client import capture_deployment

T = 12


def test_replay_transport_failures_are_typed(tmp_path: Path) -> None:
    out = tmp_path / "replay.safetensors"
    missing = read_replay(out, 1)
    assert isinstance(missing, ServingFailure) and missing.kind == UNSUPPORTED_VERSION
    Path(str(out) + ".json").write_text(json.dumps({"ok": False, "error": "RuntimeError: boom", "traceback": "tb"}))
    failed = read_replay(out, 1)
    assert isinstance(failed, ServingFailure) and failed.kind == SGLANG_EXCEPTION and "boom" in failed.message


def test_replay_transport_reads_logits_and_maps_draft_ids(tmp_path: Path) -> None:
    out = tmp_path / "replay.safetensors"
    logits = torch.zeros(3, 4)
    logits[torch.arange(3), torch.tensor([0, 2, 3])] = 1.0
    save_file({"served/0": logits, "recorded/0": logits.flip(0).contiguous(),
               "hot_token_id": torch.tensor([10, 11, 12, 13])}, str(out))
    Path(str(out) + ".json").write_text(json.dumps({"ok": True, "passes": {"served": {"fc_calls": 1}}}))
    replay = read_replay(out, 1)
    assert isinstance(replay, DrafterReplay)
    assert replay.first_drafts("served")[0].tolist() == [10, 12, 13]
    assert replay.first_drafts("recorded")[0].tolist() == [13, 12, 10]
    assert replay.passes == {"served": {"fc_calls": 1}}


def test_server_args_get_room_for_the_replay_but_user_values_win() -> None:
    probes = [[1] * 100, [2] * 50]
    cpu = sized_server_args(None, device="cpu", probes=probes)
    assert cpu == {"max_running_requests": 48, "max_total_tokens": 4096}
    big = sized_server_args(None, device="cpu", probes=[[1] * 1000] * 20)
    assert big == {"max_running_requests": 108, "max_total_tokens": 6 * 20000 + 256}
    assert sized_server_args({"max_total_tokens": 99}, device="cpu", probes=probes)["max_total_tokens"] == 99
    assert "max_total_tokens" not in sized_server_args(None, device="cuda", probes=probes)


def test_mismatched_recorded_rows_fail_before_any_child(tmp_path: Path) -> None:
    capture = capture_deployment(tmp_path, tmp_path, probes=[[1, 2, 3]], recorded_fc=[torch.zeros(2, 4)])
    assert isinstance(capture.replay, ServingFailure) and capture.replay.kind == BAD_DEPLOYMENT
    assert capture.fc is None and capture.failures == (capture.replay,)


def _pack_and_head(seed: int) -> tuple[ProbePack, torch.Tensor]:
    d = tiny_drafter(seed=seed)
    gen = torch.Generator().manual_seed(seed)
    head = torch.randn(VOCAB, 8, generator=gen)
    samples = [ProbeSample(input_ids=torch.randint(0, VOCAB, (T,), generator=gen),
                           fc_input=torch.randn(T, d.shape.fc_in_features, generator=gen),
                           loss_mask=torch.tensor([0] * 4 + [1] * (T - 4)),
                           final_norm=torch.randn(T, 8, generator=gen)) for _ in range(3)]
    return ProbePack(samples=samples, sources=["layer:1", "layer:3", "layer:5"], hidden_size=16), head


def test_identical_served_input_gives_identical_acceptance() -> None:
    pack, head = _pack_and_head(1)
    d = tiny_drafter(seed=1)
    report = outcome_from_capture(drafter=d, target_lm_head=head, probes=pack, num_steps=2, engine_replay=None,
                                  capture=_capture([s.fc_input.clone() for s in pack.samples]))
    assert report.recorded == report.served
    assert report.recorded.rows == 3 * (T - 4)  # rows 3..T-2: x_{t+1} is an answer token
    assert report.first_draft_source == "training_side" and report.engine_agreement is None


def test_engine_first_drafts_drive_position_one_and_agreement_is_measured() -> None:
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

    fake = DrafterReplay(served_logits=[perfect(g) for g in greedy], recorded_logits=[perfect(g) for g in greedy],
                        hot_token_id=d.hot_token_id, passes={})
    report = outcome_from_capture(drafter=d, target_lm_head=head, probes=pack, num_steps=1, engine_replay=fake,
                                  capture=_capture([s.fc_input for s in pack.samples]))
    reachable = sum(int(g[t + 1]) in draft_of for g in greedy for t in range(4 - 1, T - 1))
    assert report.recorded.accepted[0] == reachable
    assert report.first_draft_source == "engine"
    assert report.engine_agreement is not None and 0.0 <= report.engine_agreement["served"] < 1.0


def test_missing_capture_or_final_norm_is_an_error_not_a_pass() -> None:
    pack, head = _pack_and_head(3)
    d = tiny_drafter(seed=3)
    failed = CaptureResult(None, None, None, (ServingFailure(SGLANG_EXCEPTION, "x"),))
    with pytest.raises(ValueError, match="no fc input"):
        outcome_from_capture(drafter=d, target_lm_head=head, probes=pack, capture=failed, engine_replay=None,
                             num_steps=1)
    bare = ProbePack(samples=[ProbeSample(s.input_ids, s.fc_input) for s in pack.samples], sources=pack.sources,
                     hidden_size=16)
    with pytest.raises(ValueError, match="final_norm"):
        outcome_from_capture(drafter=d, target_lm_head=head, probes=bare, engine_replay=None, num_steps=1,
                             capture=_capture([s.fc_input for s in pack.samples]))


def _contract() -> Any:
    from specparity.contract import load_contract

    return load_contract(Path(__file__).resolve().parents[2] / "contracts" / "tiny-llama-eagle3.json")


def test_unsupported_drafter_is_an_error_naming_the_key_never_a_pass(tmp_path: Path) -> None:
    from replay_builders import write_dirs

    from specparity.replay.outcome import check_outcome

    draft, target, _ = write_dirs(tmp_path, cfg_extra={"fc_norm": True})
    pack, _ = _pack_and_head(4)
    capture = _capture([s.fc_input for s in pack.samples], replay=_perfect_replay(pack))
    out = check_outcome(_contract(), pack, capture, target=target, draft=draft, engine="SGLang")
    assert out.summary is None and out.report is None
    [f] = out.findings
    assert (f.kind, f.severity) == (FindingKind.ENGINE_ERROR, Severity.ERROR)
    assert "training-side replay cannot run this drafter" in f.message and "fc_norm" in f.message


def _perfect_replay(pack: ProbePack) -> DrafterReplay:
    n = [int(s.input_ids.shape[0]) for s in pack.samples]
    return DrafterReplay(served_logits=[torch.zeros(t, 24) for t in n], recorded_logits=[torch.zeros(t, 24) for t in n],
                         hot_token_id=None, passes={})


def _capture(fc: list[torch.Tensor], *, replay: DrafterReplay | ServingFailure | None = None,
             acceptance: LoopAcceptance | None = None) -> CaptureResult:
    return CaptureResult(deployment=None, atlas=None, failures=(), replay=replay, acceptance=acceptance,
                         fc=FcCapture(per_sample=fc, dtype="float32", engine_version="test", hook_calls=1,
                                      aux_states_captured=3, aux_states_expected=3, kernel_stub_calls=()))


@pytest.fixture
def bundle_dirs(tmp_path: Path) -> tuple[Path, Path, ProbePack]:
    """A drafter on disk the training side loads, with probes fitting it."""
    from replay_builders import write_dirs

    draft, target, ref = write_dirs(tmp_path)
    gen = torch.Generator().manual_seed(5)
    samples = [ProbeSample(input_ids=torch.randint(0, VOCAB, (T,), generator=gen),
                           fc_input=torch.randn(T, ref.shape.fc_in_features, generator=gen),
                           loss_mask=torch.tensor([0] * 4 + [1] * (T - 4)),
                           final_norm=torch.randn(T, ref.shape.hidden, generator=gen)) for _ in range(3)]
    return draft, target, ProbePack(samples=samples, sources=["layer:1", "layer:3", "layer:5"], hidden_size=16)


@pytest.mark.parametrize("figures", ["replay", "loop", "both"])
def test_the_engines_own_figures_let_the_outcome_stand(bundle_dirs: tuple[Path, Path, ProbePack], figures: str) -> None:
    from specparity.replay.outcome import check_outcome

    draft, target, pack = bundle_dirs
    replay = _perfect_replay(pack) if figures in ("replay", "both") else None
    acc = LoopAcceptance("vllm", drafts=10, accepted_per_position=(7, 4, 1), accepted=12) if figures != "replay" else None
    out = check_outcome(_contract(), pack, _capture([s.fc_input for s in pack.samples], replay=replay, acceptance=acc),
                        target=target, draft=draft, engine="X")
    assert out.summary is not None and out.report is not None
    assert not [f for f in out.findings if f.kind is FindingKind.ENGINE_ERROR]
    assert out.report.first_draft_source == ("engine" if replay is not None else "training_side")
    assert (out.summary.engine_loop is not None) == (acc is not None)


@pytest.mark.parametrize(("replay", "kind", "words"), [
    (None, FindingKind.ENGINE_ERROR, "X reported no acceptance of its own"),
    (ServingFailure(SGLANG_EXCEPTION, "the drafter replay raised RuntimeError at sglang/x.py:1"),
     FindingKind.ENGINE_ERROR, "X drafter replay unavailable"),
    (ServingFailure(UNSUPPORTED_VERSION, "this SGLang adapter ran no drafter replay"), FindingKind.ENGINE_ERROR,
     "training-side replay alone"),
    (ServingFailure(NONFINITE, "SGLang's drafter produced NaN/Inf logits (served/0)"), FindingKind.NONFINITE,
     "NaN/Inf"),
])
def test_without_the_engines_own_figures_the_outcome_never_passes(
        bundle_dirs: tuple[Path, Path, ProbePack], replay: ServingFailure | None, kind: FindingKind,
        words: str) -> None:
    """The training-side replay alone is no pass, however healthy its figures."""
    from specparity.replay.outcome import check_outcome

    draft, target, pack = bundle_dirs
    out = check_outcome(_contract(), pack, _capture([s.fc_input for s in pack.samples], replay=replay),
                        target=target, draft=draft, engine="X")
    assert out.summary is not None  # the training side still says what it measured
    errors = [f for f in out.findings if f.kind is kind and f.severity is Severity.ERROR]
    assert errors and words in errors[0].message and errors[0].details["check"] == "outcome"
    if replay is not None:
        assert replay.message in errors[0].message


def test_a_capture_without_fc_input_leaves_the_outcome_to_the_capture_failures(
        bundle_dirs: tuple[Path, Path, ProbePack]) -> None:
    from specparity.replay.outcome import check_outcome

    draft, target, pack = bundle_dirs
    failed = CaptureResult(None, None, None, (ServingFailure(SGLANG_EXCEPTION, "x"),))
    out = check_outcome(_contract(), pack, failed, target=target, draft=draft)
    assert out.summary is None and out.findings == ()
