"""The ``specparity`` command: the gate, ``explain`` and the contract tools.

Exit codes: 0 pass, 1 the deployment does not match the contract (SGLang refusing or crashing on it
and a wrong target included), 2 the user's own files are malformed, 3 the check could not run here
(:mod:`specparity.errors`, :mod:`specparity.verdict.rules`). Errors print one short line naming the file and field; never a traceback
(set ``SPECPARITY_DEBUG=1`` to see one).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from specparity import __version__
from specparity.cli_command import launch_options, server_options
from specparity.cli_contract import _Group, contract
from specparity.cli_watch import alert_rules, watch
from specparity.errors import InputError
from specparity.serving.results import ENGINES

F = TypeVar("F", bound=Callable[..., Any])


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="specparity")
def main() -> None:
    """Train/serve parity gate for EAGLE-3 drafters.

    A contract, written at training time, says which target hidden states the drafter's fc layer was
    trained on. The gate checks what the serving engine (SGLang or vLLM) really feeds fc against it.
    """


main.add_command(contract)
main.add_command(watch)
main.add_command(alert_rules)


def _options(*options: Callable[[F], F]) -> Callable[[F], F]:
    """The click ``options`` as one decorator; ``--help`` lists them in the order given."""

    def apply(f: F) -> F:
        for option in reversed(options):
            f = option(f)
        return f

    return apply


def _deployment_options(*, target: str, draft: str, deployed_arg: str) -> Callable[[F], F]:
    """The deployment ``gate`` and ``explain`` read: ``--target``, ``--draft`` (help texts given), the engine and
    its arguments."""
    return _options(
        click.option("--target", type=click.Path(path_type=Path), help=target + " Default: the launch command's."),
        click.option("--draft", type=click.Path(path_type=Path), help=draft + " Default: the launch command's."),
        click.option("--sglang-arg", "deployed_args", multiple=True, metavar="KEY=VALUE", help=deployed_arg),
        click.option("--engine", type=click.Choice(list(ENGINES)), default="sglang", show_default=True,
                     help="Serving engine of the deployment."),
        click.option("--engine-arg", "engine_args", multiple=True, metavar="KEY=VALUE",
                     help="Engine argument (repeatable): ServerArgs for sglang, vllm.LLM keywords for vllm, "
                          "e.g. tensor_parallel_size=2."),
    )


def _child_options(*, python: str, timeout_s: float, json: str) -> Callable[[F], F]:
    """The engine child's interpreter and time budget, and the JSON output (help texts and default given)."""
    return _options(
        click.option("--python", "python", default=None, help=python),
        click.option("--timeout", "timeout_s", default=timeout_s, show_default=True,
                     help="Seconds before the engine is stopped."),
        click.option("--json", "json_path", type=click.Path(path_type=Path), default=None, help=json),
    )


@main.command("gate")
@click.option("--contract", "contract_path", required=True, type=click.Path(path_type=Path), help="Contract JSON.")
@_deployment_options(target="Target model dir as deployed.", draft="Draft model dir as deployed.",
                     deployed_arg="SGLang server argument as deployed (repeatable), e.g. speculative_num_steps=3.")
@click.option("--level", type=click.Choice(["static", "capture", "outcome", "all"]), default="all", show_default=True)
@click.option("--device", default="cpu", show_default=True, help="cpu, or cuda for a production capture.")
@_child_options(python="Interpreter whose engine (SGLang or vLLM) serves (default: this one).", timeout_s=900.0,
                json="Write the JSON report.")
@click.option("--html", "html_path", type=click.Path(path_type=Path), default=None, help="Write the HTML report.")
@click.option("--junit", "junit_path", type=click.Path(path_type=Path), default=None, help="Write JUnit XML.")
@click.option("--evidence", type=click.Choice(["reduced", "full"]), default="reduced", show_default=True,
              help="reduced: the server's processes (vLLM's workers, SGLang's live hooks) send the statistics "
                   "attribution reads, not the layer atlas; full: every residual boundary from every rank (for "
                   "debugging; large at a real model's size).")
@click.option("--node-evidence", "node_evidence", multiple=True, type=click.Path(path_type=Path), metavar="DIR",
              help="A multi-node SGLang server (--nnodes): another node's hook evidence directory, shared or copied "
                   "here (repeatable). SGLang's hooks write on each node's own disk; a node the gate cannot read "
                   "is exit 3, never a pass on half the ranks.")
@launch_options
@server_options
def gate(contract_path: Path, target: Path | None, draft: Path | None, deployed_args: tuple[str, ...], engine: str,
         engine_args: tuple[str, ...], level: str, device: str, python: str | None, timeout_s: float,
         json_path: Path | None, html_path: Path | None, junit_path: Path | None, launch: bool,
         launch_file: Path | None, command: tuple[str, ...], server: str | None, api_key: str | None,
         allow_dev_endpoints: bool, evidence: str, node_evidence: tuple[Path, ...]) -> None:
    """Check a deployment against its contract.

    \b
    Exit codes:
      0  pass: the engine (SGLang or vLLM) feeds the drafter's fc what the contract promises.
      1  the deployment does not match the contract, including a deployment the engine refuses or
         crashes on because of the draft, target or engine arguments as deployed, and a wrong target
         (config, tokenizer, chat template or weights).
      2  your own files are malformed (contract, probe pack, model dirs, arguments): the message
         names the file and field.
      3  the check could not run here: the engine missing or unsupported, out of memory, timeout,
         this machine's limits (e.g. no Ray, a CPU attention backend that cannot run MLA: the
         finding names the call), a dead engine. A vLLM worker's own exception decides it.
    """
    from specparity import cli_command
    from specparity.engine_args import parse_engine_args
    from specparity.gate import run_gate
    from specparity.progress import Progress
    from specparity.report import check_report_paths, render_text, use_color, write_reports

    check_report_paths(json_path=json_path, html_path=html_path, junit_path=junit_path)  # before any engine starts
    cmd = cli_command.read_command(launch, command, launch_file)
    if server is not None and cmd is not None:
        raise InputError("give the deploy command (--launch) or a running server (--server), not both",
                         field="--server")
    started = cli_command.start_early(cmd, level=level, python=python, allow_dev_endpoints=allow_dev_endpoints)
    try:  # the server started from the command is stopped whatever happens next (bad input included)
        spec = cli_command.launch_spec(launch, command, launch_file, python=python, timeout_s=timeout_s, cmd=cmd)
        if server is None:  # a running server says itself what it serves (gate_live.attach)
            target, draft, engine, _ = cli_command.deployment(spec, target, draft, engine)
            _check_model_dirs(target, draft)
        elif not cli_command.engine_given():
            from specparity.serving.live.capture import detect_engine

            engine = detect_engine(server, api_key=api_key) or engine
        with Progress(3, "gate") as progress:
            verdict = run_gate(contract_path, target, draft, deployed_args=parse_engine_args(deployed_args),
                               level=level, device=device, python=python, timeout_s=timeout_s, progress=progress,
                               engine=engine, engine_args=parse_engine_args(engine_args, field="--engine-arg"),
                               launch=spec, server=server, api_key=api_key, allow_dev_endpoints=allow_dev_endpoints,
                               started=started, evidence=evidence, node_evidence=node_evidence)
    finally:
        if started is not None:
            started.stop()
    click.echo(render_text(verdict, color=use_color(sys.stdout)), nl=False)
    write_reports(verdict, json_path=json_path, html_path=html_path, junit_path=junit_path)
    sys.exit(verdict.exit_code)


@main.command("explain")
@_deployment_options(target="Target model dir (config.json).", draft="Draft model dir (config.json).",
                     deployed_arg="SGLang server argument as deployed (repeatable); device defaults to cuda.")
@_child_options(python="Interpreter whose engine resolves (default: this one).", timeout_s=600.0,
                json="Write the answer as JSON.")
@click.option("--strict", is_flag=True, default=False, help="Exit 1 on any warning (e.g. a setting the engine "
              "rewrites).")
@launch_options
def explain_cmd(target: Path | None, draft: Path | None, deployed_args: tuple[str, ...], engine: str,
                engine_args: tuple[str, ...], python: str | None, timeout_s: float, json_path: Path | None,
                strict: bool, launch: bool, launch_file: Path | None, command: tuple[str, ...]) -> None:
    """Which target layers the engine (SGLang or vLLM) will feed the drafter's fc, and why. No contract needed.

    Exit 0 resolved; 1 the engine refuses the deployment or would not serve what its draft config says (an error
    note, or an error in the launch command), or --strict and a warning; 2 bad input; 3 the answer could not be
    computed here (environment, or a fallback without a reason).
    """
    import json

    from specparity import cli_command
    from specparity.deployed import check_deployed_files, check_family_algorithm
    from specparity.engine_args import parse_engine_args
    from specparity.gate_live import launch_env
    from specparity.report.writing import ReportFile, check_report_path, write_files
    from specparity.serving.engine import get_engine

    if json_path is not None:
        check_report_path(json_path, option="--json")  # before any engine starts
    spec = cli_command.launch_spec(launch, command, launch_file, python=python, timeout_s=timeout_s)
    target, draft, engine, launched = cli_command.deployment(spec, target, draft, engine)
    _check_model_dirs(target, draft)
    check_deployed_files(target, draft)  # swapped dirs, a broken weight file: exit 2 before the engine
    args = {**launched, **parse_engine_args(deployed_args), **parse_engine_args(engine_args, field="--engine-arg")}
    check_family_algorithm(draft, args)  # a DFlash drafter under an EAGLE algorithm (or the reverse): exit 3
    python = cli_command.interpreter(spec, python)
    with launch_env(spec):  # the command's own environment reaches the engine's child
        result = get_engine(engine).explain(target, draft, args=args, python=python, timeout_s=timeout_s)
    found = cli_command.explain_findings(spec, result.data, engine=engine, draft=draft, python=python)
    code, summary = cli_command.explain_exit(result.exit_code, result.summary, found, result.data, strict=strict)
    click.echo(summary)
    for line in [*result.lines, *(spec.lines() if spec else []),
                 *(f"{f.severity.value:<8} {f.kind.value}: {f.message}" for f in found)]:
        click.echo(f"  {line}")
    if json_path is not None:  # whole or not at all (report/writing.py)
        write_files([ReportFile("--json answer", json_path, json.dumps(
            {"exit_code": code, "summary": summary, **result.data, "launch": spec.to_dict() if spec else None,
             "findings": [f.to_dict() for f in found]}, indent=2) + "\n")])
    sys.exit(code)


@main.command("launch-flags")
@click.option("--engine", type=click.Choice(list(ENGINES)), required=True, help="The server's engine.")
@click.option("--evidence-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="SGLang: the directory the hooks write into (created 0700 if absent, with the marker an attaching "
                   "gate requires before it writes there).")
@click.option("--cpu", is_flag=True, default=False,
              help="SGLang on a CPU (no sgl_kernel CPU build): also the CPU stand-ins' env and --skip-server-warmup.")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print flags, env and notes as JSON.")
def launch_flags(engine: str, evidence_dir: Path | None, cpu: bool, as_json: bool) -> None:
    """What to add to a staging or canary server's command so that `specparity gate --server URL` can capture the
    fc input from it. The hooks record nothing until the gate arms them."""
    import json
    import shlex

    from specparity.serving.engine import get_engine

    eng = get_engine(engine)
    flags, env, notes = eng.launch_flags()
    if evidence_dir is not None and engine == "sglang":
        from specparity.serving.sglang.engine import SKIP_WARMUP
        from specparity.serving.sglang.live import hook_switches, mark_evidence_dir

        mark_evidence_dir(evidence_dir)  # 0700, with the marker an attaching gate checks before it writes there
        flags, env = hook_switches(evidence_dir.resolve(), cpu_stand_ins=cpu)
        flags += [SKIP_WARMUP] if cpu else []
        notes = [*notes, f"{evidence_dir.resolve()} carries specparity's marker for this user: `specparity gate "
                         "--server URL` writes there only while it does"]
    if as_json:
        click.echo(json.dumps({"engine": engine, "flags": flags, "env": env, "notes": notes}, indent=2))
        return
    click.echo(" ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), "<your command>",
                         *(shlex.quote(f) for f in flags)]))
    for n in notes:
        click.echo(f"  note: {n}")


@main.command("versions")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print the tables as JSON.")
def versions(as_json: bool) -> None:
    """The SGLang and vLLM versions specparity supports: range, adapter and the CI env that tests it."""
    import json

    from specparity.serving.engine import get_engine

    engines = [get_engine(name) for name in ENGINES]
    if as_json:
        click.echo(json.dumps([row for e in engines for row in e.versions()], indent=2))
        return
    click.echo("\n\n".join("\n".join(e.versions_lines()) for e in engines))


def _check_model_dirs(target: Path, draft: Path) -> None:
    """Bad input before any engine starts: each of --target and --draft must be a model directory."""
    for role, p in (("--target", target), ("--draft", draft)):
        if not (p / "config.json").is_file():
            raise InputError("not a model directory (no config.json)", path=p, field=role)


def run() -> None:  # pragma: no cover - console entry for `python -m specparity`
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    main()
