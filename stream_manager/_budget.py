"""The step budget of one logical turn (SM-7, SM-9, SM-17, SM-18, ST-12, R37, R65).

A turn may run as several streams (the original, resumes after cuts, auto-retries) and a stream
as several loops (fallback hops, the empty-output retry, the previous-response retry). All of
them share one ceiling: a stream starts with the remainder its predecessor left
(``step_budget``), counts every completed step (a refused step and a step cut mid-flight
included), and a restarted loop runs under what is left, never a fresh ceiling.

Pure: plain values in, plain values out.
"""

from __future__ import annotations

import msgspec

from persistence import UsageError


class StepBudget(msgspec.Struct, frozen=True, kw_only=True):
    """What one stream may spend: its ceiling and the steps it has spent so far."""

    #: The stream's step ceiling: the request's ``step_budget``, else ``MAX_STREAM_STEPS``.
    ceiling: int
    #: Completed steps of this stream, across all its in-stream restarts (SM-9).
    spent: int = 0

    @property
    def remaining(self) -> int:
        """``max(0, ceiling - spent)``: what a cut, abort or failure hands its successor."""
        return max(0, self.ceiling - self.spent)

    @property
    def exhausted(self) -> bool:
        """The step cap holds (SM-7 condition 1): nothing may start or restart."""
        return self.spent >= self.ceiling

    def charge(self) -> StepBudget:
        """Spend one completed step.

        Raises:
            UsageError: the budget was already exhausted (a step ran that should not have).
        """
        if self.exhausted:
            raise UsageError(f"a step was charged to an exhausted budget {self!r}")
        return StepBudget(ceiling=self.ceiling, spent=self.spent + 1)


def initial_budget(step_budget: int | None, max_stream_steps: int) -> StepBudget:
    """The budget a new stream starts with (SM-7, ST-12).

    Args:
        step_budget: what the turn has left (a resume's or retry's remainder), or ``None`` for
            a fresh turn.
        max_stream_steps: the engine's ceiling for one logical turn.

    Raises:
        UsageError: a budget that is not a non-negative integer (never read as absent, R61).
    """
    for name, value in (("step_budget", step_budget), ("max_stream_steps", max_stream_steps)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise UsageError(f"{name} must be an integer, got {value!r}")
        if value is not None and value < 0:
            raise UsageError(f"{name} must not be negative, got {value}")
    ceiling = max_stream_steps if step_budget is None else step_budget
    return StepBudget(ceiling=ceiling)
