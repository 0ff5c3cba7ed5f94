"""The reduced evidence (compare/reduced.py, serving/vllm/tap_reduce.py) gives the verdict of the full atlas.

The tap's own code runs here on synthetic tensors shaped like the bundled tiny model's (fixtures/default: 8 layers,
H=64, the contract's recorded fc inputs and final norms), for two tensor-parallel ranks, once as the full atlas and
once reduced in the "worker"; both go through the gate's own path (``run_gate`` with the evidence assembled by
serving/vllm/evidence.py). Each miswiring class the suite knows (embedding first, off by one, a norm applied, fewer
chunks, another layer set) and the healthy wiring must give the same verdict: findings, chunk attributions, fix,
the attribution table's numbers. The real engine's reduced path is in tests/vllm_engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
import torch
from tests.resolved_deployments import tiny_deployment

from specparity import gate, gate_verdict
from specparity.compare.reduced import Reduction
from specparity.contract import load_contract, read_contract_probes
from specparity.serving.results import CaptureResult
from specparity.serving.vllm import tap
from specparity.serving.vllm.engine import VllmEngine
from specparity.serving.vllm.evidence import assemble_capture
from specparity.serving.vllm.ranks import RPC, RankEvidence
from specparity.sources import EMBEDDING, FINAL_NORM, boundary_to_source

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "fixtures" / "vllm" / "contract" / "tiny-llama-eagle3-hd32.json"
BUNDLE = ROOT / "fixtures" / "vllm"
L, H = 8, 64


def _atlas(fc: torch.Tensor, final_norm: torch.Tensor, seed: int) -> dict[str, torch.Tensor]:
    """A residual stream around the recording: layer:1, 3, 5 are its chunks, the others lie between them."""
    g = torch.Generator().manual_seed(seed)
    c1, c3, c5 = fc.chunk(3, dim=-1)
    scale = c1.norm(dim=-1, keepdim=True) / 8

    def noise() -> torch.Tensor:
        out: torch.Tensor = torch.randn(c1.shape, generator=g) * scale
        return out

    return {EMBEDDING: noise() * 4, "layer:0": c1 + noise(), "layer:1": c1, "layer:2": (c1 + c3) / 2 + noise(),
            "layer:3": c3, "layer:4": (c3 + c5) / 2 + noise(), "layer:5": c5, "layer:6": c5 + noise(),
            FINAL_NORM: final_norm}


def _rms(t: torch.Tensor) -> torch.Tensor:
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)


# the miswiring classes (tests/catalog, tests/vllm_engine): what the served fc input is made of
CLASSES: dict[str, Any] = {
    "healthy": ["layer:1", "layer:3", "layer:5"],
    "embedding_first": [EMBEDDING, "layer:1", "layer:3"],
    "off_by_one": ["layer:2", "layer:4", "layer:6"],
    "norm_applied": ["rms:layer:1", "rms:layer:3", "rms:layer:5"],
    "fewer_chunks": ["layer:1", "layer:3"],
    "another_layer_set": ["layer:0", "layer:3", "layer:6"],
}


def _served(atlas: dict[str, torch.Tensor], sources: list[str]) -> torch.Tensor:
    return torch.cat([_rms(atlas[s.removeprefix("rms:")]) if s.startswith("rms:") else atlas[s] for s in sources],
                     dim=-1)


class _Workers:
    """``collective_rpc`` over the taps of two ranks, each called as its own worker would be."""

    def __init__(self, taps: list[tap._Tap]) -> None:
        self.taps = taps

    def collective_rpc(self, method: str, kwargs: dict[str, str] | None = None) -> list[dict[str, Any]]:
        out = []
        for t in self.taps:
            tap._ACTIVE = t
            out.append(tap.drain(None, **(kwargs or {})) if method == RPC else tap.expect(None, **(kwargs or {})))
        return out


def _capture(sources: list[str], reduction: Reduction | None, ranks: int = 2) -> CaptureResult:
    """The tap's code on every rank for the contract's probes, then the gate's assembly of the evidence."""
    pack = read_contract_probes(load_contract(CONTRACT), CONTRACT)
    width = len(sources) * H
    taps = [tap._Tap({"rank": r, "tp_rank": r, "pp_rank": 0, "num_layers": L, "drafter": "EagleProposer",
                      "fc": {"in_features": width, "out_features": H, "bias": False}, "aux_layers": [1, 3, 5]},
                     atlas=True, reduced=reduction is not None) for r in range(ranks)]
    before = tap._ACTIVE
    try:
        evidence = RankEvidence(_Workers(taps))
        evidence.discard()
        for i, s in enumerate(pack.samples):
            assert s.final_norm is not None
            atlas = _atlas(s.fc_input, s.final_norm, seed=i)
            served = _served(atlas, sources)
            if reduction is not None:
                evidence.expect(reduction.recorded[i], expected=list(reduction.expected), rtol=reduction.rtol)
            for step, rows in enumerate((served, served[-1:], served[-1:])):  # the prefill, then two verify steps
                for t in taps:
                    for b in range(L):
                        src = boundary_to_source(b, L)
                        if t._recording():
                            t.boundary(b, atlas[src][-rows.shape[0]:] if step else atlas[src])
                    t.final_norm(atlas[FINAL_NORM][-rows.shape[0]:] if step else atlas[FINAL_NORM])
                    t.fc_call(rows)
            evidence.end_probe()
    finally:
        tap._ACTIVE = before
    dep = tiny_deployment(BUNDLE, engine_version="0.32.0", adapter="vllm-0.32", fc_in_features=width,
                          layout={"ranks_expected": list(range(ranks)), "tensor_parallel_size": ranks,
                                  "pipeline_parallel_size": 1})
    return assemble_capture(dep, evidence, [s.input_ids.tolist() for s in pack.samples], atlas=True, loop={})


class _TappedEngine(VllmEngine):
    def __init__(self, sources: list[str]) -> None:
        self.sources, self.seen = sources, cast("list[Reduction | None]", [])

    def reading(self, *a: Any, **kw: Any) -> None:  # the draft config's ids are not what is compared here
        return None

    def capture(self, target: Any, draft: Any, **kw: Any) -> Any:
        self.seen.append(kw.get("reduction"))
        return _capture(self.sources, kw.get("reduction"))


def _verdict(monkeypatch: pytest.MonkeyPatch, sources: list[str], evidence: str) -> tuple[dict[str, Any], Any]:
    return gate_with(monkeypatch, _TappedEngine(sources), "vllm", evidence)


def gate_with(monkeypatch: pytest.MonkeyPatch, eng: Any, engine: str, evidence: str) -> tuple[dict[str, Any], Any]:
    """``run_gate`` at the capture level with ``eng`` standing for the engine (its ``capture`` records the reduction
    it was given in ``eng.seen``): the report as a dict without timings, and the verdict (also used by
    test_sglang_reduced_evidence.py)."""
    monkeypatch.setattr(gate, "get_engine", lambda name: eng)
    monkeypatch.setattr(gate_verdict, "get_engine", lambda name: eng)
    v = gate.run_gate(CONTRACT, BUNDLE / "target", BUNDLE / "draft", level="capture", engine=engine,
                      evidence=evidence)
    [red] = eng.seen
    assert (red is None) == (evidence == "full")
    d = v.to_dict()
    d.pop("timings", None)
    return d, v


@pytest.mark.parametrize("name", list(CLASSES))
def test_reduced_evidence_gives_the_full_atlas_verdict(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    full, vf = _verdict(monkeypatch, CLASSES[name], "full")
    reduced, vr = _verdict(monkeypatch, CLASSES[name], "reduced")
    assert (vr.status, vr.exit_code) == (vf.status, vf.exit_code)
    assert [(f.kind, f.severity, f.chunk, f.message, f.fix) for f in vr.findings] == \
        [(f.kind, f.severity, f.chunk, f.message, f.fix) for f in vf.findings]
    assert vr.served_layout == vf.served_layout
    assert reduced == full  # every number of the report, the attribution table's included
    if name == "healthy":
        assert vf.status == "pass"
    else:
        assert vf.status == "fail" and vf.exit_code == 1


def test_the_reduced_evidence_is_small_and_only_the_lead_sends_the_fc_input() -> None:
    pack = read_contract_probes(load_contract(CONTRACT), CONTRACT)
    red = gate.reduction_for(load_contract(CONTRACT), pack)
    full, reduced = _capture(CLASSES["healthy"], None, ranks=4), _capture(CLASSES["healthy"], red, ranks=4)
    assert reduced.atlas is not None and reduced.atlas.reduced is not None and full.atlas is not None
    assert full.atlas.reduced is None and reduced.loop is not None and reduced.loop["rank_max_abs_diff"] == 0.0
    for f_s, r_s in zip(full.atlas.per_sample, reduced.atlas.per_sample, strict=True):
        assert set(r_s) == {FINAL_NORM} and torch.equal(r_s[FINAL_NORM], f_s[FINAL_NORM])  # the outcome reads it


def test_a_rank_whose_fc_input_differs_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    pack = read_contract_probes(load_contract(CONTRACT), CONTRACT)
    red = gate.reduction_for(load_contract(CONTRACT), pack)
    original = tap._Tap.fc_call

    def skewed(self: tap._Tap, x: torch.Tensor) -> None:
        original(self, x + 1e-3 if self.meta["rank"] == 1 else x)

    monkeypatch.setattr(tap._Tap, "fc_call", skewed)
    c = _capture(CLASSES["healthy"], red)
    assert c.loop is not None and c.loop["ranks_differing"] == [1] and c.loop["rank_max_abs_diff"] is None
    assert c.deployment is not None and any("ranks [1] fed fc other bytes than rank 0" in n for n in c.deployment.notes)


def test_a_prefill_that_does_not_fit_goes_as_the_full_atlas_and_a_mix_is_refused_by_name() -> None:
    pack = read_contract_probes(load_contract(CONTRACT), CONTRACT)
    red = gate.reduction_for(load_contract(CONTRACT), pack)
    # rows that are not the probe's (as a chunked prefill's first call): that probe comes as the full atlas
    every = Reduction(tuple(torch.cat([r, r[-1:]]) for r in red.recorded), red.expected, red.rtol)
    c = _capture(CLASSES["off_by_one"], every)
    full = _capture(CLASSES["off_by_one"], None)
    assert c.atlas is not None and full.atlas is not None and c.atlas.reduced is None and not c.failures
    assert all(set(a) == set(b) for a, b in zip(c.atlas.per_sample, full.atlas.per_sample, strict=True))
    one = Reduction((every.recorded[0], *red.recorded[1:]), red.expected, red.rtol)
    mixed = _capture(CLASSES["off_by_one"], one)
    assert mixed.atlas is None and [f.kind for f in mixed.failures] == ["hooks_missing"]
    assert "--evidence full" in mixed.failures[0].message


def test_a_reduced_tap_never_told_its_probe_is_refused_by_name() -> None:
    pack = read_contract_probes(load_contract(CONTRACT), CONTRACT)
    red = gate.reduction_for(load_contract(CONTRACT), pack)
    original = RankEvidence.expect
    try:
        RankEvidence.expect = lambda self, *a, **k: None  # type: ignore[method-assign]
        c = _capture(CLASSES["healthy"], red)
    finally:
        RankEvidence.expect = original  # type: ignore[method-assign]
    assert c.fc is None and [f.kind for f in c.failures] == ["hooks_missing"]


def test_the_reduced_evidence_crosses_the_child_boundary_whole(tmp_path: Path) -> None:
    """The in-process vllm.LLM child writes its capture to files (serving/child/transport.py); the parent reads it back."""
    from specparity.serving.child.transport import read_result, write_result

    pack = read_contract_probes(load_contract(CONTRACT), CONTRACT)
    c = _capture(CLASSES["embedding_first"], gate.reduction_for(load_contract(CONTRACT), pack))
    write_result(tmp_path, c)
    back = read_result(tmp_path)
    assert back is not None and back.atlas is not None and c.atlas is not None
    assert back.atlas.reduced is not None and c.atlas.reduced is not None
    for a, b in zip(c.atlas.reduced, back.atlas.reduced, strict=True):
        assert a.meta == b.meta and a.tensors.keys() == b.tensors.keys()
        assert all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
