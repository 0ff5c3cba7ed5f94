"""SGLang's own HTTP server (``python -m sglang.launch_server``) on this CPU, with specparity's hook switches:
``/server_info`` -> the static level, and the capture at prefill through ``--forward-hooks``.

One server start per drafter (module-scoped): the bundled healthy drafter, and the seed incident's wiring (the
same drafter with ids ``[-1, 1, 3]``, as the catalog makes it). Each server is started by the engine-neutral server
layer (``serving.server.LaunchedServer``: 127.0.0.1 and a free port, its own process group) and stopped (the whole
group) inside its fixture, whatever happens; the tests then check what was recorded, including that no process of
the group is left (read from /proc).

On CPU the command carries ``--skip-server-warmup`` (SGLang's warm-up decodes, which needs a CPU ``sgl_kernel`` op:
``live.CPU_REFUSALS``) and the stand-ins' environment (``live.hook_switches(..., cpu_stand_ins=True)``).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.deploy_files import draft_with_ids
from version_facts import SGLANG_VERSION

from specparity.compare.attribution import attribute
from specparity.compare.tolerances import tolerances_from_contract
from specparity.contract import Contract, ProbePack, load_contract, read_contract_probes
from specparity.serving import stand_ins
from specparity.serving.results import CaptureResult, SpecSettings
from specparity.serving.server import LaunchedServer, ServerClient, ServerError, free_port
from specparity.serving.sglang import live
from specparity.sources import EMBEDDING

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.usefixtures("sglang_required")]

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "fixtures" / "default" / "target"
DRAFT = REPO / "fixtures" / "default" / "draft"
CONTRACT = REPO / "contracts" / "tiny-llama-eagle3.json"
START_TIMEOUT_S = 240
LIVE_FROM = "0.5.23"  # the release this CPU's live run is made for (its refusals and stand-ins are 0.5.23's)


@dataclass
class ServerRun:
    """What one server start recorded: the capture, the timings, and the process group after the stop."""

    result: CaptureResult
    info: dict[str, Any]
    startup_s: float
    capture_s: float
    stop_s: float
    pgid: int
    left_after_stop: list[int]
    log_tail: str
    raised_inside: bool


def _group_members(pgid: int) -> list[int]:
    """Processes (zombies included) whose process group is ``pgid``, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid:
            out.append(int(entry))
    return out


class _OnPurpose(Exception):
    """Raised inside a server's block to show the stop runs when a test fails there."""


def _serve_and_capture(draft: Path, probes: list[list[int]], *, fail_inside: bool = False) -> ServerRun:
    """Start ``launch_server`` with the hook switches (``serving.server.LaunchedServer``: its own process group,
    127.0.0.1 and a free port), capture, stop the group; the stop runs also when the block raises."""
    evidence = Path(tempfile.mkdtemp(prefix="specparity-live-test-"))
    os.chmod(evidence, 0o700)
    port = free_port()
    flags, env = live.hook_switches(evidence, cpu_stand_ins=True)
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(TARGET),
            "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft),
            # 16 draft tokens at topk 1: SGLang rewrites it to steps + 1, and /server_info must show that
            "--speculative-num-steps", "2", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "16",
            "--device", "cpu", "--attention-backend", "torch_native", "--dtype", "float32", "--disable-cuda-graph",
            "--mem-fraction-static", "0.05", "--max-total-tokens", "4096", "--skip-server-warmup",
            "--host", "127.0.0.1", "--port", str(port), *flags]
    full_env = {"HF_HUB_OFFLINE": "1", **env,
                "PYTHONPATH": os.pathsep.join(p for p in (env["PYTHONPATH"], os.environ.get("PYTHONPATH")) if p)}
    url = f"http://127.0.0.1:{port}"
    server = LaunchedServer(argv, full_env, url, log=evidence / "server.log")
    raised = False
    capture_s = 0.0
    result: CaptureResult | None = None
    info: dict[str, Any] = {}
    try:
        server.start()
        try:
            server.wait_healthy(START_TIMEOUT_S)
        except ServerError as e:
            lines = server.log_tail(400).splitlines()
            raise AssertionError(f"the server did not come up: {live.server_failure(str(e), lines)}") from None
        t1 = time.monotonic()
        with ServerClient(url, timeout_s=120) as client:
            info = live.server_info(client)
            result = live.live_capture(client, evidence_dir=evidence, probes=probes, cwd=REPO)
        capture_s = time.monotonic() - t1
        if fail_inside:  # a test that fails while its server runs must still leave nothing behind
            raise _OnPurpose
    except _OnPurpose:
        raised = True
    finally:
        t2 = time.monotonic()
        server.stop()
        stop_s = time.monotonic() - t2
        assert server.proc is not None
        pgid = server.proc.pid
        deadline = time.monotonic() + 5  # orphaned children's zombies are init's to reap
        while (left := _group_members(pgid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        tail = server.log_tail()
        shutil.rmtree(evidence, ignore_errors=True)  # the records are read into `result` by now
    assert result is not None
    return ServerRun(result, info, server.started_s or 0.0, capture_s, stop_s, pgid, left, tail, raised)


@pytest.fixture(scope="module")
def contract() -> tuple[Contract, ProbePack]:
    c = load_contract(CONTRACT)
    return c, read_contract_probes(c, CONTRACT)


@pytest.fixture(scope="module")
def probes(contract: tuple[Contract, ProbePack]) -> list[list[int]]:
    return [s.input_ids.tolist() for s in contract[1].samples]


@pytest.fixture(scope="module")
def healthy(probes: list[list[int]]) -> Iterator[ServerRun]:
    if SGLANG_VERSION != LIVE_FROM:
        pytest.fail(f"this CPU's live server run is made for sglang {LIVE_FROM}; installed: {SGLANG_VERSION}")
    run = _serve_and_capture(DRAFT, probes)
    print(f"\nhealthy: server start to /health {run.startup_s:.1f} s, capture of {len(probes)} probes "
          f"{run.capture_s:.1f} s, stop {run.stop_s:.1f} s")
    yield run


@pytest.fixture(scope="module")
def seed(probes: list[list[int]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerRun]:
    draft = draft_with_ids(DRAFT, tmp_path_factory.mktemp("seed") / "draft", [-1, 1, 3])
    run = _serve_and_capture(draft, probes, fail_inside=True)
    print(f"\nseed: server start to /health {run.startup_s:.1f} s, capture {run.capture_s:.1f} s, stop "
          f"{run.stop_s:.1f} s")
    yield run


def _attribution(run: ServerRun, contract: tuple[Contract, ProbePack]) -> list[str | None]:
    c, pack = contract
    fc, atlas = run.result.fc, run.result.atlas
    assert fc is not None and atlas is not None, run.result.failures
    base, over = tolerances_from_contract(c.tolerances, dtype=fc.dtype)
    table = attribute(fc.per_sample, [s.fc_input for s in pack.samples], atlas.per_sample,
                      expected=list(c.fc_input.sources), tolerance=base, overrides=over)
    assert table.recorded_sources() == list(c.fc_input.sources)  # the live atlas explains the recording
    return table.served_sources()


def test_server_info_resolves_the_deployment(healthy: ServerRun) -> None:
    dep = healthy.result.deployment
    assert dep is not None
    assert dep.engine_version == LIVE_FROM and dep.adapter == live.ADAPTER and dep.device == "cpu"
    # the server's own rewrite, shown by the server: 16 requested, steps + 1 = 3 resolved
    assert dep.requested_spec == SpecSettings(2, 1, 16)
    assert dep.resolved_spec == SpecSettings(2, 1, 3)
    assert healthy.info["speculative_num_draft_tokens"] == 3
    assert dep.spec_warnings and "16 to 3" in dep.spec_warnings[0]
    assert "--speculative-num-draft-tokens 16" in healthy.info["launch_command"]
    assert dep.draft_config_ids == (1, 3, 5) and dep.layers_to_capture == (2, 4, 6)
    assert dep.served_sources == ("layer:1", "layer:3", "layer:5")
    assert (dep.target_architecture, dep.num_layers, dep.fc_in_features, dep.fc_source) == \
        ("LlamaForCausalLM", 8, 192, "checkpoint")
    assert live.HOOK_FACTORY in str(dep.server_args["forward_hooks"])
    assert dep.layout["ranks_expected"] == [0] and dep.layout["ranks_reported"] == [0]


def test_capture_at_prefill_is_attributed_to_the_contracts_layers(
        healthy: ServerRun, contract: tuple[Contract, ProbePack]) -> None:
    result, pack = healthy.result, contract[1]
    assert result.ok, result.failures
    assert result.fc is not None and result.atlas is not None
    assert [t.shape[0] for t in result.fc.per_sample] == [s.num_tokens for s in pack.samples]
    assert result.fc.aux_states_captured == 3 and result.fc.dtype == "float32"
    assert _attribution(healthy, contract) == list(contract[0].fc_input.sources)
    # what training recorded is what the server fed fc (fp32, torch_native: the bundle's unpadded forward)
    worst = max(float((got - s.fc_input).abs().max()) for got, s in zip(result.fc.per_sample, pack.samples, strict=True))
    assert worst < 1e-4, worst
    assert set(result.atlas.sources()) >= {EMBEDDING, "final_norm", *(f"layer:{i}" for i in range(8))}


def test_the_seeds_wiring_is_named(seed: ServerRun, contract: tuple[Contract, ProbePack]) -> None:
    dep = seed.result.deployment
    assert dep is not None and dep.draft_config_ids == (-1, 1, 3)
    assert dep.served_sources == (EMBEDDING, "layer:1", "layer:3")  # the static level, from /server_info
    assert _attribution(seed, contract) == [EMBEDDING, "layer:1", "layer:3"]  # the capture, from the hooks


def test_stand_ins_are_recorded_and_reported(healthy: ServerRun) -> None:
    dep, fc = healthy.result.deployment, healthy.result.fc
    assert dep is not None and fc is not None
    assert dep.stand_ins[0] == f"{stand_ins.SGL_KERNEL}: calls copy_all_layer_kv_cache_cpu"
    assert any(s.startswith(stand_ins.DRAFT_ATTENTION_FALLBACK) for s in dep.stand_ins)
    assert len(dep.stand_ins) == 2
    assert fc.kernel_stub_active and set(fc.kernel_stub_calls) <= stand_ins.KERNEL_STUB_ALLOWED


def test_no_process_is_left_after_stop(healthy: ServerRun, seed: ServerRun) -> None:
    for run in (healthy, seed):
        assert run.left_after_stop == [], (run.pgid, run.left_after_stop)
    assert seed.raised_inside  # the seed's block raised on purpose: the group went all the same
