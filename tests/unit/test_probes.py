"""Probe packs: lossless (bf16 too), byte-stable, and every defect named by file and field."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from specparity.contract import ProbePack, ProbeSample, read_probe_pack, write_probe_pack
from specparity.contract.probes import file_sha256
from specparity.errors import InputError


def pack(dtype: torch.dtype = torch.bfloat16, n: int = 2) -> ProbePack:
    g = torch.Generator().manual_seed(0)
    samples = [ProbeSample(torch.arange(5 + i), torch.randn(5 + i, 12, generator=g).to(dtype), torch.ones(5 + i),
                           torch.randn(5 + i, 4, generator=g).to(dtype)) for i in range(n)]
    return ProbePack(samples, ["embedding", "layer:0", "layer:2"], 4)


@settings(max_examples=10, deadline=None)
@given(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), st.integers(min_value=1, max_value=4))
def test_round_trip_is_lossless_and_bytes_are_stable(tmp_path_factory, dtype, n):
    d = tmp_path_factory.mktemp("p")
    sha = write_probe_pack(pack(dtype, n), d / "a.safetensors")
    assert write_probe_pack(pack(dtype, n), d / "b.safetensors") == sha  # same content, same bytes
    back = read_probe_pack(d / "a.safetensors", expected_sha256=sha)
    assert back.sources == ["embedding", "layer:0", "layer:2"] and back.dtype == str(dtype).removeprefix("torch.")
    for a, b in zip(back.samples, pack(dtype, n).samples, strict=True):
        assert a.fc_input.dtype == dtype and torch.equal(a.fc_input, b.fc_input)


def test_missing_pack(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="probe pack not found") as e:
        read_probe_pack(tmp_path / "x.safetensors")
    assert e.value.field == "probes.file"


def test_altered_pack_fails_its_hash(tmp_path: Path) -> None:
    p = tmp_path / "p.safetensors"
    sha = write_probe_pack(pack(), p)
    p.write_bytes(p.read_bytes()[:-1] + b"\0")
    assert file_sha256(p) != sha
    with pytest.raises(InputError) as e:
        read_probe_pack(p, expected_sha256=sha)
    assert e.value.field == "probes.sha256"


def test_foreign_safetensors_is_not_a_probe_pack(tmp_path: Path) -> None:
    p = tmp_path / "w.safetensors"
    save_file({"fc.weight": torch.zeros(2, 2)}, str(p))
    with pytest.raises(InputError) as e:
        read_probe_pack(p)
    assert e.value.field == "format"


def test_truncated_pack(tmp_path: Path) -> None:
    p = tmp_path / "p.safetensors"
    write_probe_pack(pack(), p)
    p.write_bytes(p.read_bytes()[:40])
    with pytest.raises(InputError, match="not a readable safetensors file"):
        read_probe_pack(p)
