"""An attached vLLM server is left as it was found, other clients' requests are never blamed on it, and what
``--api-key`` guards is measured. One real server for the module (vLLM 0.32, the bundled healthy pair,
``specparity launch-flags --engine vllm``'s switches, ``--api-key``), started by the test on loopback:

- ``--api-key`` guards ``/v1/...`` but not the dev routes the gate uses (docs/live-server.md "Security");
- a tap armed with a short lease and never drained (a gate killed with SIGKILL) disarms itself and holds nothing,
  with no traffic; a tap past its bound disarms itself and says so;
- the gate attached while three other clients stream completions passes on the healthy drafter, their rows told
  apart by token ids and counted (before: their rows were taken for the probe's, "recorded[0]: has 65 tokens, the
  served fc input has 36", exit 2). With the bundled draft's own ids ([1, 3, 5], one layer early on vLLM) the same
  run gives the launched server's off_by_one, as it should.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from vllm_helpers import BUNDLE, CONTRACT, REPO, copy_draft

from specparity.gate import run_gate
from specparity.serving.live.server import LaunchedServer, ServerClient, free_port
from specparity.serving.vllm import tap_wire
from specparity.serving.vllm.live import HttpRpc
from specparity.serving.vllm.ranks import RPC

pytestmark = pytest.mark.vllm
KEY = "trust-test-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("trust")
    # vLLM reads id k as boundary k: the contract's layer:1, 3, 5 are ids 2, 4, 6 there (as test_vllm_live_server.py)
    draft = copy_draft(tmp, "healthy")
    cfg = json.loads((draft / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 4, 6]
    (draft / "config.json").write_text(json.dumps(cfg))
    flags = json.loads(subprocess.run([sys.executable, "-m", "specparity.cli", "launch-flags", "--engine", "vllm",
                                       "--json"], capture_output=True, text=True, check=True).stdout)
    port = free_port()
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port),
            "--model", str(BUNDLE / "target"), "--seed", "42", "-tp", "1", "--dtype", "float32",
            "--max-model-len", "512", "--speculative_config",
            json.dumps({"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3}),
            *flags["flags"], "--per-request-spec-decode-metrics", "summary", "--api-key", KEY]
    with LaunchedServer(argv, {"VLLM_CPU_KVCACHE_SPACE": "1", **flags["env"]}, f"http://127.0.0.1:{port}",
                        cwd=str(REPO), log=tmp / "server.log") as live:
        live.wait_healthy(600)
        yield live.url


def _status(url: str, method: str, path: str, key: str | None, body: object = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.request(method, url + path, headers=headers, json=body, timeout=120, trust_env=False)
    return int(r.status_code)


def test_api_key_guards_v1_but_not_the_dev_routes(server: str) -> None:
    """The measurement docs/live-server.md's Security section states (vllm 0.32
    entrypoints/serve/middleware/authenticate.py:11 guards /v1, /v2, /inference and /cohere only)."""
    for key in (None, "wrong"):
        assert _status(server, "GET", "/v1/models", key) == 401
        assert _status(server, "GET", "/server_info", key) == 200
        assert _status(server, "POST", "/collective_rpc", key, {"method": tap_wire.DESCRIBE}) == 200
        assert _status(server, "POST", "/reset_prefix_cache", key) == 200
    assert _status(server, "GET", "/v1/models", KEY) == 200


def _complete(client: ServerClient, prompt: list[int], tokens: int = 16) -> None:
    model = client.get_json("/v1/models")["data"][0]["id"]
    client.post_json("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": tokens,
                                         "temperature": 0.0, "ignore_eos": True})


def test_an_undrained_tap_disarms_itself_within_its_lease_and_holds_nothing(server: str) -> None:
    """A gate that armed the tap and was killed: nobody drains; within the lease the worker is disarmed and has
    dropped what it recorded, with no request needed to notice."""
    with ServerClient(server, api_key=KEY, timeout_s=120) as client:
        rpc = HttpRpc(client)
        rpc.collective_rpc(tap_wire.ARM, {"atlas": "1", "lease_s": "2"})
        _complete(client, [5, 6, 7, 8, 9, 10])
        time.sleep(3.0)  # the lease runs out with the calls undrained, and no traffic after them
        reply = rpc.collective_rpc(RPC)[0]
        assert reply["disarmed"] == {"why": "lease", "lease_s": 2.0} and reply["calls"] == [], reply
        assert reply["armed"] is False
        _complete(client, [5, 6, 7, 8, 9, 10])
        assert rpc.collective_rpc(RPC)[0]["calls"] == []  # records nothing after


def test_a_tap_past_its_bound_disarms_itself_and_says_so(server: str) -> None:
    with ServerClient(server, api_key=KEY, timeout_s=120) as client:
        rpc = HttpRpc(client)
        rpc.collective_rpc(tap_wire.ARM, {"atlas": "1", "lease_s": "60", "max_calls": "2"})
        _complete(client, [11, 12, 13, 14])  # a prefill and verify steps: more than 2 fc calls
        reply = rpc.collective_rpc(RPC)[0]
        assert reply["disarmed"]["why"] == "overflow" and reply["disarmed"]["max_calls"] == 2, reply
        assert reply["calls"] == []
        rpc.collective_rpc(tap_wire.DISARM)


def test_other_clients_requests_are_told_apart_and_counted(server: str) -> None:
    stop = threading.Event()
    sent: list[int] = []

    def other(seed: int) -> None:
        with ServerClient(server, api_key=KEY, timeout_s=120) as c:
            while not stop.is_set():
                _complete(c, [(seed * 37 + j * 11) % 250 for j in range(20 + seed * 7)], tokens=24)
                sent.append(seed)

    threads = [threading.Thread(target=other, args=(s,), daemon=True) for s in (1, 2, 3)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        v = run_gate(CONTRACT, server=server, api_key=KEY, engine="vllm", python=sys.executable, level="capture",
                     timeout_s=600)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert sent, "the other clients sent nothing"
    assert v.exit_code == 0, [f"{f.kind.value}: {f.message}" for f in v.errors]
    assert v.live is not None and v.live["other_request_rows"] > 0, v.live
    assert any("told apart by token ids" in n for n in v.live["notes"])
