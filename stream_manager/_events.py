"""The events the stream manager reports, with the names and fields of ``docs/trace.md``.

Events are past-tense facts, frozen msgspec Structs tagged by ``event``. They are handed to the
observers synchronously, when the fact is recorded and before any reaction to it runs; the trace
observer adds ``seq`` and ``t``. Constructing an event is skipped entirely when no observer is
attached, so an unobserved engine pays nothing for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import StrEnum

import msgspec

from stream_manager._parts import FinishReason
from stream_manager._stop import StopWhy
from stream_manager.redaction import redact


class AbortReason(StrEnum):
    """Why a stream was stopped (``stream-abort.reason`` in ``docs/trace.md``)."""

    #: An explicit Stop, edit or send-now.
    USER = "user"
    #: A backend hard stop: task stop, cascade, timeout, compaction interrupt, disposal.
    SYSTEM = "system"
    #: A stop while no stream is registered yet (the default for synthetic aborts).
    STARTUP = "startup"
    #: The provider-tool soft stop made for a queued tool-end entry; the only reason that may
    #: owe a continuation.
    QUEUED_MESSAGE = "queued-message"


class StartCause(StrEnum):
    """What started a stream (``stream-start.cause`` in ``docs/trace.md``)."""

    SEND = "send"
    QUEUE = "queue"
    RESUME = "resume"
    RETRY = "retry"
    RECOVERY = "recovery"
    FOLLOW_UP = "follow-up"


class ErrorKind(StrEnum):
    """The category of a stream error as the trace reports it."""

    RETRYABLE = "retryable"
    TERMINAL = "terminal"
    CONTEXT_EXCEEDED = "context_exceeded"


class _Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="event", gc=False):
    session: str | None


class StreamStarted(_Event, frozen=True, kw_only=True, tag="stream-start"):
    """A stream began processing; its first event."""

    stream: str
    model: str
    #: The stream's step ceiling.
    budget: int
    cause: StartCause
    handle: str | None = None


class StepCompleted(_Event, frozen=True, kw_only=True, tag="step"):
    """One model step finished (a refused step included)."""

    stream: str
    #: The step's number in the stream, counted across in-stream restarts.
    n: int
    model: str


class StepUsage(_Event, frozen=True, kw_only=True, tag="usage"):
    """What a finished step used, when its model reported it (right after its ``step``)."""

    stream: str
    n: int
    #: The model that ran the step (a fallback's usage is its own, R59).
    model: str
    input_tokens: int
    output_tokens: int


class FellBack(_Event, frozen=True, kw_only=True, tag="fallback"):
    """A refusal hopped to the next model of the chain."""

    stream: str
    from_: str = msgspec.field(name="from")
    to: str
    refused: tuple[str, ...]


class LoopStopped(_Event, frozen=True, kw_only=True, tag="stop"):
    """The model loop ended, and why."""

    stream: str
    why: StopWhy


class StreamEnded(_Event, frozen=True, kw_only=True, tag="stream-end"):
    """The stream finished normally."""

    stream: str
    finish: FinishReason
    steps: int
    remaining: int


class StreamAborted(_Event, frozen=True, kw_only=True, tag="stream-abort"):
    """The stream was stopped; ``stream`` is empty for a synthetic abort (SM-12)."""

    stream: str
    reason: AbortReason
    remaining: int


class StreamFailed(_Event, frozen=True, kw_only=True, tag="stream-error"):
    """The stream failed."""

    stream: str
    kind: ErrorKind
    remaining: int
    #: The error type (SM-19), e.g. ``model_refusal`` or ``stream_truncated``.
    type: str
    #: What happened, redacted when the event is built: a provider's error text may quote a
    #: credential, and an observer never receives one (``docs/trace.md``, "Redaction").
    message: str

    def __post_init__(self) -> None:
        msgspec.structs.force_setattr(self, "message", redact(self.message))


class LaunchRefused(_Event, frozen=True, kw_only=True, tag="launch-refused"):
    """A launch was refused before any ``stream-start`` (SM-4)."""

    #: Why, redacted when the event is built (a host's launch probe writes it).
    why: str

    def __post_init__(self) -> None:
        msgspec.structs.force_setattr(self, "why", redact(self.why))


class ToolCallStarted(_Event, frozen=True, kw_only=True, tag="tool-call-start"):
    """The model asked for a tool (AS-20); provider calls run inside the step."""

    stream: str
    call: str
    tool: str
    provider: bool


class ToolCallEnded(_Event, frozen=True, kw_only=True, tag="tool-call-end"):
    """A tool call has its result: a provider's inside the step, or the engine's execution."""

    stream: str
    call: str
    tool: str
    provider: bool
    is_error: bool


class OperationStarted(_Event, frozen=True, kw_only=True, tag="op-start"):
    """A tool call is about to execute as an operation."""

    op: str
    tool: str
    stream: str
    #: The operation's absolute deadline, in clock milliseconds.
    deadline: int


class OpCancelRequested(_Event, frozen=True, kw_only=True, tag="op-cancel-requested"):
    """Cancellation of an operation was requested (and recorded durably first, OP-3)."""

    op: str
    why: str


class ReceiptWritten(_Event, frozen=True, kw_only=True, tag="receipt"):
    """An operation reached a terminal or indeterminate state, durably."""

    op: str
    tool: str
    state: str
    acknowledged: bool
    #: A second receipt: the same layer really ended the operation after its first receipt
    #: said ``indeterminate`` (OP-8).
    resolved_late: bool


class OpBlocked(_Event, frozen=True, kw_only=True, tag="op-blocked"):
    """A call was refused while an earlier one on the same target is indeterminate (OP-9)."""

    op: str
    tool: str
    blocked_by: str


class OpOverlapWarned(_Event, frozen=True, kw_only=True, tag="op-overlap-warned"):
    """A call runs although an earlier one on its target is indeterminate (OP-9, ``warn``)."""

    op: str
    tool: str
    #: The indeterminate operation it overlaps.
    overlaps: str


class Persisted(_Event, frozen=True, kw_only=True, tag="persisted"):
    """A durable write committed (a crash point)."""

    what: str
    id: str


class OpProgress(_Event, frozen=True, kw_only=True, tag="op-progress"):
    """A running operation's tool layer reported progress (an MCP progress notification).

    Progress is only reported: it never extends the operation's deadline.
    """

    op: str
    progress: float
    #: The total the progress counts towards, when the tool layer knows one.
    total: float | None = None
    message: str | None = None


StreamEvent = (
    StreamStarted
    | StepCompleted
    | StepUsage
    | FellBack
    | LoopStopped
    | StreamEnded
    | StreamAborted
    | StreamFailed
    | LaunchRefused
    | OperationStarted
    | ToolCallStarted
    | ToolCallEnded
    | OpCancelRequested
    | ReceiptWritten
    | OpBlocked
    | Persisted
    | OpProgress
    | OpOverlapWarned
)

Observer = Callable[[StreamEvent], None]


class Emitter:
    """The observers of one stream manager, and the one way its parts report to them.

    The manager, its step-loop processor and its operation runner share one emitter; a part
    checks :attr:`observers` before it builds an event, so an unobserved manager pays nothing.
    """

    __slots__ = ("observers",)

    def __init__(self, observers: Iterable[Observer] = ()) -> None:
        self.observers: list[Observer] = list(observers)

    def add(self, observer: Observer) -> None:
        """Report every later event to ``observer`` too (synchronously, in order)."""
        self.observers.append(observer)

    def emit(self, event: StreamEvent) -> None:
        """Hand ``event`` to every observer, in the order they were added."""
        for observer in self.observers:
            observer(event)
