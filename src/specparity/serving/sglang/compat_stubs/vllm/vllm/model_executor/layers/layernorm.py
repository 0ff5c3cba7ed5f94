"""SGLang's own norm classes under vllm's name (identity shim, see ``vllm/__init__``)."""

from sglang.srt.layers.layernorm import GemmaRMSNorm, RMSNorm

__all__ = ["GemmaRMSNorm", "RMSNorm"]
