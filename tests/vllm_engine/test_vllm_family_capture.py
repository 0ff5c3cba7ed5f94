"""The capture level for the drafter families beyond the Llama-style EAGLE-3 head on vLLM 0.32's CPU path,
with tiny generated drafters (tests/serving/family_pairs.py) over the reduced real-class targets.

- DFlash: vLLM's CPU runner serves it (v1/spec_decode/dflash.py; models/qwen3_dflash.py), and its proposer hands fc
  the target's aux states through the same ``combine_hidden_states`` call as EAGLE-3 (v1/spec_decode/
  llm_base_proposer.py:536-553), where the tap records them. The contract is written from SpecForge-shaped DFlash
  records (``contract_from_specforge``): id k is layer:k, and vLLM adds 1 (v1/worker/gpu_model_runner.py:5270-5277).
- MLA EAGLE-3 head over a non-MLA target: vLLM refuses it on this CPU itself, the MLA drafter's CPU_MLA backend and
  the target's CPU_ATTN share no KV-cache block size (v1/worker/utils.py:554): exit 3, that call named, never a pass.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from vllm_helpers import BUNDLE, REPO

from specparity.gate import run_gate
from specparity.sources import EMBEDDING
from specparity.training.specforge import contract_from_specforge
from specparity.verdict import Verdict

sys.path.append(str(REPO / "tests" / "serving"))  # the shared builders, after everything else on the path
from family_pairs import write_dflash_draft, write_dflash_records, write_mla_draft
from real_class_targets import write_deployment

pytestmark = pytest.mark.vllm
HEALTHY = ["layer:1", "layer:3", "layer:5"]


def _gate(contract: Path, target: Path, draft: Path, python: str, *, level: str = "capture") -> Verdict:
    return run_gate(contract, target, draft, level=level, engine="vllm", python=python, timeout_s=600)


def _kinds(v: Verdict) -> set[str]:
    return {f.kind.value for f in v.errors}


@pytest.fixture(scope="module")
def dflash(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The reduced Qwen3 target, a DFlash contract from SpecForge-shaped records of layer:1, 3, 5, and drafters:
    healthy (ids [1, 3, 5]), the seed's wiring ([-1, 1, 3]: vLLM's +1 makes -1 boundary 0, the embedding) and one
    layer early ([0, 2, 4])."""
    root = tmp_path_factory.mktemp("dflash")
    dep = write_deployment("Qwen--Qwen3-8B", root, {}, bundle=BUNDLE, probes=2, max_probe_tokens=32)
    records = write_dflash_records(root / "hidden_states", root / "dflash_records", [1, 3, 5])
    drafts = {label: write_dflash_draft(root / f"draft-{label}", ids)
              for label, ids in {"healthy": [1, 3, 5], "seed_wiring": [-1, 1, 3], "early": [0, 2, 4]}.items()}
    _, contract = contract_from_specforge(records, drafts["healthy"], dep["target"], out=root / "contract.json",
                                          probes=2, max_probe_tokens=32)
    return {"target": dep["target"], "contract": contract, "drafts": drafts}


def test_dflash_capture_passes_and_static_serves_what_capture_found(dflash: dict[str, Any],
                                                                   vllm_python: str) -> None:
    v = _gate(dflash["contract"], dflash["target"], dflash["drafts"]["healthy"], vllm_python)
    assert (v.status, v.exit_code) == ("pass", 0), [str(f) for f in v.errors]
    assert list(v.served_layout or []) == HEALTHY
    static = _gate(dflash["contract"], dflash["target"], dflash["drafts"]["healthy"], vllm_python, level="static")
    assert (static.status, list(static.served_layout or [])) == ("pass", HEALTHY), [str(f) for f in static.errors]


def test_dflash_seeds_wiring_and_a_layer_early_are_named(dflash: dict[str, Any], vllm_python: str) -> None:
    seed = _gate(dflash["contract"], dflash["target"], dflash["drafts"]["seed_wiring"], vllm_python)
    assert (seed.status, seed.exit_code) == ("fail", 1), [str(f) for f in seed.errors]
    assert {"extra_embedding", "missing_source"} <= _kinds(seed), sorted(_kinds(seed))
    assert list(seed.served_layout or []) == [EMBEDDING, "layer:1", "layer:3"]
    # the fix names the DFlash key, not an EAGLE-3 one
    assert seed.fix is not None and "dflash_config.target_layer_ids = [1, 3, 5]" in seed.fix.summary, seed.fix
    early = _gate(dflash["contract"], dflash["target"], dflash["drafts"]["early"], vllm_python)
    assert early.status == "fail" and "off_by_one" in _kinds(early), sorted(_kinds(early))
    assert list(early.served_layout or []) == ["layer:0", "layer:2", "layer:4"]


def test_mla_head_over_a_llama_target_is_vllms_named_cpu_limit(tmp_path: Path, vllm_python: str) -> None:
    """The static level resolves the MLA head (layer:1, 3, 5 for vLLM ids [2, 4, 6]); its capture starts and vLLM's
    own KV-cache set-up refuses it on this CPU (v1/worker/utils.py:554): exit 3 naming that, never a pass and never
    "does not match". Where the CPU has AMX tiles vLLM may pick its AMX MLA backend instead, also a named limit."""
    trained = write_mla_draft(tmp_path / "trained", [1, 3, 5])  # SpecForge ids on the Llama target: layer:1, 3, 5
    _, contract = contract_from_specforge(BUNDLE / "hidden_states", trained, BUNDLE / "target",
                                          out=tmp_path / "contract.json", probes=2, max_probe_tokens=32)
    served = write_mla_draft(tmp_path / "served", [2, 4, 6])  # vLLM's boundary ids for the same layers
    static = _gate(contract, BUNDLE / "target", served, vllm_python, level="static")
    assert (static.status, list(static.served_layout or [])) == ("pass", HEALTHY), [str(f) for f in static.errors]
    v = _gate(contract, BUNDLE / "target", served, vllm_python)
    assert (v.status, v.exit_code) == ("error", 3), [str(f) for f in v.errors]
    [f] = [f for f in v.errors if f.details.get("machine_limit")]
    assert ("CPU_MLA" in f.message and "utils.py:554" in f.message) or "AMX MLA" in f.message, f.message
    assert f.details["engine"] == "vllm"
