"""Benchmark: the evidence a server's processes send per probe, full atlas against the default (reduced), at
Kimi-K2.5's geometry, through the engines' own hook code on synthetic tensors: vLLM's tap (``--engine vllm``, the
default) or SGLang's live hooks (``--engine sglang``: serving/sglang/live_hooks.py on a module tree named and called
as SGLang's llama target and EAGLE-3 drafter, each rank writing its records to the evidence directory as a scheduler
process does; the bytes are the records' files).

Probe: 512 tokens, H = 7168, bf16, a 61-layer target (boundaries ``b0..b61`` and the final norm: 63 tensors of
``[512, 7168]``), 3 fc chunks (``layer:{1,29,57}``), tensor parallelism simulated with ``--ranks`` ranks (default 8).

Each simulated rank is its own process, as a vLLM worker is: it holds the probe's tensors (what the model would),
runs serving/vllm/tap.py's hooks for the prefill and three verify steps, and builds its reply to the gate's drain as
the ``/collective_rpc`` route sends it (``drain(encoding="base64")``, JSON). Reported per mode:

- bytes per probe leaving the workers (the safetensors blobs, summed over ranks; the JSON/base64 text is 4/3 of it);
- the peak RSS of a worker process building its reply, and above the probe's own tensors (what the tap adds);
- the gate's peak RSS and wall time: decoding every rank's reply (as serving/vllm/live.py does), assembling the
  capture (serving/vllm/evidence.py) and attributing it (compare/attribution.py), in a process of its own.

The full atlas is measured with ``--full-ranks`` ranks (default 2: each full rank is ~0.5 GB of blobs, and the
gate holds every rank's; this machine is shared). Its bytes grow exactly with the rank count (every rank sends the
same atlas), so the full figures at ``--ranks`` are that per-rank figure times the rank count, and the gate's RSS is
extrapolated linearly from the two measured points (marked ``~``). ``--full-ranks`` equal to ``--ranks`` measures it.

Run: ``.venv/bin/python benchmarks/bench_evidence.py [--engine vllm|sglang] [--ranks 8] [--full-ranks 2]
[--tokens 512] [--json]``.
With ``--json`` the last line is one JSON object (full_bytes_per_probe, default_bytes_per_probe, ranks,
hidden_size, num_layers, probe_tokens, server_peak_rss_mb, gate_rss_mb, attribution_s).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def sources(layers: int) -> list[str]:
    """The fc chunks' sources: layer:1, 29, 57 at 61 layers (the EAGLE-3 default ids, 1, L/2-1, L-4)."""
    return [f"layer:{i}" for i in (1, layers // 2 - 1, layers - 4)]


SOURCES = sources(61)  # replaced by the geometry's in each process (main, _child)
VERIFY_STEPS = 3


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _rtol_for(served: str, atlas: str) -> list[float]:
    """The gate's rule (gate.reduction_for) for a contract without tolerances of its own."""
    from specparity.compare.reduced import RTOL_CHUNKS
    from specparity.compare.tolerances import resolve_tolerance, tolerances_from_contract

    base, over = tolerances_from_contract(None, dtype=served, other=atlas)
    chunks = [*SOURCES, *[None] * (RTOL_CHUNKS - len(SOURCES))]
    return [resolve_tolerance(base, over, chunk=c, source=s).rtol for c, s in enumerate(chunks)]


def _make_probe(path: Path, *, tokens: int, hidden: int, layers: int) -> None:
    import torch
    from safetensors.torch import save_file

    from specparity.compare.synthetic import bf16_noise, concat_sources, residual_stream

    states = residual_stream(layers, hidden, tokens=tokens, dtype=torch.bfloat16)
    recorded = concat_sources(states, SOURCES)
    served = bf16_noise(recorded, seed=1)
    save_file({**{f"atlas/{k}": v.contiguous() for k, v in states.items()}, "served": served.contiguous(),
               "recorded": recorded.contiguous()}, str(path))


def _warm_scan(reduce: bool) -> None:
    """numba compiles its kernels on first use (cached on disk): a tiny run of the same dtypes first."""
    import torch

    from specparity.compare.attribution import attribute
    from specparity.compare.reduced import reduce_sample
    from specparity.compare.synthetic import concat_sources, residual_stream
    from specparity.compare.tolerances import tolerances_from_contract

    s = residual_stream(max(int(x.split(":")[1]) for x in SOURCES) + 4, 16, tokens=4, dtype=torch.bfloat16)
    x = concat_sources(s, SOURCES)
    rtol = _rtol_for("bfloat16", "bfloat16")[:3]
    if reduce:
        reduce_sample(x, x, s, expected=SOURCES, rtol=rtol)
    else:
        base, over = tolerances_from_contract(None, dtype="bfloat16", other="bfloat16")
        attribute([x], [x], [s], expected=SOURCES, tolerance=base, overrides=over)


def worker(work: Path, mode: str, rank: int) -> dict[str, Any]:
    """One rank: the tap's hooks on the probe, then its drain reply as the HTTP route sends it."""
    from safetensors.torch import load_file

    from specparity.serving.vllm import tap
    from specparity.serving.vllm.tap_reduce import expect_kwargs
    from specparity.sources import boundary_to_source

    meta = json.loads((work / "geometry.json").read_text())
    layers = int(meta["layers"])
    if mode == "default":
        _warm_scan(reduce=True)
    # what the model holds anyway, in memory (load_file maps the file: its pages would count only once touched)
    t = {k: v.clone() for k, v in load_file(str(work / "probe.safetensors")).items()}
    atlas = {k.removeprefix("atlas/"): v for k, v in t.items() if k.startswith("atlas/")}
    served = t["served"]
    base = _rss_mb()
    t0 = time.perf_counter()
    tp = tap._Tap({"rank": rank, "tp_rank": rank, "pp_rank": 0, "num_layers": layers, "drafter": "EagleProposer",
                   "fc": {"in_features": int(served.shape[-1]), "out_features": 7168, "bias": False},
                   "aux_layers": [2, 30, 58]}, atlas=True, reduced=mode == "default")
    tap._ACTIVE = tp
    if mode == "default":  # the gate's EXPECT for this probe (serving/vllm/ranks.py RankEvidence.expect)
        tap.expect(None, **expect_kwargs(t["recorded"], expected=SOURCES,
                                         rtol={"bfloat16/bfloat16": _rtol_for("bfloat16", "bfloat16")}, lead=0))
    for step in range(1 + VERIFY_STEPS):  # the prefill, then verify steps of one row each
        rows = None if step == 0 else slice(-1, None)
        for b in range(layers + 1):
            if tp._recording():
                v = atlas[boundary_to_source(b, layers)]
                tp.boundary(b, v if rows is None else v[rows])
        norm = atlas["final_norm"]
        tp.final_norm(norm if rows is None else norm[rows])
        tp.fc_call(served if rows is None else served[rows])
    raw = sum(len(b) for b in tp.pending)
    reply = json.dumps(tap.drain(None, encoding="base64"))
    tap_s = time.perf_counter() - t0
    (work / mode / f"rank{rank}.json").write_text(reply)
    return {"rank": rank, "bytes": raw, "reply_bytes": len(reply), "peak_rss_mb": _peak_mb(), "base_rss_mb": base,
            "tap_s": tap_s}


def gate(work: Path, mode: str, ranks: int) -> dict[str, Any]:
    """The gate: every rank's reply decoded, the capture assembled, every chunk attributed."""
    import base64

    from specparity.serving.vllm.evidence import assemble_capture
    from specparity.serving.vllm.ranks import RankEvidence

    meta = json.loads((work / "geometry.json").read_text())
    _warm_scan(reduce=False)
    t0 = time.perf_counter()
    replies = []
    for r in range(ranks):
        reply = json.loads((work / mode / f"rank{r}.json").read_text())
        reply["calls"] = [base64.b64decode(c) for c in reply["calls"]]  # as serving/vllm/live.py HttpRpc does
        replies.append(reply)

    class _Llm:
        def collective_rpc(self, method: str, kwargs: Any = None) -> list[dict[str, Any]]:
            return replies

    evidence = RankEvidence(_Llm())
    evidence.end_probe()
    replies.clear()  # the evidence holds the blobs now
    dep = _deployment(meta, "0.32.0", ranks)
    capture = assemble_capture(dep, evidence, [list(range(int(meta["tokens"])))], atlas=True, loop={})
    return _attributed(work, capture, ranks, decode_s=time.perf_counter() - t0)


def _attributed(work: Path, capture: Any, ranks: int, *, decode_s: float) -> dict[str, Any]:
    """The gate's attribution of an assembled capture against the probe's recording, timed."""
    from safetensors.torch import load_file

    from specparity.compare.attribution import attribute
    from specparity.compare.tolerances import tolerances_from_contract

    assert capture.fc is not None and capture.atlas is not None, capture.failures
    recorded = load_file(str(work / "probe.safetensors"))["recorded"]
    base, over = tolerances_from_contract(None, dtype="bfloat16", other="bfloat16")
    t1 = time.perf_counter()
    table = attribute(capture.fc.per_sample, [recorded.to(capture.fc.per_sample[0].dtype)], capture.atlas.per_sample,
                      expected=SOURCES, tolerance=base, overrides=over, reduced=capture.atlas.reduced)
    attribution_s = time.perf_counter() - t1
    return {"ranks": ranks, "decode_s": decode_s, "attribution_s": attribution_s, "rss_mb": _peak_mb(),
            "served": table.served_sources(), "rank_diff": (capture.loop or {}).get("rank_max_abs_diff"),
            "failures": [f.kind for f in capture.failures]}


def sglang_worker(work: Path, mode: str, rank: int) -> dict[str, Any]:
    """One SGLang scheduler process (TP rank ``rank``): the live hooks as ``--forward-hooks`` registers them, one
    priming forward (adoption), then the probe's target and draft extends while armed; its records are its bytes."""
    from types import SimpleNamespace

    import torch
    from safetensors.torch import load_file

    from specparity.serving.sglang import live, live_hooks, live_wire

    meta = json.loads((work / "geometry.json").read_text())
    layers, hidden = int(meta["layers"]), int(meta["hidden"])
    if mode == "default":
        _warm_scan(reduce=True)
    t = {k: v.clone() for k, v in load_file(str(work / "probe.safetensors")).items()}
    stream = {k.removeprefix("atlas/"): v for k, v in t.items() if k.startswith("atlas/")}
    served = t["served"]
    evidence = work / mode / "evidence"
    live_hooks._rank = lambda: (rank, int(meta["ranks"]))  # torch.distributed's rank in a scheduler process

    class Norm(torch.nn.Module):  # SGLang's RMSNorm call shape; scripted: the boundary is what it is handed
        def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> Any:
            return x if residual is None else (x, x)

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.input_layernorm = Norm()

    class Inner(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(Layer() for _ in range(layers))
            self.norm = Norm()

        def forward(self, ids: Any, pos: Any, batch: Any) -> Any:
            st = batch.stream
            self.layers[0].input_layernorm(st["embedding"])
            for i in range(1, layers):
                self.layers[i].input_layernorm(st[f"layer:{i - 1}"], st["embedding"])
            self.norm(st[f"layer:{layers - 1}"], st["embedding"])
            return st["final_norm"], list(batch.served.split(hidden, dim=-1))

    class Fc(torch.nn.Module):  # the drafter's fc: only its input is evidence (no 21504 x 7168 matmul here)
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[:, :hidden]

    class DraftInner(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = Fc()

        def forward(self, ids: Any, pos: Any, batch: Any) -> Any:
            return self.fc(batch.spec_info.hidden_states)

    target, draft = Inner(), DraftInner()
    hook = live_hooks.factory(live.hook_specs(evidence)[0]["config"])
    assert hook is not None
    target.register_forward_hook(hook)
    draft.register_forward_hook(hook)

    def extend(rows: int, st: dict[str, Any], x: Any) -> None:
        ids = torch.arange(rows)
        batch = SimpleNamespace(forward_mode=SimpleNamespace(name="EXTEND"), input_ids=ids, positions=ids,
                                extend_seq_lens=torch.tensor([rows]), extend_prefix_lens=torch.tensor([0]),
                                req_pool_indices=torch.tensor([rows % 7]), spec_info=SimpleNamespace(hidden_states=x),
                                stream=st, served=x)
        with torch.no_grad():
            target(ids, ids, batch)
            draft(ids, ids, batch)

    extend(1, {k: v[:1] for k, v in stream.items()}, served[:1])  # adopts both models (unarmed)
    base = _rss_mb()
    (evidence / live_wire.ARMED).touch()
    t0 = time.perf_counter()
    extend(int(served.shape[0]), stream, served)
    tap_s = time.perf_counter() - t0
    raw = sum(f.stat().st_size for f in (evidence / live_wire.RECORDS).glob(f"r{rank}-*"))
    (evidence / live_wire.ARMED).unlink()
    return {"rank": rank, "bytes": raw, "reply_bytes": raw, "peak_rss_mb": _peak_mb(), "base_rss_mb": base,
            "tap_s": tap_s}


def sglang_gate(work: Path, mode: str, ranks: int) -> dict[str, Any]:
    """The gate: every rank's records read (serving/sglang/live.py), the capture assembled, every chunk attributed."""

    from specparity.serving.sglang.live import evidence_to_capture

    meta = json.loads((work / "geometry.json").read_text())
    _warm_scan(reduce=False)
    t0 = time.perf_counter()
    dep = _deployment(meta, "0.5.23", ranks)
    capture = evidence_to_capture(work / mode / "evidence", [list(range(int(meta["tokens"])))], deployment=dep)
    return _attributed(work, capture, ranks, decode_s=time.perf_counter() - t0)


def _deployment(meta: dict[str, Any], version: str, ranks: int) -> Any:
    """The deployment both gates judge: the probe's geometry, ids 2, 30, 58 (layer:1, 29, 57 served), ``ranks`` TP
    ranks."""
    from specparity.serving.results import ResolvedDeployment, SpecSettings

    spec = SpecSettings(3, 1, 4)
    h, layers = int(meta["hidden"]), int(meta["layers"])
    return ResolvedDeployment(
        engine_version=version, adapter="bench", target_path="t", draft_path="d", device="cuda",
        target_architecture="DeepseekV3ForCausalLM", num_layers=layers, target_hidden_size=h, target_vocab_size=1,
        target_dtype="bfloat16", draft_architecture="LlamaForCausalLMEagle3", draft_hidden_size=h,
        draft_vocab_size=1, requested_spec=spec, resolved_spec=spec, spec_warnings=(), draft_config_ids=(2, 30, 58),
        ids_fallback_reason=None, layers_to_capture=(2, 30, 58), served_sources=tuple(SOURCES),
        fc_in_features=3 * h, fc_out_features=h, fc_bias=False, num_aux_hidden_states=3, fc_applied=True,
        norm_before_fc=False, fc_norm=False, norm_output=False, fc_bias_in_config=False, server_args={},
        timings={}, layout={"ranks_expected": list(range(ranks)), "tensor_parallel_size": ranks,
                            "pipeline_parallel_size": 1})


def _child(*args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", *args], check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _measure(work: Path, mode: str, ranks: int, engine: str = "vllm") -> dict[str, Any]:
    import shutil

    (work / mode).mkdir(exist_ok=True)
    if engine == "sglang":
        _sglang_evidence(work, mode, ranks)
    workers = [_child(str(work), f"{engine}-worker", mode, str(r)) for r in range(ranks)]
    g = _child(str(work), f"{engine}-gate", mode, str(ranks))
    for r in range(ranks):
        (work / mode / f"rank{r}.json").unlink(missing_ok=True)
    shutil.rmtree(work / mode / "evidence", ignore_errors=True)
    return {"workers": workers, "gate": g, "bytes": sum(w["bytes"] for w in workers),
            "reply_bytes": sum(w["reply_bytes"] for w in workers),
            "worker_peak_mb": max(w["peak_rss_mb"] for w in workers),
            "worker_added_mb": max(w["peak_rss_mb"] - w["base_rss_mb"] for w in workers),
            "tap_s": max(w["tap_s"] for w in workers)}


def _sglang_evidence(work: Path, mode: str, ranks: int) -> None:
    """The evidence directory the gate makes (0700), with the gate's expectation of the probe in default mode."""
    import shutil

    from safetensors.torch import load_file

    from specparity.serving.sglang import live_wire

    evidence = work / mode / "evidence"
    shutil.rmtree(evidence, ignore_errors=True)
    evidence.mkdir(mode=0o700)
    geometry = json.loads((work / "geometry.json").read_text())
    (work / "geometry.json").write_text(json.dumps({**geometry, "ranks": ranks}))
    if mode == "default":
        import torch

        recorded = load_file(str(work / "probe.safetensors"))["recorded"]
        live_wire.write_expectations(evidence, [list(range(int(recorded.shape[0])))], [recorded],
                                      expected=SOURCES, rtol={"bfloat16/bfloat16": _rtol_for("bfloat16", "bfloat16")},
                                      lead=0)
        del torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=["vllm", "sglang"], default="vllm")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--full-ranks", type=int, default=2, help="ranks the full atlas is measured with")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--layers", type=int, default=61)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = parser.parse_args()
    global SOURCES
    if a.child:
        work, role, mode, n = Path(a.child[0]), a.child[1], a.child[2], int(a.child[3])
        SOURCES = sources(int(json.loads((work / "geometry.json").read_text())["layers"]))
        run = {"vllm-worker": worker, "vllm-gate": gate, "sglang-worker": sglang_worker,
               "sglang-gate": sglang_gate}[role]
        print(json.dumps(run(work, mode, n)))
        return
    SOURCES = sources(a.layers)
    full_n = max(1, min(a.full_ranks, a.ranks))
    with tempfile.TemporaryDirectory(prefix="bench-evidence-") as tmp:
        work = Path(tmp)
        (work / "geometry.json").write_text(json.dumps({"tokens": a.tokens, "hidden": a.hidden, "layers": a.layers}))
        _make_probe(work / "probe.safetensors", tokens=a.tokens, hidden=a.hidden, layers=a.layers)
        full_one = _measure(work, "full", 1, a.engine) if full_n > 1 else None
        full = _measure(work, "full", full_n, a.engine)
        default = _measure(work, "default", a.ranks, a.engine)
    per_rank = full["bytes"] / full_n
    full_bytes = int(per_rank * a.ranks)
    g_full = full["gate"]["rss_mb"]
    if full_n < a.ranks and full_one is not None:  # linear in the rank count, from the two measured points
        slope = (g_full - full_one["gate"]["rss_mb"]) / (full_n - 1)
        g_full = g_full + slope * (a.ranks - full_n)
    est = "~" if full_n < a.ranks else ""
    load = os.getloadavg()
    print(f"{a.engine}: probe: {a.tokens} tokens, hidden {a.hidden}, {a.layers} layers, {a.ranks} TP ranks, bf16; "
          f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'':42} {'full atlas':>16} {'default':>14} {'default/full':>13}")
    rows = [
        ("bytes per probe leaving the workers", f"{est}{full_bytes / 2**20:,.1f} MiB",
         f"{default['bytes'] / 2**20:,.2f} MiB", f"{default['bytes'] / full_bytes:.3%}"),
        ("  as /collective_rpc JSON text" if a.engine == "vllm" else "  as the hooks' record files", f"{est}{full['reply_bytes'] / full_n * a.ranks / 2**20:,.1f} MiB",
         f"{default['reply_bytes'] / 2**20:,.2f} MiB", ""),
        ("worker peak RSS (building its reply)", f"{full['worker_peak_mb']:,.0f} MB",
         f"{default['worker_peak_mb']:,.0f} MB", ""),
        ("  above the probe's own tensors", f"{full['worker_added_mb']:,.0f} MB",
         f"{default['worker_added_mb']:,.0f} MB", ""),
        ("worker time in the tap (prefill + verify)", f"{full['tap_s']:.2f} s", f"{default['tap_s']:.2f} s", ""),
        ("gate peak RSS", f"{est}{g_full:,.0f} MB", f"{default['gate']['rss_mb']:,.0f} MB", ""),
        ("gate decode + assemble", f"{full['gate']['decode_s']:.2f} s ({full_n} rk)",
         f"{default['gate']['decode_s']:.2f} s", ""),
        ("gate attribution", f"{full['gate']['attribution_s']:.2f} s", f"{default['gate']['attribution_s']:.2f} s",
         ""),
    ]
    for r in rows:
        print(f"{r[0]:42} {r[1]:>16} {r[2]:>14} {r[3]:>13}")
    same = full["gate"]["served"] == default["gate"]["served"]
    print(f"attributed chunks: full {full['gate']['served']}, default {default['gate']['served']} "
          f"({'the same' if same else 'DIFFERENT'}); rank agreement: full max|d| {full['gate']['rank_diff']}, "
          f"default {default['gate']['rank_diff']}")
    if full_n < a.ranks:
        print(f"full atlas measured with {full_n} rank(s) (and 1 for the gate's RSS slope); ~ = scaled to {a.ranks}")
    if a.json:
        print(json.dumps({
            "full_bytes_per_probe": full_bytes, "default_bytes_per_probe": int(default["bytes"]), "ranks": a.ranks,
            "hidden_size": a.hidden, "num_layers": a.layers, "probe_tokens": a.tokens,
            "server_peak_rss_mb": {"full": round(full["worker_peak_mb"], 1),
                                   "default": round(default["worker_peak_mb"], 1)},
            "gate_rss_mb": {"full": round(g_full, 1), "default": round(default["gate"]["rss_mb"], 1)},
            "attribution_s": {"full": round(full["gate"]["attribution_s"], 3),
                              "default": round(default["gate"]["attribution_s"], 3)},
            "full_ranks_measured": full_n, "load": [round(x, 2) for x in load], "engine": a.engine}))


if __name__ == "__main__":
    main()
