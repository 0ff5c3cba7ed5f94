"""Contract schema v1: validation names the field, the hash is stable, the committed schema is current."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from specparity.cli import main
from specparity.contract import content_hash, dump_contract, json_schema_text, load_contract, parse_contract
from specparity.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "contracts" / "schema" / "contract.v1.schema.json"


def good() -> dict[str, Any]:
    return {
        "schema_version": 1,
        "name": "t",
        "target": {
            "architecture": "LlamaForCausalLM", "num_hidden_layers": 8, "hidden_size": 4, "vocab_size": 16,
            "dtype": "float32", "config_fingerprint": "0" * 64, "fingerprint_fields": ["hidden_size"],
        },
        "fc_input": {"sources": ["layer:1", "layer:3", "layer:5"], "chunk_widths": [4, 4, 4], "total_width": 12,
                     "dtype": "float32"},
        "layer_ids": {"ids": [1, 3, 5], "convention": "specforge_eagle", "origin": "draft_config", "tool": "specforge",
                      "architecture": "LlamaForCausalLM"},
        "drafter": {"hidden_size": 4, "fc_in_features": 12, "fc_out_features": 4, "draft_vocab_size": 16},
        "probes": {"file": "t.probes.safetensors", "sha256": "1" * 64, "num_samples": 1, "num_tokens": 3},
        "provenance": {"tool": "specforge", "created_at": "2026-11-29T00:00:00Z", "specparity_version": "0.1.0"},
    }


def write(tmp_path: Path, data: dict[str, Any] | str) -> Path:
    p = tmp_path / "c.json"
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def bad(tmp_path: Path, data: dict[str, Any] | str) -> InputError:
    p = write(tmp_path, data)
    with pytest.raises(InputError) as ei:
        load_contract(p)
    assert str(p) in str(ei.value)
    return ei.value


def test_good_contract_round_trips_with_hash(tmp_path):
    c = parse_contract(good())
    text = dump_contract(c)
    again = load_contract(write(tmp_path, text))
    assert again.content_hash == content_hash(c)
    assert again.model_copy(update={"content_hash": None}) == c


@settings(max_examples=25, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(min_value=0, max_value=4))
def test_hash_is_stable_across_key_order_and_whitespace(rnd, indent):
    def shuffle(x: Any) -> Any:
        if isinstance(x, dict):
            items = list(x.items())
            rnd.shuffle(items)
            return {k: shuffle(v) for k, v in items}
        return x

    base = content_hash(parse_contract(good()))
    text = json.dumps(shuffle(good()), indent=indent or None)
    assert content_hash(parse_contract(json.loads(text))) == base


def test_edited_contract_fails_its_hash(tmp_path):
    data = json.loads(dump_contract(parse_contract(good())))
    data["drafter"]["fc_bias"] = True
    assert bad(tmp_path, data).field == "content_hash"


def test_malformed_json(tmp_path):
    e = bad(tmp_path, '{"schema_version": 1,')
    assert "malformed JSON" in str(e)


def test_unknown_field(tmp_path):
    d = good()
    d["drafter"]["fc_biass"] = True
    e = bad(tmp_path, d)
    assert e.field == "drafter.fc_biass" and "unknown field" in str(e)


def test_wrong_schema_version(tmp_path):
    d = good()
    d["schema_version"] = 2
    e = bad(tmp_path, d)
    assert e.field == "schema_version" and "unsupported schema_version 2" in str(e)


def test_ids_out_of_range(tmp_path):
    d = good()
    d["fc_input"]["sources"] = ["layer:1", "layer:3", "layer:8"]
    e = bad(tmp_path, d)
    assert "fc_input.sources[2]" in str(e) and "8 layers" in str(e)
    d = good()
    d["layer_ids"]["ids"] = [1, 3, 12]
    assert "layer_ids.ids [12] out of range" in str(bad(tmp_path, d))


def test_duplicate_sources(tmp_path):
    d = good()
    d["fc_input"]["sources"] = ["layer:1", "layer:1", "layer:5"]
    e = bad(tmp_path, d)
    assert e.field == "fc_input" and "repeated: ['layer:1']" in str(e)


def test_not_a_canonical_source(tmp_path):
    d = good()
    d["fc_input"]["sources"][0] = "hs[2]"
    e = bad(tmp_path, d)
    assert e.field == "fc_input.sources[0]" and "not a canonical source" in str(e)


def test_width_inconsistent_with_fc_in_features(tmp_path):
    d = good()
    d["drafter"]["fc_in_features"] = 8
    e = bad(tmp_path, d)
    assert "total_width 12 != drafter.fc_in_features 8" in str(e)


def test_chunk_width_must_be_target_hidden(tmp_path):
    d = good()
    d["fc_input"]["chunk_widths"] = [4, 4, 5]
    d["fc_input"]["total_width"] = 13
    d["drafter"]["fc_in_features"] = 13
    assert "fc_input.chunk_widths[2] = 5" in str(bad(tmp_path, d))


def test_committed_json_schema_is_current():
    assert SCHEMA.read_text() == json_schema_text(), "run: specparity contract schema > " + str(SCHEMA.relative_to(ROOT))


def test_committed_json_schema_says_what_the_docs_say():
    """Independent of the generator: the facts docs/writing-contracts.md states about a v1 contract."""
    schema = json.loads(SCHEMA.read_text())
    assert schema["$id"].endswith("contract.v1.schema.json") and "2020-12" in schema["$schema"]
    assert schema["additionalProperties"] is False  # unknown fields are rejected
    assert schema["properties"]["schema_version"]["const"] == 1
    assert sorted(schema["required"]) == sorted(["name", "target", "fc_input", "layer_ids", "drafter", "provenance"])
    # probes may be absent only in a contract from configs alone, which says why in layout_assumed
    assert {"probes", "layout_assumed"} <= set(schema["properties"])
    # every top-level key of the committed contract is a schema property, and every required one is present
    committed = json.loads((ROOT / "contracts" / "tiny-llama-eagle3.json").read_text())
    assert set(committed) <= set(schema["properties"]) and set(schema["required"]) <= set(committed)
    assert good().keys() >= set(schema["required"])


def test_cli_schema_validate_and_exit_codes(tmp_path):
    r = CliRunner()
    out = r.invoke(main, ["contract", "schema"])
    assert out.exit_code == 0 and json.loads(out.output)["title"] == "Contract"
    d = good()
    d["nonsense"] = 1
    res = r.invoke(main, ["contract", "validate", str(write(tmp_path, d))])
    assert res.exit_code == 2 and "nonsense: unknown field" in res.output and "Traceback" not in res.output
    res = r.invoke(main, ["contract", "validate", str(tmp_path / "absent.json")])
    assert res.exit_code == 2 and "no such file" in res.output


def test_sources_must_follow_from_the_raw_ids(tmp_path):
    d = good()
    d["layer_ids"]["ids"] = [2, 4, 6]  # SpecForge ids 2,4,6 are layer:2,4,6, not the stated layer:1,3,5
    e = bad(tmp_path, d)
    assert "disagree with layer_ids.ids [2, 4, 6] read as specforge_eagle" in str(e)


def test_rehash_accepts_an_intended_edit(tmp_path):
    data = json.loads(dump_contract(parse_contract(good())))
    data["drafter"]["fc_bias"] = True
    p = write(tmp_path, data)
    res = CliRunner().invoke(main, ["contract", "rehash", str(p)])
    assert res.exit_code == 0, res.output
    assert load_contract(p).drafter.fc_bias is True


# --- the hash covers the stored JSON, so older contracts keep loading ----------------------
LEGACY = Path(__file__).resolve().parent / "data" / "contract-0.1.0.json"


def _sha_of_stored(data: dict[str, Any]) -> str:
    """The rule restated from the docs, not imported: sha256 of sorted, compact JSON without content_hash."""
    body = {k: v for k, v in data.items() if k != "content_hash"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def test_contract_written_by_0_1_0_keeps_loading():
    data = json.loads(LEGACY.read_text())
    assert data["provenance"]["specparity_version"] == "0.1.0"
    assert data["content_hash"] == "339a52da5833167eddf93b25e8bc2d26ddff8ca855bc8777572f7902cde99368"
    c = load_contract(LEGACY)
    assert c.name == "tiny-llama-eagle3" and c.fc_input.sources == ["layer:1", "layer:3", "layer:5"]
    assert c.content_hash == _sha_of_stored(data)


def test_a_field_defaulted_after_the_writer_does_not_break_its_hash(tmp_path):
    """A writer that predates a defaulted field never stored it; the loader fills the default in, and the
    hash still verifies because it covers what was stored, not the re-dumped model."""
    data = json.loads(LEGACY.read_text())
    for key in ("alignment", "training_outcome"):  # both have defaults in the model
        del data[key]
    del data["serving"]["eagle_topk"]
    data["content_hash"] = _sha_of_stored(data)
    c = load_contract(write(tmp_path, data))
    assert c.alignment.recorded_row == "token_t" and c.serving.eagle_topk is None
    # and an edit of the stored content is still caught
    data["name"] = "renamed"
    assert bad(tmp_path, data).field == "content_hash"
