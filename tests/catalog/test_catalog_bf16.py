"""The catalog on bf16 recordings in SpecForge's format (fixtures/bf16), served in fp32 and in bf16.

Every real SpecForge run records in bf16, and SGLang serves with other kernels (here fp32 by default,
or ``--sglang-arg dtype=bfloat16``, torch_native on CPU). Healthy must pass at every level, the
outcome check included; every miswiring must still fail with its kind. All of it runs in every SGLang env
of the matrix, served in fp32 and in bf16: ~1-2 min per env, which the clean-clone CI run
(29.5 min on 2 cores without it) has room for.

Measured with SGLang 0.5.23 on CPU (capture level, 4 probes, 343 tokens; u = 2^-8, the coarser dtype):

=============  ==================================  ===================  ===================
served in      recorded separation (layer:1/3/5)   drift p99 (worst)    drift max (worst)
=============  ==================================  ===================  ===================
fp32           0.023 / 0.038 / 0.047 (limit 0.5)   8.2 u (limit 24 u)   14.9 u (limit 64 u)
bf16           0.015 / 0.028 / 0.037               5.8 u                9.3 u
=============  ==================================  ===================  ===================
"""

from __future__ import annotations

from typing import Any

import pytest
from test_catalog import CASES, FOUND_FROM_FILES, STATIC_ONLY, assert_capture_refused, kinds

from specparity.gate import run_gate
from specparity.verdict import Verdict

pytestmark = pytest.mark.sglang
SERVED = {"fp32": {}, "bf16": {"dtype": "bfloat16"}}

_verdicts: dict[tuple[str, str, str], Verdict] = {}


def gate_bf16(catalog_bf16: dict[str, Any], name: str, served: str, *, level: str = "capture") -> Verdict:
    key = (name, served, level)
    if key not in _verdicts:
        contract, target, draft = catalog_bf16[name]
        _verdicts[key] = run_gate(contract, target, draft, level=level, engine_args=SERVED[served])
    return _verdicts[key]


@pytest.mark.parametrize("served", sorted(SERVED))
def test_healthy_bf16_recording_passes_at_every_level(catalog_bf16: dict[str, Any], served: str) -> None:
    v = gate_bf16(catalog_bf16, "healthy", served, level="all")
    if STATIC_ONLY:  # family A: the capture and outcome levels are refused, never passed
        assert_capture_refused(v)
        return
    assert v.status == "pass" and v.exit_code == 0, [f.to_dict() for f in v.findings]
    assert v.served_layout == ["layer:1", "layer:3", "layer:5"]
    assert not [f for f in v.findings if f.severity.value == "warning"], [f.message for f in v.findings]
    drift = [f for f in v.findings if f.kind.value == "numeric_drift"]
    # the margins are in the verdict: bf16 recording vs fp32 (or bf16) serving, judged as bf16
    for f in drift:
        assert f.details["dtype"] == "bfloat16" and f.details["p99_units"] < f.details["limit_p99_units"]
    assert all(p["status"] == "pass" for p in v.probes) and len(v.probes) == 4


@pytest.mark.parametrize("served", sorted(SERVED))
@pytest.mark.parametrize("name", sorted(n for n in CASES if n != "healthy"))
def test_every_miswiring_fails_with_its_kind_on_bf16_recordings(catalog_bf16: dict[str, Any], name: str,
                                                                served: str) -> None:
    status, expected = CASES[name]
    v = gate_bf16(catalog_bf16, name, served)
    assert v.status == status, (name, served, v.status, [f.to_dict() for f in v.findings])
    assert expected <= kinds(v), (name, served, sorted(kinds(v)))
    # the default catalog's verdict on this version: a miswiring exits 1; a scenario this version serves as
    # trained (e.g. norm_before_fc where SGLang ignores the key, D5) passes here too; family A refuses (exit 3), and
    # exits 1 where the miswiring is read from the files (tokenizer, chat template, d2t)
    if STATIC_ONLY:
        assert_capture_refused(v, found=expected & FOUND_FROM_FILES)
        return
    assert v.exit_code == (0 if status == "pass" else 1), (name, served, v.exit_code)
