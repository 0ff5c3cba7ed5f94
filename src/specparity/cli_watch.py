"""``specparity watch`` (live acceptance against the contract's band: a live table, a canary, a calibration) and
``specparity alert-rules`` (the same band as Prometheus rules and a Grafana dashboard). docs/watch.md is the page."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from specparity.errors import EXIT_ENVIRONMENT, EXIT_PARITY_FAILURE, EXIT_PASS, EnvironmentProblem, InputError
from specparity.intervals import FLOOR_RATIO
from specparity.watch.band import MIN_CALIBRATION_DRAFTS
from specparity.watch.engines import ENGINES


def _band(contract_path: Path, baseline: Path | None, floor_ratio: float, *, use_baseline: bool = True) -> Any:
    """The band of ``contract_path``, with its baseline (``baseline``, else the one beside the contract, if present)
    unless ``use_baseline`` is off (``--calibrate`` takes a new one: ``baseline`` is then where it goes)."""
    from specparity.watch.band import Band, Baseline, ContractFigures, baseline_path

    if not 0.0 < floor_ratio < 1.0:
        raise InputError(f"{floor_ratio:g} is not a fraction between 0 and 1", field="--floor-ratio")
    figures = ContractFigures.load(contract_path)
    path = baseline or baseline_path(contract_path)
    if use_baseline and baseline is not None and not baseline.is_file():
        raise InputError("no such baseline (specparity watch --calibrate writes it)", path=baseline,
                         field="--baseline")
    loaded = Baseline.load(path, figures) if use_baseline and path.is_file() else None
    return Band(figures, loaded, floor_ratio)


@click.command("watch")
@click.option("--server", required=True, metavar="URL", help="The running server (vLLM or SGLang) to watch.")
@click.option("--contract", "contract_path", required=True, type=click.Path(path_type=Path),
              help="The contract whose recorded acceptance is the band's ceiling.")
@click.option("--api-key", "api_key", envvar="SPECPARITY_API_KEY", default=None, metavar="KEY",
              help="The server's API key (or SPECPARITY_API_KEY); sent as a Bearer header, never printed.")
@click.option("--engine", type=click.Choice(list(ENGINES)), default=None,
              help="The server's engine (default: read from its metric names).")
@click.option("--window", "window_s", type=float, default=60.0, show_default=True,
              help="Seconds of the sliding window each verdict is pooled over.")
@click.option("--interval", "interval_s", type=float, default=10.0, show_default=True,
              help="Seconds between two reads of /metrics (one window each).")
@click.option("--windows", type=int, default=3, show_default=True,
              help="Consecutive windows below the floor that make an alert (exit 1 with --once).")
@click.option("--once", is_flag=True, default=False, help="A canary: watch for --duration, then exit 0, 1 or 3.")
@click.option("--duration", "duration_s", type=float, default=None,
              help="Seconds to watch (needed by --once and --calibrate; without it, watch until interrupted).")
@click.option("--json", "as_json", is_flag=True, default=False, help="One JSON line per window on stdout.")
@click.option("--calibrate", is_flag=True, default=False,
              help="Take the baseline from this server for --duration (right after the gate passed) and store it "
                   "beside the contract.")
@click.option("--baseline", "baseline", type=click.Path(path_type=Path), default=None,
              help="The baseline file (default: <contract>.watch-baseline.json beside the contract, if present).")
@click.option("--floor-ratio", type=float, default=FLOOR_RATIO, show_default=True,
              help="The floor as a fraction of what the drafter adds at the reference: 1 + ratio x (reference - 1).")
@click.option("--load", "load_path", type=click.Path(path_type=Path), default=None,
              help="JSON lines of chat prompts to send, one request at a time, while watching (a canary's own "
                   "bounded load; its answers give the per-request mean).")
@click.option("--max-tokens", type=int, default=64, show_default=True, help="max_tokens of each --load request.")
def watch(server: str, contract_path: Path, api_key: str | None, engine: str | None, window_s: float,
          interval_s: float, windows: int, once: bool, duration_s: float | None, as_json: bool, calibrate: bool,
          baseline: Path | None, floor_ratio: float, load_path: Path | None, max_tokens: int) -> None:
    """Watch a running server's speculative acceptance against the contract's band.

    \b
    Polls the engine's own counters (vLLM's vllm:spec_decode_*, SGLang's --enable-metrics), pools acceptance over
    a sliding window with 95% Wilson intervals, and judges each window: inside, below (its upper bound under the
    floor) or idle (no drafts: never "acceptance 0"). Both acceptance definitions are shown by name; the verdict
    uses the pooled one.

    \b
    Exit codes (--once):
      0  inside the band
      1  below the floor for --windows consecutive windows
      2  bad input (a contract without recorded acceptance, a bad baseline or prompt file, bad options)
      3  the server cannot be read, its metrics carry no speculative decoding (named, with the flag), or no
         speculative traffic came during --duration (nothing to judge)
    """
    from specparity.serving.live.server import ServerClient
    from specparity.watch import view
    from specparity.watch.load import PromptLoad, read_prompts
    from specparity.watch.watcher import Watcher

    if interval_s <= 0 or window_s < interval_s:
        raise InputError(f"--interval {interval_s:g} must be > 0 and at most --window {window_s:g}",
                         field="--interval")
    if windows < 1:
        raise InputError("--windows must be at least 1", field="--windows")
    if (once or calibrate) and (duration_s is None or duration_s < interval_s):
        raise InputError("--once and --calibrate need --duration S, at least one --interval", field="--duration")
    if once and calibrate:
        raise InputError("give --once or --calibrate, not both", field="--calibrate")
    band = _band(contract_path, baseline, floor_ratio, use_baseline=not calibrate)
    prompts = read_prompts(load_path) if load_path is not None else None
    with ServerClient(server, api_key=api_key, timeout_s=max(30.0, interval_s * 3)) as client:
        watcher = Watcher(client, band, engine=engine, window_s=window_s, interval_s=interval_s, windows=windows)
        load = None
        live: Any = None
        try:
            watcher.poll()  # the first read: unreachable (3) or no speculative metrics (3) before anything is sent
            if prompts is not None:  # its own connection: a request may take far longer than a read of /metrics
                load = watcher.load = PromptLoad(ServerClient(server, api_key=api_key, timeout_s=600.0), prompts,
                                                 engine=watcher.engine or engine or "vllm", model=_model(client),
                                                 max_tokens=max_tokens)
                load.start()
            if not as_json and sys.stdout.isatty() and not calibrate:
                from rich.live import Live

                live = Live(auto_refresh=False, transient=False)
                live.start()

            def on_window(r: Any) -> None:
                if as_json:
                    click.echo(view.json_line(r, watcher))
                elif live is not None:
                    live.update(view.table(r, watcher), refresh=True)
                else:
                    click.echo(view.plain_line(r, watcher))

            watcher.run(duration_s=duration_s, on_window=on_window, first_done=True)
        finally:
            if live is not None:
                live.stop()
            if load is not None:
                load.stop()
    if calibrate:
        _store_baseline(watcher, band, contract_path, baseline, server, as_json=as_json)
        return
    judged = watcher.counts["inside"] + watcher.counts["below"]
    code = EXIT_PARITY_FAILURE if watcher.alerted else EXIT_PASS if judged else EXIT_ENVIRONMENT
    s = view.summary(watcher, code=code, duration_s=float(duration_s or 0))
    if as_json:
        import json

        click.echo(json.dumps(s, sort_keys=True))
    else:
        for line in view.summary_lines(s):
            click.echo(line)
    if code == EXIT_ENVIRONMENT:
        click.echo(f"specparity: error: no speculative traffic reached {server} in {duration_s:g} s, so there is "
                   "nothing to judge (an idle server is not a healthy one): send traffic, or --load FILE", err=True)
    sys.exit(code)


def _model(client: Any) -> str:
    from specparity.serving.live.server import ServerError

    try:
        data = client.get_json("/v1/models").get("data") or []
    except ServerError as e:
        raise EnvironmentProblem(f"--load needs the served model's name: {e}") from None
    if not data:
        raise EnvironmentProblem(f"{client.url}/v1/models lists no model to send --load to")
    return str(data[0]["id"])


def _store_baseline(watcher: Any, band: Any, contract_path: Path, baseline: Path | None, server: str, *,
                    as_json: bool) -> None:
    import json

    from specparity.watch.band import Baseline, baseline_path, calibration_notes

    total = watcher.total()
    drafts = 0.0 if total is None else total.drafts
    if total is None or total.idle or drafts < MIN_CALIBRATION_DRAFTS:
        raise EnvironmentProblem(f"not enough speculative traffic to calibrate on {server}: {drafts:.0f} drafts, "
                                 f"at least {MIN_CALIBRATION_DRAFTS} are needed; watch longer (--duration), or send "
                                 "a load (--load FILE)")
    b = Baseline.from_window(total, contract=band.contract, engine=watcher.engine or "",
                             metrics=watcher.metrics.label if watcher.metrics else "", server=server)
    path = b.save(baseline or baseline_path(contract_path))
    notes = calibration_notes(b, band)
    if as_json:
        click.echo(json.dumps({"baseline": str(path), **b.to_dict(), "notes": notes}, sort_keys=True))
        return
    from specparity.watch.band import Band

    floor = Band(band.contract, b, band.floor_ratio).floor_length
    click.echo(f"specparity watch: baseline written to {path}: acceptance length {b.acceptance_length:.3f} pooled over "
               f"{b.drafts:.0f} drafts in {b.seconds:.0f} s"
               + (f" (per-request mean {b.per_request_mean:.3f}, {b.requests} requests)" if b.per_request_mean else "")
               + f"; floor {floor:.3f}; contract {band.ceiling_length:.3f}")
    for n in notes:
        click.echo(f"  note: {n}")


@click.command("alert-rules")
@click.option("--contract", "contract_path", required=True, type=click.Path(path_type=Path),
              help="The contract whose band the rules carry (its baseline beside it, if calibrated).")
@click.option("--engine", type=click.Choice(list(ENGINES)), required=True, help="The servers' engine.")
@click.option("--release", default=None, help="The engine release, for its own metric names (default: the newest).")
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path),
              help="The Prometheus rules file to write (YAML).")
@click.option("--dashboard", "dashboard_path", type=click.Path(path_type=Path), default=None,
              help="The Grafana dashboard JSON (default: <output stem>.grafana.json).")
@click.option("--range", "rng", default="5m", show_default=True, help="The window each rate is pooled over.")
@click.option("--for", "for_", default="10m", show_default=True, help="How long below the floor before it fires.")
@click.option("--selector", default="", help='Label matchers for the servers, e.g. \'job="vllm-prod"\'.')
@click.option("--by", "by", default="job,instance", show_default=True, help="Labels a series is kept apart by.")
@click.option("--baseline", "baseline", type=click.Path(path_type=Path), default=None,
              help="The baseline file (default: <contract>.watch-baseline.json beside the contract, if present).")
@click.option("--floor-ratio", type=float, default=FLOOR_RATIO, show_default=True, help="As for watch.")
def alert_rules(contract_path: Path, engine: str, release: str | None, output: Path, dashboard_path: Path | None,
                rng: str, for_: str, selector: str, by: str, baseline: Path | None, floor_ratio: float) -> None:
    """Write Prometheus recording and alerting rules for the contract's band, and a Grafana dashboard.

    The PromQL uses the engine release's own metric names and computes what `specparity watch` computes: pooled
    acceptance (per position on vLLM), its 95% Wilson upper bound, the band's floor; the alert fires when the bound
    stays under the floor for --for. Check the file with `promtool check rules`.
    """
    from specparity.watch import rules
    from specparity.watch.engines import metric_set

    try:
        metrics = metric_set(engine, release)
        rules.check_duration(rng, "--range")
        rules.check_duration(for_, "--for")
    except ValueError as e:
        raise InputError(str(e), field="--release" if "release" in str(e) else "--range/--for") from None
    band = _band(contract_path, baseline, floor_ratio)
    groups = [s.strip() for s in by.split(",") if s.strip()]
    content = rules.build_rules(band, metrics, rng=rng, for_=for_, by=groups, selector=selector)
    header = (f"specparity alert-rules: contract '{band.contract.name}' on {metrics.label} ({metrics.cite}).\n"
              f"Band: floor {band.floor_length:.3f} = 1 + {band.floor_ratio:g} x (reference {band.reference_length:.3f}"
              f" - 1), reference: {band.reference_name}; contract {band.ceiling_length:.3f}.\n"
              "Check with: promtool check rules <this file>. docs/watch.md explains each rule.")
    dash = dashboard_path or output.with_name(output.name.split(".")[0] + ".grafana.json")
    for p in (output, dash):
        if p.parent and not p.parent.is_dir():
            raise InputError("the folder does not exist", path=p.parent, field="--output")
    output.write_text(rules.rules_text(content, header=header))
    dash.write_text(rules.dashboard_text(rules.dashboard(band, metrics, rng=rng)))
    click.echo(f"specparity alert-rules: {output} ({len(content['groups'][0]['rules'])} rules) and {dash}; "
               f"{metrics.label}; floor {band.floor_length:.3f} ({band.reference_name})")
