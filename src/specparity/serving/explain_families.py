"""What ``explain`` says about the drafter's family, on either engine: the family and the algorithm it is served with,
a block-diffusion drafter's block size, and the engine's environment switches that choose which residual stream the
aux states come from (serving/aux_env.py). The Llama-style EAGLE-3 head prints what it printed before: no family line."""

from __future__ import annotations

from typing import Any

from specparity.drafters import DrafterFamily
from specparity.serving.results import ResolvedDeployment


def family_lines(dep: ResolvedDeployment) -> list[str]:
    lines: list[str] = []
    family = DrafterFamily(dep.drafter_family)
    if family is not DrafterFamily.EAGLE3:
        lines.append(f"family   {family.label}, served as {dep.speculative_algorithm or '?'}")
    if dep.block_size is not None and family is DrafterFamily.DSPARK:
        lines.append(f"block    {dep.block_size} tokens drafted per block (gamma; the engine verifies gamma + 1)")
    elif dep.block_size is not None:
        lines.append(f"block    {dep.block_size} tokens per draft block (the engine's speculative draft tokens)")
    for name, sw in sorted(dep.aux_env.items()):
        where = "read by this target's aux capture" if sw.get("applies") else "not read by this target"
        lines.append(f"env      {name}={sw.get('value')} (default {sw.get('default')}; {where}): {sw.get('effect')} "
                     f"({sw.get('cite')})")
    return lines


def family_data(dep: ResolvedDeployment) -> dict[str, Any]:
    return {"drafter_family": dep.drafter_family, "speculative_algorithm": dep.speculative_algorithm or None,
            "block_size": dep.block_size, "aux_env": dict(dep.aux_env)}
