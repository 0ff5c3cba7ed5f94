"""SGLang's own acceptance on a live server: each probe request's ``meta_info`` histogram, and the radix-cache flush
before each probe. Part of the live check (``serving/sglang/live.py``)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass


def flush_cache(client: Any, *, wait_s: float = 10.0) -> str | None:
    """Empty the radix cache before a probe, so its prefill holds every token: ``POST /flush_cache?timeout=S``, which
    SGLang defers until the scheduler is idle (0.5.23 ``managers/scheduler_components/flush_wrapper.py:21-37``); a
    release that flushes only when idle right now is asked again until ``wait_s`` passes. None when flushed, else
    SGLang's answer."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            client.post("/flush_cache", params={"timeout": f"{wait_s:g}"})
            return None
        except Exception as e:  # SGLang answers 400 while requests are in flight
            if time.monotonic() >= deadline:
                return str(e)
            time.sleep(0.2)



# ---------------------------------------------------------------------------------------------- the server's acceptance
# SGLang returns each request's own acceptance histogram in /generate's meta_info at finish: entry j counts the verify
# steps that accepted exactly j draft tokens (0.5.23 managers/schedule_batch.py:1566-1572
# update_spec_correct_drafts_histogram, from scheduler_components/batch_result_processor.py:834-836; returned by
# managers/tokenizer_manager.py:3193-3201). Older releases return only pooled figures (spec_accept_length).
HISTOGRAM = "spec_correct_drafts_histogram"
GENERATE_TOKENS = 16  # greedy tokens per probe prompt (as vLLM's live outcome, serving/vllm/worker.py)


def acceptance_from_meta(metas: Sequence[Mapping[str, Any]]) -> tuple[Any, str | None]:
    """The server's own per-position acceptance over the probes' requests, from each answer's meta_info histogram
    (position ``k`` is accepted in the verify steps that accepted more than ``k`` drafts, as vLLM's per-position
    counter counts it): a :class:`~specparity.serving.results.LoopAcceptance`, or None and why not."""
    from specparity.serving.results import LoopAcceptance

    total: list[int] = []
    for i, meta in enumerate(metas):
        hist = meta.get(HISTOGRAM)
        if hist is None:
            if int(meta.get("spec_verify_ct") or 0) > 0 or "spec_accept_length" in meta:
                return None, (f"the server's answer to probe {i} has spec_accept_length but no {HISTOGRAM}: this "
                              "release counts acceptance pooled per request, not per draft position")
            continue  # no verify step in this request (it ended at its prefill)
        if not isinstance(hist, list) or not all(isinstance(x, int) and x >= 0 for x in hist):
            return None, f"the server's {HISTOGRAM} for probe {i} is not a list of counts: {hist!r}"
        total += [0] * (len(hist) - len(total))
        for j, n in enumerate(hist):
            total[j] += n
    drafts = sum(total)
    if drafts <= 0:
        return None, "the server verified no draft while it served the probes' prompts"
    per_pos = tuple(sum(total[k + 1:]) for k in range(len(total) - 1))
    if not per_pos:
        per_pos = (0,)
    return LoopAcceptance(engine="sglang", drafts=drafts, accepted_per_position=per_pos, accepted=sum(per_pos),
                          prompts="assistant_start"), None


def served_acceptance(client: Any, probes: Sequence[Sequence[int]], prompt_lengths: Sequence[int | None], *,
                      generate_tokens: int = GENERATE_TOKENS) -> tuple[Any, dict[str, Any], str | None]:
    """The server's own loop on the probes' prompts (up to the assistant's first token, the text the drafter was
    trained on; the whole probe where the pack does not say), greedy, each request's own counts: (acceptance, the
    loop's facts, why not)."""
    metas = []
    t0 = time.perf_counter()
    for ids, n in zip(probes, prompt_lengths, strict=True):
        prompt = [int(t) for t in (ids[: max(1, int(n))] if n is not None else ids)]
        flush_cache(client)
        answer = client.post_json("/generate", {"input_ids": prompt, "sampling_params": {
            "max_new_tokens": generate_tokens, "temperature": 0, "ignore_eos": True}})
        metas.append(dict((answer or {}).get("meta_info") or {}) if isinstance(answer, dict) else {})
    acc, why = acceptance_from_meta(metas)
    loop = {"engine": "sglang", "source": "server_metrics", "acceptance_source": "per_request",
            "other_requests": None, "generate_tokens": generate_tokens, "generate_s": time.perf_counter() - t0,
            "loop_prompts": "assistant_start", "requests": len(metas)}
    return acc, loop, why
