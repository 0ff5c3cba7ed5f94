"""Identity ``vllm`` shim for old SGLang (0.4.10.post2, 0.5.3) on CPUs without AMX; test-only glue.

Why it exists: on a CPU without AMX these versions fall back to vllm's layer classes and rebind their
own names to them (sglang 0.5.3 ``layers/activation.py:383`` / 0.4.10.post2 ``:237`` for
``SiluAndMul``/``GeluAndMul``; 0.5.3 ``layers/layernorm.py:338`` / 0.4.10.post2 ``:287`` for
``RMSNorm``/``GemmaRMSNorm``). vllm is not installed (and must not be: it pins its own torch).

Rules:
- specparity puts the directory above this package on ``sys.path`` ONLY inside the SGLang child process,
  ONLY for the 0.4.10 and 0.5.3 adapters, ONLY when ``device == "cpu"`` and no real ``vllm`` imports.
- ``vllm.model_executor.layers.{activation,layernorm}`` re-export SGLang's OWN classes, so the rebinding
  is a no-op and SGLang's code runs unchanged.
- ``vllm._custom_ops`` hands out callables that record their name and raise: ``RotaryEmbedding.__init__``
  fetches ``rotary_embedding`` (0.5.3 ``layers/rotary_embedding.py:114``) but the CPU path uses
  ``forward_native``; any call would raise, so a test notices.
"""

SPECPARITY_SHIM = True
