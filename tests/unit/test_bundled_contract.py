"""The committed contract is exactly what `specparity contract from-specforge` makes of the bundle."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from click.testing import CliRunner

from specparity.cli import main
from specparity.contract import load_contract, probe_pack_path, read_probe_pack

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "fixtures" / "default"
COMMITTED = ROOT / "contracts" / "tiny-llama-eagle3.json"


def _make_default():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("make_default", ROOT / "fixtures" / "make_default.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_importer_reproduces_the_committed_contract(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the bundle's paths are recorded relative to the repository
    out = tmp_path / "tiny-llama-eagle3.json"
    args = _make_default().contract_cli_args(BUNDLE, out)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text()) == json.loads(COMMITTED.read_text())
    assert (tmp_path / "tiny-llama-eagle3.probes.safetensors").read_bytes() == (
        ROOT / "contracts" / "tiny-llama-eagle3.probes.safetensors").read_bytes()


def test_committed_contract_is_valid_and_its_probes_are_unpadded():
    c = load_contract(COMMITTED)
    assert c.fc_input.sources == ["layer:1", "layer:3", "layer:5"]
    pack = read_probe_pack(probe_pack_path(c, COMMITTED), expected_sha256=c.probes.sha256)
    for s in pack.samples:
        # SpecForge pads batches with id 0 and loss_mask 0; a probe never ends in padding
        assert not (int(s.input_ids[-1]) == 0 and int(s.loss_mask[-1]) == 0)  # type: ignore[index]
    assert c.probes.num_tokens == sum(s.num_tokens for s in pack.samples)


def test_committed_probes_are_the_first_recordings_of_the_bundle():
    """An expectation independent of the importer: the probe pack holds data_0..3 of the bundle's SpecForge
    recordings, cut at their real (unpadded) length and at 128 tokens, bit for bit (no float math between)."""
    import torch

    c = load_contract(COMMITTED)
    pack = read_probe_pack(probe_pack_path(c, COMMITTED), expected_sha256=c.probes.sha256)
    assert len(pack.samples) == c.probes.num_samples == 4
    total = 0
    for i, s in enumerate(pack.samples):
        rec = torch.load(BUNDLE / "hidden_states" / "rows_0-2000" / f"data_{i}.ckpt", weights_only=True)
        ids, mask = rec["input_ids"], rec["loss_mask"]
        n = ids.shape[0]
        while n > 0 and int(ids[n - 1]) == 0 and int(mask[n - 1]) == 0:
            n -= 1
        n = min(n, 128)
        total += n
        assert torch.equal(s.input_ids, ids[:n]) and torch.equal(s.loss_mask, mask[:n]), i  # type: ignore[arg-type]
        assert torch.equal(s.fc_input, rec["aux_hidden_state"][0, :n]), i
        assert torch.equal(s.final_norm, rec["hidden_state"][0, :n]), i  # type: ignore[arg-type]
    assert c.probes.num_tokens == total == 343
