"""What SGLang says, as specparity's records: an exception in a child as a typed failure, and the warnings it logs.

An exception raised inside SGLang is ``sglang_exception`` quoting SGLang's innermost ``file:line``; one raised in
specparity's own adapter code is a gap in specparity (``unsupported_version``), never SGLang's verdict; a target
the engine's transformers does not know, and torch refusing a CUDA query on a machine without a GPU, are named as
such. No sglang import here.
"""

from __future__ import annotations

import json
import logging
import os
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from specparity.serving.child.exception_text import exception_text
from specparity.serving.results import NEEDS_HARDWARE, SGLANG_EXCEPTION, UNSUPPORTED_VERSION, ServingFailure


def exception_failure(exc: BaseException, *, prefix: str = "") -> ServingFailure:
    """``sglang_exception`` quoting type, message and the innermost sglang ``file:line``."""
    where = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        fname = frame.filename.replace("\\", "/")
        if "/sglang/" in fname and "/specparity/" not in fname:  # specparity's own serving/sglang/ is not SGLang
            where = f" at {fname[fname.rindex('/sglang/') + 1 :]}:{frame.lineno}"
            break
    # every line of the reason (a first line may only announce it: transformers' strict config classes,
    # pydantic's "1 validation error for ..."), shortened by serving/child/exception_text.py
    return ServingFailure(SGLANG_EXCEPTION, f"{prefix}{exception_text(exc)}{where}")


def harness_gap_failure(exc: BaseException, *, module_file: str | Sequence[str], sglang_version: str,
                        prefix: str = "") -> ServingFailure | None:
    """An exception raised in specparity's own adapter code (``module_file``), not in SGLang: a gap in this
    adapter for the deployment's architecture, reported as ``unsupported_version`` (the check could not run, exit 3)
    and never as SGLang refusing the deployment. None when the raising frame is anywhere else."""
    # the innermost frame of SGLang's or specparity's own code decides (library frames below it, e.g.
    # transformers' config __getattribute__ raising the AttributeError, do not)
    ours = {os.path.realpath(f) for f in ([module_file] if isinstance(module_file, str) else module_file)}
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        fname = frame.filename.replace("\\", "/")
        if os.path.realpath(frame.filename) in ours:
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return ServingFailure(UNSUPPORTED_VERSION, (
                f"{prefix}specparity's adapter for sglang {sglang_version} cannot resolve this architecture: "
                f"{type(exc).__name__}: {text} at specparity/serving/sglang/{_in_room(fname)}:{frame.lineno}; "
                "this is a gap in specparity, not a verdict on the deployment"))
        if "/sglang/" in fname or "/specparity/" in fname:
            return None
    return None


def unknown_architecture_failure(exc: BaseException, *, target: str | Path, sglang_version: str,
                                 prefix: str = "") -> ServingFailure | None:
    """The same "does not recognize this architecture" refusal on every version, or None for any other exception.

    SGLang reads the target's config with transformers' ``AutoConfig`` (0.4.8 ``hf_transformers_utils.py:118``).
    A model_type the installed transformers does not know is refused in one of two words, depending on the
    config: without ``auto_map``, "... Transformers does not recognize this architecture"
    (``models/auto/configuration_auto.py``); with an ``auto_map`` (Kimi-K2.5's hub config), "The repository ...
    contains custom code which must be executed" (``dynamic_module_utils.py`` ``resolve_trust_remote_code``),
    which does not say that the architecture is unknown. Both are this case when the exception is a ValueError
    raised inside transformers and the target's model_type is absent from that transformers' own registry
    (``CONFIG_MAPPING``): checked here, in the child, against the engine's transformers, not guessed from text.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    if not isinstance(exc, ValueError) or not frames or "/transformers/" not in frames[-1].filename.replace("\\", "/"):
        return None
    try:
        cfg = json.loads((Path(target) / "config.json").read_text())
        from transformers import __version__ as transformers_version
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except Exception:  # unreadable config or no transformers: leave the exception as it was
        return None
    model_type = cfg.get("model_type") if isinstance(cfg, dict) else None
    if not isinstance(model_type, str) or model_type in CONFIG_MAPPING:
        return None
    archs = cfg.get("architectures")
    arch = f" ({', '.join(map(str, archs))})" if isinstance(archs, list) and archs else ""
    remote = (" (its config.json names only remote code in auto_map, which SGLang does not run here)"
              if isinstance(cfg.get("auto_map"), dict) else "")
    said = exception_failure(exc).message
    return ServingFailure(SGLANG_EXCEPTION, (
        f"{prefix}sglang {sglang_version} does not recognize this architecture: the target's model_type "
        f"{model_type!r}{arch} is unknown to the transformers {transformers_version} it reads configs with"
        f"{remote}; this SGLang cannot serve the target. transformers said: {said}"))


def gpu_query_failure(exc: BaseException, *, stage: str) -> ServingFailure | None:
    """``needs_hardware`` when ``exc`` is torch refusing a CUDA query on a machine without a GPU, else None.

    The innermost frame is torch's own CUDA module (``torch/cuda/__init__.py`` ``_lazy_init``: "Found no
    NVIDIA driver", "Torch not compiled with CUDA"); the SGLang frame that asked is named, e.g.
    ``arg_groups/model_hook.py:341`` (DSA models read ``torch.cuda.get_device_capability()`` while resolving
    ServerArgs) or ``models/qwen3_next.py:252`` (``torch.get_device_module().current_device()``, which is
    torch.cuda on a CUDA build of torch, while constructing). On a machine with a GPU these calls succeed.
    """
    import torch

    frames = traceback.extract_tb(exc.__traceback__)
    if torch.cuda.is_available() or not frames or "/torch/cuda/" not in frames[-1].filename.replace("\\", "/"):
        return None
    asked = next((f"{f.filename[f.filename.rindex('/sglang/') + 1:]}:{f.lineno}" for f in reversed(frames)
                  if "/sglang/" in f.filename.replace("\\", "/")), "?")
    why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    return ServingFailure(NEEDS_HARDWARE, f"{stage}, SGLang asks for a GPU at {asked} ({type(exc).__name__}: {why}); "
                          "this machine has none, so SGLang's own code cannot resolve the deployment here")


class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def collect_sglang_warnings(logger_name: str = "sglang") -> Iterator[list[str]]:
    """Collect WARNING+ messages SGLang logs under ``logger_name`` while the block runs."""
    handler = _ListHandler()
    log = logging.getLogger(logger_name)
    log.addHandler(handler)
    try:
        yield handler.lines
    finally:
        log.removeHandler(handler)


def _in_room(fname: str) -> str:
    """A file of specparity's SGLang room as its path inside ``serving/sglang/`` (``since_0_4_4/static.py``)."""
    key = "/serving/sglang/"
    return fname[fname.rindex(key) + len(key):] if key in fname else Path(fname).name
