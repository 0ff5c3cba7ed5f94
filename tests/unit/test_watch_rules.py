"""specparity alert-rules: every generated file passes ``promtool check rules`` (Debian's prometheus 2.42),
and ``promtool test rules`` runs it on synthetic series of each engine release's own metric names: a healthy series
stays quiet, an idle one too, a collapse and a slow drift each fire, a server without the metrics is named, and a
band calibrated under out-of-domain prompts keeps the healthy server quiet while the seed's wiring fires.

The alert's ``$value`` is checked to three decimals against the watcher's own Python (WindowAcceptance): PromQL and
``specparity watch`` compute the same bound."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from specparity.watch.band import Band, Baseline, ContractFigures
from specparity.watch.engines import MetricSet, metric_set
from specparity.watch.rules import ABSENT, ALERT, build_rules, dashboard, dashboard_exprs, rules_text, to_yaml
from specparity.watch.window import WindowAcceptance

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "contracts" / "smollm2-135m-eagle3.json"
RELEASES = [("vllm", None), ("vllm", "0.32.0"), ("sglang", None), ("sglang", "0.5.14"), ("sglang", "0.5.10"),
            ("sglang", "0.5.3")]
RANGE, FOR = "5m", "10m"
K = 3
INSTANCE = "10.0.0.1:8000"


def _promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is required in CI (apt-get install -y prometheus; .ci/run installs it)")
        pytest.skip("promtool is not installed (apt-get install -y prometheus); in CI (CI set) this fails")
    return exe


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_promtool(), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.fixture(scope="module")
def figures() -> ContractFigures:
    return ContractFigures.load(CONTRACT)


@pytest.mark.parametrize(("engine", "release"), RELEASES)
def test_promtool_checks_every_generated_file(engine: str, release: str | None, tmp_path: Path) -> None:
    """Through the command as a user runs it; the dashboard's queries are checked by promtool's own parser too."""
    out = tmp_path / "rules.yml"
    args = ["alert-rules", "--contract", str(CONTRACT), "--engine", engine, "-o", str(out), "--selector",
            'job="serving"']
    if release:
        args += ["--release", release]
    run = subprocess.run([sys.executable, "-m", "specparity.cli", *args], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    dash = tmp_path / "rules.grafana.json"
    assert out.is_file() and dash.is_file()
    check = _run("check", "rules", str(out))
    assert check.returncode == 0 and "SUCCESS" in check.stdout, check.stdout + check.stderr
    board = json.loads(dash.read_text())
    titles = [p["title"] for p in board["panels"]]
    assert titles[0].startswith("Acceptance per draft position" if engine == "vllm" else "Acceptance rate")
    assert any("Drafts per second" in t for t in titles) and any("tokens per second" in t for t in titles)
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    wrapped = tmp_path / "dashboard-queries.yml"
    wrapped.write_text(to_yaml({"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query:{i}", "expr": e} for i, e in enumerate(exprs)]}]}) + "\n")
    check = _run("check", "rules", str(wrapped))
    assert check.returncode == 0, check.stdout + check.stderr


def test_an_unknown_release_and_a_bad_duration_are_exit_2(tmp_path: Path) -> None:
    for extra, says in ((["--release", "0.6.3"], "known: vLLM >= 0.32"),
                        (["--range", "five minutes"], "not a Prometheus duration")):
        run = subprocess.run([sys.executable, "-m", "specparity.cli", "alert-rules", "--contract", str(CONTRACT),
                              "--engine", "vllm", "-o", str(tmp_path / "r.yml"), *extra], capture_output=True,
                             text=True, timeout=120, cwd=ROOT)
        assert run.returncode == 2 and says in run.stderr, run.stderr
    assert not (tmp_path / "r.yml").exists()


# --- promtool test rules ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Phase:
    minutes: int
    drafts: float  # verify steps per minute
    rate: float  # accepted / proposed draft tokens


def _per_minute(phases: Sequence[Phase]) -> list[tuple[float, float]]:
    """(drafts, accepted) per minute; a drift is a phase whose rate is interpolated from the previous one."""
    out = []
    for p in phases:
        out += [(p.drafts, p.drafts * K * p.rate)] * p.minutes
    return out


def _drift(start: float, end: float, minutes: int, drafts: float) -> list[tuple[float, float]]:
    return [(drafts, drafts * K * (start + (end - start) * (i + 1) / minutes)) for i in range(minutes)]


def _cumulative(steps: Sequence[float]) -> str:
    total, values = 0.0, ["0"]
    for s in steps:
        total += s
        values.append(f"{total:.6g}")
    return " ".join(values)


def _series(metrics: MetricSet, minutes: list[tuple[float, float]], *, gauge: list[float] | None = None) -> list[dict]:  # type: ignore[type-arg]
    """input_series in each release's own names and label sets (vLLM: model_name, engine, position; SGLang:
    model_name, engine_type, tp_rank, pp_rank, moe_ep_rank, is_streaming on its token counter)."""
    where = f'job="serving", instance="{INSTANCE}"'
    drafts = [d for d, _ in minutes]
    accepted = [a for _, a in minutes]
    if metrics.engine == "vllm":
        lab = f'{{{where}, model_name="smol", engine="0"}}'
        rows = [(metrics.drafts, drafts), (metrics.draft_tokens, [d * K for d in drafts]),
                (metrics.accepted, accepted), (metrics.generation_tokens, [d + a for d, a in minutes])]
        series = [{"series": f"{n}{lab}", "values": _cumulative(v)} for n, v in rows]
        # accepted through position j: a geometric split of each minute's accepted tokens (shape only)
        for j, share in enumerate((0.55, 0.3, 0.15)):
            series.append({"series": f'{metrics.accepted_per_pos}{{{where}, model_name="smol", engine="0", '
                                     f'position="{j}"}}', "values": _cumulative([a * share for a in accepted])})
        return series
    lab = f'{where}, model_name="smol", engine_type="unified", tp_rank="0", pp_rank="0", moe_ep_rank="0"'
    series = [{"series": f'{metrics.generation_tokens}{{{lab}, is_streaming="false"}}',
               "values": _cumulative([d + a for d, a in minutes])}]
    if metrics.verify_calls:
        series.append({"series": f"{metrics.verify_calls}{{{lab}}}", "values": _cumulative(drafts)})
    if gauge is not None and metrics.accept_length_gauge:
        series.append({"series": f"{metrics.accept_length_gauge}{{{lab}}}",
                       "values": " ".join(f"{g:.6g}" for g in [gauge[0], *gauge])})
    return series


def _expected_value(metrics: MetricSet, last5: list[tuple[float, float]], gauge: float | None) -> str:
    """What watch computes for the same five minutes: the upper 95% bound of pooled acceptance length."""
    if metrics.source == "gauge":
        return f"{gauge:.3f}"
    d = sum(x for x, _ in last5)
    a = sum(y for _, y in last5)
    w = WindowAcceptance(300.0, "counters", drafts=d, draft_tokens=d * K, accepted=a)
    assert w.length_interval is not None
    return f"{w.length_interval.high:.3f}"


def _alert(band: Band, metrics: MetricSet, value: str) -> dict:  # type: ignore[type-arg]
    rules = build_rules(band, metrics, rng=RANGE, for_=FOR)["groups"][0]["rules"]
    annotations = next(r for r in rules if r.get("alert") == ALERT)["annotations"]
    expand = {k: v.replace("{{ $labels.instance }}", INSTANCE).replace('{{ $value | printf "%.3f" }}', value)
              for k, v in annotations.items()}
    labels = {"severity": "page", "contract": band.contract.name, "engine": metrics.engine, "job": "serving",
              "instance": INSTANCE}
    return {"exp_labels": labels, "exp_annotations": expand}


def _promtool_test(tmp: Path, band: Band, metrics: MetricSet, cases: list[dict]) -> None:  # type: ignore[type-arg]
    rules = tmp / "rules.yml"
    rules.write_text(rules_text(build_rules(band, metrics, rng=RANGE, for_=FOR), header="under test"))
    spec = {"rule_files": [rules.name], "evaluation_interval": "1m", "tests": cases}
    (tmp / "tests.yml").write_text(to_yaml(spec) + "\n")
    run = _run("test", "rules", "tests.yml", cwd=tmp)
    assert run.returncode == 0, run.stdout + run.stderr


def _case(metrics: MetricSet, band: Band, minutes: list[tuple[float, float]], *, quiet_at: Sequence[int],
          fires_at: Sequence[int] = (), gauge: list[float] | None = None) -> dict:  # type: ignore[type-arg]
    tests = [{"eval_time": f"{m}m", "alertname": ALERT, "exp_alerts": []} for m in quiet_at]
    for m in fires_at:
        value = _expected_value(metrics, minutes[m - 5:m], gauge[m - 1] if gauge else None)
        tests.append({"eval_time": f"{m}m", "alertname": ALERT, "exp_alerts": [_alert(band, metrics, value)]})
    tests.append({"eval_time": f"{len(minutes)}m", "alertname": ABSENT, "exp_alerts": []})
    return {"interval": "1m", "input_series": _series(metrics, minutes, gauge=gauge), "alert_rule_test": tests}


HEALTHY, COLLAPSED = 0.318, 0.05  # pooled acceptance rates: vLLM's loop in-domain, and a collapse


@pytest.mark.parametrize(("engine", "release"), [r for r in RELEASES if r != ("vllm", "0.32.0")])
def test_promtool_healthy_quiet_collapse_and_drift_fire(engine: str, release: str | None, figures: ContractFigures,
                                                        tmp_path: Path) -> None:
    metrics = metric_set(engine, release)
    band = Band(figures)  # uncalibrated: floor 1.718
    healthy = _per_minute([Phase(60, 300, HEALTHY)])
    collapse = _per_minute([Phase(30, 300, HEALTHY), Phase(40, 300, COLLAPSED)])
    drift = _per_minute([Phase(10, 300, HEALTHY)]) + _drift(HEALTHY, 0.10, 50, 300) + \
        _per_minute([Phase(30, 300, 0.10)])
    idle = _per_minute([Phase(10, 300, HEALTHY), Phase(40, 0, 0.0)])

    def gauge_of(minutes: list[tuple[float, float]]) -> list[float] | None:
        # SGLang's own windowed gauge: the last interval's acceptance length (kept when idle)
        if metrics.source != "gauge":
            return None
        out, last = [], 1.0
        for d, a in minutes:
            last = 1 + a / d if d else last
            out.append(last)
        return out

    cases = [
        _case(metrics, band, healthy, quiet_at=(10, 30, 60), gauge=gauge_of(healthy)),
        _case(metrics, band, collapse, quiet_at=(20, 31), fires_at=(60, 70), gauge=gauge_of(collapse)),
        # the drift crosses the floor near minute 28 (rate 0.22); with the 5m range and 10m for, quiet before 35
        _case(metrics, band, drift, quiet_at=(20, 30), fires_at=(80, 90), gauge=gauge_of(drift)),
        _case(metrics, band, idle, quiet_at=(20, 50), gauge=gauge_of(idle)),
    ]
    absent = {"interval": "1m", "input_series": [{"series": 'up{job="serving"}', "values": "1x30"}],
              "alert_rule_test": [{"eval_time": "20m", "alertname": ABSENT, "exp_alerts": [{"exp_labels": {
                  "severity": "warning", "contract": band.contract.name, "engine": metrics.engine},
                  "exp_annotations": next(r for r in build_rules(band, metrics, rng=RANGE, for_=FOR)["groups"][0][
                      "rules"] if r.get("alert") == ABSENT)["annotations"]}]}]}
    _promtool_test(tmp_path, band, metrics, [*cases, absent])


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_promtool_a_calibrated_band_keeps_out_of_domain_quiet_and_the_seed_fires(
        engine: str, figures: ContractFigures, tmp_path: Path) -> None:
    """vLLM's loop under chat prompts unlike the training prompts: healthy 1.19, the seed's wiring 1.07 (test_watch.py
    MEASURED). The baseline is the healthy server's own; the seed's wiring arrives after calibration."""
    metrics = metric_set(engine)
    healthy_ood, seed_ood = 211 / 3366, 86 / 3720
    base = Baseline.from_window(WindowAcceptance(300, "counters", drafts=1122, draft_tokens=3366, accepted=211,
                                                 per_position_accepted=(183, 24, 4)),
                                contract=figures, engine=engine, metrics=metrics.label, server="s")
    band = Band(figures, base)
    assert band.floor_length == pytest.approx(1 + 0.6 * 211 / 1122, abs=1e-4)
    quiet = _per_minute([Phase(60, 300, healthy_ood)])
    seed = _per_minute([Phase(20, 300, healthy_ood), Phase(40, 300, seed_ood)])
    _promtool_test(tmp_path, band, metrics, [
        _case(metrics, band, quiet, quiet_at=(10, 30, 60)),
        _case(metrics, band, seed, quiet_at=(15,), fires_at=(50, 60)),
    ])


def test_the_dashboard_names_the_recorded_series(figures: ContractFigures) -> None:
    d = dashboard(Band(figures), metric_set("vllm"))
    exprs = dashboard_exprs(d)
    assert any("acceptance_per_position:pooled5m" in e for e in exprs)
    assert any(":floor" in e for e in exprs) and any(":contract" in e for e in exprs)
    assert d["templating"]["list"][0]["type"] == "datasource"
