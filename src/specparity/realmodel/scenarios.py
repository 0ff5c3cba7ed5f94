"""The real model's deployments: the drafter as trained, and the seed incident's miswirings of it.

One table shared by ``make demo-real``, the real-model test tier and the benchmarks. The committed drafter
(``fixtures/real/draft``) was trained by ``fixtures/real/make_real.py`` on SmolLM2-135M-Instruct's
``layer:1, layer:14, layer:26`` (SpecForge's default ids ``[1, 14, 26]`` for 30 layers). A miswired
deployment is a copy of that drafter whose ``eagle_config.eagle_aux_hidden_state_layer_ids`` the engine
reads differently; the user's files are never modified (copies go to a temporary folder).

SGLang reads id ``i`` as ``layer:i`` (its ``+1`` boundary rule; id ``-1`` serves the embedding on 0.5.22+).
vLLM reads id ``k`` as boundary ``k`` (``hidden_states[k]``, which is ``layer:k-1``), so the SpecForge export
as it is runs one layer early there, and the healthy vLLM deployment carries ids ``[2, 15, 27]``
(``specparity.idrules.vllm``).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specparity.contract.probes import ProbePack

REPO = Path(__file__).resolve().parents[3]
CONTRACT = REPO / "contracts" / "smollm2-135m-eagle3.json"
DRAFT = REPO / "fixtures" / "real" / "draft"
TRAINING = REPO / "fixtures" / "real" / "training.json"
TRAINED_IDS = (1, 14, 26)


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    engine: str  # "sglang" or "vllm"
    ids: tuple[int, ...] | None  # eagle ids written into the copy; None = the committed draft unchanged
    expect_status: str  # "pass" or "fail"
    expect_kinds: tuple[str, ...]  # finding kinds a fail must name


SGLANG = (
    Scenario("healthy", "the drafter served as trained (layer:1, 14, 26)", "sglang", None, "pass", ()),
    Scenario("late", "every chunk one layer late (ids [2, 15, 27])", "sglang", (2, 15, 27), "fail", ("off_by_one",)),
    Scenario("embedding", "the seed's wiring: the embedding in chunk 0, the rest shifted (ids [-1, 1, 14])",
             "sglang", (-1, 1, 14), "fail", ("extra_embedding",)),
)
VLLM_HEALTHY_IDS = (2, 15, 27)
VLLM = (
    Scenario("healthy", "the drafter with vLLM's ids for layer:1, 14, 26 ([2, 15, 27])", "vllm", VLLM_HEALTHY_IDS,
             "pass", ()),
    Scenario("as_exported", "the SpecForge export as it is: vLLM serves it one layer early", "vllm", None, "fail",
             ("off_by_one",)),
    Scenario("embedding", "the seed's wiring on vLLM: the embedding in chunk 0, the rest shifted (ids [0, 2, 15])",
             "vllm", (0, 2, 15), "fail", ("extra_embedding",)),
)


def loop_prompts(pack: ProbePack, n: int | None = None) -> list[list[int]]:
    """Each probe's prompt up to its first assistant token (the outcome level's own cut,
    ``serving.engine.outcome_request``): the target then writes the answer the drafter was trained to predict."""
    from specparity.serving.engine import outcome_request

    lengths = outcome_request(pack).prompt_lengths
    samples = pack.samples[:n] if n is not None else pack.samples
    return [[int(t) for t in s.input_ids[: lengths[i] or len(s.input_ids)]] for i, s in enumerate(samples)]


def draft_for(s: Scenario, work: Path, base: Path = DRAFT) -> Path:
    """The draft directory this scenario serves: ``base`` itself, or a copy with the scenario's ids."""
    if s.ids is None:
        return base
    out = work / f"draft-{s.engine}-{s.key}"
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(base, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.setdefault("eagle_config", {})["eagle_aux_hidden_state_layer_ids"] = list(s.ids)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out
