"""The gate on vLLM's own server: a deploy command launched as given, and a running server attached to.

The command is a published vLLM command made to run on this CPU (tests/launch_commands/vllm/cpu_api_server_eagle3.sh,
provenance in its README): ``python -m vllm.entrypoints.openai.api_server ... --speculative_config '{...}'``. The gate
adds only vLLM's own hook switches (``--worker-extension-cls`` with the tap, ``VLLM_SERVER_DEV_MODE=1``) and a free
port; the evidence comes back through the server's ``/collective_rpc``, and acceptance from its ``/metrics``. Each
launched run ends with no process of it alive (the run marker, tests/process_marks.py).

Server starts: healthy TP=1 (through the CLI), the one-layer shift TP=1, the seed's wiring TP=2; attached: the shift
with the hooks, and a healthy server without them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.process_marks import describe, gone, marked_alive
from vllm_helpers import BUNDLE, CONTRACT, REPO, copy_draft

from specparity.compare.findings import FindingKind
from specparity.deploy_command import read_launch
from specparity.gate import run_gate
from specparity.serving.child.reaper import MARKER_ENV
from specparity.serving.command.parse import LaunchSpec, parse_launch
from specparity.serving.live.server import LaunchedServer, free_port
from specparity.verdict import Verdict

pytestmark = pytest.mark.vllm
COMMAND = REPO / "tests" / "launch_commands" / "vllm" / "cpu_api_server_eagle3.sh"
# vLLM reads id k as hidden_states[k] (boundary k): the contract's layer:1, 3, 5 are boundaries 2, 4, 6; the
# SpecForge export as it is ([1, 3, 5]) is one layer early there; the seed's wiring puts the embedding first
HEALTHY, SHIFT, SEED = [2, 4, 6], [1, 3, 5], [0, 2, 4]


def _draft(tmp: Path, name: str, ids: list[int]) -> Path:
    out = copy_draft(tmp, name)
    cfg = json.loads((out / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _text(draft: Path, *, tp: int = 1) -> str:
    text = COMMAND.read_text().replace("facebook/opt-6.7b", str(BUNDLE / "target"))
    text = text.replace("nvidia/gpt-oss-120b-Eagle3-v3", str(draft)).replace("-tp 1", f"-tp {tp}")
    if tp > 1:  # vLLM's CPU autobind wants a NUMA node per local worker: one core each, as a CPU user sets it
        text = f"VLLM_CPU_OMP_THREADS_BIND='0|1' {text}"
    return text


def _spec(draft: Path, *, tp: int = 1) -> LaunchSpec:
    return parse_launch(read_launch(_text(draft, tp=tp), source="--launch", cwd=REPO), python=sys.executable)


@pytest.fixture(scope="module")
def drafts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("live-drafts")
    return {"healthy": _draft(tmp, "healthy", HEALTHY), "shift": _draft(tmp, "shift", SHIFT),
            "seed": _draft(tmp, "seed", SEED)}


def _launched(spec: LaunchSpec, marker: str, level: str = "all") -> Verdict:
    """One gate run on the launched server, then nothing of it may be alive."""
    old = os.environ.get(MARKER_ENV)
    os.environ[MARKER_ENV] = marker
    try:
        v = run_gate(CONTRACT, level=level, launch=spec, timeout_s=600)
    finally:
        if old is None:
            os.environ.pop(MARKER_ENV, None)
        else:
            os.environ[MARKER_ENV] = old
    assert gone(marker, within_s=15), describe(marked_alive(marker))
    return v


@pytest.fixture(scope="module")
def shift(drafts: dict[str, Path]) -> Verdict:
    return _launched(_spec(drafts["shift"]), f"live-shift-{os.getpid()}")


def test_healthy_drafter_passes_on_the_launched_server(drafts: dict[str, Path], tmp_path: Path) -> None:
    """The CLI as a user runs it: ``specparity gate --launch -- <command>``; exit 0, the server's own acceptance."""
    marker = f"live-healthy-{os.getpid()}"
    report = tmp_path / "r.json"
    words = ["bash", "-c", f"exec {sys.executable} -m specparity.cli gate --contract {CONTRACT} --json {report} "
             f"--launch -- {_text(drafts['healthy'])}"]
    run = subprocess.run(words, cwd=REPO, env={**os.environ, MARKER_ENV: marker}, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert gone(marker, within_s=15), describe(marked_alive(marker))
    d = json.loads(report.read_text())
    assert d["verdict"] == "pass" and d["served_layout"] == ["layer:1", "layer:3", "layer:5"]
    live = d["live"]
    assert live["mode"] == "launched" and live["url"].startswith("http://127.0.0.1:")
    # exactly vLLM's own hook switches and the port were added; the user's own words all ran
    assert live["added_flags"][:2] == ["--worker-extension-cls", "specparity.serving.vllm.tap.TapWorkerExtension"]
    assert live["added_env"]["VLLM_SERVER_DEV_MODE"] == "1"
    for word in ("--seed", "42", "--gpu_memory_utilization", "0.8", "-tp"):
        assert word in live["command"]
    loop = d["outcome"]["engine_loop"]
    # the acceptance the server's own counters moved by over the probes' prompts (vllm:spec_decode_*)
    assert loop["engine"] == "vllm" and loop["drafts"] > 0 and loop["prompts"] == "assistant_start"
    assert loop["per_position"][0] > 0.5, loop
    assert "Server: launched from the command" in run.stdout


def test_the_one_layer_shift_is_named_with_its_fix(shift: Verdict) -> None:
    assert shift.status == "fail" and shift.engine == "vllm"
    kinds = {f.kind for f in shift.errors}
    assert {FindingKind.OFF_BY_ONE, FindingKind.ENGINE_CONVENTION_MISMATCH} <= kinds
    assert shift.served_layout == ["layer:0", "layer:2", "layer:4"]
    assert shift.fix is not None and list(shift.fix.json_patch) == [
        {"op": "replace", "path": "/eagle_config/eagle_aux_hidden_state_layer_ids", "value": HEALTHY}]
    assert shift.outcome is not None and shift.outcome.diagnosis == "wiring"
    assert shift.live is not None and shift.live["mode"] == "launched"


def test_the_seeds_wiring_is_named_at_tp2(drafts: dict[str, Path]) -> None:
    v = _launched(_spec(drafts["seed"], tp=2), f"live-seed-{os.getpid()}", level="capture")
    assert v.status == "fail"
    assert FindingKind.EXTRA_EMBEDDING in {f.kind for f in v.errors}
    assert v.served_layout == ["embedding", "layer:1", "layer:3"]
    # both ranks reported through the server's own collective_rpc
    assert v.layout["tensor_parallel_size"] == 2 and v.layout["ranks_reported"] == [0, 1]


@pytest.fixture(scope="module")
def attached_server(drafts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The shift served by a server the test starts itself, with `specparity launch-flags --engine vllm`'s switches."""
    flags = json.loads(subprocess.run([sys.executable, "-m", "specparity.cli", "launch-flags", "--engine", "vllm",
                                       "--json"], capture_output=True, text=True, check=True).stdout)
    yield from _serve(_text(drafts["shift"]), flags["flags"], flags["env"], tmp_path_factory.mktemp("attach"))


def _serve(text: str, flags: list[str], env: dict[str, str], tmp: Path) -> Iterator[str]:
    spec = read_launch(text, source="--launch", cwd=REPO)
    port = free_port()
    argv = [sys.executable, *spec.program[1:], *spec.args, *flags, "--port", str(port)]
    with LaunchedServer(argv, {**spec.env, **env}, f"http://127.0.0.1:{port}", cwd=str(REPO),
                        log=tmp / "server.log") as server:
        server.wait_healthy(600)
        yield server.url


def test_attached_server_gives_the_launched_verdict(attached_server: str, shift: Verdict) -> None:
    v = run_gate(CONTRACT, server=attached_server, engine="vllm", python=sys.executable, timeout_s=600)
    assert v.status == shift.status == "fail"
    assert {f.kind for f in v.errors} >= {FindingKind.OFF_BY_ONE, FindingKind.ENGINE_CONVENTION_MISMATCH}
    assert v.served_layout == shift.served_layout
    assert v.fix is not None and shift.fix is not None and v.fix.json_patch == shift.fix.json_patch
    assert v.live is not None and v.live["mode"] == "attached"
    assert v.outcome is not None and v.outcome.engine_loop is not None and v.outcome.engine_loop["drafts"] > 0
    static = run_gate(CONTRACT, server=attached_server, engine="vllm", python=sys.executable, level="static")
    assert static.status == "fail" and static.served_layout == shift.served_layout


def test_a_server_without_the_hooks_refuses_the_capture_by_name(drafts: dict[str, Path],
                                                                 tmp_path: Path) -> None:
    """Dev mode on, the tap not: the static level runs on what /server_info says; the capture is exit 3 with the
    flags to add, never a pass or a mismatch."""
    for url in _serve(_text(drafts["healthy"]), [], {"VLLM_SERVER_DEV_MODE": "1"}, tmp_path):
        static = run_gate(CONTRACT, server=url, engine="vllm", python=sys.executable, level="static")
        assert static.status == "pass", [str(f) for f in static.errors]
        v = run_gate(CONTRACT, server=url, engine="vllm", python=sys.executable, level="capture")
        assert v.exit_code == 3
        msg = " ".join(f.message for f in v.errors)
        assert "--worker-extension-cls specparity.serving.vllm.tap.TapWorkerExtension" in msg, msg


def test_pytest_parity_against_the_running_server(attached_server: str, pytester: pytest.Pytester) -> None:
    """``pytest -m parity`` with a ``server`` key: the same verdict, item by item, read from the running server."""
    pytester.makepyprojecttoml(f"""
        [tool.specparity.deployments.staging]
        contract = "{CONTRACT}"
        server = "{attached_server}"
        python = "{sys.executable}"
    """)
    result = pytester.runpytest_subprocess("-m", "parity", "-p", "no:cacheprovider", "-ra")
    result.stdout.fnmatch_lines(["*error   off_by_one: chunk 0: served layer:0, expected layer:1*"])
    result.stdout.fnmatch_lines(["FAILED parity::staging::static - FAIL *", "FAILED parity::staging::capture[[]probe-0[]]*",
                                 "FAILED parity::staging::outcome - FAIL *"])
    result.assert_outcomes(failed=6)
    assert result.ret == 1
