"""What a person or a log pipeline sees of each window: a live rich table with a sparkline, a plain line, or one JSON
line; and the canary's closing summary. Every face shows both acceptance definitions by name, and the verdict on
the pooled one."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from specparity.watch.band import BELOW, IDLE
from specparity.watch.watcher import Watcher, WindowResult
from specparity.watch.window import PER_REQUEST, POOLED, WindowAcceptance

BLOCKS = "▁▂▃▄▅▆▇█"
STYLE = {"inside": "green", "below": "bold red", "idle": "dim"}


def sparkline(values: Iterable[float | None], *, low: float, high: float) -> str:
    """One block per window between ``low`` and ``high``; an idle window is ``·``."""
    span = max(high - low, 1e-9)
    out = []
    for v in values:
        if v is None:
            out.append("·")
            continue
        i = int((min(max(v, low), high) - low) / span * (len(BLOCKS) - 1) + 0.5)
        out.append(BLOCKS[i])
    return "".join(out)


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _iv(pair: Sequence[float] | None, digits: int = 3) -> str:
    return "-" if not pair else f"[{pair[0]:.{digits}f}, {pair[1]:.{digits}f}]"


def record(result: WindowResult, watcher: Watcher) -> dict[str, Any]:
    """The JSON line of one window (docs/watch.md lists its keys)."""
    m = watcher.metrics
    return {"time": datetime.fromtimestamp(result.wall_time, timezone.utc).isoformat(timespec="seconds"),
            "window": result.index, "server": watcher.source.url, "engine": watcher.engine,
            "metrics": None if m is None else {"release": m.label, "source": m.source},
            "waiting": watcher.waiting, "state": result.state, "below_streak": result.streak,
            "alert": result.alert, "windows_to_alert": watcher.windows,
            "acceptance": result.acceptance.to_dict(), "band": watcher.band.to_dict()}


def json_line(result: WindowResult, watcher: Watcher) -> str:
    return json.dumps(record(result, watcher), sort_keys=True)


def plain_line(result: WindowResult, watcher: Watcher) -> str:
    """One line per window, for a log that is not a terminal."""
    w, band = result.acceptance, watcher.band
    li = w.length_interval
    head = f"window {result.index:>4}  {result.state:<6}"
    if result.state == IDLE:
        why = f" ({watcher.waiting})" if watcher.waiting else ""
        return f"{head}  no speculative traffic in {w.seconds:.0f} s{why}"
    gauge = "  (SGLang's own windowed gauge, no interval)" if w.source == "gauge" else ""
    per_req = f"  per-request mean {w.per_request_mean:.3f} ({len(w.per_request)} req)" if w.per_request else ""
    alert = f"  ALERT: below for {result.streak} windows" if result.alert else ""
    return (f"{head}  acceptance length {_f(w.length)} {_iv(li.to_list() if li else None)} pooled"
            f"  floor {band.floor_length:.3f}  drafts {w.drafts:.0f}/{w.seconds:.0f} s{per_req}{gauge}{alert}")


def table(result: WindowResult, watcher: Watcher) -> Any:
    """The live table: expected, observed, interval, window and verdict per row, with the sparkline."""
    from rich.table import Table

    w, band = result.acceptance, watcher.band
    title = (f"specparity watch {watcher.source.url} · contract {band.contract.name} · "
             f"{watcher.metrics.label if watcher.metrics else watcher.engine or '?'} · window {result.index}")
    t = Table(title=title, caption=_caption(result, watcher), show_lines=False)
    for col in ("", "contract (ceiling)", "reference", "floor", "observed (pooled)", "95% interval", "state"):
        t.add_column(col, justify="left" if not col else "right")
    style = STYLE.get(result.state, "")
    li = w.length_interval
    t.add_row("acceptance length", _f(band.ceiling_length), _f(band.reference_length), _f(band.floor_length),
              _f(w.length), _iv(li.to_list() if li else None), f"[{style}]{result.state}[/]")
    pp, ppi = w.per_position, w.per_position_interval
    ref_pp, floor_pp = band.reference_per_position, band.floor_per_position
    for j, ceiling in enumerate(band.contract.per_position):
        obs = pp[j] if j < len(pp) else None
        low_mark = "" if obs is None or j >= len(floor_pp) or ppi[j].high >= floor_pp[j] else "[red]low[/]"
        t.add_row(f"  position {j + 1}", _f(ceiling), _f(ref_pp[j] if j < len(ref_pp) else None),
                  _f(floor_pp[j] if j < len(floor_pp) else None), _f(obs),
                  _iv(ppi[j].to_list() if j < len(ppi) else None), low_mark)
    t.add_row("length, per-request mean", "", "", "", _f(w.per_request_mean),
              f"{len(w.per_request)} requests" if w.per_request else "needs --load", "not judged")
    low = min([band.floor_length - 0.2, *(v for v in watcher.lengths if v is not None)])
    high = max([band.ceiling_length, *(v for v in watcher.lengths if v is not None)])
    t.add_row("last windows", "", "", "", sparkline(watcher.lengths, low=max(1.0, low), high=high), "", "")
    return t


def _caption(result: WindowResult, watcher: Watcher) -> str:
    w, band = result.acceptance, watcher.band
    parts = [f"window {w.seconds:.0f} s, {w.drafts:.0f} drafts, {w.generated_tokens / max(w.seconds, 1e-9):.1f} tok/s",
             f"verdict on acceptance {POOLED}; also shown: {PER_REQUEST}"
             + ("" if w.per_request else " (needs single requests' figures: --load)"),
             f"reference: {band.reference_name}; floor = 1 + {band.floor_ratio:g} x (reference - 1)"]
    if w.source == "gauge":
        parts.append("SGLang before 0.5.14: its own windowed gauge sglang:spec_accept_length, no interval")
    if watcher.waiting:
        parts.append(watcher.waiting)
    if result.state == BELOW:
        parts.append(f"below for {result.streak} of {watcher.windows} windows"
                     + (": ALERT" if result.alert else ""))
    return "\n".join(parts)


def summary(watcher: Watcher, *, code: int, duration_s: float) -> dict[str, Any]:
    """The canary's closing record: the whole run pooled, windows by state, the exit code and why."""
    total: WindowAcceptance | None = watcher.total()
    why = {0: "inside the band", 1: f"below the band for {watcher.windows} consecutive windows",
           3: "no speculative traffic: nothing to judge"}[code]
    return {"summary": True, "server": watcher.source.url, "engine": watcher.engine, "duration_s": duration_s,
            "exit_code": code, "verdict": why, "windows": dict(watcher.counts),
            "acceptance": None if total is None else total.to_dict(), "band": watcher.band.to_dict(),
            "load": None if watcher.load is None else {"sent": watcher.load.sent, "errors": watcher.load.errors,
                                                       "last_error": watcher.load.last_error}}


def summary_lines(s: dict[str, Any]) -> list[str]:
    acc = s.get("acceptance") or {}
    pooled, per_req = acc.get("pooled") or {}, acc.get("per_request_mean") or {}
    band = s["band"]
    lines = [f"specparity watch: {s['verdict']} (exit {s['exit_code']}) on {s['server']} over {s['duration_s']:g} s; "
             f"windows {s['windows']}",
             f"  acceptance length, {pooled.get('definition', POOLED)}: {_f(pooled.get('acceptance_length'))} "
             f"{_iv(pooled.get('acceptance_length_interval95'))}",
             f"  acceptance length, {PER_REQUEST}: {_f(per_req.get('acceptance_length'))}"
             f" ({per_req.get('requests', 0)} requests)",
             f"  band: floor {band['floor_length']:.3f} = 1 + {band['floor_ratio']:g} x ({band['reference_length']:.3f}"
             f" - 1), reference {band['reference']}; contract {band['ceiling_length']:.3f}"]
    if pooled.get("per_position"):
        lines.append("  per position (pooled): " + ", ".join(_f(a) for a in pooled["per_position"])
                     + "; floor " + ", ".join(_f(a) for a in band["floor_per_position"]))
    load = s.get("load")
    if load:
        lines.append(f"  load: {load['sent']} requests sent, {load['errors']} failed"
                     + (f" (last: {load['last_error']})" if load["last_error"] else ""))
    return lines
