"""What a model step streams, and the messages a request carries.

A model call runs one step and yields *parts*: text and reasoning blocks (each ends at its own
boundary, the ``text-end`` / ``reasoning-end`` where a soft stop may land), tool calls (client
or provider-executed), the results of provider-executed tools, and one ``Finish``. All are
frozen msgspec Structs tagged by ``type``.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

import msgspec


class FinishReason(StrEnum):
    """Why a step finished (``stream-end.finish`` in ``docs/trace.md``)."""

    STOP = "stop"
    TOOL_CALLS = "tool-calls"
    LENGTH = "length"
    REFUSAL = "refusal"


class TextPart(msgspec.Struct, frozen=True, kw_only=True, tag="text", tag_field="type"):
    """A complete text block; its end is a soft-stop boundary."""

    text: str


class ReasoningPart(msgspec.Struct, frozen=True, kw_only=True, tag="reasoning", tag_field="type"):
    """A complete reasoning block; its end is a soft-stop boundary."""

    text: str


class ToolCallPart(msgspec.Struct, frozen=True, kw_only=True, tag="tool-call", tag_field="type"):
    """The model asks for a tool.

    A client-executed call is run by the engine after the step finishes; a provider-executed one
    runs inside the model's response and is answered by a :class:`ToolResultPart` in the same step.
    """

    call_id: str
    name: str
    args: Mapping[str, object] = msgspec.field(default_factory=dict)
    provider_executed: bool = False


class ToolResultPart(
    msgspec.Struct, frozen=True, kw_only=True, tag="tool-result", tag_field="type"
):
    """A tool's result: a provider's inside the step, or the engine's after executing a call."""

    call_id: str
    name: str
    output: object = None
    is_error: bool = False
    provider_executed: bool = False


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """What one model step used, as its provider reported it."""

    input_tokens: int = 0
    output_tokens: int = 0


class ModelUsage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a stream's steps on one model used, summed (SM-14, SM-15: priced under it, R59)."""

    model: str
    input_tokens: int = 0
    output_tokens: int = 0


def add_usage(usage: tuple[ModelUsage, ...], model: str, step: Usage) -> tuple[ModelUsage, ...]:
    """``usage`` with one more step of ``model`` counted (a fallback's usage is its own)."""
    for index, known in enumerate(usage):
        if known.model == model:
            summed = ModelUsage(
                model=model,
                input_tokens=known.input_tokens + step.input_tokens,
                output_tokens=known.output_tokens + step.output_tokens,
            )
            return (*usage[:index], summed, *usage[index + 1 :])
    return (
        *usage,
        ModelUsage(model=model, input_tokens=step.input_tokens, output_tokens=step.output_tokens),
    )


def merge_usage(
    usage: tuple[ModelUsage, ...], more: tuple[ModelUsage, ...]
) -> tuple[ModelUsage, ...]:
    """``usage`` with ``more`` added, model by model."""
    for extra in more:
        step = Usage(input_tokens=extra.input_tokens, output_tokens=extra.output_tokens)
        usage = add_usage(usage, extra.model, step)
    return usage


class Finish(msgspec.Struct, frozen=True, kw_only=True, tag="finish", tag_field="type"):
    """The step's terminal part: the step is complete (a ``finish-step``)."""

    reason: FinishReason
    #: The step's token usage, when the model reports it (a ``usage`` event follows ``step``).
    usage: Usage | None = None


Part = TextPart | ReasoningPart | ToolCallPart | ToolResultPart | Finish


class Role(StrEnum):
    """Who speaks in a request message."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One message of a model request."""

    role: Role
    text: str = ""
    tool_calls: tuple[ToolCallPart, ...] = ()
    tool_results: tuple[ToolResultPart, ...] = ()
