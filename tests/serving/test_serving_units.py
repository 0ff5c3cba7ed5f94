"""The serving room's own logic without starting SGLang: records, rules, child-process handling."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import save_file

from specparity.checkpoint_files import fc_shape_from_checkpoint
from specparity.serving.cache import cache_key
from specparity.serving.child.process import run_child
from specparity.serving.child.transport import read_result, running_engine_version, write_result
from specparity.serving.child.warm import WARM_START_ENV
from specparity.serving.results import (
    CaptureResult,
    FcCapture,
    LayerAtlas,
    ResolvedDeployment,
    ServingFailure,
    SpecSettings,
)
from specparity.serving.sglang.adapter import WorkerRequest, parse_version, select_adapter
from specparity.serving.sglang.child_output import judge_fc_capture, split_rows
from specparity.serving.sglang.client import capture_deployment, resolve_deployment
from specparity.serving.sglang.drafter_facts import served_sources
from specparity.serving.sglang.engine_messages import exception_failure, unknown_architecture_failure
from specparity.sources import boundary_to_source, order_key

STUB = (
    Path(__file__).resolve().parents[2] / "src/specparity/serving/sglang/kernel_stub/sgl_kernel/__init__.py"
)


def _deployment(**over: object) -> ResolvedDeployment:
    base: dict[str, object] = dict(
        engine_version="0.5.23",
        adapter="sglang-0.5.23",
        target_path="/t",
        draft_path="/d",
        device="cpu",
        target_architecture="LlamaForCausalLM",
        num_layers=8,
        target_hidden_size=64,
        target_vocab_size=512,
        target_dtype="float32",
        draft_architecture="LlamaForCausalLMEagle3",
        draft_hidden_size=64,
        draft_vocab_size=None,
        requested_spec=SpecSettings(1, 1, 16),
        resolved_spec=SpecSettings(1, 1, 2),
        spec_warnings=("adjusted",),
        draft_config_ids=(1, 3, 5),
        ids_fallback_reason=None,
        layers_to_capture=(2, 4, 6),
        served_sources=("layer:1", "layer:3", "layer:5"),
        fc_in_features=192,
        fc_out_features=64,
        fc_bias=False,
        num_aux_hidden_states=3,
        fc_applied=True,
        norm_before_fc=False,
        fc_norm=False,
        norm_output=False,
        fc_bias_in_config=False,
        server_args={"dtype": "float32"},
        timings={"total_s": 1.5},
    )
    base.update(over)
    return ResolvedDeployment(**base)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ records
@given(
    ids=st.none() | st.lists(st.integers(-1, 70), max_size=4).map(tuple),
    spec=st.tuples(*(st.none() | st.integers(0, 64) for _ in range(3))),
)
def test_deployment_json_round_trip(ids: tuple[int, ...] | None, spec: tuple[int | None, ...]) -> None:
    d = _deployment(
        draft_config_ids=ids,
        requested_spec=SpecSettings(*spec),
        ids_fallback_reason=None if ids is not None else "draft config has no eagle_config",
    )
    assert ResolvedDeployment.from_dict(json.loads(json.dumps(d.to_dict()))) == d


def test_capture_result_without_fc_needs_a_failure() -> None:
    with pytest.raises(ValueError, match="at least one ServingFailure"):
        CaptureResult(deployment=None, fc=None, atlas=None, failures=())


def test_transport_round_trip(tmp_path: Path) -> None:
    per = [torch.randn(3, 6), torch.randn(5, 6)]
    atlas = LayerAtlas(
        per_sample=[
            {"embedding": torch.randn(3, 2), "final_norm": torch.randn(3, 2)},
            {"embedding": torch.randn(5, 2), "final_norm": torch.randn(5, 2)},
        ],
        num_layers=8,
    )
    fc = FcCapture(
        per_sample=per,
        dtype="float32",
        engine_version="0.5.23",
        hook_calls=1,
        aux_states_captured=3,
        aux_states_expected=3,
        kernel_stub_calls=("copy_all_layer_kv_cache_cpu",),
        aux_per_sample=[t * 2 for t in per],
        kernel_stub_active=True,
    )
    failure = ServingFailure("nonfinite", "x", sample=1)
    write_result(tmp_path, CaptureResult(_deployment(), fc, atlas, (failure,)))
    back = read_result(tmp_path)
    assert back is not None and back.deployment == _deployment()
    # each failure comes back naming the engine release the child ran (running_engine_version: None without one)
    assert back.failures == (dataclasses.replace(failure, engine_version=running_engine_version()),)
    assert back.fc is not None and back.fc.meta_dict() == fc.meta_dict()
    assert all(torch.equal(a, b) for a, b in zip(back.fc.per_sample, per, strict=True))
    assert all(torch.equal(a, b * 2) for a, b in zip(back.fc.aux_per_sample, per, strict=True))
    assert back.atlas is not None and back.atlas.sources() == ("embedding", "final_norm")
    assert torch.equal(back.atlas.per_sample[1]["final_norm"], atlas.per_sample[1]["final_norm"])
    # a child of an older specparity names the engine's version sglang_version: read alike
    doc = json.loads((tmp_path / "result.json").read_text())
    for part in (doc["deployment"], doc["fc"]):
        part["sglang_version"] = part.pop("engine_version")
    (tmp_path / "result.json").write_text(json.dumps(doc))
    older = read_result(tmp_path)
    assert older is not None and older.deployment == back.deployment and older.fc is not None
    assert older.fc.meta_dict() == fc.meta_dict()


# ------------------------------------------------------------------------------------------ rules
@given(num_layers=st.integers(2, 64), data=st.data())
def test_served_sources_are_ascending_dedup_reachable(num_layers: int, data: st.DataObject) -> None:
    boundaries = data.draw(st.lists(st.integers(-2, num_layers + 2), max_size=6))
    sources, unreachable = served_sources(boundaries, num_layers, max_reachable=num_layers - 1)
    keys = [order_key(s) for s in sources]
    assert keys == sorted(set(keys))  # ascending, no duplicates: fc-chunk order
    assert set(sources) == {boundary_to_source(b, num_layers) for b in boundaries if 0 <= b < num_layers}
    assert set(unreachable) == {b for b in boundaries if not 0 <= b < num_layers}


def test_split_rows_restores_samples() -> None:
    parts = [torch.randn(n, 4) for n in (3, 1, 5)]
    assert all(torch.equal(a, b) for a, b in zip(split_rows(torch.cat(parts), [3, 1, 5]), parts, strict=True))


def test_judge_flags_every_shortfall() -> None:
    ok = dict(
        hook_calls=1,
        rows=9,
        width=192,
        expected_rows=9,
        expected_width=192,
        aux_captured=3,
        aux_expected=3,
        fc_applied=True,
    )
    assert judge_fc_capture(**ok) == []  # type: ignore[arg-type]
    assert [f.kind for f in judge_fc_capture(**{**ok, "hook_calls": 0, "rows": None})] == ["fc_not_called"]  # type: ignore[arg-type]
    assert [f.kind for f in judge_fc_capture(**{**ok, "aux_captured": 2, "width": 128})] == [  # type: ignore[arg-type]
        "capture_count_short",
        "capture_shape",
    ]
    skipped = judge_fc_capture(**{**ok, "hook_calls": 0, "rows": None, "fc_applied": False})  # type: ignore[arg-type]
    assert "k*H_t == H_d" in skipped[0].message


def test_version_registry() -> None:
    assert parse_version("0.5.23.post1") == (0, 5, 23)
    entry = select_adapter("0.5.23")
    assert not isinstance(entry, ServingFailure) and entry.name == "sglang-family-E"
    for old in ("0.4.4.post1", "0.3.0", "garbage"):  # versions no adapter serves (tests/serving/test_versions.py)
        f = select_adapter(old)
        assert isinstance(f, ServingFailure) and f.kind == "unsupported_version"
        assert ">=0.5.22,<0.5.24" in f.message and old in f.message


def test_exception_failure_quotes_innermost_sglang_frame() -> None:
    code = compile(
        "def f():\n    raise TypeError('unsupported operand')\n",
        "/venv/lib/python3.11/site-packages/sglang/srt/models/llama.py",
        "exec",
    )
    ns: dict[str, object] = {}
    exec(code, ns)
    try:
        ns["f"]()  # type: ignore[operator]
    except TypeError as exc:
        f = exception_failure(exc)
    assert f.kind == "sglang_exception"
    assert f.message == "TypeError: unsupported operand at sglang/srt/models/llama.py:2"


def _autoconfig_refusal(target: Path) -> ValueError:
    """What transformers' own AutoConfig raises on ``target`` (as SGLang calls it: trust_remote_code off)."""
    from transformers import AutoConfig

    with pytest.raises(ValueError) as info:
        AutoConfig.from_pretrained(str(target), trust_remote_code=False)
    return info.value


@pytest.mark.parametrize("auto_map", [True, False])
def test_an_unknown_model_type_is_said_the_same_way_whether_or_not_the_config_names_remote_code(
        tmp_path: Path, auto_map: bool) -> None:
    """Kimi-K2.5's hub config on an SGLang whose transformers predates it: with auto_map transformers says
    "contains custom code which must be executed", without it "does not recognize this architecture";
    both are the same fact, said the same way (explain and gate show it on every version)."""
    cfg: dict[str, object] = {"model_type": "specparity_unknown_arch", "architectures": ["UnknownArchForCausalLM"]}
    if auto_map:
        cfg["auto_map"] = {"AutoConfig": "configuration_unknown.UnknownConfig"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    exc = _autoconfig_refusal(tmp_path)
    f = unknown_architecture_failure(exc, target=tmp_path, sglang_version="0.4.8", prefix="while resolving: ")
    assert f is not None and f.kind == "sglang_exception"
    assert f.message.startswith("while resolving: sglang 0.4.8 does not recognize this architecture: the target's "
                                "model_type 'specparity_unknown_arch' (UnknownArchForCausalLM) is unknown"), f.message
    assert ("auto_map" in f.message) == auto_map
    assert f"transformers said: ValueError: {str(exc).strip().splitlines()[0][:200]}" in f.message


def test_other_config_errors_are_left_as_they_were(tmp_path: Path) -> None:
    """A model_type transformers knows, or an exception not raised by transformers, is not this case."""
    from transformers import AutoConfig

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError) as info:
        AutoConfig.for_model("specparity_unknown_arch")  # transformers raises, but the target's llama is known
    assert unknown_architecture_failure(info.value, target=tmp_path, sglang_version="0.4.8") is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "specparity_unknown_arch"}))
    assert unknown_architecture_failure(ValueError("not from transformers"), target=tmp_path,
                                        sglang_version="0.4.8") is None
    assert unknown_architecture_failure(_autoconfig_refusal(tmp_path), target=tmp_path / "absent",
                                        sglang_version="0.4.8") is None


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_fc_shape_from_checkpoint(tmp_path: Path, fmt: str) -> None:
    w = {"fc.weight": torch.zeros(64, 192), "fc.bias": torch.zeros(64), "fc_norm.0.weight": torch.ones(64)}
    if fmt == "safetensors":
        save_file(w, str(tmp_path / "model.safetensors"))
    else:
        torch.save(w, tmp_path / "pytorch_model.bin")
    shape = fc_shape_from_checkpoint(tmp_path)
    assert shape is not None and (shape.in_features, shape.out_features, shape.bias) == (192, 64, True)


@given(items=st.dictionaries(st.sampled_from(["a", "b", "c", "speculative_num_steps"]), st.integers(0, 9)))
def test_cache_key_ignores_server_arg_order(items: dict[str, int]) -> None:
    forward = cache_key("capture", "/t", "/d", server_args=items, device="cpu", probes=[[1, 2]])
    backward = cache_key(
        "capture", "/t", "/d", server_args=dict(reversed(list(items.items()))), device="cpu", probes=[[1, 2]]
    )
    assert forward == backward
    assert forward != cache_key("capture", "/t", "/d", server_args=items, device="cpu", probes=[[2, 1]])


def _model_dirs(root: Path) -> tuple[Path, Path]:
    for role in ("target", "draft"):
        (root / role).mkdir(parents=True)
        (root / role / "config.json").write_text(json.dumps({"num_hidden_layers": 8}))
        (root / role / "model.safetensors").write_bytes(b"0" * 64)
    return root / "target", root / "draft"


def test_session_cache_is_keyed_by_content_not_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An in-place edit of a config or a weight file must not reuse the stale result."""
    import specparity.serving.cache as cache_mod

    calls: list[int] = []

    def fake_resolve(target: Path, draft: Path, **_: object) -> ServingFailure:
        calls.append(json.loads((Path(draft) / "config.json").read_text())["num_hidden_layers"])
        return ServingFailure("bad_deployment", f"call {len(calls)}")

    monkeypatch.setattr(cache_mod, "resolve_deployment", fake_resolve)
    cache = cache_mod.SessionCache()
    target, draft = _model_dirs(tmp_path)
    first = cache.resolve(target, draft)
    assert cache.resolve(target, draft) is first and calls == [8]  # unchanged: a hit
    (draft / "config.json").write_text(json.dumps({"num_hidden_layers": 1}))  # same path, new content
    assert cache.resolve(target, draft).message == "call 2" and calls == [8, 1]
    weights = target / "model.safetensors"
    st = weights.stat()
    weights.write_bytes(b"1" * 64)  # same size; a rewrite moves the mtime
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert cache.resolve(target, draft).message == "call 3"
    assert cache.resolve(target, draft, server_args={"speculative_num_steps": 2}).message == "call 4"
    assert cache.resolve(target, draft, python="/nonexistent/python").message == "call 5"
    assert cache.resolve(target, draft).message == "call 3"  # the same content again: a hit
    assert (cache.hits, cache.misses) == (2, 5)


def test_cache_key_names_the_interpreter_and_its_sglang(tmp_path: Path) -> None:
    from specparity.serving.cache import interpreter_identity

    here = interpreter_identity(None)
    assert here.startswith(os.path.realpath(sys.executable) + " sglang=")
    assert here.split("sglang=")[1] not in ("", "unknown")
    assert "unknown" in interpreter_identity(str(tmp_path / "no-python"))


def test_real_sglang_tests_fail_where_sglang_is_missing() -> None:
    """The real-SGLang modules used a module-level importorskip, which skipped 18 tests without a word where
    sglang was missing; now they fail with a message that says where to run them."""
    from version_facts import require_sglang

    with pytest.raises(pytest.fail.Exception, match="sglang is not importable"):
        require_sglang(lambda name: None)
    require_sglang()  # this interpreter (.venv) has sglang
    for module in ("test_sglang_capture.py", "test_replay_sglang.py"):
        text = (Path(__file__).parent / module).read_text()
        assert "importorskip" not in text and 'usefixtures("sglang_required")' in text, module


# ------------------------------------------------------------------------------------------ bad input
def test_target_without_config_is_bad_deployment(tmp_path: Path) -> None:
    (tmp_path / "target").mkdir()
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "config.json").write_text("{}")
    r = resolve_deployment(tmp_path / "target", tmp_path / "draft")
    assert isinstance(r, ServingFailure) and r.kind == "bad_deployment" and "config.json" in r.message
    c = capture_deployment(tmp_path / "target", tmp_path / "draft", probes=[[1, 2]])
    assert c.fc is None and c.failure_kinds() == ("bad_deployment",)


def test_empty_probe_list_is_fc_not_called_without_starting_sglang(tmp_path: Path) -> None:
    for role in ("target", "draft"):
        (tmp_path / role).mkdir()
        (tmp_path / role / "config.json").write_text("{}")
    # a started child would fail with sglang_missing on this interpreter
    r = capture_deployment(tmp_path / "target", tmp_path / "draft", probes=[], python="/nonexistent/python")
    assert r.fc is None and r.failure_kinds() == ("fc_not_called",)
    r = capture_deployment(tmp_path / "target", tmp_path / "draft", probes=[[1, 2], []])
    assert r.failures == (ServingFailure("bad_deployment", "probe sample has no tokens", sample=1),)


# ------------------------------------------------------------------------------------------ child process
@pytest.fixture(autouse=True)
def _cold_children(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests pin the cold child path (run_child with a fake interpreter); the warm path and a wrapper
    interpreter that is not a zygote are tests/unit/test_warm_start.py's. Cold here also keeps the fake
    scripts from being started as zygotes (they would write their files relative to the working directory)."""
    monkeypatch.setenv(WARM_START_ENV, "0")


def _fake_python(tmp_path: Path, body: str) -> str:
    script = tmp_path / "fake-python"
    script.write_text("#!/bin/bash\n" + body)
    script.chmod(0o755)
    return str(script)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # the "interpreter" starts a grandchild and hangs: both must be gone after the timeout
    python = _fake_python(tmp_path, f"sleep 300 &\necho $! > {pids}\necho $$ >> {pids}\nwait\n")
    t0 = time.monotonic()
    r = run_child(WorkerRequest(op="resolve", target="/t", draft="/d"), python=python, timeout_s=1.5)
    assert isinstance(r, ServingFailure) and r.kind == "timeout"
    assert time.monotonic() - t0 < 30
    recorded = [int(x) for x in pids.read_text().split()]
    assert len(recorded) == 2
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in recorded) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in recorded), "an orphan survived the timeout"


def test_raising_progress_callback_still_kills_the_child(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    python = _fake_python(tmp_path, f"echo $$ > {pids}\necho '@@specparity-progress 1 3'\nsleep 300\n")

    def explode(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_child(
            WorkerRequest(op="capture", target="/t", draft="/d"),
            python=python,
            timeout_s=60,
            progress=explode,
        )
    pid = int(pids.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def test_child_crash_carries_stderr_tail(tmp_path: Path) -> None:
    python = _fake_python(tmp_path, "echo 'Fatal Python error: Segmentation fault' >&2\nexit 139\n")
    r = run_child(WorkerRequest(op="capture", target="/t", draft="/d"), python=python, timeout_s=30)
    assert isinstance(r, ServingFailure) and r.kind == "child_crashed"
    assert "139" in r.message and "Segmentation fault" in r.message


def test_progress_lines_reach_the_callback(tmp_path: Path) -> None:
    doc = json.dumps(
        {
            "format": "specparity-serving-result/1",
            "deployment": None,
            "fc": None,
            "atlas": None,
            "failures": [{"kind": "fc_not_called", "message": "m", "sample": None}],
        }
    )
    python = _fake_python(
        tmp_path,
        "echo '@@specparity-progress 1 2'\necho '@@specparity-progress 2 2'\n"
        f'mkdir -p "$4"\necho \'{doc}\' > "$4/result.json"\n',
    )
    seen: list[tuple[int, int]] = []
    r = run_child(
        WorkerRequest(op="capture", target="/t", draft="/d"),
        python=python,
        timeout_s=30,
        progress=lambda d, t: seen.append((d, t)),
    )
    assert not isinstance(r, ServingFailure) and r.failures[0].kind == "fc_not_called"
    assert seen == [(1, 2), (2, 2)]


def test_missing_interpreter_is_sglang_missing() -> None:
    r = run_child(WorkerRequest(op="resolve", target="/t", draft="/d"), python="/nonexistent/python3")
    assert isinstance(r, ServingFailure) and r.kind == "sglang_missing"


# ------------------------------------------------------------------------------------------ sgl_kernel stand-in
def test_kernel_stub_records_calls_and_refuses_other_ops() -> None:
    script = f"""
import importlib.util, torch
spec = importlib.util.spec_from_file_location("sgl_kernel", {str(STUB)!r})
k = importlib.util.module_from_spec(spec); spec.loader.exec_module(k)
buf = torch.arange(8, dtype=torch.int32)
k.copy_all_layer_kv_cache_cpu(torch.tensor([buf.data_ptr()]), torch.tensor([4]), torch.tensor([1]), torch.tensor([1]))
try:  # a real KV move (slot 0 -> slot 1) needs the real kernel: the stand-in refuses it
    k.copy_all_layer_kv_cache_cpu(torch.tensor([buf.data_ptr()]), torch.tensor([4]), torch.tensor([1]),
                                  torch.tensor([0]))
except NotImplementedError as e:
    assert "(0, 1)" in str(e), str(e)
else:
    raise SystemExit("a real KV move did not raise")
assert buf.tolist() == list(range(8)), buf.tolist()
try:
    k.rmsnorm(buf)
except NotImplementedError as e:
    assert "sgl_kernel.rmsnorm" in str(e)
else:
    raise SystemExit("rmsnorm did not raise")
assert k.CALLED == ["copy_all_layer_kv_cache_cpu", "copy_all_layer_kv_cache_cpu", "rmsnorm"], k.CALLED
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


@pytest.mark.parametrize(("device", "installed"), [("cpu", True), ("cuda", False)])
def test_stub_goes_on_sys_path_only_on_cpu(device: str, installed: bool) -> None:
    script = (
        "import sys; from specparity.serving.sglang import worker as w; "
        f"print(w.install_kernel_stub_if_needed({device!r}), str(w.STUB_DIR) in sys.path)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True, env=env)
    # this venv has no sgl_kernel, so on cpu the stand-in is installed; never on cuda
    assert out.stdout.split() == [str(installed), str(installed)]


# ------------------------------------------------------------------------------------------ 0.5.23 static rules
def test_fallback_reason_names_why_sglang_used_its_default() -> None:
    from types import SimpleNamespace

    from specparity.serving.sglang.since_0_5_11.core import _fallback_reason

    assert _fallback_reason(SimpleNamespace(), [1, 3, 5]) is None
    assert _fallback_reason(SimpleNamespace(), None) == "draft config has no eagle_config"
    top = _fallback_reason(SimpleNamespace(eagle_aux_hidden_state_layer_ids=[1, 3, 5]), None)
    assert top is not None and top.startswith("draft config has no eagle_config") and "top-level" in top
    assert _fallback_reason(SimpleNamespace(eagle_config=[1]), None) == (
        "malformed eagle_config: expected a mapping, got list"
    )
    assert _fallback_reason(SimpleNamespace(eagle_config={"use_aux_hidden_state": True}), None) == (
        "malformed eagle_config: no eagle_aux_hidden_state_layer_ids"
    )


def test_server_args_defaults_per_device_and_user_wins() -> None:
    from specparity.serving.sglang.since_0_5_11.core import server_args_kwargs

    cpu = server_args_kwargs(WorkerRequest(op="capture", target="/t", draft="/d", probes=((1, 2),)))
    assert cpu["attention_backend"] == "torch_native" and cpu["disable_cuda_graph"] is True
    assert (cpu["model_path"], cpu["speculative_draft_model_path"], cpu["speculative_algorithm"]) == (
        "/t",
        "/d",
        "EAGLE3",
    )
    cuda = server_args_kwargs(WorkerRequest(op="capture", target="/t", draft="/d", device="cuda"))
    assert (
        "attention_backend" not in cuda and "disable_cuda_graph" not in cuda
    )  # SGLang's defaults, graphs on
    user = server_args_kwargs(
        WorkerRequest(
            op="resolve", target="/t", draft="/d", server_args={"dtype": "bfloat16", "page_size": 16}
        )
    )
    assert (user["dtype"], user["page_size"]) == ("bfloat16", 16)


def test_non_json_server_arg_is_bad_deployment(tmp_path: Path) -> None:
    for role in ("target", "draft"):
        (tmp_path / role).mkdir()
        (tmp_path / role / "config.json").write_text("{}")
    r = resolve_deployment(
        tmp_path / "target", tmp_path / "draft", server_args={"model_loader_extra_config": {1j}}
    )
    assert (
        isinstance(r, ServingFailure)
        and r.kind == "bad_deployment"
        and "model_loader_extra_config" in r.message
    )


def test_no_replay_status_is_the_capture_failure_that_stopped_it(tmp_path: Path) -> None:
    """Family A refuses the capture level, so its child writes no replay status: the outcome level's reason is that
    refusal itself (one failure, naming --level static), not a second one claiming some version is needed."""
    from specparity.serving.drafter_replay import read_replay
    from specparity.serving.results import UNSUPPORTED_VERSION

    refusal = ServingFailure(UNSUPPORTED_VERSION, "sglang 0.4.8 (family A) is supported at the static level only; "
                                                  "run `specparity gate --level static`")
    assert read_replay(tmp_path / "replay.safetensors", 2, capture_failures=(refusal,)) is refusal
    alone = read_replay(tmp_path / "replay.safetensors", 2)
    assert isinstance(alone, ServingFailure) and alone.kind == UNSUPPORTED_VERSION
    assert "ran no drafter replay" in alone.message and "0.5.23" not in alone.message


def test_an_exception_in_specparitys_own_adapter_is_a_gap_not_an_sglang_refusal(tmp_path: Path) -> None:
    """A frame of specparity's serving/sglang/ code is not SGLang's: the failure names specparity's file and is
    ``unsupported_version`` (exit 3), even when a library frame below it raised (transformers' config)."""
    from specparity.serving.sglang import engine_messages
    from specparity.serving.sglang.engine_messages import exception_failure, harness_gap_failure

    def ours() -> None:
        getattr(object(), "num_hidden_layers")  # noqa: B009 (raises inside a builtin, as transformers' config does)

    try:
        ours()
    except AttributeError as exc:
        gap = harness_gap_failure(exc, module_file=__file__, sglang_version="0.5.10", prefix="while resolving: ")
        plain = exception_failure(exc)
        elsewhere = harness_gap_failure(exc, module_file=engine_messages.__file__, sglang_version="0.5.10")
    assert gap is not None and gap.kind == "unsupported_version"
    assert "a gap in specparity" in gap.message and "test_serving_units.py:" in gap.message
    assert elsewhere is None
    assert " at " not in plain.message  # no SGLang frame: nothing is labelled sglang/...
