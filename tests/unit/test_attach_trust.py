"""Attaching to a server that is not on loopback: where its vLLM runs with dev mode on, the gate
refuses to drive those endpoints without ``--allow-dev-endpoints`` (exit 2, naming the flag), as launching already
does, and touches nothing on the server first.

The server is a stand-in on this host's own non-loopback address that answers as vLLM 0.32 answered with
``VLLM_SERVER_DEV_MODE=1`` (``/health``, ``/v1/models``, ``/server_info``: the routes the gate reads before it would
arm anything; measured on the real server, docs/live-server.md "Security"); every request it gets is logged.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from specparity.cli import main

BUNDLE = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
CONTRACT = BUNDLE / "contract" / "tiny-llama-eagle3-hd32.json"
# vLLM 0.32's own answers (a server of the bundled models with dev mode on), shortened
MODELS = {"object": "list", "data": [{"id": "/models/target", "object": "model", "created": 1765083000,
                                      "owned_by": "vllm", "root": "/models/target", "parent": None,
                                      "max_model_len": 512, "permission": []}]}
SERVER_INFO = {"vllm_config": "model='/models/target', speculative_config=SpeculativeConfig(method='eagle3', "
                              "model='/models/draft', num_spec_tokens=3), tokenizer='/models/target'"}


def _own_address() -> str | None:
    """This host's address on its default route (a UDP connect sends nothing), if it has one besides loopback."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))
            addr = str(s.getsockname()[0])
    except OSError:
        return None
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


@pytest.fixture
def dev_server() -> Iterator[tuple[str, list[str]]]:
    host = _own_address()
    if host is None:
        pytest.skip("this host has no address besides loopback")
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append(f"{self.command} {self.path}")
            body = {"/health": b"", "/v1/models": json.dumps(MODELS).encode(),
                    "/server_info": json.dumps(SERVER_INFO).encode()}.get(self.path.split("?")[0])
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body if body is not None else b'{"detail":"Not Found"}')

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_a_non_loopback_server_with_dev_mode_needs_allow_dev_endpoints(dev_server: tuple[str, list[str]]) -> None:
    url, seen = dev_server
    result = CliRunner().invoke(main, ["gate", "--contract", str(CONTRACT), "--server", url, "--engine", "vllm",
                                       "--level", "capture"])
    assert result.exit_code == 2, result.output
    assert "--allow-dev-endpoints" in result.output and "not loopback" in result.output
    assert "Traceback" not in result.output
    # read only: nothing armed, reset or called on the server's workers
    assert all(r.startswith("GET ") for r in seen) and not any("collective_rpc" in r for r in seen), seen
