"""The canonical vocabulary for hidden-state sources (domain.md §2).

- ``embedding``: output of the token embedding, the input of decoder layer 0 (boundary 0).
- ``layer:<i>``: residual stream after decoder layer ``i`` (0-based), before the final norm
  (boundary ``i + 1``).
- ``final_norm``: output of the final norm, what ``lm_head`` consumes.

Engines store capture positions as boundary indices ``b`` (the state entering layer ``b``):
``b = 0`` is ``embedding`` and ``1 <= b <= L`` is ``layer:b-1``. ``final_norm`` has no boundary.
"""

from __future__ import annotations

import re

EMBEDDING = "embedding"
FINAL_NORM = "final_norm"
_LAYER_RE = re.compile(r"^layer:(0|[1-9][0-9]*)$")


def layer(i: int) -> str:
    """The canonical name of the output of decoder layer ``i``."""
    if i < 0:
        raise ValueError(f"layer index must be >= 0, got {i}")
    return f"layer:{i}"


def is_source(name: str) -> bool:
    return name in (EMBEDDING, FINAL_NORM) or _LAYER_RE.match(name) is not None


def layer_index(name: str) -> int | None:
    """``i`` for ``layer:i``; None for ``embedding`` and ``final_norm``. Raises on anything else."""
    if name in (EMBEDDING, FINAL_NORM):
        return None
    m = _LAYER_RE.match(name)
    if m is None:
        raise ValueError(f"{name!r} is not a canonical source (embedding, layer:<i>, final_norm)")
    return int(m.group(1))


def check_in_range(name: str, num_layers: int) -> None:
    """Raise ValueError when ``name`` is malformed or names a layer the target does not have."""
    i = layer_index(name)
    if i is not None and i >= num_layers:
        raise ValueError(f"{name} does not exist in a target with {num_layers} layers (last is layer:{num_layers - 1})")


def boundary_to_source(b: int, num_layers: int) -> str:
    """Boundary index (state entering layer ``b``) to canonical name."""
    if b < 0 or b > num_layers:
        raise ValueError(f"boundary {b} outside 0..{num_layers}")
    return EMBEDDING if b == 0 else layer(b - 1)


def source_to_boundary(name: str, num_layers: int) -> int:
    """Canonical name to boundary index. ``final_norm`` has none (ValueError)."""
    if name == FINAL_NORM:
        raise ValueError("final_norm is not a boundary of the residual stream")
    check_in_range(name, num_layers)
    i = layer_index(name)
    return 0 if i is None else i + 1


def order_key(name: str) -> int:
    """Position in the residual stream: embedding < layer:0 < ... < final_norm."""
    if name == EMBEDDING:
        return -1
    if name == FINAL_NORM:
        return 1 << 30
    i = layer_index(name)
    assert i is not None
    return i


def all_sources(num_layers: int) -> list[str]:
    """Every canonical source of an L-layer target, in residual-stream order."""
    return [EMBEDDING, *(layer(i) for i in range(num_layers)), FINAL_NORM]
