"""Checks on what a model streams: malformed output is a typed terminal error, never a hang.

Pure: a part and what came before it in, a sentence out (``None`` when the part is fine).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stream_manager._parts import (
    Finish,
    FinishReason,
    Part,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

_KNOWN = (TextPart, ReasoningPart, ToolCallPart, ToolResultPart, Finish)


def malformed(
    part: object, before: Sequence[Part], calls: Mapping[str, ToolCallPart]
) -> str | None:
    """Why ``part`` cannot follow ``before`` in one step, or ``None`` when it can."""
    if not isinstance(part, _KNOWN):
        return f"unknown part type {type(part).__name__}"
    if before and isinstance(before[-1], Finish):
        return f"a {type(part).__name__} after the step's finish"
    if isinstance(part, TextPart | ReasoningPart):
        text: object = part.text  # msgspec does not check types at construction
        return None if isinstance(text, str) else "a text part whose text is not a string"
    if isinstance(part, ToolCallPart):
        return _bad_call(part, calls)
    if isinstance(part, ToolResultPart):
        call = calls.get(part.call_id)
        if call is None or not call.provider_executed:
            return f"a tool result for {part.call_id!r}, which is no provider-executed call"
        return None
    return _bad_finish(part, before, calls)


def _bad_call(part: ToolCallPart, calls: Mapping[str, ToolCallPart]) -> str | None:
    name: object = part.name
    call_id: object = part.call_id
    if not isinstance(name, str) or not name:
        return "a tool call with no name"
    if not isinstance(call_id, str) or not call_id:
        return f"a call to {part.name!r} with no call id"
    if part.call_id in calls:
        return f"a second tool call with id {part.call_id!r}"
    return None


def _bad_finish(
    part: Finish, before: Sequence[Part], calls: Mapping[str, ToolCallPart]
) -> str | None:
    reason: object = part.reason
    if not isinstance(reason, FinishReason):
        return f"unknown finish reason {reason!r}"
    if not before and part.reason is not FinishReason.REFUSAL:
        return f"a finish ({part.reason}) before any part"
    if part.reason is FinishReason.TOOL_CALLS and not calls:
        return "a tool-calls finish without any tool call"
    return None
