"""The comparison holds for any pair of dtypes and any scale.

Residual streams whose norm grows with depth and that carry outlier channels are "served" in one of
fp32/bf16/fp16 (the atlas and the fc input come from the same engine run, as in SGLang) and
"recorded" in one of fp32/bf16/fp16 by another run with its own kernel noise. The gate's rules
(attribution + diagnosis, each comparison judged by the coarser dtype of its pair) must pass every
correct layout and fail every wrong one: a layer one off, the embedding, a permutation, a normed
chunk, and another target's weights.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specparity.compare.attribution import attribute
from specparity.compare.diagnosis import DeploymentFacts, ExpectedFacts, diagnose
from specparity.compare.findings import Finding, FindingKind, Severity
from specparity.compare.synthetic import concat_sources, growing_stream, kernel_run, rms_norm
from specparity.compare.tolerances import pair_tolerance

H = 64
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
WRONG = ("plus_one", "minus_one", "embedding", "permutation", "normed", "other_weights")


@st.composite
def deployments(draw: st.DrawFn) -> tuple[int, int, list[str], str, str]:
    num_layers = draw(st.integers(6, 12))
    k = draw(st.integers(2, 3))
    # interior layers, so that both neighbours exist (layer:0 .. layer:L-2 are captured, domain.md §3)
    ids = sorted(draw(st.lists(st.integers(1, num_layers - 3), min_size=k, max_size=k, unique=True)))
    served = draw(st.sampled_from(sorted(DTYPES)))
    recorded = draw(st.sampled_from(sorted(DTYPES)))
    return num_layers, draw(st.integers(0, 10_000)), [f"layer:{i}" for i in ids], served, recorded


def _gate_findings(truth: dict[str, torch.Tensor], served_fc: torch.Tensor, atlas: dict[str, torch.Tensor],
                   sources: list[str], served: str, recorded: str, seed: int) -> list[Finding]:
    rec_run = kernel_run(truth, DTYPES[recorded], seed=seed + 2)
    rec_fc = concat_sources(rec_run, sources)
    s, r = DTYPES[served], DTYPES[recorded]
    atlas = {k: v for k, v in atlas.items()}
    table = attribute([served_fc], [rec_fc.to(s)], [atlas], expected=sources, tolerance=pair_tolerance(s, s),
                      recorded_tolerance=pair_tolerance(r, s))
    return diagnose(ExpectedFacts(name="t", sources=tuple(sources), hidden_size=H), DeploymentFacts(), table=table,
                    tolerance=pair_tolerance(s, s), drift_tolerance=pair_tolerance(s, r),
                    recorded_tolerance=pair_tolerance(r, s))


def _errors(findings: list[Finding]) -> set[FindingKind]:
    return {f.kind for f in findings if f.severity is Severity.ERROR}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deployments())
def test_every_correct_layout_passes_in_every_dtype_pair(d: tuple[int, int, list[str], str, str]) -> None:
    num_layers, seed, sources, served, recorded = d
    truth = growing_stream(num_layers, H, tokens=16, seed=seed)
    run = kernel_run(truth, DTYPES[served], seed=seed + 1)
    findings = _gate_findings(truth, concat_sources(run, sources), run, sources, served, recorded, seed)
    assert not _errors(findings), [f.message for f in findings]
    # within the drift limits, with room: no warning on a healthy wiring
    assert not [f for f in findings if f.severity is Severity.WARNING], [f.message for f in findings]


@settings(max_examples=90, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deployments(), st.sampled_from(WRONG))
def test_every_wrong_layout_fails_in_every_dtype_pair(d: tuple[int, int, list[str], str, str], wrong: str) -> None:
    num_layers, seed, sources, served, recorded = d
    truth = growing_stream(num_layers, H, tokens=16, seed=seed)
    run = kernel_run(truth, DTYPES[served], seed=seed + 1)
    wired = list(sources)
    expect: set[FindingKind]
    if wrong in ("plus_one", "minus_one"):
        step = 1 if wrong == "plus_one" else -1
        c = seed % len(sources)
        wired[c] = f"layer:{int(sources[c].split(':')[1]) + step}"
        expect = {FindingKind.OFF_BY_ONE, FindingKind.LAYOUT_MISMATCH, FindingKind.MISSING_SOURCE}
        fc = concat_sources(run, wired)
    elif wrong == "embedding":
        wired = ["embedding", *sources[:-1]]
        expect = {FindingKind.EXTRA_EMBEDDING}
        fc = concat_sources(run, wired)
    elif wrong == "permutation":
        wired = sources[1:] + sources[:1]
        expect = {FindingKind.ORDER_MISMATCH}
        fc = concat_sources(run, wired)
    elif wrong == "normed":
        c = seed % len(sources)
        weight = 1.0 + 0.1 * torch.randn(H, generator=torch.Generator().manual_seed(seed))
        chunks = [run[s] for s in sources]
        chunks[c] = rms_norm(chunks[c], weight)
        fc = torch.cat(chunks, dim=-1)
        expect = {FindingKind.NORM_MISMATCH, FindingKind.LAYOUT_MISMATCH}
    else:  # another target's weights, same config: the served run (and its atlas) are of that target
        other = growing_stream(num_layers, H, tokens=16, seed=seed + 5000)
        run = kernel_run(other, DTYPES[served], seed=seed + 1)
        fc = concat_sources(run, sources)
        expect = {FindingKind.TARGET_MISMATCH}
    findings = _gate_findings(truth, fc, run, sources, served, recorded, seed)
    got = _errors(findings)
    assert got & expect, (wrong, wired, sorted(k.value for k in got), [f.message for f in findings])
