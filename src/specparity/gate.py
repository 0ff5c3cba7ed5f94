"""The gate: static resolution + capture with attribution + outcome -> one :class:`Verdict`.

Data flows one way (docs/house-style.md): the contract says what training promised; the engine
adapter (:mod:`specparity.serving.engine`, SGLang or vLLM) says what the engine really does, started once
per gate run in a child process with the engine's own code; compare/ and replay/ turn the two into
findings; this module only orchestrates and never renders.

Levels:
- ``static``  the engine resolves the deployment (ids, capture list, fc width, speculative settings).
- ``capture`` also a real run of the contract's probes; every fc chunk attributed to a source.
- ``outcome`` also the drafter's acceptance on recorded vs served fc inputs (wiring vs model), held against
  the engine's own figures from the same run (its drafter replay, its serving loop's counters).
- ``all``     everything.

A check that could not run is an ``error`` verdict, never a pass.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from specparity.compare.attribution import attribute
from specparity.compare.reduced import RTOL_CHUNKS, Reduction, rtol_table
from specparity.compare.tolerances import resolve_tolerance, tolerances_from_contract
from specparity.contract import Contract, ProbePack, load_contract, read_contract_probes
from specparity.deployed import check_deployed_files, check_family_algorithm, check_family_level
from specparity.errors import InputError
from specparity.gate_live import apply_launch, attach, capture_launched, resolve_launched
from specparity.gate_verdict import GateRun, pair_tolerances, verdict_of
from specparity.replay.outcome import check_outcome
from specparity.report.items import item_report
from specparity.serving.command.parse import LaunchSpec
from specparity.serving.engine import engine_args_for, get_engine, outcome_request
from specparity.serving.live.capture import StartedServer, capture_attached
from specparity.serving.results import CaptureResult, ResolvedDeployment
from specparity.verdict import Level, Verdict

LEVELS: tuple[Level, ...] = ("static", "capture", "outcome", "all")
EVIDENCE = ("reduced", "full")


def reduction_for(contract: Contract, pack: ProbePack) -> Reduction:
    """What a worker needs to reduce its atlas exactly as :func:`_attribute` will judge it: the recorded fc inputs,
    the contract's sources, and the served-vs-atlas rtol of every chunk for each pair of dtypes the worker may see
    (the rule of gate_verdict.pair_tolerances, the served and atlas dtypes standing in for the capture's)."""
    sources = list(contract.fc_input.sources)

    def rtol_for(served: str, atlas: str) -> list[float]:
        base, overrides = tolerances_from_contract(contract.tolerances, dtype=served, other=atlas)
        chunks = [*sources, *[None] * (RTOL_CHUNKS - len(sources))]
        return [resolve_tolerance(base, overrides, chunk=c, source=src).rtol for c, src in enumerate(chunks)]

    d = contract.drafter
    return Reduction(recorded=tuple(s.fc_input for s in pack.samples), expected=tuple(sources),
                     rtol=rtol_table(rtol_for), served="aux" if d.norm_before_fc or d.fc_norm else "fc")


def _node_evidence(dirs: Sequence[str | Path], engine: str, *, live: bool) -> tuple[Path, ...]:
    """``--node-evidence`` as the gate may use it: SGLang's live path only, each a directory of this user, 0700 (the
    hooks' own rule, serving/sglang/live_hooks.py ``evidence_dir_problem``); else :class:`InputError`."""
    if not dirs:
        return ()
    if engine != "sglang":
        raise InputError("--node-evidence is for SGLang servers: vLLM reaches every node's workers through its own "
                         "executor (/collective_rpc)", field="--node-evidence")
    if not live:
        raise InputError("--node-evidence needs the server: --launch or --server", field="--node-evidence")
    from specparity.serving.sglang.live_wire import evidence_dir_problem

    out = []
    for d in dirs:
        problem = evidence_dir_problem(Path(d))
        if problem is not None:
            raise InputError(f"not a node's evidence directory: {problem}", path=Path(d), field="--node-evidence")
        out.append(Path(d))
    return tuple(out)


def run_gate(
    contract_path: str | Path,
    target: str | Path | None = None,
    draft: str | Path | None = None,
    *,
    deployed_args: Mapping[str, object] | None = None,
    level: str = "all",
    device: str = "cpu",
    python: str | None = None,
    timeout_s: float = 900,
    progress: Callable[[int, int], None] | None = None,
    engine: str = "sglang",
    engine_args: Mapping[str, object] | None = None,
    launch: LaunchSpec | None = None,
    server: str | None = None,
    api_key: str | None = None,
    allow_dev_endpoints: bool = False,
    started: StartedServer | None = None,
    evidence: str = "reduced",
    node_evidence: Sequence[str | Path] = (),
) -> Verdict:
    """Check the deployment (``target``, ``draft``, engine arguments) against the contract.

    ``engine`` is ``sglang`` or ``vllm`` (:mod:`specparity.serving.engine`); ``engine_args`` are its
    arguments (ServerArgs keywords / ``vllm.LLM`` keywords), merged over ``deployed_args`` (the arguments as deployed:
    ``--sglang-arg``, the plugin's; a deploy command's own override them, ``engine_args`` override both). ``launch`` is the deploy
    command as its engine parsed it (serving/command/parse.py): its engine, target, draft and arguments are the deployment's
    (``target``/``draft`` given too must agree; ``engine_args`` override the command's), served by the interpreter
    that parsed it unless ``python`` says otherwise (gate_live.py); at the capture, outcome and ``all`` levels the
    gate starts that server itself, with the engine's hook switches added (serving/live/capture.py). ``server`` is the URL of
    a running server (``api_key`` its key): the deployment is what the server reports, and the evidence comes through
    its hooks; ``started``, that server already started from the command while it was parsed (cli.py).
    ``evidence``: ``reduced`` (default) lets an engine that can (vLLM's tap) reduce the layer atlas where it is, to
    the statistics attribution reads (compare/reduced.py); ``full`` ships the whole atlas (for debugging).
    ``node_evidence``: the evidence directories of a multi-node SGLang server's other nodes (its hooks write on each
    node's own disk; serving/sglang/live.py ``evidence_to_capture``). Raises
    :class:`InputError` for bad input (contract, probe pack, arguments); everything the engine does,
    including crashing, ends up in the returned verdict.
    """
    if launch is not None:
        target, draft, engine, engine_args = apply_launch(launch, target=target or None, draft=draft or None,
                                                          engine=None, engine_args=engine_args)
        python = python or (launch.python if launch.python and launch.python != sys.executable else None)
    try:
        eng = get_engine(engine)
    except ValueError as e:
        raise InputError(str(e), field="--engine") from None
    attached = attach(eng, server, api_key=api_key, target=target, draft=draft, python=python,
                      timeout_s=timeout_s, allow_dev_endpoints=allow_dev_endpoints) if server is not None else None
    if attached is not None:
        target, draft = attached.target, attached.draft
    if not target or not draft:
        raise InputError("give --target and --draft, the deploy command (--launch), or a running server (--server)",
                         field="--target")
    if evidence not in EVIDENCE:
        raise InputError(f"unknown evidence {evidence!r}; choose one of {', '.join(EVIDENCE)}", field="--evidence")
    nodes = _node_evidence(node_evidence, eng.name, live=server is not None or launch is not None)
    if level not in LEVELS:
        raise InputError(f"unknown level {level!r}; choose one of {', '.join(LEVELS)}", field="--level")
    t0 = time.perf_counter()
    contract = load_contract(contract_path)
    if contract.probes is None and level != "static":
        why = contract.layout_assumed.reason if contract.layout_assumed else "no recordings"
        raise InputError(
            f"contract {contract.name!r} has no probe pack: its layout is assumed ({why}). Only --level static can "
            f"check it; the {level} level compares served tensors with recorded ones, so it needs a contract written "
            "from recordings (specparity contract from-specforge / from-speculators)", path=contract_path,
            field="probes")
    pack = read_contract_probes(contract, contract_path) if contract.probes is not None else None
    if pack is not None and pack.sources != list(contract.fc_input.sources):
        raise InputError(f"probe pack sources {pack.sources} differ from the contract's", path=contract_path,
                         field="fc_input.sources")
    if attached is None or attached.local:  # a remote server's files are the server's to read
        check_deployed_files(Path(target), Path(draft))  # swapped dirs, a broken weight file: exit 2 before the engine
        # a level that cannot run for the drafter's family here (ours, or the engine's own CPU refusal): exit 3
        check_family_level(Path(draft), level, engine=eng.name, device=device,
                           live=attached is not None or launch is not None)
    user = {**(deployed_args or {}), **(engine_args or {})}
    check_family_algorithm(Path(draft), user)  # a DFlash drafter under an EAGLE algorithm (or the reverse): exit 3
    args = engine_args_for(eng, contract, user)
    run = GateRun(contract=contract, draft=Path(draft), target=Path(target), engine=eng.name, launch=launch,
               recorded_dtype=str(pack.samples[0].fc_input.dtype).removeprefix("torch.") if pack and pack.samples else None)
    timings: dict[str, float] = {}
    if level == "static":
        dep = (attached.deployment if attached is not None
               else resolve_launched(eng, launch, target, draft, args=args, device=device, python=python,
                                     timeout_s=timeout_s) if launch is not None
               else eng.resolve(target, draft, args=args, device=device, python=python, timeout_s=timeout_s))
        if attached is not None:
            run.live = attached.live
        run.deployment, run.failures = (dep, ()) if isinstance(dep, ResolvedDeployment) else (None, (dep,))
        timings["static"] = time.perf_counter() - t0
    else:
        assert pack is not None  # refused above for a contract without probes
        # one engine start per gate run: the capture, and at the outcome levels the outcome's evidence too
        request = outcome_request(pack) if level in ("outcome", "all") else None
        probes = [s.input_ids.tolist() for s in pack.samples]
        # the atlas reduced in the engine's workers, where the engine can (an engine that cannot ships it whole)
        red = ({"reduction": reduction_for(contract, pack)}
               if evidence == "reduced" and getattr(eng, "reduces_evidence", False) else {})
        live_kw: dict[str, Any] = {**red, **({"node_evidence": nodes} if nodes else {})}
        if attached is not None:  # the running server's own hooks and counters (serving/live/capture.py)
            capture = capture_attached(eng, attached.url, api_key=api_key, probes=probes, outcome=request,
                                       timeout_s=timeout_s, progress=progress, **live_kw)
        elif launch is not None:  # the user's own server, launched from their command (gate_live.capture_launched)
            capture = capture_launched(eng, launch, probes=probes, timeout_s=timeout_s, python=python,
                                       progress=progress, outcome=request, allow_dev_endpoints=allow_dev_endpoints,
                                       started=started, **live_kw)
        else:
            capture = eng.capture(target, draft, probes=probes, args=args, device=device, timeout_s=timeout_s,
                                  python=python, progress=progress, outcome=request, **red)
        run.deployment, run.failures = capture.deployment, tuple(capture.failures)
        run.requested_layout = dict((capture.loop or {}).get("layout") or {})
        run.live = (capture.loop or {}).get("live") or run.live
        timings["capture"] = time.perf_counter() - t0
        if capture.fc is not None and capture.atlas is not None:
            t1 = time.perf_counter()
            _attribute(run, pack, capture)
            timings["compare"] = time.perf_counter() - t1
        if request is not None:
            t1 = time.perf_counter()
            matches = (run.table is not None and not capture.failures
                       and list(run.table.served_sources()) == list(contract.fc_input.sources))
            out = check_outcome(contract, pack, capture, target=target, draft=draft, engine=eng.label,
                                capture_matches=matches)
            run.outcome, run.outcome_findings = out.summary, out.findings
            timings["outcome"] = time.perf_counter() - t1
    timings["total"] = time.perf_counter() - t0
    return verdict_of(run, level=level, timings=timings)


def _attribute(run: GateRun, pack: ProbePack, capture: CaptureResult) -> None:
    assert capture.fc is not None and capture.atlas is not None
    run.fc_dtype = capture.fc.dtype
    reduced = capture.atlas.reduced
    first = next(iter(capture.atlas.per_sample[0].values()), None) if capture.atlas.per_sample else None
    run.atlas_dtype = (str(reduced[0].meta["atlas_dtype"]) if reduced
                       else str(first.dtype).removeprefix("torch.") if first is not None else capture.fc.dtype)
    (base, overrides), (rec, rec_over), _ = pair_tolerances(run)
    d = run.contract.drafter
    # with norm_before_fc / fc_norm the fc hook sees the normed tensor; the recording is the raw aux
    # states (domain.md §1 "Where to tap"), so compare what the target produced
    served = capture.fc.aux_per_sample if (d.norm_before_fc or d.fc_norm) and capture.fc.aux_per_sample \
        else capture.fc.per_sample
    # the recording is compared in the served dtype: bf16 -> fp32 is exact, and fp32 -> bf16 loses only what
    # the coarser side's tolerance already allows
    run.table = attribute(
        served, [s.fc_input.to(capture.fc.per_sample[0].dtype) for s in pack.samples],
        capture.atlas.per_sample, expected=list(run.contract.fc_input.sources), tolerance=base, overrides=overrides,
        recorded_tolerance=rec, recorded_overrides=rec_over, reduced=reduced,
    )
    h = pack.hidden_size
    probes = []
    for i, (got, sample) in enumerate(zip(served, pack.samples, strict=True)):
        same = got.shape == sample.fc_input.shape and got.numel() > 0
        finite = bool(got.isfinite().all())
        a, b = got.float(), sample.fc_input.float()
        err = float((a - b).abs().max()) if same else math.inf
        tok = ((a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-30)) if same else None
        # the status is filled in from the verdict's findings (verdict/rules.py probe_status): one rule for every face
        probes.append({"index": i, "tokens": int(got.shape[0]), "status": "pending",
                       "max_abs_err": err if finite else math.nan, "chunks": int(got.shape[-1] // h),
                       "rel_err_max": float(tok.max()) if tok is not None and finite else math.nan})
    run.probes = tuple(probes)


def check_failures(verdict: Verdict, check: str, *, probe: int | None = None) -> str | None:
    """The report text for one pytest item (``static``, ``capture``, ``outcome``), or None when it passes."""
    return item_report(verdict, check, probe=probe)
