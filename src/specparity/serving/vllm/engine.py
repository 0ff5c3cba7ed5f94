"""vLLM behind :class:`specparity.serving.engine.Engine`: resolve, capture (with the acceptance vLLM's own serving
loop counted), its id rules (``specparity.idrules.vllm``), explain and the supported releases."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specparity.serving.engine_base import EngineBase
from specparity.serving.results import IdReading

if TYPE_CHECKING:
    from specparity.compare.fix import DraftConfigFix
    from specparity.compare.reduced import Reduction
    from specparity.deploy_command import LaunchCommand
    from specparity.serving.live.server import ServerClient
    from specparity.serving.results import (
        CaptureResult,
        Explanation,
        OutcomeRequest,
        Progress,
        ResolvedDeployment,
        ServingFailure,
    )


class VllmEngine(EngineBase):
    """vLLM's real engine: the parent side in ``client.py``, the child in ``worker.py``, the tap in ``tap.py``."""

    name, label = "vllm", "vLLM"
    reduces_evidence = True  # the tap reduces the atlas in the workers when the gate sends a Reduction
    # vLLM's EAGLE proposer drafts one chain: num_speculative_tokens is the chain length
    spec_keys = ("num_speculative_tokens", None, None)
    health_path = "/health"

    def resolve(self, target: str | Path, draft: str | Path, *, args: Mapping[str, object], device: str,
                timeout_s: float, python: str | None) -> ResolvedDeployment | ServingFailure:
        from specparity.serving.vllm.client import resolve_deployment

        return resolve_deployment(target, draft, engine_args=args, device=device, timeout_s=timeout_s, python=python)

    def capture(self, target: str | Path, draft: str | Path, *, probes: Sequence[Sequence[int]],
                args: Mapping[str, object], device: str, timeout_s: float, python: str | None,
                progress: Progress | None, outcome: OutcomeRequest | None = None,
                reduction: Reduction | None = None) -> CaptureResult:
        from specparity.serving.vllm.client import capture_deployment

        # the outcome: vLLM's real loop counts its own acceptance, on the probes' prompts where every probe says
        # where its assistant turn starts; otherwise on what it generates after each probe (loop "prompts" says)
        lengths = outcome.prompt_lengths if outcome is not None else ()
        known = [n for n in lengths if n is not None]
        return capture_deployment(target, draft, probes=probes, engine_args=args, device=device, atlas=True,
                                  timeout_s=timeout_s, python=python, progress=progress,
                                  loop_prompt_lengths=known if lengths and len(known) == len(lengths) else None,
                                  reduction=reduction)

    def reading(self, draft_config: Mapping[str, Any], *, num_layers: int, architecture: str,
                version: str) -> IdReading | None:
        from specparity.idrules.vllm import read_ids

        try:
            r = read_ids(draft_config, num_layers=num_layers, version=version)
        except ValueError:
            return None
        return IdReading(r.ids, r.key, r.sources,
                         "vLLM reads id k as hidden_states[k], no +1 (vllm/model_executor/models/interfaces.py:"
                         "1601-1611, models/llama.py:428-441)")

    def layout_fix(self, sources: Sequence[str], draft_config: Mapping[str, Any], *, num_layers: int,
                   architecture: str, version: str, draft_path: str) -> DraftConfigFix:
        from specparity.compare.fix import DraftConfigFix, dflash_layout_fix
        from specparity.idrules.vllm import IDS_KEY, fix_ops

        file = f"{draft_path.rstrip('/')}/config.json"
        eagle = draft_config.get("eagle_config")
        if not (IDS_KEY in draft_config or (isinstance(eagle, Mapping) and IDS_KEY in eagle)):
            # a DFlash drafter's own key, where no EAGLE-3 key (which vLLM's reader takes first) is there
            dflash = dflash_layout_fix(sources, draft_config, num_layers=num_layers, file=file,
                                       engine_rule="vLLM 0.32 adds 1 to DFlash ids, v1/worker/gpu_model_runner.py:"
                                                   "5270-5277")
            if dflash is not None:
                return dflash
        try:
            ids, key, ops = fix_ops(sources, draft_config, num_layers=num_layers, version=version)
        except ValueError as e:
            return DraftConfigFix(summary=f"no draft config serves {', '.join(sources)} on vllm {version}: {e}",
                                  file=file, ids=None)
        summary = (f"{file} already sets {key} = {ids}" if not ops
                   else f"set {key} = {ids} in {file} (vLLM reads id k as hidden_states[k])")
        return DraftConfigFix(summary=summary, file=file, ids=tuple(ids), json_patch=tuple(ops))

    def explain(self, target: Path, draft: Path, *, args: Mapping[str, object], python: str | None,
                timeout_s: float) -> Explanation:
        from specparity.serving.vllm.explain import explain_vllm

        return explain_vllm(target, draft, engine_args=args, python=python, timeout_s=timeout_s)

    def versions(self) -> list[dict[str, Any]]:
        from specparity.serving.vllm.versions import versions_rows

        return versions_rows()

    def versions_lines(self) -> list[str]:
        from specparity.serving.vllm.families import ENVS

        lines = [f"{'vLLM range':<18} {'family':<7} {'adapter folder':<26} {'reads ids':<17} {'on CPU':<24} tested with"]
        for v in self.versions():
            levels = ", ".join(v["levels_on_cpu"])
            tested = "; ".join(f"{e} ({ENVS[e].dist} {r}: {'capture' if ENVS[e].cpu_capture else 'static'})"
                               for e, r in zip(v["tested_with"], v["tested_versions"], strict=True))
            lines.append(f"{v['range']:<18} {v['family']:<7} {v['folder']:<26} {v['reader']:<17} {levels:<24} "
                         f"{tested or v['untested_why']}")
        return lines

    def live_switches(self, command: LaunchCommand, *, evidence_dir: Path,
                      program: Sequence[str] = ()) -> tuple[list[str], dict[str, str], list[str]]:
        """The tap's switches, and per-request spec-decode counts where the server's own vLLM has them
        (``program``: the words that will start it; ``live.release_has_flag``)."""
        from specparity.serving.vllm.live import PER_REQUEST_FLAG, hook_switches, release_has_flag

        return hook_switches(command.args, per_request=bool(program) and release_has_flag(program, PER_REQUEST_FLAG))

    def live_capture(self, client: ServerClient, *, evidence_dir: Path | None, probes: Sequence[Sequence[int]],
                     outcome: OutcomeRequest | None, progress: Progress | None,
                     cwd: str | None, reduction: Reduction | None = None) -> CaptureResult:
        from dataclasses import replace

        from specparity.serving.results import HOOKS_MISSING, CaptureResult, ServingFailure
        from specparity.serving.vllm.client import loop_acceptance
        from specparity.serving.vllm.live import HooksMissing, live_capture

        lengths = outcome.prompt_lengths if outcome is not None else ()
        known = [n for n in lengths if n is not None]
        try:
            result = live_capture(client, probes=probes, progress=progress,
                                  prompt_lengths=known if lengths and len(known) == len(lengths) else None,
                                  reduction=reduction)
        except HooksMissing as e:
            return CaptureResult(None, None, None, (ServingFailure(HOOKS_MISSING, f"{e}; {self.flags_hint()}"),))
        return replace(result, acceptance=loop_acceptance(result.loop))

    def live_resolve(self, client: ServerClient, *, python: str | None,
                     timeout_s: float) -> ResolvedDeployment | ServingFailure:
        from specparity.serving.vllm.live import resolve_from_server

        return resolve_from_server(client, python=python, timeout_s=timeout_s, hint=self.flags_hint())

    def server_failure(self, message: str, log_lines: Sequence[str]) -> ServingFailure:
        """vLLM's own exception in the server's log decides (a worker's root cause first,
        ``serving/vllm/root_cause.py``); without one the server's failure is the machine's (exit 3)."""
        from specparity.serving.results import SERVER_FAILED, VLLM_EXCEPTION, ServingFailure
        from specparity.serving.vllm.root_cause import worker_root_cause

        cause = worker_root_cause(log_lines) or _last_exception(log_lines)
        if cause is None:
            return ServingFailure(SERVER_FAILED, message)
        return ServingFailure(VLLM_EXCEPTION, f"{cause} (the server exited before it served; {message})")

    def launch_flags(self) -> tuple[list[str], dict[str, str], list[str]]:
        from specparity.serving.vllm.live import LAUNCH_ENV, LAUNCH_FLAGS, PER_REQUEST_FLAG

        # --enforce-eager: a compiled target hides its layer boundaries from any hook (the capture is then exit 3,
        # serving/vllm/evidence.py), so a verdict needs it; every vLLM release has the flag
        return [*LAUNCH_FLAGS, "--enforce-eager"], dict(LAUNCH_ENV), [
            "--enforce-eager: without it vLLM compiles the target and its layer boundaries cannot be read (the gate "
            "then exits 3); gate a staging copy of the command with it",
            f"where the release has it (vLLM 0.32 does), add {PER_REQUEST_FLAG} summary: the gate then counts the "
            "acceptance of its own probes alone, whatever else the server serves; without it other clients' requests "
            "during the gate's run make the acceptance unmeasurable (exit 3)",
            "do not start it with --disable-log-stats: the gate reads the server's spec-decode counters from /metrics",
            "specparity must be importable in the server's environment (pip install specparity there)",
            "VLLM_SERVER_DEV_MODE=1 turns on vLLM's dev endpoints (/collective_rpc, /server_info, "
            "/reset_prefix_cache), which vLLM's --api-key does not guard (measured on 0.32: docs/live-server.md "
            "\"Security\"): bind the server to loopback or keep it behind your network's access rules; the gate "
            "attaches to a non-loopback URL with dev mode on only with --allow-dev-endpoints",
            "the tap installs nothing until the gate arms it; armed (while the gate sends its probes) it records every "
            "forward, bounded and leased (a gate that dies leaves it disarmed within the lease); other clients' "
            "requests are told apart by token ids, but gate a server without other traffic where you can"]

    def dev_endpoints(self, client: ServerClient) -> str | None:
        """Whether the server runs with ``VLLM_SERVER_DEV_MODE=1``: its dev routes answer (``GET /server_info``,
        ``entrypoints/serve/__init__.py:45-75`` mounts them only then). Measured on vLLM 0.32: ``--api-key`` does not
        guard them (``entrypoints/serve/middleware/authenticate.py:11`` guards ``/v1``, ``/v2``, ``/inference`` and
        ``/cohere`` only), so this answers the same with or without the key."""
        from specparity.serving.live.server import ServerError
        from specparity.serving.vllm.live import DEV_MODE_ENV

        try:
            client.get_json("/server_info")
        except ServerError:
            return None
        return (f"{DEV_MODE_ENV}=1: /collective_rpc (any worker method by name), /server_info and "
                "/reset_prefix_cache answer there, and vLLM's --api-key does not guard them")

    def flags_hint(self) -> str:
        flags, env, _ = self.launch_flags()
        return ("start the server with " + " ".join(f"{k}={v}" for k, v in env.items()) + " and "
                + " ".join(flags) + " (specparity launch-flags --engine vllm)")


def _last_exception(lines: Sequence[str]) -> str | None:
    """The last ``SomethingError: message`` line of a log (the API server's own traceback, e.g. a config vLLM
    refused before any worker started), with the innermost vLLM frame above it."""
    import re

    exc = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)\b(?::.*)?$")
    frame = re.compile(r'File "(?:.*/site-packages/)?(vllm/[^"]+)", line (\d+)')
    where, last = None, None
    for raw in lines:
        text = re.sub(r"^\([\w:.-]+ pid=\d+\) ", "", raw.strip())
        m = frame.search(text)
        if m:
            where = f"{m.group(1)}:{m.group(2)}"
        elif exc.match(text):
            last = text + (f" at {where}" if where else "")
    return last

