"""Which files of a checkpoint directory hold its weights, as SGLang's loader picks them.

SGLang (sglang 0.5.23 model_loader/loader.py:495-579 `_prepare_weights`) loads ``*.safetensors`` when there
are any, else ``*.bin`` (``*.pt`` as the fallback); with ``model.safetensors.index.json`` it keeps only the
shards the index names (model_loader/weight_utils.py:757-808 `filter_duplicate_safetensors_files`), and from
pickles it drops trainer state such as ``training_args.bin`` and ``optimizer.pt`` (weight_utils.py:868-884
`filter_files_not_needed_for_inference`). The readers in training/ and serving/ share this rule, so a
sharded checkpoint is read whole and a ``training_args.bin`` beside the weights is never unpickled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

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
