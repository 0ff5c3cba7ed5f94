"""What an SGLang child sets up for itself before SGLang runs: the modules a warm zygote preloads, the distributed
port (without the files SGLang's own port choice leaves), and the CPU memory fraction its ServerArgs get.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
