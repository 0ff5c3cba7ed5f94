"""Drafter families (specparity.drafters, deployed.py): DSpark capture and outcome levels are refused by name, exit 3;
an MLA EAGLE-3 head and a DFlash drafter reach the static level; their capture runs where the engine's CPU path can
try it (vLLM's), and is refused by name with the engine's own line where it cannot (SGLang's, in-process on a CPU);
their outcome level is refused by name, exit 3. A DFlash drafter is never explained or gated as a Llama-style EAGLE-3 head (it was explained on
SGLang's default three layers, exit 0)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specparity.deployed import check_family_algorithm, check_family_level, drafter_family, unmodelled_family
from specparity.drafters import DrafterFamily, family_of
from specparity.errors import EnvironmentProblem

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data" / "drafter_families"
DEFAULT = ROOT / "fixtures" / "default"
# z-lab/Qwen3-4B-DFlash-b16's fields (README.md in DATA)
DFLASH = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16,
          "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
          "hidden_size": 2560, "num_hidden_layers": 5, "num_target_layers": 36, "vocab_size": 151936}
# the fields of TorchSpec's kimi_k3_dspark_mla.json that name its family (README.md in DATA)
DSPARK = {"architectures": ["K3DSparkModel"], "model_type": "k3_dspark", "target_layer_ids": [7, 31, 47, 63, 87]}


def _load(name: str) -> dict[str, object]:
    cfg: dict[str, object] = json.loads((DATA / name).read_text())
    return cfg


def _draft(tmp: Path, cfg: dict[str, object]) -> Path:
    d = tmp / "draft"
    shutil.copytree(DEFAULT / "draft", d)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize(("cfg", "family"), [
    (_load("qwen3_8b_eagle3_mla.json"), DrafterFamily.EAGLE3_MLA),
    (_load("kimi_k25_eagle3_moe.json"), DrafterFamily.EAGLE3_MLA),
    (_load("qwen3_8b_dflash.json"), DrafterFamily.DFLASH),
    (DFLASH, DrafterFamily.DFLASH),
    (DSPARK, DrafterFamily.DSPARK),
    ({"architectures": ["DSparkDraftModel"], "dflash_config": {"projector_type": "dspark"}}, DrafterFamily.DSPARK),
])
def test_public_configs_have_their_family(cfg: dict[str, object], family: DrafterFamily) -> None:
    assert family_of(cfg) is family


def test_the_eagle3_heads_specparity_models_are_llama_style() -> None:
    for draft in (DEFAULT / "draft", ROOT / "fixtures" / "vllm" / "draft"):
        assert drafter_family(draft) is DrafterFamily.EAGLE3, draft
        assert unmodelled_family(draft) is None, draft


def test_no_family_is_unmodelled_now(tmp_path: Path) -> None:
    assert unmodelled_family(_draft(tmp_path / "a", DFLASH)) is None
    assert unmodelled_family(_draft(tmp_path / "b", _load("kimi_k25_eagle3_moe.json"))) is None
    assert unmodelled_family(_draft(tmp_path / "c", DSPARK)) is None  # static level and explain on both engines
    assert unmodelled_family(_draft(tmp_path / "d", _load("dspark_qwen3_8b_block7.json"))) is None


def test_dspark_capture_and_outcome_are_refused_by_name(tmp_path: Path) -> None:
    draft = _draft(tmp_path / "s", _load("dspark_qwen3_8b_block7.json"))
    check_family_level(draft, "static", engine="sglang")
    check_family_level(draft, "static", engine="vllm")
    for engine, level, device, line in [("sglang", "capture", "cpu", "speculative_hook.py:668-672"),
                                        ("vllm", "capture", "cuda", "spec_decode/__init__.py:45-50"),
                                        ("sglang", "outcome", "cuda", "Llama-style EAGLE-3 head only")]:
        with pytest.raises(EnvironmentProblem, match="DSpark") as info:
            check_family_level(draft, level, engine=engine, device=device)
        assert line in str(info.value), info.value
    check_family_level(draft, "capture", engine="sglang", device="cuda")  # on the deployment's GPU: attempted
    with pytest.raises(EnvironmentProblem, match="DSpark"):
        check_family_algorithm(draft, {"speculative_algorithm": "DFLASH"})
    with pytest.raises(EnvironmentProblem, match="DFlash"):
        check_family_algorithm(_draft(tmp_path / "f", DFLASH), {"speculative_config": {"method": "dspark"}})
    check_family_algorithm(draft, {"speculative_algorithm": "DSPARK"})


@pytest.mark.parametrize(("cfg", "sglang_line"), [
    (DFLASH, "arg_groups/speculative_hook.py:287-300"),
    (_load("kimi_k25_eagle3_moe.json"), "models/kimi_k25_eagle3.py:414-415"),
], ids=["dflash", "eagle3-mla"])
def test_which_levels_run_for_each_family_and_where(tmp_path: Path, cfg: dict[str, object], sglang_line: str) -> None:
    """Static always; the outcome level never (ours, named); the capture wherever the engine's own CPU path can try:
    vLLM's (a DFlash capture runs; an MLA head gets vLLM's own refusal, test_vllm_family_capture.py), never SGLang's
    in-process CPU capture, refused by name with SGLang's line; a GPU or the user's own server goes on."""
    draft = _draft(tmp_path, cfg)
    for engine in ("sglang", "vllm"):
        check_family_level(draft, "static", engine=engine)
        for level in ("outcome", "all"):
            with pytest.raises(EnvironmentProblem, match=r"outcome evidence .* Llama-style EAGLE-3 head only"):
                check_family_level(draft, level, engine=engine, device="cuda", live=True)
    check_family_level(draft, "capture", engine="vllm")
    with pytest.raises(EnvironmentProblem, match="the capture level cannot run for it here") as e:
        check_family_level(draft, "capture", engine="sglang")
    assert sglang_line in str(e.value) and e.value.exit_code == 3
    check_family_level(draft, "capture", engine="sglang", device="cuda")
    check_family_level(draft, "capture", engine="sglang", live=True)


def test_a_dflash_drafter_under_an_eagle_algorithm_is_refused(tmp_path: Path) -> None:
    draft = _draft(tmp_path, DFLASH)
    check_family_algorithm(draft, {})
    check_family_algorithm(draft, {"speculative_algorithm": "DFLASH"})
    check_family_algorithm(draft, {"speculative_config": {"method": "dflash"}})
    for args in ({"speculative_algorithm": "EAGLE3"}, {"speculative_config": {"method": "eagle3"}}):
        with pytest.raises(EnvironmentProblem, match="does not model what the engine makes of that pair"):
            check_family_algorithm(draft, args)
    with pytest.raises(EnvironmentProblem):
        check_family_algorithm(_draft(tmp_path / "e", _load("kimi_k25_eagle3_moe.json")),
                               {"speculative_algorithm": "DFLASH"})


def test_gate_refuses_dspark_and_dflash_captures_by_name_exit_3(tmp_path: Path) -> None:
    runs = [(["gate", "--contract", str(ROOT / "contracts" / "tiny-llama-eagle3.json")], _draft(tmp_path / "s", DSPARK),
             "DSpark"),
            (["gate", "--contract", str(ROOT / "contracts" / "tiny-llama-eagle3.json")], _draft(tmp_path / "d", DFLASH),
             "DFlash")]
    for words, draft, named in runs:
        run = subprocess.run([sys.executable, "-m", "specparity.cli", *words, "--target", str(DEFAULT / "target"),
                              "--draft", str(draft)], capture_output=True, text=True, timeout=120)
        assert run.returncode == 3, run.stdout + run.stderr
        assert named in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_contract_from_config_records_the_mla_family_and_refuses_dflash_without_ids(tmp_path: Path) -> None:
    from specparity.contract.io import load_contract
    from specparity.training.fromconfig import contract_from_config

    kimi = ROOT / "tests" / "serving" / "configs" / "public" / "targets" / "moonshotai--Kimi-K2.5.json"
    mla = tmp_path / "mla"
    mla.mkdir()
    (mla / "config.json").write_text((DATA / "kimi_k25_eagle3_moe.json").read_text())
    c, path = contract_from_config(mla, kimi, trainer="specforge", trainer_sglang_version="0.5.23",
                                   out=tmp_path / "mla.json")
    assert c.drafter.family == "eagle3-mla" and c.drafter.architecture == "Eagle3DeepseekV2ForCausalLM"
    assert c.fc_input.sources == ["layer:1", "layer:29", "layer:57"] and c.fc_input.total_width == 3 * 7168
    assert load_contract(path).drafter.family == "eagle3-mla"
    # a Llama-style head's contract JSON is as before (no family key: content hashes unchanged)
    plain, plain_path = contract_from_config(DEFAULT / "draft", DEFAULT / "target", trainer="specforge",
                                             out=tmp_path / "plain.json")
    assert plain.drafter.family == "eagle3" and "family" not in json.loads(plain_path.read_text())["drafter"]
    dflash = tmp_path / "dflash"
    dflash.mkdir()
    (dflash / "config.json").write_text((DATA / "qwen3_8b_dflash.json").read_text())
    # TorchSpec's DFlash config names no ids (a DFlash contract with ids: test_dflash_contract.py)
    with pytest.raises(EnvironmentProblem, match="names no target layers"):
        contract_from_config(dflash, kimi, trainer="specforge", out=tmp_path / "d.json")
