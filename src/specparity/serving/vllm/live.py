"""vLLM's part of a live check: what a server needs added to its command, the tap's RPC over HTTP, and its counters.

The server is the user's own (``vllm serve ...`` / ``python -m vllm.entrypoints.openai.api_server ...``): launched
by the gate (``serving/live/capture.py``) or already running (``--server URL``). Everything goes through interfaces vLLM
supports, cited from vllm 0.32:

- the hook switches (:func:`hook_switches`): ``--worker-extension-cls`` with the tap's RPC methods
  (``v1/worker/worker_base.py:296-320`` mixes the class into every worker), or, where the command already names an
  extension class of its own, the tap's ``vllm.general_plugins`` entry point in server mode (the entry point must
  then be installed in the server's environment); ``VLLM_SERVER_DEV_MODE=1`` for ``POST /collective_rpc``,
  ``GET /server_info`` and ``POST /reset_prefix_cache`` (``entrypoints/serve/__init__.py:45-75``), on loopback
  only unless the user allows it;
- the evidence (:func:`live_capture`): ``POST /collective_rpc`` calls the tap in every rank through vLLM's own
  executor (``entrypoints/serve/dev/rpc/api_router.py:23-58`` -> ``AsyncLLM.collective_rpc``,
  ``v1/engine/async_llm.py:1205``), so a rank on another node reports like a local one; probes go as token ids to
  ``/v1/completions``, greedy, with the prefix cache reset before each so the prefill's fc call holds the whole
  probe;
- the outcome: each probe prompt's own spec-decode counts where the server returns them
  (``--per-request-spec-decode-metrics``: the response's ``metrics.speculative_decoding``, ``v1/metrics/stats.py``
  ``RequestSpecDecodeMetrics.to_dict``, ``entrypoints/openai/completion/serving.py:620-636``), so no other client's
  request can move the figure; else the spec-decode counters of ``/metrics`` (``vllm:spec_decode_num_drafts_total``,
  ``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total``, ``..._num_accepted_tokens_per_pos_total``;
  ``v1/spec_decode/metrics.py``) as deltas over the probe run, with ``vllm:request_success_total``
  (``v1/metrics/loggers.py:807-815``) telling how many requests of other clients finished in the same window.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from specparity.serving.live.metrics import Scrape
from specparity.serving.live.server import ServerClient, ServerError
from specparity.serving.results import (
    BAD_DEPLOYMENT,
    RANK_MISSING,
    CaptureResult,
    ResolvedDeployment,
    ServingFailure,
)
from specparity.serving.vllm import tap
from specparity.serving.vllm.tap_wire import ARM, DESCRIBE, DISARM, RPC

if TYPE_CHECKING:
    from specparity.compare.reduced import Reduction

DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
EXTENSION_FLAG = "--worker-extension-cls"
GENERATE_TOKENS = 16
COUNTERS = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
            "spec_decode_num_accepted_tokens_per_pos", "request_success")
PER_REQUEST_FLAG = "--per-request-spec-decode-metrics"  # vllm 0.32 engine/arg_utils.py:1657
# the flags and env a server needs so that the gate can capture from it (specparity launch-flags prints them)
LAUNCH_FLAGS = (EXTENSION_FLAG, tap.EXTENSION)
LAUNCH_ENV = {DEV_MODE_ENV: "1"}


def hook_switches(args: Sequence[str], *, per_request: bool = False) -> tuple[list[str], dict[str, str], list[str]]:
    """(flags to append, env to add, notes): what the gate adds to the user's ``args`` so the tap can answer, and with
    ``per_request`` (the server's release has :data:`PER_REQUEST_FLAG`) each request's own spec-decode counts, where
    the command serves a drafter and sets no level of its own (vLLM refuses the flag without speculative decoding,
    ``config/vllm.py:1660-1666``)."""
    notes = []
    if any(a == EXTENSION_FLAG or a.startswith(EXTENSION_FLAG + "=") for a in args):
        # vLLM takes one extension class; the user's stays, the tap comes through its entry point instead
        flags: list[str] = []
        env = {**LAUNCH_ENV, tap.ENV_ON: tap.SERVER_MODE}
        notes.append(f"the command names its own {EXTENSION_FLAG}; the tap comes through specparity's "
                     "vllm.general_plugins entry point, which must be installed in the server's environment")
    else:
        flags, env = list(LAUNCH_FLAGS), dict(LAUNCH_ENV)
    speculative = any(a.split("=", 1)[0] in ("--speculative-config", "--speculative_config", "-sc") for a in args)
    own = any(a.split("=", 1)[0] in (PER_REQUEST_FLAG, "--per_request_spec_decode_metrics") for a in args)
    if per_request and speculative and not own:
        flags += [PER_REQUEST_FLAG, "summary"]
    return flags, env, notes


def release_has_flag(program: Sequence[str], flag: str) -> bool:
    """Whether the vLLM that ``program`` starts accepts ``flag``, read from its own ``engine/arg_utils.py`` (found,
    never imported, by the interpreter that runs it: ``vllm serve``'s console script names it on its first line).
    False whenever that cannot be told: the switch is then not added, and the counters fall back to the global ones."""
    import shutil
    import subprocess
    from pathlib import Path

    head = shutil.which(program[0]) or program[0]
    python = head
    try:
        if not Path(head).name.startswith("python"):
            first = Path(head).read_bytes()[:300].split(b"\n", 1)[0].decode(errors="replace")
            python = first.removeprefix("#!").strip().split()[0] if first.startswith("#!") else ""
        if not python:
            return False
        found = subprocess.run([python, "-c", "import importlib.util as u; s = u.find_spec('vllm'); "
                                "print(s.submodule_search_locations[0] if s else '')"],
                               capture_output=True, text=True, timeout=30, check=False).stdout.strip()
        return bool(found) and flag in (Path(found) / "engine" / "arg_utils.py").read_text(errors="replace")
    except (OSError, subprocess.SubprocessError, IndexError):
        return False


class HttpRpc:
    """``collective_rpc`` over the server's dev-mode route, shaped like ``LLM.collective_rpc`` for
    :class:`~specparity.serving.vllm.ranks.RankEvidence`: the tap's drain answers with base64 text there."""

    def __init__(self, client: ServerClient, *, timeout_s: float = 120.0) -> None:
        self.client, self.timeout_s = client, timeout_s

    def collective_rpc(self, method: str, kwargs: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        kw = dict(kwargs or {})
        if method == RPC:
            kw.setdefault("encoding", "base64")
        try:
            reply = self.client.post_json("/collective_rpc", {"method": method, "kwargs": kw,
                                                              "timeout": self.timeout_s},
                                          timeout_s=self.timeout_s + 10)
        except ServerError as e:
            if e.status == 404:
                raise HooksMissing(f"{self.client.url} has no /collective_rpc route: the server runs without "
                                   f"{DEV_MODE_ENV}=1") from None
            if e.status is not None and method in str(e):
                raise HooksMissing(f"the server's workers have no {method} method: it was started without "
                                   f"{' '.join(LAUNCH_FLAGS)}") from None
            raise
        results = (reply or {}).get("results")
        if not isinstance(results, list):
            raise ServerError(f"/collective_rpc answered {str(reply)[:200]!r}, not a list of results")
        out = []
        for r in results:
            if not isinstance(r, dict):
                raise HooksMissing(f"a worker answered {method} with {str(r)[:200]!r}")
            if method == RPC or "calls" in r:
                r = {**r, "calls": [base64.b64decode(c) for c in r.get("calls") or ()]}
            out.append(r)
        return out


class HooksMissing(RuntimeError):
    """The server cannot answer the tap: started without the hook switches (the capture level exits 3 by name)."""


def model_name(client: ServerClient) -> str:
    """The served model's name, as ``/v1/models`` lists it (``--served-model-name`` or the model path)."""
    data = client.get_json("/v1/models").get("data") or []
    if not data:
        raise ServerError(f"{client.url}/v1/models lists no model")
    return str(data[0]["id"])


def counters(client: ServerClient) -> dict[str, Any]:
    """vLLM's spec-decode counters now, summed over its series: scalars, and the per-position list."""
    s = Scrape.parse(client.text("/metrics"))
    out: dict[str, Any] = {}
    for name in COUNTERS:
        full = f"vllm:{name}_total"
        if name.endswith("per_pos"):
            by_pos = s.by_label(full, "position")
            out[name] = [int(by_pos[k]) for k in sorted(by_pos, key=int)]
        else:
            v = s.total(full)
            out[name] = None if v is None else int(v)
    return out


def describe(rpc: HttpRpc) -> tuple[ResolvedDeployment | None, list[dict[str, Any]]]:
    """The deployment as the server's own workers resolved it (the first rank's), and every rank's reply."""
    replies = rpc.collective_rpc(DESCRIBE)
    deps = [r["deployment"] for r in replies if isinstance(r.get("deployment"), dict)]
    return (ResolvedDeployment.from_dict(deps[0]) if deps else None), replies


def _assistant_start_run(client: ServerClient, body: dict[str, Any], probes: Sequence[Sequence[int]],
                         prompt_lengths: Sequence[int]) -> tuple[dict[str, Any], int, list[Any]]:
    """The server's own loop on the probes' prompts, up to the assistant's first token: the target then writes its
    own answer, the text the drafter was trained on (as serving/vllm/worker.py's capture does). The counters it
    moved, the requests sent, and each request's own spec-decode metrics."""
    from specparity.serving.vllm.evidence import counter_delta

    start = counters(client)
    per_request = []
    for ids, n in zip(probes, prompt_lengths, strict=True):
        _reset_prefix_cache(client)
        answer = client.post_json("/v1/completions", {**body, "prompt": [int(t) for t in ids[: max(1, int(n))]]})
        per_request.append(_spec_metrics(answer))
    return counter_delta(counters(client), start), len(per_request), per_request


def live_capture(client: ServerClient, *, probes: Sequence[Sequence[int]],
                 prompt_lengths: Sequence[int] | None, generate_tokens: int = GENERATE_TOKENS,
                 progress: Callable[[int, int], None] | None = None, atlas: bool = True,
                 reduction: Reduction | None = None) -> CaptureResult:
    """The probes through the running server with the tap armed: fc input per probe and rank, the atlas, the
    layout, and the acceptance the server's own counters moved by. Every problem is a typed failure.
    ``reduction`` (compare/reduced.py): the workers reduce the atlas where it is (serving/vllm/tap_reduce.py),
    the gate sending each probe's recorded fc input before it; without it the full atlas comes back."""
    from specparity.serving.vllm.evidence import assemble_capture, counter_delta
    from specparity.serving.vllm.ranks import RankEvidence

    rpc = HttpRpc(client)
    total = len(probes) + 2
    t0 = time.perf_counter()
    dep, _ = describe(rpc)
    if dep is None:
        return CaptureResult(None, None, None, (ServingFailure(RANK_MISSING, "no rank of the server described "
                                                               "its deployment through the tap"),))
    if progress:
        progress(1, total)
    model = model_name(client)
    evidence = RankEvidence(rpc)
    # the lease (serving/vllm/tap.py): a tap not drained within the gate's own request timeout disarms itself, so a
    # gate killed while armed leaves the workers disarmed and holding nothing within it
    lease = min(max(float(getattr(client, "timeout_s", 0) or 0) + 30.0, tap.LEASE_S), tap.MAX_LEASE_S)
    evidence.identity = {int(r["rank"]): {k: v for k, v in r.items() if k != "calls"}
                         for r in rpc.collective_rpc(ARM, {"atlas": "" if not atlas else
                                                               tap.REDUCED if reduction is not None else "1",
                                                               "lease_s": f"{lease:g}"})}
    before = counters(client)
    outputs: list[list[int]] = []
    answers: list[Any] = []
    n_spec = int(dep.resolved_spec.num_steps or 0)
    body = {"model": model, "max_tokens": generate_tokens, "temperature": 0.0, "ignore_eos": True}
    failures: list[ServingFailure] = []
    try:
        for i, ids in enumerate(probes):
            _reset_prefix_cache(client)
            if reduction is not None and atlas:
                evidence.expect(reduction.recorded[i], expected=list(reduction.expected), rtol=reduction.rtol,
                                ids=list(ids))
            try:
                out = client.post_json("/v1/completions", {**body, "prompt": [int(t) for t in ids],
                                                           "return_token_ids": True})
            except ServerError as e:
                if e.status == 400:  # vLLM refused the probe itself (e.g. longer than its max_model_len)
                    failures.append(ServingFailure(BAD_DEPLOYMENT, f"vLLM refused probe {i}: {e}", sample=i))
                    evidence.end_probe()
                    continue
                raise
            choice = (out.get("choices") or [{}])[0]
            outputs.append([int(t) for t in choice.get("token_ids") or []])
            answers.append(out)
            evidence.end_probe()
            if evidence.disarmed:  # a tap disarmed itself (overflow, lease): the rest would record nothing
                break
            if progress:
                progress(2 + i, total)
    finally:
        rpc.collective_rpc(DISARM)
    counted, prompts = counter_delta(counters(client), before), "after_probe"
    sent, per_request = len(outputs), [_spec_metrics(a) for a in answers]
    if prompt_lengths is not None and len(prompt_lengths) == len(probes):
        counted, sent, per_request = _assistant_start_run(client, body, probes, prompt_lengths)
        prompts = "assistant_start"
    generate_s = time.perf_counter() - t0
    layout = dict(dep.layout)
    moved = sum(len(b) for calls in evidence.per_probe.values() for probe in calls for b in probe)
    loop = {"engine": "vllm", "tensor_parallel_size": int(layout.get("tensor_parallel_size") or 1),
            "num_speculative_tokens": n_spec, "generate_tokens": generate_tokens, "counters": counted,
            "loop_prompts": prompts, "outputs": outputs, "generate_s": generate_s, "source": "server_metrics",
            "evidence_bytes": moved, **acceptance_window(counted, per_request, sent=sent)}
    return assemble_capture(dep, evidence, probes, atlas=atlas, loop=loop, failures=failures, shared=True)


def _spec_metrics(answer: Any) -> dict[str, Any] | None:
    """One answer's own spec-decode counts (``metrics.speculative_decoding``), or None where the server gives none."""
    spec = ((answer.get("metrics") or {}).get("speculative_decoding") if isinstance(answer, dict) else None)
    return spec if isinstance(spec, dict) and isinstance(spec.get("acceptance_histogram"), list) else None


def acceptance_window(counted: Mapping[str, Any], per_request: Sequence[Mapping[str, Any] | None], *,
                      sent: int) -> dict[str, Any]:
    """The counting window's acceptance source: every request's own counts when the server returned them for each
    (``counters`` rebuilt from their histograms: position ``k`` is accepted in the verify steps that accepted more
    than ``k`` draft tokens, as vLLM's per-position counter counts it, ``v1/spec_decode/metrics.py``), else the
    server's global counters, with how many requests of other clients finished in the window (``request_success``'s
    delta less the gate's own ``sent``)."""
    if per_request and all(r is not None for r in per_request):
        width = max(len(r["acceptance_histogram"]) for r in per_request if r is not None)
        hist = [sum(int((r or {})["acceptance_histogram"][j]) if j < len((r or {})["acceptance_histogram"]) else 0
                    for r in per_request) for j in range(width)]
        per_pos = [sum(hist[j] for j in range(k + 1, width)) for k in range(width - 1)]
        own = {"spec_decode_num_drafts": sum(hist), "spec_decode_num_accepted_tokens_per_pos": per_pos,
               "spec_decode_num_accepted_tokens": sum(per_pos),
               "spec_decode_num_draft_tokens": sum(int((r or {}).get("num_draft_tokens") or 0) for r in per_request)}
        return {"counters": own, "server_counters": dict(counted), "acceptance_source": "per_request",
                "other_requests": None}
    finished = counted.get("request_success")
    return {"acceptance_source": "server_counters",
            "other_requests": None if finished is None else max(0, int(finished) - sent)}


def _reset_prefix_cache(client: ServerClient) -> None:
    """A probe whose prefix another probe shares would otherwise prefill only its suffix (vLLM's prefix cache is on
    by default in a server): ``POST /reset_prefix_cache`` (dev mode, ``entrypoints/serve/dev/cache/api_router.py:20``)."""
    client.post("/reset_prefix_cache")


def resolve_from_server(client: ServerClient, *, python: str | None, timeout_s: float,
                        hint: str) -> ResolvedDeployment | ServingFailure:
    """The static level from what a running server reports: its own workers' ``VllmConfig`` through the tap
    (:data:`~specparity.serving.vllm.tap_wire.DESCRIBE`), else dev mode's ``GET /server_info?config_format=json``
    (``entrypoints/serve/dev/server_info/api_router.py:43-59``: the whole resolved ``VllmConfig``), whose model,
    draft and speculative settings vLLM's own code then resolves here (``serving/vllm/client.py``), reading the draft
    config at the path the server names."""
    from pathlib import Path

    from specparity.serving.results import HOOKS_MISSING, SERVER_UNREACHABLE
    from specparity.serving.vllm.client import resolve_deployment

    try:
        dep, _ = describe(HttpRpc(client))
        if dep is not None:
            return dep
    except HooksMissing:
        pass
    except ServerError as e:
        return ServingFailure(SERVER_UNREACHABLE, str(e))
    try:
        info = client.get_json("/server_info", params={"config_format": "json"})
    except ServerError as e:
        if e.status == 404:
            return ServingFailure(HOOKS_MISSING, f"{client.url} answers neither the tap's RPC nor /server_info: it "
                                  f"runs without {DEV_MODE_ENV}=1, so nothing says what it resolved; {hint}")
        return ServingFailure(SERVER_UNREACHABLE, str(e))
    cfg = info.get("vllm_config") if isinstance(info, dict) else None
    if not isinstance(cfg, dict):
        return ServingFailure(SERVER_UNREACHABLE, f"{client.url}/server_info has no vllm_config in JSON")
    mc, sc, pc = cfg.get("model_config") or {}, cfg.get("speculative_config") or {}, cfg.get("parallel_config") or {}
    target, draft = str(mc.get("model") or ""), str(sc.get("model") or "")
    unreadable = [p for p in (target, draft) if not (Path(p) / "config.json").is_file()]
    if unreadable:
        return ServingFailure(SERVER_UNREACHABLE, f"the server names {', '.join(unreadable)}, which is not a model "
                              "directory on this host; attach the gate where the server's files are, or start the "
                              f"server with the hook switches ({hint})")
    args = {"speculative_config": {"method": sc.get("method"), "model": draft,
                                   "num_speculative_tokens": sc.get("num_speculative_tokens")},
            "tensor_parallel_size": int(pc.get("tensor_parallel_size") or 1),
            "pipeline_parallel_size": int(pc.get("pipeline_parallel_size") or 1),
            "dtype": str(mc.get("dtype") or "auto").removeprefix("torch."),
            "max_model_len": mc.get("max_model_len"), "quantization": mc.get("quantization")}
    here = resolve_deployment(target, draft, engine_args={k: v for k, v in args.items() if v is not None},
                              device="cpu", timeout_s=timeout_s, python=python)
    return resolved_here(here, _server_version(client), client.url)


def _server_version(client: ServerClient) -> str | None:
    """The server's own vLLM release (``GET /version``, vllm 0.32 ``entrypoints/serve/instrumentator/basic.py:53``), or None."""
    try:
        version = client.get_json("/version").get("version")
    except (ServerError, AttributeError):
        return None
    return str(version) if version else None


def resolved_here(dep: ResolvedDeployment | ServingFailure, server_version: str | None,
                  url: str) -> ResolvedDeployment | ServingFailure:
    """A static level resolved on the gate's host from what the server's ``/server_info`` names (no tap in the
    server): the report says so and with which release, and warns where the server runs another release."""
    from dataclasses import replace

    if isinstance(dep, ServingFailure):
        return dep
    where = (f"resolved on the gate's host by vllm {dep.engine_version} from what {url}/server_info names (the server "
             "runs without the tap, so its own workers could not describe it)")
    notes: tuple[tuple[str, str, str, str], ...] = (("resolution_note", "info", where, "serving/vllm/live.py"),)
    if server_version is not None and server_version != dep.engine_version:
        notes += (("resolution_note", "warning",
                   f"the server runs vllm {server_version}, the gate resolved with vllm {dep.engine_version}: another "
                   "release may resolve the same deployment otherwise; give --python with the server's own interpreter, "
                   "or start the server with the tap (specparity launch-flags --engine vllm)", "GET /version"),)
    return replace(dep, notes=(*dep.notes, where), adapter_notes=(*dep.adapter_notes, *notes))
