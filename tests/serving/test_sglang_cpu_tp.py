"""Can SGLang serve TP=2 on CPU? Answered by a run of SGLang's own code, pinned as a refusal.

SGLang 0.5.23's CPU engine builds its TP group with ``use_pynccl=None`` (distributed/parallel_state.py:2686-2695),
which means PyNccl on every in-tree platform (:2181-2185; only out-of-tree platforms may say they lack it), and its
CPU platform is in-tree (platforms/device_mixin.py:151-153): a world of two creates ``PyNcclCommunicator``
(:463-464), which asks for a CUDA device. Its CPU all-reduce (:695-699, shared memory or gloo) is never reached.
So specparity's SGLang capture stays one rank on CPU. The day SGLang builds the groups on CPU this test fails,
saying so: then TP=2 capture on SGLang can be wired (docs/real-classes.md).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

pytestmark = [pytest.mark.sglang, pytest.mark.usefixtures("sglang_required")]
SGLANG = version("sglang")
SCRIPT = Path(__file__).parent / "data" / "sglang_cpu_tp2.py"
TARGET = Path(__file__).resolve().parents[2] / "fixtures" / "default" / "target"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(SGLANG != "0.5.23", reason="runtime_context.publish, which places a rank, is 0.5.23's API")
def test_sglang_tp2_on_cpu_is_refused_by_pynccl_at_group_init(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), str(_free_port()), str(TARGET), str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    ranks = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert sorted(r["rank"] for r in ranks) == [0, 1], (proc.stdout, proc.stderr[-2000:])
    if all(r["ok"] for r in ranks):
        pytest.fail(f"sglang {SGLANG} now builds a TP=2 group on CPU: wire SGLang's capture at TP>1 "
                    "(docs/real-classes.md) and turn this test into its capture test")
    for r in ranks:
        assert not r["ok"] and "Expected a cuda device" in r["error"], r
        assert any(w.startswith("sglang/srt/distributed/parallel_state.py") for w in r["where"]), r
        assert any(w.startswith("sglang/srt/distributed/device_communicators/pynccl.py") for w in r["where"]), r
