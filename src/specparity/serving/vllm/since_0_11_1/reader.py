"""What vLLM 0.11.1-0.33 capture: the V1 model runner's own reader, ``GPUModelRunner._get_eagle3_aux_layers_from_config``
(0.32 ``v1/worker/gpu_model_runner.py:5251``; the CPU runner inherits it), which each release defines with its own
keys (idrules/vllm_releases.py READERS), and else the target's default (``interfaces.py``
``get_eagle3_default_aux_hidden_state_layers`` from 0.18, ``llama.py`` ``get_eagle3_aux_hidden_state_layers`` before)."""

from __future__ import annotations

from typing import Any

READER = "v1/worker/gpu_model_runner.py GPUModelRunner._get_eagle3_aux_layers_from_config"


def vllm_reading(speculative_config: Any) -> tuple[int, ...] | None:
    """vLLM's own reading of the draft config (None: it found no ids and serves the target's default)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    class _Runner:  # the one attribute the reader looks at (0.32 gpu_model_runner.py:5263-5266)
        speculative_config: Any = None

    runner = _Runner()
    runner.speculative_config = speculative_config
    read = GPUModelRunner._get_eagle3_aux_layers_from_config(runner)
    return tuple(read) if read else None
