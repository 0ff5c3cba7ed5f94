"""Bad inputs, each built from the bundled tiny deployment: the bad files a user may give (and a few beside),
and the file systems that refuse a report (a small tmpfs, read-only or full; a path under a regular file).

Each builder writes a copy into a directory the caller owns and returns what a gate run takes (a draft directory, a
contract path); the bundle itself is never touched. ``BAD_DRAFTS`` and ``BAD_CONTRACTS`` name every case with the
file and field its exit-2 message must name, so the unit tests (tests/unit/test_bad_inputs.py,
tests/unit/test_report_files.py) and a fault tier can walk the same tables. Imported as ``tests.bad_inputs`` (pytest
puts the checkout's root on sys.path).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pickle
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / "fixtures" / "default"
CONTRACT = ROOT / "contracts" / "tiny-llama-eagle3.json"
WEIGHTS = "model.safetensors"


def draft_copy(dest: Path, source: Path = BUNDLE / "draft") -> Path:
    """A copy of the bundled drafter at ``dest``."""
    shutil.copytree(source, dest)
    return dest


def empty_weights(dest: Path) -> Path:
    """A drafter whose ``model.safetensors`` has 0 bytes."""
    d = draft_copy(dest)
    (d / WEIGHTS).write_bytes(b"")
    return d


def symlink_loop(dest: Path) -> Path:
    """A drafter whose ``model.safetensors`` is a symlink to itself (open: ELOOP)."""
    d = draft_copy(dest)
    (d / WEIGHTS).unlink()
    (d / WEIGHTS).symlink_to(WEIGHTS)
    return d


def directory_weights(dest: Path) -> Path:
    """A drafter whose ``model.safetensors`` is a directory."""
    d = draft_copy(dest)
    (d / WEIGHTS).unlink()
    (d / WEIGHTS).mkdir()
    return d


def truncated_weights(dest: Path) -> Path:
    """A drafter whose ``model.safetensors`` ends inside its tensor data (a copy cut short)."""
    d = draft_copy(dest)
    data = (d / WEIGHTS).read_bytes()
    (d / WEIGHTS).write_bytes(data[: len(data) // 2])
    return d


class Tripwire:
    """Unpickling this calls ``Path.touch`` on its marker: the marker existing means a pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., object], tuple[object, ...]]:
        return (Path.touch, (self.marker,))


def tripwire_marker(draft: Path) -> Path:
    """Where :func:`pickle_bin` points its tripwire."""
    return draft.parent / f"{draft.name}.unpickled"


def pickle_bin(dest: Path) -> Path:
    """A drafter whose weights are a ``model.bin`` pickle holding an object beside the tensors: loading it with
    ``weights_only=False`` would run ``Path.touch`` (:func:`tripwire_marker`)."""
    d = draft_copy(dest)
    from safetensors.torch import load_file

    state: dict[str, object] = {"trainer": Tripwire(tripwire_marker(d)), **load_file(str(d / WEIGHTS))}
    (d / WEIGHTS).unlink()
    with (d / "model.bin").open("wb") as fh:
        pickle.dump(state, fh, protocol=2)  # torch's weights_only unpickler reads protocol 2 as far as the object
    return d


def torch_bin(dest: Path) -> Path:
    """A drafter saved as a plain ``torch.save`` state dict (``pytorch_model.bin``): valid weights that SGLang and vLLM
    load (``weights_only`` is enough), which the drafter replay (safetensors only) does not read."""
    d = draft_copy(dest)
    from safetensors.torch import load_file

    torch.save(load_file(str(d / WEIGHTS)), d / "pytorch_model.bin")
    (d / WEIGHTS).unlink()
    return d


@dataclass(frozen=True)
class BadDraft:
    build: Callable[[Path], Path]
    file: str  # the file the message names
    says: str  # words the message holds


BAD_DRAFTS: dict[str, BadDraft] = {
    "empty": BadDraft(empty_weights, WEIGHTS, "0 bytes"),
    "symlink_loop": BadDraft(symlink_loop, WEIGHTS, "symlink loop"),
    "directory": BadDraft(directory_weights, WEIGHTS, "a directory"),
    "truncated": BadDraft(truncated_weights, WEIGHTS, "truncated"),
    "pickle": BadDraft(pickle_bin, "model.bin", "Unsupported global"),
}


# --- contracts and probe packs ---------------------------------------------------------------------------------


def contract_copy(dest: Path, source: Path = CONTRACT) -> Path:
    """The bundled contract and its probe pack, copied into the directory ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    data = json.loads(source.read_text())
    shutil.copy2(source.parent / data["probes"]["file"], dest / data["probes"]["file"])
    return Path(shutil.copy2(source, dest / source.name))


def _rewrite_pack(contract_path: Path, change: Callable[[list[dict[str, torch.Tensor]]], None]) -> Path:
    """Rewrite the probe pack beside ``contract_path`` with ``change`` applied to its samples' tensors, and store the
    pack's new sha256 and size in the contract, rehashed: the pack is consistent with its contract, only bad."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from specparity.contract.io import stored_hash
    from specparity.contract.probes import file_sha256

    data = json.loads(contract_path.read_text())
    pack = contract_path.parent / data["probes"]["file"]
    with safe_open(str(pack), framework="pt") as fh:
        meta = fh.metadata()
    tensors = load_file(str(pack))
    n = data["probes"]["num_samples"]
    samples = [{k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith(f"sample_{i}.")} for i in range(n)]
    change(samples)
    save_file({f"sample_{i}.{k}": v.contiguous() for i, s in enumerate(samples) for k, v in s.items()}, str(pack),
              metadata=meta)
    data["probes"]["sha256"] = file_sha256(pack)
    data["content_hash"] = stored_hash(data)
    contract_path.write_text(json.dumps(data, indent=2) + "\n")
    return contract_path


def zero_token_probe(dest: Path, sample: int = 1) -> Path:
    """A contract whose probe ``sample`` holds 0 tokens (its ids and fc input cut to no rows)."""

    def cut(samples: list[dict[str, torch.Tensor]]) -> None:
        samples[sample] = {k: v[:0] for k, v in samples[sample].items()}

    return _rewrite_pack(contract_copy(dest), cut)


def nonfinite_fc_input(dest: Path, value: float = math.nan, *, sample: int = 2, row: int = 3) -> Path:
    """A contract whose recorded ``fc_input`` of probe ``sample`` holds ``value`` (NaN or Inf) at ``row``."""

    def poison(samples: list[dict[str, torch.Tensor]]) -> None:
        fc = samples[sample]["fc_input"].clone()
        fc[row, 5] = value
        samples[sample]["fc_input"] = fc

    return _rewrite_pack(contract_copy(dest), poison)


def nan_acceptance(dest: Path) -> Path:
    """A contract with a bare ``NaN`` in ``training_outcome.acceptance_per_position`` (what Python's json writes for
    float('nan')), its content hash recomputed so that only the number is wrong."""
    from specparity.contract.io import stored_hash

    path = contract_copy(dest)
    data = json.loads(path.read_text())
    data["training_outcome"]["acceptance_per_position"][1] = math.nan
    data["content_hash"] = stored_hash(data)
    text = json.dumps(data, indent=2)
    assert "NaN" in text
    path.write_text(text + "\n")
    return path


@dataclass(frozen=True)
class BadContract:
    build: Callable[[Path], Path]
    file: str  # "contract" or "probes": which of the two files the message names
    field: str
    says: str


BAD_CONTRACTS: dict[str, BadContract] = {
    "zero_tokens": BadContract(zero_token_probe, "probes", "sample_1.input_ids", "0 tokens"),
    "nan_fc_input": BadContract(nonfinite_fc_input, "probes", "sample_2.fc_input", "NaN"),
    "inf_fc_input": BadContract(lambda d: nonfinite_fc_input(d, math.inf), "probes", "sample_2.fc_input", "Inf"),
    "nan_acceptance": BadContract(nan_acceptance, "contract", "training_outcome.acceptance_per_position[1]",
                                  "finite"),
}


def named_file(contract_path: Path, which: str) -> Path:
    """The file a :class:`BadContract`'s message names."""
    if which == "contract":
        return contract_path
    return contract_path.parent / json.loads(contract_path.read_text())["probes"]["file"]


# --- file systems that refuse writes ----------------------------------------------------------------------------


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


needs_root = pytest.mark.skipif(not is_root(), reason="mounts a tmpfs: needs root (CI runs as root)")


@contextlib.contextmanager
def tmpfs(path: Path, *, size: str = "64k", read_only: bool = False) -> Iterator[Path]:
    """A small tmpfs mounted at ``path`` (made if missing) for the block, unmounted after it. ``read_only``
    remounts it read-only once made, so files written into ``path`` before the remount are there to read."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def under_a_file(root: Path, name: str = "r.json") -> Path:
    """A report path whose parent is a regular file."""
    (root / "plain").write_text("not a folder\n")
    return root / "plain" / name
