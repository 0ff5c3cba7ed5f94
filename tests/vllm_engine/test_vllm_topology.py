"""The topology tier (``-m topology``): layouts beyond TP=2 on vLLM's real engine (CPU).

Not in the default CI run (the dense TP=2 and the MoE class at TP=2 with expert parallelism are:
test_vllm_gate.py, test_vllm_real_class.py). Run it in the vLLM env:

    .tox/vllm-0.32/bin/python -m pytest -p no:cacheprovider -m topology tests/vllm_engine     (make test-topology)

- Two Ray nodes on one machine (ray_cluster.py: a head and a second node on loopback, each with its own temporary
  directory), served with vLLM's Ray executor at TP=2. vLLM 0.32's CPU platform names no Ray device, so its Ray
  executor refuses before any worker starts (v1/executor/ray_utils.py:574): exit 3 with that call named, the
  layout in the report, and no Ray process left behind. Where a vLLM can place Ray workers (a GPU machine) the
  verdict must be the TP=1 one with both nodes' ranks reported.
- PP=2 and TP=2 x PP=2: vLLM's own crash on its CPU worker, named from the worker (exit 1), the layout shown.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ray_cluster import two_nodes
from vllm_helpers import BUNDLE, CONTRACT

from specparity.compare.findings import FindingKind
from specparity.gate import run_gate
from specparity.report import render_text
from specparity.verdict import Verdict

pytestmark = [pytest.mark.vllm, pytest.mark.topology]


def _gate(python: str, **engine_args: object) -> Verdict:
    return run_gate(CONTRACT, BUNDLE / "target", BUNDLE / "draft", level="capture", engine="vllm",
                    engine_args=engine_args, python=python, timeout_s=600)


def test_two_ray_nodes_serve_or_name_vllms_refusal_and_leave_no_ray_process(
        vllm_python: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with two_nodes() as cluster:
        assert cluster.alive_nodes == 2, "the Ray cluster never showed two alive nodes"
        assert cluster.dirs[0] != cluster.dirs[1] and not Path(cluster.dirs[0]).is_relative_to(cluster.dirs[1])
        monkeypatch.setenv("RAY_ADDRESS", cluster.address)  # vLLM's ray.init(address=None) joins it
        v = _gate(vllm_python, tensor_parallel_size=2, distributed_executor_backend="ray")
    assert cluster.orphans == [], cluster.orphans
    assert v.layout["executor"] == "ray" and v.layout["tensor_parallel_size"] == 2, v.layout
    if v.status != "error":  # a vLLM that places Ray workers here: the TP=1 verdict, every rank from both nodes
        assert FindingKind.OFF_BY_ONE in {f.kind for f in v.errors}, [str(f) for f in v.errors]
        assert v.layout["ranks_reported"] == [0, 1] and v.layout["nodes"] == 2, v.layout
        return
    assert v.exit_code == 3, [str(f) for f in v.errors]
    [f] = [f for f in v.errors if f.details.get("machine_limit")]
    assert "current platform cpu does not support ray" in f.message and "ray_utils.py:574" in f.message, f.message
    assert "ray_device_key" in str(f.details["machine_limit"])
    assert v.layout["ranks_expected"] == [0, 1] and v.layout["ranks_reported"] is None
    text = render_text(v)
    assert "Layout: vllm (ray) TP=2 PP=1" in text and "none of 0, 1" in text, text


@pytest.mark.parametrize("tp", [1, 2], ids=["pp2", "tp2xpp2"])
def test_pipeline_stages_meet_vllms_own_crash_named_from_its_worker(vllm_python: str, tp: int) -> None:
    """PP=2 (and TP=2 x PP=2, four workers on this machine's cores): vLLM builds the drafter only on the last
    pipeline stage (v1/worker/gpu_model_runner.py:590) and then asserts it on every stage while it sets up attention
    (:6866-6880): a first-stage worker raises AttributeError and the front end says only "Engine core
    initialization failed". The report leads with the worker's own exception (serving/vllm/root_cause.py) and, since
    vLLM's code raised on this deployment, it is exit 1, not a machine's failure. The layout names the world."""
    v = _gate(vllm_python, tensor_parallel_size=tp, pipeline_parallel_size=2)
    assert (v.status, v.exit_code) == ("fail", 1), [str(f) for f in v.errors]
    [f] = [f for f in v.errors if f.kind is FindingKind.ENGINE_ERROR]
    # which generic error vLLM's front end raises first varies with timing ("Engine core initialization failed", or
    # "Worker failed with error '...'"); either way the worker's exception is in the finding and decides the exit
    assert "'CPUModelRunner' object has no attribute 'drafter'" in f.message, f.message
    assert f.details["cause"] == "deployment"
    assert (v.layout["pipeline_parallel_size"], v.layout["tensor_parallel_size"]) == (2, tp), v.layout
    assert v.layout["ranks_expected"] == list(range(2 * tp)) and v.layout["ranks_reported"] is None
