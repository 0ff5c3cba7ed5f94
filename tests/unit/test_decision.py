"""One decision for every face: status, exit code and pytest item outcomes from the findings alone."""

from __future__ import annotations

import pytest

from specparity.compare.findings import Finding, FindingKind, Severity
from specparity.verdict import rules


@pytest.mark.parametrize(("kind", "message", "cause"), [
    ("sglang_exception", "TypeError: unsupported operand type(s) for +: 'Tensor' and 'NoneType' at "
                         "sglang/srt/models/llama.py:340", "deployment"),
    ("sglang_exception", "during start-up: RuntimeError: Error(s) in loading state_dict: size mismatch for "
                         "fc.weight at sglang/srt/model_loader/loader.py:1", "deployment"),
    ("sglang_exception", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "environment"),
    ("sglang_exception", "during start-up: ValueError: Loaded weights leave no GPU memory for the KV cache under "
                         "--mem-fraction-static=0.8 at sglang/srt/mem_cache/kv_cache_configurator.py:3050",
     "environment"),
    ("sglang_exception", "ModuleNotFoundError: No module named 'sgl_kernel'", "environment"),
    # raised in specparity's adapter, not in SGLang: the adapter does not fit this SGLang (seen on 0.5.14)
    ("sglang_exception", "during start-up: AttributeError: 'ServerArgs' object has no attribute 'resolve_once' at "
                         "sglang/since_0_5_11/core.py:143", "environment"),
    ("timeout", "the SGLang child did not finish within 900 s", "environment"),
    ("unsupported_version", "sglang 0.3.0 is not supported", "environment"),
    ("sglang_missing", "cannot start the interpreter", "environment"),
    ("child_crashed", "the SGLang child exited with code -9 without a result", "environment"),
    ("bad_deployment", "draft directory d has no config.json", "deployment"),
])
def test_failure_cause(kind: str, message: str, cause: str) -> None:
    assert rules.failure_cause(kind, message) == cause


def _f(kind: FindingKind, severity: Severity = Severity.ERROR, **details: object) -> Finding:
    return Finding(kind, severity, "m", details=details)


def test_status_and_exit_codes_follow_the_worst_cause() -> None:
    crash = _f(FindingKind.ENGINE_ERROR, check="engine", cause="deployment")
    oom = _f(FindingKind.ENGINE_ERROR, check="engine", cause="environment")
    timeout = _f(FindingKind.TIMEOUT, check="engine")
    drift = _f(FindingKind.NUMERIC_DRIFT, Severity.WARNING, check="capture")
    assert rules.status_of([]) == rules.status_of([drift]) == "pass"
    assert rules.status_of([oom]) == rules.status_of([timeout, oom]) == "error"
    assert rules.status_of([crash]) == rules.status_of([crash, timeout]) == "fail"
    assert rules.status_of([_f(FindingKind.TARGET_MISMATCH, check="static")]) == "fail"


def test_an_item_fails_iff_an_error_finding_is_on_its_check_or_probe() -> None:
    static = _f(FindingKind.TOKENIZER_MISMATCH, check="static")
    probe2 = _f(FindingKind.NONFINITE, check="capture", sample=2)
    everywhere = _f(FindingKind.ENGINE_ERROR, check="engine", cause="deployment")
    warning = _f(FindingKind.NUMERIC_DRIFT, Severity.WARNING, check="capture")
    findings = [static, probe2, warning]
    assert rules.item_findings(findings, "static") == [static]
    assert rules.item_findings(findings, "capture", 2) == [probe2]
    assert rules.item_findings(findings, "capture", 1) == []
    assert rules.item_findings(findings, "outcome") == []
    assert [rules.probe_status(findings, i) for i in range(4)] == ["pass", "pass", "fail", "pass"]
    assert all(rules.on_item(everywhere, c, p) for c in rules.CHECKS for p in (None, 0, 3))
    blocked = rules.not_run("outcome", [everywhere])
    assert rules.on_item(blocked, "outcome") and not rules.on_item(blocked, "static")
    assert rules.status_of([blocked]) == "fail"  # the cause is carried over: a crash stays exit 1
