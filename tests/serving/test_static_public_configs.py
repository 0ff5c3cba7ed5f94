"""Full-size public configs through the product's static level and ``explain``, on real SGLang.

tests/serving/configs/public holds verbatim copies of configs nobody here wrote (SOURCES.json names the
repository, path and commit of each): Hugging Face target config.json files (NVIDIA aiconfigurator's
copies) and SpecForge's own drafter configs, paired as SpecForge's examples pair them. For every pair the
static level (SGLang's ServerArgs, the real target and draft classes built on the meta device, the real
``set_eagle3_layers_to_capture``) and ``explain`` must succeed, and the served layers must equal both the
manifest's ``expected_served`` (written from domain.md section 3) and the conventions module.
Targets no SpecForge drafter is paired with run with a SpecForge-style drafter of the target's width.

In-process like test_static_registry.py (one one-rank world per process, since_0_5_11.static.init_single_rank).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from meta_static import SKIP, make_0523_adapter
from static_configs import hardware_note_expected
from tests.public_drafts import specforge_style_draft

if SKIP:
    pytest.skip(SKIP, allow_module_level=True)

from static_checks import assert_resolved_as_planned, text_config

from specparity.serving import ResolvedDeployment
from specparity.serving.sglang.adapter import WorkerRequest
from specparity.serving.sglang.explain import explain_failure, explain_resolved
from specparity.serving.sglang.since_0_5_11.static import resolve_static

pytestmark = pytest.mark.sglang
ADAPTER = make_0523_adapter()
PUBLIC = Path(__file__).resolve().parent / "configs" / "public"
SOURCES: dict[str, Any] = json.loads((PUBLIC / "SOURCES.json").read_text())
PAIRED_TARGETS = {p["target"] for p in SOURCES["pairs"]}
LONE_TARGETS = sorted(set(SOURCES["targets"]) - PAIRED_TARGETS)


def _deployment(tmp_path: Path, target: str, draft: dict[str, Any]) -> WorkerRequest:
    (tmp_path / "target").mkdir()
    (tmp_path / "draft").mkdir()
    shutil.copy(PUBLIC / "targets" / target, tmp_path / "target" / "config.json")
    (tmp_path / "draft" / "config.json").write_text(json.dumps(draft))
    return WorkerRequest(op="resolve", target=str(tmp_path / "target"), draft=str(tmp_path / "draft"))


def _check(r: object, *, target_cfg: dict[str, Any], ids: list[int] | None, expected: list[str] | None) -> None:
    """The static result and its explanation: resolved, equal to domain.md and to the conventions module."""
    arch = target_cfg["architectures"][0]
    num_layers = int(text_config(target_cfg)["num_hidden_layers"])
    if hardware_note_expected(arch):
        # SGLang asks this machine's (absent) GPU before the model exists: a note and exit 3, never a crash
        assert not isinstance(r, ResolvedDeployment), r
        assert r.kind == "needs_hardware", r  # type: ignore[attr-defined]
        assert explain_failure(r).exit_code == 3  # type: ignore[arg-type]
        return
    r, plan = assert_resolved_as_planned(r, architecture=arch, num_layers=num_layers, ids=ids)
    if expected is not None:
        assert list(r.served_sources) == expected
    e = explain_resolved(r)
    assert e.exit_code == 0, (e.summary, e.lines)
    assert e.data["served_sources"] == list(plan.served_sources)
    assert e.data["fc_in_features"] == len(plan.served_sources) * int(text_config(target_cfg)["hidden_size"])


@pytest.mark.parametrize("pair", SOURCES["pairs"], ids=lambda p: p["draft"].removesuffix(".json"))
def test_specforge_drafter_on_its_public_target(pair: dict[str, Any], tmp_path: Path) -> None:
    target_cfg = json.loads((PUBLIC / "targets" / pair["target"]).read_text())
    draft = json.loads((PUBLIC / "drafts" / pair["draft"]).read_text())
    ids = (draft.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    r = resolve_static(ADAPTER, _deployment(tmp_path, pair["target"], draft))
    _check(r, target_cfg=target_cfg, ids=ids, expected=pair["expected_served"])


@pytest.mark.parametrize("ids_kind", ["default", "specforge_default_ids"])
@pytest.mark.parametrize("target", LONE_TARGETS, ids=lambda t: t.removesuffix(".json"))
def test_public_target_with_a_specforge_style_drafter(target: str, ids_kind: str, tmp_path: Path) -> None:
    target_cfg = json.loads((PUBLIC / "targets" / target).read_text())
    text = text_config(target_cfg)
    num_layers = int(text["num_hidden_layers"])
    # SpecForge's default ids [1, L//2-1, L-4] (domain.md section 3.1); without ids SGLang's default
    # [2, L//2, L-3] serves the same layers on every architecture here (none is MiniMax-M3's VL class)
    ids = None if ids_kind == "default" else [1, num_layers // 2 - 1, num_layers - 4]
    expected = [f"layer:{i}" for i in (1, num_layers // 2 - 1, num_layers - 4)]
    draft = specforge_style_draft(int(text["hidden_size"]), int(text.get("vocab_size") or 32000), ids)
    r = resolve_static(ADAPTER, _deployment(tmp_path, target, draft))
    _check(r, target_cfg=target_cfg, ids=ids, expected=expected)


# The unpaired SpecForge drafters (SOURCES.json "unpaired_drafts": no verbatim copy of their target's config.json was
# found) still run verbatim, against a config of their target's architecture built from its own config class
# (static_configs.target_config) sized as the hub model their SpecForge example trains against: the class, layer
# count and width the manifest's reason names, plus the head counts of that model's card.
UNPAIRED_TARGETS: dict[str, tuple[str, dict[str, int]]] = {
    "gemma3-1b-eagle3.json": ("Gemma3ForCausalLM", {"num_hidden_layers": 26, "hidden_size": 1152,
                                                    "num_attention_heads": 4, "num_key_value_heads": 1}),
    "ling-flash-2.0-eagle3.json": ("BailingMoeV2ForCausalLM", {"num_hidden_layers": 32, "hidden_size": 4096,
                                                               "num_attention_heads": 32, "num_key_value_heads": 4}),
    "longcat-flash-eagle3.json": ("LongcatFlashForCausalLM", {"hidden_size": 6144}),
    "phi4-eagle3.json": ("Phi3ForCausalLM", {"num_hidden_layers": 40, "hidden_size": 5120,
                                             "num_attention_heads": 40, "num_key_value_heads": 10}),
    "qwen2-5-vl-7b-eagle3.json": ("Qwen2_5_VLForConditionalGeneration", {
        "num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4}),
    "qwen2.5-0.5b-eagle3.json": ("Qwen2ForCausalLM", {"num_hidden_layers": 24, "hidden_size": 896,
                                                      "num_attention_heads": 14, "num_key_value_heads": 2}),
    "qwen2.5-vl-32b-eagle3.json": ("Qwen2_5_VLForConditionalGeneration", {
        "num_hidden_layers": 64, "hidden_size": 5120, "num_attention_heads": 40, "num_key_value_heads": 8}),
    "qwen3-4b-eagle3.json": ("Qwen3ForCausalLM", {"num_hidden_layers": 36, "hidden_size": 2560,
                                                  "num_attention_heads": 32, "num_key_value_heads": 8}),
}


# SpecForge's own qwen2.5-vl-32b drafter declares hidden 5120 with 28 heads (and head_dim 128): transformers 4.51,
# which wrote it, accepted that; the transformers SGLang 0.5.23 pins validates the config class and refuses it
DRAFT_REFUSED = {"qwen2.5-vl-32b-eagle3.json": "The hidden size (5120) is not a multiple of the number of attention "
                                               "heads (28)"}


@pytest.mark.parametrize("draft_file", sorted(SOURCES["unpaired_drafts"]), ids=lambda d: d.removesuffix(".json"))
def test_unpaired_specforge_drafter_on_its_architecture(draft_file: str, tmp_path: Path,
                                                        record_property: Callable[[str, object], None]) -> None:
    from static_configs import SGLANG_REFUSES, server_args_for, stand_ins, target_config, target_files

    arch, sizes = UNPAIRED_TARGETS[draft_file]
    cfg = target_config(arch)
    record_property("stand_ins", json.dumps(stand_ins(arch)))  # Ling: the remote-code module written here
    text = text_config(cfg)
    if "num_hidden_layers" in sizes:
        text.pop("layer_types", None)  # sized for the class's default depth; the config class derives it again
    text.update(sizes)
    draft = json.loads((PUBLIC / "drafts" / draft_file).read_text())
    text["vocab_size"] = int(draft["vocab_size"])
    (tmp_path / "target").mkdir()
    (tmp_path / "draft").mkdir()
    (tmp_path / "target" / "config.json").write_text(json.dumps(cfg))
    for name, source in target_files(arch).items():
        (tmp_path / "target" / name).write_text(source)
    shutil.copy(PUBLIC / "drafts" / draft_file, tmp_path / "draft" / "config.json")
    r = resolve_static(ADAPTER, WorkerRequest(op="resolve", target=str(tmp_path / "target"),
                                              draft=str(tmp_path / "draft"), server_args=server_args_for(arch)))
    if draft_file in DRAFT_REFUSED:  # the verbatim drafter config itself is refused, with the reason (exit 1)
        assert not isinstance(r, ResolvedDeployment) and r.kind == "sglang_exception", r
        assert DRAFT_REFUSED[draft_file] in r.message, r.message
        assert explain_failure(r).exit_code == 1
        return
    if arch in SGLANG_REFUSES:  # SGLang's own exception on the architecture's config class, quoted (exit 1)
        assert not isinstance(r, ResolvedDeployment) and SGLANG_REFUSES[arch] in r.message, r  # type: ignore[attr-defined]
        return
    num_layers = int(text["num_hidden_layers"])
    # no ids in these drafts: SGLang's default boundaries [2, L//2, L-3] = layer:{1, L//2-1, L-4} (domain.md 3.1)
    expected = [f"layer:{i}" for i in (1, num_layers // 2 - 1, num_layers - 4)]
    assert draft.get("eagle_config") is None
    _check(r, target_cfg=cfg, ids=None, expected=expected)


def test_the_manifest_names_a_source_for_every_file() -> None:
    for kind in ("targets", "drafts"):
        on_disk = {p.name for p in (PUBLIC / kind).glob("*.json")}
        assert on_disk == set(SOURCES[kind]), kind
        for entry in SOURCES[kind].values():
            assert entry["repo"] and entry["path"] and len(entry["commit"]) == 40
    assert {p["draft"] for p in SOURCES["pairs"]} | set(SOURCES["unpaired_drafts"]) == set(SOURCES["drafts"])
    assert set(UNPAIRED_TARGETS) == set(SOURCES["unpaired_drafts"])
