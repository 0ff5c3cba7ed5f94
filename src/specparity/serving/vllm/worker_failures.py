"""What a vLLM worker child makes of vLLM raising: the exception named with its innermost vLLM frame (or as ours,
``internal_error``, when it was raised in specparity's own code), and the refusals that are this machine's limit, not
a verdict on the deployment: a quantized or CPU-refused capture, DSpark without vLLM's V2 runner. Split from :mod:`specparity.serving.vllm.worker`, which calls them."""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specparity.serving.child.worker_common import WorkerRequest


def innermost_vllm_frame(exc: BaseException) -> str:
    """`` at vllm/FILE.py:LINE`` for the innermost frame of ``exc`` inside vLLM, or ``""``."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        fname = frame.filename.replace("\\", "/")
        if "/vllm/" in fname and "/specparity/" not in fname:  # never specparity's own serving/vllm/ folder
            return f" at {fname[fname.rindex('/vllm/') + 1 :]}:{frame.lineno}"
    return ""


def raised_in_specparity(exc: BaseException) -> str | None:
    """``specparity/FILE.py:LINE`` where ``exc`` was raised when that innermost frame of vLLM's or specparity's code
    is specparity's own (a bug of ours, never the engine's), else None."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        fname = frame.filename.replace("\\", "/")
        if "/specparity/" in fname:
            return f"{fname[fname.rindex('/specparity/') + 1 :]}:{frame.lineno}"
        if "/vllm/" in fname:
            return None
    return None


def exception_failure(exc: BaseException, *, prefix: str = "") -> Any:
    """``vllm_exception`` quoting type, message and the innermost vllm ``file:line``; ``internal_error`` naming
    specparity's own ``file:line`` when specparity's code raised it (exit 3, never attributed to vLLM)."""
    from specparity.serving.child.exception_text import exception_text
    from specparity.serving.results import INTERNAL_ERROR, VLLM_EXCEPTION, ServingFailure

    ours = raised_in_specparity(exc)
    if ours is not None:
        return ServingFailure(INTERNAL_ERROR, f"{prefix}specparity's own code raised {exception_text(exc)} at {ours} "
                              "(a bug in specparity, not in vLLM or the deployment: please report it with this "
                              "message)")
    return ServingFailure(VLLM_EXCEPTION, f"{prefix}{exception_text(exc)}{innermost_vllm_frame(exc)}")


def target_quantization(target: str) -> str | None:
    """The target checkpoint's ``quant_method`` (fp8, mxfp4, compressed-tensors, ...), top level or text config."""
    try:
        cfg = json.loads((Path(target) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for where in (cfg, cfg.get("text_config") if isinstance(cfg, dict) else None):
        q = where.get("quantization_config") if isinstance(where, dict) else None
        if isinstance(q, dict):
            return str(q.get("quant_method") or "unnamed")
    return None


def cpu_capture_refusal(request: WorkerRequest, exc: BaseException) -> Any:
    """A quantized target's capture vLLM's CPU platform could not run: the machine's limit (exit 3), named."""
    from specparity.serving.child.exception_text import exception_text
    from specparity.serving.results import NEEDS_HARDWARE, ServingFailure

    quant = target_quantization(request.target)
    if request.op == "resolve" or request.device != "cpu" or quant is None:
        return None
    return ServingFailure(NEEDS_HARDWARE, f"vLLM's CPU platform cannot run this {quant}-quantized target for the "
                          f"capture ({exception_text(exc)}{innermost_vllm_frame(exc)}); the static level resolves "
                          "it here as deployed, the capture needs the deployment's GPU")


def v2_runner_refusal(request: WorkerRequest, exc: BaseException) -> Any:
    """A DSpark deployment this machine's vLLM resolves without its V2 model runner: vLLM implements DSpark only there
    (0.32 ``config/vllm.py:2976-2979``, refused on V1 at ``:3198-3203``) and falls back to V1 where Triton is missing
    (``config/vllm.py:724-728``), as on this CPU build. The machine's limit (exit 3), named; None otherwise."""
    from vllm.triton_utils import HAS_TRITON

    from specparity.drafters import DrafterFamily
    from specparity.serving.results import NEEDS_HARDWARE, ServingFailure
    from specparity.serving.vllm.drafter_static import draft_family

    if (HAS_TRITON or "Model Runner V1 does not support" not in str(exc)
            or draft_family(request.draft) is not DrafterFamily.DSPARK):
        return None
    import vllm

    return ServingFailure(NEEDS_HARDWARE, f"vllm {vllm.__version__} serves DSpark only on its V2 model runner "
                          "(config/vllm.py:2976-2979: 'DSpark is implemented only by the V2 GPU model runner'), which "
                          "needs Triton; this machine's vLLM has none, so it takes the V1 runner (config/vllm.py:"
                          "724-728) and refuses the deployment (:3198-3203). The static level needs a machine whose "
                          "vLLM has Triton (the deployment's GPU)")
