"""Any attribute is a callable that records its name in :data:`CALLED` and raises (see ``vllm/__init__``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

CALLED: list[str] = []


def __getattr__(name: str) -> Callable[..., Any]:
    if name.startswith("__"):
        raise AttributeError(name)

    def _unavailable(*args: Any, **kwargs: Any) -> Any:
        CALLED.append(name)
        raise NotImplementedError(
            f"vllm._custom_ops.{name} was called, but only specparity's identity vllm shim is installed; "
            "this op is on the traced path and cannot be faked")

    return _unavailable
