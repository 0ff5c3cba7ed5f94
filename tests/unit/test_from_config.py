"""``specparity contract from-config``: probe-less contracts whose layout is assumed from the configs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from specparity.cli import main
from specparity.contract import load_contract
from specparity.errors import InputError
from specparity.gate import run_gate
from specparity.training.fromconfig import contract_from_config

REPO = Path(__file__).resolve().parents[2]
DEFAULT = REPO / "fixtures" / "default"
KIMI = REPO / "tests" / "serving" / "configs" / "public" / "targets" / "moonshotai--Kimi-K2.5.json"


def _draft(tmp_path: Path, ids: list[int] | None, **extra: object) -> Path:
    cfg = json.loads((DEFAULT / "draft" / "config.json").read_text())
    cfg.pop("eagle_config", None)
    if ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
    cfg.update(extra)
    d = tmp_path / "draft"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_specforge_declared_ids_without_a_version_record_the_assumption(tmp_path: Path) -> None:
    c, path = contract_from_config(DEFAULT / "draft", DEFAULT / "target", trainer="specforge", out=tmp_path / "c.json")
    assert c.fc_input.sources == ["layer:1", "layer:3", "layer:5"] and c.probes is None
    assert c.layout_assumed is not None and c.layout_assumed.trainer_sglang_version_assumed
    assert "0.5.14" in c.layout_assumed.reason and "--trainer-sglang-version" in c.layout_assumed.reason
    assert load_contract(path).model_copy(update={"content_hash": None}) == c  # written, hashed and valid
    assert "probes" not in json.loads(path.read_text())


def test_specforge_default_is_1_l2m1_lm4(tmp_path: Path) -> None:
    c, _ = contract_from_config(_draft(tmp_path, None), DEFAULT / "target", trainer="specforge",
                                trainer_sglang_version="0.5.23", out=tmp_path / "c.json")
    assert c.fc_input.sources == ["layer:1", "layer:3", "layer:4"]  # SpecForge [1, L//2-1, L-4] for L=8
    assert c.layer_ids.origin == "tool_default" and c.layout_assumed is not None
    assert not c.layout_assumed.trainer_sglang_version_assumed and "default ids" in c.layout_assumed.reason


@pytest.mark.parametrize(("version", "want"), [("0.5.12", ["layer:2", "layer:30", "layer:58"]),
                                               ("0.5.13", ["layer:1", "layer:29", "layer:57"])])
def test_kimi_k25_layout_depends_on_the_trainers_sglang_version(tmp_path: Path, version: str, want: list[str]) -> None:
    draft = _draft(tmp_path, [2, 30, 58], hidden_size=7168)
    c, _ = contract_from_config(draft, KIMI, trainer="specforge", trainer_sglang_version=version,
                                out=tmp_path / "c.json")  # a bare config JSON as the target
    assert c.fc_input.sources == want and c.target.num_hidden_layers == 61 and c.fc_input.total_width == 3 * 7168


def test_speculators_and_eagle_conventions(tmp_path: Path) -> None:
    spec = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
            "eagle_aux_hidden_state_layer_ids": [2, 4, 6], "transformer_layer_config": {"hidden_size": 64},
            "draft_vocab_size": 256}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    c, _ = contract_from_config(tmp_path / "spec.json", DEFAULT / "target", trainer="speculators",
                                out=tmp_path / "s.json")
    assert c.fc_input.sources == ["layer:1", "layer:3", "layer:5"]  # boundaries, no +1
    e, _ = contract_from_config(_draft(tmp_path, None), DEFAULT / "target", trainer="eagle", out=tmp_path / "e.json")
    assert e.fc_input.sources == ["layer:1", "layer:3", "layer:4"] and e.layer_ids.ids == [2, 4, 5]


def test_bad_version_and_unknown_trainer_are_input_errors(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["contract", "from-config", "--draft", str(DEFAULT / "draft"), "--target",
                                  str(DEFAULT / "target"), "--trainer", "specforge", "--trainer-sglang-version",
                                  "latest", "-o", str(tmp_path / "c.json")])
    assert r.exit_code == 2 and "--trainer-sglang-version" in r.output
    with pytest.raises(InputError, match="unknown trainer"):
        contract_from_config(DEFAULT / "draft", DEFAULT / "target", trainer="medusa",  # type: ignore[arg-type]
                             out=tmp_path / "c.json")


@pytest.mark.parametrize("level", ["capture", "outcome", "all"])
def test_capture_and_outcome_refuse_a_contract_without_probes(tmp_path: Path, level: str) -> None:
    _, path = contract_from_config(DEFAULT / "draft", DEFAULT / "target", trainer="specforge", out=tmp_path / "c.json")
    with pytest.raises(InputError, match="no probe pack: its layout is assumed") as e:
        run_gate(path, DEFAULT / "target", DEFAULT / "draft", level=level, python="/nonexistent/python")
    assert "--level static" in str(e.value) and e.value.exit_code == 2


def test_contract_without_probes_or_assumption_is_invalid(tmp_path: Path) -> None:
    committed = json.loads((REPO / "contracts" / "tiny-llama-eagle3.json").read_text())
    committed.pop("probes")
    committed.pop("content_hash")
    (tmp_path / "c.json").write_text(json.dumps(committed))
    with pytest.raises(InputError, match="probes"):
        load_contract(tmp_path / "c.json")
    shutil.rmtree(tmp_path)
