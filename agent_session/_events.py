"""The events the session reports, with the names and fields of ``docs/trace.md``.

Like the stream manager's, they are frozen msgspec Structs tagged by ``event`` and handed to the
engine's observers synchronously, when the fact is recorded.
"""

from __future__ import annotations

import msgspec

from agent_session._continuation import EndedHow
from agent_session._phases import Phase
from message_queue import DispatchMode, EntryKind
from stream_manager import Persisted, StreamEvent, redact


class _Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="event", gc=False):
    session: str | None


class PhaseChanged(_Event, frozen=True, kw_only=True, tag="phase"):
    """The session's turn phase moved."""

    from_: Phase = msgspec.field(name="from")
    to: Phase


class EntryQueued(_Event, frozen=True, kw_only=True, tag="queued"):
    """A message was queued; ``into`` names the entry it batched into."""

    entry: str
    kind: EntryKind
    mode: DispatchMode
    into: str | None


class EntryWithdrawn(_Event, frozen=True, kw_only=True, tag="withdrawn"):
    """An entry's cancel token fired."""

    entry: str


class EntryDequeued(_Event, frozen=True, kw_only=True, tag="dequeued"):
    """The drain took an entry off the queue's head."""

    entry: str


class EntryCanceled(_Event, frozen=True, kw_only=True, tag="entry-canceled"):
    """An entry left without running: cancelled before acceptance, cleared or removed."""

    entry: str
    reason: str


class QueueCleared(_Event, frozen=True, kw_only=True, tag="cleared"):
    """The queue was cleared."""

    entries: tuple[str, ...]
    hard_stop: bool


class ContinuationOwed(_Event, frozen=True, kw_only=True, tag="owed"):
    """A cut turn is owed a continuation."""

    cut: str
    remaining: int
    model: str
    handle: str | None


class ContinuationEnded(_Event, frozen=True, kw_only=True, tag="continuation-ended"):
    """An owed continuation ended, and how."""

    cut: str
    how: EndedHow
    why: str


class ResumeAttempted(_Event, frozen=True, kw_only=True, tag="resume"):
    """A resume attempt has an outcome: started, failed, refused or withdrawn."""

    cut: str
    attempt: int
    outcome: str


class Recovered(_Event, frozen=True, kw_only=True, tag="recovered"):
    """Startup recovery's decision for one session (PS-4, PS-6): resume, retry or abandon."""

    action: str
    #: Why, redacted when the event is built (it may quote a stored record's problem).
    why: str
    #: The cut (a stream id) a ``resume`` or ``retry`` takes up; its endings follow the
    #: durable record of a resume, none of a retry (nothing durable stands for it).
    cut: str | None = None

    def __post_init__(self) -> None:
        msgspec.structs.force_setattr(self, "why", redact(self.why))


class Compacted(_Event, frozen=True, kw_only=True, tag="compaction"):
    """AS-36: a compaction ran for the stream stopped for it, and how it went."""

    #: The stream stopped for the compaction.
    stream: str
    #: The input usage that crossed the threshold.
    tokens: int
    #: ``summarized`` (its summary row is durable) or ``failed``.
    outcome: str


class RetryScheduled(_Event, frozen=True, kw_only=True, tag="retry-scheduled"):
    """AS-32: a failed stream's turn is retried after a backoff on the engine's clock."""

    #: The stream that failed (the attempt this retry follows).
    stream: str
    #: Which retry of the turn this is (1 first; a stream end or a new user row resets it).
    attempt: int
    #: The retry's step ceiling: what the failed attempt left (R36).
    budget: int


class RetryAbandoned(_Event, frozen=True, kw_only=True, tag="retry-abandoned"):
    """A turn that would have been retried is not, and why (AS-32, PS-5, R36, R44, R61)."""

    why: str

    def __post_init__(self) -> None:
        msgspec.structs.force_setattr(self, "why", redact(self.why))


class SessionBroken(_Event, frozen=True, kw_only=True, tag="session-broken"):
    """An internal error broke the session (told once); it takes no input but disposal."""

    #: The phase the session was in when it broke.
    phase: Phase
    #: The input whose handling failed (its type's name).
    input: str
    #: The error, redacted (``Type: message``).
    error: str

    def __post_init__(self) -> None:
        msgspec.structs.force_setattr(self, "error", redact(self.error))


class HandleClaimed(_Event, frozen=True, kw_only=True, tag="claim"):
    """The owner's claim on a delegated turn's cut (ST-15, TD-2), told once its write is durable.

    ``session`` is the target (the session whose cut was claimed).
    """

    handle: str
    #: The stream whose ``tool-calls`` end was claimed.
    cut: str
    #: ``defer``: something will continue the turn; ``settle``: nothing will, it settles now.
    answer: str


class HandleSettled(_Event, frozen=True, kw_only=True, tag="settled"):
    """A delegated turn settled (TD-3 to TD-10), told once the settlement is durable.

    ``session`` is the owner (the session that delegated the turn). Why it settled is in the
    handle record (``inspect``), not the trace.
    """

    handle: str
    status: str


SessionEvent = (
    PhaseChanged
    | EntryQueued
    | EntryWithdrawn
    | EntryDequeued
    | EntryCanceled
    | QueueCleared
    | ContinuationOwed
    | ContinuationEnded
    | ResumeAttempted
    | Recovered
    | RetryScheduled
    | RetryAbandoned
    | Compacted
    | SessionBroken
    | HandleClaimed
    | HandleSettled
)

EngineEvent = SessionEvent | StreamEvent

__all__ = [
    "Compacted",
    "ContinuationEnded",
    "ContinuationOwed",
    "EngineEvent",
    "EntryCanceled",
    "EntryDequeued",
    "EntryQueued",
    "EntryWithdrawn",
    "HandleClaimed",
    "HandleSettled",
    "Persisted",
    "PhaseChanged",
    "QueueCleared",
    "Recovered",
    "ResumeAttempted",
    "RetryAbandoned",
    "RetryScheduled",
    "SessionBroken",
    "SessionEvent",
]
