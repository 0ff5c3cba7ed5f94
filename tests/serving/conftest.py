"""Models for the real-SGLang serving tests, built once per session.

Base models: the bundled default (fixtures/default, L=8, H=64, draft ids [1,3,5]) once it exists,
else the reference builder (/work/shared/reference/sglang-cpu/make_models.py, same shape and ids).
Variants share the base target and copy the draft with only ``eagle_config`` changed, which is what
make_models.py produces for those ids (k stays 3, weights are identical).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from serving_probes import PROBES
from version_facts import require_sglang

from specparity.serving.cache import SessionCache

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "fixtures" / "default"
REFERENCE_BUILDER = Path("/work/shared/reference/sglang-cpu/make_models.py")
USE_BUNDLED = (BUNDLED / "target" / "config.json").is_file()  # flip to False to force the reference builder


@pytest.fixture(scope="session")
def sglang_required() -> None:
    """A real-SGLang test run where sglang cannot be imported fails loudly; it is never skipped.
    Envs without SGLang deselect these tests with ``-m "not sglang"`` instead (scripts/matrix.sh)."""
    require_sglang()


@pytest.fixture(scope="session")
def base_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory with ``target/`` and ``draft/`` (draft ids [1,3,5])."""
    if USE_BUNDLED:
        return BUNDLED
    out = tmp_path_factory.mktemp("models") / "ids_1_3_5"
    subprocess.run(
        [sys.executable, str(REFERENCE_BUILDER), str(out), "[1,3,5]"], check=True, capture_output=True
    )
    return out


def _draft_variant(base: Path, out: Path, edit: Callable[[dict[str, object]], None]) -> Path:
    shutil.copytree(base / "draft", out / "draft")
    cfg_path = out / "draft" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    edit(cfg)
    cfg_path.write_text(json.dumps(cfg, indent=1))
    (out / "target").symlink_to(base / "target", target_is_directory=True)
    return out


@pytest.fixture(scope="session")
def models(base_models: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name -> models dir: ids_1_3_5, ids_m1_1_3, no_eagle_config, ids_1_3_7, one_aux_fc_skipped, nan_target."""
    root = tmp_path_factory.mktemp("variants")

    def set_ids(ids: list[int]) -> Callable[[dict[str, object]], None]:
        def edit(cfg: dict[str, object]) -> None:
            ec = dict(cfg.get("eagle_config") or {})  # type: ignore[call-overload]
            ec["eagle_aux_hidden_state_layer_ids"] = ids
            cfg["eagle_config"] = ec

        return edit

    def drop_eagle_config(cfg: dict[str, object]) -> None:
        cfg.pop("eagle_config", None)

    out = {
        "ids_1_3_5": base_models,
        "ids_m1_1_3": _draft_variant(base_models, root / "ids_m1_1_3", set_ids([-1, 1, 3])),
        "no_eagle_config": _draft_variant(base_models, root / "no_eagle_config", drop_eagle_config),
        # id 7 = L-1 -> boundary 8 is never reached: 2 aux states for an fc sized for 3 (domain.md §3.2)
        "ids_1_3_7": _draft_variant(base_models, root / "ids_1_3_7", set_ids([1, 3, 7])),
        "one_aux_fc_skipped": _draft_variant(base_models, root / "one_aux_fc_skipped", set_ids([3])),
    }
    # k = 1 and H_t == H_d: fc is Linear(H, H); keep the first H input columns of the trained fc
    for f in (out["one_aux_fc_skipped"] / "draft").glob("*.safetensors"):
        weights = load_file(str(f))
        if "fc.weight" in weights:
            w = weights["fc.weight"]
            weights["fc.weight"] = w[:, : w.shape[0]].contiguous()
            save_file(weights, str(f), metadata={"format": "pt"})
    # A target with one NaN weight in decoder layer 2: layer:2 onwards is non-finite.
    nan = root / "nan_target"
    shutil.copytree(base_models / "target", nan / "target")
    (nan / "draft").symlink_to(base_models / "draft", target_is_directory=True)
    for f in (nan / "target").glob("*.safetensors"):
        weights = load_file(str(f))
        key = next((k for k in weights if k.endswith("layers.2.mlp.down_proj.weight")), None)
        if key is not None:
            weights[key] = weights[key].clone()
            weights[key][0, 0] = float("nan")
            save_file(weights, str(f), metadata={"format": "pt"})
            break
    else:
        raise AssertionError("no layers.2.mlp.down_proj.weight in the base target")
    out["nan_target"] = nan
    return out


@pytest.fixture(scope="session")
def serving_cache() -> SessionCache:
    """One cache per test session: each deployment's child runs once."""
    return SessionCache()


@pytest.fixture(scope="session")
def hf_hidden_states(base_models: Path) -> list[tuple[torch.Tensor, ...]]:
    """transformers forward of the base target per probe: ``output_hidden_states`` (L+1 entries of [T, H])."""
    from transformers import AutoModelForCausalLM

    # no dtype keyword: transformers 4.54.1 (the 0.4.10.post2 env) rejects ``dtype=``; the checkpoint is float32
    hf = AutoModelForCausalLM.from_pretrained(str(base_models / "target"))
    hf.eval()
    assert all(p.dtype == torch.float32 for p in hf.parameters()), {p.dtype for p in hf.parameters()}
    out = []
    with torch.no_grad():
        for p in PROBES:
            hs = hf(torch.tensor([p]), output_hidden_states=True).hidden_states
            out.append(tuple(h[0] for h in hs))
    return out
