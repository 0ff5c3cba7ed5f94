"""Version-independent helpers shared by every SGLang adapter (no sglang import here).

Mapping SGLang boundary indices to canonical names, turning exceptions into typed failures, collecting
SGLang's log lines, and judging a raw fc capture. Reading the draft checkpoint's ``fc`` and the non-finite check,
which vLLM's worker needs too, live in :mod:`specparity.serving.child.worker_common`.
"""

from __future__ import annotations

import json
import logging
import os
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# both engines' workers read these (checkpoint_files.py, serving/child/worker_common.py); importable from here too
from specparity.checkpoint_files import FcShape as FcShape
from specparity.checkpoint_files import checkpoint_shapes as checkpoint_shapes
from specparity.checkpoint_files import fc_shape_from_checkpoint as fc_shape_from_checkpoint
from specparity.serving.child.exception_text import exception_text
from specparity.serving.child.worker_common import nonfinite_failures as nonfinite_failures
from specparity.serving.results import (
    CAPTURE_COUNT_SHORT,
    CAPTURE_SHAPE,
    FC_NOT_CALLED,
    NEEDS_HARDWARE,
    SGLANG_EXCEPTION,
    UNSUPPORTED_VERSION,
    ResolvedDeployment,
    ServingFailure,
)
from specparity.sources import boundary_to_source

NORM_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")


def applied_norm_flags(drafter_inner: Any) -> dict[str, bool]:
    """The norms the drafter SGLang built really applies, read from its modules, not from the config.

    sglang 0.5.23 models/llama_eagle3.py:169-207 builds ``input_norm`` iff ``norm_before_fc``, ``fc_norm``
    (a ModuleList) iff ``fc_norm``/``use_aux_norm``, and keeps ``norm_output``; 0.5.3 and 0.4.10.post2
    (models/llama_eagle3.py:120-142) build only ``fc``, ``midlayer`` and ``norm``, so every flag reads False
    there whatever the config says (domain.md D5).
    """
    return {
        "norm_before_fc": getattr(drafter_inner, "input_norm", None) is not None,
        "fc_norm": getattr(drafter_inner, "fc_norm", None) is not None,
        "norm_output": bool(getattr(drafter_inner, "norm_output", False)),
    }


def with_applied_norms(dep: ResolvedDeployment, drafter_inner: Any, **changes: Any) -> ResolvedDeployment:
    """``dep`` with its norm flags read from the built drafter (:func:`applied_norm_flags`) and ``changes``."""
    import dataclasses

    f = applied_norm_flags(drafter_inner)
    return dataclasses.replace(dep, norm_before_fc=f["norm_before_fc"], fc_norm=f["fc_norm"],
                               norm_output=f["norm_output"], **changes)


def served_sources(
    layers_to_capture: Sequence[int], num_layers: int, *, max_reachable: int
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Boundary indices -> canonical sources in fc-chunk order, plus the unreachable boundaries.

    Every SGLang version tests ``i in layers_to_capture`` inside the layer loop (sglang 0.5.23
    models/llama.py:485-493), so chunks come out ascending and deduplicated; a boundary above
    ``max_reachable`` (``L-1`` for llama-style loops) is never captured (domain.md §3.1).
    """
    reachable = sorted({b for b in layers_to_capture if 0 <= b <= max_reachable})
    unreachable = tuple(sorted({b for b in layers_to_capture if not 0 <= b <= max_reachable}))
    return tuple(boundary_to_source(b, num_layers) for b in reachable), unreachable


# What every adapter's resolve/capture imports (the model registry imports every model file). A warm zygote
# (serving/child/zygote.py) imports these once through the adapter's ``warm``, after the adapter's own set-up.
PRELOAD = (
    "sglang.srt.server_args", "sglang.srt.configs.model_config", "sglang.srt.model_loader.loader",
    "sglang.srt.models.registry", "sglang.srt.managers.tp_worker", "sglang.srt.managers.schedule_batch",
    "sglang.srt.speculative.spec_info", "sglang.srt.model_executor.forward_batch_info",
    "sglang.srt.sampling.sampling_params", "sglang.benchmark.one_batch", "sglang.srt.speculative.eagle_worker",
    "sglang.srt.speculative.eagle_worker_v2", "sglang.srt.arg_groups.pipeline",
)


def preload_engine_modules() -> list[str]:
    """Import :data:`PRELOAD` (names a version lacks, or that fail, are left to the job); returns those imported."""
    import importlib

    done = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # absent in this version, or it fails: the job imports (and reports) it itself
            continue
        done.append(name)
    return done


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


def judge_fc_capture(
    *,
    hook_calls: int,
    rows: int | None,
    width: int | None,
    expected_rows: int,
    expected_width: int,
    aux_captured: int,
    aux_expected: int,
    fc_applied: bool,
    target_ran: bool = True,
) -> list[ServingFailure]:
    """Failures implied by what the fc pre-hook and the target aux hook saw. Pure; used by all adapters.

    Never a pass when the hook did not fire or saw fewer rows/chunks than the probes imply.
    ``target_ran`` is False when no target forward happened (then there is no aux count to judge).
    """
    failures: list[ServingFailure] = []
    if target_ran and aux_captured < aux_expected:
        failures.append(
            ServingFailure(
                CAPTURE_COUNT_SHORT,
                f"the target captured {aux_captured} aux hidden state(s) but the drafter's fc expects "
                f"{aux_expected}; a configured layer is unreachable or duplicated",
            )
        )
    if hook_calls == 0 or rows is None:
        why = (
            "SGLang skips fc when k*H_t == H_d (sglang 0.5.23 models/llama_eagle3.py:238)"
            if not fc_applied
            else "no forward reached the drafter"
            if expected_rows == 0
            else "the draft-extend forward never called fc"
        )
        failures.append(ServingFailure(FC_NOT_CALLED, f"the drafter's fc was never called: {why}"))
        return failures
    if rows != expected_rows or width != expected_width:
        failures.append(
            ServingFailure(
                CAPTURE_SHAPE,
                f"fc input was [{rows}, {width}], expected [{expected_rows}, {expected_width}] "
                "(sum of probe lengths, k*H_t)",
            )
        )
    return failures


def split_rows(tensor: Any, lengths: Sequence[int]) -> list[Any]:
    """Split a ``[sum T_i, ...]`` batch tensor back into per-sample ``[T_i, ...]`` tensors (clones)."""
    return [t.clone() for t in tensor.split(list(lengths), dim=0)]


def _weight_bytes(path: str) -> int:
    """Bytes of a model directory's safetensors, as float32 (the CPU capture serves float32 by default)."""
    d = Path(path)
    size = sum(p.stat().st_size for p in d.glob("*.safetensors")) if d.is_dir() else 0
    try:
        dtype = str(json.loads((d / "config.json").read_text()).get("torch_dtype", "float32"))
    except (OSError, ValueError, AttributeError):
        dtype = "float32"
    return size * (2 if dtype in ("bfloat16", "float16") else 1)


def nccl_port(server_args: Any) -> int:
    """The distributed port SGLang's own ``PortArgs.init_new`` picks, without the IPC placeholder files it also makes.

    ``init_new`` names an IPC endpoint for each process of SGLang's server (tokenizer, scheduler input, detokenizer,
    RPC, metrics) with ``tempfile.NamedTemporaryFile(delete=False)`` (0.5.23 ``server_args.py:781,807-812``): an
    empty file per endpoint in the temp directory, which SGLang never removes. A capture or static child starts none
    of those processes and uses the port alone, so it removes the placeholders again (empty regular files only: a
    bound socket is never touched); before this, every SGLang child left five or six files in ``/tmp``."""
    import dataclasses
    import stat

    from sglang.srt.server_args import PortArgs

    port_args = PortArgs.init_new(server_args)
    for f in dataclasses.fields(port_args):
        value = getattr(port_args, f.name)
        if isinstance(value, str) and value.startswith("ipc://"):
            path = Path(value[len("ipc://"):])
            try:
                st = path.lstat()
                if stat.S_ISREG(st.st_mode) and st.st_size == 0:
                    path.unlink()
            except OSError:
                pass
    return int(port_args.nccl_port)


def cpu_mem_fraction(target: str, draft: str) -> float:
    """``mem_fraction_static`` for a CPU capture (every family): 0.5, more where real weights need it.

    On CPU SGLang's "GPU memory" is the machine's available memory (``utils/common.py:454``,
    ``psutil.virtual_memory().available``). Start-up keeps ``pre * (1 - fraction)`` of what was available
    before the load as slack and refuses when what is left after it is not positive
    (``mem_cache/kv_cache_configurator.py:3041-3057``): everything any process on the machine allocated in
    between counts against the fraction. A fixed 0.1 made a real 135M target's start depend on what else ran
    (three gates at once needed 0.113): an environment failure of ours, never the deployment's. The pool itself
    is capped by ``max_total_tokens``, so a larger fraction only admits the weights and the machine's churn; it
    allocates nothing more. The toys had 0.1 until CI's sglang-0.5.20 run refused one start with "Loaded weights
    leave no GPU memory for the KV cache" (``kv_cache_configurator.py:2191``): the other pytest worker had taken
    more than a tenth of the machine's available memory during the load. 0.5 leaves the start room for half."""
    import psutil

    weights = _weight_bytes(target) + _weight_bytes(draft)
    available = max(1, int(psutil.virtual_memory().available))
    return round(min(0.8, 0.5 + 3.0 * weights / available), 3)


def draft_k(draft_hf_config: Any) -> int:
    # sglang 0.5.23 models/llama_eagle3.py:155-160: num_aux_hidden_states > len(eagle ids) > 3.
    k = getattr(draft_hf_config, "num_aux_hidden_states", None)
    if k is None:
        ec = getattr(draft_hf_config, "eagle_config", None) or {}
        ids = ec.get("eagle_aux_hidden_state_layer_ids") if isinstance(ec, dict) else None
        k = len(ids) if ids else 3
    return int(k)


def json_safe(v: Any) -> object:
    """A resolved server argument as JSON: scalars and lists as they are, anything else as its str."""
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, list | tuple):
        return [json_safe(x) for x in v]
    return str(v)


def _in_room(fname: str) -> str:
    """A file of specparity's SGLang room as its path inside ``serving/sglang/`` (``since_0_4_4/static.py``)."""
    key = "/serving/sglang/"
    return fname[fname.rindex(key) + len(key):] if key in fname else Path(fname).name
