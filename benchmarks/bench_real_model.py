"""Benchmark: the gate on the real model (SmolLM2-135M-Instruct + its trained drafter) against a bare engine.

Ratios measured in one run, not asserts (goal <= 1.2x each):

  vLLM   (a) bare: a fresh interpreter of the vLLM env builds ``vllm.LLM`` with the settings the gate uses
             (EAGLE-3, 3 speculative tokens, the healthy drafter) and generates the contract's probes greedily,
             16 tokens each, nothing else;
         (b) the gate: ``specparity gate --engine vllm --level all`` (the tap in every worker, the atlas,
             attribution, the outcome replay, the loop's counters).
  SGLang (a) bare: a fresh .venv interpreter imports SGLang, builds the target's ``ModelRunner`` through
             specparity's serving child with nothing measured: ``--level static`` (SGLang's own objects on
             the meta device) is the floor we can start without the gate's own work; the bare prefill of
             the same probes is the HF forward of the target on them (the same tokens, the same dtype);
         (b) the gate: ``specparity gate --level all`` (SGLang's real workers, the fc tap, the atlas, replay).
         The SGLang figure is (b) / ((a) static + HF prefill), printed with both parts.

Wall time of the whole command and peak RSS (the largest process of its tree, ``RUSAGE_CHILDREN``). Also the
attribution margins per chunk at this model's activation scale, read from the gate's JSON report: identity
separation (the served chunk's error to its best boundary over the runner-up's; 0 means no other boundary
comes close) and drift against the recording in units of the served dtype's unit roundoff.

Run: ``.venv/bin/python benchmarks/bench_real_model.py [--vllm-python .tox/vllm-0.32/bin/python] [--skip-vllm]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from bare_vllm import BARE_GENERATE  # noqa: E402

from specparity.realmodel.fetch import fetch  # noqa: E402
from specparity.realmodel.scenarios import CONTRACT, VLLM, draft_for  # noqa: E402

GOAL = 1.2
MEASURE = r"""
import resource, subprocess, sys, time
t = time.perf_counter()
rc = subprocess.call(sys.argv[1:])
wall = time.perf_counter() - t
print("@@bench", rc, wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, flush=True)
"""
HF_PREFILL = r"""
import json, sys, torch
from transformers import AutoModelForCausalLM
probes = json.loads(open(sys.argv[2]).read())
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
with torch.no_grad():
    for p in probes:
        m(torch.tensor([p]), output_hidden_states=True)
"""


def measured(cmd: list[str], env: dict[str, str] | None = None) -> tuple[int, float, float]:
    out = subprocess.run([sys.executable, "-c", MEASURE, *cmd], capture_output=True, text=True, env=env)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("@@bench")), None)
    if line is None:
        raise SystemExit(f"benchmark child failed: {out.stderr[-2000:]}")
    _, rc, wall, rss = line.split()
    return int(rc), float(wall), float(rss)


def probes(tmp: Path) -> Path:
    from specparity.contract.io import load_contract
    from specparity.contract.probes import read_probe_pack

    c = load_contract(CONTRACT)
    assert c.probes is not None
    pack = read_probe_pack(CONTRACT.parent / c.probes.file)
    path = tmp / "probes.json"
    path.write_text(json.dumps([[int(t) for t in s.input_ids] for s in pack.samples]))
    return path


def margins(report: Path) -> list[str]:
    d = json.loads(report.read_text())
    lines = []
    for c in d.get("chunks", []):
        u = c.get("unit_roundoff") or 0.0
        p99 = c.get("rel_err_p99")
        lines.append(f"    chunk {c['index']} {c.get('served')}: separation {c.get('separation')} "
                     f"(runner-up {c.get('runner_up')}), drift p99 "
                     + (f"{p99 / u:.1f} u" if p99 is not None and u else "n/a")
                     + (f", max {c['rel_err_max'] / u:.1f} u" if c.get("rel_err_max") is not None and u else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-python", default=str(REPO / ".tox" / "vllm-0.32" / "bin" / "python"))
    parser.add_argument("--skip-vllm", action="store_true")
    args = parser.parse_args(argv)
    model = fetch()
    target = model.fp32
    cli = [sys.executable, "-m", "specparity.cli", "gate", "--contract", str(CONTRACT), "--target", str(target)]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; target {target}")
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        ids = probes(tmp)
        # SGLang
        _, static_s, static_mb = measured([*cli, "--draft", str(REPO / "fixtures" / "real" / "draft"),
                                           "--level", "static"])
        _, hf_s, hf_mb = measured([sys.executable, "-c", HF_PREFILL, str(target), str(ids)])
        rep = tmp / "sglang.json"
        rc, gate_s, gate_mb = measured([*cli, "--draft", str(REPO / "fixtures" / "real" / "draft"), "--level", "all",
                                        "--json", str(rep)])
        bare_s, bare_mb = static_s + hf_s, max(static_mb, hf_mb)
        print(f"SGLang gate --level all: {gate_s:.1f} s, {gate_mb:.0f} MB (exit {rc}); bare: static {static_s:.1f} s "
              f"+ HF prefill {hf_s:.1f} s = {bare_s:.1f} s, {bare_mb:.0f} MB")
        print(f"  ratio wall {gate_s / bare_s:.2f}x, peak RSS {gate_mb / bare_mb:.2f}x (goal <= {GOAL}x)")
        print("  attribution margins (fp32 served, fp32 recorded):")
        print("\n".join(margins(rep)))
        if not args.skip_vllm:
            healthy = draft_for(VLLM[0], tmp)
            _, bare_s, bare_mb = measured([args.vllm_python, "-c", BARE_GENERATE, "1", str(target), str(healthy),
                                           str(ids)])
            rep = tmp / "vllm.json"
            env = {**os.environ}
            rc, gate_s, gate_mb = measured([*cli, "--draft", str(healthy), "--engine", "vllm", "--python",
                                            args.vllm_python, "--level", "all", "--json", str(rep)], env=env)
            print(f"vLLM gate --level all: {gate_s:.1f} s, {gate_mb:.0f} MB (exit {rc}); bare LLM start + generate of "
                  f"the probes: {bare_s:.1f} s, {bare_mb:.0f} MB")
            print(f"  ratio wall {gate_s / bare_s:.2f}x, peak RSS {gate_mb / bare_mb:.2f}x (goal <= {GOAL}x)")
            print("  attribution margins (vLLM fp32 served, HF fp32 recorded):")
            print("\n".join(margins(rep)))
    t = time.strftime("%Y-%m-%d")
    print(f"measured {t}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
