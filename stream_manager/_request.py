"""What a caller hands ``StreamManager.start_stream``, and what it gets back.

A request carries the turn's continuation state in (``step_budget``, ``fallback_progress``) and
the outcome carries it out again (``remaining``, ``model``, ``progress``), so every cut,
abort and failure hands its successor exactly what the turn has left (SM-8, SM-14, SM-20).
Outcomes are values: a refused launch, an abort and a failure are returned, never raised.

While the stream runs, the manager talks to its caller through one typed port the request
carries, :class:`StreamHost`: it asks (``thinking_for_step``, ``tool_end_queued``,
``refusal``), it reports a cut synchronously (``queued_stop``, SM-8) and it awaits the host at
each durable boundary of the stream's life (``reached`` with a :data:`Milestone`:
:class:`Constructed`, :class:`Started`, :class:`Completed`). :class:`NullHost` asks and records
nothing, for callers that need no host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import msgspec

from message_queue import Correlation
from stream_manager._abort import AbortSignal
from stream_manager._events import AbortReason, ErrorKind, StartCause
from stream_manager._fallback import ModelFallbackProgress
from stream_manager._parts import ChatMessage, ModelUsage

if TYPE_CHECKING:
    from stream_manager._parts import FinishReason, Part
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
    #: What the stream's steps used, by model (SM-14: stamped on the partial, R59).
    usage: tuple[ModelUsage, ...] = ()


class StreamInfo(msgspec.Struct, frozen=True):
    """The registered stream, as the host sees it at its milestones."""

    session: str
    stream: str
    model: str
    budget: int


class Constructed(msgspec.Struct, frozen=True):
    """SM-3: the stream is registered (``STARTING``); nothing has been emitted for it yet.

    The host makes the turn envelope durable here. The manager awaits it (not shielded), then
    checks the caller's signal, the registration and the launch probe again (SM-2, SM-3, SM-4)
    before anything starts; a host that raises deregisters the stream, and the error
    propagates from ``start_stream``.
    """

    info: StreamInfo


class Started(msgspec.Struct, frozen=True):
    """SM-3: ``stream-start`` was emitted; the first step has not been asked for yet.

    Awaited shielded, so what the start makes durable (the consumed continuation's record,
    AS-19) lands before the model runs, and no cancellation cuts it short; but bounded: after
    the cleanup bound (``cleanup_s``) the host's await is cancelled and the start counts as not
    durable (the stream fails ``store_write``, no step runs). A host treats that cancellation
    as a failed write.
    """

    info: StreamInfo


class Completed(msgspec.Struct, frozen=True):
    """SM-15: the loop stopped normally; the stream is ``COMPLETED``, ``stream-end`` not yet out.

    The host makes the final row durable here (the assistant row; a cut's row carries the cut
    record ``ended.queued_stop``, R60). Awaited shielded; a hard stop arriving meanwhile emits
    nothing (SM-11). ``stream-end`` is emitted once it returns. Bounded like ``Started``: cut
    short, the host's await is cancelled, the write counts as failed and the stream ends in a
    ``store_write`` error instead.
    """

    ended: Ended


Milestone = Constructed | Started | Completed
"""A durable boundary of a stream's life, in the order a stream reaches them; the manager
awaits the host at each one (``StreamHost.reached``)."""


class StreamHost(Protocol):
    """The caller's side of one stream: what the manager asks it, and what it tells it.

    Queries are synchronous and cheap: the manager calls them on its hot path. Reports are
    typed values: the synchronous cut report, and the milestones the manager awaits.
    """

    def thinking_for_step(self) -> str | None:
        """The thinking level the next step prepares with; ``None``: no thinking level.

        Asked before every step, so a mid-turn change applies at the next step.
        """
        ...

    def tool_end_queued(self) -> bool:
        """SM-7: whether a live ``tool-end`` entry is queued (MQ-8).

        Asked at each tool boundary, once every result of the step has settled (SM-5).
        """
        ...

    def refusal(self) -> str | None:
        """SM-4, the launch probe: why the launch must be refused, or ``None``.

        Asked right before the stream is registered and again once ``Constructed`` returned.
        """
        ...

    def queued_stop(self, report: QueuedStopReport) -> None:
        """SM-8, R1: the loop was cut for a queued entry alone.

        Never for the step cap or a required tool (R5, R46, R65). Called once, synchronously,
        after ``stop`` and before the stream's ``Completed`` milestone and its ``stream-end``,
        so what the host records here exists before anyone handles the cut stream's end.
        """
        ...

    async def reached(self, milestone: Milestone) -> None:
        """The stream reached ``milestone``; the manager goes on once this returns."""
        ...


class NullHost:
    """A host that needs nothing: no thinking level, no queued entry, no refusal.

    It ignores every report; the default of :attr:`StreamRequest.host`.
    """

    __slots__ = ()

    def thinking_for_step(self) -> str | None:
        return None

    def tool_end_queued(self) -> bool:
        return False

    def refusal(self) -> str | None:
        return None

    def queued_stop(self, report: QueuedStopReport) -> None:
        pass

    async def reached(self, milestone: Milestone) -> None:
        pass


_NULL_HOST = NullHost()


def hears_milestones(host: StreamHost) -> bool:
    """Whether ``host`` wants its milestones awaited (a :class:`NullHost` does not).

    The manager skips the awaits, and the shielded scopes around them, for a host that ignores
    them: a bare stream pays nothing for a port it does not use.
    """
    return not isinstance(host, NullHost)


class StreamRequest(msgspec.Struct, frozen=True, kw_only=True):
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
    #: Required-tool patterns beyond the tools of kind ``completion`` (SM-7 condition 3).
    required_tools: tuple[str, ...] = ()
    #: The caller's abort signal (SM-2): fired before processing began, the launch is
    #: ``Withdrawn`` with its reason; fired during processing, a hard stop with that reason.
    abort: AbortSignal | None = None
    #: The caller's port: the thinking level, the queued-entry reader, the launch probe, the
    #: cut report and the milestones (:class:`StreamHost`); :class:`NullHost` by default.
    host: StreamHost = _NULL_HOST


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
    #: What the stream's steps used, by model (SM-15: recorded on the final row).
    usage: tuple[ModelUsage, ...] = ()


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
    #: The provider's requested wait before a retry, in seconds, when it sent one (AS-32).
    retry_after: float | None = None
    #: What the attempt's steps used, by model (on its leftover partial row, PS-2).
    usage: tuple[ModelUsage, ...] = ()

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
