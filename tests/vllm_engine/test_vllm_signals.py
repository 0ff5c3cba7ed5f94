"""SIGINT and SIGTERM to a real ``specparity gate --engine vllm`` on vLLM's real engine (CPU), its worker forked warm
from a zygote: nothing of the run is left, and no report is written.

The fault tier (tests/faults/test_fault_signals.py) signals SGLang's runs at every point; vLLM's worker is a zygote
worker too (serving/vllm/worker.py ``warm``), and its engine starts processes of its own (vLLM's engine core, its
workers). Two runs, each on the tier's checks (tests/faults/fault_runs.py ``Run``): Ctrl-C while the zygote imports
vLLM, and SIGTERM while vLLM's engine is up and the tapped probes are about to run.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from tests.faults.fault_runs import Run, contract_files, expected_code, gate_argv, report_paths
from vllm_helpers import BUNDLE, CONTRACT

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.mark.parametrize(("point", "sig"), [("engine_import", signal.SIGINT), ("capture", signal.SIGTERM)])
def test_a_signalled_vllm_gate_leaves_nothing(tmp_path: Path, vllm_python: str, point: str,
                                              sig: signal.Signals) -> None:
    reports = tmp_path / "reports"
    argv = gate_argv(level="capture", reports=reports, contract=CONTRACT, target=BUNDLE / "target",
                     draft=BUNDLE / "draft", extra=["--engine", "vllm", "--python", vllm_python])
    run = Run(tmp_path / "run", argv, name=f"vllm-{point}-{sig.name}", warm=True, pause_at=point,
              reports=report_paths(reports),
              inputs=[*contract_files(CONTRACT), BUNDLE / "target", BUNDLE / "draft"])
    try:
        run.start()
        took = run.wait_point()
        # the process waiting at the point is the warm path's: the zygote (engine_import, in warm) or a job forked
        # from it (capture); a cold child would be `python -m specparity.serving.vllm.worker`
        [waiting] = run.reached()
        cmdline = Path(f"/proc/{waiting.name.rsplit('.', 1)[1]}/cmdline").read_bytes().split(b"\0")
        assert b"specparity.serving.child.zygote" in cmdline and b"specparity.serving.vllm.worker" in cmdline, cmdline
        run.signal(sig)
        code = run.wait()
        print(f"{point} reached after {took:.1f} s; exit {code}")
        assert code == expected_code(sig), run.output()
        assert f"specparity: interrupted by {sig.name}" in run.stderr, run.output()
        assert "Traceback" not in run.stderr, run.output()
        run.check_clean()
        run.check_reports(code)
    finally:
        run.kill()
