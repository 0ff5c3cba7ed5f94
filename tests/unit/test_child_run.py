"""The child-run wrapper both engines share (serving/child/run.py) and the session cache over it, without a
child: ``process.run_child`` is replaced by a recording stand-in."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from test_gate import _deployment

import specparity.serving.cache as cache_mod
from specparity.serving.child import process
from specparity.serving.child.transport import ChildOutcome
from specparity.serving.results import CaptureResult, ResolvedDeployment, ServingFailure
from specparity.serving.sglang import client as serving
from specparity.serving.vllm import client as serving_vllm


def _model_dirs(root: Path) -> tuple[Path, Path]:
    for role in ("target", "draft"):
        (root / role).mkdir(parents=True)
        (root / role / "config.json").write_text(json.dumps({"num_hidden_layers": 8}))
    return root / "target", root / "draft"


class _Child:
    """Stands in for process.run_child: records each call and answers with ``result``."""

    def __init__(self, result: ChildOutcome | ServingFailure) -> None:
        self.result = result
        self.calls: list[dict[str, Any]] = []

    def __call__(self, request: Any, **kwargs: Any) -> ChildOutcome | ServingFailure:
        self.calls.append({"request": request, **kwargs})
        return self.result


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    return _model_dirs(tmp_path)


def _patch(monkeypatch: pytest.MonkeyPatch, result: ChildOutcome | ServingFailure) -> _Child:
    child = _Child(result)
    monkeypatch.setattr(process, "run_child", child)
    return child


def test_both_engines_resolve_through_one_wrapper_with_their_own_worker(
        dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    child = _patch(monkeypatch, ChildOutcome(_deployment(), None, None, ()))
    target, draft = dirs
    sglang = serving.resolve_deployment(target, draft, server_args={"x": 1}, timeout_s=7, python="/py")
    vllm = serving_vllm.resolve_deployment(target, draft, engine_args={"x": 2}, device="cuda")
    for dep in (sglang, vllm):
        assert isinstance(dep, ResolvedDeployment) and dep.timings["child_wall_s"] >= 0
    first, second = child.calls
    assert first["request"].op == "resolve" and first["request"].server_args == {"x": 1}
    assert {k: v for k, v in first.items() if k != "request"} == {"python": "/py", "timeout_s": 7}
    assert second["request"].device == "cuda" and second["request"].server_args == {"x": 2}
    assert second["module"] == serving_vllm.WORKER_MODULE and second["engine"] == "vLLM"
    assert second["timeout_s"] == 300 and second["python"] is None


def test_resolve_maps_the_childs_failures(dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    target, draft = dirs
    crashed = ServingFailure("child_crashed", "died")
    _patch(monkeypatch, crashed)
    assert serving.resolve_deployment(target, draft) is crashed
    refused = ServingFailure("bad_deployment", "no")
    _patch(monkeypatch, ChildOutcome(None, None, None, (refused, crashed)))
    assert serving_vllm.resolve_deployment(target, draft) is refused
    child = _patch(monkeypatch, crashed)
    bad = serving.resolve_deployment(target, draft.parent / "missing")
    assert isinstance(bad, ServingFailure) and bad.kind == "bad_deployment" and child.calls == []


def test_capture_failures_before_and_in_the_child(dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    target, draft = dirs
    child = _patch(monkeypatch, ServingFailure("timeout", "slow"))
    for capture in (serving.capture_deployment, serving_vllm.capture_deployment):
        assert capture(target, draft, probes=[]).failure_kinds() == ("fc_not_called",)
        assert capture(target, draft, probes=[[1, -1]]).failure_kinds() == ("bad_deployment",)
        failed = capture(target, draft, probes=[[1, 2]])
        assert failed.failure_kinds() == ("timeout",) and failed.loop is None and failed.replay is None
    assert len(child.calls) == 2


def test_capture_keeps_each_engines_own_fields(dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    target, draft = dirs
    loop = {"counters": {"spec_decode_num_drafts": 2, "spec_decode_num_accepted_tokens_per_pos": [2, 1]}}
    failure = ServingFailure("fc_not_called", "no call")
    child = _patch(monkeypatch, ChildOutcome(_deployment(), None, None, (failure,), loop=loop))
    sglang = serving.capture_deployment(target, draft, probes=[[1, 2]], atlas=False)
    assert sglang.loop is None and sglang.acceptance is None and sglang.failures == (failure,)
    assert sglang.deployment is not None and "child_wall_s" in sglang.deployment.timings
    vllm = serving_vllm.capture_deployment(target, draft, probes=[[1, 2]], progress=print)
    assert vllm.loop == loop and vllm.acceptance is not None and vllm.acceptance.accepted_per_position == (2, 1)
    assert child.calls[0]["progress"] is None and "module" not in child.calls[0]
    assert child.calls[1]["progress"] is print and child.calls[1]["annotate"] is not None


def test_the_serving_face_names_no_engine() -> None:
    """``specparity.serving`` holds only the engine-neutral records; each engine's entry points are in its room."""
    import specparity.serving as face

    assert not {"resolve_deployment", "capture_deployment", "make_request"} & set(face.__all__)
    assert {"capture_deployment", "resolve_deployment"} == set(serving.__all__) <= set(serving_vllm.__all__)


def test_session_cache_methods_take_the_serving_functions_parameters(
        dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def fake_capture(*args: Any, **kwargs: Any) -> CaptureResult:
        calls.append((args, kwargs))
        return CaptureResult(None, None, None, (ServingFailure("bad_deployment", str(len(calls))),))

    monkeypatch.setattr(cache_mod, "capture_deployment", fake_capture)
    cache = cache_mod.SessionCache()
    target, draft = dirs
    first = cache.capture(target, draft, probes=[[1, 2]], timeout_s=5)
    assert calls == [((target, draft), {"probes": [[1, 2]], "timeout_s": 5})]
    # the defaults are part of the key: spelling them out is the same call
    assert cache.capture(target, draft, probes=[[1, 2]], device="cpu", atlas=True, server_args=None) is first
    assert cache.capture(target, draft, probes=[[1, 2]], atlas=False) is not first
    assert (cache.hits, cache.misses) == (1, 2)
    for unkeyed in ({"progress": None}, {"recorded_fc": None}):
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            cache.capture(target, draft, probes=[[1, 2]], **unkeyed)
    with pytest.raises(TypeError):
        cache.capture(target, draft)  # type: ignore[call-arg]
    assert len(calls) == 2


def test_session_cache_resolve_keys_like_cache_key(dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[cache_mod.CacheKey] = []
    real_get = cache_mod.SessionCache._get

    def recording_get(self: cache_mod.SessionCache, key: cache_mod.CacheKey, compute: Any) -> Any:
        seen.append(key)
        return real_get(self, key, compute)

    monkeypatch.setattr(cache_mod.SessionCache, "_get", recording_get)
    monkeypatch.setattr(cache_mod, "resolve_deployment", lambda *a, **k: _deployment())
    target, draft = dirs
    dep = cache_mod.SessionCache().resolve(target, draft, server_args={"a": 1}, python="/py")
    assert dataclasses.asdict(dep) == dataclasses.asdict(_deployment())
    assert seen == [cache_mod.cache_key("resolve", target, draft, server_args={"a": 1}, device="cpu", python="/py")]
