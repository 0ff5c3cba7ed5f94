"""SpecForge artifacts -> contract: layouts, probe packs, and every bad input named by file and field."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from sf_builders import write_record

from specparity.cli import main
from specparity.contract import load_contract, probe_pack_path, read_probe_pack
from specparity.training.specforge import contract_from_specforge, list_hidden_state_files


def _make(run, out: Path, **kw):  # type: ignore[no-untyped-def]
    return contract_from_specforge(run.hidden_states, run.draft, run.target, out=out, vocab_mapping=run.vocab_mapping, **kw)


def test_eagle_ids_012_on_4_layer_target_give_layers_0_1_2(specforge_run, tmp_path):
    run = specforge_run(ids=[0, 1, 2], num_layers=4)
    c, path = _make(run, tmp_path / "c.json")
    assert c.fc_input.sources == ["layer:0", "layer:1", "layer:2"]
    assert c.layer_ids.ids == [0, 1, 2] and c.layer_ids.origin == "draft_config"
    assert load_contract(path) == c.model_copy(update={"content_hash": load_contract(path).content_hash})


def test_no_eagle_config_resolves_specforge_default_and_records_it(specforge_run, tmp_path):
    # L=8: SpecForge default ids [1, L//2-1, L-4] = [1, 3, 4] -> layer:1, layer:3, layer:4
    run = specforge_run(ids=None, num_layers=8)
    c, _ = _make(run, tmp_path / "c.json")
    assert c.layer_ids.ids is None and c.layer_ids.origin == "tool_default"
    assert c.fc_input.sources == ["layer:1", "layer:3", "layer:4"]


def test_probe_pack_strips_trailing_padding_and_matches_records(specforge_run, tmp_path):
    run = specforge_run(samples=3)
    c, path = _make(run, tmp_path / "c.json", probes=2)
    pack = read_probe_pack(probe_pack_path(c, path), expected_sha256=c.probes.sha256)
    assert [s.num_tokens for s in pack.samples] == [10, 8]  # sample 1 had 2 pad tokens
    rec = torch.load(run.hidden_states / "rows_0-2000" / "data_1.ckpt", weights_only=True)
    assert torch.equal(pack.samples[1].fc_input, rec["aux_hidden_state"][0, :8])
    assert c.probes.num_tokens == 18


def test_files_are_found_in_all_spellings_and_sorted_by_index(tmp_path):
    hs = tmp_path / "hs"
    write_record(hs / "rows_2000-4000" / "data_2000.ckpt", seq=4, width=8, hidden=4, seed=0)
    write_record(hs / "rows_0-2000" / "data_10.pt", seq=4, width=8, hidden=4, seed=1)
    plain = hs / "rows_0-2000" / "data_3.ckpt"
    write_record(plain, seq=4, width=8, hidden=4, seed=2)
    (hs / "rows_0-2000" / "data_3.ckpt.gz").write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    assert [i for i, _ in list_hidden_state_files(hs)] == [3, 10, 2000]


def test_importer_does_not_modify_inputs(specforge_run, tmp_path):
    run = specforge_run()
    before = {p: p.read_bytes() for p in run.root.rglob("*") if p.is_file()}
    _make(run, tmp_path / "out" / "c.json")
    after = {p: p.read_bytes() for p in run.root.rglob("*") if p.is_file()}
    assert before == after


# --- bad input: each a short message naming file and field, exit 2 from the CLI, no traceback


def _cli(run, out: Path):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(
        main,
        ["contract", "from-specforge", "--hidden-states", str(run.hidden_states), "--draft", str(run.draft),
         "--target", str(run.target), "-o", str(out)],
    )


def _assert_bad(result, *needles: str) -> None:  # type: ignore[no-untyped-def]
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for n in needles:
        assert n in result.output, result.output


def test_width_that_disagrees_with_fc_weight(specforge_run, tmp_path):
    run = specforge_run(ids=[0, 1, 2], k=2)  # fc.weight sized for 2 chunks, config says 3
    _assert_bad(_cli(run, tmp_path / "c.json"), "draft", "fc.weight", "in_features 16")


def test_record_missing_key(specforge_run, tmp_path):
    run = specforge_run()
    write_record(run.hidden_states / "rows_0-2000" / "data_1.ckpt", seq=10, width=24, hidden=8, seed=1, drop="loss_mask")
    _assert_bad(_cli(run, tmp_path / "c.json"), "data_1.ckpt", "loss_mask")


def test_record_with_wrong_shape(specforge_run, tmp_path):
    run = specforge_run()
    write_record(run.hidden_states / "rows_0-2000" / "data_2.ckpt", seq=10, width=16, hidden=8, seed=2)
    _assert_bad(_cli(run, tmp_path / "c.json"), "data_2.ckpt", "aux_hidden_state", "width 16")


def test_truncated_file(specforge_run, tmp_path):
    run = specforge_run()
    f = run.hidden_states / "rows_0-2000" / "data_0.ckpt"
    f.write_bytes(f.read_bytes()[:200])
    _assert_bad(_cli(run, tmp_path / "c.json"), "data_0.ckpt", "truncated or corrupt")


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (Path.touch, (self.marker,))


def test_pickled_callable_is_refused_and_never_executed(specforge_run, tmp_path):
    run = specforge_run()
    marker = tmp_path / "executed"
    torch.save({"input_ids": torch.zeros(3), "evil": _Evil(marker)}, run.hidden_states / "rows_0-2000" / "data_0.ckpt")
    res = _cli(run, tmp_path / "c.json")
    _assert_bad(res, "data_0.ckpt", "refused")
    assert not marker.exists()


def test_empty_hidden_states_directory(specforge_run, tmp_path):
    run = specforge_run()
    shutil.rmtree(run.hidden_states)
    run.hidden_states.mkdir()
    _assert_bad(_cli(run, tmp_path / "c.json"), str(run.hidden_states), "no SpecForge hidden-state files")


def test_negative_eagle_id_rejected_like_specforge(specforge_run, tmp_path):
    run = specforge_run(ids=[-1, 1, 2])
    _assert_bad(_cli(run, tmp_path / "c.json"), "config.json", "eagle_config.eagle_aux_hidden_state_layer_ids")


def test_eagle_id_out_of_range(specforge_run, tmp_path):
    run = specforge_run(ids=[0, 1, 9], num_layers=4)
    _assert_bad(_cli(run, tmp_path / "c.json"), "config.json", "eagle_aux_hidden_state_layer_ids")


def test_malformed_draft_config(specforge_run, tmp_path):
    run = specforge_run()
    (run.draft / "config.json").write_text("{not json")
    _assert_bad(_cli(run, tmp_path / "c.json"), "config.json", "malformed JSON")


def test_cli_writes_contract_that_validates(specforge_run, tmp_path):
    run = specforge_run()
    out = tmp_path / "c.json"
    res = _cli(run, out)
    assert res.exit_code == 0, res.output
    ok = CliRunner().invoke(main, ["contract", "validate", str(out)])
    assert ok.exit_code == 0 and "valid contract" in ok.output
    assert json.loads(out.read_text())["fc_input"]["sources"] == ["layer:0", "layer:1", "layer:2"]


# --- contract creation reads the probes plus a bounded sample, not the whole dataset --------
def test_contract_creation_loads_a_bounded_number_of_files(specforge_run, tmp_path, monkeypatch):
    import specparity.training.specforge as sf

    run = specforge_run(samples=40)
    loaded: list[str] = []
    real = sf.load_record

    def counting(path, index, **kw):  # type: ignore[no-untyped-def]
        loaded.append(path.name)
        return real(path, index, **kw)

    monkeypatch.setattr(sf, "load_record", counting)
    c, _ = _make(run, tmp_path / "c.json", probes=4)
    assert c.probes.num_samples == 4
    # 4 probes + CHECK_SAMPLE (4) spread over the other 36 files, the last one included
    assert loaded == [f"data_{i}.ckpt" for i in (0, 1, 2, 3, 4, 16, 27, 39)]


@pytest.mark.parametrize("bad", [39, 3])
def test_a_width_error_in_a_checked_file_is_still_bad_input(specforge_run, tmp_path, bad):
    run = specforge_run(samples=40)
    write_record(run.hidden_states / "rows_0-2000" / f"data_{bad}.ckpt", seq=10, width=16, hidden=8, seed=bad)
    _assert_bad(_cli(run, tmp_path / "c.json"), f"data_{bad}.ckpt", "aux_hidden_state", "width 16")


def test_mixed_dtypes_among_the_checked_files_are_bad_input(specforge_run, tmp_path):
    run = specforge_run(samples=6)
    f = run.hidden_states / "rows_0-2000" / "data_5.ckpt"
    rec = torch.load(f, weights_only=True)
    rec["aux_hidden_state"] = rec["aux_hidden_state"].to(torch.bfloat16)
    torch.save(rec, f)
    _assert_bad(_cli(run, tmp_path / "c.json"), "data_5.ckpt", "aux_hidden_state", "bfloat16")
