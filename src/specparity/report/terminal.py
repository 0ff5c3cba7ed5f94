"""The terminal report: a :class:`~specparity.verdict.Verdict` in the house failure shape.

Shape (docs/house-style.md "Failure message shape"): a summary line, a ``Fix:`` line, one line per
fc-input chunk, then every finding (never only the first), then ``Note:`` lines with remedies
(Polygraphy-style: the smallest tolerance that would have passed). A pass is one line, followed by
any warnings. The HTML and JUnit reports reuse the same lines, so all faces say the same words.

The same lines styled by rich (:func:`styled_lines`): the verdict word, a chunk that serves the wrong source,
each finding's severity, notes. Colour on a terminal; plain text in CI logs, pipes and files, and under
``NO_COLOR`` or ``TERM=dumb`` (rich's own detection). Lines are never wrapped or cropped, so a log holds exactly
the plain text. rich is imported when a report is styled, never when :mod:`specparity.report` is imported.
"""

from __future__ import annotations

import io
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from specparity.compare.findings import ENVIRONMENT_KINDS, Finding, FindingKind, Severity, engine_label
from specparity.report.layout import layout_line
from specparity.verdict import ChunkReport, OutcomeSummary, Verdict

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

# Kinds that mean "the tensors fc receives are not the promised ones"; other failures (vocab map,
# spec settings, ...) fail the deployment without the fc input itself being wrong.
FC_INPUT_KINDS = frozenset(
    {
        FindingKind.EXTRA_EMBEDDING,
        FindingKind.MISSING_SOURCE,
        FindingKind.OFF_BY_ONE,
        FindingKind.ORDER_MISMATCH,
        FindingKind.LAYOUT_MISMATCH,
        FindingKind.DEFAULT_IDS_FALLBACK,
        FindingKind.WIDTH_MISMATCH,
        FindingKind.CAPTURE_COUNT_SHORT,
        FindingKind.FC_NOT_CALLED,
        FindingKind.RANK_MISSING,
        FindingKind.NORM_MISMATCH,
        FindingKind.POSITION_SHIFT,
        FindingKind.NONFINITE,
        FindingKind.NUMERIC_DRIFT,
    }
)

DIAGNOSIS_TEXT = {
    "healthy": "healthy; the drafter accepts served fc inputs as well as recorded ones",
    "wiring": "wiring; acceptance drops on the served fc input, so the serving path (not the model) is at fault",
    "model_quality": "model quality; acceptance is low on the recorded fc input too, so the drafter itself is weak",
    "inconclusive": "inconclusive; too few scored tokens to clear or confirm a drop on the served fc input",
}


def fmt_num(value: float | None) -> str:
    """Short number for reports: ``3.1``, ``0.02``, ``1.2e-06``, ``0.0``; ``n/a`` for None."""
    if value is None:
        return "n/a"
    if math.isnan(value) or math.isinf(value):
        return str(value)
    if value == 0:
        return "0.0"
    text = f"{value:.2g}"
    return text if ("." in text or "e" in text) else text + ".0"


def fmt_cosine(value: float | None) -> str:
    """Cosine with 2 decimals, or 4 near 1 where the difference matters (0.9987 is not 1.00)."""
    if value is None:
        return "n/a"
    if math.isnan(value):
        return "nan"
    return f"{value:.4f}" if value >= 0.99 else f"{value:.2f}"


def context(verdict: Verdict) -> str:
    """``sglang 0.5.23, LlamaForCausalLM``: the parts that are known."""
    parts = []
    if verdict.engine_version:
        parts.append(f"{verdict.engine} {verdict.engine_version}")
    if verdict.target_architecture:
        parts.append(verdict.target_architecture)
    return ", ".join(parts) if parts else "serving engine unknown"


def max_abs_err(verdict: Verdict) -> float | None:
    """The largest served-vs-recorded error over all chunks (None when no tensors were compared)."""
    errs = [c.max_abs_err for c in verdict.chunks if c.max_abs_err is not None]
    return max(errs) if errs else None


def summary_line(verdict: Verdict) -> str:
    """The first line of every report: status word, what was checked, against which contract."""
    ctx = f"contract '{verdict.contract_name}' ({context(verdict)})"
    if verdict.status == "pass":
        layout = ", ".join(verdict.expected_layout)
        facts = []
        if verdict.probes:
            facts.append(f"{len(verdict.probes)} probe{'s' if len(verdict.probes) != 1 else ''}")
        err = max_abs_err(verdict)
        if err is not None:
            facts.append(f"max|d| {fmt_num(err)}")
        if verdict.level == "static":
            facts.append("static check only, no tensors captured")
        return f"PASS  fc input matches {ctx}: {layout}" + (f"; {', '.join(facts)}" if facts else "")
    label = engine_label(verdict.engine)
    if verdict.status == "error":
        env = [f for f in verdict.errors if f.kind in ENVIRONMENT_KINDS]
        ours = [f for f in env if f.details.get("cause") == "specparity"]
        if ours and len(ours) == len(env):  # a limit of specparity's own, never blamed on the engine
            limit = ours[0].details.get("limit") or "its own code"
            return f"ERROR  could not check fc input against {ctx}: a limit of specparity ({limit}), not {label}'s"
        what = f"{label} timed out" if env and env[0].kind is FindingKind.TIMEOUT else f"{label} failed"
        if verdict.chunks and env and len(env) == len(verdict.errors) and \
                all(f.details.get("check") == "outcome" for f in env):
            # the capture ran and matched; only the outcome could not run here (a live SGLang server on a CPU)
            return (f"ERROR  fc input matches {ctx}: {', '.join(verdict.expected_layout)}; the outcome could not be "
                    f"checked on this machine: {what}")
        return f"ERROR  could not check fc input against {ctx} on this machine: {what}"
    if any(f.kind in FC_INPUT_KINDS for f in verdict.errors) or not verdict.errors:
        return f"FAIL  fc input does not match {ctx}"
    if all(f.kind in ENVIRONMENT_KINDS for f in verdict.errors):
        return f"FAIL  {label} refuses the deployment of {ctx}"
    return f"FAIL  deployment does not match {ctx}"


def fix_text(verdict: Verdict) -> str:
    """The one-line remedy: the verdict's fix, else the fixes of its error findings, else a pointer."""
    if verdict.fix is not None:
        return verdict.fix.summary
    fixes: list[str] = []
    for f in verdict.errors or list(verdict.findings):
        if f.fix and f.fix not in fixes:
            fixes.append(f.fix)
    if fixes:
        return "; ".join(fixes)
    label = engine_label(verdict.engine)
    if verdict.status == "error":
        return f"nothing here says the deployment is wrong: run the check where {label} can serve it (cause below)"
    if verdict.errors and all(f.kind in ENVIRONMENT_KINDS for f in verdict.errors):
        return f"change what {label} names in its error below (engine arguments, draft config or target)"
    return "no automatic fix is known; see the findings below"


def chunk_lines(chunks: Sequence[ChunkReport]) -> list[str]:
    """``chunk 0: served embedding      expected layer:1   cosine 0.02  max|d| 3.1`` per chunk."""
    def served(c: ChunkReport) -> str:  # "unknown" is a diagnosis of a captured chunk; without one, say so
        return c.served or ("unknown" if c.captured else "not captured")

    served_w = max([14, *(len(served(c)) + 1 for c in chunks)])
    expected_w = max([9, *(len(c.expected or "(none)") + 1 for c in chunks)])
    lines = []
    for c in chunks:
        line = (
            f"chunk {c.index}: served {served(c).ljust(served_w)} "
            f"expected {(c.expected or '(none)').ljust(expected_w)} "
            f"cosine {fmt_cosine(c.cosine)}  max|d| {fmt_num(c.max_abs_err)}"
        )
        if c.recorded is not None and c.recorded != c.expected:
            line += f"  (recording matches {c.recorded})"
        lines.append(line)
    return lines


def finding_lines(findings: Sequence[Finding], *, headline_fix: str | None = None) -> list[str]:
    """Every finding as ``<severity> <kind>: <message>``, plus its own fix when it adds one."""
    lines = []
    for f in findings:
        lines.append(f"{f.severity.value.ljust(7)} {f.kind.value}: {f.message}")
        if f.fix and f.fix != headline_fix:
            lines.append(f"{'':8}fix: {f.fix}")
    return lines


def _spec_settings(d: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items())


def spec_config_line(resolved: Mapping[str, Any]) -> str:
    """``Spec config: SGLang serves num_steps 3, ... (requested ...)`` from ``resolved_spec_config``.

    Accepts either ``{"requested": {...}, "resolved": {...}}`` or a flat mapping of resolved values.
    """
    req, res = resolved.get("requested"), resolved.get("resolved")
    label = resolved.get("engine_label", "SGLang")
    if isinstance(res, Mapping):
        line = f"Spec config: {label} serves {_spec_settings(res)}"
        if isinstance(req, Mapping):
            changed = {k: v for k, v in req.items() if v is not None and res.get(k) != v}
            if changed:
                line += f" (requested {_spec_settings(changed)})"
        return line
    return f"Spec config: {label} serves {_spec_settings(resolved)}"


def _acc_row(label: str, values: Sequence[float]) -> str:
    return f"  {label:<10}" + "".join(f"{v:>7.2f}" for v in values)


def outcome_lines(outcome: OutcomeSummary) -> list[str]:
    """The acceptance block: per draft position, recorded vs served (and expected), then diagnosis."""
    n = max(len(outcome.recorded_acceptance), len(outcome.served_acceptance),
            len(outcome.expected_acceptance or ()))
    lines = [
        f"Outcome: {DIAGNOSIS_TEXT[outcome.diagnosis]}",
        f"  {'position':<10}" + "".join(f"{i:>7}" for i in range(n)),
        _acc_row("recorded", outcome.recorded_acceptance),
        _acc_row("served", outcome.served_acceptance),
    ]
    if outcome.expected_acceptance is not None:
        lines.append(_acc_row("expected", outcome.expected_acceptance))
    lines.append(
        f"  acceptance length: recorded {outcome.recorded_acceptance_length:.2f}, "
        f"served {outcome.served_acceptance_length:.2f}"
    )
    if outcome.recorded_interval is not None and outcome.served_interval is not None:
        r, v = outcome.recorded_interval, outcome.served_interval
        lines.append(f"  first draft, 95% Wilson interval over {outcome.scored_tokens} scored tokens: "
                     f"recorded [{r[0]:.3f}, {r[1]:.3f}], served [{v[0]:.3f}, {v[1]:.3f}]")
    loop = outcome.engine_loop
    if loop:
        cells = ", ".join(f"{p:.2f} [{lo:.2f}, {hi:.2f}]" for p, (lo, hi) in zip(loop["per_position"], loop["intervals"],
                                                                             strict=True))
        lines.append(f"  {loop.get('engine')}'s own loop, {loop['drafts']} drafts: accepted per position {cells} "
                     f"(95% Wilson); acceptance length {loop['acceptance_length']:.2f}")
    return lines


def note_lines(verdict: Verdict) -> list[str]:
    """Remedies worth knowing beyond the fix: passing tolerances, unattributed chunks, the JSON patch."""
    notes = []
    for c in verdict.chunks:
        if c.min_passing_atol is not None and verdict.status != "pass":
            atol = fmt_num(c.min_passing_atol)
            if c.served == c.expected:
                if c.min_passing_atol > 0:  # an exact chunk needs no note
                    notes.append(f"chunk {c.index} would have passed with atol >= {atol}")
            else:
                notes.append(f"chunk {c.index} would need atol >= {atol} to pass, but it serves "
                             f"{c.served or 'an unknown source'} instead of {c.expected}: "
                             "fix the layout, not the tolerance")
        if c.captured and c.served is None and c.expected is not None:  # a diagnosis of captured evidence only
            notes.append(f"chunk {c.index} matches no residual-stream boundary of the target; "
                         "check norm flags (norm_before_fc, fc_norm) and the capture point")
    if verdict.fix is not None and verdict.fix.json_patch and verdict.fix.file:
        notes.append(f"a JSON patch for {verdict.fix.file} is in the JSON and HTML reports (fix.json_patch)")
    return notes


def render_lines(verdict: Verdict) -> list[str]:
    """The report as plain lines (no colour)."""
    lines = [summary_line(verdict)]
    failing = verdict.status != "pass"
    headline_fix = None
    if failing:
        headline_fix = fix_text(verdict)
        lines.append(f"Fix: {headline_fix}")
    if verdict.resolved_spec_config is not None and (
        failing or any(f.kind is FindingKind.SPEC_CONFIG_REWRITTEN for f in verdict.findings)
    ):
        lines.append(spec_config_line(verdict.resolved_spec_config))
    if failing:
        lines += chunk_lines(verdict.chunks)
    lines += finding_lines(verdict.findings, headline_fix=headline_fix)
    if verdict.outcome is not None:
        lines += outcome_lines(verdict.outcome)
    lines += [f"Note: {n}" for n in note_lines(verdict)]
    served_layout = layout_line(verdict)
    lines += [served_layout] if served_layout else []
    lines += launch_lines(verdict)
    lines += live_lines(verdict)
    lines += environment_lines(verdict)
    return lines


def live_lines(verdict: Verdict) -> list[str]:
    """Where the evidence came from when the gate checked a server: the one it launched from the user's command
    (with every flag and variable it added) or the one it attached to."""
    live = verdict.live
    if not live:
        return []
    if live.get("mode") == "attached":
        return [f"Server: attached to {live.get('url')} (its own hooks and counters; nothing started or stopped)"]
    started = live.get("startup_s")
    lines = [f"Server: launched from the command at {live.get('url')}"
             + (f", healthy after {started:.0f} s" if isinstance(started, (int, float)) else "") + ", then stopped",
             "Server: specparity added " + (" ".join(live.get("added_flags") or ()) or "no flag") + "; env "
             + (", ".join(f"{k}={v}" for k, v in (live.get("added_env") or {}).items()) or "none")]
    lines += [f"Server note: {n}" for n in live.get("notes") or ()]
    return lines


def launch_lines(verdict: Verdict) -> list[str]:
    """The deploy command as given (redacted) and what its engine's own parser made of it (``--launch``)."""
    launch = verdict.launch
    if not launch:
        return []
    cmd = launch.get("command") or {}
    where = str(cmd.get("source")) + (f" {cmd['path']}" if cmd.get("path") else "")
    args = ", ".join(f"{k}={json.dumps(v)}" for k, v in (launch.get("engine_args") or {}).items()) or "none"
    label = engine_label(str(launch.get("engine")))
    lines = [f"Launch command ({where}): {cmd.get('one_line')}",
             f"Launch parsed by {label} {launch.get('engine_version')}: target {launch.get('target')}, "
             f"draft {launch.get('draft')}, {args}"]
    lines += [f"Launch note: {n}" for n in launch.get("notes") or ()]
    return lines


def environment_lines(verdict: Verdict) -> list[str]:
    """What the SGLang child ran on, and the stand-ins active there."""
    env = verdict.environment
    lines = []
    if env:
        name = "vllm" if "vllm" in env else "sglang"
        lines.append(f"Measured with: {name} {env.get(name)} ({env.get(name + '_path')}), torch {env.get('torch')}, "
                     f"transformers {env.get('transformers')}, device {env.get('device')}, python {env.get('python')}")
    if verdict.stand_ins:
        lines.append(f"Stand-ins active: {'; '.join(verdict.stand_ins)}")
    return lines


def render_text(verdict: Verdict, *, color: bool = False) -> str:
    """The terminal report for ``verdict``, newline-terminated; ANSI colours (drawn by rich,
    :func:`ansi_text`) when ``color``."""
    if color:
        return ansi_text(verdict)
    return "\n".join(render_lines(verdict)) + "\n"


# --- styled by rich -----------------------------------------------------------------------------------------

STATUS_STYLE = {"PASS": "bold green", "FAIL": "bold red", "ERROR": "bold yellow"}
SEVERITY_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
_CHUNK = re.compile(r"chunk (\d+): served (\S+)")


def styled_lines(verdict: Verdict) -> list[Text]:
    """The report's lines as rich Text; ``Text.plain`` of each is exactly the plain line."""
    from rich.text import Text

    chunks = {c.index: c for c in verdict.chunks}
    out: list[Text] = []
    for line in render_lines(verdict):
        text = Text(line)
        word = line.split(" ", 1)[0]
        if out == [] and word in STATUS_STYLE:
            text.stylize(STATUS_STYLE[word], 0, len(word))
        elif line.startswith(("Fix: ", "Spec config: ", "Outcome: ", "Measured with: ", "Stand-ins active: ",
                              "Launch command ", "Launch parsed by ", "Launch note: ")):
            text.stylize("bold", 0, line.index(":") + 1)
        elif line.startswith("Note: "):
            text.stylize("dim")
        elif m := _CHUNK.match(line):
            c = chunks.get(int(m.group(1)))
            if c is not None:
                text.stylize("green" if c.served == c.expected else "bold red", m.start(2), m.end(2))
        else:
            for sev, style in SEVERITY_STYLE.items():
                if line.startswith(sev.value.ljust(7) + " "):
                    text.stylize(style, 0, len(sev.value))
                    break
        out.append(text)
    return out


def console(stream: TextIO | None = None, *, color: bool | None = None) -> Console:
    """A rich Console for reports: no wrapping, no markup or highlighting; ``color`` None = detect."""
    from rich.console import Console

    return Console(file=stream if stream is not None else sys.stdout, force_terminal=color,
                   no_color=None if color is None else not color, color_system="standard" if color else "auto",
                   highlight=False, markup=False, emoji=False, soft_wrap=True, width=100_000 if color else None)


def print_verdict(verdict: Verdict, stream: TextIO | None = None, *, color: bool | None = None) -> None:
    """Print the terminal report to ``stream`` (default stdout); colour only on a terminal."""
    c = console(stream, color=color)
    for text in styled_lines(verdict):
        c.print(text, soft_wrap=True, crop=False, overflow="ignore")


def ansi_text(verdict: Verdict) -> str:
    """The terminal report with ANSI colours, as a string (``render_text(color=True)``)."""
    buf = io.StringIO()
    print_verdict(verdict, buf, color=True)
    return buf.getvalue()


def use_color(stream: TextIO) -> bool:
    """Whether to pass ``color=True`` for ``stream``: rich would colour it (a terminal, ``NO_COLOR`` unset,
    ``TERM`` not dumb)."""
    try:
        c = console(stream)
        return bool(c.is_terminal and not c.is_dumb_terminal and not c.no_color and c.color_system)
    except (AttributeError, ValueError, OSError):
        return False
