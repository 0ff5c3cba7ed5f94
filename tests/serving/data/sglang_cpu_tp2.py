"""Two ranks of SGLang's own CPU engine build their parallel groups (tests/serving/test_sglang_cpu_tp.py).

Each rank runs as SGLang's scheduler would on the CPU platform: ``SGLANG_USE_CPU_ENGINE=1``, the sgl_kernel import
stand-in where the real one is missing (as the capture child installs it), ServerArgs with ``tp_size=2`` and
``device=cpu`` published with this rank's placement, then SGLang's ``init_distributed_environment`` (gloo, on
loopback) and ``initialize_model_parallel``. Each writes ``rank<R>.json`` in OUT_DIR (its own file: two ranks
printing to one pipe can interleave): ok, or the exception and where it was raised.
Usage: python sglang_cpu_tp2.py PORT TARGET_DIR OUT_DIR
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import traceback


def _report(out: str, r: int, result: dict[str, object]) -> None:
    with open(os.path.join(out, f"rank{r}.json"), "w") as f:
        json.dump({"rank": r, **result}, f)


def rank(r: int, port: int, target: str, out: str) -> None:
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    try:
        from specparity.serving.sglang.worker import install_kernel_stub_if_needed

        install_kernel_stub_if_needed("cpu")
        from sglang.srt.distributed import parallel_state as ps
        from sglang.srt.runtime_context import SpawnRanks, publish
        from sglang.srt.server_args import ServerArgs

        publish(ServerArgs(model_path=target, tp_size=2, device="cpu"), role="scheduler",
                ranks=SpawnRanks(world_rank=r))
        ps.init_distributed_environment(world_size=2, rank=r, local_rank=r, backend="gloo",
                                        distributed_init_method=f"tcp://127.0.0.1:{port}")
        ps.initialize_model_parallel(backend="gloo")
        _report(out, r, {"ok": True})
    except BaseException as e:  # reported, never raised: the parent asserts on it
        frames = traceback.extract_tb(e.__traceback__)
        _report(out, r, {"ok": False, "error": f"{type(e).__name__}: {e}"[:400],
                         "where": [f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in frames]})


if __name__ == "__main__":
    port, target, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    procs = [mp.get_context("spawn").Process(target=rank, args=(r, port, target, out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
        if p.is_alive():
            p.kill()
