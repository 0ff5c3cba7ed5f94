"""What an SGLang child hands back, shaped: the fc capture judged against what the probes imply, a batch's rows
split per probe, and resolved server arguments as JSON values. No sglang import here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specparity.serving.results import (
    CAPTURE_COUNT_SHORT,
    CAPTURE_SHAPE,
    FC_NOT_CALLED,
    ServingFailure,
)


def judge_fc_capture(
    *,
    hook_calls: int,
    rows: int | None,
    width: int | None,
    expected_rows: int,
    expected_width: int,
    aux_captured: int,
    aux_expected: int,
    fc_applied: bool,
    target_ran: bool = True,
) -> list[ServingFailure]:
    """Failures implied by what the fc pre-hook and the target aux hook saw. Pure; used by all adapters.

    Never a pass when the hook did not fire or saw fewer rows/chunks than the probes imply.
    ``target_ran`` is False when no target forward happened (then there is no aux count to judge).
    """
    failures: list[ServingFailure] = []
    if target_ran and aux_captured < aux_expected:
        failures.append(
            ServingFailure(
                CAPTURE_COUNT_SHORT,
                f"the target captured {aux_captured} aux hidden state(s) but the drafter's fc expects "
                f"{aux_expected}; a configured layer is unreachable or duplicated",
            )
        )
    if hook_calls == 0 or rows is None:
        why = (
            "SGLang skips fc when k*H_t == H_d (sglang 0.5.23 models/llama_eagle3.py:238)"
            if not fc_applied
            else "no forward reached the drafter"
            if expected_rows == 0
            else "the draft-extend forward never called fc"
        )
        failures.append(ServingFailure(FC_NOT_CALLED, f"the drafter's fc was never called: {why}"))
        return failures
    if rows != expected_rows or width != expected_width:
        failures.append(
            ServingFailure(
                CAPTURE_SHAPE,
                f"fc input was [{rows}, {width}], expected [{expected_rows}, {expected_width}] "
                "(sum of probe lengths, k*H_t)",
            )
        )
    return failures


def split_rows(tensor: Any, lengths: Sequence[int]) -> list[Any]:
    """Split a ``[sum T_i, ...]`` batch tensor back into per-sample ``[T_i, ...]`` tensors (clones)."""
    return [t.clone() for t in tensor.split(list(lengths), dim=0)]


def json_safe(v: Any) -> object:
    """A resolved server argument as JSON: scalars and lists as they are, anything else as its str."""
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, list | tuple):
        return [json_safe(x) for x in v]
    return str(v)
