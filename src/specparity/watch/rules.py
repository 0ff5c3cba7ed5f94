"""Prometheus recording and alerting rules, and a Grafana dashboard, for one contract's band on one engine release.

The PromQL computes what ``watch`` computes, from the same counters (:mod:`~specparity.watch.engines`):

- pooled acceptance rate Σaccepted / Σproposed and length 1 + Σaccepted / Σdrafts over ``[range]``, per
  ``by`` labels (default ``job, instance``: one series per server); vLLM also per draft position;
- the upper end of the rate's 95% Wilson interval, written out in PromQL, mapped to length;
- the alert ``SpecparityAcceptanceBelowBand``: that upper end under the band's floor ``for`` a duration. A window
  with no drafts divides by zero, gives no sample, and so resets the alert: idle is never "no acceptance";
- ``SpecparitySpeculativeMetricsAbsent``: the server exports none of the engine's speculative-decoding metrics.

SGLang before 0.5.14 has only its windowed gauge ``sglang:spec_accept_length``: the rules average it over
``[range]`` where ``sglang:generation_tokens_total`` moved (a gauge keeps its last value when nothing runs), with no
interval, and the annotations say so.

The rules file is YAML written here (no YAML library is needed: every string is single-quoted); ``promtool check
rules`` accepts every file this writes (tests/unit/test_watch_rules.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from specparity.intervals import WILSON_Z
from specparity.watch.band import Band
from specparity.watch.engines import MetricSet

Z2 = WILSON_Z * WILSON_Z
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
ALERT = "SpecparityAcceptanceBelowBand"
ABSENT = "SpecparitySpeculativeMetricsAbsent"
DOCS = "specparity docs/watch.md, 'Reading a drift'"


def check_duration(value: str, flag: str) -> str:
    if not DURATION.match(value):
        raise ValueError(f"{flag} {value!r} is not a Prometheus duration (e.g. 30s, 5m, 1h)")
    return value


def _num(x: float) -> str:
    return f"{x:.6g}"


class _Names:
    """The recorded series' names for one range (``specparity:<what>:<how><range>``)."""

    def __init__(self, rng: str) -> None:
        self.drafts_rate = f"specparity:spec_decode_drafts:rate{rng}"
        self.n = f"specparity:spec_decode_draft_tokens:increase{rng}"
        self.rate = f"specparity:spec_decode_acceptance_rate:pooled{rng}"
        self.rate_upper = f"specparity:spec_decode_acceptance_rate:upper95_{rng}"
        self.length = f"specparity:spec_decode_acceptance_length:pooled{rng}"
        self.length_upper = f"specparity:spec_decode_acceptance_length:upper95_{rng}"
        self.per_position = f"specparity:spec_decode_acceptance_per_position:pooled{rng}"
        self.tokens_rate = f"specparity:generation_tokens:rate{rng}"
        self.floor = "specparity:spec_decode_acceptance_length:floor"
        self.reference = "specparity:spec_decode_acceptance_length:reference"
        self.ceiling = "specparity:spec_decode_acceptance_length:contract"
        self.floor_pp = "specparity:spec_decode_acceptance_per_position:floor"
        self.ceiling_pp = "specparity:spec_decode_acceptance_per_position:contract"


def build_rules(band: Band, metrics: MetricSet, *, rng: str = "5m", for_: str = "10m",
                by: Sequence[str] = ("job", "instance"), selector: str = "") -> dict[str, Any]:
    """The rules file's content (``groups``), for ``band`` on the engine release ``metrics`` describes."""
    check_duration(rng, "--range")
    check_duration(for_, "--for")
    c = band.contract.name
    g = ", ".join(by)
    sel = "{" + selector.strip().strip("{}") + "}" if selector.strip().strip("{}") else ""
    mine = f'{{contract="{c}"}}'
    nm = _Names(rng)
    tag = {"contract": c, "engine": metrics.engine}
    rules: list[dict[str, Any]] = []

    def record(name: str, expr: str, labels: Mapping[str, str] | None = None) -> None:
        rules.append({"record": name, "expr": expr, "labels": {**tag, **(labels or {})}})

    def inc(metric: str | None) -> str:
        return f"sum by ({g}) (increase({metric}{sel}[{rng}]))"

    if metrics.source == "counters" and metrics.engine == "vllm":
        record(nm.drafts_rate, f"sum by ({g}) (rate({metrics.drafts}{sel}[{rng}]))")
        record(nm.n, inc(metrics.draft_tokens))
        record(nm.rate, f"{inc(metrics.accepted)} / {inc(metrics.draft_tokens)}")
        record(nm.length, f"1 + {inc(metrics.accepted)} / {inc(metrics.drafts)}")
        record(nm.per_position, f"sum by ({g}, position) (increase({metrics.accepted_per_pos}{sel}[{rng}])) "
                                f"/ ignoring(position) group_left {inc(metrics.drafts)}")
        steps = f"({inc(metrics.draft_tokens)} / {inc(metrics.drafts)})"
    elif metrics.source == "counters":  # SGLang >= 0.5.14: Δgeneration_tokens / Δverify_calls
        k = _num(band.num_steps)
        record(nm.drafts_rate, f"sum by ({g}) (rate({metrics.verify_calls}{sel}[{rng}]))")
        record(nm.n, f"{k} * {inc(metrics.verify_calls)}")
        record(nm.length, f"{inc(metrics.generation_tokens)} / {inc(metrics.verify_calls)}")
        record(nm.rate, f"clamp_min({nm.length}{mine} - 1, 0) / {k}")
        steps = k
    else:  # a gauge: SGLang's own window; only where tokens were generated in the range
        record(nm.length, f"avg by ({g}) (avg_over_time({metrics.accept_length_gauge}{sel}[{rng}])) and on({g}) "
                          f"({inc(metrics.generation_tokens)} > 0)")
        steps = None
    if metrics.generation_tokens:
        record(nm.tokens_rate, f"sum by ({g}) (rate({metrics.generation_tokens}{sel}[{rng}]))")
    if steps is not None:
        p, n = f"{nm.rate}{mine}", f"{nm.n}{mine}"
        record(nm.rate_upper, f"({p} + {Z2 / 2:.10g} / {n} + {WILSON_Z:.10g} * sqrt(clamp_min({p} * (1 - {p}) / {n} "
                              f"+ {Z2 / 4:.10g} / ({n} * {n}), 0))) / (1 + {Z2:.10g} / {n})")
        # the recorded series carry contract and engine labels, the raw sums only the ``by`` ones
        match = "ignoring(contract, engine) " if metrics.engine == "vllm" else ""  # SGLang's k is a number
        record(nm.length_upper, f"1 + {nm.rate_upper}{mine} * {match}{steps}")
        judged, how = nm.length_upper, "the upper end of its 95% Wilson interval"
    else:
        judged, how = nm.length, "SGLang's own windowed gauge sglang:spec_accept_length, no interval"
    record(nm.floor, f"vector({_num(band.floor_length)})")
    record(nm.reference, f"vector({_num(band.reference_length)})")
    record(nm.ceiling, f"vector({_num(band.ceiling_length)})")
    if metrics.accepted_per_pos:
        for j, (floor, ceiling) in enumerate(zip(band.floor_per_position, band.contract.per_position, strict=True)):
            record(nm.floor_pp, f"vector({_num(floor)})", {"position": str(j)})
            record(nm.ceiling_pp, f"vector({_num(ceiling)})", {"position": str(j)})
    reference = (f"the calibrated baseline {band.reference_length:.3f}" if band.calibrated
                 else f"the contract's figure {band.reference_length:.3f} (uncalibrated)")
    alerts = [
        {"alert": ALERT, "expr": f"{judged}{mine} < {_num(band.floor_length)}", "for": for_,
         "labels": {"severity": "page", **tag},
         "annotations": {
             "summary": f"Speculative acceptance on {{{{ $labels.instance }}}} is below the band of contract '{c}'",
             "description": (f"Acceptance length pooled over draft tokens ({how}) is {{{{ $value | printf \"%.3f\" }}}} "
                             f"over the last {rng}, under the floor {band.floor_length:.3f} = 1 + {band.floor_ratio:g}"
                             f" x ({reference} - 1), for {for_}. The contract's replay gives "
                             f"{band.ceiling_length:.3f}. A wiring fault (the seed's: the embedding in fc's first "
                             "chunk) keeps about a third of the drafter's gain; run `specparity gate` against this "
                             "deployment to tell wiring from traffic."),
             "runbook": DOCS}},
        {"alert": ABSENT, "expr": f"absent({metrics.required[0]}{sel})", "for": for_,
         "labels": {"severity": "warning", **tag},
         "annotations": {"summary": f"No {metrics.label} speculative-decoding metrics for contract '{c}'",
                         "description": f"{metrics.required[0]} is absent; the server needs {metrics.enable}.",
                         "runbook": DOCS}},
    ]
    return {"groups": [{"name": f"specparity-{c}-{metrics.engine}", "rules": [*rules, *alerts]}]}


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return "'" + str(v).replace("'", "''") + "'"


def to_yaml(data: Any, indent: int = 0) -> str:
    """YAML for dicts, lists and scalars; every string single-quoted (so PromQL and templates need no escaping)."""
    pad = "  " * indent
    if isinstance(data, Mapping):
        out = []
        for k, v in data.items():
            if isinstance(v, (Mapping, list)) and v:
                out.append(f"{pad}{k}:\n{to_yaml(v, indent + 1)}")
            elif isinstance(v, (Mapping, list)):
                out.append(f"{pad}{k}: {'{}' if isinstance(v, Mapping) else '[]'}")
            else:
                out.append(f"{pad}{k}: {_scalar(v)}")
        return "\n".join(out)
    if isinstance(data, list):
        out = []
        for item in data:
            body = to_yaml(item, indent + 1) if isinstance(item, (Mapping, list)) else pad + "  " + _scalar(item)
            out.append(f"{pad}- {body.lstrip()}")
        return "\n".join(out)
    return pad + _scalar(data)


def rules_text(rules: Mapping[str, Any], *, header: str) -> str:
    return "".join(f"# {line}\n" for line in header.splitlines()) + to_yaml(rules) + "\n"


def dashboard(band: Band, metrics: MetricSet, *, rng: str = "5m") -> dict[str, Any]:
    """A Grafana dashboard (import JSON) over the recorded series: acceptance per position against the band,
    acceptance length with its floor, drafts per second and generated tokens per second."""
    nm = _Names(rng)
    c = band.contract.name
    inst = f'contract="{c}", instance=~"$instance"'
    const = f'contract="{c}"'

    def target(expr: str, legend: str, ref: str) -> dict[str, Any]:
        return {"datasource": {"type": "prometheus", "uid": "${datasource}"}, "expr": expr, "legendFormat": legend,
                "refId": ref}

    def panel(i: int, title: str, targets: list[dict[str, Any]], unit: str, desc: str) -> dict[str, Any]:
        return {"id": i, "type": "timeseries", "title": title, "description": desc,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 9, "w": 12, "x": 12 * ((i - 1) % 2), "y": 9 * ((i - 1) // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}, "targets": targets,
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}}}

    if metrics.accepted_per_pos:
        first = panel(1, "Acceptance per draft position against the contract's band", [
            target(f"{nm.per_position}{{{inst}}}", "{{instance}} position {{position}}", "A"),
            target(f"{nm.floor_pp}{{{const}}}", "floor position {{position}}", "B"),
            target(f"{nm.ceiling_pp}{{{const}}}", "contract position {{position}}", "C")], "percentunit",
            "Pooled over the range (vLLM's counters): accepted at position j / drafts. Floor = ratio x reference.")
    else:
        first = panel(1, "Acceptance rate (pooled) against the band", [
            target(f"{nm.rate}{{{inst}}}" if metrics.source == "counters" else
                   f'avg by (instance) ({metrics.accept_rate_gauge or metrics.accept_length_gauge}{{instance=~"$instance"}})',
                   "{{instance}}", "A")], "percentunit",
            "SGLang exports no per-position acceptance; accepted / proposed draft tokens.")
    length_targets = [target(f"{nm.length}{{{inst}}}", "{{instance}} pooled", "A"),
                      target(f"{nm.floor}{{{const}}}", "floor", "B"),
                      target(f"{nm.reference}{{{const}}}", "reference", "C"),
                      target(f"{nm.ceiling}{{{const}}}", "contract", "D")]
    if metrics.source == "counters":
        length_targets.append(target(f"{nm.length_upper}{{{inst}}}", "{{instance}} upper 95%", "E"))
    panels = [first,
              panel(2, "Acceptance length (pooled) with the floor the alert uses", length_targets, "none",
                    "The alert fires when the upper 95% bound stays under the floor for the rule's duration."),
              panel(3, "Drafts per second (verify steps with a draft)",
                    [target(f"{nm.drafts_rate}{{{inst}}}", "{{instance}}", "A")] if metrics.source == "counters" else [],
                    "ops", "An idle server has no acceptance; the band is judged only where this is above 0."),
              panel(4, "Generated tokens per second",
                    [target(f"{nm.tokens_rate}{{{inst}}}", "{{instance}}", "A")], "short", "Throughput of the server.")]
    return {"title": f"specparity: {c} on {metrics.label}", "uid": f"specparity-{c}-{metrics.engine}"[:40],
            "schemaVersion": 39, "version": 1, "editable": True, "time": {"from": "now-6h", "to": "now"},
            "refresh": "30s", "tags": ["specparity", "speculative-decoding", metrics.engine],
            "templating": {"list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
                {"name": "instance", "type": "query", "label": "server", "includeAll": True, "multi": True,
                 "datasource": {"type": "prometheus", "uid": "${datasource}"},
                 "query": f"label_values({nm.length}{{{const}}}, instance)", "refresh": 2}]},
            "panels": panels}


def dashboard_exprs(dash: Mapping[str, Any]) -> list[str]:
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


def dashboard_text(dash: Mapping[str, Any]) -> str:
    return json.dumps(dash, indent=2) + "\n"
