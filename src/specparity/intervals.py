"""Binomial confidence intervals, pure arithmetic: the replay's acceptance and the watcher's live acceptance both use
them, and the watcher must run without torch (``replay/acceptance.py`` re-exports these names). Also the one floor
both judge a server's own acceptance by (:data:`FLOOR_RATIO`)."""

from __future__ import annotations

import math

WILSON_Z = 1.959964  # two-sided 95%
# a server's own acceptance is healthy down to this fraction of its reference (watch/band.py says why 0.6); the gate's
# live outcome (replay/server_acceptance.py) and watch's band use the same figure
FLOOR_RATIO = 0.6


def wilson_interval(successes: int, trials: int, *, z: float = WILSON_Z) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; (0, 1) when there are no trials.

    Acceptance is a proportion of scored tokens and is noisy at probe-pack sizes (speculators #793 saw
    first-position acceptance swing 0.073-0.118 across identical environments), so verdicts use its interval.
    """
    if trials <= 0:
        return 0.0, 1.0
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)
