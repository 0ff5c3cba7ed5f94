"""Version-specific SGLang behaviour, pinned per adapter family (the tox matrix).

Each ``sglang-*`` matrix env runs this file against its own SGLang (``pytest -m sglang``); the expected
behaviour is picked through the adapter registry for the installed version, never by skipping. The
unmarked tests check the registry, the matrix wiring and the pure helpers of the old-version adapters
(they run in the ``unit`` env).

Facts pinned here (table: ``version_facts.FACTS``, shared with the other real-SGLang tests; domain.md §3.4,
§5, §7 D9; sglang-cpu.md §9):
- draft ids ``[1,3,5]``: the fc input equals HF ``layer:1,3,5`` on every version;
- ``[-1,1,3]``: TypeError ``hs + None`` at models/llama.py:332 (0.4.10.post2) / :340 (0.5.3) / :388 (0.5.10) /
  :409 (0.5.14) / :442 (0.5.20), reported as ``sglang_exception``; 0.5.23 serves ``embedding, layer:1, layer:3``;
- family A (0.4.8): static level only; the configured ids are never read (the default ``layer:1,3,4`` with a
  ``draft_ids_ignored`` finding), fc always has a bias (D4), and a capture is a typed ``unsupported_version``;
- no ``eagle_config``: SGLang's default on every version, with the fallback reason;
- steps=1, topk=1, num_draft_tokens=16 is served as 2 on every version;
- the conventions module's rules equal this version's own ``set_eagle3_layers_to_capture``.
"""

from __future__ import annotations

import configparser
import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from serving_probes import PROBES
from setter_sources import CPU_SGLANG_PREAMBLE
from version_facts import FACTS, SGLANG_VERSION, VersionFacts, facts_for

from specparity.idrules import sglang
from specparity.idrules.sglang import TYPE_ERROR_HS_NONE
from specparity.serving.results import SGLANG_EXCEPTION, UNSUPPORTED_VERSION, ServingFailure
from specparity.serving.sglang.adapter import REGISTRY, AdapterEntry, parse_version, select_adapter
from specparity.serving.sglang.families import (
    ENVS,
    FAMILIES,
    FIRST_EAGLE3,
    KNOWN_RELEASES,
    family_for,
    release_of,
)
from specparity.sources import EMBEDDING, layer

REPO = Path(__file__).resolve().parents[2]
TOL = 1e-5
H = 64
NUM_LAYERS = 8
SPEC_REWRITE = {"speculative_num_steps": 1, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 16}


# ================================================================================ no sglang needed
def test_every_family_env_is_wired_with_facts_tox_matrix_and_a_pinned_list() -> None:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(REPO / "tox.ini")
    matrix = (REPO / "scripts" / "matrix.sh").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    for entry in REGISTRY:
        fam = next(f for f in FAMILIES if f.letter == entry.family)
        assert entry.tested_with and not fam.untested_why, f"family {fam.letter}: no matrix env runs it"
        for env_name in entry.tested_with:
            env = ENVS[env_name]
            assert family_for(env.sglang).family is not None
            assert family_for(env.sglang).family.letter == entry.family, env  # type: ignore[union-attr]
            assert env_name in FACTS, f"{env_name}: pin its version-specific behaviour in FACTS"
            assert f"testenv:{env_name}" in tox, f"tox.ini has no [testenv:{env_name}]"
            assert env_name in tox["tox"]["env_list"], f"tox.ini env_list lacks {env_name}"
            assert env_name in matrix, f"scripts/matrix.sh does not know {env_name}"
            # 0.5.23 (.venv) runs inside `make test`; every other family env runs in .ci/run
            assert env_name in ci or env_name == "sglang-0.5.23", f".ci/run does not run {env_name}"
            assert (REPO / env.constraints).is_file() and (REPO / env.torch).is_file(), env
            pins = (REPO / env.constraints).read_text().splitlines()
            assert f"sglang=={env.sglang}" in pins, env


def _versions_json() -> list[dict[str, Any]]:
    from click.testing import CliRunner

    from specparity.cli import main

    out = CliRunner().invoke(main, ["versions", "--json"])
    assert out.exit_code == 0, out.output
    rows: list[dict[str, Any]] = json.loads(out.output)
    assert {r["engine"] for r in rows} == {"sglang", "vllm"}  # vLLM's rows: tests/unit/test_vllm_versions.py
    return [r for r in rows if r["engine"] == "sglang"]


def test_versions_json_covers_every_release_from_0_4_4_post2_to_0_5_23_with_no_gap() -> None:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    rows = _versions_json()
    assert all({"range", "adapter", "family", "tested_with"} <= set(r) for r in rows)
    assert [r["family"] for r in rows] == ["A", "B", "C", "D", "E", "E"] and rows[-1]["untested"] is True
    assert len(KNOWN_RELEASES) == 70 and KNOWN_RELEASES[0] == FIRST_EAGLE3 and KNOWN_RELEASES[-1] == "0.5.23"
    for release in KNOWN_RELEASES:  # each release in exactly one tested range, and that row lists it
        holding = [r for r in rows[:-1] if SpecifierSet(r["range"]).contains(Version(release), prereleases=True)]
        assert len(holding) == 1 and release in holding[0]["releases"], release
    # contiguous: each range starts where the previous one stops, the untested one where the last stops
    bounds = [r["range"].removeprefix(">=").split(",<") for r in rows]
    for (_, below), nxt in itertools.pairwise(bounds):
        assert below == nxt[0]
    assert bounds[0][0] == FIRST_EAGLE3
    for r in rows[:-1]:
        assert r["adapter"] == next(e.name for e in REGISTRY if e.family == r["family"])


def test_versions_text_names_each_range_and_its_env() -> None:
    from click.testing import CliRunner

    from specparity.cli import main

    out = CliRunner().invoke(main, ["versions"])
    assert out.exit_code == 0, out.output
    for entry in REGISTRY:
        line = next(ln for ln in out.output.splitlines() if ln.startswith(entry.range_text + " "))
        assert entry.name in line and all(env in line for env in entry.tested_with), line
    assert "untested_version" in out.output


def test_supported_versions_table_lists_every_range() -> None:
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "supported_versions.py")], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    # SGLang's rows: the first table (the vLLM table follows under its own header)
    sglang_part = out.split("| vLLM versions |")[0]
    rows = [line for line in sglang_part.splitlines() if line.startswith("| `")]
    assert len(rows) == len(REGISTRY) + 1
    for entry in REGISTRY:
        assert any(f"`{entry.range_text}`" in row and f"| {entry.family}: " in row for row in rows), entry


_VERSIONS = st.tuples(st.integers(0, 1), st.integers(0, 6), st.integers(0, 30), st.sampled_from(
    ["", ".post1", ".post2", ".post4", "rc0", ".dev3"]))


@given(_VERSIONS)
def test_every_version_is_served_by_exactly_one_family_or_refused(v: tuple[int, int, int, str]) -> None:
    from packaging.version import Version

    text = ".".join(map(str, v[:3])) + v[3]
    accepting = [e for e in REGISTRY if e.accepts(text)]
    assert len(accepting) <= 1
    picked = select_adapter(text)
    if release_of(Version(text)) < Version(FIRST_EAGLE3):
        assert isinstance(picked, ServingFailure) and picked.kind == UNSUPPORTED_VERSION
        assert "no EAGLE-3" in picked.message and REGISTRY[0].range_text in picked.message
    elif accepting:
        assert isinstance(picked, AdapterEntry) and picked == accepting[0] and not picked.untested
    else:  # newer than every range: the newest adapter, flagged, never refused
        assert release_of(Version(text)) >= Version("0.5.24")
        assert isinstance(picked, AdapterEntry) and picked.family == REGISTRY[-1].family and picked.untested
        assert picked.note.startswith(f"untested_version: sglang {text} is newer")


@pytest.mark.parametrize(("installed", "family"), [
    ("0.4.4.post2", "A"), ("0.4.8.post1", "A"), ("0.4.9", "B"), ("0.4.10.post2", "B"), ("0.5.0rc0", "B"),
    ("0.5.3", "B"), ("0.5.10.post1", "B"), ("0.5.11", "C"), ("0.5.14", "C"), ("0.5.16", "C"), ("0.5.17", "D"),
    ("0.5.20", "D"), ("0.5.21", "D"), ("0.5.22", "E"), ("0.5.23", "E")])
def test_releases_select_their_family(installed: str, family: str) -> None:
    picked = select_adapter(installed)
    assert isinstance(picked, AdapterEntry) and picked.family == family and not picked.untested


@pytest.mark.parametrize("installed", ["0.4.4.post1", "0.4.4", "0.4.3.post4", "0.3.0", "garbage", ""])
def test_older_than_eagle3_or_unparsable_is_refused(installed: str) -> None:
    picked = select_adapter(installed)
    assert isinstance(picked, ServingFailure) and picked.kind == UNSUPPORTED_VERSION
    assert f"sglang {installed} is not supported" in picked.message and ">=0.4.4.post2,<0.4.9" in picked.message


@pytest.mark.parametrize("installed", ["0.5.24", "0.6.0", "1.0.0", "0.5.23.post1"])
def test_newer_versions_run_through_the_newest_adapter_flagged(installed: str) -> None:
    picked = select_adapter(installed)
    assert isinstance(picked, AdapterEntry)
    if installed == "0.5.23.post1":  # a post-release of a tested release is in its range
        assert not picked.untested and picked.family == "E"
        return
    assert picked.untested and picked.module == REGISTRY[-1].module and "untested_version" in picked.note


def test_family_b_glue_is_detected_from_what_sglang_has() -> None:
    """eagle_info vs eagle_utils and the init_new keyword, as the 0.5.3 / 0.4.10.post2 glue hard-wired them."""
    from specparity.serving.sglang.since_0_4_4 import adapter as family_b
    from specparity.serving.sglang.since_0_4_4 import glue

    def init_new_0410(reqs: Any, enable_custom_logit_processor: bool, spec_algorithm: Any = None) -> None: ...
    def init_new_053(reqs: Any, spec_algorithm: Any = None) -> None: ...

    assert family_b.draft_input_module(lambda name: object()) == glue.GLUE_0_5_3.draft_input_module
    assert family_b.draft_input_module(lambda name: None) == glue.GLUE_0_4_10.draft_input_module

    def no_parent(name: str) -> None:
        raise ModuleNotFoundError(name)

    assert family_b.draft_input_module(no_parent) == glue.GLUE_0_4_10.draft_input_module
    assert family_b.batch_extra_kwargs(init_new_0410) == glue.GLUE_0_4_10.batch_extra_kwargs
    assert family_b.batch_extra_kwargs(init_new_053) == glue.GLUE_0_5_3.batch_extra_kwargs == {}


@given(ids=st.none() | st.lists(st.integers(0, 70), min_size=1, max_size=4), layers=st.integers(4, 80),
       device=st.sampled_from(["cuda", "cpu"]), graphs=st.booleans())
def test_family_b_cuda_graph_hazard_only_on_cuda_with_graphs_and_non_default_ids(
        ids: list[int] | None, layers: int, device: str, graphs: bool) -> None:
    from specparity.serving.sglang.since_0_4_4.adapter import cuda_graph_hazard

    default = [1, layers // 2 - 1, layers - 4]
    hazard = cuda_graph_hazard(device=device, cuda_graphs=graphs, ids=None if ids is None else tuple(ids),
                               num_layers=layers)
    expected = device == "cuda" and graphs and ids is not None and ids != default
    assert (hazard is not None) == expected
    if hazard is not None:
        assert str(default) in hazard and str(ids) in hazard and "sglang #22836" in hazard
        assert "model_executor/model_runner.py:450-470" in hazard


def _static_deployment(**kw: Any) -> Any:
    from tests.resolved_deployments import tiny_deployment

    return tiny_deployment(REPO / "fixtures" / "default", **{"adapter": "sglang-family-E", **kw})


def test_untested_version_warning_reaches_every_report_and_is_only_a_warning() -> None:
    from specparity import gate_verdict
    from specparity.contract import load_contract
    from specparity.serving import CaptureResult, ResolvedDeployment
    from specparity.serving.sglang.worker import with_version_note

    entry = select_adapter("0.6.1")
    assert isinstance(entry, AdapterEntry) and entry.untested
    dep = with_version_note(_static_deployment(engine_version="0.6.1"), entry)
    assert dep.adapter_notes[0][:2] == ("untested_version", "warning") and "0.6.1" in dep.adapter_notes[0][2]
    assert ResolvedDeployment.from_dict(json.loads(json.dumps(dep.to_dict()))) == dep  # survives the child pipe
    crash = ServingFailure(SGLANG_EXCEPTION, "boom")
    captured = with_version_note(CaptureResult(_static_deployment(engine_version="0.6.1"), None, None, (crash,)),
                                 entry)
    assert captured.deployment.adapter_notes == dep.adapter_notes and captured.failures == (crash,)
    tested = select_adapter("0.5.23")
    assert with_version_note(_static_deployment(), tested).adapter_notes == ()
    contract = REPO / "contracts" / "tiny-llama-eagle3.json"
    run = gate_verdict.GateRun(contract=load_contract(contract), draft=REPO / "fixtures" / "default" / "draft",
                               deployment=dep)
    v = gate_verdict.verdict_of(run, level="static", timings={})
    found = [f for f in v.findings if f.kind.value == "untested_version"]
    assert len(found) == 1 and found[0].severity.value == "warning" and v.status == "pass"
    assert found[0].details["check"] == "static"


@pytest.mark.parametrize(("configured", "severity"), [((1, 3, 4), "warning"), (None, "warning"),
                                                        ((1, 3, 5), "error"), ((0, 1, 2), "error")])
def test_family_a_names_the_defaults_it_serves_instead_of_the_configured_ids(
        configured: tuple[int, ...] | None, severity: str) -> None:
    from specparity import gate_verdict
    from specparity.contract import load_contract
    from specparity.serving.sglang.since_0_4_4.static_only import ids_ignored_note

    note = ids_ignored_note(version="0.4.8", configured=configured, num_layers=8)
    assert note[0] == "draft_ids_ignored" and note[1] == severity
    assert "[1, 3, 4]" in note[2] and "layer:1, layer:3, layer:4" in note[2] and "0.4.8" in note[2]
    assert "model_runner.py:307" in note[3] and "models/llama.py:700-706" in note[3]
    dep = _static_deployment(engine_version="0.4.8", adapter="sglang-family-A", draft_config_ids=None,
                             layers_to_capture=(2, 4, 5), served_sources=(layer(1), layer(3), layer(4)),
                             adapter_notes=(note,))
    contract = REPO / "contracts" / "tiny-llama-eagle3.json"
    run = gate_verdict.GateRun(contract=load_contract(contract), draft=REPO / "fixtures" / "default" / "draft",
                               deployment=dep)
    v = gate_verdict.verdict_of(run, level="static", timings={})
    assert v.status == "fail"  # the bundle was trained on layer:1,3,5; 0.4.8 serves 1,3,4
    assert any(f.kind.value == "draft_ids_ignored" and f.severity.value == severity for f in v.findings)


@pytest.mark.parametrize(("checkpoint_has_bias", "noted"), [(False, True), (True, False), (None, False)])
def test_family_a_fc_bias_is_always_built_and_random_without_a_checkpoint_bias(
        checkpoint_has_bias: bool | None, noted: bool) -> None:
    """D4: <= 0.4.8 builds fc = nn.Linear(3*H_t, H_d) (bias on); only a checkpoint fc.bias fills it."""
    from specparity.serving.sglang.since_0_4_4.static_only import fc_bias_note
    from specparity.verdict import rules

    note = fc_bias_note(version="0.4.8", checkpoint_has_bias=checkpoint_has_bias)
    assert (note is not None) == noted
    if note is None:
        return
    assert note[:2] == ("config_mismatch", "error") and "fc.bias" in note[2] and "0.4.8" in note[2]
    assert "models/llama_eagle3.py:109-112" in note[3] and "D4" in note[3]
    [f] = rules.adapter_findings(_static_deployment(engine_version="0.4.8", fc_bias=True, adapter_notes=(note,)))
    assert f.kind.value == "config_mismatch" and f.severity.value == "error"


def test_family_a_reads_configured_ids_from_either_place() -> None:
    from specparity.serving.sglang.since_0_4_4.static_only import configured_ids

    assert configured_ids(SimpleNamespace(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 3]})) == (1, 2, 3)
    assert configured_ids(SimpleNamespace(eagle_aux_hidden_state_layer_ids=[4])) == (4,)
    assert configured_ids(SimpleNamespace(eagle_config="junk")) is None
    assert configured_ids(SimpleNamespace(eagle_config={"eagle_aux_hidden_state_layer_ids": ["x"]})) is None


def test_family_c_kv_copy_stand_in_is_the_stubs_byte_copy_and_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.5.14's Triton KV-copy launch on CPU: the stand-in's warm-up no-op, any real move refused, all recorded."""
    import importlib.util

    from specparity.serving.sglang.run_common import _TiledKvCopyOnCpu

    stub_init = REPO / "src/specparity/serving/sglang/kernel_stub/sgl_kernel/__init__.py"
    spec = importlib.util.spec_from_file_location("sgl_kernel", stub_init)
    assert spec is not None and spec.loader is not None
    stub = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stub)
    monkeypatch.setitem(sys.modules, "sgl_kernel", stub)
    layers = [torch.arange(8 * 4, dtype=torch.float32).reshape(8, 4) for _ in range(2)]
    before = [t.clone() for t in layers]
    ptrs = torch.tensor([t.data_ptr() for t in layers], dtype=torch.uint64)
    strides = torch.tensor([t.stride(0) * t.element_size() for t in layers], dtype=torch.int64)
    zero = torch.zeros(4, dtype=torch.int64)
    _TiledKvCopyOnCpu()[(2, 1)](ptrs, strides, zero, zero, 1, 4, BYTES_PER_TILE=128, num_warps=4)  # the warm-up
    assert all(torch.equal(a, b) for a, b in zip(layers, before, strict=True))
    with pytest.raises(NotImplementedError, match="would move KV slots"):  # a real move never runs on it
        _TiledKvCopyOnCpu()[(2, 1)](ptrs, strides, torch.tensor([5, 6]), torch.tensor([1, 2]), 2, 2)
    assert all(torch.equal(a, b) for a, b in zip(layers, before, strict=True))
    assert stub.CALLED == ["copy_all_layer_kv_cache_cpu"] * 2


def test_worker_v2_glue_detects_keywords_id_holder_and_id_reader() -> None:
    """Families C/D: constructor keywords by signature, where the runner keeps the ids, the re-typed reader."""
    from specparity.serving.sglang.since_0_5_11.run_compat import call_with_accepted, runner_ids
    from specparity.serving.sglang.since_0_5_11.static_compat import read_ids

    def tp_worker_0514(server_args: Any, gpu_id: int, tp_rank: int, dp_rank: Any, nccl_port: int) -> dict[str, Any]:
        return {"tp_rank": tp_rank, "dp_rank": dp_rank}

    def tp_worker_0523(server_args: Any, gpu_id: int, nccl_port: int) -> str:
        return "ok"

    common = {"server_args": 0, "gpu_id": 0, "nccl_port": 1, "tp_rank": 0, "dp_rank": None, "pp_rank": 0}
    assert call_with_accepted(tp_worker_0514, **common) == {"tp_rank": 0, "dp_rank": None}
    assert call_with_accepted(tp_worker_0523, **common) == "ok"
    assert runner_ids(SimpleNamespace(spec_aux_config=SimpleNamespace(eagle_aux_hidden_state_layer_ids=[1]))) == [1]
    assert runner_ids(SimpleNamespace(eagle_aux_hidden_state_layer_ids=[2, 3])) == [2, 3]
    assert runner_ids(SimpleNamespace()) is None
    ec = {"eagle_aux_hidden_state_layer_ids": [1, 3, 5]}
    assert read_ids(SimpleNamespace(eagle_config=ec)) == (True, [1, 3, 5])
    assert read_ids(SimpleNamespace(eagle_config={**ec, "use_aux_hidden_state": False})) == (False, [1, 3, 5])
    assert read_ids(SimpleNamespace()) == (True, None)  # bare except: None.get raises
    assert read_ids(SimpleNamespace(eagle_config={"use_aux_hidden_state": True})) == (True, None)


def test_family_d_publish_style_is_read_from_publishs_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.5.23 publish(sa, role=, ranks=); 0.5.20 publish(sa, *, role, hf_config=None); 0.5.14 has none."""
    import types

    from specparity.serving.sglang.since_0_5_11 import adapter as family_e

    def publish_0523(server_args: Any, *, role: str, ranks: Any) -> None: ...
    def publish_0520(server_args: Any, *, role: str, hf_config: Any = None) -> None: ...

    for publish, style in ((publish_0523, "ranks"), (publish_0520, "role"), (None, "global")):
        module = types.ModuleType("sglang.srt.runtime_context")
        if publish is not None:
            module.publish = publish  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "sglang.srt.runtime_context", module)
        assert family_e.publish_style() == style
    monkeypatch.setattr(family_e, "_has_module", lambda name: True)
    assert not family_e.has_0523_layout()  # every module there, but publish takes no ranks: not 0.5.23's glue


def test_family_d_parallel_state_only_where_the_worker_takes_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from specparity.serving.sglang.since_0_5_11.run_compat import parallel_state_kwargs

    class Worker0514:
        def __init__(self, server_args: Any, gpu_id: int, tp_rank: int, nccl_port: int) -> None: ...

    class Worker0520:
        def __init__(self, server_args: Any, gpu_id: int, ps: Any, nccl_port: int) -> None: ...

    seen: list[dict[str, Any]] = []

    class ParallelState:
        @staticmethod
        def trivial(**overrides: Any) -> str:
            seen.append(overrides)
            return "one-rank state"

    module = types.ModuleType("sglang.srt.distributed.parallel_state_wrapper")
    module.ParallelState = ParallelState  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sglang.srt.distributed.parallel_state_wrapper", module)
    assert parallel_state_kwargs(Worker0514) == {}
    assert parallel_state_kwargs(Worker0520) == {"ps": "one-rank state"}
    assert seen == [{"dp_rank": None, "moe_dp_rank": None}]  # as 0.5.20 benchmark/one_batch.py:329-349


@pytest.mark.parametrize("release", ["0.5.14", "0.5.20", "0.5.23"])
def test_worker_v2_memory_pools_follow_the_schedulers_steps(monkeypatch: pytest.MonkeyPatch, release: str) -> None:
    from specparity.serving.sglang.since_0_5_11 import run_compat as family_e_run

    calls: list[str] = []
    runner = SimpleNamespace(memory_pool_config="cfg")
    if release == "0.5.20":
        runner.account_preloaded_weights = lambda n: calls.append(f"account {n}")  # type: ignore[attr-defined]
    tp = SimpleNamespace(model_runner=runner, preloaded_weights_bytes=5, get_memory_pool=lambda: ("pool", "alloc"),
                         alloc_memory_pool=lambda **kw: calls.append(f"target pool {sorted(kw)}"))
    spec = SimpleNamespace(preloaded_weights_bytes=2, alloc_memory_pool=lambda **kw: calls.append(
        f"draft pool {kw['memory_pool_config']} {kw['req_to_token_pool']} {kw['token_to_kv_pool_allocator']}"))
    if release == "0.5.20":
        spec.init_hicache_draft_plan = lambda: calls.append("hicache plan")  # type: ignore[attr-defined]
    if release == "0.5.23":
        spec.draft_parallel_layout = "layout"  # type: ignore[attr-defined]
    monkeypatch.setattr(family_e_run, "_retraction_backup", lambda: (
        (lambda tp_worker: calls.append("retraction")) if release == "0.5.20" else None))
    family_e_run.alloc_memory_pools(tp, spec)
    expected = {
        "0.5.14": ["target pool []", "draft pool cfg pool alloc"],
        "0.5.20": ["account 7", "target pool []", "retraction", "draft pool cfg pool alloc", "hicache plan"],
        "0.5.23": ["target pool ['draft_parallel_layout']", "draft pool cfg pool alloc"],
    }
    assert calls == expected[release]


@pytest.mark.parametrize(("release", "crashes"), [("0.5.20", True), ("0.5.21", True), ("0.5.22", False),
                                                  ("0.5.23", False)])
def test_family_d_static_level_reports_boundary_0_as_the_crash_it_is(release: str, crashes: bool) -> None:
    """0.5.20 has 0.5.23's module layout but no layer_boundary: [-1,1,3] crashes llama (D9), never 'embedding'."""
    from specparity.serving.sglang.since_0_5_11.adapter import boundary0_crash

    dep = _static_deployment(engine_version=release, draft_config_ids=(-1, 1, 3), layers_to_capture=(0, 2, 4),
                             served_sources=(EMBEDDING, layer(1), layer(3)))
    failure = boundary0_crash(dep)
    assert (failure is not None) == crashes
    if failure is not None:
        assert failure.kind == SGLANG_EXCEPTION and TYPE_ERROR_HS_NONE in failure.message and release in failure.message
    assert boundary0_crash(_static_deployment(engine_version=release)) is None  # (2, 4, 6): nothing to predict


def test_family_d_atlas_reads_the_embedding_by_a_tap_where_boundary_0_crashes(monkeypatch: pytest.MonkeyPatch) -> None:
    from specparity.serving.sglang.since_0_5_11 import adapter as family_e
    from specparity.serving.sglang.since_0_5_11 import run as run_0523
    from specparity.serving.sglang.since_0_5_11 import run_compat as family_e_run

    monkeypatch.setattr(family_e, "has_0523_layout", lambda: True)
    for capturable in (True, False):
        monkeypatch.setattr(family_e, "embedding_capturable", lambda c=capturable: c)
        adapter = family_e.FamilyEAdapter(sglang_version="0.5.20", name="sglang-family-D")
        if capturable:  # 0.5.22+: 0.5.23's glue unchanged
            assert adapter.run is run_0523
        else:
            atlas = adapter.run.layer_atlas
            assert atlas.func is family_e_run.layer_atlas and atlas.keywords == {"embedding_capturable": False}
            assert adapter.run.start_workers is run_0523.start_workers


_JSONISH = st.recursive(st.none() | st.booleans() | st.integers(-3, 70) | st.text(max_size=4),
                        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                                    max_size=3), max_leaves=8)


@given(eagle_config=_JSONISH | st.fixed_dictionaries(
    {"eagle_aux_hidden_state_layer_ids": st.none() | st.lists(st.integers(-1, 70), max_size=4)}))
def test_old_runner_id_reader_never_raises_and_explains_none(eagle_config: Any) -> None:
    """The re-typed reader of 0.5.3 model_runner.py:458-466: bare except -> None, and a reason for every None."""
    from specparity.serving.sglang.since_0_4_4.core import ids_fallback_reason, read_draft_ids

    config = SimpleNamespace(eagle_config=eagle_config)
    try:
        ids = read_draft_ids(config)
    except (TypeError, ValueError):
        # only the int() conversion is outside the bare except, so a raise means: the ids are present and are
        # not a list of ints (SGLang's own reader raises on the same value); asserted, not assumed
        assert isinstance(eagle_config, dict) and "eagle_aux_hidden_state_layer_ids" in eagle_config
        value = eagle_config["eagle_aux_hidden_state_layer_ids"]
        assert value is not None
        assert not (isinstance(value, list) and all(isinstance(x, int) for x in value)), value
        return
    reason = ids_fallback_reason(config, ids, cite="here")
    assert (ids is None) == (reason is not None)
    if ids is not None:
        assert list(ids) == list(eagle_config["eagle_aux_hidden_state_layer_ids"])


def test_legacy_server_args_user_wins_models_last() -> None:
    from specparity.serving.sglang.adapter import WorkerRequest
    from specparity.serving.sglang.since_0_4_4.core import server_args_kwargs

    req = WorkerRequest(op="capture", target="/t", draft="/d", probes=((1, 2, 3),),
                        server_args={"dtype": "bfloat16", "model_path": "/elsewhere", "speculative_eagle_topk": 1})
    kw = server_args_kwargs(req)
    assert kw["dtype"] == "bfloat16" and kw["speculative_eagle_topk"] == 1
    assert (kw["model_path"], kw["speculative_draft_model_path"]) == ("/t", "/d")
    assert kw["skip_tokenizer_init"] is True  # transformers 4.x cannot load a 5.x tokenizer (sglang-cpu.md §4)
    assert kw["attention_backend"] == "torch_native" and kw["disable_cuda_graph"] is True


def test_legacy_shims_only_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from specparity.serving.sglang.since_0_4_4 import shims as legacy_shims

    monkeypatch.setattr(legacy_shims, "_installed", [])
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert legacy_shims.install(device="cuda", torch_drift=True) == ()
    assert str(legacy_shims.VLLM_SHIM_DIR) not in sys.path
    assert (legacy_shims.VLLM_SHIM_DIR / "vllm" / "model_executor" / "layers" / "layernorm.py").is_file()
    assert (legacy_shims.TORCH_DRIFT_DIR / "sitecustomize.py").is_file()


# ================================================================================ real SGLang
@pytest.fixture(scope="module")
def facts() -> tuple[AdapterEntry, VersionFacts]:
    """The installed SGLang's registry entry and its pinned facts; no sglang is a failure, not a skip."""
    if SGLANG_VERSION is None:
        pytest.fail("the sglang tests need SGLang installed (scripts/venv.sh, scripts/venv-engine.sh sglang)",
                    pytrace=False)
    entry = select_adapter(SGLANG_VERSION)
    assert isinstance(entry, AdapterEntry), entry
    return entry, facts_for(SGLANG_VERSION)


def _capture(cache: Any, models: dict[str, Path], name: str) -> Any:
    d = models[name]
    return cache.capture(d / "target", d / "draft", probes=PROBES, atlas=True, timeout_s=300)


def _resolve(cache: Any, models: dict[str, Path], name: str, **server_args: object) -> Any:
    d = models[name]
    return cache.resolve(d / "target", d / "draft", server_args=server_args, timeout_s=200)


def _plan(ids: list[int] | None) -> Any:
    assert SGLANG_VERSION is not None
    return sglang.capture_plan(ids, num_layers=NUM_LAYERS, architecture="LlamaForCausalLM", version=SGLANG_VERSION)


def _max_err(fc: torch.Tensor, hs: tuple[torch.Tensor, ...], hf_indices: list[int]) -> float:
    return float((fc - torch.cat([hs[i] for i in hf_indices], dim=-1)).abs().max())


def _capture_refused(r: Any) -> None:
    """Family A (static level only): a capture is a typed unsupported_version failure, never a pass."""
    assert r.fc is None and r.atlas is None and r.failure_kinds() == (UNSUPPORTED_VERSION,), r.failures
    assert "static level only" in r.failures[0].message and SGLANG_VERSION in r.failures[0].message


def _ids_ignored(dep: Any, *, severity: str) -> None:
    """Family A's static resolve: SGLang's default boundaries whatever the config says, and the finding."""
    assert dep.draft_config_ids is None and dep.layers_to_capture == _plan(None).layers_to_capture == (2, 4, 5)
    assert dep.served_sources == (layer(1), layer(3), layer(4))
    [note] = [n for n in dep.adapter_notes if n[0] == "draft_ids_ignored"]
    assert note[1] == severity and "[1, 3, 4]" in note[2] and "model_runner.py:307" in note[3], note


@pytest.mark.sglang
def test_ids_1_3_5_fc_input_equals_hf_on_every_version(
        facts: tuple[AdapterEntry, VersionFacts], serving_cache: Any, models: dict[str, Path],
        hf_hidden_states: list[tuple[torch.Tensor, ...]]) -> None:
    entry, pinned = facts
    r = _capture(serving_cache, models, "ids_1_3_5")
    if not pinned.capture_supported:
        _capture_refused(r)
        resolved = _resolve(serving_cache, models, "ids_1_3_5")
        assert not isinstance(resolved, ServingFailure), resolved
        assert resolved.adapter == entry.name and resolved.engine_version == SGLANG_VERSION
        _ids_ignored(resolved, severity="error")  # trained on layer:1,3,5; served layer:1,3,4
        # D4: fc always has a bias here, and the bundled checkpoint has none (it stays random)
        assert resolved.fc_bias and any(n[0] == "config_mismatch" and "fc.bias" in n[2]
                                        for n in resolved.adapter_notes), resolved.adapter_notes
        return
    assert r.failures == (), r.failures
    assert r.deployment.adapter == entry.name and r.deployment.engine_version == SGLANG_VERSION
    assert r.fc is not None and r.fc.hook_calls == 1
    assert [tuple(t.shape) for t in r.fc.per_sample] == [(len(p), 3 * H) for p in PROBES]
    for fc, hs in zip(r.fc.per_sample, hf_hidden_states, strict=True):
        assert _max_err(fc, hs, [2, 4, 6]) <= TOL  # layer:i is HF output_hidden_states[i+1]
    assert set(r.fc.kernel_stub_calls) <= pinned.kernel_stub_calls
    # the ids SGLang's own reader produced, and what the runner passed them through to
    assert r.deployment.draft_config_ids == (1, 3, 5) and r.deployment.ids_fallback_reason is None
    assert r.deployment.layers_to_capture == _plan([1, 3, 5]).layers_to_capture == (2, 4, 6)
    assert r.deployment.served_sources == _plan([1, 3, 5]).served_sources == (layer(1), layer(3), layer(5))


@pytest.mark.sglang
def test_atlas_embedding_layers_and_final_norm_equal_hf(
        facts: tuple[AdapterEntry, VersionFacts], serving_cache: Any, models: dict[str, Path],
        hf_hidden_states: list[tuple[torch.Tensor, ...]]) -> None:
    r = _capture(serving_cache, models, "ids_1_3_5")
    if not facts[1].capture_supported:
        _capture_refused(r)
        return
    assert r.atlas is not None and r.atlas.num_layers == NUM_LAYERS
    assert r.atlas.sources() == (EMBEDDING, *(layer(i) for i in range(NUM_LAYERS - 1)), "final_norm")
    for sample, hs in zip(r.atlas.per_sample, hf_hidden_states, strict=True):
        for hf_index, name in enumerate(r.atlas.sources()):  # HF index = boundary; hs[L] is final_norm
            assert float((sample[name] - hs[hf_index]).abs().max()) <= TOL, name


@pytest.mark.sglang
def test_minus_one_crashes_old_llama_and_serves_embedding_from_0_5_22(
        facts: tuple[AdapterEntry, VersionFacts], serving_cache: Any, models: dict[str, Path],
        hf_hidden_states: list[tuple[torch.Tensor, ...]]) -> None:
    _, pinned = facts
    plan = _plan([-1, 1, 3])
    r = _capture(serving_cache, models, "ids_m1_1_3")
    if not pinned.capture_supported:  # family A never reads the ids: the default, no crash
        _capture_refused(r)
        assert plan.crash is None
        resolved = _resolve(serving_cache, models, "ids_m1_1_3")
        assert not isinstance(resolved, ServingFailure), resolved
        _ids_ignored(resolved, severity="error")
        return
    assert r.deployment is not None and r.deployment.layers_to_capture == plan.layers_to_capture == (0, 2, 4)
    if pinned.minus_one_crash_at is not None:
        assert plan.crash == TYPE_ERROR_HS_NONE
        assert r.fc is None and r.failure_kinds() == (SGLANG_EXCEPTION,), r.failures
        message = r.failures[0].message
        assert f"{TYPE_ERROR_HS_NONE} at {pinned.minus_one_crash_at}" in message
        assert "Traceback" not in message and "\n" not in message
        resolved = _resolve(serving_cache, models, "ids_m1_1_3")  # static: never claims the embedding
        assert isinstance(resolved, ServingFailure) and resolved.kind == SGLANG_EXCEPTION, resolved
        assert TYPE_ERROR_HS_NONE in resolved.message
    else:
        assert plan.crash is None
        assert r.failures == (), r.failures
        assert r.deployment.served_sources == plan.served_sources == (EMBEDDING, layer(1), layer(3))
        for fc, hs in zip(r.fc.per_sample, hf_hidden_states, strict=True):
            assert _max_err(fc, hs, [0, 2, 4]) <= TOL


@pytest.mark.sglang
def test_no_eagle_config_serves_sglang_default_on_every_version(
        facts: tuple[AdapterEntry, VersionFacts], serving_cache: Any, models: dict[str, Path],
        hf_hidden_states: list[tuple[torch.Tensor, ...]]) -> None:
    plan = _plan(None)
    r = _capture(serving_cache, models, "no_eagle_config")
    if not facts[1].capture_supported:
        _capture_refused(r)
        resolved = _resolve(serving_cache, models, "no_eagle_config")
        assert not isinstance(resolved, ServingFailure), resolved
        _ids_ignored(resolved, severity="warning")  # no ids asked: the defaults are what the config implies
        return
    assert r.failures == (), r.failures
    dep = r.deployment
    assert dep.draft_config_ids is None and "no eagle_config" in (dep.ids_fallback_reason or "")
    assert dep.layers_to_capture == plan.layers_to_capture == (2, 4, 5)  # [2, L//2, L-3]
    assert dep.served_sources == plan.served_sources == (layer(1), layer(3), layer(4))
    for fc, hs in zip(r.fc.per_sample, hf_hidden_states, strict=True):
        assert _max_err(fc, hs, [2, 4, 5]) <= TOL


@pytest.mark.sglang
def test_num_draft_tokens_16_is_served_as_steps_plus_one(
        facts: tuple[AdapterEntry, VersionFacts], serving_cache: Any, models: dict[str, Path]) -> None:
    r = _resolve(serving_cache, models, "ids_1_3_5", **SPEC_REWRITE)
    assert not isinstance(r, ServingFailure), r
    assert (r.requested_spec.num_steps, r.requested_spec.eagle_topk, r.requested_spec.num_draft_tokens) == (1, 1, 16)
    assert (r.resolved_spec.num_steps, r.resolved_spec.eagle_topk, r.resolved_spec.num_draft_tokens) == (1, 1, 2)
    assert any("speculative_num_draft_tokens is adjusted" in w for w in r.spec_warnings), r.spec_warnings
    assert r.server_args["speculative_num_draft_tokens"] == 2
    if facts[1].capture_supported:
        assert r.served_sources == (layer(1), layer(3), layer(5))
    else:
        _ids_ignored(r, severity="error")


@pytest.mark.sglang
def test_one_aux_state_checkpoint_loads_only_where_fc_width_follows_the_config(
        facts: tuple[AdapterEntry, VersionFacts], serving_cache: Any, models: dict[str, Path]) -> None:
    """Draft ids [3] with fc.weight [H, H] (k = 1, H_t == H_d): D5 decides whether SGLang can load it."""
    _, pinned = facts
    resolved = _resolve(serving_cache, models, "one_aux_fc_skipped")
    if pinned.fc_width_fixed_at_3:
        assert isinstance(resolved, ServingFailure) and resolved.kind == SGLANG_EXCEPTION, resolved
        assert f"Linear(3*{H}, {H})" in resolved.message
        d = models["one_aux_fc_skipped"]
        r = serving_cache.capture(d / "target", d / "draft", probes=PROBES, atlas=False, timeout_s=300)
        if not pinned.capture_supported:
            _capture_refused(r)
            return
        assert r.fc is None and r.failure_kinds() == (SGLANG_EXCEPTION,), r.failures
        assert "during start-up: AssertionError: Attempted to load weight" in r.failures[0].message
        assert " at sglang/srt/model_loader/weight_utils.py:" in r.failures[0].message
    else:
        assert not isinstance(resolved, ServingFailure), resolved
        assert not resolved.fc_applied and resolved.served_sources == (layer(3),)


# ------------------------------------------------------------------ conventions vs this version's setters
_SETTER_CHILD = CPU_SGLANG_PREAMBLE + textwrap.dedent("""
    cases = json.loads(sys.stdin.read())
    out = {}
    for arch, module, layers in [("LlamaForCausalLM", "llama", 8), ("LlamaForCausalLM", "llama", 61),
                                 ("Qwen2ForCausalLM", "qwen2", 8), ("Qwen3ForCausalLM", "qwen3", 8)]:
        try:
            cls = getattr(importlib.import_module("sglang.srt.models." + module), arch)
        except (ImportError, AttributeError):
            continue
        if not hasattr(cls, "set_eagle3_layers_to_capture"):
            continue
        rows = []
        for ids in cases:
            fake = types.SimpleNamespace(
                pp_group=types.SimpleNamespace(is_last_rank=True),
                config=types.SimpleNamespace(num_hidden_layers=layers),
                model=types.SimpleNamespace(layers_to_capture="unset", layers=[types.SimpleNamespace()] * layers),
                capture_aux_hidden_states=False)
            # family A's setters take no ids at all (0.4.8 models/llama.py:700): called as its ModelRunner does
            takes_ids = len(inspect.signature(cls.set_eagle3_layers_to_capture).parameters) > 1
            cls.set_eagle3_layers_to_capture(fake, *([ids] if takes_ids else []))
            rows.append([fake.capture_aux_hidden_states, list(fake.model.layers_to_capture)])
        out[f"{arch}/{layers}"] = rows
    print(json.dumps(out))
""")
# Every id list of length 0..3 over -1..8 (boundary 0 and one past the last layer included), plus None.
_ID_CASES: list[list[int] | None] = [None, *(list(c) for n in range(4) for c in itertools.product(range(-1, 9),
                                                                                                  repeat=n))]


@pytest.fixture(scope="module")
def real_setter_results(facts: tuple[AdapterEntry, VersionFacts]) -> dict[str, list[list[Any]]]:
    """This SGLang's own setters run over ``_ID_CASES`` in a child (sglang needs its CPU shims)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _SETTER_CHILD], input=json.dumps(_ID_CASES), text=True,
                          capture_output=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results: dict[str, list[list[Any]]] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "LlamaForCausalLM/8" in results, results.keys()  # never an empty comparison
    return results


@pytest.mark.sglang
def test_conventions_equal_this_versions_real_setters(real_setter_results: dict[str, list[list[Any]]]) -> None:
    assert SGLANG_VERSION is not None
    compared = 0
    for key, rows in real_setter_results.items():
        arch, layers = key.split("/")
        assert len(rows) == len(_ID_CASES)
        for ids, (flag, stored) in zip(_ID_CASES, rows, strict=True):
            plan = sglang.capture_plan(ids, num_layers=int(layers), architecture=arch, version=SGLANG_VERSION)
            assert flag is True, (key, ids)
            assert tuple(stored) == plan.layers_to_capture, (key, ids, stored, plan)
            compared += 1
    assert compared >= len(_ID_CASES) * 2


@pytest.mark.sglang
def test_installed_version_parses_into_its_registry_range(facts: tuple[AdapterEntry, VersionFacts]) -> None:
    entry, _ = facts
    assert SGLANG_VERSION is not None and entry.accepts(parse_version(SGLANG_VERSION))
