"""The server's own acceptance, judged beside the replay: the figure the seed's users watched.

The seed's symptom was the server's acceptance (about 19% served where 60-80% was expected), and it is the one number
every user of a live server already reads. The gate holds the server's own per-position acceptance, counted while it
served the probes' prompts, against a band derived from the contract the way ``specparity watch`` derives its band
(:mod:`specparity.watch.band`): the *reference* is the contract's per-position acceptance (its training-side replay on
the recorded inputs; the replay's own recorded figure where the contract states none), and the *floor* of each
position is :data:`~specparity.watch.band.FLOOR_RATIO` of it. Measured with ``watch`` on vLLM servers of SmolLM2 and
its trained drafter under the drafter's held-out questions, first-position acceptance was 0.50 [0.45, 0.54] healthy and
0.20 [0.17, 0.23] with the embedding first, against the contract's 0.60: floor 0.36, so the healthy server is inside
and the seed's wiring below with room on both sides (an engine's loop is not the replay, so the floor is a fraction,
never the contract's figure itself).

The first draft position decides, as the replay's diagnosis does:

- **below**: even the upper end of its 95% Wilson interval is under the floor;
- **inside**: the point estimate is at or above the floor;
- **inconclusive**: the point is under the floor but the interval reaches it (too few drafts to tell).

With the capture's own finding (:func:`judge`):

- capture mismatched, server below: wiring, confirmed by the server's own figures (``served_acceptance_collapse``);
- capture clean, server inside: pass;
- capture clean, server below: ``served_acceptance_collapse`` naming what the capture cannot see (draft weights,
  sampling, a speculative setting, the tokenizer) and which checks ruled out which cause;
- unmeasurable (no drafts, inconclusive, or other clients' requests in the counting window where only the server's
  global counters exist): ``server_acceptance_unmeasured``, exit 3 by name, never a pass and never a mixed figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specparity.compare.findings import Finding, FindingKind, Severity
from specparity.intervals import FLOOR_RATIO, wilson_interval

INSIDE, BELOW, INCONCLUSIVE, UNMEASURED = "inside", "below", "inconclusive", "unmeasured"
# where the figure came from: each probe's own counts (per request) or the server's global counters
PER_REQUEST, SERVER_COUNTERS = "per_request", "server_counters"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def band(reference: Sequence[float]) -> list[float]:
    """Each position's floor: :data:`FLOOR_RATIO` of the reference (as watch's band, in acceptance per position)."""
    return [FLOOR_RATIO * float(r) for r in reference]


def state_of(accepted: int, drafts: int, floor: float) -> str:
    """One position's state against its floor (module docstring); ``unmeasured`` when no draft was verified."""
    if drafts <= 0:
        return UNMEASURED
    high = wilson_interval(accepted, drafts)[1]
    point = accepted / drafts
    if high < floor:
        return BELOW
    if point >= floor:
        return INSIDE
    return INCONCLUSIVE


def _unmeasured(message: str, details: Mapping[str, Any]) -> Finding:
    return Finding(FindingKind.SERVER_ACCEPTANCE_UNMEASURED, Severity.ERROR, message,
                   details={"check": "outcome", "cause": "measurement", **details},
                   fix="gate the server with no other clients (a staging copy of the deployment), or where the engine "
                       "counts per request (vLLM --per-request-spec-decode-metrics; SGLang's meta_info)")


def judge(loop: Mapping[str, Any] | None, *, reference: Sequence[float] | None, reference_from: str,
          capture_matches: bool, replay_diagnosis: str | None, engine: str) -> tuple[dict[str, Any], list[Finding]]:
    """The server's acceptance against the band: (the judgement for the report, findings).

    ``loop``: the engine's own loop as :func:`specparity.replay.outcome.loop_summary` gives it, plus ``counts``
    (``drafts``, ``accepted_per_position``), ``source`` (:data:`PER_REQUEST` or :data:`SERVER_COUNTERS`) and
    ``other_requests`` (requests of other clients the server finished in the counting window; None: not known).
    ``capture_matches``: the capture found the fc input the contract's layout; ``replay_diagnosis``: what the
    training-side replay on the served inputs said.
    """
    loop = dict(loop or {})
    drafts = int(loop.get("drafts") or 0)
    accepted = [int(a) for a in loop.get("accepted_per_position") or []]
    source = str(loop.get("source") or SERVER_COUNTERS)
    other = loop.get("other_requests")
    out: dict[str, Any] = {"source": source, "drafts": drafts, "reference": list(reference or []),
                           "reference_from": reference_from, "floor_ratio": FLOOR_RATIO, "other_requests": other}
    if source == SERVER_COUNTERS and other:
        out["state"] = UNMEASURED
        return out, [_unmeasured(
            f"{engine}'s own acceptance cannot be judged: the server served {other} other request(s) while the gate "
            "measured, and its counters are global, so the figure would mix other clients' drafts with the probes'",
            {"other_requests": other, "source": source})]
    if drafts <= 0 or not accepted:
        out["state"] = UNMEASURED
        return out, [_unmeasured(
            f"{engine}'s own acceptance cannot be judged: the server verified no draft while it served the probes' "
            "prompts (its speculative-decoding counters did not move)", {"drafts": drafts, "source": source})]
    if not reference:
        out["state"] = UNMEASURED
        return out, [_unmeasured(f"{engine}'s own acceptance cannot be judged: neither the contract nor the replay "
                                 "gives a reference acceptance to hold it against", {"source": source})]
    floors = band(reference)
    positions = min(len(floors), len(accepted))
    per_position = [a / drafts for a in accepted[:positions]]
    intervals = [list(wilson_interval(a, drafts)) for a in accepted[:positions]]
    states = [state_of(a, drafts, f) for a, f in zip(accepted[:positions], floors[:positions], strict=True)]
    out.update(floor=floors[:positions], per_position=per_position, intervals=intervals, states=states,
               state=states[0])
    first = (f"first draft position {_pct(per_position[0])} [{_pct(intervals[0][0])}, {_pct(intervals[0][1])}] over "
             f"{drafts} drafts, against the {reference_from}'s {_pct(float(reference[0]))} (floor {_pct(floors[0])}: "
             f"{FLOOR_RATIO:g} of it, as watch's band)")
    numbers = {"check": "outcome", "server_acceptance": out}
    if states[0] == INCONCLUSIVE:
        return out, [_unmeasured(f"{engine}'s own acceptance is inconclusive: {first}; the interval reaches the floor, "
                                 "so too few drafts to tell a collapse from a healthy server", numbers)]
    if states[0] == INSIDE:
        out["confirms"] = "healthy" if capture_matches else None
        return out, []
    if not capture_matches:
        out["confirms"] = "wiring"
        return out, [Finding(
            FindingKind.SERVED_ACCEPTANCE_COLLAPSE, Severity.ERROR,
            f"{engine}'s own acceptance confirms the wiring fault: {first}. The server accepts far less than the "
            "drafter was trained to, and the capture shows why (the fc input does not match the contract)",
            details=numbers, fix="fix the layout named by the capture findings; the server's acceptance then returns "
                                 "to the band")]
    out["confirms"] = "beyond_capture"
    ruled_out = ["the fc input: the capture found every chunk where the contract expects it"]
    if replay_diagnosis == "healthy":
        ruled_out.append("the fc input's values: the drafter's replay on the served input accepts as on the "
                         "recorded one")
    return out, [Finding(
        FindingKind.SERVED_ACCEPTANCE_COLLAPSE, Severity.ERROR,
        f"{engine}'s own acceptance collapsed while its fc input matches the contract: {first}. Something the "
        f"capture cannot see is wrong: the draft weights served, sampling, a speculative setting, or the tokenizer. "
        f"Ruled out: {'; '.join(ruled_out)}",
        details={**numbers, "ruled_out": ruled_out},
        fix="compare the served draft checkpoint, the request's sampling parameters, the speculative settings and "
            "the tokenizer with the ones training evaluated")]
