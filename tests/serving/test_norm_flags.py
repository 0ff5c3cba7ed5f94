"""The norm flags reported are the ones the drafter SGLang built applies, on every version."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from specparity import gate_verdict
from specparity.compare.findings import Finding, FindingKind, Severity
from specparity.serving.sglang.drafter_facts import NORM_FLAGS, applied_norm_flags, with_applied_norms


def test_flags_come_from_the_modules_sglang_built() -> None:
    # sglang 0.5.23 llama_eagle3 LlamaModel: input_norm iff norm_before_fc, fc_norm ModuleList iff fc_norm
    new = SimpleNamespace(input_norm=torch.nn.Identity(), fc_norm=None, norm_output=True, fc=None)
    assert applied_norm_flags(new) == {"norm_before_fc": True, "fc_norm": False, "norm_output": True}
    built_without = SimpleNamespace(input_norm=None, fc_norm=None, norm_output=False)
    assert applied_norm_flags(built_without) == dict.fromkeys(NORM_FLAGS, False)
    # 0.5.3 / 0.4.10.post2 llama_eagle3 LlamaModel: fc, midlayer, norm only: nothing applies, whatever the config
    legacy = SimpleNamespace(fc=None, midlayer=None, norm=None, config=SimpleNamespace(norm_before_fc=True))
    assert applied_norm_flags(legacy) == dict.fromkeys(NORM_FLAGS, False)


def _dep(**kw: object):  # type: ignore[no-untyped-def]
    import test_stand_ins

    return dataclasses.replace(test_stand_ins._deployment(), **kw)


def test_with_applied_norms_overrides_what_the_config_said() -> None:
    dep = _dep(norm_before_fc=True, engine_version="0.5.3")  # as the old code reported it: configured
    fixed = with_applied_norms(dep, SimpleNamespace(), fc_source="sglang_module")
    assert (fixed.norm_before_fc, fixed.fc_norm, fixed.norm_output, fixed.fc_source) == (
        False, False, False, "sglang_module")


def test_a_norm_the_version_cannot_apply_is_said_as_such() -> None:
    generic = Finding(FindingKind.NORM_MISMATCH, Severity.ERROR, "the served drafter has norm_before_fc=False, "
                      "training used norm_before_fc=True", details={"flag": "norm_before_fc", "expected": True,
                                                                    "served": False})
    dep = _dep(engine_version="0.5.3", unsupported_norms=NORM_FLAGS, ignored_norm_config=("norm_before_fc",))
    [f] = gate_verdict._explain_unsupported_norms([generic], dep)
    assert f.kind is FindingKind.NORM_MISMATCH and f.severity is Severity.ERROR
    assert "sglang 0.5.3 cannot apply" in f.message and f.fix is not None and ">= 0.5.17" in f.fix
    assert f.details["unsupported_by_version"] == "0.5.3"
    # a version that builds the norm keeps the plain finding; so does the reverse direction
    assert gate_verdict._explain_unsupported_norms([generic], _dep()) == [generic]
    reverse = Finding(FindingKind.NORM_MISMATCH, Severity.ERROR, "x",
                      details={"flag": "norm_before_fc", "expected": False, "served": True})
    assert gate_verdict._explain_unsupported_norms([reverse], dep) == [reverse]


# --- the atlas includes boundary L (layer:L-1) where the class's loop can capture it --------
def _fake_workers(class_name: str, num_layers: int, h: int):  # type: ignore[no-untyped-def]
    target = type(class_name, (), {})()
    target.model = SimpleNamespace(layers_to_capture=[2, 4], end_layer=num_layers)
    target.capture_aux_hidden_states = True
    cfg = SimpleNamespace(num_hidden_layers=num_layers)
    runner = SimpleNamespace(model_config=SimpleNamespace(hf_text_config=cfg))
    return SimpleNamespace(target_model=target, tp_worker=SimpleNamespace(model_runner=runner))


def _run_atlas(monkeypatch, class_name: str, num_layers: int = 4, h: int = 2):  # type: ignore[no-untyped-def]
    import specparity.serving.sglang.since_0_5_11.run as run

    workers = _fake_workers(class_name, num_layers, h)
    seen: list[list[int]] = []

    def fake_extend(w, probes):  # type: ignore[no-untyped-def]
        caps = list(w.target_model.model.layers_to_capture) if w.target_model.capture_aux_hidden_states else []
        seen.append(caps)
        rows = sum(len(p) for p in probes)
        if not caps:  # final_norm
            return torch.full((rows, h), -1.0)
        return torch.cat([torch.full((rows, h), float(b)) for b in caps], dim=-1)  # boundary b's value is b

    monkeypatch.setattr(run, "target_extend", fake_extend)
    atlas = run.layer_atlas(workers, ((1, 2, 3),), [3])
    assert workers.target_model.model.layers_to_capture == [2, 4]  # restored
    return atlas, seen


def test_atlas_includes_the_final_pre_norm_boundary_for_gpt_oss(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    atlas, seen = _run_atlas(monkeypatch, "GptOssForCausalLM")
    assert seen[0] == [0, 1, 2, 3, 4]
    sample = atlas.per_sample[0]
    assert list(sample) == ["embedding", "layer:0", "layer:1", "layer:2", "layer:3", "final_norm"]
    assert float(sample["layer:3"][0, 0]) == 4.0  # boundary L = layer:L-1, the input of the final norm


def test_llama_atlas_stops_at_the_boundary_its_loop_reaches(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    atlas, seen = _run_atlas(monkeypatch, "LlamaForCausalLM")
    assert seen[0] == [0, 1, 2, 3]
    assert list(atlas.per_sample[0]) == ["embedding", "layer:0", "layer:1", "layer:2", "final_norm"]


@pytest.mark.sglang
@pytest.mark.usefixtures("sglang_required")
def test_static_resolve_reports_the_norms_the_built_drafter_applies(tmp_path: Path) -> None:
    """norm_before_fc in the draft config: 0.5.23 builds input_norm (reported True); 0.5.3 / 0.4.10 build no
    norm module and ignore the key (reported False, and named as ignored), where they used to echo the config;
    0.5.14 builds fc_norm/norm_output but not norm_before_fc (only that one is unsupported)."""
    import json
    import shutil
    from importlib.metadata import version

    from specparity.serving import ResolvedDeployment
    from specparity.serving.sglang.adapter import parse_version
    from specparity.serving.sglang.client import resolve_deployment

    bundle = Path(__file__).resolve().parents[2] / "fixtures" / "default"
    draft = tmp_path / "draft"
    shutil.copytree(bundle / "draft", draft)
    cfg = json.loads((draft / "config.json").read_text())
    cfg["norm_before_fc"] = True
    (draft / "config.json").write_text(json.dumps(cfg))
    dep = resolve_deployment(bundle / "target", draft)
    assert isinstance(dep, ResolvedDeployment), dep
    installed = parse_version(version("sglang"))
    applies = installed >= (0, 5, 17)
    assert dep.norm_before_fc is applies and not dep.fc_norm
    if not applies:
        # D5: fc_norm and norm_output are built from 0.5.12 (0.5.14 models/llama_eagle3.py:161-183), norm_before_fc
        # only from 0.5.17; before 0.5.12 the drafter builds no norm around fc at all
        unsupported = ("norm_before_fc",) if installed >= (0, 5, 12) else NORM_FLAGS
        assert dep.unsupported_norms == unsupported and dep.ignored_norm_config == ("norm_before_fc",)


def test_atlas_sets_and_restores_the_layer_marks_of_marking_classes(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Qwen3-MoE's loop captures the layers SGLang's setter marked (_is_layer_to_capture, 0.5.23
    models/qwen2_moe.py:1153-1156, 1196-1202), not the capture list: the atlas marks every boundary for its stream
    forward, none for its final-norm forward, and leaves the deployment's own marks as they were."""
    import specparity.serving.sglang.since_0_5_11.run as run
    from specparity.serving.sglang.capture_marks import CAPTURE_MARK

    workers = _fake_workers("Qwen3MoeForCausalLM", 4, 2)
    layers = [SimpleNamespace() for _ in range(4)]
    for i in (2,):  # what SGLang's setter did for the deployment's ids
        setattr(layers[i], CAPTURE_MARK, True)
    workers.target_model.model.layers = layers
    seen: list[list[int]] = []

    def fake_extend(w, probes):  # type: ignore[no-untyped-def]
        marked = [i for i, m in enumerate(layers) if getattr(m, CAPTURE_MARK, False)]
        seen.append(marked)
        rows = sum(len(p) for p in probes)
        if not marked:
            return torch.full((rows, 2), -1.0)
        return torch.cat([torch.full((rows, 2), float(b)) for b in marked], dim=-1)

    monkeypatch.setattr(run, "target_extend", fake_extend)
    atlas = run.layer_atlas(workers, ((1, 2, 3),), [3])
    assert seen == [[0, 1, 2, 3], []]
    assert list(atlas.per_sample[0]) == ["embedding", "layer:0", "layer:1", "layer:2", "final_norm"]
    assert [vars(m).get(CAPTURE_MARK) for m in layers] == [None, None, True, None]  # restored, absent stays absent
    assert workers.target_model.model.layers_to_capture == [2, 4]
