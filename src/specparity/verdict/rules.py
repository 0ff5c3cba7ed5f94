"""The rules of a verdict, one for every face: which check each finding fails, the status, the exit code, and which
pytest item each finding fails.

The gate (gate.py) computes the findings once; everything here is a pure function of them, so the CLI
exit code, the JSON/HTML/JUnit reports and every pytest item are views of the same decision:

- each finding is tagged with the check it fails (:func:`tag_checks`): ``static``, ``capture``, ``outcome``, or
  ``engine`` (every check).
- status ``pass`` iff no finding is an error; ``error`` iff every error is environmental (the check
  could not run here); otherwise ``fail``.
- exit codes (errors.py): 0 pass; 1 the deployment does not match the contract, including a
  deployment SGLang refuses to load or crashes on and a wrong target; 2 the user's own files are
  malformed (raised as :class:`~specparity.errors.InputError` before a verdict exists); 3 the check
  could not run here (SGLang missing or unsupported, out of memory, timeout).
- a pytest item (``static``, ``capture[probe-i]``, ``outcome``) fails iff an error finding is on its
  check (``details["check"]``; ``engine`` means every check, ``sglang`` in older reports: docs/report-format.md,
  changelog) and, for a probe item, on no other probe
  (``details["sample"]`` absent or equal to the probe). The item's failure text is ``report/items.py``'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from specparity.compare.findings import ENGINE_THEN, ENVIRONMENT_KINDS, Finding, FindingKind, Severity
from specparity.compare.findings import (
    adapter_findings as adapter_findings,  # the decision's inputs, kept here by name
)
from specparity.compare.findings import is_environmental as is_environmental
from specparity.compare.findings import status_of as status_of

CHECKS = ("static", "capture", "outcome")
ALL_CHECKS = "engine"  # a finding on every check (the engine could not serve the deployment at all)
_ALL_CHECKS_BEFORE = "sglang"  # what reports written before engine_error called it (report-format.md changelog)

# findings the static check owns; everything else found with tensors belongs to the capture check
_STATIC_KINDS = frozenset({FindingKind.ENGINE_CONVENTION_MISMATCH, FindingKind.LAYOUT_ASSUMED,
                           FindingKind.RESOLUTION_NOTE, FindingKind.DEFAULT_IDS_FALLBACK,
                           FindingKind.SPEC_CONFIG_REWRITTEN, FindingKind.VOCAB_MAP_MISMATCH,
                           FindingKind.CONFIG_MISMATCH, FindingKind.NORM_MISMATCH,
                           FindingKind.UNTESTED_VERSION, FindingKind.DRAFT_IDS_IGNORED,
                           FindingKind.CUDA_GRAPH_IDS_HAZARD, FindingKind.TOKENIZER_MISMATCH,
                           FindingKind.CHAT_TEMPLATE_MISMATCH, FindingKind.SPECULATIVE_ALGORITHM_ASSUMED,
                           FindingKind.DRAFTER_FAMILY_MISMATCH})
_OUTCOME_KINDS = frozenset({FindingKind.ACCEPTANCE_COLLAPSE, FindingKind.ACCEPTANCE_BELOW_CONTRACT,
                            FindingKind.MODEL_QUALITY, FindingKind.ACCEPTANCE_INCONCLUSIVE})


def _check_of(f: Finding) -> str:
    if f.kind in _OUTCOME_KINDS:
        return "outcome"
    if f.kind in ENVIRONMENT_KINDS:
        return str(f.details.get("check", ALL_CHECKS))
    if f.kind in _STATIC_KINDS:
        return "static"
    return str(f.details.get("check", "capture"))


def tag_checks(findings: Sequence[Finding], level: str, static_layout: bool, *, engine: str,
               version: str | None) -> list[Finding]:
    """Each finding with the check (pytest item) it fails; an engine error also names the engine and release."""
    out = []
    named = {"engine": engine, "version": version}
    for f in findings:
        check = "static" if (level == "static" or (static_layout and f.chunk is None and
                                                   f.kind not in _OUTCOME_KINDS)) else _check_of(f)
        details = {**f.details}
        if f.kind in ENVIRONMENT_KINDS:
            details = {**named, **details}
            if "check" not in f.details:
                check = ALL_CHECKS
        out.append(Finding(f.kind, f.severity, f.message, f.chunk, {**details, "check": check}, f.fix))
    return out

# ServingFailure kinds (serving/results.py) that mean "this machine cannot run the check"; the strings are the
# kinds reports carry, each engine's own named for it (sglang_missing beside vllm_missing)
_ENVIRONMENT_FAILURES = frozenset({"sglang_missing", "vllm_missing", "engine_import", "unsupported_version",
                                   "timeout", "needs_hardware", "server_failed", "server_unreachable",
                                   "hooks_missing", "node_missing", "probe_not_isolated", "tap_overflow",
                                   "tap_lease_expired", "internal_error"})
# an SGLang exception that says nothing about the deployment: memory, a broken or partial install
# (sglang 0.5.23 mem_cache/kv_cache_configurator.py:3050 raises ValueError "Loaded weights leave no GPU memory
# for the KV cache": on CPU that budget is the machine's free RAM at start-up, which other processes move)
_ENVIRONMENT_EXCEPTION = re.compile(
    r"\b(MemoryError|OutOfMemoryError|ModuleNotFoundError|ImportError|PackageNotFoundError)\b|out of memory"
    r"|no GPU memory"
    r"|not enough memory|insufficient memory"
    # this machine's CPUs, not the deployment: vLLM's CPU thread binding wants a NUMA node per local worker
    # (vllm 0.32 utils/ompmultiprocessing.py:217 "Not enough allowed NUMA nodes to bind threads")
    r"|NUMA node"
    # the engine's worker processes died under it (vllm 0.32 v1/engine/exceptions.py EngineDeadError; "Engine core
    # initialization failed" is what the front end raises when the core process exited, v1/engine/core_client.py)
    r"|\bEngineDeadError\b|Engine core initialization failed|^Segfault in "
    # a distributed backend this env lacks: vLLM's ParallelConfig refuses the Ray executor without Ray installed
    # (vllm 0.32 config/parallel.py) - the machine's install, not the deployment
    r"|ray is not installed|install ray|No module named .?ray", re.IGNORECASE)


# What this machine's CPU backends cannot run that the deployment's GPU can: named refusals. The check
# cannot run here (exit 3, never a pass); the finding says which call refused and why it is the machine's.
# Each row: a pattern of the refusal (matched ignoring case) and why that refusal is the machine's.
_MACHINE_LIMIT_ROWS: tuple[tuple[str, str], ...] = (
    (r"No common block size .*CPU_MLA",
     "vLLM's CPU attention backends share no KV-cache block size when MLA and non-MLA attention serve together, an "
     "MLA target with its drafter or an MLA drafter over a non-MLA target (CPU_MLA takes blocks of 16 only, "
     "v1/attention/backends/mla/cpu_mla.py:67-68; CPU_ATTN multiples of 32, cpu_attn.py:65-66; one KV-cache group "
     "holds both, and vllm 0.32 v1/worker/utils.py:554, select_common_block_size, finds none, whatever block_size is "
     "asked: 16, 32 and the CPU default 128 measured); on a GPU the MLA and the drafter's backends agree, so the "
     "capture needs a GPU here"),
    # where the CPU has AMX tiles vLLM prefers its AMX MLA backend instead (vllm 0.32 platforms/cpu.py:152-164, with
    # torch builds that have torch.cpu._is_amx_tile_supported), whose weight packing takes no float32
    (r"expect weight to be bfloat16, float16, int8.* at vllm/v1/attention/backends/mla/amx_mla\.py",
     "vLLM's AMX MLA backend, which it picks for an MLA target on a CPU with AMX tiles (vllm 0.32 platforms/cpu.py:"
     "152-164), packs the attention weights with torch.ops._C.convert_weight_packed, which takes bfloat16, float16 "
     "or int8 weights only (v1/attention/backends/mla/amx_mla.py:303), and the CPU capture runs the target in "
     "float32; on a GPU vLLM serves MLA with its GPU backends in the deployment's dtype, so the capture needs a GPU "
     "here"),
    (r"batch2 tensor.* at sglang/srt/layers/attention/torch_native_backend\.py",
     "SGLang's CPU attention backend (torch_native, layers/attention/torch_native_backend.py) attends with the "
     "query's head size and cannot read MLA's compressed latent cache (kv_lora_rank + qk_rope_head_dim wide); on a "
     "GPU SGLang serves MLA with its MLA backends, so the capture needs a GPU here"),
    (r"Segfault in vllm/csrc/cpu/cpu_fused_moe\.cpp",
     "vLLM's CPU fused-MoE kernel (csrc/cpu/cpu_fused_moe.cpp) crashes when the experts are split across ranks "
     "(enable_expert_parallel; the same target at TP=2 without it serves); on a GPU vLLM's fused-MoE kernels serve "
     "expert parallelism, so the capture needs a GPU here"),
    (r"NotImplementedError at sglang/srt/layers/moe/fused_moe_native\.py",
     "SGLang's torch-native MoE (layers/moe/fused_moe_native.py:68-69, moe_forward_native), its only MoE path on this "
     "CPU without sgl_kernel's CPU build, does not implement apply_router_weight_on_input, which Llama 4's MoE uses; on "
     "a GPU SGLang's fused MoE kernels apply it, so the capture needs a GPU here"),
    (r"current platform cpu does not support ray",
     "vLLM's CPU platform names no Ray device (platforms/interface.py:150 ray_device_key is empty; only the CUDA, ROCm "
     "and XPU platforms set one), so its Ray executor refuses to place workers (vllm 0.32 v1/executor/ray_utils.py:"
     "572-576, initialize_ray_cluster); on GPUs the Ray executor places one worker per GPU across the nodes, so the "
     "capture needs the deployment's GPUs here"),
    (r"requires one of \[.*\] attention backend, but got .*torch_native",
     "SGLang serves this class only with the attention backends it names (its CPU one, intel_amx, needs sgl_kernel's "
     "CPU build, which this machine lacks), and this machine has only torch_native; on the deployment's GPU one of "
     "the named backends serves it, so the capture needs a GPU here"),
)
MACHINE_LIMITS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), why) for pattern, why in _MACHINE_LIMIT_ROWS
)


def machine_limit(message: str) -> str | None:
    """Why this machine cannot run what ``message`` reports, where it is a known CPU-backend limit."""
    return next((why for pattern, why in MACHINE_LIMITS if pattern.search(message)), None)


_WHERE = re.compile(r" at (sglang/[^\s:]+):\d+\s*$")


def failure_cause(kind: str, message: str) -> str:
    """``environment`` or ``deployment`` for one serving failure (kind and message of a ServingFailure).

    SGLang raising while it loads or runs the deployment (``sglang_exception``) is the deployment's
    fault unless the exception is about memory or the installation; a child that died without a
    result (killed by the kernel's OOM killer, a segfault in a kernel) is environmental.
    """
    if kind in _ENVIRONMENT_FAILURES:
        return "environment"
    if kind == "child_crashed":
        return "environment"
    # a worker's own exception leads a generic "engine core failed" (serving/vllm/root_cause.py): judged alone
    message = message.split(ENGINE_THEN)[0]
    if kind in ("sglang_exception", "vllm_exception"):  # vLLM's own exceptions follow the same rule
        if _ENVIRONMENT_EXCEPTION.search(message) or machine_limit(message):
            return "environment"
        # raised in specparity's own SGLang adapter (serving/sglang/*.py, quoted "at sglang/<file>.py:N"), not in
        # SGLang's code (sglang/srt/...): the adapter does not fit the installed SGLang, so the check cannot run here
        where = _WHERE.search(message)
        if kind == "sglang_exception" and where is not None and not where.group(1).startswith("sglang/srt/"):
            return "environment"
        return "deployment"
    return "deployment"


def on_item(f: Finding, check: str, probe: int | None = None) -> bool:
    """Whether error finding ``f`` fails the pytest item of ``check`` (and ``probe``)."""
    if f.severity is not Severity.ERROR:
        return False
    where = str(f.details.get("check", ALL_CHECKS))
    if where not in (check, ALL_CHECKS, _ALL_CHECKS_BEFORE):
        return False
    sample = f.details.get("sample")
    return probe is None or sample is None or sample == probe


def item_findings(findings: Sequence[Finding], check: str, probe: int | None = None) -> list[Finding]:
    """The error findings that fail one item, in verdict order."""
    return [f for f in findings if on_item(f, check, probe)]


def probe_status(findings: Sequence[Finding], probe: int) -> str:
    """``pass`` or ``fail`` for one probe sample's capture item: the same rule as the item itself."""
    return "fail" if item_findings(findings, "capture", probe) else "pass"


def _head(message: str, limit: int = 160) -> str:
    """The start of a blocker's message: the blocker itself is in the report whole."""
    line = message.splitlines()[0] if message else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def not_run(check: str, blockers: Sequence[Finding]) -> Finding:
    """A finding for a requested check that could not run because an earlier one failed (same kind and cause)."""
    first = blockers[0]
    cause = first.details.get("cause") if first.details.get("cause") == "specparity" else (
        "environment" if is_environmental(first) else "deployment")
    details: dict[str, object] = {"check": check, "cause": cause, "blocked_by": first.kind.value}
    details.update({k: first.details[k] for k in ("engine", "version") if k in first.details})
    return Finding(first.kind if first.kind in ENVIRONMENT_KINDS else FindingKind.ENGINE_ERROR, Severity.ERROR,
                   f"the {check} check could not run: {first.kind.value} (above): {_head(first.message)}",
                   details=details)


_FAILURE_FINDING: dict[str, FindingKind] = {
    "fc_not_called": FindingKind.FC_NOT_CALLED,
    "rank_missing": FindingKind.RANK_MISSING,
    "capture_count_short": FindingKind.CAPTURE_COUNT_SHORT,
    "capture_shape": FindingKind.WIDTH_MISMATCH,
    "nonfinite": FindingKind.NONFINITE,
    "timeout": FindingKind.TIMEOUT,
    # a draft config SGLang cannot read is the deployment's fault, not the environment's: exit 1
    "draft_unreadable": FindingKind.CONFIG_MISMATCH,
}


def serving_findings(failures: Iterable[Any], *, engine: str, version: str | None = None) -> list[Finding]:
    """ServingFailures as findings: deployment faults keep their own kind, the rest is an ``engine_error`` naming
    ``engine`` and ``version``, whose ``details["cause"]`` (:func:`failure_cause`) decides exit 1 or 3;
    ``details["sample"]`` names the probe."""
    out = []
    for f in failures:
        kind = _FAILURE_FINDING.get(f.kind, FindingKind.ENGINE_ERROR)
        where = f" (sample {f.sample})" if f.sample is not None else ""
        details: dict[str, object] = {"serving_failure": f.kind, "cause": failure_cause(f.kind, f.message),
                                      "engine": engine, "version": version}
        if f.sample is not None:
            details["sample"] = f.sample
        fix = None
        if f.kind == "draft_unreadable":
            fix = "convert the draft config as the finding says" + (
                ", or serve it as it is with vLLM (--engine vllm)" if "speculators" in f.message else "")
        elif f.kind == "engine_import":
            fix = ("repair this machine's engine install or environment as the error says (e.g. a writable HOME or "
                   "XDG_CACHE_HOME); the deployment was never loaded")
        limit = machine_limit(f.message)
        if limit is not None:
            details["machine_limit"] = limit
            fix = fix or "run the capture on a machine with the deployment's GPU; the static level resolves it here"
        message = f"{f.message}{where}" + (f"; on this machine: {limit}" if limit else "")
        out.append(Finding(kind, Severity.ERROR, message, details=details, fix=fix))
    return out


def blocked_checks(findings: Sequence[Finding], level: str, ran: Mapping[str, bool]) -> list[Finding]:
    """A finding for each requested check (``ran[check]`` False) that no finding fails but that could not
    run because an earlier one failed: its pytest item fails too, with the same cause."""
    checks = {"static": ["static"], "capture": ["static", "capture"]}.get(level, list(CHECKS))
    out = []
    for check in checks:
        if ran.get(check, False) or item_findings(findings, check):
            continue
        blockers = [f for f in findings if f.severity is Severity.ERROR]
        if blockers:
            out.append(not_run(check, blockers))
    return out
