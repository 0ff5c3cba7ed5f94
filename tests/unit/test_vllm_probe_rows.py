"""The probe's own rows in a batch vLLM shares with other clients' requests (other traffic).

The blobs are the tap's real recordings from a vLLM 0.32 server of the bundled pair (tests/unit/data/vllm_shared_batch,
recorded by scripts/record_vllm_shared_batch.py; the layer atlas left out): the contract's first probe alone, and the
same probe while three other clients streamed completions. Before, the gate took the leading fc calls by row count, so
another request's rows were judged as the probe's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load, load_file, save
from tests.resolved_deployments import tiny_deployment

from specparity.serving.results import CAPTURE_SHAPE, PROBE_NOT_ISOLATED
from specparity.serving.vllm.evidence import assemble_capture, locate, prefill_rows
from specparity.serving.vllm.ranks import RankEvidence

DATA = Path(__file__).parent / "data" / "vllm_shared_batch"
BUNDLE = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"


def _recorded(name: str) -> tuple[list[bytes], list[int], list[int]]:
    """(the calls as the tap sent them, the probe, the server's answer to it)."""
    from safetensors import safe_open

    path = DATA / f"{name}.safetensors"
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    calls = [save({k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith(f"call{i}/")})
             for i in range(int(meta["calls"]))]
    return calls, json.loads(meta["probe"]), json.loads(meta["output"])


class _Workers:
    """``collective_rpc`` answering with one rank's recorded calls, as vLLM's executor returns them."""

    def __init__(self, calls: list[bytes]) -> None:
        self.calls = calls

    def collective_rpc(self, method: str, kwargs: Any = None) -> list[dict[str, Any]]:
        calls, self.calls = self.calls, []
        return [{"rank": 0, "tp_rank": 0, "pp_rank": 0, "host": "h", "pid": 1, "ray_node_id": None,
                 "meta": {"rank": 0, "drafter": "EagleProposer", "aux_layers": [2, 4, 6], "num_layers": 8,
                          "fc": {"in_features": 192, "out_features": 64, "bias": False}}, "calls": calls}]


def _capture(calls: list[bytes], probe: list[int], output: list[int]) -> Any:
    evidence = RankEvidence(_Workers(calls))
    evidence.end_probe()
    dep = tiny_deployment(BUNDLE, engine_version="0.32.0", adapter="vllm-0.32",
                          layout={"ranks_expected": [0], "tensor_parallel_size": 1, "pipeline_parallel_size": 1})
    return assemble_capture(dep, evidence, [probe], atlas=False, loop={"outputs": [output]}, shared=True)


@pytest.fixture(scope="module")
def alone() -> torch.Tensor:
    calls, probe, output = _recorded("alone")
    where = locate(calls, probe, output)
    assert where is not None and where.why is None and where.others == 0
    assert len(where.parts) == 1 and where.verify  # the prefill, then its verify steps
    c, a, b = where.parts[0]
    return load(calls[c])["fc"][a:b]


def test_a_shared_batch_gives_the_probes_own_rows(alone: torch.Tensor) -> None:
    calls, probe, output = _recorded("shared")
    where = locate(calls, probe, output)
    assert where is not None and where.why is None
    assert where.others > 0  # the other clients' rows were there, and were counted
    result = _capture(calls, probe, output)
    assert result.failures == ()
    assert result.fc is not None and tuple(result.fc.per_sample[0].shape) == (len(probe), 192)
    torch.testing.assert_close(result.fc.per_sample[0], alone, rtol=1e-4, atol=1e-5)
    assert result.loop["other_request_rows"] == where.others
    # the rows the old rule took (the leading calls by row count) are not the probe's
    old = prefill_rows(calls, len(probe))[0]
    assert old.shape != alone.shape or not torch.allclose(old, alone, atol=1e-5)


def test_calls_without_token_ids_on_a_server_are_probe_not_isolated() -> None:
    """The same recording with the tap's batch facts taken out (a release whose drafter's propose the tap does not
    see): on a server they cannot be told from another client's rows, so exit 3 by name, never the old verdict on
    the leading rows."""
    calls, probe, _ = _recorded("shared")
    stripped = [save({k: v for k, v in load(b).items() if not k.startswith("tap/")}) for b in calls]
    result = _capture(stripped, probe, [])
    assert [f.kind for f in result.failures] == [PROBE_NOT_ISOLATED]
    assert CAPTURE_SHAPE not in [f.kind for f in result.failures]


def test_a_prompt_another_client_cached_is_probe_not_isolated() -> None:
    """A prefix cache hit, derived from the recording of the probe alone: its prefill call cut to the rows from
    position 32 on, as vLLM feeds fc when a prefix of 32 tokens comes from the cache (on this CPU a 77-token prompt
    fills no cache block, so the real server's hit could not be recorded with the bundled probe)."""
    calls, probe, output = _recorded("alone")
    t = load(calls[0])
    cut = {k: v for k, v in t.items() if k in ("fc", "tap/ids", "tap/positions")}
    cut = {k: v[32:] for k, v in cut.items()}
    cut["tap/qsl"] = torch.tensor([0, len(probe) - 32], dtype=torch.int64)
    hit = [save(cut), *calls[1:]]
    where = locate(hit, probe, output)
    assert where is not None and where.why is not None and "prefix cache" in where.why
    result = _capture(hit, probe, output)
    assert [f.kind for f in result.failures] == [PROBE_NOT_ISOLATED]
