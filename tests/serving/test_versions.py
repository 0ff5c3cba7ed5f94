"""Version-specific SGLang behaviour, pinned per adapter family (issue 7: the tox matrix).

Each ``sglang-*`` matrix env runs this file against its own SGLang (``pytest -m sglang``); the expected
behaviour is picked through the adapter registry for the installed version, never by skipping. The
unmarked tests check the registry, the matrix wiring and the pure helpers of the old-version adapters
(they run in the ``unit`` env).

Facts pinned here (table: ``version_facts.FACTS``, shared with the other real-SGLang tests; domain.md §3.4,
§5, §7 D9; sglang-cpu.md §9):
- draft ids ``[1,3,5]``: the fc input equals HF ``layer:1,3,5`` on every version;
- ``[-1,1,3]``: TypeError ``hs + None`` at models/llama.py:332 (0.4.10.post2) / :340 (0.5.3), reported as
  ``sglang_exception``; 0.5.23 serves ``embedding, layer:1, layer:3``;
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
from version_facts import FACTS, SGLANG_VERSION, VersionFacts

from specparity.contract.sglang_capture import TYPE_ERROR_HS_NONE, sglang_capture_plan
from specparity.serving.results import SGLANG_EXCEPTION, UNSUPPORTED_VERSION, ServingFailure
from specparity.serving.sglang.adapter import REGISTRY, AdapterEntry, parse_version, select_adapter
from specparity.sources import EMBEDDING, layer

REPO = Path(__file__).resolve().parents[2]
TOL = 1e-5
H = 64
NUM_LAYERS = 8
SPEC_REWRITE = {"speculative_num_steps": 1, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 16}


# ================================================================================ no sglang needed
def test_every_adapter_has_pinned_facts_a_matrix_env_and_a_pinned_list() -> None:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(REPO / "tox.ini")
    matrix = (REPO / "scripts" / "matrix.sh").read_text()
    for entry in REGISTRY:
        assert entry.name in FACTS, f"{entry.name}: pin its version-specific behaviour in FACTS"
        assert f"testenv:{entry.name}" in tox, f"tox.ini has no [testenv:{entry.name}]"
        assert entry.name in matrix, f"scripts/matrix.sh does not know {entry.name}"
        lowest = ".".join(map(str, entry.lowest))
        assert list((REPO / "constraints").glob(f"sglang-{lowest}*.txt")), f"no pinned list for {entry.name}"


def test_supported_versions_table_lists_every_adapter() -> None:
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "supported_versions.py")], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    rows = [line for line in out.splitlines() if line.startswith("| `")]
    assert len(rows) == len(REGISTRY)
    for entry in REGISTRY:
        assert any(f"`{entry.range_text}`" in row and "family " in row for row in rows), entry


_VERSIONS = st.tuples(st.integers(0, 1), st.integers(0, 6), st.integers(0, 30))


@given(_VERSIONS)
def test_registry_ranges_are_disjoint_and_selection_is_exact(version: tuple[int, int, int]) -> None:
    accepting = [e for e in REGISTRY if e.accepts(version)]
    assert len(accepting) <= 1
    picked = select_adapter(".".join(map(str, version)) + ".post2")
    if accepting:
        assert isinstance(picked, AdapterEntry) and picked == accepting[0]
    else:
        assert isinstance(picked, ServingFailure) and picked.kind == UNSUPPORTED_VERSION
        for entry in REGISTRY:  # the message names the whole supported range
            assert entry.range_text in picked.message


@pytest.mark.parametrize(("installed", "name"), [("0.4.10.post2", "sglang-0.4.10"), ("0.5.3", "sglang-0.5.3"),
                                                   ("0.5.23", "sglang-0.5.23")])
def test_matrix_versions_select_their_adapter(installed: str, name: str) -> None:
    picked = select_adapter(installed)
    assert isinstance(picked, AdapterEntry) and picked.name == name


@pytest.mark.parametrize("installed", ["0.4.9", "0.5.2", "0.5.10", "0.5.22", "0.6.0", "garbage"])
def test_unsupported_version_is_a_clear_failure(installed: str) -> None:
    picked = select_adapter(installed)
    assert isinstance(picked, ServingFailure) and picked.kind == UNSUPPORTED_VERSION
    assert f"sglang {installed} is not supported" in picked.message
    assert "0.4.10" in picked.message and "0.5.3" in picked.message and "0.5.23" in picked.message


_JSONISH = st.recursive(st.none() | st.booleans() | st.integers(-3, 70) | st.text(max_size=4),
                        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                                    max_size=3), max_leaves=8)


@given(eagle_config=_JSONISH | st.fixed_dictionaries(
    {"eagle_aux_hidden_state_layer_ids": st.none() | st.lists(st.integers(-1, 70), max_size=4)}))
def test_old_runner_id_reader_never_raises_and_explains_none(eagle_config: Any) -> None:
    """The re-typed reader of 0.5.3 model_runner.py:458-466: bare except -> None, and a reason for every None."""
    from specparity.serving.sglang.legacy import ids_fallback_reason, read_draft_ids

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
    from specparity.serving.sglang.legacy import server_args_kwargs

    req = WorkerRequest(op="capture", target="/t", draft="/d", probes=((1, 2, 3),),
                        server_args={"dtype": "bfloat16", "model_path": "/elsewhere", "speculative_eagle_topk": 1})
    kw = server_args_kwargs(req)
    assert kw["dtype"] == "bfloat16" and kw["speculative_eagle_topk"] == 1
    assert (kw["model_path"], kw["speculative_draft_model_path"]) == ("/t", "/d")
    assert kw["skip_tokenizer_init"] is True  # transformers 4.x cannot load a 5.x tokenizer (sglang-cpu.md §4)
    assert kw["attention_backend"] == "torch_native" and kw["disable_cuda_graph"] is True


def test_legacy_shims_only_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from specparity.serving.sglang import legacy_shims

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
        pytest.fail("the sglang tests need SGLang installed (scripts/venv.sh, scripts/venv-sglang.sh)",
                    pytrace=False)
    entry = select_adapter(SGLANG_VERSION)
    assert isinstance(entry, AdapterEntry), entry
    return entry, FACTS[entry.name]


def _capture(cache: Any, models: dict[str, Path], name: str) -> Any:
    d = models[name]
    return cache.capture(d / "target", d / "draft", probes=PROBES, atlas=True, timeout_s=300)


def _resolve(cache: Any, models: dict[str, Path], name: str, **server_args: object) -> Any:
    d = models[name]
    return cache.resolve(d / "target", d / "draft", server_args=server_args, timeout_s=200)


def _plan(ids: list[int] | None) -> Any:
    assert SGLANG_VERSION is not None
    return sglang_capture_plan(ids, num_layers=NUM_LAYERS, architecture="LlamaForCausalLM", version=SGLANG_VERSION)


def _max_err(fc: torch.Tensor, hs: tuple[torch.Tensor, ...], hf_indices: list[int]) -> float:
    return float((fc - torch.cat([hs[i] for i in hf_indices], dim=-1)).abs().max())


@pytest.mark.sglang
def test_ids_1_3_5_fc_input_equals_hf_on_every_version(
        facts: tuple[AdapterEntry, VersionFacts], serving_cache: Any, models: dict[str, Path],
        hf_hidden_states: list[tuple[torch.Tensor, ...]]) -> None:
    entry, pinned = facts
    r = _capture(serving_cache, models, "ids_1_3_5")
    assert r.failures == (), r.failures
    assert r.deployment.adapter == entry.name and r.deployment.sglang_version == SGLANG_VERSION
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
    assert r.served_sources == (layer(1), layer(3), layer(5))


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
        assert r.fc is None and r.failure_kinds() == (SGLANG_EXCEPTION,), r.failures
        assert "during start-up: AssertionError: Attempted to load weight" in r.failures[0].message
        assert " at sglang/srt/model_loader/weight_utils.py:" in r.failures[0].message
    else:
        assert not isinstance(resolved, ServingFailure), resolved
        assert not resolved.fc_applied and resolved.served_sources == (layer(3),)


# ------------------------------------------------------------------ conventions vs this version's setters
_SETTER_CHILD = textwrap.dedent("""
    import importlib, json, os, sys, types
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    from importlib import metadata
    from specparity.serving.sglang import legacy_shims
    from specparity.serving.sglang.adapter import select_adapter
    from specparity.serving.sglang.worker import install_kernel_stub_if_needed
    entry = select_adapter(metadata.version("sglang"))
    glue = getattr(importlib.import_module(entry.module), "GLUE", None)
    install_kernel_stub_if_needed("cpu")
    if glue is not None:
        legacy_shims.install(device="cpu", torch_drift=glue.torch_drift)
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
            cls.set_eagle3_layers_to_capture(fake, ids)
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
            plan = sglang_capture_plan(ids, num_layers=int(layers), architecture=arch, version=SGLANG_VERSION)
            assert flag is True, (key, ids)
            assert tuple(stored) == plan.layers_to_capture, (key, ids, stored, plan)
            compared += 1
    assert compared >= len(_ID_CASES) * 2


@pytest.mark.sglang
def test_installed_version_parses_into_its_registry_range(facts: tuple[AdapterEntry, VersionFacts]) -> None:
    entry, _ = facts
    assert SGLANG_VERSION is not None and entry.accepts(parse_version(SGLANG_VERSION))
