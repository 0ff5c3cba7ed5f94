"""SGLang behind :class:`specparity.serving.engine.Engine`: resolve, capture (with SGLang's own drafter replayed on
served and recorded inputs), its id rules (``specparity.idrules.sglang``), explain and the supported releases."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specparity.deploy_command import flag_values
from specparity.serving import results
from specparity.serving.engine_base import EngineBase

if TYPE_CHECKING:
    from specparity.compare.fix import DraftConfigFix
    from specparity.compare.reduced import Reduction
    from specparity.deploy_command import LaunchCommand
    from specparity.serving.live.server import ServerClient

# added to a CPU server's command (reported with the other switches): SGLang's own warm-up request decodes 8 tokens
# (entrypoints/http_server.py:2407), and the EAGLE decode step has no CPU kernel (serving/sglang/live.py CPU_REFUSALS)
SKIP_WARMUP = "--skip-server-warmup"


class SglangEngine(EngineBase):
    """SGLang: the parent side in ``client.py``, the child in ``worker.py``, one adapter per release family."""

    name, label = "sglang", "SGLang"
    spec_keys = results.SPEC_SERVER_ARGS
    health_path = "/health"
    # the live hooks reduce the atlas in the server's processes when the gate sends a Reduction (live_hooks); the
    # in-process capture's child is on the gate's own host and ships its atlas whole over its local transport
    reduces_evidence = True

    def resolve(self, target: str | Path, draft: str | Path, *, args: Mapping[str, object], device: str,
                timeout_s: float, python: str | None) -> results.ResolvedDeployment | results.ServingFailure:
        from specparity.serving.sglang.client import resolve_deployment

        dep = resolve_deployment(target, draft, server_args=args, device=device, timeout_s=timeout_s, python=python)
        if isinstance(dep, results.ResolvedDeployment):
            return dep
        return _why_sglang_cannot_read((dep,), Path(draft))[0]

    def capture(self, target: str | Path, draft: str | Path, *, probes: Sequence[Sequence[int]],
                args: Mapping[str, object], device: str, timeout_s: float, python: str | None,
                progress: results.Progress | None,
                outcome: results.OutcomeRequest | None = None,
                reduction: Reduction | None = None) -> results.CaptureResult:
        """``reduction`` is not used here: the child runs on the gate's host and hands its atlas over a local
        transport (the live path reduces, ``live_capture``)."""
        from specparity.serving.sglang.client import capture_deployment

        # the outcome: SGLang's own drafter replayed on served and recorded inputs in the capture's child (its
        # draft-decode loop has no CPU kernels, sglang-cpu.md §5 item 6, so there are no loop counters)
        result = capture_deployment(target, draft, probes=probes, server_args=args, device=device, atlas=True,
                                    timeout_s=timeout_s, python=python, progress=progress,
                                    recorded_fc=outcome.recorded_fc if outcome is not None else None)
        if result.deployment is not None:
            return result
        return dataclasses.replace(result, failures=_why_sglang_cannot_read(result.failures, Path(draft)))

    def reading(self, draft_config: Mapping[str, Any], *, num_layers: int, architecture: str,
                version: str) -> results.IdReading | None:
        return None  # SGLang's reading is judged from its own resolution (ResolvedDeployment)

    def layout_fix(self, sources: Sequence[str], draft_config: Mapping[str, Any], *, num_layers: int,
                   architecture: str, version: str, draft_path: str) -> DraftConfigFix:
        from specparity.compare.fix import layout_fix

        return layout_fix(sources, draft_config, num_layers=num_layers, architecture=architecture, version=version,
                          draft_path=draft_path)

    def explain(self, target: Path, draft: Path, *, args: Mapping[str, object], python: str | None,
                timeout_s: float) -> results.Explanation:
        from specparity.serving.sglang.explain import explain

        return explain(target, draft, sglang_args=args, python=python, timeout_s=timeout_s)

    def versions(self) -> list[dict[str, Any]]:
        from specparity.serving.sglang.families import versions_table

        return [{"engine": "sglang", **r} for r in versions_table()]

    def versions_lines(self) -> list[str]:
        lines = [f"{'SGLang range':<26} {'family':<7} {'adapter':<16} {'folder':<13} {'live':<5} tested with"]
        for r in self.versions():
            tested = ", ".join(f"{e} (sglang {v})" for e, v in zip(r["tested_with"], r["tested_versions"], strict=True))
            if r["untested"]:
                tested = "untested: runs with an untested_version warning"
            elif not tested:
                tested = str(r["untested_why"])
            lines.append(f"{r['range']!s:<26} {r['family']!s:<7} {r['adapter']!s:<16} {r['folder']!s:<13} "
                         f"{r['live_capture']!s:<5} {tested}")
        return lines

    def live_switches(self, command: LaunchCommand, *, evidence_dir: Path,
                      program: Sequence[str] = ()) -> tuple[list[str], dict[str, str], list[str]]:
        """``--forward-hooks`` naming the hook factory; on a CPU server also the stand-ins' environment and
        ``--skip-server-warmup`` (SGLang's warm-up decodes, which no CPU kernel can: ``live.CPU_REFUSALS``). Read
        from the command's words, so the server can start while SGLang's parser reads them."""
        from specparity.serving.sglang.live import hook_switches

        cpu = _cpu_server(command.args)
        flags, env = hook_switches(evidence_dir, cpu_stand_ins=cpu)
        notes = []
        own = _own_forward_hooks(command.args)
        if own is not None:  # SGLang's parser keeps the last --forward-hooks: ours carries the user's hooks too
            import json

            flags[1] = json.dumps([*own, *json.loads(flags[1])], separators=(",", ":"))
            notes.append(f"the command's own --forward-hooks ({len(own)} hook(s)) kept: specparity's hook is added to "
                         "the same list, since SGLang takes the last --forward-hooks given (a JSON list, "
                         "arg_groups/fields/observability.py forward_hooks)")
        if cpu:
            notes.append("a CPU server: the CPU stand-ins of the in-process capture are active in it (recorded in the "
                         "report's stand-ins)")
            if SKIP_WARMUP not in command.args:
                flags.append(SKIP_WARMUP)
                notes.append(f"{SKIP_WARMUP} added: SGLang's warm-up request decodes, and the EAGLE decode step has no "
                             "CPU kernel (sglang 0.5.23 speculative/eagle_utils.py:910)")
        return flags, env, notes

    def live_capture(self, client: ServerClient, *, evidence_dir: Path | None, probes: Sequence[Sequence[int]],
                     outcome: results.OutcomeRequest | None, progress: results.Progress | None,
                     cwd: str | None, reduction: Reduction | None = None,
                     node_evidence: Sequence[Path] = ()) -> results.CaptureResult:
        """The probes' prefill through the server's ``--forward-hooks``; attached, the hooks' directory is the one
        the server's own ``/server_info`` names, when it is on this host. ``node_evidence``: the other nodes'
        evidence directories (``--node-evidence``); ``reduction``: the hooks reduce the atlas where it is."""
        from specparity.serving.sglang.live import live_capture, server_hooks_dir

        where = evidence_dir if evidence_dir is not None else server_hooks_dir(client)
        result = live_capture(client, evidence_dir=where, probes=probes, cwd=cwd, progress=progress,
                              reduction=reduction, node_dirs=node_evidence)
        replay: results.ServingFailure | None = None
        acceptance: results.LoopAcceptance | None = None
        loop: dict[str, Any] = {}
        if outcome is not None and result.fc is not None:
            replay, acceptance, loop = _served_acceptance(client, result, outcome, probes, launched_in=evidence_dir)
        # the bytes the hooks wrote for this run (counted before the run removed them: serving/sglang/live.py)
        moved = int((result.loop or {}).get("evidence_bytes") or 0)
        return dataclasses.replace(result, loop={**(result.loop or {}), **loop, "evidence_bytes": moved},
                                   replay=replay, acceptance=acceptance)

    def live_resolve(self, client: ServerClient, *, python: str | None,
                     timeout_s: float) -> results.ResolvedDeployment | results.ServingFailure:
        from specparity.serving.sglang.live import resolve_from_server

        return resolve_from_server(client)

    def server_failure(self, message: str, log_lines: Sequence[str]) -> results.ServingFailure:
        from specparity.serving.sglang.live import server_failure

        return server_failure(message, log_lines)

    def launch_flags(self) -> tuple[list[str], dict[str, str], list[str]]:
        import json

        from specparity.serving.sglang.live import hook_specs

        return ["--forward-hooks", json.dumps(hook_specs("/path/to/evidence-dir"), separators=(",", ":"))], {}, [
            "specparity must be importable in the server's environment (pip install specparity there)",
            "create the evidence directory first, owned by the server's user, mode 0700 (mkdir -m 700 DIR); the "
            "hooks record only while the gate arms them (DIR/ARMED)",
            "SGLang returns no hook evidence over HTTP: run the gate on the server's host (specparity gate --server "
            "URL reads DIR from the server's own /server_info)"]


def _why_sglang_cannot_read(failures: Sequence[results.ServingFailure],
                            draft: Path) -> tuple[results.ServingFailure, ...]:
    """SGLang's own start-up failure on a draft config it cannot read (a speculators-format draft: transformers'
    AutoConfig wants a model_type), told as ``draft_unreadable`` with the conversion and SGLang's own message kept;
    other failures unchanged. SGLang is always asked first: a release that learns the format is never refused here."""
    from specparity.serving.results import DRAFT_UNREADABLE, SGLANG_EXCEPTION
    from specparity.serving.sglang.draft_format import unreadable_draft

    why = unreadable_draft(draft) if any(f.kind == SGLANG_EXCEPTION for f in failures) else None
    if why is None:
        return tuple(failures)
    raised = "; ".join(f.message for f in failures)
    version = next((f.engine_version for f in failures if f.engine_version), None)
    vllm = (". To gate this draft as it is, serve it with vLLM (--engine vllm), which reads the speculators "
            "format: capture and outcome levels both" if "speculators" in why.message else "")
    return (results.ServingFailure(DRAFT_UNREADABLE,
                                   f"{why.message}{vllm} (SGLang {version or 'at start-up'} raised: {raised})",
                                   engine_version=version),)


def _served_acceptance(client: ServerClient, result: results.CaptureResult, outcome: results.OutcomeRequest,
                       probes: Sequence[Sequence[int]], *, launched_in: Path | None,
                       ) -> tuple[results.ServingFailure | None, results.LoopAcceptance | None, dict[str, Any]]:
    """The server's own acceptance after the capture: its loop on the probes' prompts, each request's own counts
    (``serving/sglang/live.py`` ``served_acceptance``). Whether the server can decode speculatively is the server's
    to say: a launched server is asked, and where it refuses (this CPU: no kernel for the EAGLE decode step) its own
    log names the call, file:line of the installed release (``server_failure``); an attached server on a CPU is not
    sent a decode (it would stop the user's server), and the known refusal is named. (refusal, acceptance, loop)."""
    import time

    from specparity.serving.live.server import ServerError
    from specparity.serving.sglang.live import CPU_REFUSALS, served_acceptance, server_failure

    dep = result.deployment
    version = dep.engine_version if dep is not None else "?"
    if launched_in is None and (dep is None or dep.device == "cpu"):
        r = CPU_REFUSALS[0]
        return results.ServingFailure(results.NEEDS_HARDWARE, (
            f"the server's own acceptance was not measured: it runs on a CPU, where sglang {r.release} refuses the "
            f"EAGLE decode step at {r.call}, and the gate sends no decode that would stop a server it did not start; "
            "the capture above ran at prefill")), None, {}
    try:
        acc, loop, why = served_acceptance(client, probes, outcome.prompt_lengths)
    except ServerError as e:
        lines: list[str] = []
        log = Path(launched_in) / "server.log" if launched_in is not None else None
        deadline = time.monotonic() + 10
        while log is not None and time.monotonic() < deadline:  # the scheduler's traceback reaches the log last
            lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
            if any("Error" in ln for ln in lines[-200:]):
                break
            time.sleep(0.5)
        failure = server_failure(f"the server stopped while it decoded the probes' prompts for its own acceptance "
                                 f"({e})", lines[-400:])
        return failure, None, {}
    if acc is None:
        return results.ServingFailure(results.UNSUPPORTED_VERSION, f"sglang {version}'s own acceptance cannot be "
                                      f"judged per draft position: {why}"), None, loop
    return None, acc, loop


def _own_forward_hooks(args: Sequence[str]) -> list[Any] | None:
    """The hooks of the command's own last ``--forward-hooks`` (a JSON list, as SGLang's ``json_list_type`` reads
    it), or None when it gives none; a value that is not a JSON list is the user's input (exit 2)."""
    import json

    from specparity.errors import InputError

    value = next(iter(flag_values(args, "--forward-hooks", "--forward_hooks")[-1:]), None)
    if value is None:
        return None
    try:
        hooks = json.loads(value)
    except ValueError as e:
        raise InputError(f"--forward-hooks is not JSON: {e}", field="--launch") from None
    if not isinstance(hooks, list):
        raise InputError("--forward-hooks must be a JSON list of hook specifications", field="--launch")
    return hooks


# device nodes of the accelerators SGLang serves on besides the CPU (its ServerArgs picks the device from the
# platform when --device is not given): NVIDIA, AMD ROCm (/dev/kfd), Huawei Ascend (/dev/davinci*), Intel Gaudi
# (/dev/accel/*); a host with none of them serves on the CPU
_ACCELERATOR_NODES = ("nvidia[0-9]*", "kfd", "davinci[0-9]*", "accel/accel[0-9]*")


def _cpu_server(args: Sequence[str], dev: Path = Path("/dev")) -> bool:
    """Whether the command's server runs on the CPU: it says ``--device cpu``, or names no device and this machine
    has no accelerator device node (:data:`_ACCELERATOR_NODES`; SGLang then needs SGLANG_USE_CPU_ENGINE and the CPU
    stand-ins). A command that names its device decides, whatever the host has."""
    device = next(iter(flag_values(args, "--device")[-1:]), None)
    if device:
        return device == "cpu"
    return not any(any(dev.glob(pattern)) for pattern in _ACCELERATOR_NODES)
