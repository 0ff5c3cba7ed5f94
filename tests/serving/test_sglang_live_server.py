"""The gate on SGLang's own server: a deploy command launched as given, and a running server attached to.

The command is SGLang's published EAGLE-3 command made to run on this CPU (tests/launch_commands/sglang/
cpu_docs_eagle3.sh, provenance in its README): ``python3 -m sglang.launch_server ...``. The tests put the bundled
models in for the published ones and, where a test says so, change only the speculative settings. The gate adds only
SGLang's ``--forward-hooks`` (with, on this CPU, ``--skip-server-warmup`` and the stand-ins' environment) and a
free port; the evidence is read from the hooks' directory on this host.

Server starts (each ~25 s idle to healthy, 60-130 s with other runs on the 2 cores):

1. launched through the CLI: the healthy drafter with the contract's speculative settings, ``--level capture``: exit 0;
2. launched through ``run_gate``: the seed's wiring (``[-1, 1, 3]``) with the published command's topk tuned to 1 and
   its 16 draft tokens kept (SGLang rewrites them to steps + 1 = 4), ``--level all``;
3. a server the test starts itself with ``specparity launch-flags --engine sglang --evidence-dir DIR``'s flags, serving
   the command of start 1; ``--server URL`` at the capture, static and ``all`` levels against it.

Every run carries its own run marker (``SPECPARITY_RUN_ID``); after each, no process with it is alive
(tests/process_marks.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.deploy_files import draft_with_ids
from tests.process_marks import describe, gone, marked_alive
from version_facts import SGLANG_VERSION

from specparity.compare.findings import FindingKind, Severity, is_environmental
from specparity.contract import load_contract, read_contract_probes
from specparity.deploy_command import read_launch
from specparity.gate import run_gate
from specparity.serving import stand_ins
from specparity.serving.child.reaper import MARKER_ENV
from specparity.serving.command.parse import LaunchSpec, parse_launch
from specparity.serving.live.server import LaunchedServer, ServerClient, free_port
from specparity.serving.sglang import live
from specparity.sources import EMBEDDING
from specparity.verdict import Verdict

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.usefixtures("sglang_required")]

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "fixtures" / "default" / "target"
DRAFT = REPO / "fixtures" / "default" / "draft"
CONTRACT = REPO / "contracts" / "tiny-llama-eagle3.json"
COMMAND = REPO / "tests" / "launch_commands" / "sglang" / "cpu_docs_eagle3.sh"
PUBLISHED_TARGET, PUBLISHED_DRAFT = "meta-llama/Meta-Llama-3.1-8B-Instruct", "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B"
LIVE_FROM = "0.5.23"  # the release this CPU's live run is made for (its refusals and stand-ins are 0.5.23's)
TIMEOUT_S = 600
# the contract's serving block (num_steps 3, eagle_topk 1, num_draft_tokens 4); the published steps are 3 already
CONTRACT_SPEC = {"--speculative-eagle-topk 4": "--speculative-eagle-topk 1",
                 "--speculative-num-draft-tokens 16": "--speculative-num-draft-tokens 4"}
# a user who tunes the docs' topk to 1 and keeps its 16 draft tokens (tests/serving/test_launch_parse.py
# docs-eagle3-topk1): SGLang serves steps + 1 = 4 (arg_groups/speculative_hook.py, "adjusted to speculative_num_steps + 1")
TOPK1 = {"--speculative-eagle-topk 4": "--speculative-eagle-topk 1"}
SOURCES = ["layer:1", "layer:3", "layer:5"]
SEED_IDS, SEED_SOURCES = [-1, 1, 3], [EMBEDDING, "layer:1", "layer:3"]
# the decode step SGLang 0.5.23 refuses on this CPU (live.CPU_REFUSALS[0])
DECODE_REFUSAL = ("mem_cache/allocation.py:746", "speculative/eagle_utils.py:910")


def _text(draft: Path, edit: dict[str, str]) -> str:
    text = COMMAND.read_text().replace(PUBLISHED_TARGET, str(TARGET)).replace(PUBLISHED_DRAFT, str(draft))
    for old, new in edit.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


def _spec(draft: Path, edit: dict[str, str]) -> LaunchSpec:
    return parse_launch(read_launch(_text(draft, edit), source="--launch", cwd=REPO), python=sys.executable)


@contextmanager
def _marked(marker: str) -> Iterator[None]:
    """Every process started in the block carries ``marker``; after it none may be alive."""
    old = os.environ.get(MARKER_ENV)
    os.environ[MARKER_ENV] = marker
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(MARKER_ENV, None)
        else:
            os.environ[MARKER_ENV] = old
    assert gone(marker, within_s=15), describe(marked_alive(marker))


def _cli(*args: str, marker: str, timeout_s: float = 900) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "specparity.cli", *args], cwd=REPO,
                         env={**os.environ, MARKER_ENV: marker}, capture_output=True, text=True, timeout=timeout_s)
    took = time.monotonic() - t0
    assert gone(marker, within_s=15), describe(marked_alive(marker))
    return run, took


def _probe_tokens() -> list[int]:
    return [s.num_tokens for s in read_contract_probes(load_contract(CONTRACT), CONTRACT).samples]


@pytest.fixture(scope="module", autouse=True)
def _release() -> None:
    if SGLANG_VERSION != LIVE_FROM:
        pytest.fail(f"this CPU's live server run is made for sglang {LIVE_FROM}; installed: {SGLANG_VERSION}")


@pytest.fixture(scope="module")
def launched_healthy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Start 1: ``specparity gate --launch-file CMD --level capture`` as a user runs it; its JSON report."""
    tmp = tmp_path_factory.mktemp("healthy")
    cmd, report = tmp / "cmd.sh", tmp / "r.json"
    cmd.write_text(_text(DRAFT, CONTRACT_SPEC))
    run, took = _cli("gate", "--contract", str(CONTRACT), "--level", "capture", "--python", sys.executable,
                     "--launch-file", str(cmd), "--json", str(report), marker=f"sglang-live-healthy-{os.getpid()}")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    d = json.loads(report.read_text())
    print(f"\nlaunched healthy --level capture (CLI): {took:.1f} s, server healthy after "
          f"{d['live']['startup_s']:.1f} s")
    return {"report": d, "stdout": run.stdout}


def test_healthy_drafter_passes_on_the_launched_server(launched_healthy: dict[str, Any]) -> None:
    """Exit 0 through the CLI; what the server fed fc is what training recorded, at the contract's layers."""
    d = launched_healthy["report"]
    assert d["verdict"] == "pass" and d["level"] == "capture" and d["engine_version"] == LIVE_FROM
    assert d["served_layout"] == SOURCES and d["expected_layout"] == SOURCES
    assert [(c["served"], c["expected"]) for c in d["chunks"]] == list(zip(SOURCES, SOURCES, strict=True))
    # fp32 on torch_native: the served fc input equals the recording to < 1e-4, probe by probe, every token
    assert [p["tokens"] for p in d["probes"]] == _probe_tokens()
    assert all(p["status"] == "pass" and p["chunks"] == 3 and p["max_abs_err"] < 1e-4 for p in d["probes"]), d["probes"]
    # the live atlas has every boundary of the 8-layer target (the attribution's candidates)
    assert set(d["heatmap"]["columns"]) >= {EMBEDDING, "final_norm", *(f"layer:{i}" for i in range(8))}
    # the server's own settings (its /server_info): the contract's, asked for and served, nothing rewritten
    spec = d["resolved_spec_config"]
    assert spec["requested"] == spec["resolved"] == {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    assert d["layout"]["ranks_expected"] == [0] and d["layout"]["ranks_reported"] == [0]
    assert not [f for f in d["findings"] if f["severity"] != "info"], d["findings"]
    assert "PASS" in launched_healthy["stdout"]


def test_the_live_block_lists_what_the_gate_added(launched_healthy: dict[str, Any]) -> None:
    """The report says the server was launched from the command, and lists every flag and env var added to it."""
    d = launched_healthy["report"]
    run = d["live"]
    assert run["mode"] == "launched" and run["url"].startswith("http://127.0.0.1:")
    port = run["url"].rsplit(":", 1)[1]
    flags = run["added_flags"]
    assert flags[0] == "--forward-hooks" and live.HOOK_FACTORY in flags[1]
    evidence = json.loads(flags[1])[0]["config"]["evidence_dir"]
    # SGLang's warm-up decodes, which no CPU kernel can; a free port (and loopback, which is SGLang's default too)
    assert flags[2] == "--skip-server-warmup" and flags[-2:] == ["--port", port]
    assert flags[3:-2] in ([], ["--host", "127.0.0.1"]), flags
    env = run["added_env"]
    assert env["SGLANG_USE_CPU_ENGINE"] == "1" and env["SPECPARITY_SGLANG_LIVE_STAND_INS"] == evidence
    # the server's temp files (SGLang's IPC placeholders) go with the evidence directory (serving/live/capture.py scratch_env)
    assert env["TMPDIR"] == str(Path(evidence) / "tmp")
    assert str(Path(live.__file__).parent / "live_site") in env["PYTHONPATH"].split(os.pathsep)
    # the user's words all ran, in their order, with what was added after them
    words = _text(DRAFT, CONTRACT_SPEC).replace("\\\n", " ").split()[2:]  # less HF_HUB_OFFLINE=1 and python3
    assert run["command"][1:] == [*words, *flags] and run["command"][0] == sys.executable
    assert d["launch"]["command"]["env"] == {"HF_HUB_OFFLINE": "1"}
    assert run["evidence_bytes"] > 0
    assert not Path(evidence).exists()  # the evidence directory went with the run
    out = launched_healthy["stdout"]
    assert "Server: launched from the command" in out and "--skip-server-warmup" in out


def test_stand_ins_are_recorded_and_reported(launched_healthy: dict[str, Any]) -> None:
    """Only the in-process capture's two CPU stand-ins ran in the server's processes, each reported."""
    names = launched_healthy["report"]["stand_ins"]
    assert names[0] == f"{stand_ins.SGL_KERNEL}: calls copy_all_layer_kv_cache_cpu"  # inside KERNEL_STUB_ALLOWED
    assert "copy_all_layer_kv_cache_cpu" in stand_ins.KERNEL_STUB_ALLOWED
    assert names[1].startswith(stand_ins.DRAFT_ATTENTION_FALLBACK)
    assert len(names) == 2
    assert "Stand-ins active: " in launched_healthy["stdout"]


@pytest.fixture(scope="module")
def launched_seed(tmp_path_factory: pytest.TempPathFactory) -> Verdict:
    """Start 2: the seed's wiring, the published command with topk 1 and its 16 draft tokens, ``--level all``."""
    draft = draft_with_ids(DRAFT, tmp_path_factory.mktemp("seed") / "draft", SEED_IDS)
    spec = _spec(draft, TOPK1)
    t0 = time.monotonic()
    with _marked(f"sglang-live-seed-{os.getpid()}"):
        v = run_gate(CONTRACT, launch=spec, level="all", timeout_s=TIMEOUT_S)
    assert v.live is not None
    print(f"\nlaunched seed --level all (run_gate): {time.monotonic() - t0:.1f} s, server healthy after "
          f"{v.live['startup_s']:.1f} s")
    return v


def test_the_seeds_wiring_is_named_with_its_fix(launched_seed: Verdict) -> None:
    v = launched_seed
    assert v.status == "fail" and v.exit_code == 1 and v.live is not None and v.live["mode"] == "launched"
    assert FindingKind.EXTRA_EMBEDDING in {f.kind for f in v.errors}
    assert v.served_layout == SEED_SOURCES  # the capture through the hooks
    assert v.fix is not None and list(v.fix.json_patch) == [
        {"op": "replace", "path": "/eagle_config/eagle_aux_hidden_state_layer_ids", "value": [1, 3, 5]}]


def test_the_servers_own_rewrite_is_named(launched_seed: Verdict) -> None:
    """16 draft tokens at topk 1: the server's /server_info says it runs steps + 1 = 4, its launch_command that 16
    was asked for; the gate names the rewrite from what the server itself reports, with the flags that keep 16."""
    v = launched_seed
    spec = v.resolved_spec_config
    assert spec is not None
    assert spec["requested"] == {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 16}
    assert spec["resolved"] == {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    rewritten = [f for f in v.findings if f.kind is FindingKind.SPEC_CONFIG_REWRITTEN]
    assert [(f.severity, f.details["setting"], f.details["requested"], f.details["resolved"]) for f in rewritten] == [
        (Severity.ERROR, "num_draft_tokens", 16, 4)], [str(f) for f in v.findings]
    assert "from 16 to 4" in rewritten[0].message and "sglang 0.5.23" in rewritten[0].message
    assert rewritten[0].fix is not None and "--speculative-num-steps 15" in rewritten[0].fix


def test_the_decode_refusal_is_named_and_is_not_the_mismatch(launched_seed: Verdict) -> None:
    """At ``--level all`` the server's own acceptance cannot be counted on this CPU: named by call, environmental;
    the exit 1 is the wiring's and the rewrite's."""
    v = launched_seed
    refusal = [f for f in v.errors if all(c in f.message for c in DECODE_REFUSAL)]
    assert len(refusal) == 1 and is_environmental(refusal[0]) and refusal[0].details.get("check") == "outcome"
    others = {f.kind for f in v.errors if f not in refusal and not is_environmental(f)}
    assert others >= {FindingKind.EXTRA_EMBEDDING, FindingKind.SPEC_CONFIG_REWRITTEN}


@dataclass
class Attached:
    url: str
    marker: str


@pytest.fixture(scope="module")
def attached_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Attached]:
    """Start 3: the command of start 1 run by the test itself, with ``specparity launch-flags --engine sglang
    --evidence-dir DIR``'s flags. On this CPU it also needs what the gate adds to a launched CPU server: the
    stand-ins' environment and ``--skip-server-warmup`` (launch-flags prints what a GPU server needs)."""
    tmp = tmp_path_factory.mktemp("attach")
    evidence = tmp / "evidence"  # launch-flags creates it, 0700
    marker = f"sglang-live-attached-{os.getpid()}"
    printed = json.loads(subprocess.run(
        [sys.executable, "-m", "specparity.cli", "launch-flags", "--engine", "sglang", "--evidence-dir", str(evidence),
         "--json"], capture_output=True, text=True, check=True).stdout)
    assert evidence.is_dir() and evidence.stat().st_mode & 0o777 == 0o700
    _, cpu_env = live.hook_switches(evidence, cpu_stand_ins=True)
    command = read_launch(_text(DRAFT, CONTRACT_SPEC), source="--launch", cwd=REPO)
    port = free_port()
    argv = [sys.executable, *command.program[1:], *command.args, *printed["flags"], "--skip-server-warmup",
            "--host", "127.0.0.1", "--port", str(port)]
    try:
        with _marked(marker), LaunchedServer(argv, {**command.env, **printed["env"], **cpu_env},
                                             f"http://127.0.0.1:{port}", cwd=str(REPO),
                                             log=tmp / "server.log") as server:
            server.wait_healthy(TIMEOUT_S)
            print(f"\nattached server healthy after {server.started_s:.1f} s")
            yield Attached(server.url, marker)
    finally:
        shutil.rmtree(evidence, ignore_errors=True)


def test_attached_server_gives_the_launched_verdict(attached_server: Attached,
                                                    launched_healthy: dict[str, Any]) -> None:
    """``--server URL`` at the capture level: the verdict of the launched run of the same command and draft."""
    t0 = time.monotonic()
    v = run_gate(CONTRACT, server=attached_server.url, level="capture", timeout_s=TIMEOUT_S)
    print(f"\nattached --level capture: {time.monotonic() - t0:.1f} s")
    d, launched = v.to_dict(), launched_healthy["report"]
    assert v.status == launched["verdict"] == "pass"
    for key in ("served_layout", "stand_ins", "resolved_spec_config", "engine_version", "target_architecture"):
        assert d[key] == launched[key], key
    assert [p["tokens"] for p in d["probes"]] == [p["tokens"] for p in launched["probes"]]
    assert {f["kind"] for f in d["findings"]} == {f["kind"] for f in launched["findings"]}
    assert v.live is not None and v.live["mode"] == "attached" and v.live["url"] == attached_server.url
    assert v.live["added_flags"] == [] and v.live["added_env"] == {}  # nothing of a running server is changed
    # the hooks reduced the atlas in the server's scheduler process (the default); --evidence full ships every
    # boundary: the same verdict, every number of the report included, from fewer bytes
    t1 = time.monotonic()
    full = run_gate(CONTRACT, server=attached_server.url, level="capture", timeout_s=TIMEOUT_S, evidence="full")
    print(f"attached --level capture --evidence full: {time.monotonic() - t1:.1f} s; evidence bytes reduced "
          f"{v.live['evidence_bytes']}, full {full.live['evidence_bytes'] if full.live else '?'}")
    f = full.to_dict()
    for x in (d, f):
        x.pop("timings", None)
        x.pop("live", None)
    assert d == f
    # fewer bytes even at this target's 8 layers of 64 (the statistics are per token and boundary pair, so they
    # approach the atlas's size at tiny widths; at Kimi-K2.5's geometry they are ~1%: benchmarks/bench_evidence.py)
    assert full.live is not None and v.live["evidence_bytes"] < full.live["evidence_bytes"]


def test_attached_static_level_is_the_servers_own_report(attached_server: Attached) -> None:
    """``--server URL --level static``: what the server itself reports (/server_info: its resolved settings and the
    draft it serves, read at the path it names), without starting anything."""
    with ServerClient(attached_server.url, timeout_s=30) as client:
        info = live.server_info(client)
    t0 = time.monotonic()
    v = run_gate(CONTRACT, server=attached_server.url, level="static", timeout_s=TIMEOUT_S)
    took = time.monotonic() - t0
    print(f"\nattached --level static: {took:.1f} s")
    assert v.status == "pass" and v.level == "static", [str(f) for f in v.errors]
    assert v.resolved_spec_config is not None
    assert v.resolved_spec_config["resolved"] == {key: info[f"speculative_{key}"] for key in
                                                  ("num_steps", "eagle_topk", "num_draft_tokens")}
    assert v.resolved_spec_config["requested"] == v.resolved_spec_config["resolved"]
    assert "--speculative-num-draft-tokens 4" in info["launch_command"]
    assert live.HOOK_FACTORY in str(info["forward_hooks"])
    assert v.served_layout == SOURCES and v.draft_path == info["speculative_draft_model_path"]
    assert v.live is not None and v.live["mode"] == "attached"


def test_level_all_on_cpu_is_exit_3_naming_the_decode_refusal(attached_server: Attached, tmp_path: Path) -> None:
    """``--server URL --level all`` through the CLI: the healthy drafter's capture passes, the server's own
    acceptance cannot be counted on this CPU: exit 3 by name, never 1 and never a pass; the server still serves."""
    report = tmp_path / "r.json"
    run, took = _cli("gate", "--contract", str(CONTRACT), "--level", "all", "--server", attached_server.url,
                     "--json", str(report), marker=f"{attached_server.marker}-all")
    print(f"\nattached --level all (CLI): {took:.1f} s")
    assert run.returncode == 3, run.stdout[-4000:] + run.stderr[-4000:]
    d = json.loads(report.read_text())
    assert d["verdict"] == "error" and d["served_layout"] == SOURCES
    assert [(c["served"], c["expected"]) for c in d["chunks"]] == list(zip(SOURCES, SOURCES, strict=True))
    errors = [f for f in d["findings"] if f["severity"] == "error"]
    assert len(errors) == 1 and errors[0]["details"]["check"] == "outcome", errors
    assert all(c in errors[0]["message"] for c in DECODE_REFUSAL)
    assert all(c in run.stdout for c in DECODE_REFUSAL)
    # the headline keeps the capture's result apart from the outcome that could not run here
    assert run.stdout.startswith("ERROR  fc input matches contract 'tiny-llama-eagle3'"), run.stdout[:400]
    assert "the outcome could not be checked on this machine" in run.stdout.splitlines()[0]
    with ServerClient(attached_server.url, timeout_s=30) as client:
        assert client.healthy("/health")  # no decode was sent to it
