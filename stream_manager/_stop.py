"""Stop conditions at a tool boundary (SM-5, SM-7, SM-8, R5, R46, R65).

The loop asks :func:`decide_stop` only after every client tool call of the step has a result.
Three conditions can end the loop there; only the queued-message one is a *cut* that owes a
continuation, and it is reported only when neither of the others holds (R5: a cut at the step
cap would resume past the ceiling; R46: a turn whose required tool succeeded ended
legitimately).

Pure: plain values in, a decision out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stream_manager._parts import ToolResultPart


class StopWhy(StrEnum):
    """Why a stream's loop ended (``stop.why`` in ``docs/trace.md``)."""

    QUEUED_MESSAGE = "queued-message"
    STEP_CAP = "step-cap"
    REQUIRED_TOOL = "required-tool"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class StopDecision:
    """The loop stops at this tool boundary."""

    why: StopWhy

    @property
    def reports_queued_stop(self) -> bool:
        """SM-8: only a pure queued-message stop is reported (and owes a continuation)."""
        return self.why is StopWhy.QUEUED_MESSAGE


def decide_stop(
    *, budget_exhausted: bool, queued_tool_end: bool, required_tool_satisfied: bool
) -> StopDecision | None:
    """SM-7: ``None`` to run another step, else why the loop stops.

    Precedence for the reported reason: the step cap, then a satisfied required tool, then a
    live queued ``tool-end`` entry.
    """
    if budget_exhausted:
        return StopDecision(StopWhy.STEP_CAP)
    if required_tool_satisfied:
        return StopDecision(StopWhy.REQUIRED_TOOL)
    if queued_tool_end:
        return StopDecision(StopWhy.QUEUED_MESSAGE)
    return None


class RequiredTools:
    """Anchored full-name patterns of the tools whose success ends a turn (SM-7 condition 3).

    A leading ``^`` or trailing ``$`` in a configured pattern is tolerated; every pattern must
    match the whole tool name.
    """

    __slots__ = ("_patterns",)

    def __init__(self, patterns: Iterable[str] = ()) -> None:
        self._patterns: tuple[re.Pattern[str], ...] = tuple(
            re.compile(p.removeprefix("^").removesuffix("$")) for p in patterns
        )

    def __bool__(self) -> bool:
        return bool(self._patterns)

    def matches(self, name: str) -> bool:
        """Whether ``name`` is a required tool."""
        return any(pattern.fullmatch(name) for pattern in self._patterns)

    def satisfied_by(self, results: Sequence[ToolResultPart]) -> bool:
        """Whether one of a step's results is a successful result of a required tool."""
        return any(
            self.matches(result.name) and not result.is_error and is_success(result.output)
            for result in results
        )


def is_success(output: object) -> bool:
    """SM-7's success rule for a required tool's output.

    ``success`` present → it must be ``True``; else ``ok`` present → it must be ``True``; else an
    object with no ``error`` and ``isError`` not ``True`` succeeds. Non-objects never do.
    ``success: false`` means "retry the tool", not a stop.
    """
    if not isinstance(output, Mapping):
        return False
    if "success" in output:
        return output["success"] is True
    if "ok" in output:
        return output["ok"] is True
    return "error" not in output and output.get("isError") is not True
