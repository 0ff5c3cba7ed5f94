"""What SGLang refuses on this CPU, named by call and release, and a failed server told from its own log. Part of
the live check (``serving/sglang/live.py``)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specparity.serving.results import (
    SGLANG_EXCEPTION,
    ServingFailure,
)

if TYPE_CHECKING:
    pass



# ---------------------------------------------------------------------------------------------- refusals
@dataclass(frozen=True)
class Refusal:
    """Where SGLang refuses on this machine, by call and release: the gate's exit 3 names it."""

    needle: str
    call: str
    release: str
    why: str


# Measured on a 2-core x86-64 CPU without AVX-512/AMX (docs/live-sglang.md); ``call`` is where the release named
# refuses, and :func:`server_failure` adds the innermost sglang frames of the log's own traceback
CPU_REFUSALS: tuple[Refusal, ...] = (
    Refusal("sgl_kernel.assign_req_to_token_pool_cpu", "mem_cache/allocation.py:746 assign_req_to_token_pool_func "
            "-> sgl_kernel.assign_req_to_token_pool_cpu (from speculative/eagle_utils.py:910 "
            "eagle_prepare_for_decode)", "0.5.23",
            "the EAGLE decode step needs a CPU sgl_kernel op that no installable package provides; the server's "
            "own warm-up request decodes 8 tokens (entrypoints/http_server.py:2407), so on CPU the command needs "
            "--skip-server-warmup and the probes run with max_new_tokens 1"),
    Refusal("triton_ops/cache_locs.py", "speculative/triton_ops/cache_locs.py:58 assign_req_to_token_pool_func "
            "(a Triton kernel; Triton has no CPU driver) from speculative/eagle_info_v2.py:104 prepare_for_decode",
            "0.5.14", "the EAGLE decode step; with the overlap scheduler it is prepared even for a request that "
            "ends after its prefill, so on CPU the command needs --disable-overlap-schedule (0.5.23 turns it off "
            "itself on CPU)"),
    Refusal("EAGLE is not supported in decode attention backend", "speculative/draft_utils.py (0.5.23 :64 from "
            "speculative/eagle_worker_v2.py:405; 0.5.10 :35 from speculative/eagle_worker.py:205 -> :224, in the "
            "worker's __init__)", "0.5.10, 0.5.23",
            "SGLang's EAGLE draft-decode backend map has no CPU entry (torch_native). From 0.5.11 the live "
            "stand-in falls back to the draft runner's own backend, as the in-process capture does; before, the "
            "worker builds the backend in its __init__ and no in-process stand-in covers it"),
    Refusal("No module named 'sgl_kernel'", "sglang/kernels/ops/kvcache/cache_move.py:10 import sgl_kernel",
            "0.5.23", "no CPU sgl_kernel build is installable; the live stand-ins were not active"),
    Refusal("must be between 1 and 65535", "server_args.py:2761-2769 (grpc_port = port + 10000)", "0.5.14",
            "the port is above 55535; 0.5.23 derives the gRPC port only when gRPC is on"),
    Refusal("from vllm._custom_ops import rotary_embedding", "layers/rotary_embedding/base.py:138", "0.5.23",
            "SGLang took its non-CPU path: SGLANG_USE_CPU_ENGINE=1 is not set (utils/common.py:221-224)"),
)


def cpu_refusals(log_text: str | Iterable[str]) -> list[Refusal]:
    """The known CPU refusals a server log shows, in :data:`CPU_REFUSALS` order."""
    text = log_text if isinstance(log_text, str) else "\n".join(log_text)
    return [r for r in CPU_REFUSALS if r.needle in text]


def server_failure(message: str, log_lines: Sequence[str]) -> ServingFailure:
    """Why a server failed, for the report: a known refusal by call and release (the gate's exit 3), else
    SGLang's own last exception line, with the log tail; a log with no exception at all (a server that never answered
    /health in time, or was killed from outside) is the machine's (``server_failed``, exit 3), as for vLLM."""
    from specparity.serving.results import NEEDS_HARDWARE

    found = cpu_refusals(log_lines)
    if found:
        r = found[0]
        frames = innermost_sglang_frames(log_lines)
        at = f" (this log: {' <- '.join(frames)})" if frames else ""
        return ServingFailure(NEEDS_HARDWARE, f"sglang {r.release} refuses on this CPU at {r.call}{at}: {r.why}. "
                                              f"{message}")
    last = next((ln for ln in reversed(log_lines) if "Error" in ln or "Exception" in ln), "")
    if not last:  # no exception of SGLang's in its log (a slow start, a server killed from outside): the machine's
        from specparity.serving.results import SERVER_FAILED

        return ServingFailure(SERVER_FAILED, f"{message} (no exception in the server's log)")
    return ServingFailure(SGLANG_EXCEPTION, f"{message} (last error: {last.strip()})")


_FRAME = re.compile(r'File "[^"]*/sglang/(srt/[^"]+|[^"]+)", line (\d+), in (\S+)')


def innermost_sglang_frames(log_lines: Iterable[str], count: int = 2) -> list[str]:
    """The innermost ``count`` sglang frames of the log's last traceback, innermost first (``srt/x.py:N fn``)."""
    lines = list(log_lines)
    start = max((i for i, ln in enumerate(lines) if "Traceback (most recent call last)" in ln), default=-1)
    frames = [f"{m.group(1).removeprefix('srt/')}:{m.group(2)} {m.group(3)}" for ln in lines[start + 1:]
              if (m := _FRAME.search(ln))]
    return frames[::-1][:count]
