"""The gate with --engine vllm on vLLM's real engine (CPU): verdicts, the off-by-one and its patch, TP=2.

Each gate run is one vLLM start in a child process (the vllm-0.32 env's own interpreter)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from vllm_helpers import BUNDLE, CONTRACT, REPO, SPECULATORS_CONTRACT, copy_draft

from specparity.compare.findings import FindingKind
from specparity.compare.fix import apply_json_patch
from specparity.gate import run_gate
from specparity.verdict import Verdict

pytestmark = pytest.mark.vllm
TARGET = BUNDLE / "target"


def _gate(draft: Path, python: str, *, level: str = "all", contract: Path = CONTRACT, timeout_s: float = 600,
          evidence: str = "reduced", **engine_args: object) -> Verdict:
    return run_gate(contract, TARGET, draft, level=level, engine="vllm", engine_args=engine_args, python=python,
                    timeout_s=timeout_s, evidence=evidence)


@pytest.fixture(scope="module")
def as_is(vllm_python: str) -> Verdict:
    """The bundled SpecForge-style drafter (nested ids [1, 3, 5]) served on vLLM unchanged."""
    return _gate(BUNDLE / "draft", vllm_python)


@pytest.fixture(scope="module")
def patched(as_is: Verdict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same drafter with the report's JSON patch applied to a copy of its config."""
    assert as_is.fix is not None and as_is.fix.json_patch
    out = copy_draft(tmp_path_factory.mktemp("patched"), "draft")
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(apply_json_patch(cfg, as_is.fix.json_patch)))
    return out


def test_specforge_drafter_as_is_fails_naming_the_off_by_one(as_is: Verdict) -> None:
    assert as_is.status == "fail" and as_is.engine == "vllm" and (as_is.engine_version or "").startswith("0.32")
    kinds = {f.kind for f in as_is.errors}
    assert FindingKind.ENGINE_CONVENTION_MISMATCH in kinds and FindingKind.OFF_BY_ONE in kinds
    assert as_is.served_layout == ["layer:0", "layer:2", "layer:4"]
    assert as_is.fix is not None
    assert list(as_is.fix.json_patch) == [
        {"op": "replace", "path": "/eagle_config/eagle_aux_hidden_state_layer_ids", "value": [2, 4, 6]}]
    assert as_is.outcome is not None and as_is.outcome.diagnosis == "wiring"


def test_the_full_atlas_gives_the_reduced_evidences_verdict(as_is: Verdict, vllm_python: str) -> None:
    """The default evidence is reduced in vLLM's worker (serving/vllm/tap_reduce.py); the full atlas (--evidence
    full) must give the same verdict on the real engine: findings, chunk attributions, fix and outcome."""
    full = _gate(BUNDLE / "draft", vllm_python, evidence="full")
    a, b = as_is.to_dict(), full.to_dict()
    assert a["layout"]["ranks_reported"] == b["layout"]["ranks_reported"] == [0]
    for d in (a, b):
        d.pop("timings", None)
        d.pop("layout", None)  # names each rank's process id: another run, other pids
    assert [(f.kind, f.chunk, f.message, f.fix) for f in as_is.findings] == \
        [(f.kind, f.chunk, f.message, f.fix) for f in full.findings]
    assert as_is.served_layout == full.served_layout and as_is.fix == full.fix
    assert a == b


def test_patched_drafter_passes_with_the_real_loop_reported(patched: Path, vllm_python: str) -> None:
    v = _gate(patched, vllm_python)
    assert v.status == "pass", [str(f) for f in v.errors]
    assert v.served_layout == ["layer:1", "layer:3", "layer:5"]
    assert v.outcome is not None and v.outcome.diagnosis == "healthy"
    loop = v.outcome.engine_loop
    assert loop is not None and loop["drafts"] > 0 and len(loop["per_position"]) == 3
    for p, (lo, hi) in zip(loop["per_position"], loop["intervals"], strict=True):
        assert 0.0 <= lo <= p <= hi <= 1.0
    # the loop runs on the probes' prompts, where the target writes the answers the drafter learnt:
    # measured 0.76 [0.60, 0.88] at position 1 against 0.81 replayed on the recordings (fp32, 2 CPU cores)
    assert loop["prompts"] == "assistant_start" and loop["per_position"][0] > 0.5


def test_tp2_gives_the_tp1_verdict(as_is: Verdict, vllm_python: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # a temp directory of this run's own (short: vLLM's IPC socket paths live below it): at TP=2 vLLM's processes
    # bind ZeroMQ sockets there and leave the socket files behind; the child puts them under its own directory
    # (serving/vllm/worker.py _setup_env), so nothing of the run is left
    tmp = Path(tempfile.mkdtemp(prefix="spv-"))
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    try:
        v = _gate(BUNDLE / "draft", vllm_python, level="capture", tensor_parallel_size=2)
        # torch's inductor cache lives in the temp directory across runs by design (cache_dir_utils.py); so does
        # the warm-start zygote this TMPDIR got (tests only: it serves the session's later jobs and removes its
        # directory when it stops, serving/child/warm.py), which holds nothing of the run's own
        left = sorted(p.name for p in tmp.iterdir() if not p.name.startswith(("torchinductor_", "specparity-zygote-")))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert left == [], f"left in the run's TMPDIR: {left}"
    assert v.status == as_is.status == "fail"
    assert v.served_layout == as_is.served_layout
    assert {f.kind for f in v.errors} >= {FindingKind.ENGINE_CONVENTION_MISMATCH, FindingKind.OFF_BY_ONE}
    assert v.fix is not None and as_is.fix is not None and v.fix.json_patch == as_is.fix.json_patch
    # the layout block: vLLM's own ParallelConfig, both ranks reported through its collective_rpc
    lay = v.layout
    assert (lay["engine"], lay["executor"], lay["tensor_parallel_size"], lay["pipeline_parallel_size"]) == (
        "vllm", "mp", 2, 1), lay
    assert lay["ranks_expected"] == lay["ranks_reported"] == [0, 1] and lay["nodes"] == 1
    assert {r["tp_rank"] for r in lay["ranks"].values()} == {0, 1}
    assert all(r["fc_calls"] > 0 and r["drafter"] == "EagleProposer" for r in lay["ranks"].values())
    assert as_is.layout["ranks_reported"] == [0] and as_is.layout["executor"] == "uni"


def test_speculators_format_drafter_passes_with_a_real_outcome(vllm_python: str) -> None:
    """`contract from-speculators` end to end on vLLM, the outcome level included: the
    training-side drafter reads speculators' config and weight names, vLLM's loop gives the real acceptance."""
    v = _gate(BUNDLE / "speculators" / "draft", vllm_python, contract=SPECULATORS_CONTRACT)
    assert v.status == "pass", [str(f) for f in v.errors]
    # the deployed speculators draft is read by its own format's reader: vocab map and weight names checked
    assert not [f for f in v.findings if f.kind is FindingKind.CHECK_SKIPPED], [str(f) for f in v.findings]
    assert v.served_layout == ["layer:1", "layer:3", "layer:5"]
    assert v.outcome is not None and v.outcome.diagnosis == "healthy"
    loop = v.outcome.engine_loop
    assert loop is not None and loop["engine"] == "vllm" and loop["drafts"] > 0
    for p, (lo, hi) in zip(loop["per_position"], loop["intervals"], strict=True):
        assert 0.0 <= lo <= p <= hi <= 1.0
    # speculators' hs files carry no loss mask, so where each assistant turn starts is unknown: the loop's
    # figures are what vLLM accepts after each probe (text the drafter was not trained on), and say so.
    # Measured 0.09 [0.04, 0.20] at position 1 there, against 0.85 replayed on the recordings.
    assert loop["prompts"] == "after_probe"
    # the same drafter as the SpecForge-style bundle: its replay on the recordings clears the default floor
    assert v.outcome.recorded_acceptance[0] > 0.5 and v.outcome.served_acceptance[0] > 0.5
    print(f"speculators on vLLM: replay recorded {v.outcome.recorded_acceptance} served {v.outcome.served_acceptance};"
          f" loop {loop['per_position']} {loop['intervals']} AL {loop['acceptance_length']:.3f}")


def test_vllms_real_loop_on_the_speculators_drafter_accepts_as_the_replay_says(vllm_python: str) -> None:
    """With prompts that end where each assistant turn starts (the SpecForge-style pack has loss masks), vLLM's
    own loop on the speculators drafter accepts what the training-side replay predicts: vLLM serves the
    speculators format (config schema, layers.0.* names) as the replay reads it, draft-decode steps included.
    Measured: loop 0.76 [0.60, 0.88] at position 1, replay 0.81 (as for the SpecForge-style drafter)."""
    v = _gate(BUNDLE / "speculators" / "draft", vllm_python)
    # this contract was written for the SGLang export of the same drafter: the architecture and the checkpoint's
    # weight names (speculators' layers.0.* for SpecForge's midlayer.*) differ, nothing else. The names are read
    # since the gate reads a speculators draft with its own format's reader (it skipped them)
    assert {(f.kind, f.message.split(":")[0]) for f in v.errors} == {
        (FindingKind.CONFIG_MISMATCH, "#1 drafter.architecture"),
        (FindingKind.CONFIG_MISMATCH, "#2 drafter.checkpoint_keys")}, [str(f) for f in v.errors]
    assert not [f for f in v.findings if f.kind is FindingKind.CHECK_SKIPPED], [str(f) for f in v.findings]
    assert v.served_layout == ["layer:1", "layer:3", "layer:5"]
    assert v.outcome is not None and v.outcome.diagnosis == "healthy"
    loop = v.outcome.engine_loop
    assert loop is not None and loop["prompts"] == "assistant_start"
    lo, hi = loop["intervals"][0]
    assert lo <= v.outcome.recorded_acceptance[0] <= hi and loop["per_position"][0] > 0.5, (loop, v.outcome)


def test_miswired_speculators_deployment_fails_on_capture_and_outcome(vllm_python: str, tmp_path: Path) -> None:
    """speculators ids are vLLM boundaries (layer:i = id i+1): [1, 3, 5] serves layer:0, 2, 4 - off by one, and
    the drafter's acceptance on what vLLM serves collapses against the recordings."""
    draft = copy_draft(tmp_path, "speculators-off", src=BUNDLE / "speculators" / "draft",
                       edit={"eagle_aux_hidden_state_layer_ids": [1, 3, 5]})
    v = _gate(draft, vllm_python, contract=SPECULATORS_CONTRACT)
    assert v.status == "fail" and v.served_layout == ["layer:0", "layer:2", "layer:4"]
    assert FindingKind.OFF_BY_ONE in {f.kind for f in v.errors}
    assert v.outcome is not None and v.outcome.diagnosis == "wiring"
    assert FindingKind.ACCEPTANCE_COLLAPSE in {f.kind for f in v.errors}
    assert v.fix is not None and list(v.fix.json_patch) == [
        {"op": "replace", "path": "/eagle_aux_hidden_state_layer_ids", "value": [2, 4, 6]}]


def test_static_level_uses_vllms_own_reader_without_weights(vllm_python: str) -> None:
    v = _gate(BUNDLE / "draft", vllm_python, level="static")
    assert v.status == "fail"
    assert v.served_layout == ["layer:0", "layer:2", "layer:4"]
    assert FindingKind.ENGINE_CONVENTION_MISMATCH in {f.kind for f in v.errors}


def test_speculation_off_is_fc_not_called(vllm_python: str) -> None:
    v = _gate(BUNDLE / "draft", vllm_python, level="capture", speculative_config=None)
    assert v.status != "pass"
    assert FindingKind.FC_NOT_CALLED in {f.kind for f in v.errors}


def test_nan_in_the_target_is_a_failure(vllm_python: str, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    target = tmp_path / "target"
    shutil.copytree(TARGET, target)
    st = load_file(str(target / "model.safetensors"))
    st["model.layers.2.mlp.down_proj.weight"][0, 0] = float("nan")
    save_file(st, str(target / "model.safetensors"), metadata={"format": "pt"})
    v = run_gate(CONTRACT, target, BUNDLE / "draft", level="capture", engine="vllm", python=vllm_python)
    assert v.status != "pass"
    assert FindingKind.NONFINITE in {f.kind for f in v.errors}


def test_engine_crash_is_a_failure_not_a_pass(vllm_python: str, tmp_path: Path) -> None:
    # d2t in the checkpoint while draft_vocab_size == vocab_size: vLLM 0.32 builds no draft_id_to_target_id
    # and its loader raises (measured) - a real incompatibility, reported as vLLM's exception
    draft = copy_draft(tmp_path, "draft", edit={"draft_vocab_size": 512})
    v = _gate(draft, vllm_python, level="capture")
    assert v.status == "fail" and v.exit_code == 1  # vLLM refusing the draft as deployed is the deployment's fault
    assert any(f.details.get("serving_failure") == "vllm_exception" for f in v.errors), [str(f) for f in v.errors]


def test_timeout_is_an_error_not_a_pass(vllm_python: str) -> None:
    v = _gate(BUNDLE / "draft", vllm_python, level="capture", timeout_s=3)
    assert v.status == "error"
    assert FindingKind.TIMEOUT in {f.kind for f in v.errors}


def test_cli_from_the_main_venv_shape(vllm_python: str, tmp_path: Path) -> None:
    """`specparity gate --engine vllm --python <vllm env>` writes the engine and its version in the report."""
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "specparity.cli", "gate", "--engine", "vllm", "--python", vllm_python, "--level",
         "static", "--contract", str(CONTRACT), "--target", str(TARGET), "--draft", str(BUNDLE / "draft"),
         "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["engine"] == "vllm" and report["engine_version"].startswith("0.32")
    assert "(vllm 0.32" in proc.stdout


def test_a_tp_the_heads_do_not_divide_is_vllms_refusal_with_its_reason(vllm_python: str) -> None:
    """vLLM's pydantic refusal is an ``engine_error`` naming vLLM and its release, the reason kept
    (it was cut to "1 validation error for SpeculativeConfig" and reported as ``sglang_error``), exit 1."""
    v = _gate(BUNDLE / "draft", vllm_python, level="static", tensor_parallel_size=3)
    assert v.status == "fail" and v.exit_code == 1, [str(f) for f in v.errors]
    [f] = [f for f in v.errors if f.kind is FindingKind.ENGINE_ERROR]
    assert (f.details["engine"], f.details["version"], f.details["cause"]) == ("vllm", v.engine_version, "deployment")
    assert (v.engine_version or "").startswith("0.32") and "divisible by tensor parallel size (3)" in f.message
