"""Measure the margins behind compare/tolerances.py on the bundled target, for every pair of dtypes.

For served x recorded in {fp32, bf16, fp16}: the bundled target (fixtures/default) is run with HF
transformers on CPU in the served dtype (the "engine": its fc input and its layer atlas come from the
same forward, as in SGLang) and, separately, in the recorded dtype (the "training recording"), on the
contract's 4 probe samples. The gate's own attribution then reports, per pair and over the chunks of
the correct layout (layer:1, 3, 5) and of a layout one layer late (layer:2, 4, 6):

- worst separation of a recorded chunk against the serving atlas (limit: max_separation; the served
  chunks and the atlas come from one forward, so their own separation is 0);
- per-token relative error vs recorded, p99 and max, in units of the coarser dtype's roundoff, for the
  correct layout and (p99, best case) for the layout one layer late.

Run: ``PYTHONPATH=src .venv/bin/python scripts/measure_margins.py`` (about a minute on one thread).
"""

from __future__ import annotations

from pathlib import Path

import torch

from specparity.compare.attribution import attribute
from specparity.compare.tolerances import pair_tolerance
from specparity.contract import load_contract, probe_pack_path, read_probe_pack
from specparity.sources import EMBEDDING, FINAL_NORM, layer

ROOT = Path(__file__).resolve().parents[1]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
RIGHT, LATE = ["layer:1", "layer:3", "layer:5"], ["layer:2", "layer:4", "layer:6"]


def states(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        hs = model(ids[None], output_hidden_states=True).hidden_states
    out = {EMBEDDING: hs[0][0]}
    out |= {layer(i): hs[i + 1][0] for i in range(len(hs) - 2)}
    out[FINAL_NORM] = hs[-1][0]
    return out


def main() -> None:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    c = ROOT / "contracts" / "tiny-llama-eagle3.json"
    pack = read_probe_pack(probe_pack_path(load_contract(c), c))
    runs = {}
    for name, dt in DTYPES.items():
        model = AutoModelForCausalLM.from_pretrained(ROOT / "fixtures" / "default" / "target", dtype=dt).eval()
        runs[name] = [states(model, s.input_ids) for s in pack.samples]
    print(f"{'served/recorded':16} {'recorded sep (worst)':>20} {'p99 u':>7} {'max u':>7} {'one late: p99 u':>16}")
    for s_name, s_dt in DTYPES.items():
        for r_name, r_dt in DTYPES.items():
            atlas = [{k: v.to(s_dt) for k, v in a.items()} for a in runs[s_name]]
            recorded = [torch.cat([a[x] for x in RIGHT], -1).to(r_dt).to(s_dt) for a in runs[r_name]]
            drift = pair_tolerance(s_dt, r_dt)
            row = []
            for wired in (RIGHT, LATE):
                served = [torch.cat([a[x] for x in wired], -1) for a in atlas]
                row.append(attribute(served, recorded, atlas, expected=RIGHT, tolerance=pair_tolerance(s_dt, s_dt),
                                     recorded_tolerance=pair_tolerance(r_dt, s_dt)))
            right, late = row
            # the served chunk and the atlas come from one run (exact); the recording is another run: its
            # separation against the serving atlas is the cross-kernel identity margin
            sep = max(c.separation for c in right.recorded)
            p99 = max(drift.units(e.token_rel_err_p99) for e in right.evidence)
            peak = max(drift.units(e.token_rel_err_max) for e in right.evidence)
            late_p99 = min(drift.units(e.token_rel_err_p99) for e in late.evidence)
            print(f"{s_name + '/' + r_name:16} {sep:>20.3g} {p99:>7.3g} {peak:>7.3g} {late_p99:>16.3g}")


if __name__ == "__main__":
    main()
