"""What an engine really does with a deployment, run with the engine's own code in a child process.

The gate, explain and the plugin reach an engine only through :mod:`specparity.serving.engine`
(``get_engine("sglang" | "vllm")``); each engine's room (``serving/sglang/``, ``serving/vllm/``) implements that
interface side by side. This package face holds only the engine-neutral records every engine returns
(:mod:`specparity.serving.results`), in canonical source names; it knows nothing of contracts, comparison or pytest.
"""

from specparity.serving.results import (
    FAILURE_KINDS,
    CaptureResult,
    DrafterReplay,
    FcCapture,
    LayerAtlas,
    LoopAcceptance,
    OutcomeRequest,
    ResolvedDeployment,
    ServingFailure,
    SpecSettings,
)

__all__ = [
    "FAILURE_KINDS",
    "CaptureResult",
    "DrafterReplay",
    "FcCapture",
    "LayerAtlas",
    "LoopAcceptance",
    "OutcomeRequest",
    "ResolvedDeployment",
    "ServingFailure",
    "SpecSettings",
]
