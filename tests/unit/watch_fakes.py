"""Servers for the watch tests: Prometheus text as vLLM and SGLang write it, served over real HTTP on loopback.

The text is written with ``prometheus_client`` (the library both engines export with, 0.26 in both envs) under each
engine's own metric names, types and label sets: vLLM 0.32 ``v1/spec_decode/metrics.py:229-263`` (labels
``model_name``, ``engine``; ``position`` on the per-position counter) and SGLang 0.5.23
``observability/metrics_collector.py:512-545,1860-1870,2092-2112`` (labels ``model_name``, ``engine_type``,
``tp_rank``, ``pp_rank``, ``moe_ep_rank``; ``is_streaming`` on the token counters). test_watch.py pins those names
against the installed releases' own source files.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

VLLM_LABELS = {"model_name": "smol", "engine": "0"}
SGLANG_LABELS = {"model_name": "smol", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}


@dataclass
class Counts:
    """Cumulative spec-decode counts of one server."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_pos: tuple[float, ...] = (0.0, 0.0, 0.0)
    generation_tokens: float = 0.0
    verify_calls: float = 0.0

    def step(self, drafts: float, per_pos: Sequence[float], k: int = 3) -> None:
        """``drafts`` more verify steps, of which ``per_pos[j]`` accepted through position j."""
        self.drafts += drafts
        self.draft_tokens += drafts * k
        self.accepted += sum(per_pos)
        self.per_pos = tuple(a + b for a, b in zip(self.per_pos, per_pos, strict=True))
        self.generation_tokens += drafts + sum(per_pos)
        self.verify_calls += drafts


def vllm_text(c: Counts, *, spec: bool = True, filler: int = 0) -> str:
    r = CollectorRegistry()
    Counter("vllm:generation_tokens", "Number of generation tokens processed.", list(VLLM_LABELS),
            registry=r).labels(**VLLM_LABELS).inc(c.generation_tokens)
    if spec:
        for name, value in (("vllm:spec_decode_num_drafts", c.drafts), ("vllm:spec_decode_num_draft_tokens",
                            c.draft_tokens), ("vllm:spec_decode_num_accepted_tokens", c.accepted)):
            Counter(name, "d", list(VLLM_LABELS), registry=r).labels(**VLLM_LABELS).inc(value)
        pp = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                     [*VLLM_LABELS, "position"], registry=r)
        for j, v in enumerate(c.per_pos):
            pp.labels(**VLLM_LABELS, position=str(j)).inc(v)
    for i in range(filler):  # the rest of a vLLM /metrics: latency histograms the watcher must skip
        Histogram(f"vllm:filler_{i}_seconds", "f", list(VLLM_LABELS), registry=r).labels(**VLLM_LABELS).observe(0.1)
    return generate_latest(r).decode()


def sglang_text(c: Counts | None, *, gauge_length: float | None = None, gauge_rate: float | None = None,
                num_steps: int | None = 3, counters: bool = True) -> str:
    """SGLang's /metrics: nothing of a labelled family until a value is written (its exporter, like
    prometheus_client's, shows a label set only once set)."""
    r = CollectorRegistry()
    stream = {**SGLANG_LABELS, "is_streaming": "false"}
    gen = Counter("sglang:generation_tokens", "Number of generation tokens processed.", list(stream), registry=r)
    verify = Counter("sglang:spec_verify_calls", "Number of speculative decoding verification calls.",
                     list(SGLANG_LABELS), registry=r) if counters else None  # 0.5.14+
    length = Gauge("sglang:spec_accept_length", "Mean acceptance length", list(SGLANG_LABELS), registry=r)
    rate = Gauge("sglang:spec_accept_rate", "Speculative acceptance rate", list(SGLANG_LABELS), registry=r)
    steps = Gauge("sglang:spec_num_steps", "Currently active speculative_num_steps.", list(SGLANG_LABELS), registry=r)
    if c is not None and c.generation_tokens:
        gen.labels(**stream).inc(c.generation_tokens)
        if verify is not None and c.verify_calls:
            verify.labels(**SGLANG_LABELS).inc(c.verify_calls)
    if gauge_length is not None:
        length.labels(**SGLANG_LABELS).set(gauge_length)
        if gauge_rate is not None:
            rate.labels(**SGLANG_LABELS).set(gauge_rate)
        if num_steps is not None:
            steps.labels(**SGLANG_LABELS).set(num_steps)
    return generate_latest(r).decode()


class FakeSource:
    """A metrics source the watcher reads in-process: each read returns the next text."""

    def __init__(self, texts: Sequence[str] | Callable[[], str], url: str = "http://fake:8000") -> None:
        self.url = url
        self._texts = texts
        self.i = 0

    def text(self, path: str, *, timeout_s: float | None = None) -> str:
        if callable(self._texts):
            return self._texts()
        t = self._texts[min(self.i, len(self._texts) - 1)]
        self.i += 1
        return t


class MetricsServer:
    """A loopback HTTP server: ``/metrics`` from ``metrics()`` (called per read), ``/v1/models``, and
    ``/v1/chat/completions`` answered through ``chat(body)``."""

    def __init__(self, metrics: Callable[[], str], *, chat: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                 metrics_status: int = 200) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/metrics":
                    self._send(outer.metrics_status, outer.metrics().encode(), "text/plain; version=0.0.4")
                elif self.path == "/v1/models":
                    self._send(200, json.dumps({"data": [{"id": "smol", "owned_by": "vllm"}]}).encode(),
                               "application/json")
                else:
                    self._send(404, b"not found", "text/plain")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                outer.requests.append(body)
                if self.path == "/v1/chat/completions" and outer.chat is not None:
                    self._send(200, json.dumps(outer.chat(body)).encode(), "application/json")
                else:
                    self._send(404, b"not found", "text/plain")

        self.metrics, self.chat, self.metrics_status = metrics, chat, metrics_status
        self.requests: list[dict[str, Any]] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> MetricsServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
