"""The drafter families beyond the Llama-style EAGLE-3 head on SGLang 0.5.23's CPU path.

A DFlash contract written from SpecForge-shaped DFlash records passes SGLang's static level (SGLang's DFlash path,
built on the meta device) and a drafter one layer early is named, with the fix on DFlash's own key; its capture is
refused before the engine starts with SGLang's CPU refusal (arg_groups/speculative_hook.py:287-300).

Why the capture of an MLA EAGLE-3 head cannot run on SGLang 0.5.23's CPU path: the refusal the
gate gives before the engine starts (deployed.py ``_CPU_CAPTURE_REFUSED``) is what SGLang itself does when it is
started anyway, measured here with a tiny Kimi-style head (tests/serving/family_pairs.py) over the SGLang bundle's
8-layer Llama target, through the capture child the gate would run (``capture_deployment``).

- draft hidden = target hidden (every published Kimi head): start-up fails in ``set_embed``'s
  ``torch.cuda.synchronize`` (models/kimi_k25_eagle3.py:414-415);
- draft hidden != target hidden (``set_embed`` returns early, :406-411): the target serves, fc is fed (its input is
  captured: layer:1, 3, 5 for ids [1, 3, 5]), and the drafter's MLA attention then fails on the CPU backend
  (layers/attention/torch_native_backend.py:160), a named machine limit (verdict/rules.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from family_pairs import write_dflash_draft, write_dflash_records, write_mla_draft
from real_class_targets import write_deployment
from version_facts import SGLANG_VERSION

from specparity.errors import EnvironmentProblem
from specparity.gate import run_gate
from specparity.serving.sglang.client import capture_deployment
from specparity.training.specforge import contract_from_specforge
from specparity.verdict.rules import machine_limit

pytestmark = [pytest.mark.sglang, pytest.mark.usefixtures("sglang_required"),
              pytest.mark.skipif(SGLANG_VERSION != "0.5.23", reason="the MLA head's lines are read at sglang 0.5.23")]
TARGET = Path(__file__).resolve().parents[2] / "fixtures" / "default" / "target"
PROBES = [[256, 10, 20, 30, 40, 50, 60, 70], [256, 11, 21, 31, 41]]


def test_sglang_cannot_start_the_mla_head_on_this_cpu(tmp_path: Path) -> None:
    r = capture_deployment(TARGET, write_mla_draft(tmp_path / "draft", [1, 3, 5]), probes=PROBES, device="cpu",
                           atlas=False, timeout_s=600)
    assert r.fc is None and r.failures, r
    message = " ".join(f.message for f in r.failures)
    assert "kimi_k25_eagle3.py:415" in message and "NVIDIA driver" in message, message


def test_past_start_up_fc_is_fed_and_the_mla_attention_is_the_cpu_limit(tmp_path: Path) -> None:
    draft = write_mla_draft(tmp_path / "draft", [1, 3, 5], hidden=32, target_hidden=64)
    r = capture_deployment(TARGET, draft, probes=PROBES, device="cpu", atlas=False, timeout_s=600)
    assert r.deployment is not None and list(r.deployment.served_sources) == ["layer:1", "layer:3", "layer:5"]
    assert r.deployment.fc_in_features == 3 * 64  # the ColumnParallelLinear's whole width (run_common.fc_sizes)
    assert r.fc is not None and [int(t.shape[0]) for t in r.fc.per_sample] == [len(p) for p in PROBES]
    [failure] = [f for f in r.failures if "torch_native_backend.py:160" in f.message]
    assert machine_limit(failure.message) is not None, failure.message


def test_dflash_contract_on_sglangs_static_level_and_its_capture_refused_by_name(tmp_path: Path) -> None:
    dep = write_deployment("Qwen--Qwen3-8B", tmp_path, {}, probes=2, max_probe_tokens=32)
    records = write_dflash_records(tmp_path / "hidden_states", tmp_path / "dflash_records", [1, 3, 5])
    healthy = write_dflash_draft(tmp_path / "healthy", [1, 3, 5])
    _, contract = contract_from_specforge(records, healthy, dep["target"], out=tmp_path / "c.json", probes=2,
                                          max_probe_tokens=32)
    v = run_gate(contract, dep["target"], healthy, level="static", timeout_s=600)
    assert (v.status, list(v.served_layout or [])) == ("pass", ["layer:1", "layer:3", "layer:5"]), [
        str(f) for f in v.errors]
    early = run_gate(contract, dep["target"], write_dflash_draft(tmp_path / "early", [0, 2, 4]), level="static",
                     timeout_s=600)
    assert early.status == "fail" and "off_by_one" in {f.kind.value for f in early.errors}
    assert early.fix is not None and "dflash_config.target_layer_ids = [1, 3, 5]" in early.fix.summary, early.fix
    with pytest.raises(EnvironmentProblem, match=r"speculative_hook\.py:287-300"):
        run_gate(contract, dep["target"], healthy, level="capture", timeout_s=600)
