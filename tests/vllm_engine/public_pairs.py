"""Real public drafter/target config pairs under ``explain --engine vllm``.

The pairs (provenance: tests/serving/configs/public/README.md, section "The vLLM sweep"):

- every SpecForge drafter paired with its public target (SOURCES.json ``pairs``, verbatim: 19);
- every public target no SpecForge drafter is paired with, under a SpecForge-style drafter of its width holding
  SpecForge's default ids ``[1, L//2-1, L-4]`` nested, as SpecForge writes them (11);
- the draft-config shapes vLLM's own PRs and issues report, each on the Llama-3.3-70B pair (SpecForge's
  ``llama3-70B-ealge3.json``, one field changed as the case names it): ``eagle_config`` without the key
  (vllm-project/vllm#50170: nvidia/Llama-3.3-70B-Instruct-Eagle3), the key ``null`` and ``[]``, the ids at a level
  vLLM never reads (``transformer_layer_config``, speculators' nested layer config), and speculators' own form
  (top-level ids, the case vLLM reads as written).

:func:`explain_in_process` runs the vLLM worker's own ``main`` in this interpreter (the child's code without the
process: one vLLM import for the whole sweep) and explains its result as ``specparity explain`` does;
:func:`vllm_reading` is vLLM's own reader on the same directories. ``python tests/vllm_engine/public_pairs.py`` in a
vLLM env prints the sweep's table.
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.public_drafts import specforge_style_draft

PUBLIC = Path(__file__).resolve().parents[1] / "serving" / "configs" / "public"
SOURCES: dict[str, Any] = json.loads((PUBLIC / "SOURCES.json").read_text())
LLAMA70 = ("meta-llama--Llama-3.3-70B-Instruct.json", "llama3-70B-ealge3.json")
IDS = "eagle_aux_hidden_state_layer_ids"


@dataclass(frozen=True)
class Pair:
    name: str
    target: str  # file under configs/public/targets
    draft: dict[str, Any]
    origin: str  # "specforge", "specforge_style", "shape"


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    return dict(cfg.get("text_config") or cfg)


def _draft(name: str) -> dict[str, Any]:
    return dict(json.loads((PUBLIC / "drafts" / name).read_text()))


def pairs() -> list[Pair]:
    out = [Pair(p["draft"].removesuffix(".json"), p["target"], _draft(p["draft"]), "specforge")
           for p in SOURCES["pairs"]]
    paired = {p["target"] for p in SOURCES["pairs"]}
    for target in sorted(set(SOURCES["targets"]) - paired):
        text = text_config(json.loads((PUBLIC / "targets" / target).read_text()))
        n = int(text["num_hidden_layers"])
        draft = specforge_style_draft(int(text["hidden_size"]), int(text.get("vocab_size") or 32000),
                                      [1, n // 2 - 1, n - 4])
        out.append(Pair(f"{target.removesuffix('.json')}+specforge-style", target, draft, "specforge_style"))
    base = _draft(LLAMA70[1])
    shapes: dict[str, dict[str, Any]] = {
        "eagle_config-without-key": {"eagle_config": {"use_aux_hidden_state": True}},
        "ids-null": {"eagle_config": {IDS: None, "use_aux_hidden_state": True}},
        "ids-empty": {"eagle_config": {IDS: [], "use_aux_hidden_state": True}},
        "ids-at-wrong-level": {"transformer_layer_config": {IDS: [2, 40, 77]}},
        "speculators-top-level": {IDS: [2, 40, 77]},
    }
    for name, edit in shapes.items():
        draft = copy.deepcopy(base)
        draft.update(edit)
        out.append(Pair(f"llama3-70B+{name}", LLAMA70[0], draft, "shape"))
    return out


def deployment(root: Path, pair: Pair) -> tuple[Path, Path]:
    target, draft = root / "target", root / "draft"
    target.mkdir(parents=True)
    draft.mkdir(parents=True)
    shutil.copy(PUBLIC / "targets" / pair.target, target / "config.json")
    (draft / "config.json").write_text(json.dumps(pair.draft))
    return target, draft


@contextmanager
def fresh_environment() -> Iterator[None]:
    """os.environ as it was, after: a child starts from the gate's environment, but in one interpreter what one
    resolution writes stays for the next (the worker's SPECPARITY_VLLM_TAP, vLLM's VLLM_USE_V1 choice of engine:
    0.11.0 envs.set_vllm_use_v1; the child's own TMPDIR, serving/child/scratch.py, with tempfile's cached choice of it)."""
    import os

    saved, saved_tempdir = dict(os.environ), tempfile.tempdir
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        tempfile.tempdir = saved_tempdir


def explain_in_process(target: Path, draft: Path, *, engine_args: dict[str, object] | None = None) -> Any:
    """``specparity explain --engine vllm``'s answer, with the worker's ``main`` run in this interpreter."""
    from specparity.serving.child.run import make_request
    from specparity.serving.child.transport import read_result
    from specparity.serving.results import ResolvedDeployment, ServingFailure
    from specparity.serving.vllm import worker
    from specparity.serving.vllm.explain import explain_vllm_failure, explain_vllm_resolved

    request = make_request("resolve", target, draft, server_args=engine_args, device="cpu")
    assert not isinstance(request, ServingFailure), request
    with tempfile.TemporaryDirectory() as tmp, fresh_environment():
        (Path(tmp) / "request.json").write_text(json.dumps(request.to_dict()))
        worker.main([str(Path(tmp) / "request.json"), str(Path(tmp) / "out")])
        outcome = read_result(Path(tmp) / "out")
    assert outcome is not None
    dep = outcome.deployment
    cfg = json.loads((draft / "config.json").read_text())
    if isinstance(dep, ResolvedDeployment):
        return explain_vllm_resolved(dep, cfg)
    return explain_vllm_failure(outcome.failures[0])


def vllm_reading(target: Path, draft: Path) -> tuple[int, ...]:
    """The boundaries vLLM itself captures for the deployment: its own reader on the config it parses, else its
    own default function (``get_eagle3_default_aux_hidden_state_layers`` where the release has it)."""
    from specparity.serving.vllm.versions import select_cpu_platform, static_platform_stand_in

    select_cpu_platform("cpu")  # a CUDA-only build (0.33, 0.34) on this CPU
    from vllm.engine.arg_utils import EngineArgs

    with static_platform_stand_in("cpu"), fresh_environment():  # 0.34's CPU platform asks for triton-cpu first
        cfg = EngineArgs(model=str(target), max_model_len=256, enforce_eager=True, speculative_config={
            "method": "eagle3", "model": str(draft), "num_speculative_tokens": 3}).create_engine_config()
    try:  # the V1 model runner's reader (0.11.1-0.33)
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:  # 0.34: the V2 runner's
        from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config

        read = get_eagle3_aux_layers_from_config(cfg.speculative_config)
    else:
        reader = getattr(GPUModelRunner, "_get_eagle3_aux_layers_from_config", None)
        if reader is None:  # 0.8.5-0.11.0: no reader; load_model sets the target's own default, whatever the draft
            import inspect

            assert "self.model.get_eagle3_aux_hidden_state_layers()" in inspect.getsource(GPUModelRunner.load_model)
            read = None
        else:

            class Runner:
                speculative_config = cfg.speculative_config

            read = reader(Runner())
    if read:
        return tuple(sorted(set(int(b) for b in read)))
    from specparity.serving.vllm.deployment import total_layers

    n = total_layers(cfg.model_config)
    return tuple(sorted({2, n // 2, n - 3}))


def sweep() -> Iterator[tuple[Pair, Any]]:
    for pair in pairs():
        with tempfile.TemporaryDirectory() as tmp:
            target, draft = deployment(Path(tmp), pair)
            yield pair, explain_in_process(target, draft)


if __name__ == "__main__":
    from specparity.cli_command import explain_exit

    for pair, e in sweep():
        strict, _ = explain_exit(e.exit_code, e.summary, [], e.data, strict=True)
        kinds = ",".join(str(n["kind"]) + (f"[{n.get('shape')}]" if n.get("shape") else "")
                         for n in e.data.get("adapter_notes") or [])
        print(f"{pair.name:<58} exit {e.exit_code} strict {strict}  {kinds or '-'}  {e.summary[:150]}")
        sys.stdout.flush()
