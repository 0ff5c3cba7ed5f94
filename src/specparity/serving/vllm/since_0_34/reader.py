"""What vLLM 0.34- capture: the V2 model runner's reader, ``get_eagle3_aux_layers_from_config(spec_config)``
(0.34 ``v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:103-150``), else the target's
``get_eagle3_default_aux_hidden_state_layers`` (``eagle3_utils.py:24-28``). 0.34 removed the V1 runner
(``v1/worker/gpu_model_runner.py``) and with it the read of ``eagle_config.eagle_aux_hidden_state_layer_ids``."""

from __future__ import annotations

from typing import Any

READER = "v1/worker/gpu/spec_decode/eagle/eagle3_utils.py get_eagle3_aux_layers_from_config"


def vllm_reading(speculative_config: Any) -> tuple[int, ...] | None:
    """vLLM's own reading of the draft config (None: it found no ids and serves the target's default)."""
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config

    read = get_eagle3_aux_layers_from_config(speculative_config)
    return tuple(read) if read else None
