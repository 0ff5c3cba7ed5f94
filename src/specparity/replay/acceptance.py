"""Per-position acceptance of a greedy (topk 1) draft chain over teacher-forced probe samples.

**Setting.** A probe sample holds token ids ``x_0..x_{T-1}``, the fc input rows ``g_t`` ``[T, k*H_t]`` and
the target's greedy token ``G_t = argmax lm_head(final_norm_t)`` at every row (the target's prediction of
token ``t+1`` given ``x_0..x_t``). Every row ``t <= T-2`` is treated as the moment right after the target
produced ``x_{t+1}``: the drafter sees ``g_t`` and ``embed(x_{t+1})`` and drafts ``d_1`` (the draft extend
after prefill, SGLang 0.5.23 ``speculative/eagle_worker_v2.py:961-1030``); step ``j > 1`` feeds back the
drafter's own ``H_d``-wide state and ``embed(d_{j-1})`` (draft decode; fc skipped). Draft position ``j``
(1-based here; "position 0" in reports is ``j = 1``) is accepted iff ``d_1..d_j`` all equal what greedy
verification would accept.

**Probe text is not the target's greedy continuation.** The target's answer to ``d_1`` is ``G_{t+1}``,
always known. Its answer to ``d_j`` (``j > 1``) is the target's greedy token after the prefix
``x_0..x_{t+1}, d_1..d_{j-1}``; the recording holds it only when the probe text after ``x_{t+1}`` *is* that
prefix, i.e. ``x_{t+2..t+j} == G_{t+1..t+j-1}`` (and then it is ``G_{t+j}``). We never substitute the
teacher-forced ``G_{t+j}`` for a different prefix (that would score the drafter against an answer to a
question it was not asked), and we do not re-run the target. Instead:

- a row whose chain was rejected at a known step contributes its known zeros;
- a row still accepted where the text departs from greedy is *censored* at that step;
- the conditional rate ``c_j = accepted_j / at_risk_j`` uses only rows whose step ``j`` is exactly known
  (``at_risk_j``: steps ``1..j`` known and ``d_1..d_{j-1}`` accepted), and the per-position acceptance is
  the product-limit (Kaplan-Meier) estimate ``a_j = c_1 * ... * c_j``, unbiased when censoring does not
  depend on acceptance. ``a_1`` is exact (plain first-draft accuracy over every evaluated row).

When the text equals the target's greedy continuation no row is censored and ``a_j`` is the plain
fraction of rows accepted through ``j``. Positions with nobody at risk (and ``a_{j-1} > 0``) have no
estimate: ``None``, and ``horizon`` counts the leading positions that have one.

**Which rows.** A row is scored where serving would run the drafter: while the assistant's answer is being
generated, i.e. ``x_{t+1}`` carries ``loss_mask`` 1 (:func:`rows_from_loss_mask`); prompt rows and batch
padding are skipped. Without a loss mask every row is scored.

**Acceptance length** is the usual EAGLE definition: the expected number of tokens a verify step emits,
``1 + sum_j a_j`` (the bonus token from the target plus the accepted drafts), over the ``horizon`` positions
(a lower bound when ``horizon < num_steps``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specparity.intervals import WILSON_Z as WILSON_Z
from specparity.intervals import wilson_interval as wilson_interval


def greedy_from_final_norm(final_norm: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
    """The target's greedy token per row: ``argmax(final_norm @ lm_head.T)`` (SpecForge's target head,
    `SF specforge/modeling/target/target_head.py:100-101`), in float32. ``[T]`` int64."""
    logits = final_norm.to(torch.float32) @ lm_head.to(torch.float32).T
    return logits.argmax(dim=-1)


def draft_next_ids(input_ids: torch.Tensor, target_greedy: torch.Tensor) -> torch.Tensor:
    """The ids the draft extend pairs with rows ``0..T-1``: ``x_1..x_{T-1}`` and the sampled ``G_{T-1}``.

    SGLang shifts ``input_ids`` left by one and appends the freshly sampled token (greedy here);
    `# sglang 0.5.23 speculative/eagle_worker_v2.py:980-992`.
    """
    return torch.cat([input_ids[1:], target_greedy[-1:]]).to(torch.int64)


def rows_from_loss_mask(loss_mask: torch.Tensor | None) -> torch.Tensor | None:
    """Rows scored where serving runs the drafter: ``x_{t+1}`` is a trained (assistant) token, i.e.
    ``loss_mask[t+1] == 1``. Prompt rows and SpecForge's trailing batch padding carry ``loss_mask`` 0.
    ``None`` (every row) when there is no mask or it marks nothing."""
    if loss_mask is None or not bool((loss_mask[1:] == 1).any()):
        return None
    rows = torch.zeros(loss_mask.shape[0], dtype=torch.bool)
    rows[:-1] = loss_mask[1:] == 1
    return rows


@dataclass(frozen=True)
class AcceptanceResult:
    """Counts behind the per-position acceptance of one side (recorded or served), over all samples."""

    num_steps: int
    at_risk: tuple[int, ...]  # per draft position j = 1..num_steps
    accepted: tuple[int, ...]

    @property
    def rows(self) -> int:
        """Rows evaluated at the first draft position."""
        return self.at_risk[0] if self.at_risk else 0

    @property
    def conditional(self) -> tuple[float | None, ...]:
        """``c_j``: accepted at j among those exactly known and accepted through j-1."""
        return tuple(a / n if n else None for a, n in zip(self.accepted, self.at_risk, strict=True))

    @property
    def per_position(self) -> tuple[float | None, ...]:
        """Product-limit acceptance ``a_j`` per draft position (index 0 = first draft)."""
        out: list[float | None] = []
        running: float | None = 1.0
        for c in self.conditional:
            if running is not None and running == 0.0:
                out.append(0.0)
                continue
            running = None if (running is None or c is None) else running * c
            out.append(running)
        return tuple(out)

    @property
    def horizon(self) -> int:
        """Leading positions that have an estimate."""
        n = 0
        for a in self.per_position:
            if a is None:
                break
            n += 1
        return n

    @property
    def defined(self) -> tuple[float, ...]:
        """``per_position`` over the horizon (no ``None``)."""
        return tuple(a for a in self.per_position[: self.horizon] if a is not None)

    @property
    def acceptance_length(self) -> float:
        """``1 + sum_j a_j`` over the horizon (EAGLE's acceptance length; a lower bound past the horizon)."""
        return 1.0 + sum(self.defined)

    @property
    def first_interval(self) -> tuple[float, float]:
        """95% Wilson interval of the first-position acceptance over the scored tokens (:func:`wilson_interval`)."""
        return wilson_interval(self.accepted[0] if self.accepted else 0, self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {"num_steps": self.num_steps, "at_risk": list(self.at_risk), "accepted": list(self.accepted),
                "per_position": list(self.per_position), "horizon": self.horizon,
                "acceptance_length": self.acceptance_length}

    def __add__(self, other: AcceptanceResult) -> AcceptanceResult:
        if other.num_steps != self.num_steps:
            raise ValueError("cannot add acceptance counts of different chain lengths")
        return AcceptanceResult(
            self.num_steps,
            tuple(a + b for a, b in zip(self.at_risk, other.at_risk, strict=True)),
            tuple(a + b for a, b in zip(self.accepted, other.accepted, strict=True)),
        )


def empty_result(num_steps: int) -> AcceptanceResult:
    return AcceptanceResult(num_steps, (0,) * num_steps, (0,) * num_steps)


def count_acceptance(drafts: torch.Tensor, input_ids: torch.Tensor, target_greedy: torch.Tensor, *,
                     rows: torch.Tensor | None = None) -> AcceptanceResult:
    """Counts for one sample. ``drafts`` ``[T, n]`` target ids ``d_1..d_n`` drafted from each row.

    ``rows`` (bool ``[T]``) restricts which rows start a chain; rows ``t > T-2`` never do (the target's
    answer to ``d_1`` would be past the sample).
    """
    t_len, n = drafts.shape
    if input_ids.shape[0] != t_len or target_greedy.shape[0] != t_len:
        raise ValueError(f"drafts {tuple(drafts.shape)}, input_ids {tuple(input_ids.shape)} and greedy "
                         f"{tuple(target_greedy.shape)} disagree on T")
    x, g = input_ids.to(torch.int64), target_greedy.to(torch.int64)
    start = torch.arange(t_len)
    eligible = start <= t_len - 2
    if rows is not None:
        eligible = eligible & rows.to(torch.bool)
    # text_follows[t] = x_{t+1} == G_t (the probe's next token is the target's greedy one)
    text_follows = torch.zeros(t_len, dtype=torch.bool)
    text_follows[:-1] = x[1:] == g[:-1]
    known = eligible.clone()  # steps 1..j exactly known
    alive = torch.ones(t_len, dtype=torch.bool)  # d_1..d_{j-1} accepted
    at_risk: list[int] = []
    accepted: list[int] = []
    for j in range(1, n + 1):
        ref_idx = start + j  # the target's answer to d_j is G_{t+j}
        in_range = ref_idx <= t_len - 1
        if j > 1:  # x_{t+j} must equal G_{t+j-1}
            follow = torch.zeros(t_len, dtype=torch.bool)
            idx = start + j - 1
            ok = idx <= t_len - 1
            follow[ok] = text_follows[idx[ok]]
            known = known & follow
        known = known & in_range
        risk = known & alive
        ref = torch.full((t_len,), -1, dtype=torch.int64)
        ref[in_range] = g[ref_idx[in_range]]
        hit = risk & (drafts[:, j - 1].to(torch.int64) == ref)
        at_risk.append(int(risk.sum()))
        accepted.append(int(hit.sum()))
        alive = alive & (drafts[:, j - 1].to(torch.int64) == ref)
    return AcceptanceResult(n, tuple(at_risk), tuple(accepted))


@dataclass(frozen=True)
class ReplaySample:
    """One probe sample as the replay needs it (all row-aligned, row t = token t)."""

    input_ids: torch.Tensor  # [T] int64
    fc_input: torch.Tensor  # [T, k*H_t]
    target_greedy: torch.Tensor  # [T] G_t, target ids
    rows: torch.Tensor | None = None  # bool [T]: rows that start a chain (None = all)


def measure(drafter: Any, samples: Sequence[ReplaySample], *, num_steps: int,
            first_drafts: Sequence[torch.Tensor] | None = None) -> AcceptanceResult:
    """Acceptance of ``drafter`` (an :class:`~specparity.replay.drafter.Eagle3Drafter`) over ``samples``.

    ``first_drafts[i]`` (``[T]`` target ids) replaces the training-side ``d_1`` of sample ``i``, e.g. with
    what SGLang's real drafter produced; later steps continue from it on the training side.
    """
    if num_steps < 1:
        raise ValueError("num_steps must be >= 1")
    total = empty_result(num_steps)
    for i, s in enumerate(samples):
        if s.input_ids.shape[0] < 2:
            continue
        next_ids = draft_next_ids(s.input_ids, s.target_greedy)
        first = None if first_drafts is None else first_drafts[i]
        drafts = drafter.draft_chain(s.fc_input, next_ids, num_steps=num_steps, first_draft=first)
        total = total + count_acceptance(drafts, s.input_ids, s.target_greedy, rows=s.rows)
    return total
