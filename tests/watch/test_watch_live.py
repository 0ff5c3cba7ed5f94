"""`specparity watch` and `specparity alert-rules` end to end: two vLLM servers of SmolLM2-135M-Instruct with
its trained drafter, one healthy and one with the seed's wiring (the embedding in fc's first chunk), under the same
out-of-domain chat prompts; a real Prometheus (Debian's 2.42) started here on loopback in its own directory scrapes
both and loads the rules `alert-rules` wrote from the baseline `watch --calibrate` took on the healthy server.

Its alert fires for the miswired server and stays quiet for the healthy one (read from Prometheus' /api/v1/alerts),
and `specparity watch --once` gives the same two verdicts. Every process the test starts carries the run marker and is
gone at the end (tests/process_marks.py).

The servers run in the vLLM env (.tox/vllm-0.32), the test and specparity in this one; each server is bound to one core.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
from tests.process_marks import describe, gone, marked_alive

from specparity.realmodel.fetch import cached
from specparity.realmodel.scenarios import CONTRACT, REPO, VLLM, draft_for
from specparity.serving.child.reaper import MARKER_ENV
from specparity.serving.live.server import LaunchedServer, ServerClient, ServerError, free_port
from specparity.watch.band import baseline_path

pytestmark = [pytest.mark.watch_live, pytest.mark.slow]
VLLM_PYTHON = REPO / ".tox" / "vllm-0.32" / "bin" / "python"
PROMPTS = Path(__file__).with_name("chat_prompts.jsonl")  # general chat, nothing like the drafter's training prompts
HEALTHY, _, SEED = VLLM
CALIBRATE_S, CANARY_S = 100, 120
RANGE, FOR = "2m", "30s"


def _server(draft: Path, target: Path, core: str, log: Path) -> LaunchedServer:
    port = free_port()
    spec = json.dumps({"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3})
    argv = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(target), "--dtype", "float32",
            "--enforce-eager", "--max-model-len", "2048", "--speculative-config", spec, "--host", "127.0.0.1",
            "--port", str(port), "--served-model-name", "smol", "--per-request-spec-decode-metrics", "summary"]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": core}
    return LaunchedServer(argv, env, f"http://127.0.0.1:{port}", log=log)


def _prometheus(folder: Path, targets: dict[str, str]) -> LaunchedServer:
    port = free_port()
    (folder / "rules.yml").write_text("groups: []\n")
    static = "\n".join(f"      - targets: ['{t.removeprefix('http://')}']\n        labels: {{deployment: '{name}'}}"
                       for name, t in targets.items())
    (folder / "prometheus.yml").write_text(
        "global: {scrape_interval: 2s, evaluation_interval: 2s}\nrule_files: [rules.yml]\n"
        f"scrape_configs:\n  - job_name: serving\n    static_configs:\n{static}\n")
    argv = [shutil.which("prometheus") or "prometheus", f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle", "--log.level=warn"]
    return LaunchedServer(argv, {}, f"http://127.0.0.1:{port}", health_path="/-/ready", log=folder / "prometheus.log")


def _watch(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "specparity.cli", "watch", *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _load_until(url: str, stop: threading.Event) -> None:
    """The seed's server gets the same prompts while the healthy one is calibrated."""
    prompts = [json.loads(x)["prompt"] for x in PROMPTS.read_text().splitlines()]
    with ServerClient(url, timeout_s=120) as c:
        i = 0
        while not stop.is_set():
            c.post_json("/v1/chat/completions", {"model": "smol", "max_tokens": 64, "temperature": 0.0,
                                                 "messages": [{"role": "user", "content": prompts[i % len(prompts)]}]})
            i += 1


def _alerts(prom: str) -> list[dict]:  # type: ignore[type-arg]
    with ServerClient(prom, timeout_s=10) as c:
        return list(c.get_json("/api/v1/alerts")["data"]["alerts"])


def test_prometheus_alerts_on_the_seeds_wiring_not_on_the_healthy_server_and_watch_agrees(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not VLLM_PYTHON.is_file():
        pytest.fail(f"the vLLM env is absent ({VLLM_PYTHON}): make vllm-env builds it")
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        pytest.fail("prometheus and promtool are required (apt-get install -y prometheus)")
    model = cached()
    if model is None:
        pytest.fail("the real target is not in the cache: run `.venv/bin/python -m specparity.realmodel fetch`")
    marker = f"watch-live-{os.getpid()}"
    monkeypatch.setenv(MARKER_ENV, marker)
    contract = tmp_path / CONTRACT.name
    for f in (CONTRACT, CONTRACT.with_name(CONTRACT.stem + ".probes.safetensors")):
        shutil.copy(f, tmp_path / f.name)
    prom_dir = tmp_path / "prometheus"
    prom_dir.mkdir()
    t0 = time.monotonic()
    figures: dict[str, object] = {}
    try:
        with ExitStack() as stack:
            healthy = stack.enter_context(_server(draft_for(HEALTHY, tmp_path), model.fp32, "0", tmp_path / "h.log"))
            seed = stack.enter_context(_server(draft_for(SEED, tmp_path), model.fp32, "1", tmp_path / "s.log"))
            prom = stack.enter_context(_prometheus(prom_dir, {"healthy": healthy.url, "seed": seed.url}))
            for s in (healthy, seed, prom):
                s.wait_healthy(900)
            figures["started_s"] = round(time.monotonic() - t0)

            # 1. the baseline, from the healthy server's own first windows under its traffic (the chat prompts)
            stop = threading.Event()
            seed_load = threading.Thread(target=_load_until, args=(seed.url, stop), daemon=True)
            seed_load.start()
            cal = _watch("--server", healthy.url, "--contract", str(contract), "--calibrate", "--duration",
                         str(CALIBRATE_S), "--interval", "10", "--window", str(CALIBRATE_S), "--load", str(PROMPTS),
                         "--json")
            out, err = cal.communicate(timeout=CALIBRATE_S + 120)
            stop.set()
            assert cal.returncode == 0, out + err
            baseline = json.loads(out.splitlines()[-1])
            figures["baseline"] = {k: baseline[k] for k in ("acceptance_length", "per_position", "drafts",
                                                              "per_request_mean", "requests")}
            assert baseline_path(contract).is_file() and baseline["notes"], baseline  # below the contract: noted

            # 2. the rules from that band, checked by promtool and loaded into the running Prometheus
            rules = tmp_path / "rules.yml"
            run = subprocess.run([sys.executable, "-m", "specparity.cli", "alert-rules", "--contract", str(contract),
                                  "--engine", "vllm", "-o", str(rules), "--range", RANGE, "--for", FOR,
                                  "--selector", 'job="serving"'], capture_output=True, text=True, cwd=REPO,
                                 timeout=120)
            assert run.returncode == 0, run.stderr
            check = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True)
            assert check.returncode == 0, check.stdout + check.stderr
            shutil.copy(rules, prom_dir / "rules.yml")
            with ServerClient(prom.url, timeout_s=10) as c:
                assert c.post("/-/reload") == 200
            seed_load.join(timeout=120)

            # 3. the canary on both, each sending the chat prompts; Prometheus scrapes the same counters
            procs = {name: _watch("--server", s.url, "--contract", str(contract), "--once", "--duration",
                                  str(CANARY_S), "--interval", "10", "--window", "90", "--load", str(PROMPTS),
                                  "--json") for name, s in (("healthy", healthy), ("seed", seed))}
            results = {name: p.communicate(timeout=CANARY_S + 180) for name, p in procs.items()}
            summaries = {name: json.loads(out.splitlines()[-1]) for name, (out, _) in results.items()}
            for name, s in summaries.items():
                pooled = (s["acceptance"] or {}).get("pooled") or {}
                figures[name] = {"exit": procs[name].returncode, "windows": s["windows"],
                                 "length": pooled.get("acceptance_length"),
                                 "interval": pooled.get("acceptance_length_interval95"),
                                 "per_position": pooled.get("per_position"),
                                 "per_request_mean": s["acceptance"]["per_request_mean"]["acceptance_length"]}
            figures["floor"] = summaries["seed"]["band"]["floor_length"]
            seed_instance = seed.url.removeprefix("http://")
            deadline = time.monotonic() + 90
            firing: list[dict] = []  # type: ignore[type-arg]
            while time.monotonic() < deadline:
                firing = [a for a in _alerts(prom.url) if a["state"] == "firing"
                          and a["labels"]["alertname"] == "SpecparityAcceptanceBelowBand"]
                if firing:
                    break
                time.sleep(3)
            everything = _alerts(prom.url)
            figures["alerts"] = [(a["labels"]["instance"], a["labels"]["alertname"], a["state"], a["value"])
                                 for a in everything]
            figures["total_s"] = round(time.monotonic() - t0)
            print("watch-live figures:", json.dumps(figures))
            assert [a["labels"]["instance"] for a in firing] == [seed_instance], figures
            assert not [a for a in everything if a["labels"].get("instance") == healthy.url.removeprefix("http://")
                        ], figures
            assert procs["seed"].returncode == 1, results["seed"]
            assert procs["healthy"].returncode == 0, results["healthy"]
            assert summaries["healthy"]["band"]["reference"] == "the calibrated baseline"
            per_req = summaries["healthy"]["acceptance"]["per_request_mean"]
            assert per_req["requests"] > 0 and per_req["acceptance_length"] > 1.0
    except ServerError as e:
        pytest.fail(f"a server did not come up: {e}")
    finally:
        assert gone(marker, within_s=20), describe(marked_alive(marker))
