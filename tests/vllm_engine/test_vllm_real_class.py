"""Capture on reduced real-class targets on vLLM: Qwen3-MoE, Qwen3 dense, GPT-OSS, Llama 4, TP=1.

The same targets as tests/serving/test_real_class_capture.py (public configs, only sizes reduced; SpecForge records
recomputed on each at ids [1, 3, 5]; the contract written by ``contract_from_specforge``), served by vLLM's real
engine in a child process with the vLLM bundle's drafter. vLLM's id convention differs from SpecForge's (id i is
boundary i, domain.md section 2): the drafter that serves the contract's layer:1, 3, 5 has ids [2, 4, 6]; the
SpecForge export as it is ([1, 3, 5]) is one layer early; ids [0, 2, 4] are the seed's wiring (the embedding in
chunk 0, the rest shifted).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from vllm_helpers import BUNDLE, REPO

from specparity.gate import run_gate
from specparity.sources import EMBEDDING
from specparity.verdict import Verdict

sys.path.append(str(REPO / "tests" / "serving"))  # the shared builder, after everything else on the path
from real_class_targets import REDUCED, REDUCED_CPU_LIMITED, REDUCED_TEXT, write_deployment

pytestmark = pytest.mark.vllm
# vLLM serves GPT-OSS and Llama 4 (its text backbone, Llama4ForCausalLM) on CPU, SGLang does not
CLASSES = [*sorted(REDUCED), "openai--gpt-oss-20b", "meta-llama--Llama-4-Scout-17B-16E-Instruct"]
assert set(CLASSES) - set(REDUCED) <= set(REDUCED_CPU_LIMITED) | set(REDUCED_TEXT)
DRAFTS = {"healthy": [2, 4, 6], "seed_wiring": [0, 2, 4], "as_exported": [1, 3, 5]}
# CI time: one MoE class runs in the default CI (with its TP=2 and expert-parallel test below); the
# other classes run in the marked tier, `make test-topology` (about 100 s per gate run here beside the SGLang matrix)
IN_CI = "Qwen--Qwen3-30B-A3B"
assert IN_CI in CLASSES
PARAMS = [pytest.param(n, marks=() if n == IN_CI else pytest.mark.topology) for n in CLASSES]


@pytest.fixture(scope="module")
def deployments(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return {name: write_deployment(name, tmp_path_factory.mktemp(name.split("--")[1]), DRAFTS, bundle=BUNDLE)
            for name in CLASSES}


def _gate(dep: dict[str, Any], label: str, python: str, *, level: str = "capture", **engine_args: object) -> Verdict:
    return run_gate(dep["contract"], dep["target"], dep["drafts"][label], level=level, engine="vllm", python=python,
                    engine_args=engine_args, timeout_s=600)


def _kinds(v: Verdict) -> set[str]:
    return {f.kind.value for f in v.errors}


@pytest.mark.parametrize("name", PARAMS)
def test_healthy_passes_and_static_serves_what_capture_found(deployments: dict[str, dict[str, Any]], name: str,
                                                             vllm_python: str) -> None:
    v = _gate(deployments[name], "healthy", vllm_python)
    assert (v.status, v.exit_code) == ("pass", 0), [str(f) for f in v.errors]
    assert list(v.served_layout or []) == ["layer:1", "layer:3", "layer:5"]
    static = _gate(deployments[name], "healthy", vllm_python, level="static")
    assert (static.status, list(static.served_layout or [])) == ("pass", list(v.served_layout or []))


@pytest.mark.parametrize("name", PARAMS)
def test_the_seeds_wiring_and_the_export_as_it_is_are_named(deployments: dict[str, dict[str, Any]], name: str,
                                                            vllm_python: str) -> None:
    seed = _gate(deployments[name], "seed_wiring", vllm_python)
    assert seed.status == "fail" and {"extra_embedding", "missing_source"} <= _kinds(seed), sorted(_kinds(seed))
    assert list(seed.served_layout or []) == [EMBEDDING, "layer:1", "layer:3"]
    early = _gate(deployments[name], "as_exported", vllm_python)
    assert early.status == "fail" and "off_by_one" in _kinds(early), sorted(_kinds(early))
    assert list(early.served_layout or []) == ["layer:0", "layer:2", "layer:4"]
    assert "static_capture_disagreement" not in _kinds(seed) | _kinds(early)


def test_deepseek_v3_resolves_statically_and_its_capture_is_this_machines_named_limit(
        tmp_path: Path, vllm_python: str) -> None:
    """The seed's class on vLLM: its own config reader resolves the drafter's layers (layer:1, 3, 5 for ids
    [2, 4, 6]); the capture cannot start on this CPU (CPU_MLA and CPU_ATTN share no block size, or, on a CPU with
    AMX tiles, AMX_MLA packs no float32 weights): exit 3 naming that (it was exit 1, "deployment does not match"), never a pass."""
    dep = write_deployment("deepseek-ai--DeepSeek-V3", tmp_path, {"healthy": DRAFTS["healthy"]}, bundle=BUNDLE,
                           probes=2, max_probe_tokens=32)
    static = _gate(dep, "healthy", vllm_python, level="static")
    assert static.status == "pass" and list(static.served_layout or []) == ["layer:1", "layer:3", "layer:5"], [
        str(f) for f in static.errors]
    v = _gate(dep, "healthy", vllm_python)
    assert (v.status, v.exit_code) == ("error", 3), [str(f) for f in v.errors]
    [f] = [f for f in v.errors if f.details.get("machine_limit")]
    # which refusal depends on this CPU: with AMX tiles vLLM picks AMX_MLA (float32 weights refused), else CPU_MLA
    # (no block size shared with the drafter's backend); each is named as the machine's
    assert ("CPU_MLA" in f.message or "AMX MLA" in f.message) and f.details["engine"] == "vllm"


def test_moe_at_tp2_passes_and_expert_parallel_is_this_machines_named_limit(
        deployments: dict[str, dict[str, Any]], vllm_python: str) -> None:
    """Tensor parallelism on the MoE class: TP=2 serves the healthy drafter (every rank's fc input gathered and equal,
    test_vllm_capture.py); with enable_expert_parallel a worker segfaults in vLLM's CPU fused-MoE kernel
    (csrc/cpu/cpu_fused_moe.cpp): exit 3 naming that, never a pass and never "does not match"."""
    dep = deployments["Qwen--Qwen3-30B-A3B"]
    v = _gate(dep, "healthy", vllm_python, tensor_parallel_size=2)
    assert (v.status, v.exit_code) == ("pass", 0), [str(f) for f in v.errors]
    assert list(v.served_layout or []) == ["layer:1", "layer:3", "layer:5"]
    assert v.layout["ranks_reported"] == [0, 1] and v.layout["expert_parallel_size"] == 1, v.layout
    ep = _gate(dep, "healthy", vllm_python, tensor_parallel_size=2, enable_expert_parallel=True)
    if ep.status == "pass":  # a vLLM whose CPU kernel serves expert parallelism: then it must be the same verdict
        assert list(ep.served_layout or []) == list(v.served_layout or [])
        return
    assert (ep.status, ep.exit_code) == ("error", 3), [str(f) for f in ep.errors]
    [f] = [f for f in ep.errors if f.details.get("machine_limit")]
    assert "cpu_fused_moe.cpp" in f.message and f.details["engine"] == "vllm"
    # the layout vLLM resolved for it: experts split over both TP ranks, no rank able to report
    assert (ep.layout["expert_parallel_size"], ep.layout["ranks_expected"]) == (2, [0, 1]), ep.layout
