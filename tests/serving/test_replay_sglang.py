"""Outcome level on real SGLang: drafter acceptance on recorded vs served fc inputs.

Three deployments of the bundled default (fixtures/default), one SGLang child each (the engine adapter's
capture with an outcome request: capture + SGLang's own drafter replay in the same run), consumed by
specparity.replay.outcome.check_outcome, shared by every test through module-scoped fixtures:

- ``healthy``: the bundle as trained (draft ids [1,3,5] -> layer:1, layer:3, layer:5);
- ``kimi``: the Kimi-K2.5 miswiring, draft ids [-1,1,3] -> SGLang 0.5.23 serves embedding, layer:1, layer:3;
  before 0.5.22 the llama forward crashes on it (domain.md D9): there the expectation is that crash, as a
  failure with no outcome report (the conventions model of the installed version says which);
- ``shuffled``: fc.weight's input columns permuted (a broken drafter, wiring intact).

The cross-check pins the training-side drafter (specparity.replay.drafter) to SGLang's real
LlamaForCausalLMEagle3 forward on the same inputs.

Family A (0.4.4.post2-0.4.8) is served at the static level only, so it has no outcome level either:
:func:`test_a_static_only_version_refuses_the_outcome_level` pins that refusal, and the outcome tests are
skipped there by name with that reason.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from version_facts import SGLANG_VERSION, capture_level_supported, needs_capture_level

from specparity.compare.findings import FindingKind, Severity
from specparity.contract.model import Contract
from specparity.contract.probes import ProbePack, read_probe_pack
from specparity.idrules import sglang
from specparity.replay.acceptance import draft_next_ids, greedy_from_final_norm
from specparity.replay.checkpoint import read_target_lm_head
from specparity.replay.diagnosis import diagnose
from specparity.replay.drafter import Eagle3Drafter
from specparity.replay.outcome import OutcomeCheck, OutcomeReport, check_outcome
from specparity.serving.engine import get_engine
from specparity.serving.results import (
    UNSUPPORTED_VERSION,
    CaptureResult,
    DrafterReplay,
    OutcomeRequest,
    ServingFailure,
)

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.usefixtures("sglang_required")]

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "fixtures" / "default"
LOGIT_ATOL = 2e-5  # fp32, torch_native on CPU; measured max |d| 4.8e-6 (printed with -s)
# What the installed SGLang does with [-1,1,3] on the bundled llama target (L=8): None serves, else the crash.
KIMI_CRASH = (sglang.capture_plan([-1, 1, 3], num_layers=8, architecture="LlamaForCausalLM",
                                  version=SGLANG_VERSION).crash if SGLANG_VERSION is not None else None)
# the outcome level runs on the capture's engine start: none where only the static level is offered (family A)
OUTCOME = needs_capture_level("tests/serving/test_replay_sglang.py::test_a_static_only_version_refuses_the_outcome_level")


@pytest.fixture(scope="module")
def bundle() -> Path:
    if not (BUNDLE / "draft" / "config.json").is_file():
        pytest.fail(f"the embedded default is missing: {BUNDLE} (regenerate with fixtures/make_default.py)")
    return BUNDLE


@pytest.fixture(scope="module")
def contract_and_pack(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Contract, ProbePack]:
    from specparity.training.specforge import contract_from_specforge

    out = tmp_path_factory.mktemp("contract") / "tiny.json"
    contract, path = contract_from_specforge(bundle / "hidden_states", bundle / "draft", bundle / "target", out=out,
                                             vocab_mapping=bundle / "vocab_mapping" / "vocab_mapping.pt", probes=8)
    return contract, read_probe_pack(path.parent / contract.probes.file)


def _variant(bundle: Path, root: Path, name: str) -> Path:
    d = root / name
    shutil.copytree(bundle / "draft", d)
    if name == "kimi":
        cfg = json.loads((d / "config.json").read_text())
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [-1, 1, 3]
        (d / "config.json").write_text(json.dumps(cfg, indent=1))
    elif name == "shuffled":
        t = load_file(str(d / "model.safetensors"))
        perm = torch.randperm(t["fc.weight"].shape[1], generator=torch.Generator().manual_seed(0))
        t["fc.weight"] = t["fc.weight"][:, perm].contiguous()
        save_file(t, str(d / "model.safetensors"))
    return d


@dataclass(frozen=True)
class OutcomeRun:
    """One engine run's evidence and what the outcome level made of it."""

    capture: CaptureResult
    check: OutcomeCheck

    @property
    def report(self) -> OutcomeReport | None:
        return self.check.report

    @property
    def replay(self) -> DrafterReplay | None:
        return self.capture.replay if isinstance(self.capture.replay, DrafterReplay) else None

    @property
    def failures(self) -> tuple[ServingFailure, ...]:
        why = (self.capture.replay,) if isinstance(self.capture.replay, ServingFailure) else ()
        return (*self.capture.failures, *(f for f in why if f not in self.capture.failures))


def _outcome_run(bundle: Path, draft: Path, contract: Contract, pack: ProbePack) -> OutcomeRun:
    """One engine start: the capture with an outcome request, and what the outcome level made of it."""
    engine = get_engine("sglang")
    request = OutcomeRequest(recorded_fc=tuple(s.fc_input for s in pack.samples),
                             prompt_lengths=tuple(s.num_tokens for s in pack.samples))
    capture = engine.capture(bundle / "target", draft, probes=[s.input_ids.tolist() for s in pack.samples],
                             args={}, device="cpu", timeout_s=300, python=None, progress=None, outcome=request)
    return OutcomeRun(capture, check_outcome(contract, pack, capture, target=bundle / "target", draft=draft,
                                             engine=engine.label, num_steps=3))


@pytest.fixture(scope="module")
def runs(bundle: Path, contract_and_pack: tuple[Contract, ProbePack],
         tmp_path_factory: pytest.TempPathFactory) -> dict[str, OutcomeRun]:
    contract, pack = contract_and_pack
    root = tmp_path_factory.mktemp("drafts")
    drafts = {"healthy": bundle / "draft", "kimi": _variant(bundle, root, "kimi"),
              "shuffled": _variant(bundle, root, "shuffled")}
    out = {}
    for name, draft in drafts.items():
        run = _outcome_run(bundle, draft, contract, pack)
        if name == "kimi" and KIMI_CRASH is not None:
            out[name] = run  # checked by test_kimi_miswiring_crashes_where_the_version_crashes
            continue
        assert not run.failures, f"{name}: {[str(f) for f in run.failures]}"
        assert run.report is not None and run.replay is not None
        assert not [f for f in run.check.findings if f.kind is FindingKind.ENGINE_ERROR], name
        out[name] = run
    return out


def _served(runs: dict[str, OutcomeRun]) -> dict[str, OutcomeRun]:
    """The runs that were served (every run but a kimi the installed version crashes on)."""
    served = {n: r for n, r in runs.items() if not (n == "kimi" and KIMI_CRASH is not None)}
    assert {"healthy", "shuffled"} <= set(served)
    return served


def _first(run: OutcomeRun) -> tuple[float, float, OutcomeReport]:
    """The first draft position's acceptance on the recorded and the served input, and the report."""
    assert run.report is not None
    rec, srv = run.report.recorded.per_position[0], run.report.served.per_position[0]
    assert rec is not None and srv is not None
    return rec, srv, run.report


def _per_position(report: OutcomeReport) -> str:
    return f"per position recorded {report.recorded.per_position} served {report.served.per_position}"


@pytest.mark.skipif(capture_level_supported(),
                    reason=f"sglang {SGLANG_VERSION} runs the outcome level: the outcome tests of this module cover it")
def test_a_static_only_version_refuses_the_outcome_level(bundle: Path,
                                                         contract_and_pack: tuple[Contract, ProbePack]) -> None:
    """Family A: the outcome request gets the capture level's one typed refusal naming ``--level static``, as the
    reason for the missing replay too (not a second failure); no fc, no replay, no acceptance report. Through
    the gate the outcome level is an environment error (exit 3) carrying that refusal, never a pass."""
    from specparity.gate import run_gate

    contract, pack = contract_and_pack
    run = _outcome_run(bundle, bundle / "draft", contract, pack)
    assert [f.kind for f in run.failures] == [UNSUPPORTED_VERSION], [str(f) for f in run.failures]
    message = run.failures[0].message
    assert f"sglang {SGLANG_VERSION}" in message and "static level only" in message and "--level static" in message
    assert run.capture.replay == run.failures[0]
    assert run.capture.fc is None and run.replay is None and run.report is None
    assert run.check.summary is None and run.check.findings == ()  # no fc: the capture's failure says why
    v = run_gate(REPO / "contracts" / "tiny-llama-eagle3.json", bundle / "target", bundle / "draft", level="outcome")
    assert (v.status, v.exit_code) == ("error", 3), [f.to_dict() for f in v.findings]
    assert v.outcome is None and v.served_layout is None
    assert any("static level only" in f.message for f in v.errors) and not any("0.5.23" in f.message for f in v.errors)


@OUTCOME
def test_the_replay_hooks_fired_once_per_pass_and_substituted(runs: dict[str, OutcomeRun]) -> None:
    for name, run in _served(runs).items():
        assert run.replay is not None and run.report is not None
        passes = run.replay.passes
        assert passes["served"] == {"fc_calls": 1, "substituted": 0, "model_calls": 1}, name
        assert passes["recorded"] == {"fc_calls": 1, "substituted": 1, "model_calls": 1}, name
        assert run.report.recorded.rows > 200 and run.report.first_draft_source == "engine"


@OUTCOME
def test_training_side_drafter_equals_sglangs_real_forward(
        runs: dict[str, OutcomeRun], contract_and_pack: tuple[Contract, ProbePack], bundle: Path) -> None:
    """Position-0 logits of specparity.replay.drafter == SGLang's LlamaForCausalLMEagle3 on the same inputs."""
    _, pack = contract_and_pack
    head = read_target_lm_head(bundle / "target")
    worst = 0.0
    for name in [n for n in ("healthy", "kimi") if n in _served(runs)]:
        run = runs[name]
        assert run.replay is not None and run.capture.fc is not None
        drafter = Eagle3Drafter.load(bundle / "draft", target_dir=bundle / "target")
        sides = {"recorded": ([s.fc_input for s in pack.samples], run.replay.recorded_logits),
                 "served": (run.capture.fc.per_sample, run.replay.served_logits)}
        for side, (inputs, sglang_logits) in sides.items():
            for i, s in enumerate(pack.samples):
                assert s.final_norm is not None
                greedy = greedy_from_final_norm(s.final_norm, head)
                ours = drafter.extend(inputs[i], draft_next_ids(s.input_ids, greedy)).logits
                theirs = sglang_logits[i]
                assert theirs.shape == ours.shape and bool(theirs.abs().sum() > 0)
                # the last row pairs with SGLang's own sampled token; rows 0..T-2 pair with probe tokens
                diff = float((ours[:-1] - theirs[:-1]).abs().max())
                worst = max(worst, diff)
                assert diff <= LOGIT_ATOL, f"{name}/{side} sample {i}: max |d| {diff:.3g}"
        assert run.report is not None and run.report.engine_agreement == {"recorded": 1.0, "served": 1.0}
    print(f"max |training-side - SGLang| draft logits: {worst:.3g}")


@OUTCOME
def test_healthy_deployment_accepts_alike_on_both_inputs(runs: dict[str, OutcomeRun]) -> None:
    rec, srv, report = _first(runs["healthy"])
    print(f"healthy: first draft recorded {rec:.4f} served {srv:.4f}; AL {report.summary.recorded_acceptance_length:.3f}"
          f" vs {report.summary.served_acceptance_length:.3f}; {_per_position(report)}")
    assert abs(rec - srv) <= 0.02
    assert rec >= 0.6 and srv >= 0.6
    assert report.summary.diagnosis == "healthy" and report.findings == []


@OUTCOME
def test_kimi_miswiring_crashes_where_the_version_crashes(runs: dict[str, OutcomeRun]) -> None:
    """Before 0.5.22 the llama forward raises on [-1,1,3]: a failure quoting SGLang's error, no outcome."""
    run = runs["kimi"]
    if KIMI_CRASH is None:
        assert not run.failures and run.report is not None
        return
    assert run.report is None and run.capture.fc is None
    assert [f.kind for f in run.failures][:1] == ["sglang_exception"], [str(f) for f in run.failures]
    assert KIMI_CRASH in run.failures[0].message and " at sglang/" in run.failures[0].message


# On versions whose llama forward crashes on [-1,1,3] there is no served acceptance to measure: the two tests
# below are skipped by name at collection (shown in the -ra summary), never passed by an early return; the
# crash itself is asserted by test_kimi_miswiring_crashes_where_the_version_crashes.
_KIMI_SERVED = pytest.mark.skipif(
    KIMI_CRASH is not None,
    reason=f"sglang {SGLANG_VERSION} crashes on [-1,1,3] ({KIMI_CRASH}); pinned by "
           "test_kimi_miswiring_crashes_where_the_version_crashes")


@OUTCOME
@_KIMI_SERVED
def test_kimi_miswiring_lowers_served_acceptance(runs: dict[str, OutcomeRun]) -> None:
    """[-1,1,3] on sglang 0.5.23 serves embedding, layer:1, layer:3: acceptance on the served input drops."""
    rec, srv, report = _first(runs["kimi"])
    healthy_rec, _, _ = _first(runs["healthy"])
    print(f"kimi: first draft recorded {rec:.4f} served {srv:.4f} ({100 * (srv - rec):+.1f} points); "
          f"{_per_position(report)}")
    assert rec == pytest.approx(healthy_rec)  # same drafter, same recorded input: the config changes nothing there
    assert srv < rec - 0.02


@OUTCOME
@_KIMI_SERVED
def test_kimi_miswiring_collapses_acceptance_and_reads_as_wiring(runs: dict[str, OutcomeRun]) -> None:
    rec, srv, report = _first(runs["kimi"])
    assert rec - srv >= 0.30
    assert report.summary.diagnosis == "wiring"


@OUTCOME
def test_shuffled_fc_reads_as_model_quality(runs: dict[str, OutcomeRun]) -> None:
    rec, srv, report = _first(runs["shuffled"])
    print(f"shuffled fc: first draft recorded {rec:.4f} served {srv:.4f}; {_per_position(report)}")
    healthy, _, _ = _first(runs["healthy"])
    assert rec < healthy - 0.2 and abs(rec - srv) <= 0.02  # the drafter is broken; the wiring is not
    assert report.summary.diagnosis == "model_quality"  # contract states no acceptance: the default floor
    # below the floor on its own inputs is an error even without a training-time figure
    assert [(f.kind, f.severity) for f in report.findings] == [(FindingKind.MODEL_QUALITY, Severity.ERROR)]
    # with the acceptance training measured (draft_training.json: top-1 on the probes) it is an error
    summary, findings = diagnose(report.recorded, report.served, expected=[healthy])
    assert summary.diagnosis == "model_quality"
    assert [(f.kind, f.severity) for f in findings] == [(FindingKind.ACCEPTANCE_BELOW_CONTRACT, Severity.ERROR)]
