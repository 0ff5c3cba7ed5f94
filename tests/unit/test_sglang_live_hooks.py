"""The live SGLang hooks and their parent side without a server: a torch module tree shaped like SGLang 0.5.23's
llama target and EAGLE-3 drafter (the names ``--forward-hooks`` patterns match, the norms' ``(normed, residual)``
return, a ForwardBatch-like argument), hooks registered as ``hook_manager.register_forward_hooks`` does.

The real server runs in tests/serving/test_sglang_live_server.py.
"""

from __future__ import annotations

import fnmatch
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from specparity.serving.results import FC_NOT_CALLED, RANK_MISSING, CaptureResult, SpecSettings
from specparity.serving.sglang import live, live_hooks, live_wire
from specparity.sources import EMBEDDING, FINAL_NORM

H, L, K = 8, 4, 3


class Norm(torch.nn.Module):
    """SGLang's RMSNorm contract: ``norm(x)`` -> normed; ``norm(x, residual)`` -> ``(normed, x + residual)``."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> Any:
        if residual is None:
            return x * 2.0
        s = x + residual
        return s * 2.0, s


class Layer(torch.nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.input_layernorm = Norm()
        self.lin = torch.nn.Linear(H, H)
        torch.nn.init.normal_(self.lin.weight, std=0.3, generator=torch.Generator().manual_seed(i))


class Inner(torch.nn.Module):
    """The target's inner ``model``: the residual handed to the next layer's input norm (0.5.23 layer_boundary)."""

    def __init__(self, capture: tuple[int, ...]) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(64, H)
        self.layers = torch.nn.ModuleList(Layer(i) for i in range(L))
        self.norm = Norm()
        self.capture = capture

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: Any) -> Any:
        h = self.embed_tokens(input_ids)
        residual = None
        aux = []
        for i, layer in enumerate(self.layers):
            if residual is None:
                x, residual = layer.input_layernorm(h), h
                stream = h
            else:
                x, residual = layer.input_layernorm(h, residual)
                stream = residual
            if i in self.capture:
                aux.append(stream)
            h = layer.lin(x)
        normed, _ = self.norm(h, residual)
        return normed, aux


class Target(torch.nn.Module):
    def __init__(self, capture: tuple[int, ...] = (2, 3)) -> None:
        super().__init__()
        self.model = Inner(capture)


class DraftInner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(K * H, H)
        self.norm = Norm()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: Any) -> torch.Tensor:
        return self.norm(self.fc(batch.spec_info.hidden_states))


class Draft(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = DraftInner()


def register(model: torch.nn.Module, specs: list[dict[str, Any]]) -> None:
    """sglang 0.5.23 model_executor/hook_manager.py:11-55, without SGLang."""
    named = dict(model.named_modules())
    for spec in specs:
        mod, fn = spec["hook_factory"].split(":")
        factory = getattr(__import__(mod, fromlist=[fn]), fn)
        hook = factory(spec.get("config") or {})
        if hook is None:
            continue
        for name, module in named.items():
            if any(fnmatch.fnmatch(name, p) for p in spec["target_modules"]):
                module.register_forward_hook(hook)


def batch(probes: list[list[int]], mode: str = "EXTEND", prefix: list[int] | None = None) -> SimpleNamespace:
    ids = torch.tensor([t for p in probes for t in p])
    return SimpleNamespace(
        forward_mode=SimpleNamespace(name=mode), input_ids=ids, positions=torch.arange(len(ids)),
        extend_seq_lens=torch.tensor([len(p) for p in probes]),
        extend_prefix_lens=torch.tensor(prefix or [0] * len(probes)),
        req_pool_indices=torch.arange(len(probes)), spec_info=SimpleNamespace(hidden_states=None))


def serve(target: Target, draft: Draft, probes: list[list[int]], **kw: Any) -> None:
    """One prefill as EAGLEWorkerV2 runs it: the target extend (aux captured), then the draft extend on its aux."""
    b = batch(probes, **kw)
    with torch.no_grad():
        _, aux = target.model(b.input_ids, b.positions, b)
        b.spec_info.hidden_states = torch.cat(aux, dim=-1)
        draft.model(b.input_ids, b.positions, b)


@pytest.fixture
def evidence(tmp_path: Path) -> Path:
    d = tmp_path / "ev"
    d.mkdir(mode=0o700)
    return d


@pytest.fixture
def served(evidence: Path) -> tuple[Target, Draft]:
    target, draft = Target(capture=(0, 2, 3)), Draft()
    specs = live.hook_specs(evidence)
    register(target, specs)
    register(draft, specs)
    serve(target, draft, [[1]])  # each runner's first forward adopts its model (the server's priming request)
    return target, draft


PROBES = [[1, 2, 3, 4, 5], [1, 9, 8], [7, 7, 7, 7]]


def reference(target: Target, probe: list[int]) -> dict[str, torch.Tensor]:
    """The residual stream by hand: boundary b is the stream entering layer b."""
    inner = target.model
    with torch.no_grad():
        h = inner.embed_tokens(torch.tensor(probe))
        out = {EMBEDDING: h.clone()}
        residual = None
        for i, layer in enumerate(inner.layers):
            if residual is None:
                x, residual = layer.input_layernorm(h), h
            else:
                x, residual = layer.input_layernorm(h, residual)
                out[f"layer:{i - 1}"] = residual.clone()
            h = layer.lin(x)
        normed, last = inner.norm(h, residual)
        out[f"layer:{L - 1}"] = last
        out[FINAL_NORM] = normed
    return out


def test_hook_switches_are_exactly_the_forward_hooks_flag(tmp_path: Path) -> None:
    argv, env = live.hook_switches(tmp_path)
    assert argv[0] == "--forward-hooks" and len(argv) == 2 and env == {}
    specs = json.loads(argv[1])
    assert [s["target_modules"] for s in specs] == [["model"]]
    assert {s["hook_factory"] for s in specs} == {live.HOOK_FACTORY}
    assert all(s["config"]["evidence_dir"] == str(tmp_path) for s in specs)
    assert live.has_hook_switches(argv)
    _, cpu_env = live.hook_switches(tmp_path, cpu_stand_ins=True)
    assert cpu_env["SPECPARITY_SGLANG_LIVE_STAND_INS"] == str(tmp_path)
    assert (Path(cpu_env["PYTHONPATH"]) / "sitecustomize.py").is_file()
    assert cpu_env["SGLANG_USE_CPU_ENGINE"] == "1"


def test_idle_hooks_write_nothing_and_install_no_tap(evidence: Path, served: tuple[Target, Draft]) -> None:
    target, draft = served
    serve(target, draft, PROBES)
    assert not (evidence / live_wire.RECORDS).exists()
    assert list(live.hooks_registered(evidence).values()) == [["model", "model"]]  # one per runner
    assert list(live.hooks_ready(evidence).values()) == [["target", "draft"]]
    hooked = [n for n, m in [*target.named_modules(), *draft.named_modules()] if m._forward_hooks]
    assert hooked == ["model", "model"]  # only SGLang's own registration: no tap until the gate arms
    with live.armed(evidence):
        serve(target, draft, PROBES)
    taps = sorted(n for n, m in target.named_modules() if m._forward_hooks)
    assert taps == ["model", *(f"model.layers.{i}.input_layernorm" for i in range(L)), "model.norm"]
    serve(target, draft, PROBES)  # disarmed: the next forward removes them
    assert [n for n, m in target.named_modules() if m._forward_hooks] == ["model"]


def test_armed_capture_is_the_residual_stream_and_the_fc_input(evidence: Path, served: tuple[Target, Draft]) -> None:
    target, draft = served
    fc_inputs: list[torch.Tensor] = []
    draft.model.fc.register_forward_pre_hook(lambda m, a: fc_inputs.append(a[0].clone()))
    with live.armed(evidence):
        serve(target, draft, PROBES)
    result = live.evidence_to_capture(evidence, PROBES)
    assert isinstance(result, CaptureResult) and result.failures == (), result.failures
    assert result.fc is not None and result.atlas is not None
    whole = torch.cat(result.fc.per_sample)
    assert torch.equal(whole, fc_inputs[0])  # exactly what fc saw, split per probe
    assert [t.shape[0] for t in result.fc.per_sample] == [len(p) for p in PROBES]
    for i, probe in enumerate(PROBES):
        ref = reference(target, probe)
        got = result.atlas.per_sample[i]
        assert set(got) == set(ref)
        for k in ref:  # one probe alone against the batch of three: float32 summation order only
            torch.testing.assert_close(got[k], ref[k], rtol=1e-5, atol=1e-5, msg=k)
        # the aux capture at boundaries 0, 2, 3 = embedding, layer:1, layer:2, exactly the atlas's rows
        assert torch.equal(result.fc.aux_per_sample[i], torch.cat([got[EMBEDDING], got["layer:1"], got["layer:2"]], -1))
    names = sorted(os.listdir(evidence / live_wire.RECORDS))
    assert [n.split("-")[1] for n in names] == ["draft", "target"]
    assert not any(n.startswith(".tmp") for n in names)


def test_decode_forwards_and_disarmed_forwards_are_not_written(evidence: Path, served: tuple[Target, Draft]) -> None:
    with live.armed(evidence):
        serve(*served, [[3]], mode="DECODE")
    serve(*served, PROBES)
    assert live.read_records(evidence) == []
    result = live.evidence_to_capture(evidence, PROBES)
    assert result.fc is None and result.failure_kinds()[0] == FC_NOT_CALLED


def test_a_radix_cache_hit_is_named_never_passed(evidence: Path, served: tuple[Target, Draft]) -> None:
    with live.armed(evidence):
        serve(*served, [[2, 3, 4, 5]], prefix=[1])  # the first token came from the cache
    result = live.evidence_to_capture(evidence, [[1, 2, 3, 4, 5]])
    assert result.fc is None
    assert "radix cache" in result.failures[0].message
    # the probe's own prefill never ran whole: the server's state (exit 3 by name), never fc_not_called (exit 1)
    assert result.failures[0].kind == "probe_not_isolated"


def test_a_server_without_the_hooks_is_hooks_missing(evidence: Path) -> None:
    result = live.evidence_to_capture(evidence, PROBES)
    assert result.failure_kinds() == (live.HOOKS_MISSING,)


def test_a_silent_rank_is_rank_missing(evidence: Path, served: tuple[Target, Draft]) -> None:
    with live.armed(evidence):
        serve(*served, PROBES)
    dep = live.deployment_from_server_info(
        {"version": "0.5.23", "tp_size": 2, "model_path": "t", "speculative_draft_model_path": "d",
         "speculative_num_steps": 2, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3},
        draft_config=DRAFT_CONFIG, target_config=TARGET_CONFIG)
    result = live.evidence_to_capture(evidence, PROBES, deployment=dep)
    assert RANK_MISSING in result.failure_kinds()
    assert result.deployment is not None and result.deployment.layout["ranks_reported"] == [0]


def test_an_unsafe_evidence_dir_registers_nothing(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    os.chmod(open_dir, 0o755)
    assert live_hooks.factory({"evidence_dir": str(open_dir)}) is None
    assert live_hooks.factory({}) is None


def test_idle_cost_is_one_stat_per_forward(evidence: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle server's forward runs one hook and one ``stat`` of ARMED, and installs nothing: counted, not timed (the
    time is printed; timing targets live in benchmarks/, bench_live.py)."""
    bare, hooked = Target(), Target()
    hooked.load_state_dict(bare.state_dict())
    register(hooked, live.hook_specs(evidence))
    b = batch([[1, 2, 3]], mode="DECODE")
    hooked.model(b.input_ids, b.positions, b)  # adopted
    stats: list[str] = []
    real_stat = live_hooks.os.stat

    def counted(path: Any, *a: Any, **k: Any) -> Any:
        stats.append(str(path))
        return real_stat(path, *a, **k)

    monkeypatch.setattr(live_hooks.os, "stat", counted)
    with torch.no_grad():
        for _ in range(20):
            hooked.model(b.input_ids, b.positions, b)
    assert stats == [str(evidence / live_wire.ARMED)] * 20  # one stat per forward, nothing else looked at
    assert [n for n, m in hooked.named_modules() if m._forward_hooks] == ["model"]  # no tap while idle
    assert not (evidence / live_wire.RECORDS).exists()
    monkeypatch.undo()

    def per_forward(model: Target) -> float:
        with torch.no_grad():
            t0 = time.perf_counter()
            for _ in range(200):
                model.model(b.input_ids, b.positions, b)
        return (time.perf_counter() - t0) / 200

    base, idle = min(per_forward(bare) for _ in range(3)), min(per_forward(hooked) for _ in range(3))
    print(f"\nper forward: bare {base * 1e6:.1f} us, idle hooks {idle * 1e6:.1f} us (reported only)")


TARGET_CONFIG = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 8, "hidden_size": 64,
                 "vocab_size": 512, "torch_dtype": "float32"}
DRAFT_CONFIG = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64, "draft_vocab_size": 256,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5]}}


def test_deployment_from_server_info_shows_the_servers_rewrite() -> None:
    info = {"version": "0.5.23", "model_path": "fixtures/default/target", "device": "cpu", "dtype": "float32",
            "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "fixtures/default/draft",
            "speculative_num_steps": 1, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 2,
            "tp_size": 1, "launch_command": "--model-path fixtures/default/target --speculative-algo EAGLE3 "
                                            "--speculative-num-steps=1 --speculative-num-draft 16"}
    dep = live.deployment_from_server_info(info, draft_config=DRAFT_CONFIG, target_config=TARGET_CONFIG)
    assert dep.requested_spec == SpecSettings(1, None, 16)
    assert dep.resolved_spec == SpecSettings(1, 1, 2)
    assert dep.spec_warnings and "16 to 2" in dep.spec_warnings[0] and live.REWRITE_RULE in dep.spec_warnings[0]
    assert dep.draft_config_ids == (1, 3, 5) and dep.layers_to_capture == (2, 4, 6)
    assert dep.served_sources == ("layer:1", "layer:3", "layer:5")
    assert dep.fc_in_features == 192 and dep.fc_applied and dep.engine_version == "0.5.23"
    assert any("launch_command" in n for n in dep.notes)
    seed = {**DRAFT_CONFIG, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 1, 3]}}
    dep = live.deployment_from_server_info(info, draft_config=seed, target_config=TARGET_CONFIG)
    assert dep.served_sources == (EMBEDDING, "layer:1", "layer:3")
    none = live.deployment_from_server_info(info, draft_config={"hidden_size": 64}, target_config=TARGET_CONFIG)
    assert none.draft_config_ids is None and none.ids_fallback_reason == "draft config has no eagle_config"
    assert none.layers_to_capture == (2, 4, 5)


def test_cpu_refusals_are_named_by_call() -> None:
    log = ["...", "NotImplementedError: sgl_kernel.assign_req_to_token_pool_cpu was called, but only ..."]
    failure = live.server_failure("the server exited with code 1", log)
    assert failure.kind == "needs_hardware" and "mem_cache/allocation.py:746" in failure.message
    assert "0.5.23" in failure.message
    plain = live.server_failure("the server exited", ["ValueError: bad flag"])
    assert plain.kind == "sglang_exception" and "bad flag" in plain.message
    # no exception in the log (a slow start past --timeout): never blamed on the deployment (exit 3, as vLLM's)
    slow = live.server_failure("/health did not answer within 8 s", ["INFO: loading weights", "INFO: still loading"])
    assert slow.kind == "server_failed" and "no exception in the server's log" in slow.message


def test_stand_ins_site_directory_does_nothing_without_its_switch(tmp_path: Path) -> None:
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "SPECPARITY_SGLANG_LIVE_STAND_INS"}
    env["PYTHONPATH"] = str(live.SITE_DIR)
    out = subprocess.run([sys.executable, "-c", "import sys; print('sgl_kernel' in sys.modules, "
                          "any('kernel_stub' in p for p in sys.path))"], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["False", "False"], out.stderr
    ev = tmp_path / "ev"
    ev.mkdir(mode=0o700)
    env["SPECPARITY_SGLANG_LIVE_STAND_INS"] = str(ev)
    out = subprocess.run([sys.executable, "-c", "import sys; print(any('kernel_stub' in p for p in sys.path))"],
                         env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["True"], out.stderr
    names, calls = live.server_stand_ins(ev)
    assert names and names[0].startswith("sgl_kernel import stand-in") and calls is None


def test_a_body_replayed_in_a_graph_gives_the_fc_input_from_the_batch_and_names_the_missing_atlas(
        evidence: Path, served: tuple[Target, Draft]) -> None:
    """sglang 0.5.23's breakable prefill graph (on by default on CUDA) swaps each runner's inner forward for a
    replay: the end hook still runs, the taps inside do not."""
    target, draft = served
    fc_inputs: list[torch.Tensor] = []
    draft.model.fc.register_forward_pre_hook(lambda m, a: fc_inputs.append(a[0].clone()))
    with live.armed(evidence):
        serve(target, draft, PROBES)  # eager: the reference records
    eager = live.evidence_to_capture(evidence, PROBES)
    for old in (evidence / live_wire.RECORDS).iterdir():
        old.unlink()
    for inner in (target.model, draft.model):
        body = inner.forward
        # an instance attribute, as prefill_cuda_graph_runner.py:2213-2214 sets it: the body runs with the taps off
        inner.forward = lambda *a, _body=body: _run_untapped(_body, *a)  # type: ignore[method-assign]
    with live.armed(evidence):
        serve(target, draft, PROBES)
    replayed = live.evidence_to_capture(evidence, PROBES)
    assert replayed.fc is not None and eager.fc is not None
    for got, want in zip(replayed.fc.per_sample, eager.fc.per_sample, strict=True):
        assert torch.equal(got, want)
    assert replayed.atlas is None
    # the hooks could not see the stream: the machine's setting (exit 3), never a width finding
    assert [f.kind for f in replayed.failures] == ["hooks_missing"]
    assert "cuda_graph_config.py:119-123" in replayed.failures[0].message


def _run_untapped(body: Any, *args: Any) -> Any:
    """Run ``body`` with every forward hook inside it silenced (a graph replay runs no Python hooks)."""
    from torch.nn.modules import module as nn_module

    saved = nn_module.Module.__call__
    nn_module.Module.__call__ = lambda self, *a, **k: self.forward(*a, **k)  # type: ignore[method-assign]
    try:
        return body(*args)
    finally:
        nn_module.Module.__call__ = saved  # type: ignore[method-assign]


def test_a_commands_own_forward_hooks_are_kept_beside_the_gates(tmp_path: Path) -> None:
    """SGLang keeps the last --forward-hooks; the one the gate appends carries the user's hooks too, never drops them."""
    from specparity.deploy_command import read_launch
    from specparity.errors import InputError
    from specparity.serving.sglang.engine import SglangEngine

    mine = [{"name": "mine", "target_modules": ["model.norm"], "hook_factory": "my.hooks:factory", "config": {}}]
    text = (f"python -m sglang.launch_server --model-path /m --device cpu --forward-hooks '{json.dumps(mine)}'")
    flags, _, notes = SglangEngine().live_switches(read_launch(text, source="--launch", cwd=tmp_path),
                                                   evidence_dir=tmp_path)
    hooks = json.loads(flags[flags.index("--forward-hooks") + 1])
    assert hooks[0] == mine[0] and any(live.HOOK_FACTORY in h["hook_factory"] for h in hooks[1:])
    assert any("own --forward-hooks (1 hook(s)) kept" in n for n in notes)
    plain, _, _ = SglangEngine().live_switches(read_launch("python -m sglang.launch_server --model-path /m --device cpu",
                                                           source="--launch", cwd=tmp_path), evidence_dir=tmp_path)
    assert len(json.loads(plain[plain.index("--forward-hooks") + 1])) == len(live.hook_specs(tmp_path))
    with pytest.raises(InputError, match="JSON list"):
        SglangEngine().live_switches(read_launch("python -m sglang.launch_server --model-path /m --forward-hooks '{}'",
                                                 source="--launch", cwd=tmp_path), evidence_dir=tmp_path)


@pytest.mark.parametrize("node", ["nvidia0", "kfd", "davinci0", "accel/accel0"])
def test_a_host_with_any_accelerator_is_no_cpu_server(tmp_path: Path, node: str) -> None:
    """A ROCm, Ascend or Gaudi host is not given the CPU stand-ins because it lacks /dev/nvidia*; --device decides."""
    from specparity.serving.sglang.engine import _cpu_server

    assert _cpu_server([], dev=tmp_path)  # no accelerator node: a CPU server
    (tmp_path / node).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / node).touch()
    assert not _cpu_server([], dev=tmp_path)
    assert _cpu_server(["--device", "cpu"], dev=tmp_path) and not _cpu_server(["--device=cuda"], dev=tmp_path)


def test_the_hooks_disarm_themselves_when_the_gate_is_gone(evidence: Path, served: tuple[Target, Draft]) -> None:
    """ARMED is a lease: a gate killed with SIGKILL (its pid gone) leaves a server that records nothing from its next
    forward on, removes the file and says why; an expired deadline does the same."""
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    flag = evidence / live_wire.ARMED
    lease = json.loads(live_wire.lease_text(lease_s=60))
    flag.write_text(json.dumps({**lease, "owner_pid": dead.pid}))
    serve(*served, PROBES)
    assert not flag.exists() and live.read_records(evidence) == []
    assert [n for n, m in served[0].named_modules() if m._forward_hooks] == ["model"]  # no tap left installed
    assert any(f"pid {dead.pid}" in why and "gone" in why for why in live.lease_ends(evidence))
    flag.write_text(json.dumps({**lease, "deadline": time.time() - 1}))
    serve(*served, PROBES)
    assert not flag.exists() and live.read_records(evidence) == []
    assert any("lease expired" in why for why in live.lease_ends(evidence))
    with live.armed(evidence):  # the gate's own lease: this process, alive, within its deadline: recorded
        serve(*served, PROBES)
    assert live.read_records(evidence)


def test_other_requests_in_the_probe_run_are_ignored_and_counted(evidence: Path, served: tuple[Target, Draft]) -> None:
    """Each probe is matched by its own token ids; another client's prefill in the same armed window is not taken for
    it, and the report counts what was ignored."""
    dep = live.deployment_from_server_info(
        {"version": "0.5.23", "tp_size": 1, "model_path": "t", "speculative_draft_model_path": "d",
         "speculative_num_steps": 2, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3},
        draft_config=DRAFT_CONFIG, target_config=TARGET_CONFIG)
    with live.armed(evidence):
        serve(*served, [[9, 9, 9, 9, 9, 9], PROBES[0], [8, 7]])  # two other clients' prompts batched with probe 0
    result = live.evidence_to_capture(evidence, PROBES[:1], deployment=dep)
    assert result.fc is not None and [t.shape[0] for t in result.fc.per_sample] == [len(PROBES[0])]
    assert result.deployment is not None
    assert any(n.startswith("2 prefill segment(s) of other requests") for n in result.deployment.notes)


def test_a_directory_named_by_a_server_is_used_only_with_launch_flags_marker(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The attached gate writes and deletes in the directory the server's /server_info names only if launch-flags
    made it for this user (0700, its marker, the token kept outside it); else exit 2 and no file touched."""
    from specparity.errors import InputError

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    class Client:
        def __init__(self, where: Path) -> None:
            self.where = where

        def get_json(self, path: str, **kw: Any) -> dict[str, Any]:
            return {"forward_hooks": live.hook_specs(self.where)}

    other = tmp_path / "someone-elses"
    other.mkdir(mode=0o700)
    (other / "records").mkdir()
    (other / "records" / "keep.safetensors").write_text("x")
    before = sorted(p.name for p in other.rglob("*"))
    with pytest.raises(InputError, match="no marker") as e:
        live.server_hooks_dir(Client(other))
    assert e.value.field == "evidence_dir" and "No file was touched" in str(e.value)
    assert sorted(p.name for p in other.rglob("*")) == before
    made = tmp_path / "mine"
    token = live.mark_evidence_dir(made)
    assert live.server_hooks_dir(Client(made)) == made and len(token) == 32
    (made / live.MARKER).write_text("forged")
    with pytest.raises(InputError, match="not the one launch-flags printed"):
        live.server_hooks_dir(Client(made))
