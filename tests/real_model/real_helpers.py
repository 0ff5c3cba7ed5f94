"""Which engine this env has (the tier runs in .venv for SGLang and in the vllm-0.32 env for vLLM)."""

from __future__ import annotations

import importlib.util


def _has(module: str) -> bool:
    # fixtures/vllm is a namespace package named vllm when it is on sys.path: the real one has an origin
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.origin is not None


HAS_SGLANG = _has("sglang")
HAS_VLLM = _has("vllm")
