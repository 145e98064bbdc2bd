"""What the turn machine is told: every input, one frozen Struct each (``docs/architecture.md``).

The machine's one entry point is :meth:`TurnMachine.handle(input)
<agent_session._machine.TurnMachine.handle>`, which finds each input's handler by its type
(``_machine._DECIDE``; a test checks the table covers :data:`Input`). Three kinds come in:

* **host calls and stream facts** the shell passes on (a send, a Stop, a stream that started, a
  tool that ended, a stream's outcome);
* **adapter results**: what the send pipeline and the stream launcher found across an await
  (history loaded, a launch refused) and what the one writer reports back about a
  :class:`~agent_session._effects.Commit` (its ``then`` input once the boundary is durable,
  its ``failed`` input, with the error, when nothing of it was written);
* **follow-ups** the machine gives itself (:class:`~agent_session._effects.Next`): where a rule
  tells something and then goes on, the rest of the decision is an input, never a closure, so
  an effect list prints and compares.

A failed write's input has an ``error`` field the writer fills in (``None`` in the decision
that names it). Inputs hold plain values and the live objects a turn carries (its
:class:`~agent_session._turn.TurnInput`, a stream's outcome); they are never persisted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import msgspec

from agent_session._compaction import FollowUp
from agent_session._continuation import Marker
from agent_session._cut_records import CutChange
from agent_session._events import EntryQueued
from agent_session._phases import Phase
from agent_session._turn import StreamContext, TurnInput
from message_queue import CancelToken, Correlation, EntryCallbacks, EntrySnapshot, NewMessage
from persistence import HistoryRow, StoredPartial
from stream_manager import (
    Aborted,
    AbortReason,
    Ended,
    QueuedStopReport,
    Refused,
    StartCause,
    StreamInfo,
    StreamOutcome,
    Withdrawn,
)

if TYPE_CHECKING:
    from typing import TypeAlias

_S = msgspec.Struct


# ------------------------------------------------------------ host calls


class Queued(_S, frozen=True):
    """A message was queued: an idle session drains it at once."""


class QueueWritten(_S, frozen=True):
    """An enqueue's commit is durable: ``queued`` was told; an idle session drains."""


class QueueFailed(_S, frozen=True):
    """A queue commit failed; an enqueue's (``queued``) entry stays queued in memory, told."""

    queued: EntryQueued | None
    error: Exception | None = None


class TokenFired(_S, frozen=True):
    """The cancel token of queued or dispatching ``entry`` fired (told ``withdrawn``)."""

    entry: str


class TakeUpQueue(_S, frozen=True):
    """A restart rebuilt the queue: ``dropped`` entries are told gone once durable; drain."""

    dropped: tuple[str, ...]


class Enqueue(_S, frozen=True):
    """Queue ``message`` (once per ``key`` when given); replies ``Queued`` or ``Rejected``."""

    message: NewMessage
    key: str | None


class Withdraw(_S, frozen=True):
    """Fire the cancel token of a queued or dispatching entry (AS-3); replies ``bool``."""

    entry: str
    reason: str


class Claim(_S, frozen=True):
    """ST-15: the owner asks whether anything continues the turn ``stream`` cut; ``bool``."""

    correlation: Correlation
    stream: str


class Clear(_S, frozen=True):
    """AS-16: clear the queue; ``hard_stop`` forfeits the owed continuation first (R23)."""

    reason: str
    hard_stop: bool


class Restore(_S, frozen=True):
    """AS-17: give user-authored text back (the reply) and cancel the rest."""


class RemoveDedupe(_S, frozen=True):
    """AS-16: remove queued messages whose dedupe keys start with ``prefix``; replies a count."""

    prefix: str
    reason: str


class RemoveWorkspaceTurn(_S, frozen=True):
    """TD-8: remove the queued entries of the delegated turn ``handle``; replies a count."""

    handle: str
    reason: str


class DropOnlyDedupeKey(_S, frozen=True):
    """AS-16: drop the queue's lone entry if its only add holds ``key``; replies a bool."""

    key: str
    reason: str


class Stop(_S, frozen=True):
    """AS-30: a user Stop."""


class HardStop(_S, frozen=True):
    """TD-7: a task hard stop."""


class SendNow(_S, frozen=True):
    """AS-18: the oldest queued user message goes next; replies whether there was one."""


class SetThinking(_S, frozen=True):
    """A thinking level change: mid-turn at the next step, between turns from now on."""

    level: str


class DirectSend(_S, frozen=True):
    """R3: a manual send on an idle session enters preflight."""


class EditBegins(_S, frozen=True):
    """AS-6: an edit withdraws the continuation."""


class EditInterrupts(_S, frozen=True):
    """AS-6: an edit holds the drain back and interrupts what runs."""


class EditSettled(_S, frozen=True):
    """AS-6: the edit reached idle; only its own interrupt may drop a partial."""


class Truncate(_S, frozen=True):
    """AS-6: the edit's history cut: delete ``row_ids``; replies ``None`` or the error."""

    row_ids: tuple[str, ...]


class EditDone(_S, frozen=True):
    """AS-6: the edit is over; the drain may run again."""


class Discard(_S, frozen=True):
    """R27: a context-discarding mutation forfeits the owed continuation."""


class DiscardHistory(_S, frozen=True):
    """R27: delete the history rows ``row_ids`` (all of the session's history)."""

    row_ids: tuple[str, ...]


class Dispose(_S, frozen=True):
    """AS-31: forfeit the owed continuation and abort a resume."""


class LeaseGone(_S, frozen=True):
    """LS-3: a write found the session's lease taken by a peer: stop here, decide nothing more.

    The peer owns the session now; nothing of the refused write is told, nothing is retried,
    and no record is changed on the way out (the peer's are the session's now).
    """

    error: Exception


class DisposedNow(_S, frozen=True):
    """AS-31: the queue is dropped; the session accepts nothing more."""


class DisposalDone(_S, frozen=True):
    """AS-31: the stream is stopped: the phase is DISPOSED."""


class AdoptOwed(_S, frozen=True):
    """PS-6: owe ``marker``, rebuilt at startup from the durable record on ``row_id``."""

    marker: Marker
    row_id: str


# ------------------------------------------------------------ the sweep and resumes


class AdoptRetry(_S, frozen=True):
    """PS-4: owe a startup retry's marker (rebuilt from the history's tail; no record)."""

    marker: Marker


class GiveUp(_S, frozen=True):
    """PS-8: the current turn must not be retried at startup (``reason``: its failure type)."""

    reason: str


class BackOffOver(_S, frozen=True):
    """PS-3, AS-32: a retry's backoff ended; the sweep may retry (a stale one does nothing)."""

    generation: int = 0


class SweepDue(_S, frozen=True):
    """The scheduled sweep runs (an idle session with queued entries drains them first)."""


class Sweep(_S, frozen=True):
    """ST-7: resume a stranded turn when every precondition holds; idempotent."""


class ResumeFailed(_S, frozen=True):
    """ST-10: the resume failed before its stream started."""

    marker: Marker
    attempt: int


class ResumeUnreadable(_S, frozen=True):
    """R61: the history the resume needs is damaged."""

    marker: Marker
    attempt: int


# ------------------------------------------------------------ sends


class UserRowWanted(_S, frozen=True):
    """AS-7: persist the send's user row; replies the row once durable, else the error."""

    turn: TurnInput


class Rollback(_S, frozen=True):
    """AS-3: take back exactly this send's row; replies ``None``, or the error."""

    row: HistoryRow


class Supersede(_S, frozen=True):
    """R35: a durable row that does not continue the cut turn withdraws its continuation."""

    turn: TurnInput
    why: str


class TurnAccepted(_S, frozen=True):
    """AS-10: an accepted direct send claims PREPARING."""

    turn: TurnInput


class Dispatched(_S, frozen=True):
    """The dequeued entry was accepted, cancelled or failed: it is past AS-3."""

    token: CancelToken | None


class SendWentNowhere(_S, frozen=True):
    """A send was refused, cancelled before acceptance or failed before its stream."""

    turn: TurnInput


# ------------------------------------------------------------ a stream's life


class HistoryLoaded(_S, frozen=True):
    """R34, PS-2: the launch read history; replies the rows to stream from.

    ``partials``: what earlier streams left in the partial store (B4), committed first.
    """

    rows: tuple[HistoryRow, ...]
    partials: tuple[StoredPartial, ...] = ()


class SentinelUnwanted(_S, frozen=True):
    """R34: a launch that failed or never started takes its sentinel back."""

    sentinel: HistoryRow


class Launching(_S, frozen=True):
    """The session's stream is about to be requested with ``context``."""

    context: StreamContext


class EnvelopeReady(_S, frozen=True):
    """B3: the stream was constructed: persist its envelope; replies ``None`` or the error."""

    info: StreamInfo


class StreamBegan(_S, frozen=True):
    """AS-19, ST-4: the stream emitted ``stream-start``."""

    stream: str
    cause: StartCause


class StartReached(_S, frozen=True):
    """The stream manager waits before the first step: the start's records become durable."""


class StartWritten(_S, frozen=True):
    """The start's record changes are durable."""

    changes: tuple[CutChange, ...]


class StartFailed(_S, frozen=True):
    """The start's record changes were not written: no step of the stream may run."""

    changes: tuple[CutChange, ...]
    error: Exception | None = None


class ToolStarted(_S, frozen=True):
    """A tool call of the session's stream is running."""

    call: str


class ToolEnded(_S, frozen=True):
    """AS-27: a tool call ended (``provider``: the model's provider ran it)."""

    call: str
    provider: bool


class SyntheticAbort(_S, frozen=True):
    """AS-21: a hard stop reached a session with no stream."""

    reason: AbortReason


class QueuedStop(_S, frozen=True):
    """ST-2, R1: the stream was cut for a queued message (recorded synchronously)."""

    report: QueuedStopReport


class FinalReady(_S, frozen=True):
    """B5: the stream ended: persist its final row; replies ``None`` or the error."""

    ended: Ended


class FinalWritten(_S, frozen=True):
    """The final row is durable."""

    row: HistoryRow


class FinalFailed(_S, frozen=True):
    """The final row was not written: the cut it carried never existed."""

    ended: Ended
    row: HistoryRow
    error: Exception | None = None


class Outcome(_S, frozen=True):
    """A launched turn's outcome."""

    outcome: StreamOutcome
    context: StreamContext


class NotStarted(_S, frozen=True):
    """The launch never reached stream-start (AS-10, ST-10)."""

    outcome: Refused | Withdrawn
    context: StreamContext


# ------------------------------------------------------------ follow-ups the machine gives itself


class Drain(_S, frozen=True):
    """AS-13: dispatch one head entry, else sweep."""


class DrainIfIdle(_S, frozen=True):
    """Drain, when nothing holds the session."""


class ToIdleFrom(_S, frozen=True):
    """Move to IDLE when the phase is one of ``phases``."""

    phases: tuple[Phase, ...]


class SweepWanted(_S, frozen=True):
    """AS-2: schedule the idle sweep (once)."""


class DispatchEntry(_S, frozen=True):
    """AS-13: the dequeued entry goes to the send pipeline."""

    turn: TurnInput
    token: CancelToken | None


class ArmResume(_S, frozen=True):
    """ST-8: PREPARING is claimed; the resume of ``marker`` starts."""

    marker: Marker
    attempt: int


class ReleasePreflight(_S, frozen=True):
    """The manual send claimed PREPARING or failed: preflight is over."""


class Removed(_S, frozen=True):
    """Entries left the queue: their cancellations run in order, then the sweep."""

    removed: tuple[EntryCallbacks, ...]
    reason: str
    before: Mapping[str, EntrySnapshot]


class FlushRecords(_S, frozen=True):
    """PS-6: make every decided cut-record change durable in one boundary, then tell them."""


class RecordsWritten(_S, frozen=True):
    """The record changes are durable."""

    changes: tuple[CutChange, ...]


class RecordsFailed(_S, frozen=True):
    """The record changes were not written."""

    changes: tuple[CutChange, ...]
    error: Exception | None = None


class Consume(_S, frozen=True):
    """ST-4: STREAMING consumes the owed continuation."""

    stream: str
    cause: StartCause


class CutRowDurable(_S, frozen=True):
    """The row carrying ``stream``'s cut record is durable."""

    stream: str
    row_id: str


class AfterTelling(_S, frozen=True):
    """What stayed untold is told: the outcome's own path."""

    outcome: StreamOutcome
    context: StreamContext


class UsageReported(_S, frozen=True):
    """A step of ``stream`` on ``model`` reported ``tokens`` of input (AS-36)."""

    stream: str
    model: str
    tokens: int


class CompactNow(_S, frozen=True):
    """AS-36: the stream stopped for compaction aborted, its partial row settled."""

    aborted: Aborted


class Summarized(_S, frozen=True):
    """AS-36: the compaction request answered ``text``."""

    text: str


class CompactionFailed(_S, frozen=True):
    """AS-36: the compaction request failed (``why``)."""

    why: str


class SummaryWritten(_S, frozen=True):
    """B7: the summary row is durable, with the pending follow-up it carries (if any)."""

    row: HistoryRow
    follow_up: FollowUp | None


class SummaryFailed(_S, frozen=True):
    """B7: the summary row could not be written."""

    error: Exception | None = None


class FollowUpWritten(_S, frozen=True):
    """B8: the follow-up row is durable and the pending follow-up cleared: reply ``rows``."""

    rows: tuple[HistoryRow, ...]


class FollowUpFailed(_S, frozen=True):
    """B8: the follow-up row could not be written: the pending follow-up stays."""

    error: Exception | None = None


class FollowUpUncleared(_S, frozen=True):
    """R48: clearing the pending follow-up on summary ``row`` failed (the flush retries it)."""

    row: HistoryRow
    error: Exception | None = None


class SummaryBeforeLaunch(_S, frozen=True):
    """AS-36 on send: the compaction request before a fresh turn's launch answered ``text``."""

    text: str
    through: int
    rows: tuple[HistoryRow, ...]


class SummaryBeforeLaunchFailed(_S, frozen=True):
    """AS-36 on send: the summary row was not written; the turn launches on ``rows``.

    ``stream`` and ``tokens``: what the ``compaction`` event, told ``failed``, names.
    """

    rows: tuple[HistoryRow, ...]
    stream: str = ""
    tokens: int = 0
    error: Exception | None = None


class AdoptFollowUp(_S, frozen=True):
    """PS-7: owe the follow-up ``marker`` a crash left pending on summary row ``row``."""

    marker: Marker
    row: HistoryRow


class KnowsAutoRetry(_S, frozen=True):
    """AS-32: the session's persisted auto-retry preference, read when it was made."""

    on: bool


class SetAutoRetry(_S, frozen=True):
    """AS-32: the user turns auto-retry on or off for the session (persisted)."""

    on: bool


class FailedTurnSettles(_S, frozen=True):
    """AS-25, R25: a stream error withdraws the continuation; the error path owns it.

    ``retry``: the auto-retry that owns the turn now, its attempt and backoff (AS-32); else
    ``abandoned``: why no retry follows, when one is told (``retry-abandoned``).
    """

    retry: Marker | None = None
    attempt: int = 0
    delay_s: float = 0.0
    abandoned: str | None = None
    #: AS-34: a context-limit failure: the compaction request runs, then its follow-up.
    compact: bool = False


class Forfeit(_S, frozen=True):
    """Forfeit the owed continuation, saying ``why``."""

    why: str


class CommitPartial(_S, frozen=True):
    """B6: the aborted stream's partial row, with the cut record when it owes."""

    aborted: Aborted


class PartialFailed(_S, frozen=True):
    """The partial row (and the cut record it carried) was not written."""

    aborted: Aborted
    error: Exception | None = None


class AbortWritten(_S, frozen=True):
    """The abort's rows are settled (``row``: the partial, when one was written)."""

    aborted: Aborted
    row: HistoryRow | None
    owes: bool


class AbortSettled(_S, frozen=True):
    """The abort's records are settled: the queue goes on."""

    soft_stop: bool


class ClassifyCutter(_S, frozen=True):
    """AS-28 step 4: the next live entry continues the cut turn, or supersedes it."""


class WithRecords(_S, frozen=True):
    """A row's result (``first``) and the record changes that rode in its boundary (item 3).

    Record changes decided and not yet durable when the machine commits a stream's row go in
    the row's transaction: both are durable, or neither is.
    """

    first: Input | None
    changes: tuple[CutChange, ...]
    error: Exception | None = None


class Answer(_S, frozen=True):
    """Reply ``value`` to the adapter that asked (a write it waited for is durable)."""

    value: object


class AnswerError(_S, frozen=True):
    """A write the adapter waited for failed: reply the error (the adapter raises or reports)."""

    error: Exception | None = None


class Ignored(_S, frozen=True):
    """A write whose result changes nothing (a sentinel that could not be taken back)."""

    error: Exception | None = None


#: Every input of the machine.
Input: TypeAlias = (
    Queued
    | QueueWritten
    | QueueFailed
    | TokenFired
    | TakeUpQueue
    | Enqueue
    | Withdraw
    | Claim
    | Clear
    | Restore
    | RemoveDedupe
    | RemoveWorkspaceTurn
    | DropOnlyDedupeKey
    | Stop
    | HardStop
    | SendNow
    | SetThinking
    | DirectSend
    | EditBegins
    | EditInterrupts
    | EditSettled
    | Truncate
    | EditDone
    | Discard
    | DiscardHistory
    | Dispose
    | LeaseGone
    | DisposedNow
    | DisposalDone
    | AdoptOwed
    | KnowsAutoRetry
    | SetAutoRetry
    | UsageReported
    | CompactNow
    | Summarized
    | CompactionFailed
    | SummaryWritten
    | SummaryFailed
    | FollowUpWritten
    | FollowUpFailed
    | AdoptFollowUp
    | FollowUpUncleared
    | SummaryBeforeLaunch
    | SummaryBeforeLaunchFailed
    | AdoptRetry
    | BackOffOver
    | GiveUp
    | SweepDue
    | Sweep
    | ResumeFailed
    | ResumeUnreadable
    | UserRowWanted
    | Rollback
    | Supersede
    | TurnAccepted
    | Dispatched
    | SendWentNowhere
    | HistoryLoaded
    | SentinelUnwanted
    | Launching
    | EnvelopeReady
    | StreamBegan
    | StartReached
    | StartWritten
    | StartFailed
    | ToolStarted
    | ToolEnded
    | SyntheticAbort
    | QueuedStop
    | FinalReady
    | FinalWritten
    | FinalFailed
    | Outcome
    | NotStarted
    | Drain
    | DrainIfIdle
    | ToIdleFrom
    | SweepWanted
    | DispatchEntry
    | ArmResume
    | ReleasePreflight
    | Removed
    | FlushRecords
    | RecordsWritten
    | RecordsFailed
    | Consume
    | CutRowDurable
    | AfterTelling
    | FailedTurnSettles
    | Forfeit
    | CommitPartial
    | PartialFailed
    | AbortWritten
    | AbortSettled
    | ClassifyCutter
    | WithRecords
    | Answer
    | AnswerError
    | Ignored
)

#: The inputs a failed write feeds back (the writer fills in ``error``).
WriteFailure: TypeAlias = (
    AnswerError
    | WithRecords
    | StartFailed
    | FinalFailed
    | RecordsFailed
    | PartialFailed
    | QueueFailed
    | SummaryFailed
    | FollowUpFailed
    | FollowUpUncleared
    | SummaryBeforeLaunchFailed
    | Ignored
)
