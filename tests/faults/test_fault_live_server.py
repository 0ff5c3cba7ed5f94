"""The gate killed while the server it launched is up (``specparity gate --launch-file CMD``, serving/live/capture.py): SGLang's
own server from its published EAGLE-3 command made to run on this CPU (tests/launch_commands/sglang/
cpu_docs_eagle3.sh, as tests/serving/test_sglang_live_server.py runs it), the bundled models in for the published
ones. The gate waits at ``server_up`` (the server answers its health check, the capture through it is next) and is
sent SIGKILL: no handler of the gate runs, so the server's whole process tree and the evidence directory are the
reaper's watchdog's to stop and remove (SIGTERM at the same moment unwinds through ``capture_launched``'s ``finally``,
which tests/unit/test_server_lifecycle.py covers on a stand-in server). One server start: 25-90 s on 2 cores.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
from tests.faults.fault_runs import (
    CONTRACT,
    DRAFT,
    ROOT,
    TARGET,
    Run,
    contract_files,
    expected_code,
    report_paths,
)

pytestmark = [pytest.mark.faults, pytest.mark.sglang, pytest.mark.slow]

COMMAND = ROOT / "tests" / "launch_commands" / "sglang" / "cpu_docs_eagle3.sh"
PUBLISHED = {"meta-llama/Meta-Llama-3.1-8B-Instruct": str(TARGET),
             "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B": str(DRAFT),
             # the contract's serving block (num_steps 3, eagle_topk 1, num_draft_tokens 4)
             "--speculative-eagle-topk 4": "--speculative-eagle-topk 1",
             "--speculative-num-draft-tokens 16": "--speculative-num-draft-tokens 4"}


def test_sigkill_while_the_launched_server_is_up_leaves_nothing(tmp_path: Path) -> None:
    text = COMMAND.read_text()
    for old, new in PUBLISHED.items():
        assert old in text, old
        text = text.replace(old, new)
    cmd = tmp_path / "cmd.sh"
    cmd.write_text(text)
    reports = tmp_path / "reports"
    run = Run(tmp_path / "run", ["-m", "specparity.cli", "gate", "--contract", str(CONTRACT), "--level", "capture",
                                 "--python", sys.executable, "--launch-file", str(cmd), "--timeout", "600",
                                 "--json", str(reports / "r.json"), "--html", str(reports / "r.html"),
                                 "--junit", str(reports / "j.xml")],
              name="live-server-killed", pause_at="server_up", reports=report_paths(reports),
              inputs=[*contract_files(CONTRACT), TARGET, DRAFT, cmd]).start()
    took = run.wait_point(within_s=400)
    server = [g for g in run.groups if g != run.proc.pid]  # type: ignore[union-attr]
    assert server, f"no process group of the server was seen\n{run.output()}"
    run.signal(signal.SIGKILL)
    code = run.wait()
    print(f"launched server up after {took:.1f} s; the gate SIGKILLed: exit {code}")
    assert code == expected_code(signal.SIGKILL)
    run.check_clean()
    run.check_reports(code)


def test_sigkill_while_an_attached_server_is_armed_leaves_it_disarmed(tmp_path: Path) -> None:
    """``specparity gate --server URL`` on a running SGLang server (started here with launch-flags' switches), killed
    with SIGKILL while the hooks are armed: the server keeps serving, ARMED and the run's records are gone (the
    watchdog removes them; the hooks' lease would end with the gate too), and a later request records nothing."""
    import json
    import os
    import subprocess
    import time

    from specparity.deploy_command import read_launch
    from specparity.serving.live.server import LaunchedServer, ServerClient, free_port
    from specparity.serving.sglang import live, live_wire

    evidence = tmp_path / "evidence"
    printed = json.loads(subprocess.run(
        [sys.executable, "-m", "specparity.cli", "launch-flags", "--engine", "sglang", "--evidence-dir", str(evidence),
         "--cpu", "--json"], capture_output=True, text=True, check=True, cwd=ROOT).stdout)
    text = COMMAND.read_text()
    for old, new in PUBLISHED.items():
        text = text.replace(old, new)
    command = read_launch(text, source="--launch", cwd=ROOT)
    port = free_port()
    argv = [sys.executable, *command.program[1:], *command.args, *printed["flags"], "--host", "127.0.0.1",
            "--port", str(port)]
    with LaunchedServer(argv, {**command.env, **printed["env"]}, f"http://127.0.0.1:{port}", cwd=str(ROOT),
                        log=tmp_path / "server.log") as server:
        server.wait_healthy(600)
        run = Run(tmp_path / "run", ["-m", "specparity.cli", "gate", "--contract", str(CONTRACT), "--level",
                                     "capture", "--server", server.url, "--timeout", "600"],
                  name="attached-armed-killed", pause_at="armed", inputs=[*contract_files(CONTRACT)],
                  env={"XDG_STATE_HOME": os.environ.get("XDG_STATE_HOME")}).start()
        took = run.wait_point(within_s=300)
        assert (evidence / live_wire.ARMED).exists()
        run.signal(signal.SIGKILL)
        code = run.wait()
        end = time.monotonic() + 30
        while (evidence / live_wire.ARMED).exists() and time.monotonic() < end:
            time.sleep(0.2)
        print(f"attached gate armed after {took:.1f} s; SIGKILL: exit {code}; ARMED gone "
              f"{not (evidence / live_wire.ARMED).exists()}")
        assert code == expected_code(signal.SIGKILL)
        assert not (evidence / live_wire.ARMED).exists()
        assert not (evidence / live_wire.RECORDS).exists() or not any((evidence / live_wire.RECORDS).iterdir())
        with ServerClient(server.url, timeout_s=120) as client:
            assert client.healthy("/health")
            client.post_json("/generate", {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 1,
                                                                                         "temperature": 0}})
        assert live.read_records(evidence) == []  # disarmed: nothing of later traffic is recorded
        run.check_clean()
