"""What a caller hands ``StreamManager.start_stream``, and what it gets back.

A request carries the turn's continuation state in (``step_budget``, ``fallback_progress``) and
the outcome carries it out again (``remaining``, ``model``, ``progress``), so every cut,
abort and failure hands its successor exactly what the turn has left (SM-8, SM-14, SM-20).
Outcomes are values: a refused launch, an abort and a failure are returned, never raised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from stream_manager._events import AbortReason, ErrorKind, StartCause
from stream_manager._fallback import ModelFallbackProgress

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from message_queue import Correlation
    from stream_manager._abort import AbortSignal
    from stream_manager._parts import ChatMessage, FinishReason, Part
    from stream_manager._stop import StopWhy
    from stream_manager.errors import ErrorType


class QueuedStopReport(msgspec.Struct, frozen=True, kw_only=True):
    """SM-8: a loop stopped at a tool boundary purely for a queued tool-end entry."""

    stream: str
    #: The model that ran the cut step (a fallback may differ from the requested one, R15).
    model: str
    #: ``ceiling - spent``, at least 1 (a zero remainder is a step-cap stop, R65).
    steps_remaining: int
    fallback_progress: ModelFallbackProgress


class AbortMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """SM-14: what an abort reports beside its reason."""

    #: The stream's effective model; aborted usage is priced under it (R59).
    model: str
    steps_remaining: int
    fallback_progress: ModelFallbackProgress
    #: The step being cut already had a successful required-tool result (R46).
    required_tool_satisfied: bool


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """The registered stream, as the envelope hook sees it."""

    session: str
    stream: str
    model: str
    budget: int


@dataclass(frozen=True, kw_only=True)
class StreamRequest:
    """One stream to run for ``session``."""

    session: str
    model: str
    messages: tuple[ChatMessage, ...]
    #: The stream's id (the assistant message id); ``None``: the manager makes one.
    stream_id: str | None = None
    cause: StartCause = StartCause.SEND
    #: The delegated handle the stream belongs to, for the trace.
    handle: str | None = None
    #: What the logical turn has left; ``None`` for a fresh turn (``MAX_STREAM_STEPS``).
    step_budget: int | None = None
    #: The turn's fallback progress carried from its predecessor (ST-13, R39).
    fallback_progress: ModelFallbackProgress | None = None
    correlation: Correlation | None = None
    extra_system_context: str | None = None
    thinking_level: str | None = None
    #: Consulted at each step's preparation: the thinking level in force for that step (a
    #: mid-turn change is applied at the next step). ``None``: ``thinking_level`` throughout.
    thinking_for_step: Callable[[], str | None] | None = None
    #: Required-tool patterns beyond the tools of kind ``completion`` (SM-7 condition 3).
    required_tools: tuple[str, ...] = ()
    #: The live reader "is a tool-end entry queued?" (MQ-8); ``None``: never.
    has_queued_tool_end: Callable[[], bool] | None = None
    #: SM-8's synchronous report, called before ``stream-end`` is emitted.
    on_queued_message_stop: Callable[[QueuedStopReport], None] | None = None
    #: SM-4's launch probe: a reason to refuse the launch, or ``None``.
    refuse_stream_start: Callable[[], str | None] | None = None
    #: SM-3's durable turn-envelope write, awaited after registration.
    on_stream_constructed: Callable[[StreamInfo], Awaitable[None]] | None = None
    #: The caller's abort signal (SM-2): fired before processing began, the launch is
    #: ``Withdrawn`` with its reason; fired during processing, a hard stop with that reason.
    abort: AbortSignal | None = None
    #: Awaited (shielded) right after ``stream-start`` and before the first step: what the
    #: start makes durable (the consumed continuation's record) lands before the model runs.
    on_started: Callable[[], Awaitable[None]] | None = None
    #: SM-15's durable final write (the assistant row, with the cut record when the stream was
    #: cut, R60), awaited shielded after the stream is COMPLETED and before ``stream-end``.
    on_complete: Callable[[Ended], Awaitable[None]] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Ended:
    """The stream finished normally (``stream-end``)."""

    stream: str
    model: str
    finish: FinishReason
    why: StopWhy
    steps: int
    remaining: int
    progress: ModelFallbackProgress
    #: Set when the loop was cut for a queued entry (SM-8); the durable cut record (R60).
    queued_stop: QueuedStopReport | None
    parts: tuple[Part, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Aborted:
    """The stream was stopped (``stream-abort``)."""

    stream: str
    reason: AbortReason
    metadata: AbortMetadata
    parts: tuple[Part, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Failed:
    """The stream failed (``stream-error``); SM-20: it reports what the attempt left."""

    stream: str
    type: ErrorType
    kind: ErrorKind
    message: str
    remaining: int
    model: str
    progress: ModelFallbackProgress
    parts: tuple[Part, ...]

    @property
    def retryable(self) -> bool:
        """Whether an auto-retry may continue the turn (SM-19)."""
        return self.kind is ErrorKind.RETRYABLE


@dataclass(frozen=True, slots=True)
class Refused:
    """The launch was refused before ``stream-start`` (SM-4, or nothing left to spend)."""

    why: str


@dataclass(frozen=True, slots=True)
class Withdrawn:
    """The launch was taken back before processing began (SM-2, SM-3): nothing started.

    ``reason`` is the caller's signal's reason, or the hard stop's (``system`` when another
    launch of the session replaced this one).
    """

    reason: AbortReason


StreamOutcome = Ended | Aborted | Failed | Refused | Withdrawn
