"""Which files of a checkpoint directory hold its weights, as SGLang's loader picks them.

SGLang (sglang 0.5.23 model_loader/loader.py:495-579 `_prepare_weights`) loads ``*.safetensors`` when there
are any, else ``*.bin`` (``*.pt`` as the fallback); with ``model.safetensors.index.json`` it keeps only the
shards the index names (model_loader/weight_utils.py:757-808 `filter_duplicate_safetensors_files`), and from
pickles it drops trainer state such as ``training_args.bin`` and ``optimizer.pt`` (weight_utils.py:868-884
`filter_files_not_needed_for_inference`). The readers in training/ and serving/ share this rule, so a
sharded checkpoint is read whole and a ``training_args.bin`` beside the weights is never unpickled.

:func:`check_weight_files` reads those files as far as it takes to know the engine can load them (safetensors
headers against the file's size; pickles only through ``weights_only``, onto the meta device), so that a broken
file is bad input (exit 2) naming the file, before any engine starts, and never an engine failure.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specparity.errors import InputError

# sglang 0.5.23 model_loader/weight_utils.py:875-880
NOT_WEIGHTS = ("training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt")
SAFETENSORS_INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class WeightFiles:
    """The weight files of a directory, and the files beside them that were left out (and why)."""

    files: tuple[Path, ...]
    ignored: tuple[tuple[str, str], ...] = ()  # (file name, reason)
    index: Path | None = None


def _from_index(directory: Path, index: Path) -> WeightFiles:
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
        weight_map = data["weight_map"]
        names = sorted({str(v) for v in weight_map.values()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise InputError(f"unreadable checkpoint index ({type(e).__name__}: {e})", path=index,
                         field="weight_map") from None
    missing = [n for n in names if not (directory / n).is_file()]
    if missing:
        raise InputError(f"the index names shard(s) that are not there: {', '.join(missing)}", path=index,
                         field="weight_map")
    return WeightFiles(tuple(directory / n for n in names), index=index)


def weight_files(directory: Path) -> WeightFiles:
    """The files SGLang would load weights from; ``files`` is empty when there are none.

    An index that names missing shards, or that cannot be read, is an :class:`InputError`.
    """
    if not directory.is_dir():
        return WeightFiles(())
    safetensors = sorted(directory.glob("*.safetensors"))
    if safetensors:
        index = directory / SAFETENSORS_INDEX
        if not index.is_file():
            return WeightFiles(tuple(safetensors))
        found = _from_index(directory, index)
        extra = tuple((p.name, f"not named in {index.name}") for p in safetensors if p not in found.files)
        return WeightFiles(found.files, extra, index)
    ignored: list[tuple[str, str]] = []
    for suffix in ("*.bin", "*.pt"):
        pickled = sorted(p for p in directory.glob(suffix) if p.is_file())
        ignored += [(p.name, "trainer state, not weights (SGLang skips it)") for p in pickled if p.name in NOT_WEIGHTS]
        kept = tuple(p for p in pickled if p.name not in NOT_WEIGHTS)
        if kept:
            return WeightFiles(kept, tuple(ignored))
    return WeightFiles((), tuple(ignored))


# safetensors refuses headers over 100 MB (safetensors 0.4 lib.rs MAX_HEADER_SIZE)
MAX_SAFETENSORS_HEADER = 100_000_000


def _checked_file(path: Path, *, field: str) -> int:
    """The size of ``path``, a non-empty regular file (symlinks followed); else an InputError saying what it is."""
    try:
        st = path.stat()
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InputError("a symlink loop: following it never reaches a file", path=path, field=field) from None
        if path.is_symlink():
            raise InputError(f"a symlink to {os.readlink(path)}, which does not exist", path=path,
                             field=field) from None
        raise InputError(f"cannot read: {e.strerror or e}", path=path, field=field) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"a directory, not a weight file: the engine loads every *{path.suffix} beside it as "
                         "weights", path=path, field=field)
    if not stat.S_ISREG(st.st_mode):
        raise InputError("not a regular file", path=path, field=field)
    if st.st_size == 0:
        raise InputError("0 bytes: an empty file, not a checkpoint (copy the weights again)", path=path, field=field)
    return st.st_size


def read_safetensors_header(path: Path, *, field: str = "header") -> dict[str, Any]:
    """Tensor name -> ``{"dtype", "shape", "data_offsets"}`` from a safetensors file's header (no tensor data read),
    checked against the file: a truncated or malformed file is an :class:`InputError` naming it.

    Layout: a u64 little-endian header length, the JSON header, then the tensor data the offsets point into.
    """
    size = _checked_file(path, field=field)
    try:
        with path.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise InputError(f"truncated: {size} bytes, shorter than the 8-byte header length", path=path,
                                 field=field)
            (n,) = struct.unpack("<Q", head)
            if n > MAX_SAFETENSORS_HEADER or 8 + n > size:
                raise InputError(f"truncated or not safetensors: the header claims {n} bytes, the file has {size}",
                                 path=path, field=field)
            header = json.loads(fh.read(n))
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror or e}", path=path, field=field) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"not safetensors: the header is not JSON ({e})", path=path, field=field) from None
    if not isinstance(header, dict):
        raise InputError("not safetensors: the header is not a JSON object", path=path, field=field)
    header.pop("__metadata__", None)
    end = 0
    for name, entry in header.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(x, int) for x in offsets)
                and 0 <= offsets[0] <= offsets[1] and isinstance(shape, list)
                and all(isinstance(x, int) and x >= 0 for x in shape)):
            raise InputError(f"not safetensors: tensor {name!r} has no valid shape and data_offsets", path=path,
                             field=field)
        end = max(end, offsets[1])
    if 8 + n + end > size:
        raise InputError(f"truncated: its tensors end at byte {8 + n + end}, the file at byte {size}", path=path,
                         field=field)
    return header


def weights_only_refusal(error: BaseException) -> str:
    """What torch's ``weights_only`` unpickler refused, without its advice (to load with ``weights_only=False``, or
    to allowlist the global): ``Unsupported global: GLOBAL pathlib.Path.touch``."""
    text = str(error)
    m = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\n\s*\n|$)", text, re.S)
    reason = " ".join(m.group(1).split()) if m else (text.strip().splitlines() or [type(error).__name__])[0]
    for cut in (" was not an allowed global", ". Please", " Please use"):
        reason = reason.split(cut)[0]
    return reason.strip().rstrip(".")


def check_pickled_weights(path: Path, *, field: str) -> dict[str, Any]:
    """A ``*.bin``/``*.pt`` weight file loads as a dict of tensors under ``weights_only`` (what the engines' loaders
    use), onto the meta device (no tensor data read); anything else pickled in it is refused, never unpickled."""
    import pickle
    import zipfile

    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Detected pickle protocol 4 in the checkpoint": the refusal says it
            state = torch.load(path, map_location="meta", weights_only=True)
    except pickle.UnpicklingError as e:
        raise InputError(f"refused, never unpickled: it pickles more than tensors ({weights_only_refusal(e)}), which "
                         "weights_only loading (the engine's own) will not read; save the weights as safetensors or "
                         "as a plain state dict", path=path, field=field) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError, struct.error, KeyError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise InputError(f"truncated or corrupt torch file ({first})", path=path, field=field) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise InputError(f"holds {type(state).__name__} of other things, not a state dict of tensors", path=path,
                         field=field)
    return state


def check_weight_files(directory: Path, *, field: str, pickles: bool = True) -> WeightFiles:
    """The files the engine will load from ``directory`` (:func:`weight_files`), each checked to be loadable: a
    non-empty regular file, a whole safetensors header, and (with ``pickles``) a pickle that ``weights_only``
    reads as a state dict. Raises :class:`InputError` naming the file and ``field`` (the option that named the
    directory); a directory without weight files is left to the engine's own report."""
    found = weight_files(directory)
    for f in found.files:
        if f.suffix == ".safetensors":
            read_safetensors_header(f, field=field)
        else:
            _checked_file(f, field=field)
            if pickles:
                check_pickled_weights(f, field=field)
    return found


# What a draft checkpoint's headers say: read by both engines' children and SGLang's live static level
@dataclass(frozen=True)
class FcShape:
    """``fc`` as stored in the draft checkpoint."""

    in_features: int
    out_features: int
    bias: bool
    weight_key: str


def _safetensors_keys(path: Path) -> dict[str, Any]:
    """The header of a safetensors file (no tensor data read); a broken file is an InputError naming it."""
    return read_safetensors_header(path, field="draft weights")


def checkpoint_shapes(draft_dir: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape for every weight file of a draft checkpoint, reading headers only.

    The files are the ones SGLang loads (:func:`weight_files`: shards named by an index, no
    ``training_args.bin`` or other trainer state, which ``weights_only`` could not unpickle anyway). A file that
    cannot be read that way (empty, truncated, a directory, a symlink loop, a pickle of more than tensors) is an
    :class:`~specparity.errors.InputError` naming it (the gate refuses those before the engine starts:
    :func:`check_weight_files`).
    """
    shapes: dict[str, tuple[int, ...]] = {}
    for f in weight_files(draft_dir).files:
        if f.suffix == ".safetensors":
            for k, v in _safetensors_keys(f).items():
                shapes[k] = tuple(int(x) for x in v["shape"])
            continue
        import torch

        state = check_pickled_weights(f, field="draft weights")
        for k, t in state.items():
            if isinstance(t, torch.Tensor):
                shapes[k] = tuple(int(x) for x in t.shape)
    return shapes


def fc_shape_from_checkpoint(draft_dir: Path) -> FcShape | None:
    """``fc`` in/out features and bias from the checkpoint; ``None`` when there is no ``fc.weight``.

    Name rule as SGLang's loader sees it (sglang 0.5.23 models/llama_eagle3.py:338-353): the key is
    ``fc.weight`` with an optional module prefix (``model.fc.weight``); ``fc_norm.*`` is a different module.
    """
    shapes = checkpoint_shapes(draft_dir)
    candidates = sorted(k for k in shapes if k == "fc.weight" or k.endswith(".fc.weight"))
    if not candidates:
        return None
    key = min(candidates, key=len)
    out_f, in_f = shapes[key][0], shapes[key][1]
    return FcShape(
        in_features=in_f, out_features=out_f, bias=key[: -len("weight")] + "bias" in shapes, weight_key=key
    )
