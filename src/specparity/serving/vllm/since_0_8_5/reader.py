"""What vLLM 0.8.5-0.11.0 capture: no reader of the draft config exists. ``GPUModelRunner.load_model`` always sets the
target's ``get_eagle3_aux_hidden_state_layers()`` (llama: ``(2, L//2, L-3)``; 0.8.5 ``v1/worker/gpu_model_runner.py:1343``,
``model_executor/models/llama.py:534``): the draft's ids are ignored."""

from __future__ import annotations

from typing import Any

READER = None  # no reader in these releases
DEFAULT = "model_executor/models/llama.py get_eagle3_aux_hidden_state_layers (2, L//2, L-3), always"


def vllm_reading(speculative_config: Any) -> tuple[int, ...] | None:
    """The ids the release reads from the draft config: none, ever."""
    return None
