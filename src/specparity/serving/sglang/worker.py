"""Child-process entry point: ``python -m specparity.serving.sglang.worker REQUEST.json OUT_DIR``.

SGLang keeps process-global state (runtime context, parallel groups, ``lru_cache``d platform probes),
so every deployment runs in a fresh process: a new interpreter, or with ``SPECPARITY_WARM_START=1`` a process
forked from a zygote that has only imported the engine (:mod:`specparity.serving.child.zygote`, which calls
:func:`warm` once and :func:`run` per job). This module:

1. reads the :class:`~specparity.serving.child.worker_common.WorkerRequest`;
2. finds the installed SGLang version without importing it, and picks the adapter (or reports
   ``sglang_missing`` / ``unsupported_version``);
3. on ``cpu`` sets ``SGLANG_USE_CPU_ENGINE=1`` before the first sglang import (``is_cpu()`` is
   ``lru_cache``d, sglang 0.5.23 ``utils/common.py:221-224``) and installs the ``sgl_kernel`` stand-in
   only if the real package cannot be imported;
4. runs the adapter and writes ``OUT_DIR/result.json`` (+ safetensors) via ``serving.child.transport``.

Progress lines go to stdout as ``@@specparity-progress DONE TOTAL``; SGLang's logs go to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

STUB_DIR = Path(__file__).resolve().parent / "kernel_stub"


def install_kernel_stub_if_needed(device: str) -> bool:
    """Put the stand-in first on ``sys.path`` iff ``import sgl_kernel`` fails and ``device == "cpu"``."""
    if device != "cpu":
        return False
    try:
        import sgl_kernel  # noqa: F401  (the real CPU build, when a deploy env has one)

        return False
    except Exception:  # ImportError, or OSError from a CUDA-only build's shared libraries
        for name in [m for m in sys.modules if m == "sgl_kernel" or m.startswith("sgl_kernel.")]:
            del sys.modules[name]
    sys.path.insert(0, str(STUB_DIR))
    return True


def child_environment(device: str) -> dict[str, str]:
    """What this interpreter really imports: its path, sglang (version and package path), torch,
    transformers, and the device asked for. Read from the installed distributions, after the adapter
    imported sglang, so it names the modules the measurement ran on."""
    import importlib.util

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "absent"

    def where(module: str) -> str:
        loaded = sys.modules.get(module)
        origin = getattr(loaded, "__file__", None) if loaded is not None else None
        if origin is None:
            spec = importlib.util.find_spec(module)
            origin = spec.origin if spec is not None else None
        return str(Path(origin).resolve().parent) if origin else "absent"

    return {"python": sys.executable, "sglang": version("sglang"), "sglang_path": where("sglang"),
            "torch": version("torch"), "torch_path": where("torch"), "transformers": version("transformers"),
            "device": device}


def _stub_calls() -> list[str] | None:
    """The sgl_kernel stand-in's recorded calls, or None when the real package (or none) was imported."""
    stub = sys.modules.get("sgl_kernel")
    return list(stub.CALLED) if stub is not None and getattr(stub, "SPECPARITY_STUB", False) else None


def with_environment(result: Any, device: str) -> Any:
    """``result`` with the child's environment and active stand-ins on its deployment; a call into the
    sgl_kernel stand-in outside ``stand_ins.KERNEL_STUB_ALLOWED`` becomes an environment failure."""
    from dataclasses import replace

    from specparity.serving import stand_ins
    from specparity.serving.results import SGLANG_EXCEPTION, CaptureResult, ResolvedDeployment, ServingFailure

    env = child_environment(device)
    calls = _stub_calls()
    active = list(stand_ins.active())
    violation = None
    if calls is not None:
        unique = sorted(set(calls))
        active.insert(0, f"{stand_ins.SGL_KERNEL}: calls {', '.join(unique) if unique else 'none'}")
        bad = stand_ins.kernel_stub_violations(calls)
        if bad:
            violation = ServingFailure(SGLANG_EXCEPTION, (
                f"the sgl_kernel stand-in was called for {', '.join(bad)}, outside its allowlist "
                f"{sorted(stand_ins.KERNEL_STUB_ALLOWED)}: install a CPU build of sgl_kernel in this environment "
                "(nothing measured through a stand-in op is trusted)"))
    if isinstance(result, ResolvedDeployment):
        dep = replace(result, environment=env, stand_ins=tuple(active))
        return violation if violation is not None else dep
    if isinstance(result, CaptureResult) and result.deployment is not None:
        dep = replace(result.deployment, environment=env, stand_ins=tuple(active))
        failures = (*result.failures, violation) if violation is not None else result.failures
        return replace(result, deployment=dep, failures=failures)
    if isinstance(result, CaptureResult) and violation is not None:
        return replace(result, failures=(*result.failures, violation))
    return result


@dataclass(frozen=True)
class Prepared:
    """This interpreter, set up for ``device``: the adapter, or the failure every job on it reports."""

    device: str
    entry: Any = None
    adapter: Any = None
    failure: Any = None


def prepare(device: str) -> Prepared:
    """Everything before a job: the installed SGLang's adapter, the CPU engine switch and the stand-in."""
    from specparity.serving.results import ENGINE_IMPORT, SGLANG_MISSING, ServingFailure
    from specparity.serving.sglang.adapter import load_adapter, select_adapter
    from specparity.serving.sglang.engine_messages import exception_failure
    from specparity.testpoints import pause

    try:
        version = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return Prepared(device, failure=ServingFailure(
            SGLANG_MISSING, f"sglang is not installed for {sys.executable}; install it there or pass python="))
    entry = select_adapter(version)
    if isinstance(entry, ServingFailure):
        return Prepared(device, failure=entry)
    # target and draft are local directories (serving.make_request checks them): never reach the hub
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if device == "cpu":
        os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    install_kernel_stub_if_needed(device)
    pause("engine_import")  # test-only (specparity/testpoints.py): inert unless SPECPARITY_TEST_PAUSE names it
    try:
        adapter = load_adapter(entry, sglang_version=version)
    except Exception as exc:  # before SGLang saw the deployment: this machine's install or environment (exit 3)
        text = exception_failure(exc, prefix=f"importing sglang {version} failed in {sys.executable}: ").message
        return Prepared(device, entry=entry, failure=ServingFailure(ENGINE_IMPORT, text))
    return Prepared(device, entry=entry, adapter=adapter)


def warm(device: str) -> Prepared:
    """The zygote's set-up (serving/child/zygote.py): :func:`prepare`, then the adapter's own ``warm``, which does what
    its resolve/capture do before their first SGLang import (e.g. the legacy CPU shims) and imports the engine
    modules every job imports. An adapter without ``warm`` imports nothing ahead (each job pays for it)."""
    prepared = prepare(device)
    hook = getattr(prepared.adapter, "warm", None)
    if callable(hook):
        hook(device)
    return prepared


def run(argv: list[str], prepared: Prepared | None = None) -> int:
    """One job: ``argv`` = [REQUEST.json, OUT_DIR]; ``prepared`` comes from the zygote, else from here."""
    from specparity.serving.child.transport import write_result
    from specparity.serving.child.worker_common import WorkerRequest, report_progress

    request_path, out_dir = Path(argv[0]), Path(argv[1])
    request = WorkerRequest.from_dict(json.loads(request_path.read_text()))
    if prepared is None or prepared.device != request.device:
        prepared = prepare(request.device)
    if prepared.failure is not None:
        write_result(out_dir, prepared.failure)
        return 0
    adapter, entry = prepared.adapter, prepared.entry
    if request.op == "resolve":
        write_result(out_dir, with_version_note(with_environment(adapter.resolve(request), request.device), entry))
    elif request.op == "capture":
        write_result(out_dir, with_version_note(with_environment(adapter.capture(request, progress=report_progress),
                                                                 request.device), entry))
    else:
        raise ValueError(f"unknown op {request.op!r}")
    return 0


def main(argv: list[str]) -> int:
    return run(argv)


def with_version_note(result: Any, entry: Any) -> Any:
    """A version newer than every known range: the ``untested_version`` warning goes into every report."""
    import dataclasses

    from specparity.serving.results import CaptureResult, ResolvedDeployment

    if not entry.untested:
        return result
    note = ("untested_version", "warning", entry.note, "specparity versions (serving/sglang/families.py)")
    if isinstance(result, ResolvedDeployment):
        return dataclasses.replace(result, adapter_notes=(note, *result.adapter_notes))
    if isinstance(result, CaptureResult) and result.deployment is not None:
        dep = dataclasses.replace(result.deployment, adapter_notes=(note, *result.deployment.adapter_notes))
        return dataclasses.replace(result, deployment=dep)
    return result


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: SGLang leaves threads and process groups that make exit slow.
    os._exit(code)
