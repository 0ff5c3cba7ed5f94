"""SGLang's own activation classes under vllm's name (identity shim, see ``vllm/__init__``)."""

from sglang.srt.layers.activation import GeluAndMul, SiluAndMul

__all__ = ["GeluAndMul", "SiluAndMul"]
