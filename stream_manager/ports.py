"""The ports the step loop talks to: ``Model``, ``Tool`` and ``Clock``.

Hosts implement them (or use the ``ScriptedModel`` and the clocks in ``stream_manager.clock``);
the engine never imports a provider SDK.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from message_queue import Correlation

# A tool's kind and the (kind, name) pair a receipt records live in `persistence`, the layer
# that stores them; they are this package's names too (`stream_manager.ToolKind`, `.Capability`).
from persistence.records import Capability as Capability
from persistence.records import ToolKind as ToolKind
from stream_manager._parts import ChatMessage, Part, ToolCallPart, ToolResultPart
from stream_manager.clock import Timer
from stream_manager.tools import ToolDefinition


class ModelRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What one model call is asked: one step of a stream."""

    model: str
    stream: str
    #: The step's number in the stream (1-based, across in-stream restarts).
    step: int
    #: The step ceiling of the loop this step runs in (a restarted loop's is the remainder).
    step_ceiling: int
    messages: tuple[ChatMessage, ...]
    correlation: Correlation | None = None
    extra_system_context: str | None = None
    thinking_level: str | None = None
    #: The tools the session offers, in the engine's order (``stream_manager.tools``).
    tools: tuple[ToolDefinition, ...] = ()


class Model(Protocol):
    """A model: one call runs one step and streams its parts.

    A call fails by raising a :class:`~stream_manager.errors.ModelError` (retryable, terminal,
    context exceeded, or a malformed output).
    """

    @property
    def id(self) -> str:
        """The model's id, as chains and requests name it."""
        ...

    def stream_step(self, request: ModelRequest) -> AsyncIterator[Part]:
        """Run one step and yield its parts, ending with a ``Finish``."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolContext:
    """Where a tool call runs, and how its layer records its own completion (OP-5)."""

    session: str
    stream: str
    op_id: str
    #: The operation's absolute deadline on the engine's clock (seconds).
    deadline_at: float
    #: The tool layer records its result here the moment it has one, independent of whether
    #: ``execute`` ever returns it (a lost completion signal is then settled from the record).
    record_completion: Callable[[ToolResultPart], None] = field(default=lambda result: None)
    #: The tool layer reports progress here (``progress``, ``total`` or ``None``, ``message`` or
    #: ``None``); the engine traces it (``op-progress``). It never extends the deadline.
    report_progress: Callable[[float, float | None, str | None], None] = field(
        default=lambda progress, total, message: None
    )


class Tool(Protocol):
    """A client-executed tool. Its execute runs inside a cancel scope the engine owns."""

    @property
    def name(self) -> str:
        """The name the model calls it by."""
        ...

    @property
    def kind(self) -> ToolKind:
        """How it runs."""
        ...

    async def execute(self, call: ToolCallPart, context: ToolContext) -> ToolResultPart:
        """Run the call and return its result; raising is a failed result, not a crash."""
        ...


class Clock(Protocol):
    """The engine's only source of time. ``now`` is in seconds; deadlines are absolute."""

    def now(self) -> float:
        """The current time in seconds."""
        ...

    async def sleep_until(self, deadline_at: float) -> None:
        """Return once ``now() >= deadline_at``."""
        ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` (synchronously, on the loop) once ``now() >= when``."""
        ...
