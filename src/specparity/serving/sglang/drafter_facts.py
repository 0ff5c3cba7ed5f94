"""What the drafter SGLang built really reads: the norms it applies, the sources of fc's chunks, its aux count.

Read from the built modules and SGLang's own capture set, never from the config alone. No sglang import here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specparity.serving.results import ResolvedDeployment
from specparity.sources import boundary_to_source

NORM_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")


def applied_norm_flags(drafter_inner: Any) -> dict[str, bool]:
    """The norms the drafter SGLang built really applies, read from its modules, not from the config.

    sglang 0.5.23 models/llama_eagle3.py:169-207 builds ``input_norm`` iff ``norm_before_fc``, ``fc_norm``
    (a ModuleList) iff ``fc_norm``/``use_aux_norm``, and keeps ``norm_output``; 0.5.3 and 0.4.10.post2
    (models/llama_eagle3.py:120-142) build only ``fc``, ``midlayer`` and ``norm``, so every flag reads False
    there whatever the config says (domain.md D5).
    """
    return {
        "norm_before_fc": getattr(drafter_inner, "input_norm", None) is not None,
        "fc_norm": getattr(drafter_inner, "fc_norm", None) is not None,
        "norm_output": bool(getattr(drafter_inner, "norm_output", False)),
    }


def with_applied_norms(dep: ResolvedDeployment, drafter_inner: Any, **changes: Any) -> ResolvedDeployment:
    """``dep`` with its norm flags read from the built drafter (:func:`applied_norm_flags`) and ``changes``."""
    import dataclasses

    f = applied_norm_flags(drafter_inner)
    return dataclasses.replace(dep, norm_before_fc=f["norm_before_fc"], fc_norm=f["fc_norm"],
                               norm_output=f["norm_output"], **changes)


def served_sources(
    layers_to_capture: Sequence[int], num_layers: int, *, max_reachable: int
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Boundary indices -> canonical sources in fc-chunk order, plus the unreachable boundaries.

    Every SGLang version tests ``i in layers_to_capture`` inside the layer loop (sglang 0.5.23
    models/llama.py:485-493), so chunks come out ascending and deduplicated; a boundary above
    ``max_reachable`` (``L-1`` for llama-style loops) is never captured (domain.md §3.1).
    """
    reachable = sorted({b for b in layers_to_capture if 0 <= b <= max_reachable})
    unreachable = tuple(sorted({b for b in layers_to_capture if not 0 <= b <= max_reachable}))
    return tuple(boundary_to_source(b, num_layers) for b in reachable), unreachable


def draft_k(draft_hf_config: Any) -> int:
    # sglang 0.5.23 models/llama_eagle3.py:155-160: num_aux_hidden_states > len(eagle ids) > 3.
    k = getattr(draft_hf_config, "num_aux_hidden_states", None)
    if k is None:
        ec = getattr(draft_hf_config, "eagle_config", None) or {}
        ids = ec.get("eagle_aux_hidden_state_layer_ids") if isinstance(ec, dict) else None
        k = len(ids) if ids else 3
    return int(k)
