"""SGLang's live hooks reduce the atlas in the server's processes, and the verdict is the full atlas's.

The hooks' own code (``serving/sglang/live_hooks.py``, registered as SGLang's ``hook_manager`` registers a
``--forward-hooks`` spec) runs on a module tree named and called like SGLang 0.5.23's llama target and EAGLE-3
drafter, whose residual stream at every boundary is scripted from the bundled contract's recorded fc inputs (the
stream layer:1, 3, 5 is the recording; the other boundaries lie between). Each miswiring class the suite knows feeds
the drafter's fc its own mix of that stream. Every "rank" runs the hooks with ``torch.distributed``'s rank set, and
the gate judges the records (``serving/sglang/live.py`` ``evidence_to_capture`` through ``run_gate``) once as the
full atlas and once reduced: findings, chunk attributions, fix and every number of the report must be the same.

Two evidence directories stand for the two nodes of an ``--nnodes 2`` server: read together they account for every
rank; without the second, the node is named and the exit code is 3. The real server runs in
tests/serving/test_sglang_live_server.py.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tests.resolved_deployments import tiny_deployment
from tests.unit.test_reduced_evidence import CLASSES, _atlas, _rms, gate_with

from specparity import gate
from specparity.compare.reduced import Reduction
from specparity.contract import load_contract, read_contract_probes
from specparity.serving.results import NODE_MISSING, CaptureResult
from specparity.serving.sglang import live, live_hooks, live_wire
from specparity.serving.sglang.engine import SglangEngine
from specparity.sources import EMBEDDING, FINAL_NORM

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "fixtures" / "vllm" / "contract" / "tiny-llama-eagle3-hd32.json"
BUNDLE = ROOT / "fixtures" / "vllm"
L, H = 8, 64



def _stream(fc: torch.Tensor, seed: int) -> dict[str, torch.Tensor]:
    """The residual stream at every boundary (test_reduced_evidence.py's: layer:1, 3, 5 are the recorded chunks, the
    others lie between), with the last layer's boundary the scripted target's final norm reads."""
    stream = _atlas(fc, fc[:, :H], seed)
    del stream[FINAL_NORM]
    stream["layer:7"] = 1.5 * stream["layer:6"]
    return stream


class Norm(torch.nn.Module):
    """SGLang's RMSNorm call shape: ``norm(x)`` -> normed; ``norm(x, residual)`` -> ``(normed, updated residual)``.
    Scripted: the updated residual is ``x`` (the inner model passes the boundary it wants the hooks to see)."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> Any:
        return _rms(x) if residual is None else (_rms(x), x)


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm = Norm()


class Inner(torch.nn.Module):
    """The target's inner ``model``: each layer's input norm called as 0.5.23's layer_boundary calls it."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer() for _ in range(L))
        self.norm = Norm()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: Any) -> Any:
        stream = batch.stream
        self.layers[0].input_layernorm(stream[EMBEDDING])
        for i in range(1, L):
            self.layers[i].input_layernorm(stream[f"layer:{i - 1}"], stream[EMBEDDING])
        normed, _ = self.norm(stream[f"layer:{L - 1}"], stream[EMBEDDING])
        return normed, list(batch.served.split(H, dim=-1))


class Target(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = Inner()


class DraftInner(torch.nn.Module):
    def __init__(self, k: int, norm_before_fc: bool = False) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(k * H, H)
        self.norm_before_fc = norm_before_fc

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: Any) -> torch.Tensor:
        h = batch.spec_info.hidden_states
        out: torch.Tensor = self.fc(_rms(h) if self.norm_before_fc else h)  # llama_eagle3.py:236-247's order
        return out


class Draft(torch.nn.Module):
    def __init__(self, k: int, norm_before_fc: bool = False) -> None:
        super().__init__()
        self.model = DraftInner(k, norm_before_fc)


def _register(model: torch.nn.Module, evidence: Path) -> None:
    """sglang 0.5.23 model_executor/hook_manager.py:11-55, without SGLang."""
    named = dict(model.named_modules())
    for spec in live.hook_specs(evidence):
        hook = live_hooks.factory(spec["config"])
        assert hook is not None
        for name, module in named.items():
            if any(fnmatch.fnmatch(name, p) for p in spec["target_modules"]):
                module.register_forward_hook(hook)


def _serve(target: Target, draft: Draft, ids: list[int], pool: int, stream: dict[str, torch.Tensor],
           served: torch.Tensor) -> None:
    """One request's prefill as EAGLEWorkerV2 runs it: the target extend, then the draft extend on its aux."""
    t = torch.tensor(ids)
    batch = SimpleNamespace(forward_mode=SimpleNamespace(name="EXTEND"), input_ids=t, positions=torch.arange(len(t)),
                            extend_seq_lens=torch.tensor([len(t)]), extend_prefix_lens=torch.tensor([0]),
                            req_pool_indices=torch.tensor([pool]), spec_info=SimpleNamespace(hidden_states=None),
                            stream=stream, served=served)
    with torch.no_grad():
        target.model(batch.input_ids, batch.positions, batch)
        batch.spec_info.hidden_states = served
        draft.model(batch.input_ids, batch.positions, batch)


def _run(root: Path, monkeypatch: pytest.MonkeyPatch, sources: list[str], reduction: Reduction | None, *,
         ranks: int = 2, nodes: int = 1, read_nodes: int | None = None, skew_rank: int | None = None,
         norm_before_fc: bool = False) -> CaptureResult:
    """Every rank's hooks through the contract's probes (rank r on node ``r * nodes // ranks``), then the gate's
    reading of the first ``read_nodes`` nodes' evidence directories."""
    pack = read_contract_probes(load_contract(CONTRACT), CONTRACT)
    probes = [s.input_ids.tolist() for s in pack.samples]
    dirs = [root / f"node{n}" for n in range(nodes)]
    for d in dirs:
        d.mkdir(mode=0o700)
        if reduction is not None:
            live_wire.write_expectations(d, probes, reduction.recorded, expected=list(reduction.expected),
                                          rtol=reduction.rtol, lead=0, served=reduction.served)
    for rank in range(ranks):
        d = dirs[rank * nodes // ranks]
        monkeypatch.setattr(live_hooks, "_rank", lambda rank=rank: (rank, ranks))
        target, draft = Target(), Draft(len(sources), norm_before_fc)
        _register(target, d)
        _register(draft, d)
        one = {k: v[:1] for k, v in _stream(pack.samples[0].fc_input, 0).items()}
        _serve(target, draft, probes[0][:1], 99, one, torch.zeros(1, len(sources) * H))  # adopts both models
        with live.armed(d):
            for i, (s, ids) in enumerate(zip(pack.samples, probes, strict=True)):
                stream = _stream(s.fc_input, seed=i)
                served = torch.cat([_rms(stream[x.removeprefix("rms:")]) if x.startswith("rms:") else stream[x]
                                    for x in sources], dim=-1)
                if rank == skew_rank:
                    served = served + 1e-3
                _serve(target, draft, ids, i, stream, served)
    tp = ranks
    layout = {"ranks_expected": list(range(ranks)), "tensor_parallel_size": tp, "pipeline_parallel_size": 1,
              "nnodes": nodes, "node_ranks": {str(n): live.node_ranks(tp, 1, nodes, n) for n in range(nodes)}}
    dep = tiny_deployment(BUNDLE, fc_in_features=len(sources) * H, layout=layout)
    read = dirs[:read_nodes if read_nodes is not None else nodes]
    return live.evidence_to_capture(read[0], probes, deployment=dep, node_dirs=read[1:])


class _HookedEngine(SglangEngine):
    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch, sources: list[str], **kw: Any) -> None:
        self.root, self.mp, self.sources, self.kw = root, monkeypatch, sources, kw
        self.seen: list[Reduction | None] = []

    def capture(self, target: Any, draft: Any, **kw: Any) -> Any:
        self.seen.append(kw.get("reduction"))
        where = self.root / ("reduced" if kw.get("reduction") is not None else "full")
        where.mkdir()
        return _run(where, self.mp, self.sources, kw.get("reduction"), **self.kw)


def _verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sources: list[str], evidence: str,
             **kw: Any) -> tuple[dict[str, Any], Any]:
    return gate_with(monkeypatch, _HookedEngine(tmp_path, monkeypatch, sources, **kw), "sglang", evidence)


@pytest.mark.parametrize("name", list(CLASSES))
def test_the_hooks_reduced_evidence_gives_the_full_atlas_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 name: str) -> None:
    full, vf = _verdict(tmp_path, monkeypatch, CLASSES[name], "full")
    reduced, vr = _verdict(tmp_path, monkeypatch, CLASSES[name], "reduced")
    assert (vr.status, vr.exit_code) == (vf.status, vf.exit_code)
    assert [(f.kind, f.severity, f.chunk, f.message, f.fix) for f in vr.findings] == \
        [(f.kind, f.severity, f.chunk, f.message, f.fix) for f in vf.findings]
    assert vr.served_layout == vf.served_layout
    assert reduced == full  # every number of the report, the attribution table's included
    if name == "healthy":
        assert vf.status == "pass", [f.message for f in vf.findings]
    else:
        assert vf.status == "fail" and vf.exit_code == 1


def _reduction() -> Reduction:
    contract = load_contract(CONTRACT)
    return gate.reduction_for(contract, read_contract_probes(contract, CONTRACT))


def test_the_reduced_records_are_small_and_only_the_lead_keeps_its_fc_input(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    full = _run(tmp_path / "a", monkeypatch, CLASSES["healthy"], None, ranks=4)
    red = _run(tmp_path / "b", monkeypatch, CLASSES["healthy"], _reduction(), ranks=4)
    assert not full.failures and not red.failures, red.failures
    assert red.atlas is not None and red.atlas.reduced is not None and full.atlas is not None
    assert full.atlas.reduced is None and red.loop == {"evidence": "reduced"}
    assert all(set(s) == {FINAL_NORM} for s in red.atlas.per_sample)  # the lead's final norm only
    sizes = {name: sum(p.stat().st_size for p in (tmp_path / name / "node0" / "records").iterdir())
             for name in ("a", "b")}
    assert sizes["b"] < sizes["a"] / 2, sizes  # 8 layers x H=64 here; at Kimi-K2.5's geometry see bench_evidence
    for rec in live.read_records(tmp_path / "b" / "node0"):
        assert not any(k == EMBEDDING or k.startswith("layer:") for k in rec.tensors)  # no boundary left the hook
        if rec.rank:
            assert set(rec.tensors) <= {"input_ids", "positions", "extend_seq_lens", "extend_prefix_lens",
                                        "req_pool_indices"}, sorted(rec.tensors)


def test_a_rank_whose_fc_input_differs_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = _run(tmp_path, monkeypatch, CLASSES["healthy"], _reduction(), skew_rank=1)
    assert c.loop is not None and c.loop["ranks_differing"] == [1]
    assert c.deployment is not None and any("ranks [1] fed fc other bytes than rank 0" in n for n in c.deployment.notes)


def test_two_nodes_are_accounted_for_rank_by_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--nnodes 2``: each node's hooks write to their own directory. Read together, every rank reported; read
    without the second node's, the node is named (exit 3), never a pass on half the ranks."""
    both = _run(tmp_path, monkeypatch, CLASSES["healthy"], _reduction(), ranks=4, nodes=2)
    assert both.failures == () and both.deployment is not None
    assert both.deployment.layout["ranks_reported"] == [0, 1, 2, 3]
    half = live.evidence_to_capture(tmp_path / "node0", [s.input_ids.tolist() for s in read_contract_probes(
        load_contract(CONTRACT), CONTRACT).samples], deployment=both.deployment)
    assert [f.kind for f in half.failures] == [NODE_MISSING]
    assert "node 1 of 2 (ranks 2-3)" in half.failures[0].message and "--node-evidence" in half.failures[0].message
    from specparity.verdict.rules import serving_findings, status_of

    findings = serving_findings(half.failures, engine="sglang", version="0.5.23")
    assert status_of(findings) == "error"  # exit 3: the gate's reach, never the deployment's fault


def test_node_ranks_are_sglangs_own_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    """live.node_ranks against SGLang's own _calculate_rank_ranges and world-rank rule (model_runner.py:700)."""
    engine = pytest.importorskip("sglang.srt.entrypoints.engine")
    if not hasattr(engine, "_calculate_rank_ranges"):
        pytest.skip("this SGLang release places ranks elsewhere")
    for tp, pp, nnodes in [(8, 1, 2), (16, 1, 2), (4, 2, 2), (8, 2, 4), (2, 4, 2), (8, 1, 1)]:
        monkeypatch.setattr(engine, "get_parallel", lambda tp=tp, pp=pp, nnodes=nnodes: SimpleNamespace(
            nnodes=nnodes, pp_size=pp, tp_size=tp))
        for node in range(nnodes):
            pps, tps, _, _ = engine._calculate_rank_ranges(node)
            assert live.node_ranks(tp, pp, nnodes, node) == [tp * p + t for p in pps for t in tps], (tp, pp, node)


def test_node_evidence_is_refused_where_it_cannot_be_used(tmp_path: Path) -> None:
    """``--node-evidence`` is SGLang's live path only, and each directory must be the hooks' kind (this user's, 0700):
    exit 2 naming the flag, before any engine starts."""
    from click.testing import CliRunner

    from specparity.cli import main

    base = ["gate", "--contract", str(CONTRACT), "--target", str(BUNDLE / "target"), "--draft", str(BUNDLE / "draft")]
    node = tmp_path / "node1"
    node.mkdir(mode=0o700)
    r = CliRunner().invoke(main, [*base, "--node-evidence", str(node)])
    assert r.exit_code == 2 and "--node-evidence needs the server" in r.output, r.output
    r = CliRunner().invoke(main, [*base, "--engine", "vllm", "--node-evidence", str(node)])
    assert r.exit_code == 2 and "vLLM reaches every node" in r.output, r.output
    with pytest.raises(Exception, match="mode 0o755"):
        node.chmod(0o755)
        gate._node_evidence([node], "sglang", live=True)


def test_a_drafter_that_norms_before_fc_is_reduced_on_the_targets_aux_states(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """With norm_before_fc the gate compares the target's aux states, not fc's normed input (gate.py _attribute); the
    hooks then reduce the aux rows, and keep them for the gate, so both forms still judge the same tensor."""
    import dataclasses

    from specparity.compare.reduced import reduce_sample

    red = dataclasses.replace(_reduction(), served="aux")
    c = _run(tmp_path, monkeypatch, CLASSES["healthy"], red, ranks=1, norm_before_fc=True)
    assert c.fc is not None and c.atlas is not None and c.atlas.reduced is not None and not c.failures
    for i, sample in enumerate(c.atlas.reduced):
        aux = c.fc.aux_per_sample[i]
        assert not torch.equal(aux, c.fc.per_sample[i])  # fc saw the normed states
        stream = _stream(red.recorded[i], seed=i)
        want = reduce_sample(aux, red.recorded[i].to(aux.dtype), {**stream, FINAL_NORM: stream["layer:7"]},
                             expected=list(red.expected), rtol=red.rtol["float32/float32"][:3])
        assert sample.tensors["ev0/served_norm2"].shape == want.tensors["ev0/served_norm2"].shape
        torch.testing.assert_close(sample.tensors["ev0/served_norm2"], want.tensors["ev0/served_norm2"])
