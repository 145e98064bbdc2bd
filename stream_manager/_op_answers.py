"""What the model is told about a tool call that gave no result of its own (``docs/operations.md``).

Every tool call in history has a result before the next model request: providers refuse a
history holding an assistant's call with no result (OpenAI answers 400, Anthropic refuses a
``tool_use`` without its ``tool_result``), and the model must learn what happened to its call. A
call that was stopped, cancelled before it ran, or left indeterminate gets, in place of a result
of its own, one that states its receipt: the operation id, the receipt's state and outcome,
whether the tool confirmed it stopped, and, where nobody knows, that the call must not be assumed
to have run or not to have run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from persistence import OperationRecord, OpState
from stream_manager._parts import Finish, Part, ToolCallPart, ToolResultPart

if TYPE_CHECKING:
    from collections.abc import Sequence

_UNKNOWN = (
    "the call was stopped and nobody confirmed that it stopped: whether it ran, and what it "
    "changed, is unknown; do not assume it ran or that it did not run"
)
_NEVER_RECORDED = (
    "the call was stopped and no receipt of it reached the model; whether it ran is unknown: "
    "do not assume it ran or that it did not run"
)

_NOT_MADE = "the stream was stopped before this call was made; it did not run"

#: What the model is told, by the receipt's state (the receipt's explanation says more).
_KNOWN = {
    OpState.REQUESTED: "the call was stopped before it ran",
    OpState.RUNNING: _UNKNOWN,
    OpState.INDETERMINATE: _UNKNOWN,
    OpState.CANCELLED: "the call was cancelled and that it stopped was confirmed",
    OpState.TIMED_OUT: "the call passed its deadline and that it stopped was confirmed",
    OpState.FAILED: "the call failed",
    OpState.COMPLETED: "the call completed, but its result did not reach the model",
}


def failed_result(call: ToolCallPart, error: str, **extra: object) -> ToolResultPart:
    """A structured failed result for ``call``: the model sees why, the loop goes on."""
    return ToolResultPart(
        call_id=call.call_id, name=call.name, output={"error": error, **extra}, is_error=True
    )


def receipt_answer(
    call: ToolCallPart,
    record: OperationRecord | None,
    *,
    error: str = "no_result",
    detail: str | None = None,
) -> ToolResultPart:
    """The result that answers ``call`` from its receipt (``None``: it never got one).

    ``error`` names what happened (``timeout``, ``cancelled``; ``no_result`` by default) and
    ``detail`` adds a sentence.
    """
    fields: dict[str, object] = {}
    if record is None:
        fields["what_is_known"] = _NEVER_RECORDED
    else:
        fields |= {
            "op": record.op_id,
            "receipt": record.state.value,
            "acknowledged": record.termination_acknowledged,
            "what_is_known": _KNOWN[record.state],
        }
        if record.outcome_code is not None:
            fields["outcome"] = record.outcome_code
        if record.explanation is not None:
            fields["explanation"] = record.explanation
    if detail is not None:
        fields["detail"] = detail
    return failed_result(call, error, **fields)


def unanswered_calls(parts: Sequence[Part]) -> list[ToolCallPart]:
    """The client calls among ``parts`` that no result among them answers, in order."""
    return [call for _, call in _open_calls(parts)]


def answer_open_calls(parts: list[Part], *, mid_step: bool) -> None:
    """Answer every client call of an aborted stream's ``parts`` that has no result.

    A call of the step the stop cut mid-flight (``mid_step``: after the last finish) was never
    made; any other one reached the operations runner, whose answers came first, so what is
    left is answered as unknown.
    """
    step_start = max((i + 1 for i, part in enumerate(parts) if isinstance(part, Finish)), default=0)
    for index, call in _open_calls(parts):
        if mid_step and index >= step_start:
            parts.append(failed_result(call, "no_result", what_is_known=_NOT_MADE))
        else:
            parts.append(receipt_answer(call, None))


def _open_calls(parts: Sequence[Part]) -> list[tuple[int, ToolCallPart]]:
    answered = {p.call_id for p in parts if isinstance(p, ToolResultPart)}
    return [
        (index, part)
        for index, part in enumerate(parts)
        if isinstance(part, ToolCallPart)
        and not part.provider_executed
        and part.call_id not in answered
    ]
