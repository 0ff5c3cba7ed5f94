"""The canary's own bounded prompt load (``watch --load FILE``), and the per-request acceptance it reads back.

A staging or canary server often has no traffic of its own; ``--load`` sends a file of chat prompts to it, one request
at a time, for the watch's duration. Each answer carries that request's own acceptance where the engine gives it, which
is what the *mean of per-request means* needs (no engine's ``/metrics`` has it):

- vLLM: ``metrics.speculative_decoding.mean_acceptance_length`` in the response body, when the server runs with
  ``--per-request-spec-decode-metrics summary`` (vllm 0.32 ``config/observability.py:50``,
  ``entrypoints/generate/base/protocol.py:100-118``);
- SGLang: ``sglext.spec_tokens_details.spec_accept_length`` when the request asks ``return_spec_tokens_details``
  (0.5.23 ``entrypoints/openai/protocol.py:393,456-480``; completion_tokens / verify_ct,
  ``managers/tokenizer_manager.py:3167``). Not run here: SGLang's EAGLE decode has no CPU kernel (docs/live-sglang.md).

The file is JSON lines: ``{"messages": [...]}``, ``{"prompt": "..."}`` or ``{"question": "..."}`` (the form of
``fixtures/real/prompts.jsonl``).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specparity.errors import InputError
from specparity.serving.live.server import ServerClient, ServerError

MAX_REQUESTS_KEPT = 4096  # per-request figures kept for the sliding window (memory stays flat)


def read_prompts(path: Path) -> list[list[dict[str, str]]]:
    """Each line of ``path`` as chat messages; a bad line is bad input naming its number."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise InputError(f"cannot read the prompt file: {e}", path=path, field="--load") from None
    out: list[list[dict[str, str]]] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as e:
            raise InputError(f"line {i} is not JSON: {e}", path=path, field="--load") from None
        if isinstance(item, dict) and isinstance(item.get("messages"), list):
            out.append([{"role": str(m.get("role")), "content": str(m.get("content"))} for m in item["messages"]
                        if isinstance(m, dict)])
            continue
        text = item.get("prompt", item.get("question")) if isinstance(item, dict) else None
        if not isinstance(text, str):
            raise InputError(f"line {i} has none of messages, prompt, question", path=path, field="--load")
        out.append([{"role": "user", "content": text}])
    if not out:
        raise InputError("the prompt file holds no prompt", path=path, field="--load")
    return out


def request_acceptance(engine: str, answer: Any) -> float | None:
    """One answer's own acceptance length, where the engine put it (module docstring)."""
    if not isinstance(answer, dict):
        return None
    if engine == "vllm":
        spec = ((answer.get("metrics") or {}).get("speculative_decoding") or {})
        value = spec.get("mean_acceptance_length") if spec.get("num_spec_steps") else None
    else:
        ext = answer.get("sglext") or (answer.get("choices") or [{}])[0].get("sglext") or {}
        spec = ext.get("spec_tokens_details") or {}
        if isinstance(spec, list):
            spec = spec[0] if spec else {}
        value = spec.get("spec_accept_length") if spec.get("spec_verify_ct") else None
    return float(value) if isinstance(value, (int, float)) else None


class PromptLoad:
    """Sends the prompts, cycling, one at a time, until :meth:`stop`; records each answer's acceptance length.
    ``client`` is its own (not the watcher's): a request may take far longer than a read of ``/metrics``."""

    def __init__(self, client: ServerClient, prompts: list[list[dict[str, str]]], *, engine: str, model: str,
                 max_tokens: int = 64, clock: Callable[[], float] = time.monotonic) -> None:
        self.client, self.prompts, self.engine, self.model = client, prompts, engine, model
        self.max_tokens, self.clock = max_tokens, clock
        self.figures: deque[tuple[float, float]] = deque(maxlen=MAX_REQUESTS_KEPT)
        self.sent = 0
        self.errors = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specparity-watch-load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """No new request; one in flight is left to the server (the thread is a daemon), its connection closed."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        if not self._thread.is_alive():
            self.client.close()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            body: dict[str, Any] = {"model": self.model, "messages": self.prompts[i % len(self.prompts)],
                                    "max_tokens": self.max_tokens, "temperature": 0.0}
            if self.engine == "sglang":
                body["return_spec_tokens_details"] = True
            i += 1
            try:
                answer = self.client.post_json("/v1/chat/completions", body)
            except ServerError as e:
                self.errors += 1
                self.last_error = str(e)
                self._stop.wait(1.0)
                continue
            self.sent += 1
            value = request_acceptance(self.engine, answer)
            if value is not None:
                self.figures.append((self.clock(), value))

    def between(self, start: float, end: float) -> list[float]:
        """Acceptance lengths of the requests that finished in ``(start, end]``."""
        return [v for t, v in list(self.figures) if start < t <= end]
