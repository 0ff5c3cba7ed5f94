"""Tokens per second in vLLM's real loop, with and without speculation: ``python -m specparity.realmodel.vllm_loop
REQUEST.json OUT.json`` in the vLLM venv.

The seed's symptom is a number: 54.8 tok/s with a miswired drafter against 88.8 with none. This child measures
the same figure on this machine for one deployment: ``vllm.LLM`` (scheduler, model runner, ``EagleProposer``
when a draft is given), greedy, one request at a time (``max_num_seqs=1``, the per-request decode speed a user
sees), prefix caching off. One warm-up request is generated first and not counted; then every prompt is
generated to ``max_tokens`` (``ignore_eos``), and the wall time of those ``generate`` calls is the figure. The
specparity tap is not installed here, so nothing but vLLM runs in the timed loop. With a draft, vLLM's own
counters (``vllm:spec_decode_num_accepted_tokens_per_pos``, ``..._num_drafts``) give acceptance per position.

REQUEST: ``{"target", "draft" (or null), "prompts": [[ids...], ...], "max_tokens", "num_speculative_tokens",
"dtype", "threads"}``. OUT: ``{"tokens", "seconds", "tok_per_s", "counters", "outputs", "error"}``; an engine
exception is written as ``error`` (type, first lines, innermost vllm file:line), never raised past the child.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _error(exc: BaseException) -> str:
    from specparity.serving.vllm.worker_failures import innermost_vllm_frame

    text = " ".join(str(exc).strip().splitlines()[:3])
    return f"{type(exc).__name__}: {text[:600]}{innermost_vllm_frame(exc)}"


def run(req: dict[str, Any]) -> dict[str, Any]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if req.get("threads"):
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-" + str(int(req["threads"]) - 1))
    from vllm import LLM, SamplingParams

    from specparity.serving.child.worker_common import WorkerRequest
    from specparity.serving.vllm.worker import llm_kwargs

    prompts = [list(map(int, p)) for p in req["prompts"]]
    max_tokens = int(req["max_tokens"])
    # the gate's own engine settings (serving/vllm/worker.py), with or without the drafter: the same typed job the
    # gate's child gets, so a field llm_kwargs reads is one this request has (a run, as a capture: float32 on CPU)
    request = WorkerRequest(op="capture", target=str(req["target"]), draft=str(req.get("draft") or req["target"]),
                            probes=tuple(tuple(p) for p in prompts), device="cpu",
                            server_args={"generate_tokens": max_tokens, "dtype": req.get("dtype", "float32"),
                                         "num_speculative_tokens": int(req.get("num_speculative_tokens", 3))})
    kw, _, _ = llm_kwargs(request)
    if not req.get("draft"):
        kw.pop("speculative_config")
    llm = LLM(**kw)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)  # warm-up, not counted

    from specparity.serving.vllm.worker import _metrics as counters

    before = counters(llm)
    outputs: list[list[int]] = []
    t0 = time.perf_counter()
    for p in prompts:
        out = llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)
        outputs.append([int(t) for t in out[0].outputs[0].token_ids])
    seconds = time.perf_counter() - t0
    after = counters(llm)
    delta = {k: ([a - b for a, b in zip(v, before.get(k) or [0] * len(v), strict=False)] if isinstance(v, list)
                 else (v or 0) - (before.get(k) or 0)) for k, v in after.items()}
    tokens = sum(len(o) for o in outputs)
    return {"tokens": tokens, "seconds": seconds, "tok_per_s": tokens / seconds if seconds > 0 else 0.0,
            "counters": delta, "outputs": outputs, "error": None}


def main(argv: list[str]) -> int:
    req = json.loads(Path(argv[0]).read_text())
    try:
        result = run(req)
    except BaseException as exc:  # an engine exception is the result, not a crash of the child
        result = {"error": _error(exc)}
    Path(argv[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip vLLM's slow interpreter teardown
