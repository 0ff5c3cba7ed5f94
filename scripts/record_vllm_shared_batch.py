"""Record real fc-call blobs from a vLLM 0.32 server with the tap (this branch): a probe alone, the same probe while
three other clients stream completions (a shared batch); tests/unit/test_vllm_probe_rows.py reads them.

Run in the vLLM 0.32 env: .tox/vllm-0.32/bin/python scripts/record_vllm_shared_batch.py [OUT]"""
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from safetensors.torch import load, save_file

from specparity.contract import load_contract, read_contract_probes
from specparity.serving.live.server import LaunchedServer, ServerClient, free_port
from specparity.serving.vllm import tap
from specparity.serving.vllm.live import HttpRpc

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / "fixtures/vllm"
CONTRACT = BUNDLE / "contract/tiny-llama-eagle3-hd32.json"
OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "tests/unit/data/vllm_shared_batch"
OUT.mkdir(parents=True, exist_ok=True)
pack = read_contract_probes(load_contract(CONTRACT), CONTRACT)
probe = [int(t) for t in pack.samples[0].input_ids.tolist()]
print("probe tokens", len(probe), flush=True)
port = free_port()
url = f"http://127.0.0.1:{port}"
argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port),
        "--model", str(BUNDLE / "target"), "--seed", "42", "-tp", "1", "--dtype", "float32", "--enforce-eager",
        "--max-model-len", "512",
        "--speculative_config", json.dumps({"method": "eagle3", "model": str(BUNDLE / "draft"), "num_speculative_tokens": 3}),
        "--worker-extension-cls", tap.EXTENSION]
env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": str(REPO / "src")}

def keep(name, calls, extra):
    tensors = {}
    for k, blob in enumerate(calls):
        for key, v in load(blob).items():
            if key.startswith("atlas/"):
                continue
            tensors[f"call{k}/{key}"] = v.contiguous()
    save_file(tensors, str(OUT / f"{name}.safetensors"), metadata={"calls": str(len(calls)), **extra})
    print(name, len(calls), [tuple(load(b)["fc"].shape) for b in calls][:8], flush=True)

t0 = time.time()
with LaunchedServer(argv, env, url, cwd="/tmp", log=OUT / "server.log") as server:
    server.wait_healthy(600)
    print(f"healthy after {time.time()-t0:.1f}s", flush=True)
    with ServerClient(url, timeout_s=120) as client:
        rpc = HttpRpc(client)
        model = client.get_json("/v1/models")["data"][0]["id"]
        body = {"model": model, "max_tokens": 16, "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}
        rpc.collective_rpc(tap.ARM, {"atlas": "1", "lease_s": "600"})
        def probe_run():
            client.post("/reset_prefix_cache")
            rpc.collective_rpc("specparity_tap_drain")
            out = client.post_json("/v1/completions", {**body, "prompt": probe})
            calls = rpc.collective_rpc("specparity_tap_drain")[0]["calls"]
            return calls, [int(t) for t in out["choices"][0]["token_ids"]]
        calls, output = probe_run()
        keep("alone", calls, {"output": json.dumps(output), "probe": json.dumps(probe)})
        # three other clients streaming completions on other prompts while the probe runs
        stop = threading.Event()
        def other(seed):
            with ServerClient(url, timeout_s=120) as c:
                while not stop.is_set():
                    c.post_json("/v1/completions", {"model": model, "max_tokens": 24, "temperature": 0.0,
                                                     "ignore_eos": True, "prompt": [(seed * 37 + j * 11) % 250 for j in range(20 + seed * 7)]})
        threads = [threading.Thread(target=other, args=(s,), daemon=True) for s in range(1, 4)]
        for t in threads:
            t.start()
        time.sleep(2.0)
        calls, output2 = probe_run()
        stop.set()
        for t in threads:
            t.join()
        keep("shared", calls, {"output": json.dumps(output2), "probe": json.dumps(probe)})
        rpc.collective_rpc("specparity_tap_drain")
        rpc.collective_rpc(tap.DISARM)
print("done", flush=True)
