"""fixtures/bf16: the default bundle's probes recorded in bf16, in SpecForge's exact offline format.

SpecForge 0.2.0 (constraints/dev.txt) reads the committed files back with its own reader and
normaliser; regenerating the records gives the same files (token ids and layout exactly, the bf16 states up to
float rounding: an HF forward's last bits depend on the CPU's kernels, fixtures/README.md); the contract says
bf16 and its probe pack holds the recording losslessly.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SET = ROOT / "fixtures" / "bf16"
FILES = sorted((SET / "hidden_states").rglob("data_*.ckpt"), key=lambda p: int(p.stem.split("_")[1]))
CONTRACT = SET / "contract" / "tiny-llama-eagle3-bf16.json"


def test_specforge_reads_the_files_with_its_own_reader_and_normaliser() -> None:
    from specforge.algorithms.eagle3.data import normalize_offline_sample
    from specforge.runtime.data_plane.feature_store import load_feature_file
    from specforge.runtime.data_plane.offline_reader import OfflineManifestReader, list_feature_files

    assert [Path(p) for p in list_feature_files(str(SET / "hidden_states"))] == FILES
    refs = OfflineManifestReader(str(SET / "hidden_states"), validate_files=True).read()
    assert len(refs) == len(FILES) == 8
    for path in FILES:
        raw = load_feature_file(str(path))
        assert list(raw) == ["input_ids", "loss_mask", "aux_hidden_state", "hidden_state"]  # the eagle3 layout order
        s = raw["input_ids"].shape[0]
        assert raw["aux_hidden_state"].dtype == raw["hidden_state"].dtype == torch.bfloat16
        assert raw["aux_hidden_state"].shape == (1, s, 3 * 64) and raw["hidden_state"].shape == (1, s, 64)
        assert raw["input_ids"].dtype == raw["loss_mask"].dtype == torch.int64
        sample = normalize_offline_sample(raw, max_len=s)
        assert torch.equal(sample["hidden_state"], raw["aux_hidden_state"])  # what fc is trained on


def test_same_rows_as_the_default_bundle() -> None:
    for path in FILES:
        ref = torch.load(ROOT / "fixtures" / "default" / "hidden_states" / path.parent.name / path.name,
                         weights_only=True)
        got = torch.load(path, weights_only=True)
        assert torch.equal(got["input_ids"], ref["input_ids"]) and torch.equal(got["loss_mask"], ref["loss_mask"])
        # the same states up to bf16 compute: per-token relative error a few bf16 unit roundoffs (2^-8)
        a, b = got["aux_hidden_state"][0].float(), ref["aux_hidden_state"][0].float()
        rel = ((a - b).norm(dim=-1) / b.norm(dim=-1)).max()
        assert 0 < float(rel) < 16 * 2.0**-8


def test_regenerating_the_records_gives_the_same_records(tmp_path: Path) -> None:
    """Exact where no float math is involved (file names, keys, order, shapes, dtypes, token ids, loss masks);
    the bf16 states within 16 bf16 unit roundoffs (u = 2^-8) per token: the committed bytes were written on
    another CPU, and bf16 rounding flips cascade with depth (measured against the committed files on a 2-core
    AVX2 machine: layer:1 1.3u, layer:3 2.7u, layer:5 4.4u, final_norm 4.5u), while adjacent layers differ by
    far more."""
    sys.path.insert(0, str(ROOT / "fixtures"))
    try:
        import make_bf16
    finally:
        sys.path.remove(str(ROOT / "fixtures"))
    written = make_bf16.build(tmp_path)
    assert [p.relative_to(tmp_path) for p in written] == [p.relative_to(SET) for p in FILES]
    for new_path, old_path in zip(written, FILES, strict=True):
        new, old = torch.load(new_path, weights_only=True), torch.load(old_path, weights_only=True)
        assert list(new) == list(old), new_path.name
        for key in old:
            a, b = new[key], old[key]
            assert (a.dtype, a.shape) == (b.dtype, b.shape), (new_path.name, key)
            if not a.is_floating_point():
                assert torch.equal(a, b), (new_path.name, key)
                continue
            rel = (a.float() - b.float()).norm(dim=-1) / b.float().norm(dim=-1).clamp_min(1e-30)
            assert float(rel.max()) <= 16 * 2.0**-8, (new_path.name, key, float(rel.max()))


def test_the_contract_is_bf16_and_its_probes_are_the_recording_bit_for_bit() -> None:
    from specparity.contract import load_contract, probe_pack_path, read_probe_pack

    c = load_contract(CONTRACT)
    assert c.fc_input.dtype == "bfloat16" and c.fc_input.sources == ["layer:1", "layer:3", "layer:5"]
    pack = read_probe_pack(probe_pack_path(c, CONTRACT), expected_sha256=c.probes.sha256)
    first = torch.load(FILES[0], weights_only=True)
    n = pack.samples[0].fc_input.shape[0]
    assert pack.samples[0].fc_input.dtype == torch.bfloat16
    assert torch.equal(pack.samples[0].fc_input, first["aux_hidden_state"][0, :n])
    assert json.loads(CONTRACT.read_text())["target"]["config_fingerprint"] == load_contract(
        ROOT / "contracts" / "tiny-llama-eagle3.json").target.config_fingerprint
