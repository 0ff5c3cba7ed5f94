"""SGLang 0.5.23 (in-process, CPU) gating the real pretrained target and its trained drafter.

The seed incident on a model nobody here wrote: the drafter served as trained passes at every level, with its
acceptance; every chunk one layer late and the embedding in chunk 0 fail, named, with the acceptance drop the
outcome level measures on the fc input SGLang really served. fp32 and bf16 serving. One gate run per
scenario, shared by the module's tests.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from specparity.compare.findings import FindingKind
from specparity.gate import run_gate
from specparity.realmodel.fetch import RealModel
from specparity.realmodel.scenarios import CONTRACT, DRAFT, SGLANG, TRAINED_IDS, draft_for
from specparity.verdict import Verdict

pytestmark = [pytest.mark.real_model, pytest.mark.sglang, pytest.mark.slow]
BY_KEY = {s.key: s for s in SGLANG}
EXPECTED = [f"layer:{i}" for i in TRAINED_IDS]


@pytest.fixture(scope="module")
def verdicts(real_model: RealModel, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Verdict]:
    work = tmp_path_factory.mktemp("real-sglang")
    runs = {f"{s.key}-fp32": (s, "fp32") for s in SGLANG} | {"healthy-bf16": (BY_KEY["healthy"], "bf16"),
                                                                "embedding-bf16": (BY_KEY["embedding"], "bf16")}

    def one(s_dtype: tuple[object, str]) -> Verdict:
        s, dtype = s_dtype
        # served in bf16: the bf16 checkpoint, and SGLang told so (its CPU capture defaults to float32)
        args = {"dtype": "bfloat16"} if dtype == "bf16" else {}
        return run_gate(CONTRACT, real_model.dir(dtype), draft_for(s, work), level="all",  # type: ignore[arg-type]
                        engine_args=args, timeout_s=900)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(runs, pool.map(one, runs.values()), strict=True))


def _kinds(v: Verdict) -> set[FindingKind]:
    return {f.kind for f in v.errors}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_drafter_as_trained_passes_with_its_acceptance(verdicts: dict[str, Verdict], dtype: str) -> None:
    v = verdicts[f"healthy-{dtype}"]
    assert v.status == "pass", [f.message for f in v.errors]
    assert list(v.served_layout or []) == EXPECTED
    assert v.outcome is not None and v.outcome.diagnosis == "healthy"
    # a drafter that learned something real: acceptance far above chance on the held-out probes, and the
    # served input (SGLang's own capture) gives the recorded input's acceptance within its interval
    rec, srv = v.outcome.recorded_acceptance[0], v.outcome.served_acceptance[0]
    assert rec > 0.3, rec
    lo, hi = v.outcome.served_interval or (0.0, 1.0)
    assert lo <= rec <= hi or abs(rec - srv) < 0.05, (rec, srv, lo, hi)
    # identity is decided scale-free at this model's massive activations: each chunk is its own layer
    assert len(v.chunks) == 3
    for c in v.chunks:
        assert c.served == c.expected and c.separation is not None


def test_every_chunk_one_layer_late_is_named_with_what_it_costs(verdicts: dict[str, Verdict]) -> None:
    v = verdicts["late-fp32"]
    assert v.status == "fail"
    assert FindingKind.OFF_BY_ONE in _kinds(v)
    assert list(v.served_layout or []) == ["layer:2", "layer:15", "layer:27"]
    assert v.fix is not None and "[1, 14, 26]" in v.fix.summary
    # adjacent layers of this model sit at cosine 0.93-0.97: one layer late costs the drafter little here
    # (measured: 0.597 recorded, ~0.56 served); the capture level fails it all the same, and the outcome
    # level reports the measured figure rather than inventing a drop
    assert v.outcome is not None and v.outcome.scored_tokens and v.outcome.served_acceptance[0] > 0


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_seeds_wiring_embedding_in_chunk_0_is_named(verdicts: dict[str, Verdict], dtype: str) -> None:
    v = verdicts[f"embedding-{dtype}"]
    assert v.status == "fail"
    assert FindingKind.EXTRA_EMBEDDING in _kinds(v)
    assert list(v.served_layout or []) == ["embedding", "layer:1", "layer:14"]
    assert v.outcome is not None and v.outcome.diagnosis == "wiring"
    assert v.outcome.served_acceptance[0] < v.outcome.recorded_acceptance[0] - 0.1


def test_the_users_draft_is_not_modified(verdicts: dict[str, Verdict]) -> None:
    assert json.loads((DRAFT / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == \
        list(TRAINED_IDS)
    assert Path(verdicts["late-fp32"].draft_path or "") != DRAFT
