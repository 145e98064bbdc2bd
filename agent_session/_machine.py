"""The turn machine: every rule of one session's turns, with no I/O (``docs/session.md``).

Theory of operation
-------------------
The machine holds the whole state of a session's turns in one place: the phase, the owed
continuation, the queue it drains, the flags of a turn in flight (a pending soft stop, the
tools running, a send-now, an edit waiting) and the durable bookkeeping of cut records (which
row carries each cut's record, the record changes decided and not yet durable, what is decided
and not yet told). Its one entry point is :meth:`TurnMachine.handle`: each input (a frozen
Struct of ``_inputs``: a send, a queue change, a stream event, a stream outcome, a write's
result, a host action) changes that state and returns the effects the shell must perform
(``_effects``): events to tell, boundaries to commit, a stream to stop, a pipeline or a resume
to run. No awaits, no clock, no store: the state is consistent whenever an effect runs.

Decide, persist, tell: every durable write is a :class:`~agent_session._effects.Commit` the
machine returns; the shell's one writer performs it and tells its events only after
``COMMIT``. A continuation that ends is dropped from memory at once (nothing acts on it any
more); its record change waits here, and its ``continuation-ended`` travels with the change,
told only once it is durable. A cut's ``owed`` is told only once the row carrying its record
commits. Where a decision must wait for a write, the rest of it is the ``Commit``'s ``then``
input (and ``failed``, with the error, when nothing was written); where it tells something and
then goes on, the rest is a :class:`~agent_session._effects.Next` input. No effect holds a
closure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from agent_session import _boundaries
from agent_session import _inputs as _in
from agent_session._compaction import (
    FOLLOW_UP_TEXT,
    CompactionPolicy,
    FollowUp,
    encode_follow_up,
    follow_up_of,
)
from agent_session._continuation import (
    Continuation,
    EndedHow,
    ForfeitAtCap,
    Marker,
    StartResume,
    SweepSnapshot,
    apply_sweep,
    consume,
    drop,
    owe,
    plan_sweep,
    resume_failed,
    resume_settled,
    retry_safe,
)
from agent_session._cut_records import CutChange, CutRecords
from agent_session._delegation import (
    ChildAborted,
    ChildDisposed,
    ChildEnded,
    ChildEvent,
    ChildFailed,
    ChildForfeited,
    ChildHardStopped,
    ChildUnsent,
)
from agent_session._effects import (
    AbortPrepared,
    AbortResume,
    BackOff,
    CancelRemoved,
    Commit,
    Dispatch,
    Effect,
    Emit,
    Next,
    Reply,
    RunCompaction,
    ScheduleSweep,
    StopStream,
    TellOwner,
)
from agent_session._effects import StartResume as StartResumeEffect
from agent_session._events import (
    Compacted,
    ContinuationEnded,
    ContinuationOwed,
    EntryCanceled,
    EntryDequeued,
    EntryQueued,
    EntryWithdrawn,
    PhaseChanged,
    QueueCleared,
    ResumeAttempted,
    RetryAbandoned,
    RetryScheduled,
    SessionBroken,
)
from agent_session._leftover import Leftover, body_of, gather
from agent_session._phases import BrokenSession, Phase, next_phase
from agent_session._queue_keeper import QueueKeeper, durable_extra
from agent_session._retry import GiveUp, RetryBook, RetryPolicy, Schedule, again, decide
from agent_session._rows import (
    CONTINUE_TEXT,
    RowBody,
    assistant_messages,
    body_from_parts,
    cut_record,
    decode_body,
    encode_body,
    needs_continue_sentinel,
)
from agent_session._statistics import SessionStatistics, turn_claimed
from agent_session._thinking import ThinkingHolder
from agent_session._turn import StreamContext, TurnInput
from message_queue import (
    DispatchMode,
    EntryKind,
    MessageQueue,
    NewMessage,
    Queued,
    SendFailure,
    SendOptions,
)
from persistence import (
    INBOX_ENTRY,
    AbandonMarker,
    Boundary,
    CutRecord,
    CutState,
    HistoryRow,
    RowKind,
    StoredPartial,
    UsageError,
)
from stream_manager import (
    Aborted,
    AbortReason,
    Ended,
    ErrorKind,
    ErrorType,
    Failed,
    Persisted,
    QueuedStopReport,
    Refused,
    StartCause,
    StreamFailed,
    StreamOutcome,
    TextPart,
    Withdrawn,
    WriteFailed,
    merge_usage,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from message_queue import CancelToken, Correlation, EntryCallbacks, EntrySnapshot
    from stream_manager import ModelFallbackProgress, ModelUsage

#: The goal kind of a turn attributed to its session's goal (the cut record's ``goal_kind``).
GOAL_KIND = "goal"
#: PS-3: a startup retry that failed before its stream waits 1 s, doubling, up to 30 s.
RETRY_BACKOFF_S = 1.0
RETRY_BACKOFF_CAP_S = 30.0

#: The causes of streams launched by the sweep for a marker (their ``resume`` event is told).
_RESUMED = frozenset(
    {StartCause.RESUME, StartCause.RECOVERY, StartCause.RETRY, StartCause.FOLLOW_UP}
)
#: Markers with no durable record of their own whose endings are not continuation events.
_SYNTHETIC = frozenset({StartCause.RETRY, StartCause.FOLLOW_UP})

_FLUSH = Next(_in.FlushRecords())
_QUEUE_WRITTEN = _in.QueueWritten()
_QUEUE_UNWRITTEN = _in.QueueFailed(None)
_ABORT_RESUME = AbortResume()
_DRAIN = Next(_in.Drain())
_DRAIN_IF_IDLE = Next(_in.DrainIfIdle())
_SWEEP_WANTED = Next(_in.SweepWanted())
_IDLE_FROM_PREPARING = Next(_in.ToIdleFrom((Phase.PREPARING,)))
_IDLE_FROM_COMPLETING = Next(_in.ToIdleFrom((Phase.COMPLETING,)))

_STATE_OF: dict[EndedHow, CutState] = {
    EndedHow.WITHDRAWN: CutState.WITHDRAWN,
    EndedHow.FORFEITED: CutState.FORFEITED,
    EndedHow.VOIDED: CutState.VOIDED,
    EndedHow.CONSUMED: CutState.CONSUMED,
}


class TurnMachine:
    """One session's turn rules: inputs in, effects out (see the module docstring)."""

    # Slots: thousands of idle sessions share one process; a per-instance dict costs ~1.6 KB.
    __slots__ = (
        "_abandon_partial",
        "_active_tools",
        "_backing_off",
        "_compact",
        "_compaction",
        "_context_retried",
        "_drain_held",
        "_follow_up_row",
        "_known_models",
        "_last_input",
        "_preparing_turn",
        "_records",
        "_resume_armed",
        "_resume_cap",
        "_retry",
        "_retry_policy",
        "_seq",
        "_soft_stop",
        "_stamp",
        "_stream_n",
        "_streaming",
        "_uncleared",
        "abandon_stored",
        "anchor",
        "broken",
        "context",
        "continuation",
        "defer_drain",
        "dispatching",
        "disposed",
        "goal",
        "id",
        "keeper",
        "leftover",
        "manual_preflight",
        "model",
        "owner_listens",
        "phase",
        "queue",
        "scratchpad",
        "send_now_pending",
        "stored_partials",
        "sweep_scheduled",
        "thinking",
        "thinking_level",
        "usage_ledger",
    )

    def __init__(
        self,
        session_id: str,
        model: str,
        *,
        known_models: frozenset[str],
        resume_attempt_cap: int,
        queue: MessageQueue | None = None,
        next_seq: int = 1,
        next_stream: int = 1,
        goal: str | None = None,
        keeper: QueueKeeper | None = None,
        retry: RetryPolicy | None = None,
        compaction: CompactionPolicy | None = None,
    ) -> None:
        self.id = session_id
        #: AS-36: when a stream is stopped for compaction (never, unless given).
        self._compaction = compaction if compaction is not None else CompactionPolicy(at=0.0)
        #: AS-36: the stream stopped for compaction, the tokens that crossed, then its abort.
        self._compact: _Compacting | None = None
        #: B7: the summary row carrying the pending follow-up the machine owes, if any.
        self._follow_up_row: HistoryRow | None = None
        #: R48: a summary row whose dropped follow-up's clearing failed (the flush retries it).
        self._uncleared: HistoryRow | None = None
        #: AS-34: the user row whose turn had its context-limit retry (once per user row).
        self._context_retried: str | None = None
        #: The input tokens the session's last step reported (a context retry's ``tokens``).
        self._last_input = 0
        #: AS-32: how failed streams are retried (off unless given: the engine gives its own).
        self._retry_policy = retry if retry is not None else RetryPolicy(enabled=False)
        #: AS-32: the turn's consecutive failed attempts, the pending backoff's generation,
        #: the session's persisted opt-out.
        self._retry = RetryBook()
        self.model = model
        #: PS-2: the parts of this session's last stream no row took yet (``_leftover``).
        self.leftover: Leftover | None = None
        #: PS-2: the partials the store held when the session was made (committed likewise).
        self.stored_partials: tuple[StoredPartial, ...] = ()
        #: The goal this session's turns are attributed to (their resumes ask it again, R8).
        self.goal = goal
        self._known_models = known_models
        self._resume_cap = resume_attempt_cap
        self.queue = queue if queue is not None else MessageQueue()
        #: What each queue change commits: the durable queue's version and dispatching entry.
        self.keeper = keeper if keeper is not None else QueueKeeper(session_id)
        self.phase = Phase.IDLE
        #: Why the machine broke (``Type: message``), or ``None`` while it works (BROKEN).
        self.broken: str | None = None
        self.continuation = Continuation()
        self.disposed = False
        self._seq = next_seq
        self._stream_n = next_stream
        #: R3: manual sends in preflight (the sweep yields until each claims or fails).
        self.manual_preflight = 0
        self._soft_stop = False
        self._active_tools: set[str] = set()
        self._resume_armed = False  # a resume in flight can be aborted
        self.sweep_scheduled = False
        #: Which row carries each cut's record; changes and decisions not yet written or told.
        self._records: CutRecords | None = None  # made at the first cut fact: most never cut
        self.send_now_pending = False  # AS-18: the interrupted stream's abort drains
        self.defer_drain = False  # AS-6/AS-15: an edit is waiting; the queue is not drained
        self._abandon_partial = False  # AS-6: the interrupted stream's partial is dropped
        #: PS-8: a startup-abandon marker may be stored (a success or a user row clears it);
        #: ``anchor``: the user row the current turn answers (the marker names it).
        self.abandon_stored = False
        self.anchor: str | None = None
        #: PS-3: a startup retry failed before its stream and waits out its backoff: the
        #: sweep does not retry it until ``BackOffOver``.
        self._backing_off = False
        #: A drain from COMPLETING waits for an enqueue's commit: the phase stays COMPLETING
        #: and the commit's result drains (AS-24: the next entry takes over from COMPLETING).
        self._drain_held = False
        self._stamp: tuple[str, Correlation] | None = None  # R56: correlation for a wake
        #: AS-3: the entry dequeued and not yet accepted, with its cancel token (if it has one).
        self.dispatching: tuple[str, CancelToken] | None = None
        self.context = StreamContext(model=model, cause=StartCause.SEND)
        #: The session's thinking level between turns; a turn's holder tracks mid-turn changes.
        self.thinking_level: str | None = None
        self.thinking: ThinkingHolder | None = None
        #: The live scratchpad (``additionalSystemContext``) the host keeps up to date (R26).
        self.scratchpad: str | None = None
        #: SM-14: usage no row records (an abandoned or empty partial, a failure with no
        #: parts), by model; in memory, for the host's accounting (``AgentSession.usage``).
        self.usage_ledger: tuple[ModelUsage, ...] = ()
        #: The turn claiming PREPARING (a direct send or a dispatched entry): ST-15's engaged
        #: cutter. ``None`` once its stream starts or the session is idle again.
        self._preparing_turn: TurnInput | None = None
        #: The stream of this session now STREAMING (ST-15 step 5), or ``None``.
        self._streaming: str | None = None
        #: A delegated turn runs in this session: its owner hears of uncorrelated stream ends
        #: too (TD-4). Set by the engine; a session nobody delegates to tells nobody anything.
        self.owner_listens = False

    # ------------------------------------------------------------ reading

    @property
    def busy(self) -> bool:
        """A send now queues (AS-12): a turn is claimed, or a manual send is in preflight.

        Or an entry queued meanwhile waits for its commit: it goes first.
        """
        return turn_claimed(self.phase, self.manual_preflight) or self.keeper.enqueues > 0

    def statistics(self, *, tasks: int = 0, writing: int = 0) -> SessionStatistics:
        """What the machine knows of the session, with the shell's ``tasks`` and ``writing``."""
        marker = self.continuation.marker
        live = tuple(entry.id for entry in self.queue if not entry.withdrawn)
        dispatching = self.dispatching
        return SessionStatistics(
            session=self.id,
            phase=self.phase,
            owed=None if marker is None else marker.cut,
            owed_steps=None if marker is None else marker.step_budget,
            queued=live,
            withdrawn=len(self.queue) - len(live),
            preflight=self.manual_preflight,
            dispatching=None if dispatching is None else dispatching[0],
            soft_stop=self._soft_stop,
            tools=len(self._active_tools),
            sweep_scheduled=self.sweep_scheduled,
            pending_writes=0 if self._records is None else len(self._records.pending),
            tasks=tasks,
            writing=writing,
            disposed=self.disposed,
        )

    def __repr__(self) -> str:
        """One stable line: the phase, then only the flags that are set (a test's oracle)."""
        machine_only = (
            ("send-now", self.send_now_pending),
            ("edit-waiting", self.defer_drain),
            ("abandon-partial", self._abandon_partial),
            ("resume-armed", self._resume_armed),
        )
        return self.statistics().line("TurnMachine", [name for name, on in machine_only if on])

    @property
    def soft_stop_in_flight(self) -> bool:
        """A queued-message soft stop was requested and has not landed."""
        return self._soft_stop

    def owes(self) -> bool:
        """Whether a continuation is owed right now."""
        return self.continuation.marker is not None

    # ------------------------------------------------------------ ids

    def new_row(self, kind: RowKind, body: bytes, **fields: object) -> HistoryRow:
        """A history row of this session with the next sequence number."""
        seq = self._seq
        self._seq += 1
        return HistoryRow(
            session=self.id,
            seq=seq,
            row_id=f"{self.id}:r{seq}",
            kind=kind,
            body=body,
            **fields,  # type: ignore[arg-type]
        )

    def next_stream_id(self) -> str:
        """The id of the session's next stream."""
        stream = f"{self.id}/{self._stream_n}"
        self._stream_n += 1
        return stream

    # ------------------------------------------------------------ phase

    def _move(self, to: Phase) -> list[Effect]:
        """Move the phase by the table (AS-1, AS-2); an illegal move raises, nothing changes."""
        current = self.phase
        self.phase = next_phase(self.id, current, to)
        effects: list[Effect] = [Emit(PhaseChanged(session=self.id, from_=current, to=to))]
        if to is not Phase.STREAMING:
            self._streaming = None
        if to is Phase.IDLE:
            self._soft_stop = False
            self._preparing_turn = None
            self._active_tools.clear()
            self.thinking = None  # AS-1: the turn's thinking holder expires
            effects += self._schedule_sweep()
        return effects

    def _to_idle_from(self, *phases: Phase) -> list[Effect]:
        if self._drain_held and self.phase is Phase.COMPLETING:
            return []  # the entry whose commit is in flight takes over from here
        return self._move(Phase.IDLE) if self.phase in phases else []

    def _schedule_sweep(self) -> list[Effect]:
        if self.sweep_scheduled or self.disposed:
            return []
        self.sweep_scheduled = True
        return [ScheduleSweep()]

    # ------------------------------------------------------------ continuation endings

    def _end(
        self, how: EndedHow, why: str, *, reason: AbortReason = AbortReason.SYSTEM
    ) -> list[Effect]:
        """Withdraw, forfeit or void the owed continuation, and abort an in-flight resume.

        The marker goes at once; its record change is queued with the event that tells it.
        ``reason``: what the in-flight resume's abort says (a user Stop's is ``user``).
        """
        self.continuation, marker = drop(self.continuation)
        effects: list[Effect] = []
        if self._resume_armed:
            effects.append(_ABORT_RESUME if reason is AbortReason.SYSTEM else AbortResume(reason))
        if marker is not None:
            if marker.cause is StartCause.RETRY:  # AS-32: a live retry ends as a retry
                self._backing_off = False  # its timer is stale now (its generation moves on)
                self._retry.next_generation()
                abandoned = RetryAbandoned(session=self.id, why=f"retry of {marker.cut}: {why}")
                effects.append(Emit(abandoned))
            elif marker.cause is StartCause.FOLLOW_UP:  # AS-37: dropped through one path
                dropped = f"follow-up of {marker.cut}: {why}"
                effects.append(Emit(RetryAbandoned(session=self.id, why=dropped)))
            elif marker.durable:
                told = ContinuationEnded(session=self.id, cut=marker.cut, how=how, why=why)
                self.records.change(marker.cut, _STATE_OF[how], told)  # PS-6: told after it
            else:  # a startup retry's: no record to write
                told = ContinuationEnded(session=self.id, cut=marker.cut, how=how, why=why)
                effects.append(Emit(told))
            if how is EndedHow.FORFEITED and marker.correlation is not None:  # ST-6, TD-11
                forfeited = ChildForfeited(target=self.id, correlation=marker.correlation, why=why)
                effects.append(TellOwner(forfeited))
            if marker.cause is StartCause.FOLLOW_UP:  # R48: settled first, then cleared
                effects += self._follow_up_cleared()
        return effects

    def _follow_up_cleared(self) -> list[Effect]:
        """R48: the summary row's pending follow-up is cleared (its row rewritten without it).

        A failed write is tried again at the next flush (the idle sweep's), like a cut
        record's change; a restart meanwhile finds it pending and drops it again.
        """
        row, self._follow_up_row = self._follow_up_row, None
        if row is None:
            return []
        self._uncleared = None
        persisted = Persisted(session=self.id, what="summary", id=row.row_id)
        boundary = Boundary(delete=(row.row_id,), rows=(_without_follow_up(row),))
        failed = _in.FollowUpUncleared(row)
        return [Commit(boundary, tell=(persisted,), failed=failed, what="follow-up drop")]

    def _follow_up_uncleared(self, row: HistoryRow) -> list[Effect]:
        """The pending follow-up's clearing failed: the next flush writes it again."""
        if self._follow_up_row is None:
            self._uncleared = row
        return []

    @property
    def records(self) -> CutRecords:
        """Which row carries each cut's record and what is not yet written or told."""
        if self._records is None:
            self._records = CutRecords()
        return self._records

    @property
    def pending(self) -> bool:
        """Record changes (or a follow-up's clearing) are waiting for their write."""
        return self._uncleared is not None or (
            self._records is not None and bool(self._records.pending)
        )

    def adopt_retry(self, marker: Marker) -> None:
        """PS-4: owe the startup retry ``marker``: no row carries a record of it."""
        self.continuation, _ = owe(self.continuation, marker)

    def adopt_owed(self, marker: Marker, row_id: str) -> None:
        """PS-6: owe ``marker``, rebuilt at startup from the durable record on ``row_id``."""
        self.continuation, _ = owe(self.continuation, marker)
        self.records.carried_by(marker.cut, row_id)

    # ------------------------------------------------------------ the queue

    def drain(self) -> list[Effect]:
        """AS-13: dispatch one head entry (withdrawn ones too, so they cancel), else sweep."""
        if self.disposed:
            return []
        self._soft_stop = False
        if self.defer_drain:
            return []  # AS-15: an edit is waiting; it restores the queue itself
        if self.queue.is_empty:
            return self._schedule_sweep()  # AS-14
        if self.keeper.enqueues:  # an entry not yet told queued: its commit's result drains
            self._drain_held = self.phase is Phase.COMPLETING
            return []
        # AS-13: PREPARING at once (claimed first: a move the table refuses takes nothing off
        # the queue), told after the dequeue: an observer of either event that queues more
        # input finds the session busy, so that input queues behind this entry.
        moved = self._move(Phase.PREPARING)
        entry = self.queue.dequeue_next()
        self.keeper.dispatch(entry.state)  # durable until accepted or dropped
        token = entry.cancel_token
        self.dispatching = (entry.entry_id, token) if token is not None else None
        turn = TurnInput.from_dequeued(entry)
        marker = self.continuation.marker
        if (
            turn.kind is EntryKind.WAKE
            and turn.correlation is None
            and marker is not None
            and marker.correlation is not None
        ):  # a wake inherits the open delegated turn's correlation when it dispatches
            turn = msgspec.structs.replace(turn, correlation=marker.correlation)
        dequeued = Emit(EntryDequeued(session=self.id, entry=entry.entry_id))
        return [dequeued, *moved, Next(_in.DispatchEntry(turn, token))]

    def _dispatch_entry(self, turn: TurnInput, token: CancelToken | None) -> list[Effect]:
        stamp, self._stamp = self._stamp, None
        if stamp is not None and stamp[0] == turn.entry_id and turn.correlation is None:
            turn = msgspec.structs.replace(turn, correlation=stamp[1])  # R56
        self._preparing_turn = turn
        return [Dispatch(turn, token)]

    def dispatched(self, token: CancelToken | None) -> None:
        """The dequeued entry was accepted, cancelled or failed: it is past AS-3."""
        if self.dispatching is not None and self.dispatching[1] is token:
            self.dispatching = None

    def withdraw(self, entry: str, reason: str) -> bool:
        """Fire the cancel token of ``entry``, queued or dequeued and not yet accepted (AS-3).

        Raises:
            UnknownEntry: no queued or dispatching entry has that id.
            InvalidEntry: the entry has no cancel token.
        """
        dispatching = self.dispatching
        if dispatching is not None and dispatching[0] == entry and self.queue.get(entry) is None:
            return dispatching[1].cancel(reason)
        return self.queue.withdraw(entry, reason)

    def token_fired(self, entry: str) -> list[Effect]:
        """An entry's cancel token fired: told at once (readers look past it from now on).

        A user-authored entry still queued is committed withdrawn, so a restart rebuilds it
        withdrawn (its drain cancels it) instead of running it. Agent-initiated entries never
        outlive the process (``docs/session.md``, "The durable queue"): nothing to commit.
        """
        told: list[Effect] = [Emit(EntryWithdrawn(session=self.id, entry=entry))]
        queued = self.queue.get(entry)
        if queued is not None and queued.user_authored and self.keeper.holds(queued.id):
            told += self._queue_commit("withdrawn entry", force=True)
        return told

    def drain_if_idle(self) -> list[Effect]:
        """Drain, when nothing holds the session (idle, no manual send in preflight)."""
        if self.phase is Phase.IDLE and self.manual_preflight == 0:
            return self.drain()
        return []

    def _enqueue(self, message: NewMessage, key: str | None) -> list[Effect]:
        """Add ``message`` to the queue; the add (or its refusal) is the reply.

        Decide, persist, tell: on a busy session a user-authored add commits the queue's new
        state, then ``queued`` is told; until then the drain waits (``keeper.enqueues``: the
        session counts as busy, so a later send queues behind it), and an entry is never
        dequeued before it was told queued. A failed write leaves the message queued in memory
        (it runs; a crash before it does loses it): ``queued`` is told all the same. On an idle
        session the entry is dispatched at once (``Queued``), so nothing is written for it
        here: like a direct send, it is durable once its row is. An agent-initiated add writes
        nothing of its own (below).
        """
        queue = self.queue
        if message.options is not None and message.options.extra:
            durable_extra(message.options.extra)  # refused before anything changes
        outcome = queue.add(message) if key is None else queue.add_once(message, key)
        if not isinstance(outcome, Queued):
            return [Reply(outcome)]
        entry = queue.get(outcome.entry_id)
        assert entry is not None
        queued = EntryQueued(
            session=self.id,
            entry=outcome.message_id,
            kind=entry.kind,
            mode=entry.mode,
            into=outcome.into,
        )
        if not self.busy or (not entry.user_authored and not self.keeper.enqueues):
            # idle: dispatched at once, durable with its row. Agent-initiated: its producer
            # lives in this process, so it is not worth a write of its own (it rides in the
            # next change's snapshot, if any; a restart drops it: docs/session.md), unless a
            # user's add is being written: then it is told after it, in queue order
            return [Reply(outcome), Emit(queued)]
        self.keeper.enqueues += 1
        persisted = Persisted(session=self.id, what="queue", id=outcome.message_id)
        commit = Commit(
            Boundary(queue=self.keeper.snapshot(queue)),
            tell=(persisted, queued),
            then=_QUEUE_WRITTEN,
            failed=_in.QueueFailed(queued),
            what="queued entry",
        )
        return [Reply(outcome), commit]

    def queued(self) -> list[Effect]:
        """A message was queued: an idle session drains it at once."""
        return [] if self.busy else self.drain()

    def queue_written(self) -> list[Effect]:
        """An enqueue's commit is settled: the drain waits for it no longer."""
        if self.keeper.enqueues:
            self.keeper.enqueues -= 1
        if self._drain_held:
            if self.keeper.enqueues:
                return []
            self._drain_held = False
            if self.phase is Phase.COMPLETING:
                return [*self.drain(), *self._to_idle_from(Phase.COMPLETING)]
        return self.queued()

    def queue_failed(self, queued: EntryQueued | None) -> list[Effect]:
        """A queue commit failed: the store's queue is not known (the next change rewrites it).

        An enqueue's message stays queued in memory and is told as queued all the same.
        """
        self.keeper.unknown()
        if queued is None:
            return []
        return [Emit(queued), *self.queue_written()]

    def take_up_queue(self, dropped: tuple[str, ...]) -> list[Effect]:
        """A restart rebuilt the queue: what it dropped is told once durable, then drain.

        The agent-initiated entries a dead process queued are not in the rebuilt queue; a
        snapshot without them is committed first, then each is told ``entry-canceled``
        (reason ``restart``). The drain goes on either way (a failed write leaves them stored:
        the next change, or the next restart, drops them).
        """
        if not dropped:
            return self.drain_if_idle()
        told = tuple(EntryCanceled(session=self.id, entry=e, reason="restart") for e in dropped)
        (commit,) = self._queue_commit("restart's dropped entries", force=True)
        assert isinstance(commit, Commit)
        then = _DRAIN_IF_IDLE.input
        return [msgspec.structs.replace(commit, tell=(*commit.tell, *told), then=then)]

    def _queue_commit(self, why: str, *, force: bool = False) -> list[Effect]:
        """The queue's state after a change that is not an add (a removal, a dispatch's end).

        Nothing when the store's queue already holds exactly these entries (an entry that was
        dispatched at once was never written), unless ``force``. Told ``persisted queue`` once
        durable; a failed one changes nothing but makes the next change write the queue again.
        """
        keeper = self.keeper
        if not force and not keeper.changed(self.queue):
            return []
        persisted = Persisted(session=self.id, what="queue", id=self.id)
        commit = Commit(
            Boundary(queue=keeper.snapshot(self.queue)),
            tell=(persisted,),
            failed=_QUEUE_UNWRITTEN,
            what=why,
        )
        return [commit]

    def removed(
        self,
        removed: list[EntryCallbacks],
        reason: str,
        before: Mapping[str, EntrySnapshot],
    ) -> list[Effect]:
        """Entries left the queue: their cancellations run in order, then the sweep (AS-16, R32).

        A removed entry that continues the owed turn (its correlation, or a live wake while a
        correlated continuation is owed) is that turn's terminal path: the continuation is
        forfeited before any cancellation runs, so the sweep cannot resume a turn whose owner
        the cancellation is about to settle.
        """
        effects: list[Effect] = []
        marker = self.continuation.marker
        if marker is not None and marker.correlation is not None:
            for callbacks in removed:
                entry = before.get(callbacks.entry_id)
                if entry is not None and (
                    entry.correlation == marker.correlation
                    or (entry.kind is EntryKind.WAKE and not entry.withdrawn)
                ):
                    effects += self._end(EndedHow.FORFEITED, "its queued continuation was removed")
                    break
        effects += self._queue_commit("queue removal")
        effects += [
            Emit(EntryCanceled(session=self.id, entry=c.entry_id, reason=reason)) for c in removed
        ]
        effects += self._prompts_removed(removed, before)
        effects.append(CancelRemoved(tuple(removed), reason))
        effects.append(_SWEEP_WANTED)
        return effects

    def clear(self, reason: str, *, hard_stop: bool) -> list[Effect]:
        """AS-16: clear the queue; a hard-stop clear forfeits the owed continuation first (R23).

        A plain (user) clear keeps the continuation and a pending soft stop (R53).
        """
        before = {e.id: e for e in self.queue}
        effects: list[Effect] = []
        if hard_stop:
            self._soft_stop = False
            effects += self._end(EndedHow.FORFEITED, "hard-stop queue clear")
        removed = self.queue.clear()
        cleared = QueueCleared(session=self.id, entries=tuple(before), hard_stop=hard_stop)
        effects.append(Emit(cleared))
        effects.append(Next(_in.Removed(tuple(removed), reason, before)))
        effects.append(_FLUSH)
        return effects

    def restore(self) -> tuple[str, list[Effect]]:
        """AS-17: give user-authored text back for the composer and cancel the rest."""
        before = {e.id: e for e in self.queue}
        restored = self.queue.restore_to_input()
        cleared = QueueCleared(session=self.id, entries=tuple(before), hard_stop=False)
        effects: list[Effect] = [Emit(cleared)]
        removed = _in.Removed(tuple(restored.removed), "restored to input", before)
        effects += [Next(removed), _FLUSH]
        return restored.text, effects

    def remove_dedupe(self, prefix: str, reason: str) -> tuple[int, list[Effect]]:
        """AS-16: remove the queued messages whose dedupe keys start with ``prefix``."""
        before = {e.id: e for e in self.queue}
        removal = self.queue.remove_by_dedupe_key_prefix(prefix)
        effects = self.removed(removal.removed_entries, reason, before)
        effects.append(_FLUSH)
        return removal.removed_messages, effects

    def remove_workspace_turn(self, handle: str, reason: str) -> tuple[int, list[Effect]]:
        """TD-8: remove the queued entries of the delegated turn ``handle`` (MQ-11), no other."""
        return self._removal(lambda: self.queue.remove_workspace_turn(handle), reason)

    def drop_only_dedupe_key(self, key: str, reason: str) -> tuple[bool, list[Effect]]:
        """AS-16: the queue's lone entry goes when its only add holds ``key`` (MQ-9)."""
        count, effects = self._removal(lambda: self.queue.drop_only_dedupe_key(key), reason)
        return count > 0, effects

    def _removal(
        self, take: Callable[[], list[EntryCallbacks]], reason: str
    ) -> tuple[int, list[Effect]]:
        """AS-16: entries ``take`` removes, told as any removal's; how many went."""
        before = {e.id: e for e in self.queue}
        removed = take()
        if not removed:
            return 0, []
        return len(removed), [*self.removed(removed, reason, before), _FLUSH]

    # ------------------------------------------------------------ the sweep

    def sweep(self) -> list[Effect]:
        """ST-7: resume a stranded turn when every precondition holds; idempotent."""
        snapshot = SweepSnapshot(
            disposed=self.disposed,
            phase=self.phase,
            queue_empty=self.queue.is_empty,
            manual_in_preflight=self.manual_preflight,
        )
        action = plan_sweep(self.continuation, snapshot, self._resume_cap)
        if isinstance(action, ForfeitAtCap):
            why = f"{action.failed_attempts} resume attempts failed before a stream started (R21)"
            return [*self._end(EndedHow.FORFEITED, why), _FLUSH]
        if isinstance(action, StartResume):
            if self._backing_off:
                return []  # PS-3: the backoff's end sweeps again
            self.continuation = apply_sweep(self.continuation, action)
            armed = Next(_in.ArmResume(action.marker, action.attempt))
            return [*self._move(Phase.PREPARING), armed]  # R7: claimed before any await
        return []

    def _arm_resume(self, marker: Marker, attempt: int) -> list[Effect]:
        self.thinking = ThinkingHolder(marker.thinking_level)
        self._resume_armed = True
        return [StartResumeEffect(marker, attempt)]

    def sweep_due(self) -> list[Effect]:
        """The scheduled sweep runs: an idle session with queued entries drains them first.

        Every move to IDLE schedules this (AS-2), so whatever made the session idle (a Stop or
        a hard stop landing while a message was queued behind it, a failed write, a refused
        resume), an idle session never holds a queued entry: the drain sends a live one and
        cancels a withdrawn one (AS-13), and an empty queue sweeps again (AS-14).
        """
        self.sweep_scheduled = False
        if (
            not self.queue.is_empty
            and not self.defer_drain
            and self.phase is Phase.IDLE
            and self.manual_preflight == 0
        ):
            return self.drain()
        return self.sweep()

    def resume_failed(self, marker: Marker, attempt: int) -> list[Effect]:
        """ST-10: failed before start; owed still (R4), counted (R21), swept again (R43).

        PS-3: a startup retry (cause ``recovery``: its history unreadable for now, a gate
        refusing) is swept again only after a backoff on the engine's clock, 1 s doubling per
        failed attempt up to 30 s; the cap (R21) still forfeits it.
        """
        self.continuation = resume_failed(self.continuation)
        self._resume_armed = False
        told = ResumeAttempted(session=self.id, cut=marker.cut, attempt=attempt, outcome="failed")
        effects: list[Effect] = [Emit(told)]
        if marker.cause is StartCause.RETRY:  # AS-32: the failure path again
            return [*effects, *self._retry_again(marker), _IDLE_FROM_PREPARING, _DRAIN_IF_IDLE]
        failed = self.continuation.failed_attempts
        if marker.cause is StartCause.RECOVERY and failed < self._resume_cap:
            delay = min(RETRY_BACKOFF_CAP_S, RETRY_BACKOFF_S * 2 ** (failed - 1))
            effects.append(self._back_off(delay))
        return [*effects, _IDLE_FROM_PREPARING, _DRAIN_IF_IDLE]

    def _back_off(self, delay_s: float) -> BackOff:
        """The sweep leaves the owed retry alone for ``delay_s``; earlier timers go stale."""
        self._backing_off = True
        return BackOff(delay_s, self._retry.next_generation())

    def _retry_again(self, marker: Marker) -> list[Effect]:
        """AS-32: the retry did not start (a gate, busy): count it; schedule again or give up."""
        plan = again(self._retry_policy, self._retry)
        if isinstance(plan, GiveUp):
            return [*self._end(EndedHow.FORFEITED, plan.why), _FLUSH]
        return self._scheduled(marker, plan)

    def _scheduled(self, marker: Marker, plan: Schedule) -> list[Effect]:
        """AS-32: told ``retry-scheduled``, then the backoff on the engine's clock."""
        told = RetryScheduled(
            session=self.id, stream=marker.cut, attempt=plan.attempt, budget=marker.step_budget
        )
        return [Emit(told), self._back_off(plan.delay_s)]

    def backoff_over(self, generation: int) -> list[Effect]:
        """PS-3, AS-32: a backoff ended: the sweep may try the retry again.

        A stale one (its retry ended, another was scheduled) does nothing. A live retry that
        finds the session busy (a turn preparing or streaming, entries queued) goes through
        the failure path again: one more attempt, scheduled anew or given up (AS-32).
        """
        if generation != self._retry.generation:
            return []
        self._backing_off = False
        marker = self.continuation.marker
        if marker is not None and marker.cause is StartCause.RETRY and self._retry_busy():
            return self._retry_again(marker)
        return [_SWEEP_WANTED] if self.phase is Phase.IDLE else []

    def _retry_busy(self) -> bool:
        return (
            self.phase is not Phase.IDLE
            or not self.queue.is_empty
            or self.manual_preflight > 0
            or self.continuation.resume_in_flight
        )

    def resume_unreadable(self, marker: Marker, attempt: int) -> list[Effect]:
        """R61: the history the resume needs is damaged; retrying cannot mend it.

        The marker goes from memory only: nothing is forfeited or voided, so the durable
        record stays owed for a person to repair (a restart tries again). The attempt is told
        ``failed``.
        """
        self._resume_armed = False
        self.continuation, _ = drop(resume_settled(self.continuation))
        if self._records is not None:
            self._records.forget(marker.cut)  # no later end may write the record either
        told = ResumeAttempted(session=self.id, cut=marker.cut, attempt=attempt, outcome="failed")
        return [Emit(told), _IDLE_FROM_PREPARING, _DRAIN_IF_IDLE]

    def resume_context(self, marker: Marker, attempt: int) -> StreamContext:
        """The stream context of a resume of ``marker`` (ST-8, ST-12, ST-13)."""
        return StreamContext(
            model=marker.model,
            cause=marker.cause,
            options=marker.options,
            step_budget=marker.step_budget,
            progress=marker.progress,
            correlation=marker.correlation,
            thinking_level=marker.thinking_level,
            extra_system_context=marker.extra_system_context,
            agent_initiated=marker.agent_initiated,
            resume_of=(marker.cut, attempt),
        )

    # ------------------------------------------------------------ sends

    def validate(self, turn: TurnInput) -> SendFailure | None:
        """AS-5: before any history change."""
        if not turn.text.strip() and not turn.attachments:
            return SendFailure(type="empty_message", message="a message needs text or files")
        model = (turn.options.model if turn.options else None) or self.model
        if model not in self._known_models:
            return SendFailure(type="invalid_model_string", message=f"unknown model {model!r}")
        return None

    def direct_send(self) -> None:
        """R3: a manual send on an idle session enters preflight (the sweep yields to it)."""
        self.manual_preflight += 1

    def release_preflight(self) -> None:
        """The manual send claimed PREPARING or failed: preflight is over."""
        if self.manual_preflight:
            self.manual_preflight -= 1

    def send_went_nowhere(self, turn: TurnInput) -> list[Effect]:
        """A send was refused, cancelled before acceptance or failed before its stream.

        A drained entry gives PREPARING back and the drain goes on (AS-13); a direct send
        leaves preflight, and the sweep it held back runs again (R3).
        """
        told = self._unsent(turn)
        if turn.dispatched:  # it left the queue without a row: durably too
            stored = self.keeper.dispatch_stored
            self.keeper.dispatch(None)
            told += self._queue_commit("dropped entry", force=stored)
            return [*told, *self._to_idle_from(Phase.PREPARING), _DRAIN_IF_IDLE]
        self.release_preflight()
        return [*told, *self._to_idle_from(Phase.PREPARING), _SWEEP_WANTED, _DRAIN_IF_IDLE]

    def _unsent(self, turn: TurnInput) -> list[Effect]:
        """TD-6: a delegated turn's send went nowhere; its owner hears if nothing carries it.

        A delegated prompt refused before its stream: no row, no stream event ever follows.
        """
        correlation = turn.correlation
        if correlation is None or not self.owner_listens or self._carried(correlation):
            return []
        return [TellOwner(ChildUnsent(target=self.id, correlation=correlation))]

    def _prompts_removed(
        self, removed: list[EntryCallbacks], before: Mapping[str, EntrySnapshot]
    ) -> list[Effect]:
        """R32: a removed entry of a delegated turn nothing else carries forfeits the turn.

        A delegated prompt still queued when a clear (or a removal) takes it never runs: no
        stream event will tell its owner anything.
        """
        if not self.owner_listens:
            return []
        effects: list[Effect] = []
        for callbacks in removed:
            entry = before.get(callbacks.entry_id)
            correlation = entry.correlation if entry is not None else None
            if correlation is not None and not self._carried(correlation):
                why = "its queued prompt was removed before it ran"
                forfeited = ChildForfeited(target=self.id, correlation=correlation, why=why)
                effects.append(TellOwner(forfeited))
        return effects

    def _carried(self, correlation: Correlation) -> bool:
        """Whether something here carries the turn: its owed cut, a live entry, its stream."""
        marker = self.continuation.marker
        if marker is not None and marker.correlation == correlation:
            return True  # the sweep resumes the cut
        if any(e.correlation == correlation for e in self.queue if not e.withdrawn):
            return True
        return self._streaming is not None and self.context.correlation == correlation

    def supersede(self, turn: TurnInput, why: str) -> list[Effect]:
        """R35: a durable row that does not continue the cut turn withdraws its continuation."""
        marker = self.continuation.marker
        if marker is None or _continues(turn, marker):
            return []
        return [*self._end(EndedHow.WITHDRAWN, why), _FLUSH]

    def accepted(self, turn: TurnInput) -> list[Effect]:
        """AS-10: an accepted direct send claims PREPARING (a drained entry already holds it)."""
        if turn.dispatched:
            return []
        moved = self._move(Phase.PREPARING)
        self._preparing_turn = turn
        return [*moved, Next(_in.ReleasePreflight())]

    def turn_context(self, turn: TurnInput) -> StreamContext:
        """AS-9: the accepted turn's stream context, with a fresh thinking holder."""
        options = turn.options
        model = (options.model if options else None) or self.model
        thinking = (options.thinking_level if options else None) or self.thinking_level
        self.thinking = ThinkingHolder(thinking)
        return StreamContext(
            model=model,
            cause=turn.cause,
            options=options or SendOptions(),
            correlation=turn.correlation,
            thinking_level=thinking,
            extra_system_context=self.scratchpad,
            agent_initiated=turn.kind is not EntryKind.USER,
        )

    # ------------------------------------------------------------ stream events

    def launching(self, context: StreamContext) -> None:
        """The session's stream is about to be requested with ``context``."""
        self.context = context

    def thinking_for_step(self) -> str | None:
        """The thinking level a step prepares with (a mid-turn change applies here)."""
        holder = self.thinking
        return holder.for_step() if holder is not None else self.context.thinking_level

    def set_thinking(self, level: str) -> None:
        """Mid-turn the change applies at the next step; between turns, from now on."""
        if self.thinking is not None:
            self.thinking.pending = level
        else:
            self.thinking_level = level

    def stream_started(self, stream: str, cause: StartCause) -> list[Effect]:
        """AS-19, ST-4: STREAMING consumes the owed continuation, whoever started the stream.

        The consumed record's change and the resume's ``started`` are told once
        :meth:`started_durable` runs after the flush (the stream manager awaits it before the
        stream's first step).
        """
        self._soft_stop = False
        self._active_tools.clear()
        moved = self._move(Phase.STREAMING)
        self._preparing_turn = None
        self._streaming = stream
        return [*moved, Next(_in.Consume(stream, cause))]

    def _consume(self, stream: str, cause: StartCause) -> list[Effect]:
        before = self.continuation
        self.continuation, marker = consume(before)
        told_now: list[Effect] = []
        if marker is not None:
            told = ContinuationEnded(
                session=self.id,
                cut=marker.cut,
                how=EndedHow.CONSUMED,
                why=f"stream {stream} started",
            )
            if marker.durable:
                self.records.consumed_from = before
                self.records.change(marker.cut, CutState.CONSUMED, told)
            elif marker.cause in _SYNTHETIC:  # a live retry's, a follow-up's: nothing to tell
                self._retry.next_generation()
                self._backing_off = False
                told_now += self._follow_up_cleared()  # a follow-up's stream (or a wake's) ran
            else:  # a startup retry's: nothing to write, told now
                told_now.append(Emit(told))
        resume = self.context.resume_of
        if resume is not None and cause in _RESUMED:
            # its continuation ended while the stream started (a Stop inside ``stream-start``):
            # the stream runs nothing and the attempt was withdrawn, not started (ST-10)
            outcome = "started" if marker is not None else "withdrawn"
            attempted = ResumeAttempted(
                session=self.id, cut=resume[0], attempt=resume[1], outcome=outcome
            )
            if marker is not None and not marker.durable:
                told_now.append(Emit(attempted))
            else:
                self.records.untold_resume = attempted
            self._resume_armed = False
        return told_now

    # ------------------------------------------------------------ cut records made durable

    def _records_commit(
        self, changes: tuple[CutChange, ...], then: _in.Input, failed: _in.WriteFailure
    ) -> Commit:
        return _boundaries.records(self.id, changes, then, failed)

    def _with_records(self, commit: Commit) -> Commit:
        """Record changes decided and not yet durable ride in this row's boundary (item 3).

        One transaction: the row and the changes are durable together, or neither is; the
        changes are told after the row's own report, in decision order.
        """
        changes = self._take_changes()
        return _boundaries.with_records(commit, self.id, changes) if changes else commit

    def _with_records_settled(self, settled: _in.WithRecords) -> list[Effect]:
        first, error = settled.first, settled.error
        if error is None:
            return [] if first is None else self.handle(first)
        effects = self._changes_failed(settled.changes)
        if first is not None:
            effects += self.handle(msgspec.structs.replace(first, error=error))
        return effects

    def _take_changes(self) -> tuple[CutChange, ...]:
        records = self._records
        if records is None or not records.pending:
            return ()
        changes = tuple(records.pending)
        records.pending.clear()
        return changes

    def _flush(self) -> list[Effect]:
        """Every decided record change, in one boundary; decided meanwhile, in the next."""
        again: list[Effect] = []
        if self._uncleared is not None:  # R48: a follow-up's clearing that failed, again
            self._follow_up_row, self._uncleared = self._uncleared, None
            again = self._follow_up_cleared()
        changes = self._take_changes()
        if not changes:
            return again
        return [
            *again,
            self._records_commit(changes, _in.RecordsWritten(changes), _in.RecordsFailed(changes)),
        ]

    def _start_reached(self) -> list[Effect]:
        """The stream waits before its first step: the consumed record is made durable."""
        changes = self._take_changes()
        if not changes:
            return self.started_durable()
        return [self._records_commit(changes, _in.StartWritten(changes), _in.StartFailed(changes))]

    def started_durable(self) -> list[Effect]:
        """The stream's start is durable: tell the resume's ``started``."""
        if self._records is None:
            return []
        self._records.consumed_from = None
        started, self._records.untold_resume = self._records.untold_resume, None
        return [Emit(started)] if started is not None else []

    def _start_failed(self, failed: _in.StartFailed) -> list[Effect]:
        """The start was not durable: the cut is owed still; no step of the stream may run."""
        told = self._changes_failed(failed.changes)
        error = WriteFailed(f"the start of the stream could not be written: {failed.error}")
        error.__cause__ = failed.error
        return [*told, Reply(error)]

    def _changes_failed(self, changes: tuple[CutChange, ...]) -> list[Effect]:
        """Record changes could not be written: nothing of them is told.

        A consumed record (a stream starting) puts the marker back: the cut is still owed, as
        the store says, and the stream fails before its first step (a resume's attempt is
        told ``failed``). An end (withdrawn, forfeited, voided) stands: the marker is gone and
        the change is written, then told, at the next flush (the idle sweep retries it).
        """
        effects: list[Effect] = []
        again: list[CutChange] = []
        for change in changes:
            effects += self._change_failed(change, again)
        records = self.records
        records.pending[:0] = again  # the oldest again, written (and told) at a retry
        return effects

    def _change_failed(self, change: CutChange, again: list[CutChange]) -> list[Effect]:
        records = self.records
        before = records.consumed_from
        if change.state is not CutState.CONSUMED or before is None:
            again.append(change)
            return []
        records.consumed_from = None
        self.continuation = resume_settled(before)
        if change.told is not None:
            records.carried_by(change.told.cut, change.row_id)
        started, records.untold_resume = records.untold_resume, None
        if started is None:
            return []
        return [Emit(msgspec.structs.replace(started, outcome="failed"))]

    def final_failed(self, ended: Ended) -> None:
        """The stream's final row could not be written: the cut it carried never existed.

        Its ``owed`` was never told and no record is durable, so the marker goes silently; the
        stream ends in a ``store_write`` error (the host is told that).
        """
        records = self._records
        owed = None if records is None else records.untold_owed
        if records is None or owed is None or owed.cut != ended.stream:
            return
        records.untold_owed = None
        marker = self.continuation.marker
        if marker is not None and marker.cut == ended.stream:
            self.continuation, _ = drop(self.continuation)

    def tool_started(self, call: str) -> None:
        """A tool call of the session's stream is running."""
        self._active_tools.add(call)

    def tool_ended(self, call: str, *, provider: bool) -> list[Effect]:
        """AS-27: after a provider tool's result, soft-stop for a live queued tool-end entry."""
        self._active_tools.discard(call)
        if (
            provider
            and not self._active_tools
            and self.phase is Phase.STREAMING
            and not self._soft_stop
            and self.queue.has_queued(DispatchMode.TOOL_END)
        ):
            self._soft_stop = True
            return [StopStream(AbortReason.QUEUED_MESSAGE, soft=True)]
        return []

    def synthetic_abort(self, reason: AbortReason) -> list[Effect]:
        """AS-21, R19: a hard stop with no stream withdraws a PREPARING resume.

        PS-8: a user's stop marks the turn it stopped ``aborted`` (a startup never retries it);
        a ``system`` or ``startup`` one marks nothing.
        """
        if reason is AbortReason.QUEUED_MESSAGE:
            return []
        self._soft_stop = False
        self._active_tools.clear()
        marks: list[Effect] = []
        if reason is AbortReason.USER and self.anchor is not None and self.phase is not Phase.IDLE:
            marks = self._abandoned("aborted")
        if self.phase is Phase.PREPARING and self._resume_armed:
            why = f"{reason} stop before the resume started"
            return [*marks, *self._end(EndedHow.WITHDRAWN, why), _FLUSH]
        return marks

    def queued_stop(self, report: QueuedStopReport) -> None:
        """ST-2, R1: the cut is owed a continuation, recorded synchronously in the report.

        ``owed`` is told once the row carrying the durable cut record commits (R60).
        """
        self.records.untold_owed = self._owe(report)

    def _owe(self, report: QueuedStopReport) -> ContinuationOwed | None:
        if report.steps_remaining <= 0:
            return None  # R65
        marker = self._marker_here(
            report.stream, report.model, report.steps_remaining, report.fallback_progress
        )
        self.continuation, _ = owe(self.continuation, marker)
        handle = marker.correlation.handle_id if marker.correlation else None
        return ContinuationOwed(
            session=self.id,
            cut=marker.cut,
            remaining=marker.step_budget,
            model=marker.model,
            handle=handle,
        )

    # ------------------------------------------------------------ durable rows of a stream

    def final_row(self, ended: Ended) -> HistoryRow:
        """B5: the stream's final assistant row; a cut's row carries its cut record (R60)."""
        record = None
        owed = None if self._records is None else self._records.untold_owed
        if ended.queued_stop is not None and owed is not None and owed.cut == ended.stream:
            stop = ended.queued_stop
            record = self._cut_record(stop.steps_remaining, stop.model, stop.fallback_progress)
        body = body_from_parts(ended.parts, finish=ended.finish, model=ended.model)
        if ended.usage:  # SM-15: the final row records what the stream used
            body = msgspec.structs.replace(body, usage=ended.usage)
        return self.new_row(RowKind.ASSISTANT, encode_body(body), stream=ended.stream, cut=record)

    def _cut_record(self, remaining: int, model: str, progress: ModelFallbackProgress) -> CutRecord:
        """The durable record of a cut of the current turn (R60): its correlation and goal."""
        goal = (GOAL_KIND if self.goal is not None else None, self.goal)
        return cut_record(remaining, model, progress, self.context.correlation, goal)

    def _final_ready(self, ended: Ended) -> list[Effect]:
        row = self.final_row(ended)
        commit = _boundaries.appended(
            row,
            "cut" if row.cut is not None else "assistant",
            then=_in.FinalWritten(row),
            failed=_in.FinalFailed(ended, row),
            what="final row",
        )
        commit = _dropping(commit, ended.stream)  # B5: the row takes the partial
        return [self._with_records(self._abandon_cleared(commit))]

    # ------------------------------------------------------------ abandon markers (PS-8)

    def _abandon_cleared(self, commit: Commit) -> Commit:
        """AS-9, AS-24: a success or a new user row clears a stored abandon marker (same commit)."""
        if not self.abandon_stored:
            return commit
        self.abandon_stored = False
        boundary = msgspec.structs.replace(commit.boundary, clear_abandon=True)
        return msgspec.structs.replace(commit, boundary=boundary)

    def _abandoned(self, reason: str, commit: Commit | None = None) -> list[Effect]:
        """PS-8: the turn must not be retried at startup: its marker, told once durable.

        Rides in ``commit`` when the decision has one (a user abort's partial row), else is
        a write of its own; a failed one is logged (a startup may retry that turn).
        """
        marker = AbandonMarker(reason=reason, user_row=self.anchor)
        self.abandon_stored = True
        persisted = Persisted(session=self.id, what="abandon", id=self.anchor or self.id)
        if commit is None:
            return [
                Commit(
                    Boundary(abandon=marker),
                    tell=(persisted,),
                    failed=_in.Ignored(),
                    what="abandon marker",
                )
            ]
        boundary = msgspec.structs.replace(commit.boundary, abandon=marker)
        return [msgspec.structs.replace(commit, boundary=boundary, tell=(*commit.tell, persisted))]

    def give_up(self, reason: str) -> list[Effect]:
        """PS-8, AS-4: a send refused before its stream keeps its row: never retried."""
        return self._abandoned(reason)

    def _final_failed(self, failed: _in.FinalFailed) -> list[Effect]:
        """A failed final row ends the stream in a ``store_write`` error (its partial stays)."""
        ended = failed.ended
        self.leftover = Leftover(ended.stream, ended.parts, ended.model, ended.usage)
        self.final_failed(failed.ended)
        error = WriteFailed(
            f"the final row {failed.row.row_id} could not be written: {failed.error}"
        )
        error.__cause__ = failed.error
        return [Reply(error)]

    def final_written(self, row: HistoryRow) -> list[Effect]:
        """The final row is durable: a cut's ``owed`` is told now.

        A continuation that ended while the row was being written follows at once (written,
        then told).
        """
        if row.cut is None or row.stream is None:
            return []
        owed, self.records.untold_owed = self.records.untold_owed, None
        durable = _in.CutRowDurable(row.stream, row.row_id)
        return [Emit(owed), Next(durable)] if owed is not None else self._cut_row_durable(durable)

    def _cut_row_durable(self, durable: _in.CutRowDurable) -> list[Effect]:
        return [_FLUSH] if self.records.written(durable.stream, durable.row_id) else []

    def _tell_unwritten(self) -> list[Effect]:
        """A turn's outcome came and no row took the cut's record: tell what stayed untold."""
        records = self._records
        if records is None or not records.untold():
            return []
        return [Emit(event) for event in records.never_written()]

    # ------------------------------------------------------------ outcomes

    def outcome(self, outcome: StreamOutcome, context: StreamContext) -> list[Effect]:
        """A launched turn's outcome: what stayed untold is told, then the outcome's path."""
        return [*self._tell_unwritten(), Next(_in.AfterTelling(outcome, context))]

    def _after_telling(self, outcome: StreamOutcome, context: StreamContext) -> list[Effect]:
        if self.disposed:
            return []
        if isinstance(outcome, Ended):
            return self._ended(outcome, context)
        if isinstance(outcome, Aborted):
            return [*self._owner_hears(outcome, context), *self._aborted(outcome)]
        if isinstance(outcome, Failed):
            return self._failed(outcome, context)
        return self.not_started(outcome, context)

    def _ended(self, ended: Ended, context: StreamContext) -> list[Effect]:
        """AS-24: a normal end; the queue's next entry takes over, else the session idles.

        A delegated turn's owner hears of it first (TD-2: its claim sees the queue as it is).
        """
        moved = self._move(Phase.COMPLETING)
        self._compact = None  # it ended before its compaction stop landed
        self._retry.reset()  # AS-24: a successful end resets the retry's attempts
        return [*moved, *self._owner_hears(ended, context), _DRAIN, _IDLE_FROM_COMPLETING]

    def _failed(self, failed: Failed, context: StreamContext) -> list[Effect]:
        """AS-25, R25: a stream error withdraws the continuation; the error path owns it.

        PS-8: a non-retryable failure stores the turn's abandon marker (its type); a
        retryable one clears a stored one (a startup retries the turn).
        """
        moved = self._move(Phase.COMPLETING)
        self._compact = None
        if failed.parts:  # PS-2: the next row this session appends commits them first
            self.leftover = Leftover(failed.stream, failed.parts, failed.model, failed.usage)
        else:  # SM-14: no row takes its usage: the ledger does
            self.usage_ledger = merge_usage(self.usage_ledger, failed.usage)
        if self._context_retry(failed):  # AS-34: compacted, then continued under the rest
            return [*moved, Next(_in.FailedTurnSettles(compact=True))]
        settles = self._retry_decision(failed)
        if failed.retryable:
            marker = self._abandon_cleared(Commit(Boundary(), what="abandon marker"))
            marks: list[Effect] = []
            if marker.boundary.clear_abandon:
                persisted = Persisted(session=self.id, what="abandon", id=self.anchor or self.id)
                marks = [msgspec.structs.replace(marker, tell=(persisted,), failed=_in.Ignored())]
        else:
            marks = self._abandoned(failed.type.value)
        # TD-6: a delegated turn's owner hears of the failure only when nothing retries it
        heard = [] if settles.retry is not None else self._owner_hears(failed, context)
        return [*moved, *marks, *heard, Next(settles)]

    def _context_retry(self, failed: Failed) -> bool:
        """AS-34, AS-35: a context-limit failure is compacted and continued, once per user row.

        The follow-up runs under what the failed attempt left and is admitted like every
        resume (R44); a second failure of the same turn is terminal.
        """
        if (
            failed.kind is not ErrorKind.CONTEXT_EXCEEDED
            or self._compaction.at <= 0  # compaction is off: nothing to retry with
            or failed.remaining <= 0
            or self._context_retried == (self.anchor or "")
            or self.disposed
        ):
            return False
        self._context_retried = self.anchor or ""
        compact = _Compacting(failed.stream, self._last_input)
        self._compact = compact.stopped_at(failed.remaining, failed.model, failed.progress)
        return True

    def _retry_decision(self, failed: Failed) -> _in.FailedTurnSettles:
        """AS-32, AS-33: the retry that owns the failed turn now, or why none does.

        The retry runs under what the attempt left (R36), on the model it reached with its
        fallback progress (R38), for its correlation (R49) and goal, asked again at launch
        (R44). Nothing is told when the engine runs without auto-retry.
        """
        policy = self._retry_policy
        if not policy.enabled:
            return _in.FailedTurnSettles()
        if failed.kind is ErrorKind.CONTEXT_EXCEEDED and self._context_retried == (
            self.anchor or ""
        ):
            why = "context_exceeded: the turn's one context-limit retry already ran (AS-34)"
            return _in.FailedTurnSettles(abandoned=why)
        plan = decide(policy, self._retry, failed)
        if isinstance(plan, GiveUp):
            return _in.FailedTurnSettles(abandoned=plan.why)
        marker = self._marker_here(
            failed.stream, failed.model, failed.remaining, failed.progress, retry=True
        )
        return _in.FailedTurnSettles(marker, plan.attempt, plan.delay_s)

    def _marker_here(
        self,
        cut: str,
        model: str,
        budget: int,
        progress: ModelFallbackProgress,
        *,
        retry: bool = False,
    ) -> Marker:
        """What continues the current turn from ``cut``: a resume's marker, or a retry's.

        ST-1, AS-33: the stream's retry-safe options on ``model``, its correlation (R49) and
        goal, the thinking level with a pending change (R20), the live scratchpad (R26).
        """
        context = self.context
        thinking = self.thinking.at_cut() if self.thinking is not None else context.thinking_level
        return Marker(
            cut=cut,
            model=model,
            step_budget=budget,
            progress=progress,
            options=msgspec.structs.replace(retry_safe(context.options), model=model),
            correlation=context.correlation,
            goal_kind=GOAL_KIND if self.goal is not None else None,
            goal_id=self.goal,
            agent_initiated=context.agent_initiated,
            thinking_level=thinking,
            extra_system_context=self.scratchpad,
            cause=StartCause.RETRY if retry else StartCause.RESUME,
            durable=not retry,
        )

    def _owner_hears(
        self, outcome: Ended | Aborted | Failed, context: StreamContext
    ) -> list[Effect]:
        """What the owner of a delegated turn hears of this stream (TD-1 to TD-6), if anyone."""
        correlation = context.correlation
        if correlation is None and not self.owner_listens:
            return []  # nothing delegated here: nobody to tell
        event: ChildEvent
        if isinstance(outcome, Ended):
            report = "".join(p.text for p in outcome.parts if isinstance(p, TextPart))
            event = ChildEnded(
                target=self.id,
                correlation=correlation,
                stream=outcome.stream,
                finish=outcome.finish,
                report=report,
            )
        elif isinstance(outcome, Aborted):
            event = ChildAborted(
                target=self.id,
                correlation=correlation,
                stream=outcome.stream,
                reason=outcome.reason,
            )
        else:
            event = ChildFailed(
                target=self.id, correlation=correlation, stream=outcome.stream, kind=outcome.kind
            )
        return [TellOwner(event)]

    # ------------------------------------------------------------ the owner's claim

    def claim(self, correlation: Correlation, stream: str) -> list[Effect]:
        """ST-15: will anything continue the turn ``correlation`` that ``stream`` cut?

        Answered at once (no await), in ST-15's order; replies ``bool``. A ``False`` is
        binding: the owed marker for exactly that cut is withdrawn (the owner settles the turn
        itself), so it can never resume, however the entry that superseded it leaves later.
        """
        answer = self._claim(correlation, stream)
        effects: list[Effect] = [Reply(answer)]
        marker = self.continuation.marker
        if (
            not answer
            and marker is not None
            and marker.correlation == correlation
            and marker.cut == stream
        ):
            effects += [
                *self._end(EndedHow.VOIDED, "its owner settles the turn (ST-15)"),
                _FLUSH,
            ]
        return effects

    def queued_or_dispatching(self, correlation: Correlation) -> bool:
        """ST-16: a live entry of ``correlation`` is queued, or dispatching and not withdrawn.

        Withdrawn entries never count (MQ-7): the owner reads this to decide whether a new
        report may carry the correlation (TD-9).
        """
        turn = self._preparing_turn
        if turn is not None and turn.correlation == correlation and not turn.canceled():
            return True
        return any(entry.correlation == correlation for entry in self.queue if not entry.withdrawn)

    def unrelated_live(self, correlation: Correlation) -> bool:
        """TD-9: a live entry not of ``correlation`` is queued, or dispatching and not withdrawn.

        The complement of :meth:`queued_or_dispatching` over the same entries: a report may
        carry ``correlation`` only when this is ``False`` (nothing unrelated ahead of it).
        """
        turn = self._preparing_turn
        if turn is not None and turn.correlation != correlation and not turn.canceled():
            return True
        return any(entry.correlation != correlation for entry in self.queue if not entry.withdrawn)

    def running_handle(self) -> str | None:
        """The handle of the delegated turn whose stream runs now, if one does."""
        correlation = self.context.correlation
        if self._streaming is None or correlation is None:
            return None
        return correlation.handle_id

    def _claim(self, correlation: Correlation, stream: str) -> bool:
        state = self.continuation
        if stream in state.consumed:  # 1: its successor already ran (R33)
            kept = tuple(cut for cut in state.consumed if cut != stream)
            self.continuation = msgspec.structs.replace(state, consumed=kept)
            return True
        if self.phase is Phase.PREPARING:  # 2: the engaged cutter first (R30)
            engaged = self._engaged(correlation)
            if engaged is not None:
                return engaged
        first = self.queue.first_live()  # 3: withdrawn entries are skipped (MQ-7)
        if first is not None:
            return first.correlation == correlation or first.kind is EntryKind.WAKE
        marker = state.marker  # 4: this cut's marker, or a newer cut's of the same turn
        if marker is not None and marker.correlation == correlation:
            return True
        return (  # 5: a stream of the turn is running
            self._streaming is not None
            and self._streaming != stream
            and self.context.correlation == correlation
        )

    def _engaged(self, correlation: Correlation) -> bool | None:
        """ST-15 step 2: what the turn claiming PREPARING answers, or ``None`` to look on."""
        if self._resume_armed:
            marker = self.continuation.marker
            return marker is not None and marker.correlation == correlation
        turn = self._preparing_turn
        if turn is None or turn.canceled():
            return None  # nothing engaged, or it will cancel before acceptance
        return turn.correlation == correlation or turn.kind is EntryKind.WAKE

    def _failed_turn_settles(self, settles: _in.FailedTurnSettles) -> list[Effect]:
        """R25, ST-10: the owed continuation is withdrawn; a retry owns the turn, or nothing."""
        self.continuation = resume_settled(self.continuation)
        why = "the stream failed; the error path owns it (R25)"
        effects = [*self._end(EndedHow.WITHDRAWN, why), _FLUSH]
        compact = self._compact
        if settles.compact and compact is not None:  # AS-34: the compaction request now
            left = self.leftover
            tail = tuple(assistant_messages(body_of(left))) if left is not None else ()
            prompt = self._compaction.prompt
            effects.append(RunCompaction(compact.stream, self.model, prompt, tail))
            return effects
        retry = settles.retry
        if retry is not None:
            self.continuation, _ = owe(self.continuation, retry)
            effects += self._scheduled(retry, Schedule(settles.attempt, settles.delay_s))
        elif settles.abandoned is not None:
            self._retry.reset()
            effects.append(Emit(RetryAbandoned(session=self.id, why=settles.abandoned)))
        return [*effects, _IDLE_FROM_COMPLETING, _DRAIN_IF_IDLE]  # nothing queued waits on it

    def not_started(self, outcome: Refused | Withdrawn, context: StreamContext) -> list[Effect]:
        """The launch never reached stream-start (AS-10, ST-10)."""
        self.send_now_pending = False  # the preempted turn never streamed; the drain serves it
        effects: list[Effect] = []
        resume = context.resume_of
        if resume is not None:
            self._resume_armed = False
            self.continuation = resume_settled(self.continuation)
            refused = outcome.why if isinstance(outcome, Refused) else None
            how = "refused" if refused is not None else "withdrawn"
            told = ResumeAttempted(session=self.id, cut=resume[0], attempt=resume[1], outcome=how)
            effects.append(Emit(told))
            if refused is not None:
                effects.append(Next(_in.Forfeit(f"admission refused: {refused}")))
        effects += [_IDLE_FROM_PREPARING, _DRAIN_IF_IDLE]
        return effects

    def _aborted(self, aborted: Aborted) -> list[Effect]:
        """AS-23, AS-28: commit the partial; a queued-message soft stop may owe a continuation.

        A soft-stop cut is one write: the partial row carries the durable cut record (R47,
        R58); ``owed`` is told after it commits (R60). A user's abort of a turn the auto-retry
        was retrying abandons the retry (``aborted`` is not retryable, AS-23, AS-32).
        """
        moved = self._move(Phase.COMPLETING) if self.phase is Phase.STREAMING else []
        told: list[Effect] = []
        if aborted.reason is AbortReason.USER and self._retry.attempts:
            self._retry.reset()
            why = f"retry of the turn aborted by the user ({aborted.stream})"
            told.append(Emit(RetryAbandoned(session=self.id, why=why)))
        return [*moved, *told, Next(_in.CommitPartial(aborted))]

    def _commit_partial(self, aborted: Aborted) -> list[Effect]:
        """B6: the partial row, with the cut record when it owes.

        Nothing is written when the stream said nothing, or an edit abandons it (AS-6).
        """
        meta = aborted.metadata
        owes = (
            self._soft_stop
            and aborted.reason is AbortReason.QUEUED_MESSAGE
            and not meta.required_tool_satisfied
            and meta.steps_remaining > 0
        )
        abandon, self._abandon_partial = self._abandon_partial, False
        effects: list[Effect] = []
        row: HistoryRow | None = None
        if aborted.parts and not abandon:
            record = None
            if owes:
                record = self._cut_record(meta.steps_remaining, meta.model, meta.fallback_progress)
            body = body_from_parts(aborted.parts, finish=None, model=meta.model)
            if meta.usage:  # SM-14: the partial is stamped with its usage, by model (R59)
                body = msgspec.structs.replace(body, usage=meta.usage)
            row = self.new_row(
                RowKind.PARTIAL, encode_body(body), stream=aborted.stream, cut=record
            )
            commit = _boundaries.appended(
                row,
                "cut" if owes else "partial",
                then=_in.AbortWritten(aborted, row, owes),
                failed=_in.PartialFailed(aborted),
                what="partial row",
            )
            commit = _dropping(commit, aborted.stream)  # B6: the row takes the partial
            if aborted.reason is AbortReason.USER:  # PS-8: a user's Stop is never retried
                (commit,) = self._abandoned("aborted", commit)  # type: ignore[assignment]
            effects.append(self._with_records(commit))
            return effects
        # SM-14: an abandoned or empty partial's usage goes to the side ledger
        self.usage_ledger = merge_usage(self.usage_ledger, meta.usage)
        if aborted.parts:  # an edit abandons it (AS-6): what the stream wrote goes too
            drop = Commit(
                Boundary(drop_partials=(aborted.stream,)), failed=_in.Ignored(), what="partial"
            )
            effects.append(drop)
        if aborted.reason is AbortReason.USER:
            effects += self._abandoned("aborted")
        effects.append(Next(_in.AbortWritten(aborted, None, owes)))
        return effects

    def _abort_unwritten(self, aborted: Aborted, failed: str) -> list[Effect]:
        """The partial (and the cut record it carried) could not be written.

        Nothing of it is durable, so the cut owes nothing; the host is told a ``store_write``
        stream error, and the queue goes on as after any abort.
        """
        error = StreamFailed(
            session=self.id,
            stream=aborted.stream,
            kind=ErrorKind.RETRYABLE,
            remaining=aborted.metadata.steps_remaining,
            type=ErrorType.STORE_WRITE.value,
            message=failed,
        )
        return [Emit(error), Next(_in.AbortWritten(aborted, None, owes=False))]

    def _abort_written(
        self, aborted: Aborted, row: HistoryRow | None, *, owes: bool
    ) -> list[Effect]:
        # R16, R22: read the soft-stop flag again after the write: a hard stop that landed
        # meanwhile cleared it, and only the queued-message reason may owe a continuation.
        soft_stop = self._soft_stop and aborted.reason is AbortReason.QUEUED_MESSAGE
        self._soft_stop = False
        effects: list[Effect] = []
        if owes and soft_stop:
            meta = aborted.metadata
            owed = self._owe(
                QueuedStopReport(
                    stream=aborted.stream,
                    model=meta.model,
                    steps_remaining=meta.steps_remaining,
                    fallback_progress=meta.fallback_progress,
                )
            )
            if row is not None:
                self.records.carried_by(aborted.stream, row.row_id)
            if owed is not None:
                effects.append(Emit(owed))
        elif owes and row is not None:  # written for a cut that the hard stop took back
            self.records.change_row(row.row_id, CutState.VOIDED)
        if soft_stop:
            effects.append(Next(_in.ClassifyCutter()))
        effects.append(_FLUSH)
        compact, self._compact = self._compact, None
        if (
            compact is not None
            and compact.stream == aborted.stream
            and aborted.reason is AbortReason.SYSTEM
            and not soft_stop
            and not self.disposed
        ):
            meta = aborted.metadata
            self._compact = compact.stopped_at(
                meta.steps_remaining, meta.model, meta.fallback_progress
            )
            effects.append(Next(_in.CompactNow(aborted)))  # AS-36: its abort was for this
            return effects
        effects.append(Next(_in.AbortSettled(soft_stop)))
        return effects

    # ------------------------------------------------------------ compaction (AS-36, AS-37)

    def usage_reported(self, stream: str, model: str, tokens: int) -> list[Effect]:
        """AS-36: a step's input reached ``compact_at`` of its window: stop at its end (system).

        Only a step whose tool calls are about to run is followed by another step; a turn's
        last step is left to end, and the next turn compacts before it launches (on send).
        """
        if self._compact is not None or self._streaming != stream:
            return []
        self._last_input = tokens
        limit = self._compaction.threshold(model)
        if limit is None or tokens < limit or not self._active_tools:
            return []
        self._compact = _Compacting(stream, tokens)
        return [StopStream(AbortReason.SYSTEM, soft=True)]

    @property
    def compaction_prompt(self) -> str:
        """What a compaction request asks after the history (the host's, AS-36)."""
        return self._compaction.prompt

    def compaction_before_launch(
        self, rows: tuple[HistoryRow, ...], context: StreamContext
    ) -> tuple[int, tuple[HistoryRow, ...]] | None:
        """AS-36 on send: a fresh turn launching over the threshold compacts what precedes it.

        Its own row (the history's last) stays after the summary; a resume, retry or
        follow-up continues a turn and never compacts here. Returns the last seq the summary
        covers and the rows it summarizes, or ``None``.
        """
        if context.cause not in (StartCause.SEND, StartCause.QUEUE) or not rows:
            return None
        limit = self._compaction.threshold(context.model)
        last = rows[-1]
        if limit is None or self._last_input < limit or last.kind is not RowKind.USER:
            return None
        earlier = rows[:-1]
        if not any(row.kind is not RowKind.SYSTEM for row in earlier):
            return None
        return earlier[-1].seq, earlier

    def summarized_before_launch(
        self, text: str, through: int, rows: tuple[HistoryRow, ...]
    ) -> list[Effect]:
        """B7 on send: the summary of everything up to ``through``; the turn's row after it."""
        tokens, self._last_input = self._last_input, 0
        stream = f"{self.id}/{self._stream_n}"  # the stream about to start
        body = RowBody(text=text, through=through)
        row = self.new_row(RowKind.SUMMARY, encode_body(body), stream=stream)
        done = Compacted(session=self.id, stream=stream, tokens=tokens, outcome="summarized")
        commit = _boundaries.appended(
            row,
            "summary",
            then=_in.Answer((*rows, row)),
            # the turn launches on all of it, and the host is told the compaction failed
            failed=_in.SummaryBeforeLaunchFailed(rows, stream=stream, tokens=tokens),
            what="summary row",
        )
        return [msgspec.structs.replace(commit, tell=(*commit.tell, done))]

    def _stop_compaction(self) -> None:
        """A stop: a compaction not begun is called off; one under way owes no follow-up."""
        compact = self._compact
        if compact is None or compact.left is None:
            self._compact = None
        else:
            compact.stopped = True

    def compact_now(self, aborted: Aborted) -> list[Effect]:
        """AS-36: the stopped stream's partial is settled: one compaction request runs now.

        The phase stays COMPLETING (a send meanwhile queues); its answer is ``Summarized``.
        """
        prompt = self._compaction.prompt
        return [RunCompaction(stream=aborted.stream, model=self.model, prompt=prompt)]

    def summarized(self, text: str) -> list[Effect]:
        """B7: the summary row, carrying the pending follow-up the stopped turn owes (R40)."""
        compact = self._compact
        if compact is None or compact.left is None or self.disposed:
            self._compact = None
            return [_IDLE_FROM_COMPLETING, _DRAIN_IF_IDLE]
        remaining, model, progress = compact.left
        follow: FollowUp | None = None
        if remaining > 0 and not compact.stopped:  # a stop ends the turn
            follow = follow_up_of(
                remaining,
                model,
                progress,
                self.context.correlation,
                (GOAL_KIND if self.goal is not None else None, self.goal),
            )
        pending = encode_follow_up(follow) if follow is not None else None
        before = None
        if self.leftover is not None or self.stored_partials:  # PS-2: what it said goes first
            before = self._leftover_commit(())
        body = RowBody(text=text, follow_up=pending)
        row = self.new_row(RowKind.SUMMARY, encode_body(body), stream=compact.stream)
        done = Compacted(
            session=self.id, stream=compact.stream, tokens=compact.tokens, outcome="summarized"
        )
        commit = _boundaries.appended(
            row,
            "summary",
            then=_in.SummaryWritten(row, follow),
            failed=_in.SummaryFailed(),
            what="summary row",
        )
        commit = msgspec.structs.replace(commit, tell=(*commit.tell, done))
        if before is not None:  # one commit: the leftover rows, then the summary
            boundary = msgspec.structs.replace(
                commit.boundary,
                rows=(*before.boundary.rows, row),
                drop_partials=before.boundary.drop_partials,
            )
            tell = (*before.tell, *commit.tell)
            commit = msgspec.structs.replace(commit, boundary=boundary, tell=tell)
        return [self._with_records(commit)]

    def summary_written(self, row: HistoryRow, follow: FollowUp | None) -> list[Effect]:
        """B7 is durable: the follow-up is owed, and the sweep launches it once idle (AS-37)."""
        compact, self._compact = self._compact, None
        effects: list[Effect] = []
        if follow is not None and compact is not None:
            context = self.context  # the stopped stream's settings go on with it
            marker = msgspec.structs.replace(
                follow.marker(compact.stream),
                options=msgspec.structs.replace(retry_safe(context.options), model=follow.model),
                agent_initiated=context.agent_initiated,
                thinking_level=context.thinking_level,
                extra_system_context=self.scratchpad,
            )
            self.continuation, _ = owe(self.continuation, marker)
            self._follow_up_row = row
        elif compact is not None:
            left = "stopped by the user" if compact.stopped else "no steps left (R48)"
            why = f"follow-up of {compact.stream}: {left}"
            effects.append(Emit(RetryAbandoned(session=self.id, why=why)))
        return [*effects, _IDLE_FROM_COMPLETING, _DRAIN_IF_IDLE]

    def compaction_failed(self, why: str) -> list[Effect]:
        """AS-36: no summary: told ``compaction failed``; the stopped turn ends there."""
        compact, self._compact = self._compact, None
        if compact is None or self.disposed:
            return [_IDLE_FROM_COMPLETING, _DRAIN_IF_IDLE]
        failed = Compacted(
            session=self.id, stream=compact.stream, tokens=compact.tokens, outcome="failed"
        )
        abandoned = RetryAbandoned(
            session=self.id, why=f"compaction of {compact.stream} failed: {why}"
        )
        return [Emit(failed), Emit(abandoned), _IDLE_FROM_COMPLETING, _DRAIN_IF_IDLE]

    def _follow_up_rows(self, rows: tuple[HistoryRow, ...], marker: Marker) -> list[Effect]:
        """B8: the follow-up row, and the pending follow-up cleared, in one commit (PS-7).

        The row carries the follow-up's retry options, so a crash after it is retried under
        them; its launch refused at the boundary takes it back (R51, the launcher).
        """
        summary = self._follow_up_row
        follow = follow_up_of(
            marker.step_budget,
            marker.model,
            marker.progress,
            marker.correlation,
            (marker.goal_kind, marker.goal_id),
        )
        body = RowBody(
            text=FOLLOW_UP_TEXT,
            entry_kind="follow-up",
            correlation=marker.correlation,
            follow_up=encode_follow_up(follow),
        )
        row = self.new_row(RowKind.USER, encode_body(body))
        persisted = Persisted(session=self.id, what="follow-up", id=row.row_id)
        if summary is None:
            boundary = Boundary(rows=(row,))
            read = (*rows, row)
        else:
            cleared = _without_follow_up(summary)
            boundary = Boundary(delete=(summary.row_id,), rows=(cleared, row))
            read = (*(cleared if r.row_id == summary.row_id else r for r in rows), row)
        return [
            Commit(
                boundary,
                tell=(persisted,),
                then=_in.FollowUpWritten(read),
                failed=_in.FollowUpFailed(),
                what="follow-up row",
            )
        ]

    def adopt_follow_up(self, marker: Marker, row: HistoryRow) -> None:
        """PS-7: owe the follow-up a crash left pending on summary ``row``; the sweep runs it."""
        self.continuation, _ = owe(self.continuation, marker)
        self._follow_up_row = row

    def _abort_settled(self, *, soft_stop: bool) -> list[Effect]:
        effects: list[Effect] = []
        if soft_stop:
            effects.append(_DRAIN)  # AS-28: the cutter, or cancel withdrawn entries
        elif self.send_now_pending:
            self.send_now_pending = False
            effects.append(_DRAIN)  # AS-18: the user's prioritized entry goes next
        effects.append(_IDLE_FROM_COMPLETING)
        return effects

    def _classify_cutter(self) -> list[Effect]:
        """AS-28 step 4: the next live entry continues the cut turn, or supersedes it.

        A wake (or an entry of the cut stream's correlation) continues it; a wake without a
        correlation is stamped with the cut stream's (R56), since a partial row gives history
        nothing to inherit from. Anything else supersedes a correlated continuation, which is
        forfeited before that entry is dispatched (R29).
        """
        marker = self.continuation.marker
        first = self.queue.first_live()
        if first is None or marker is None:
            return []
        cut_correlation = self.context.correlation
        if first.kind is EntryKind.WAKE:
            if first.correlation is None and cut_correlation is not None:
                self._stamp = (first.id, cut_correlation)
            return []
        if marker.correlation is not None and first.correlation != marker.correlation:
            return self._end(EndedHow.FORFEITED, "superseded by unrelated input (R29)")
        return []

    # ------------------------------------------------------------ host actions

    def stop(self) -> list[Effect]:
        """AS-30: a user Stop withdraws the continuation first (R6, R11), then stops.

        A delegated turn's owed continuation is the user's to end (TD-5): its owner hears a
        user abort of the cut, since no stream of the turn runs to be aborted.
        """
        marker = self.continuation.marker
        self._stop_compaction()
        effects = self._end(EndedHow.WITHDRAWN, "user stop", reason=AbortReason.USER)
        if marker is not None and not marker.durable and self.phase is Phase.IDLE:
            effects += self._abandoned("aborted")  # PS-8: a retry the user stopped stays stopped
        if marker is not None and marker.correlation is not None and self.owner_listens:
            aborted = ChildAborted(
                target=self.id,
                correlation=marker.correlation,
                stream=marker.cut,
                reason=AbortReason.USER,
            )
            effects.append(TellOwner(aborted))
        effects.append(AbortPrepared(AbortReason.USER))
        self._soft_stop = False
        self._active_tools.clear()
        effects.append(StopStream(AbortReason.USER))
        return effects

    def hard_stop(self) -> list[Effect]:
        """TD-7: a hard stop interrupts the delegated turns here, clears (hard stop), stops."""
        effects: list[Effect] = []
        self._stop_compaction()  # its system abort is no compaction's
        if self.owner_listens:
            effects.append(TellOwner(ChildHardStopped(target=self.id)))
        effects += self.clear("hard stop", hard_stop=True)
        effects.append(AbortPrepared(AbortReason.SYSTEM))
        effects.append(StopStream(AbortReason.SYSTEM))
        return effects

    def send_now(self) -> tuple[bool, list[Effect]]:
        """AS-18: the oldest queued user message goes next, interrupting what runs."""
        if not self.queue.prioritize_next_user_entry():
            return False, []
        effects = self._end(EndedHow.WITHDRAWN, "send now")  # a user interrupt withdraws (R6)
        effects += [_FLUSH, *self._queue_commit("queue order", force=True)]
        if self.phase is Phase.IDLE:
            return True, [*effects, *self.drain_if_idle()]
        self.send_now_pending = True
        effects.append(AbortPrepared(AbortReason.USER))
        effects.append(StopStream(AbortReason.USER))
        return True, effects

    def edit_begins(self) -> list[Effect]:
        """AS-6: withdraw the continuation and hold the drain back for the edit."""
        return [*self._end(EndedHow.WITHDRAWN, "history edited"), _FLUSH]

    def edit_interrupts(self) -> list[Effect]:
        """AS-6: a running (or preparing) turn is interrupted and its partial dropped."""
        self.defer_drain = True
        if self.phase in (Phase.IDLE, Phase.COMPLETING):
            return []
        self._abandon_partial = True
        return [AbortPrepared(AbortReason.USER), StopStream(AbortReason.USER)]

    def edit_settled(self) -> None:
        """AS-6: the edit reached idle; only its own interrupt may drop a partial."""
        self._abandon_partial = False

    def edit_done(self) -> None:
        """AS-6: the edit restored the queue and truncated history; the drain may run again."""
        self.defer_drain = False

    def set_auto_retry(self, *, on: bool) -> list[Effect]:
        """AS-32: the user's preference for this session, committed; off abandons a waiting retry.

        Its reply is ``None`` once durable, else the write's error (the preference holds in
        memory all the same).
        """
        self._retry.off = not on
        effects: list[Effect] = []
        marker = self.continuation.marker
        if not on and marker is not None and marker.cause is StartCause.RETRY:
            effects += self._end(EndedHow.WITHDRAWN, "auto-retry turned off for this session")
        commit = Commit(
            Boundary(auto_retry=on),
            then=_in.Answer(None),
            failed=_in.AnswerError(),
            what="auto-retry",
        )
        return [*effects, commit]

    def discard(self) -> list[Effect]:
        """R27: a context-discarding history mutation forfeits the owed continuation."""
        return self._end(EndedHow.FORFEITED, "the history was discarded (R27)")

    def dispose(self) -> list[Effect]:
        """AS-31: forfeit the owed continuation (R27), abort a resume (R18), settle the owner.

        A delegated turn of this session that owes nothing (its prompt not yet streaming, or
        its stream running) would hear of no stream event any more: the disposal's system
        abort settles nothing (TD-5), so its owner is told the session is gone (R27).
        """
        self._stop_compaction()
        effects = self._end(EndedHow.FORFEITED, "session disposed")
        if self.owner_listens:
            effects.append(TellOwner(ChildDisposed(target=self.id)))
        return effects

    def disposed_now(self) -> list[Effect]:
        """AS-31: the queue is dropped; the session accepts nothing more."""
        self.disposed = True
        removed = self.queue.clear()
        effects: list[Effect] = [AbortPrepared(AbortReason.SYSTEM)]
        if self.broken is None:  # a broken one's queue stays as stored, for its reopening
            self.keeper.dispatch(None)
            effects += self._queue_commit("disposed queue")
        effects += [
            Emit(EntryCanceled(session=self.id, entry=c.entry_id, reason="disposed"))
            for c in removed
        ]
        return effects

    def disposal_done(self) -> list[Effect]:
        """The stream is stopped: the phase is DISPOSED."""
        return [] if self.phase is Phase.DISPOSED else self._move(Phase.DISPOSED)

    # ------------------------------------------------------------ writes of sends and launches

    def _user_row_wanted(self, turn: TurnInput) -> list[Effect]:
        """AS-7: the send's user row; the adapter is answered the row once it is durable."""
        body = RowBody(text=turn.text, entry_kind=turn.kind.value, correlation=turn.correlation)
        before = None
        if self.leftover is not None or self.stored_partials:
            before = self._leftover_commit(())
        row = self.new_row(RowKind.USER, encode_body(body))
        answer = _in.Answer(row)
        commit = _boundaries.appended(
            row, "user-row", then=answer, failed=_in.AnswerError(), what="user row"
        )
        if turn.entry_id is not None and turn.entry_id.startswith(INBOX_ENTRY):
            commit = msgspec.structs.replace(  # LS-9: off the inbox as it enters history
                commit,
                boundary=msgspec.structs.replace(commit.boundary, inbox_taken=(turn.entry_id,)),
            )
        if before is not None:  # PS-2: the leftover partial goes first, in the same commit
            commit = msgspec.structs.replace(
                commit,
                boundary=msgspec.structs.replace(
                    commit.boundary,
                    rows=(*before.boundary.rows, row),
                    drop_partials=before.boundary.drop_partials,
                ),
                tell=(*commit.tell, *before.tell),  # the user row's commit: told first
            )
        self.anchor = row.row_id  # the turn this row starts answers it (PS-8)
        self._retry.reset()  # a new turn: its retries count from 1 (AS-32)
        if self._retry.off and turn.kind is EntryKind.USER:  # AS-32: a user send re-enables
            self._retry.off = False
            boundary = msgspec.structs.replace(commit.boundary, auto_retry=True)
            commit = msgspec.structs.replace(commit, boundary=boundary)
        commit = self._abandon_cleared(commit)
        keeper = self.keeper
        stored = turn.dispatched and keeper.dispatch_stored
        if turn.dispatched:
            keeper.dispatch(None)
        if stored or (turn.dispatched and keeper.changed(self.queue)):
            # accepted into history and off the queue in one transaction
            snapshot = keeper.snapshot(self.queue)
            persisted = Persisted(session=self.id, what="queue", id=row.row_id)
            commit = msgspec.structs.replace(
                commit,
                boundary=msgspec.structs.replace(commit.boundary, queue=snapshot),
                tell=(*commit.tell, persisted),
            )
        return [commit]

    def _rollback(self, row: HistoryRow) -> list[Effect]:
        """AS-3: exactly this send's row goes; a delete that took nothing counts as failed."""
        what = f"rollback of {row.row_id}"
        failed = _in.AnswerError()
        return [
            _boundaries.removed(
                (row.row_id,), what, then=_in.Answer(None), failed=failed, exact=True
            )
        ]

    def _history_loaded(
        self, rows: tuple[HistoryRow, ...], partials: tuple[StoredPartial, ...] = ()
    ) -> list[Effect]:
        """PS-2, R34: a leftover partial is committed first, else the sentinel when needed.

        A history ending in tool results gets the ``Continue`` sentinel (R34); one ending in
        a leftover partial needs none (it is no complete assistant row).
        """
        drops: tuple[str, ...] = ()
        marker = self.continuation.marker
        if (
            marker is not None
            and marker.cause is StartCause.FOLLOW_UP
            and self._resume_armed
            and not (partials or self.leftover is not None or self.stored_partials)
        ):
            return self._follow_up_rows(rows, marker)  # B8 (a leftover goes first, else)
        if partials or self.leftover is not None or self.stored_partials:
            commit = self._leftover_commit(partials)
            if commit is not None and commit.boundary.rows:
                added = commit.boundary.rows
                answer = _in.Answer((*rows, *added))
                return [msgspec.structs.replace(commit, then=answer, failed=_in.AnswerError())]
            if commit is not None:  # only empty partials: dropped with what follows
                drops = commit.boundary.drop_partials
        if not needs_continue_sentinel(rows):
            if drops:
                dropped = Commit(
                    Boundary(drop_partials=drops), failed=_in.Ignored(), what="partial"
                )
                return [dropped, Reply(rows)]
            return [Reply(rows)]
        sentinel = self.new_row(RowKind.SENTINEL, encode_body(RowBody(text=CONTINUE_TEXT)))
        answer = _in.Answer((*rows, sentinel))
        commit = _boundaries.appended(
            sentinel, "sentinel", then=answer, failed=_in.AnswerError(), what="sentinel"
        )
        if drops:
            boundary = msgspec.structs.replace(commit.boundary, drop_partials=drops)
            commit = msgspec.structs.replace(commit, boundary=boundary)
        return [commit]

    def _leftover_commit(self, partials: tuple[StoredPartial, ...]) -> Commit | None:
        """PS-2: the leftover partials as ``partial`` rows (dropped from the partial store).

        ``partials``: the store's, as just read (they win over those known at the session's
        making). ``None`` when nothing is left to commit or drop.
        """
        streams = {partial.stream for partial in partials}
        stored = (*(p for p in self.stored_partials if p.stream not in streams), *partials)
        found, drops = gather(self.id, self.leftover, stored, self.model)
        self.leftover, self.stored_partials = None, ()
        if not drops:
            return None
        rows = tuple(
            self.new_row(RowKind.PARTIAL, encode_body(body_of(left)), stream=left.stream)
            for left in found
        )
        tell = tuple(Persisted(session=self.id, what="partial", id=row.row_id) for row in rows)
        return Commit(
            Boundary(rows=rows, drop_partials=drops),
            tell=tell,
            failed=_in.Ignored(),
            what="leftover partial",
        )

    def _sentinel_unwanted(self, sentinel: HistoryRow) -> list[Effect]:
        """R34: a launch that failed or never started leaves no orphan sentinel."""
        what = f"removal of {sentinel.row_id}"
        return [_boundaries.removed((sentinel.row_id,), what, failed=_in.Ignored())]

    def _delete_rows(self, row_ids: tuple[str, ...], what: str, *, answer: bool) -> list[Effect]:
        """AS-6, R27: history rows go (an edit's truncation; a discard of everything)."""
        failed = _in.AnswerError() if answer else _in.Ignored()
        commit = _boundaries.removed(row_ids, what, failed=failed)
        # the parts a failed stream left belong to the history being cut: they go too
        gone = (
            *((self.leftover.stream,) if self.leftover is not None else ()),
            *(partial.stream for partial in self.stored_partials),
        )
        if gone:
            self.leftover, self.stored_partials = None, ()
            boundary = msgspec.structs.replace(commit.boundary, drop_partials=gone)
            commit = msgspec.structs.replace(commit, boundary=boundary)
        return [commit]

    # ------------------------------------------------------------ the one entry point

    def handle(self, given: _in.Input) -> list[Effect]:
        """Take one input; return the effects the shell must perform, in order.

        An internal error while deciding (an illegal phase move halfway through, a broken
        invariant: an engine bug) breaks the machine (:meth:`_break`) instead of leaving it in
        whatever state it reached. A host's bad call (``UsageError``: an unknown entry) is
        raised before anything changes and breaks nothing.

        Raises:
            BrokenSession: the machine is broken; it takes only disposal.
            UsageError: the input names something that does not exist.
        """
        if self.broken is not None:
            return self._while_broken(given)
        try:  # the handler, found by the input's type (see ``_DECIDE``)
            return _DECIDE[type(given)](self, given)
        except UsageError:
            raise
        except Exception as error:  # an engine bug: stop here, loudly, once
            return self._break(given, error)

    def _break(self, given: _in.Input, error: Exception) -> list[Effect]:
        """Move to BROKEN, say so once, and stop whatever runs (nothing more is decided)."""
        was = self.phase
        self.phase = Phase.BROKEN
        self.broken = f"{type(error).__name__}: {error}"
        self.sweep_scheduled = False
        broken = SessionBroken(
            session=self.id, phase=was, input=type(given).__name__, error=self.broken
        )
        return [
            Emit(PhaseChanged(session=self.id, from_=was, to=Phase.BROKEN)),
            Emit(broken),
            AbortPrepared(AbortReason.SYSTEM),
            _ABORT_RESUME,
            StopStream(AbortReason.SYSTEM),
        ]

    def _on_LeaseGone(self, given: _in.LeaseGone) -> list[Effect]:
        """LS-3: a peer holds the session now: stop whatever runs here, as a broken machine.

        Told once (``session-broken``, its error the ``LeaseLost``); the owed continuation and
        every record stand as the store holds them, for the peer.
        """
        return self._break(given, given.error)

    def _while_broken(self, given: _in.Input) -> list[Effect]:
        """A broken machine takes disposal only, and decides nothing durable on the way.

        The owed continuation is not forfeited: the store's records stand as they are, for
        the reopened session to pick up.
        """
        if isinstance(given, _in.Dispose):
            return []
        if isinstance(given, _in.DisposedNow):
            return self.disposed_now()
        if isinstance(given, _in.DisposalDone):
            return self.disposal_done()
        raise BrokenSession(self.id, self.broken or "broken")

    # ------------------------------------------------------------ one handler per input

    def _on_ToIdleFrom(self, given: _in.ToIdleFrom) -> list[Effect]:
        phases = given.phases
        return self._to_idle_from(*phases)

    def _on_Drain(self, given: _in.Drain) -> list[Effect]:
        return self.drain()

    def _on_DrainIfIdle(self, given: _in.DrainIfIdle) -> list[Effect]:
        return self.drain_if_idle()

    def _on_FlushRecords(self, given: _in.FlushRecords) -> list[Effect]:
        return self._flush()

    def _on_RecordsWritten(self, given: _in.RecordsWritten) -> list[Effect]:
        return self._flush()

    def _on_SweepWanted(self, given: _in.SweepWanted) -> list[Effect]:
        return self._schedule_sweep()

    def _on_WithRecords(self, given: _in.WithRecords) -> list[Effect]:
        return self._with_records_settled(given)

    def _on_Answer(self, given: _in.Answer) -> list[Effect]:
        value = given.value
        return [Reply(value)]

    def _on_AnswerError(self, given: _in.AnswerError) -> list[Effect]:
        error = given.error
        return [Reply(error)]

    def _on_Ignored(self, given: _in.Ignored) -> list[Effect]:
        return []

    def _on_AfterTelling(self, given: _in.AfterTelling) -> list[Effect]:
        outcome = given.outcome
        context = given.context
        return self._after_telling(outcome, context)

    def _on_Consume(self, given: _in.Consume) -> list[Effect]:
        stream = given.stream
        cause = given.cause
        return self._consume(stream, cause)

    def _on_StreamBegan(self, given: _in.StreamBegan) -> list[Effect]:
        stream = given.stream
        cause = given.cause
        return self.stream_started(stream, cause)

    def _on_ToolStarted(self, given: _in.ToolStarted) -> list[Effect]:
        call = given.call
        self.tool_started(call)
        return []

    def _on_ToolEnded(self, given: _in.ToolEnded) -> list[Effect]:
        call = given.call
        provider = given.provider
        return self.tool_ended(call, provider=provider)

    def _on_HistoryLoaded(self, given: _in.HistoryLoaded) -> list[Effect]:
        return self._history_loaded(given.rows, given.partials)

    def _on_Launching(self, given: _in.Launching) -> list[Effect]:
        context = given.context
        self.launching(context)
        return []

    def _on_EnvelopeReady(self, given: _in.EnvelopeReady) -> list[Effect]:
        info = given.info
        return [_boundaries.envelope(info, self.context, self._seq - 1)]  # B3

    def _on_StartReached(self, given: _in.StartReached) -> list[Effect]:
        return self._start_reached()

    def _on_StartWritten(self, given: _in.StartWritten) -> list[Effect]:
        return self._start_reached()  # what was decided while the start was written

    def _on_StartFailed(self, given: _in.StartFailed) -> list[Effect]:
        return self._start_failed(given)

    def _on_FinalReady(self, given: _in.FinalReady) -> list[Effect]:
        ended = given.ended
        return self._final_ready(ended)

    def _on_FinalWritten(self, given: _in.FinalWritten) -> list[Effect]:
        row = given.row
        return self.final_written(row)

    def _on_FinalFailed(self, given: _in.FinalFailed) -> list[Effect]:
        return self._final_failed(given)

    def _on_CutRowDurable(self, given: _in.CutRowDurable) -> list[Effect]:
        return self._cut_row_durable(given)

    def _on_Outcome(self, given: _in.Outcome) -> list[Effect]:
        outcome = given.outcome
        context = given.context
        return self.outcome(outcome, context)

    def _on_UserRowWanted(self, given: _in.UserRowWanted) -> list[Effect]:
        turn = given.turn
        return self._user_row_wanted(turn)

    def _on_Supersede(self, given: _in.Supersede) -> list[Effect]:
        turn = given.turn
        why = given.why
        return self.supersede(turn, why)

    def _on_TurnAccepted(self, given: _in.TurnAccepted) -> list[Effect]:
        turn = given.turn
        return self.accepted(turn)

    def _on_ReleasePreflight(self, given: _in.ReleasePreflight) -> list[Effect]:
        self.release_preflight()
        return []

    def _on_DispatchEntry(self, given: _in.DispatchEntry) -> list[Effect]:
        turn = given.turn
        token = given.token
        return self._dispatch_entry(turn, token)

    def _on_Dispatched(self, given: _in.Dispatched) -> list[Effect]:
        token = given.token
        self.dispatched(token)
        return []

    def _on_SendWentNowhere(self, given: _in.SendWentNowhere) -> list[Effect]:
        turn = given.turn
        return self.send_went_nowhere(turn)

    def _on_Queued(self, given: _in.Queued) -> list[Effect]:
        return self.queued()

    def _on_QueueWritten(self, given: _in.QueueWritten) -> list[Effect]:
        return self.queue_written()

    def _on_QueueFailed(self, given: _in.QueueFailed) -> list[Effect]:
        queued = given.queued
        return self.queue_failed(queued)

    def _on_BackOffOver(self, given: _in.BackOffOver) -> list[Effect]:
        return self.backoff_over(given.generation)

    def _on_GiveUp(self, given: _in.GiveUp) -> list[Effect]:
        reason = given.reason
        return self.give_up(reason)

    def _on_AdoptRetry(self, given: _in.AdoptRetry) -> list[Effect]:
        marker = given.marker
        self.adopt_retry(marker)
        return []

    def _on_TakeUpQueue(self, given: _in.TakeUpQueue) -> list[Effect]:
        dropped = given.dropped
        return self.take_up_queue(dropped)

    def _on_TokenFired(self, given: _in.TokenFired) -> list[Effect]:
        entry = given.entry
        return self.token_fired(entry)

    def _on_Enqueue(self, given: _in.Enqueue) -> list[Effect]:
        message = given.message
        key = given.key
        return self._enqueue(message, key)

    def _on_Claim(self, given: _in.Claim) -> list[Effect]:
        return self.claim(given.correlation, given.stream)

    def _on_DirectSend(self, given: _in.DirectSend) -> list[Effect]:
        self.direct_send()
        return []

    def _on_QueuedStop(self, given: _in.QueuedStop) -> list[Effect]:
        report = given.report
        self.queued_stop(report)
        return []

    def _on_CommitPartial(self, given: _in.CommitPartial) -> list[Effect]:
        aborted = given.aborted
        return self._commit_partial(aborted)

    def _on_PartialFailed(self, given: _in.PartialFailed) -> list[Effect]:
        aborted = given.aborted
        error = given.error
        meta = aborted.metadata  # PS-2: its parts stay for the next row to take
        self.leftover = Leftover(aborted.stream, aborted.parts, meta.model, meta.usage)
        return self._abort_unwritten(aborted, str(error))

    def _on_AbortWritten(self, given: _in.AbortWritten) -> list[Effect]:
        aborted = given.aborted
        row = given.row
        owes = given.owes
        return self._abort_written(aborted, row, owes=owes)

    def _on_AbortSettled(self, given: _in.AbortSettled) -> list[Effect]:
        soft_stop = given.soft_stop
        return self._abort_settled(soft_stop=soft_stop)

    def _on_ClassifyCutter(self, given: _in.ClassifyCutter) -> list[Effect]:
        return self._classify_cutter()

    def _on_FailedTurnSettles(self, given: _in.FailedTurnSettles) -> list[Effect]:
        return self._failed_turn_settles(given)

    def _on_Forfeit(self, given: _in.Forfeit) -> list[Effect]:
        why = given.why
        return self._end(EndedHow.FORFEITED, why)

    def _on_RecordsFailed(self, given: _in.RecordsFailed) -> list[Effect]:
        changes = given.changes
        return self._changes_failed(changes)

    def _on_NotStarted(self, given: _in.NotStarted) -> list[Effect]:
        outcome = given.outcome
        context = given.context
        return self.not_started(outcome, context)

    def _on_SyntheticAbort(self, given: _in.SyntheticAbort) -> list[Effect]:
        reason = given.reason
        return self.synthetic_abort(reason)

    def _on_SentinelUnwanted(self, given: _in.SentinelUnwanted) -> list[Effect]:
        sentinel = given.sentinel
        return self._sentinel_unwanted(sentinel)

    def _on_Rollback(self, given: _in.Rollback) -> list[Effect]:
        row = given.row
        return self._rollback(row)

    def _on_SweepDue(self, given: _in.SweepDue) -> list[Effect]:
        return self.sweep_due()

    def _on_Sweep(self, given: _in.Sweep) -> list[Effect]:
        return self.sweep()

    def _on_ArmResume(self, given: _in.ArmResume) -> list[Effect]:
        marker = given.marker
        attempt = given.attempt
        return self._arm_resume(marker, attempt)

    def _on_ResumeFailed(self, given: _in.ResumeFailed) -> list[Effect]:
        marker = given.marker
        attempt = given.attempt
        return self.resume_failed(marker, attempt)

    def _on_ResumeUnreadable(self, given: _in.ResumeUnreadable) -> list[Effect]:
        marker = given.marker
        attempt = given.attempt
        return self.resume_unreadable(marker, attempt)

    def _on_Removed(self, given: _in.Removed) -> list[Effect]:
        removed = given.removed
        reason = given.reason
        before = given.before
        return self.removed(list(removed), reason, before)

    def _on_Withdraw(self, given: _in.Withdraw) -> list[Effect]:
        entry = given.entry
        reason = given.reason
        return [Reply(self.withdraw(entry, reason))]

    def _on_Clear(self, given: _in.Clear) -> list[Effect]:
        reason = given.reason
        hard_stop = given.hard_stop
        return self.clear(reason, hard_stop=hard_stop)

    def _on_Restore(self, given: _in.Restore) -> list[Effect]:
        text, effects = self.restore()
        return [Reply(text), *effects]

    def _on_RemoveDedupe(self, given: _in.RemoveDedupe) -> list[Effect]:
        prefix = given.prefix
        reason = given.reason
        count, effects = self.remove_dedupe(prefix, reason)
        return [Reply(count), *effects]

    def _on_RemoveWorkspaceTurn(self, given: _in.RemoveWorkspaceTurn) -> list[Effect]:
        count, effects = self.remove_workspace_turn(given.handle, given.reason)
        return [Reply(count), *effects]

    def _on_DropOnlyDedupeKey(self, given: _in.DropOnlyDedupeKey) -> list[Effect]:
        dropped, effects = self.drop_only_dedupe_key(given.key, given.reason)
        return [Reply(dropped), *effects]

    def _on_Stop(self, given: _in.Stop) -> list[Effect]:
        return self.stop()

    def _on_HardStop(self, given: _in.HardStop) -> list[Effect]:
        return self.hard_stop()

    def _on_SendNow(self, given: _in.SendNow) -> list[Effect]:
        sent, effects = self.send_now()
        return [Reply(sent), *effects]

    def _on_SetThinking(self, given: _in.SetThinking) -> list[Effect]:
        level = given.level
        self.set_thinking(level)
        return []

    def _on_EditBegins(self, given: _in.EditBegins) -> list[Effect]:
        return self.edit_begins()

    def _on_EditInterrupts(self, given: _in.EditInterrupts) -> list[Effect]:
        return self.edit_interrupts()

    def _on_EditSettled(self, given: _in.EditSettled) -> list[Effect]:
        self.edit_settled()
        return []

    def _on_Truncate(self, given: _in.Truncate) -> list[Effect]:
        row_ids = given.row_ids
        return self._delete_rows(row_ids, "history truncation", answer=True)

    def _on_EditDone(self, given: _in.EditDone) -> list[Effect]:
        self.edit_done()
        return []

    def _on_Discard(self, given: _in.Discard) -> list[Effect]:
        return self.discard()

    def _on_DiscardHistory(self, given: _in.DiscardHistory) -> list[Effect]:
        row_ids = given.row_ids
        return self._delete_rows(row_ids, "history discard", answer=False)

    def _on_Dispose(self, given: _in.Dispose) -> list[Effect]:
        return self.dispose()

    def _on_DisposedNow(self, given: _in.DisposedNow) -> list[Effect]:
        return self.disposed_now()

    def _on_DisposalDone(self, given: _in.DisposalDone) -> list[Effect]:
        return self.disposal_done()

    def _on_UsageReported(self, given: _in.UsageReported) -> list[Effect]:
        return self.usage_reported(given.stream, given.model, given.tokens)

    def _on_CompactNow(self, given: _in.CompactNow) -> list[Effect]:
        return self.compact_now(given.aborted)

    def _on_Summarized(self, given: _in.Summarized) -> list[Effect]:
        return self.summarized(given.text)

    def _on_CompactionFailed(self, given: _in.CompactionFailed) -> list[Effect]:
        return self.compaction_failed(given.why)

    def _on_SummaryWritten(self, given: _in.SummaryWritten) -> list[Effect]:
        return self.summary_written(given.row, given.follow_up)

    def _on_SummaryFailed(self, given: _in.SummaryFailed) -> list[Effect]:
        return self.compaction_failed(f"the summary could not be written: {given.error}")

    def _on_FollowUpWritten(self, given: _in.FollowUpWritten) -> list[Effect]:
        self._follow_up_row = None  # cleared in the follow-up row's commit (B8)
        return [Reply(given.rows)]

    def _on_FollowUpFailed(self, given: _in.FollowUpFailed) -> list[Effect]:
        return [Reply(given.error)]  # the launch fails before its stream: the pending stays

    def _on_FollowUpUncleared(self, given: _in.FollowUpUncleared) -> list[Effect]:
        return self._follow_up_uncleared(given.row)

    def _on_SummaryBeforeLaunch(self, given: _in.SummaryBeforeLaunch) -> list[Effect]:
        return self.summarized_before_launch(given.text, given.through, given.rows)

    def _on_SummaryBeforeLaunchFailed(self, given: _in.SummaryBeforeLaunchFailed) -> list[Effect]:
        failed = Compacted(
            session=self.id, stream=given.stream, tokens=given.tokens, outcome="failed"
        )
        return [Emit(failed), Reply(given.rows)]

    def _on_AdoptFollowUp(self, given: _in.AdoptFollowUp) -> list[Effect]:
        self.adopt_follow_up(given.marker, given.row)
        return []

    def _on_KnowsAutoRetry(self, given: _in.KnowsAutoRetry) -> list[Effect]:
        self._retry.off = not given.on
        return []

    def _on_SetAutoRetry(self, given: _in.SetAutoRetry) -> list[Effect]:
        return self.set_auto_retry(on=given.on)

    def _on_AdoptOwed(self, given: _in.AdoptOwed) -> list[Effect]:
        marker = given.marker
        row_id = given.row_id
        self.adopt_owed(marker, row_id)
        return []


#: Every input's handler, by the input's type (``TurnMachine.handle``). One table rather than a
#: ``match``: a class pattern costs ~80 ns, so the 60th of 74 cases took ~6 µs to reach, a cost
#: paid on every input. ``tests/agent_session/test_machine_dispatch.py`` checks every input has
#: a handler.
_DECIDE: dict[type, Callable[[TurnMachine, Any], list[Effect]]] = {
    _in.ToIdleFrom: TurnMachine._on_ToIdleFrom,
    _in.Drain: TurnMachine._on_Drain,
    _in.DrainIfIdle: TurnMachine._on_DrainIfIdle,
    _in.FlushRecords: TurnMachine._on_FlushRecords,
    _in.RecordsWritten: TurnMachine._on_RecordsWritten,
    _in.SweepWanted: TurnMachine._on_SweepWanted,
    _in.WithRecords: TurnMachine._on_WithRecords,
    _in.Answer: TurnMachine._on_Answer,
    _in.AnswerError: TurnMachine._on_AnswerError,
    _in.Ignored: TurnMachine._on_Ignored,
    _in.AfterTelling: TurnMachine._on_AfterTelling,
    _in.Consume: TurnMachine._on_Consume,
    _in.StreamBegan: TurnMachine._on_StreamBegan,
    _in.ToolStarted: TurnMachine._on_ToolStarted,
    _in.ToolEnded: TurnMachine._on_ToolEnded,
    _in.HistoryLoaded: TurnMachine._on_HistoryLoaded,
    _in.Launching: TurnMachine._on_Launching,
    _in.EnvelopeReady: TurnMachine._on_EnvelopeReady,
    _in.StartReached: TurnMachine._on_StartReached,
    _in.StartWritten: TurnMachine._on_StartWritten,
    _in.StartFailed: TurnMachine._on_StartFailed,
    _in.FinalReady: TurnMachine._on_FinalReady,
    _in.FinalWritten: TurnMachine._on_FinalWritten,
    _in.FinalFailed: TurnMachine._on_FinalFailed,
    _in.CutRowDurable: TurnMachine._on_CutRowDurable,
    _in.Outcome: TurnMachine._on_Outcome,
    _in.UserRowWanted: TurnMachine._on_UserRowWanted,
    _in.Supersede: TurnMachine._on_Supersede,
    _in.TurnAccepted: TurnMachine._on_TurnAccepted,
    _in.ReleasePreflight: TurnMachine._on_ReleasePreflight,
    _in.DispatchEntry: TurnMachine._on_DispatchEntry,
    _in.Dispatched: TurnMachine._on_Dispatched,
    _in.SendWentNowhere: TurnMachine._on_SendWentNowhere,
    _in.Queued: TurnMachine._on_Queued,
    _in.QueueWritten: TurnMachine._on_QueueWritten,
    _in.QueueFailed: TurnMachine._on_QueueFailed,
    _in.TokenFired: TurnMachine._on_TokenFired,
    _in.TakeUpQueue: TurnMachine._on_TakeUpQueue,
    _in.AdoptRetry: TurnMachine._on_AdoptRetry,
    _in.GiveUp: TurnMachine._on_GiveUp,
    _in.BackOffOver: TurnMachine._on_BackOffOver,
    _in.Enqueue: TurnMachine._on_Enqueue,
    _in.Claim: TurnMachine._on_Claim,
    _in.DirectSend: TurnMachine._on_DirectSend,
    _in.QueuedStop: TurnMachine._on_QueuedStop,
    _in.CommitPartial: TurnMachine._on_CommitPartial,
    _in.PartialFailed: TurnMachine._on_PartialFailed,
    _in.AbortWritten: TurnMachine._on_AbortWritten,
    _in.AbortSettled: TurnMachine._on_AbortSettled,
    _in.ClassifyCutter: TurnMachine._on_ClassifyCutter,
    _in.FailedTurnSettles: TurnMachine._on_FailedTurnSettles,
    _in.Forfeit: TurnMachine._on_Forfeit,
    _in.RecordsFailed: TurnMachine._on_RecordsFailed,
    _in.NotStarted: TurnMachine._on_NotStarted,
    _in.SyntheticAbort: TurnMachine._on_SyntheticAbort,
    _in.SentinelUnwanted: TurnMachine._on_SentinelUnwanted,
    _in.Rollback: TurnMachine._on_Rollback,
    _in.SweepDue: TurnMachine._on_SweepDue,
    _in.Sweep: TurnMachine._on_Sweep,
    _in.ArmResume: TurnMachine._on_ArmResume,
    _in.ResumeFailed: TurnMachine._on_ResumeFailed,
    _in.ResumeUnreadable: TurnMachine._on_ResumeUnreadable,
    _in.Removed: TurnMachine._on_Removed,
    _in.Withdraw: TurnMachine._on_Withdraw,
    _in.Clear: TurnMachine._on_Clear,
    _in.Restore: TurnMachine._on_Restore,
    _in.RemoveDedupe: TurnMachine._on_RemoveDedupe,
    _in.RemoveWorkspaceTurn: TurnMachine._on_RemoveWorkspaceTurn,
    _in.DropOnlyDedupeKey: TurnMachine._on_DropOnlyDedupeKey,
    _in.Stop: TurnMachine._on_Stop,
    _in.HardStop: TurnMachine._on_HardStop,
    _in.SendNow: TurnMachine._on_SendNow,
    _in.SetThinking: TurnMachine._on_SetThinking,
    _in.EditBegins: TurnMachine._on_EditBegins,
    _in.EditInterrupts: TurnMachine._on_EditInterrupts,
    _in.EditSettled: TurnMachine._on_EditSettled,
    _in.Truncate: TurnMachine._on_Truncate,
    _in.EditDone: TurnMachine._on_EditDone,
    _in.Discard: TurnMachine._on_Discard,
    _in.DiscardHistory: TurnMachine._on_DiscardHistory,
    _in.Dispose: TurnMachine._on_Dispose,
    _in.LeaseGone: TurnMachine._on_LeaseGone,
    _in.DisposedNow: TurnMachine._on_DisposedNow,
    _in.DisposalDone: TurnMachine._on_DisposalDone,
    _in.AdoptOwed: TurnMachine._on_AdoptOwed,
    _in.KnowsAutoRetry: TurnMachine._on_KnowsAutoRetry,
    _in.UsageReported: TurnMachine._on_UsageReported,
    _in.CompactNow: TurnMachine._on_CompactNow,
    _in.Summarized: TurnMachine._on_Summarized,
    _in.CompactionFailed: TurnMachine._on_CompactionFailed,
    _in.SummaryWritten: TurnMachine._on_SummaryWritten,
    _in.SummaryFailed: TurnMachine._on_SummaryFailed,
    _in.FollowUpWritten: TurnMachine._on_FollowUpWritten,
    _in.FollowUpFailed: TurnMachine._on_FollowUpFailed,
    _in.AdoptFollowUp: TurnMachine._on_AdoptFollowUp,
    _in.SummaryBeforeLaunch: TurnMachine._on_SummaryBeforeLaunch,
    _in.SummaryBeforeLaunchFailed: TurnMachine._on_SummaryBeforeLaunchFailed,
    _in.FollowUpUncleared: TurnMachine._on_FollowUpUncleared,
    _in.SetAutoRetry: TurnMachine._on_SetAutoRetry,
}


def _continues(turn: TurnInput, marker: Marker) -> bool:
    """AS-8: a wake row, or a row with the marker's correlation, continues the cut turn."""
    if turn.kind is EntryKind.WAKE:
        return True
    return marker.correlation is not None and turn.correlation == marker.correlation


class _Compacting:
    """AS-36: the stream stopped for compaction, the tokens that crossed, then its abort."""

    __slots__ = ("left", "stopped", "stream", "tokens")

    def __init__(self, stream: str, tokens: int) -> None:
        self.stream = stream
        self.tokens = tokens
        #: Once the stream stopped (or failed, AS-34): the steps, model and chain progress it
        #: left, which the follow-up runs under (R40, R38); ``None`` until then.
        self.left: tuple[int, str, ModelFallbackProgress] | None = None
        #: A stop came while the compaction request ran: its summary owes no follow-up.
        self.stopped = False

    def stopped_at(
        self, remaining: int, model: str, progress: ModelFallbackProgress
    ) -> _Compacting:
        """The stream stopped: the compaction runs for what it left."""
        self.left = (remaining, model, progress)
        return self


def _without_follow_up(row: HistoryRow) -> HistoryRow:
    """A summary row with its pending follow-up cleared (B8, R48)."""
    body = msgspec.structs.replace(decode_body(row), follow_up=None)
    return msgspec.structs.replace(row, body=encode_body(body))


def _dropping(commit: Commit, stream: str) -> Commit:
    """``commit`` with ``stream``'s partial dropped in the same transaction (B5, B6)."""
    boundary = msgspec.structs.replace(commit.boundary, drop_partials=(stream,))
    return msgspec.structs.replace(commit, boundary=boundary)
