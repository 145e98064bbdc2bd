"""AgentSession: one conversation's turn state machine (``docs/session.md``).

Theory of operation
-------------------
The session owns its phase (``_phases``), its message queue and its continuation bookkeeping
(``_continuation``). Everything that decides is synchronous and runs inside the call or the
event that triggers it; everything that awaits (store writes, the model stream) runs in tasks
the engine's task group owns. Three kinds of work start turns:

* a direct ``send`` on an idle session (a manual send "in preflight" until it claims
  PREPARING, R3);
* the queue drain (AS-13): one head entry at a time, PREPARING claimed synchronously at dequeue;
* the stranded-turn sweep (ST-7), which claims PREPARING synchronously before any await (R7).

All three go through the same stream launch (``_stream_with_history``), and every stream
outcome comes back to ``_on_outcome``, which moves the phase on, drains the queue and so, on
every arrival at IDLE, schedules the sweep (AS-2). The stream manager's events reach the
session synchronously (``on_stream_event``) after the engine's observers have seen them, so a
stream-start consumes the owed continuation exactly when the fact is recorded (ST-4).

This module holds the state, the phase, the public API and the queue operations. The class
tower: ``SessionCore`` (here) <- ``SessionOutcomes`` (stream events, outcomes, the drain) <-
``SessionTurns`` (the send pipeline, the launch) <- ``AgentSession`` (``_session_resume``: the
sweep, resume, user actions, disposal).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

import anyio

from agent_session._continuation import Continuation, EndedHow, drop
from agent_session._events import (
    ContinuationEnded,
    ContinuationOwed,
    EngineEvent,
    EntryCanceled,
    EntryQueued,
    EntryWithdrawn,
    Persisted,
    PhaseChanged,
    QueueCleared,
    ResumeAttempted,
)
from agent_session._phases import Phase, next_phase
from agent_session._turn import StreamContext
from message_queue import (
    CancelToken,
    Correlation,
    DispatchMode,
    EntryCallbacks,
    EntryKind,
    EntrySnapshot,
    MessageMetadata,
    MessageQueue,
    MetadataType,
    NewMessage,
    Queued,
    Rejected,
    SendOptions,
    notify_all_canceled,
)
from persistence import CutState, Store, UsageError
from stream_manager import AbortReason, StartCause, StreamManager

if TYPE_CHECKING:
    from agent_session.ports import EngineConfig, PreStreamGate

log = logging.getLogger("turnkeeper.session")

Spawn = Callable[[Callable[[], Coroutine[Any, Any, None]]], None]


class SessionDisposed(UsageError):
    """The session was disposed; it accepts nothing more."""


class ThinkingHolder:
    """A turn's thinking level: the original, a pending mid-turn change, the applied one."""

    __slots__ = ("applied", "original", "pending")

    def __init__(self, original: str | None) -> None:
        self.original = original
        self.pending: str | None = None
        self.applied: str | None = None

    def for_step(self) -> str | None:
        """The level a step prepares with; a pending change becomes applied here."""
        if self.pending is not None:
            self.applied, self.pending = self.pending, None
        return self.applied if self.applied is not None else self.original

    def at_cut(self) -> str | None:
        """R20: ``pending ?? applied ?? original``."""
        for level in (self.pending, self.applied):
            if level is not None:
                return level
        return self.original


class SessionCore(ABC):
    """State and the synchronous half of the session (phase, queue, continuation)."""

    # Slots: thousands of idle sessions share one process; a per-instance dict costs ~1.6 KB.
    __slots__ = (
        "_abandon_partial",
        "_active_tools",
        "_config",
        "_cut_rows",
        "_defer_drain",
        "_dispatching",
        "_emit",
        "_ended_unwritten",
        "_gate",
        "_idle",
        "_known_models",
        "_manager",
        "_manual_preflight",
        "_pending_voids",
        "_prepared_abort",
        "_resume_abort",
        "_send_now",
        "_seq",
        "_soft_stop_in_flight",
        "_spawn",
        "_stamp",
        "_store",
        "_stream_context",
        "_stream_n",
        "_sweep_scheduled",
        "_tasks",
        "_thinking",
        "_untold_owed",
        "_untold_resume",
        "continuation",
        "disposed",
        "id",
        "model",
        "phase",
        "queue",
        "scratchpad",
        "thinking_level",
    )

    def __init__(
        self,
        *,
        session_id: str,
        model: str,
        store: Store,
        manager: StreamManager,
        config: EngineConfig,
        gate: PreStreamGate,
        emit: Callable[[EngineEvent], None],
        spawn: Spawn,
        known_models: frozenset[str],
        next_seq: int = 1,
        next_stream: int = 1,
    ) -> None:
        self.id = session_id
        self.model = model
        self._store = store
        self._manager = manager
        self._config = config
        self._gate = gate
        self._emit = emit
        self._spawn = spawn
        self._known_models = known_models
        self.phase = Phase.IDLE
        self.queue = MessageQueue()
        self.continuation = Continuation()
        self.disposed = False
        self._seq = next_seq
        self._stream_n = next_stream
        self._manual_preflight = 0
        self._soft_stop_in_flight = False
        self._active_tools: set[str] = set()
        self._prepared_abort: CancelToken | None = None
        self._resume_abort: CancelToken | None = None
        self._sweep_scheduled = False
        self._cut_rows: dict[str, str] = {}  # cut stream id -> the row carrying its record
        #: Cut-record state changes to commit, each with the event that tells it (told only
        #: once committed; ``None``: nothing to tell, the cut was never told owed).
        self._pending_voids: list[tuple[str, CutState, ContinuationEnded | None]] = []
        #: A normal cut's ``owed``, told once the row carrying its record commits (R60).
        self._untold_owed: ContinuationOwed | None = None
        #: A resume's ``started``, told once the consumed cut's record commits.
        self._untold_resume: ResumeAttempted | None = None
        #: Cuts whose continuation ended while their row was still being written: the row's
        #: record is ended as soon as it is durable (it must never stay owed).
        self._ended_unwritten: dict[str, tuple[CutState, ContinuationEnded]] = {}
        self._send_now = False  # AS-18: the interrupted stream's abort drains instead of idling
        self._defer_drain = False  # AS-6/AS-15: an edit is waiting; the queue is not drained
        self._abandon_partial = False  # AS-6: the interrupted stream's partial is dropped
        self._stamp: tuple[str, Correlation] | None = None  # R56: correlation for a wake
        #: AS-3: the entry dequeued and not yet accepted, with its cancel token (if it has one).
        self._dispatching: tuple[str, CancelToken] | None = None
        self._stream_context = StreamContext(model=model, cause=StartCause.SEND)
        #: ``None`` while idle (made only when someone could wait: events are not free).
        self._idle: anyio.Event | None = None
        self._tasks = 0
        #: The session's thinking level between turns; a turn's holder tracks mid-turn changes.
        self.thinking_level: str | None = None
        self._thinking: ThinkingHolder | None = None
        #: The live scratchpad (``additionalSystemContext``) the host keeps up to date (R26).
        self.scratchpad: str | None = None

    # ------------------------------------------------------------ phase

    def _set_phase(self, to: Phase) -> None:
        """Move the phase by the table (AS-1, AS-2); an illegal move raises, nothing changes."""
        current = self.phase
        self.phase = next_phase(self.id, current, to)
        self._emit(PhaseChanged(session=self.id, from_=current, to=to))
        if to is Phase.IDLE:
            self._soft_stop_in_flight = False
            self._active_tools.clear()
            self._thinking = None  # AS-1: the turn's thinking holder expires
            self._schedule_sweep()
            self._check_idle()
        else:
            self._busy()

    def _to_idle_from(self, *phases: Phase) -> None:
        if self.phase in phases:
            self._set_phase(Phase.IDLE)

    @property
    def busy(self) -> bool:
        """A turn is running or claimed, or a manual send is in preflight."""
        return self.phase is not Phase.IDLE or self._manual_preflight > 0

    def _check_idle(self) -> None:
        if (
            self.phase in (Phase.IDLE, Phase.DISPOSED)
            and self._tasks == 0
            and not self._sweep_scheduled
        ):
            event, self._idle = self._idle, None
            if event is not None:
                event.set()

    def _busy(self) -> None:
        if self._idle is None:
            self._idle = anyio.Event()

    def _run(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Start ``work`` in the engine's task group, counted for ``wait_idle``."""
        self._tasks += 1
        self._busy()

        async def counted() -> None:
            try:
                await work()
            finally:
                self._tasks -= 1
                self._check_idle()

        self._spawn(counted)

    @property
    def idle(self) -> bool:
        """Idle with nothing running or scheduled (what ``wait_idle`` waits for)."""
        return self._idle is None

    async def wait_idle(self) -> None:
        """Return once the session is idle with nothing running or scheduled."""
        while True:
            event = self._idle
            if event is not None:
                await event.wait()
            await anyio.lowlevel.checkpoint()
            if self._idle is None:
                return

    def is_disposed(self) -> bool:
        """Whether the session was disposed (it can become so across any await)."""
        return self.disposed

    def _alive(self) -> None:
        if self.disposed:
            raise SessionDisposed(f"session {self.id!r} is disposed")

    # ------------------------------------------------------------ ids

    def _next_seq(self) -> int:
        seq = self._seq
        self._seq += 1
        return seq

    def _next_stream_id(self) -> str:
        stream = f"{self.id}/{self._stream_n}"
        self._stream_n += 1
        return stream

    # ------------------------------------------------------------ continuation endings

    def _end_marker(self, how: EndedHow, why: str) -> None:
        """Withdraw, forfeit or void the owed continuation, and abort an in-flight resume.

        The marker goes at once (nothing acts on it any more); its durable record follows and
        ``continuation-ended`` is told only once that write has committed (``_flush_voids``):
        a crash in between loses the telling, never the fact.
        """
        self.continuation, marker = drop(self.continuation)
        if self._resume_abort is not None:
            self._resume_abort.cancel("withdrawn")
        if marker is None:
            return
        event = ContinuationEnded(session=self.id, cut=marker.cut, how=how, why=why)
        state = {
            EndedHow.WITHDRAWN: CutState.WITHDRAWN,
            EndedHow.FORFEITED: CutState.FORFEITED,
            EndedHow.VOIDED: CutState.VOIDED,
            EndedHow.CONSUMED: CutState.CONSUMED,
        }[how]
        self._void_cut_record(marker.cut, state, event)

    def _void_cut_record(self, cut: str, state: CutState, event: ContinuationEnded) -> None:
        """PS-6: the durable cut record follows the in-memory marker; ``event`` tells it after.

        The write is queued here and made by ``_flush_voids``: awaited in line by the async
        paths (a send crossing the point of no return, a stream's start, a failure), started
        at once by the synchronous ones (Stop, a clear, disposal), always in marker order.
        """
        row_id = self._cut_rows.pop(cut, None)
        if row_id is not None:
            self._pending_voids.append((row_id, state, event))
        else:
            self._ended_unwritten[cut] = (state, event)  # its row is being written

    def _cut_written(self, cut: str, row_id: str) -> bool:
        """The row carrying ``cut``'s record is durable; ``True`` if its end must follow now.

        A continuation that ended while the row was being written (a Stop, a clear) left no
        row to void: the record is queued for its end here, so it never stays owed.
        """
        ended = self._ended_unwritten.pop(cut, None)
        if ended is None:
            self._cut_rows[cut] = row_id
            return False
        self._pending_voids.append((row_id, *ended))
        return True

    def _tell_unwritten(self) -> None:
        """A turn's outcome came and no row took the cut's record: tell what stayed untold.

        Only the in-memory marker ever existed (its row's write failed or never came), so
        there is nothing durable to wait for.
        """
        owed, self._untold_owed = self._untold_owed, None
        if owed is not None:
            self._emit(owed)
        ended = list(self._ended_unwritten.values())
        self._ended_unwritten.clear()
        for _, event in ended:
            self._emit(event)

    async def _flush_voids(self) -> None:
        """Make every queued cut-record state change durable, in order; then tell each."""
        while self._pending_voids:
            row_id, state, event = self._pending_voids.pop(0)
            await self._store.set_cut_state(self.id, row_id, state)
            self._emit(Persisted(session=self.id, what="cut-void", id=row_id))
            if event is not None:
                self._emit(event)

    def _flush_voids_soon(self) -> None:
        if self._pending_voids:
            self._run(self._flush_voids)

    @abstractmethod
    def _schedule_sweep(self) -> None:
        """AS-2: run the sweep once the current handler's synchronous work is done."""

    @abstractmethod
    def _drain(self) -> None:
        """AS-13: dispatch the queue's head entry, or sweep when there is none."""

    # ------------------------------------------------------------ queue

    def _queue(self, message: NewMessage, *, key: str | None = None) -> Queued | Rejected:
        outcome = self.queue.add(message) if key is None else self.queue.add_once(message, key)
        if isinstance(outcome, Queued):
            entry = self.queue.get(outcome.entry_id)
            assert entry is not None
            self._emit(
                EntryQueued(
                    session=self.id,
                    entry=outcome.message_id,
                    kind=entry.kind,
                    mode=entry.mode,
                    into=outcome.into,
                )
            )
            token = message.cancel_token
            if token is not None:
                name = outcome.message_id
                token.add_listener(
                    lambda _: self._emit(EntryWithdrawn(session=self.id, entry=name))
                )
        return outcome

    def enqueue(
        self,
        text: str,
        *,
        kind: EntryKind | str,
        entry: str | None = None,
        mode: DispatchMode | str = DispatchMode.TOOL_END,
        dedupe_key: str | None = None,
        correlation: Correlation | None = None,
        sealed: bool = False,
        cancel_token: CancelToken | None = None,
    ) -> CancelToken:
        """Queue an agent-initiated entry (a wake, report or system message) with a cancel token.

        An idle session drains it at once. Returns the entry's cancel token: firing it
        withdraws the entry (``withdraw`` does the same by name).

        Raises:
            SessionDisposed: the session is disposed.
            InvalidEntry: an unknown kind or mode, a duplicate entry id.
            UsageError: the queue refused the add (blank text, a held dedupe key).
        """
        self._alive()
        token = cancel_token or CancelToken()
        metadata = None
        if correlation is not None:
            metadata = MessageMetadata(type=MetadataType.WORKSPACE_TURN, correlation=correlation)
        message = NewMessage(
            text=text,
            kind=kind,
            mode=mode,
            id=entry,
            metadata=metadata,
            sealed=sealed,
            cancel_token=token,
            workspace_turn_continuation=correlation is not None,
        )
        self.enqueue_message(message, dedupe_key=dedupe_key)
        return token

    def enqueue_message(self, message: NewMessage, *, dedupe_key: str | None = None) -> Queued:
        """Queue ``message`` as given: what ``enqueue`` does, for a host that needs more.

        ``message`` may carry what ``enqueue`` does not: send options, a cancel state, the
        ``on_accepted``, ``on_accepted_pre_stream_failure`` and ``on_canceled`` callbacks, or no
        cancel token at all (then it may join the tail entry, MQ-2). As with ``enqueue``: an
        ``EntryQueued`` event, an ``EntryWithdrawn`` event when its cancel token fires, and an
        idle session drains it at once.

        Returns:
            The accepted add (its message and entry ids, the entry it joined).

        Raises:
            SessionDisposed: the session is disposed.
            InvalidEntry: an unknown kind or mode, a duplicate entry id.
            UsageError: the queue refused the add (blank text, a held dedupe key).
        """
        self._alive()
        outcome = self._queue(message, key=dedupe_key)
        if isinstance(outcome, Rejected):
            raise UsageError(f"session {self.id}: {outcome.detail}")
        if not self.busy:
            self._drain()
        return outcome

    def withdraw(self, entry: str, reason: str = "withdrawn") -> bool:
        """Fire the cancel token of ``entry``, queued or dequeued and not yet accepted.

        Queued, readers look past it from now on (MQ-7). Dequeued, the send pipeline sees the
        signal at its next check and cancels the entry before acceptance (AS-3).

        Returns:
            ``True`` when this call withdrew it, ``False`` when it was already withdrawn.

        Raises:
            UnknownEntry: no queued or dispatching entry has that id.
            InvalidEntry: the entry has no cancel token.
        """
        dispatching = self._dispatching
        if dispatching is not None and dispatching[0] == entry and self.queue.get(entry) is None:
            return dispatching[1].cancel(reason)
        return self.queue.withdraw(entry, reason)

    def _queue_user(
        self, text: str, entry: str | None, mode: DispatchMode | str, options: SendOptions | None
    ) -> None:
        outcome = self._queue(NewMessage(text=text, id=entry, mode=mode, options=options))
        if isinstance(outcome, Rejected):
            raise UsageError(f"session {self.id}: {outcome.detail}")

    def clear_queue(self, reason: str = "cleared", *, hard_stop: bool = False) -> None:
        """AS-16: clear the queue; a hard-stop clear forfeits the owed continuation first (R23).

        A plain (user) clear keeps the continuation and a pending soft stop (R53). Removed
        entries hear of it after any forfeit (R32); then the sweep runs.
        """
        self._alive()
        before = {e.id: e for e in self.queue}
        if hard_stop:
            self._soft_stop_in_flight = False
            self._end_marker(EndedHow.FORFEITED, "hard-stop queue clear")
        removed = self.queue.clear()
        self._emit(QueueCleared(session=self.id, entries=tuple(before), hard_stop=hard_stop))
        self._cancel_removed(removed, reason, before)
        self._flush_voids_soon()

    def remove_dedupe(self, prefix: str, reason: str = "removed") -> int:
        """AS-16: remove the queued messages whose dedupe keys start with ``prefix``."""
        self._alive()
        before = {e.id: e for e in self.queue}
        removal = self.queue.remove_by_dedupe_key_prefix(prefix)
        self._cancel_removed(removal.removed_entries, reason, before)
        self._flush_voids_soon()
        return removal.removed_messages

    def restore_queue(self) -> str:
        """AS-17: give user-authored text back for the composer and cancel the rest.

        Returns:
            The restored text (empty when nothing user-authored was queued).
        """
        self._alive()
        before = {e.id: e for e in self.queue}
        restored = self.queue.restore_to_input()
        self._emit(QueueCleared(session=self.id, entries=tuple(before), hard_stop=False))
        self._cancel_removed(restored.removed, "restored to input", before)
        self._flush_voids_soon()
        return restored.text

    def _cancel_removed(
        self,
        removed: list[EntryCallbacks],
        reason: str,
        before: Mapping[str, EntrySnapshot],
    ) -> None:
        """Run the removed entries' cancellations in order, then sweep (AS-16, R32).

        A removed entry that continues the owed turn (its correlation, or a live wake while a
        correlated continuation is owed) is that turn's terminal path: the continuation is
        forfeited before any cancellation runs, so the sweep cannot resume a turn whose
        owner the cancellation is about to settle.
        """
        marker = self.continuation.marker
        if marker is not None and marker.correlation is not None:
            for callbacks in removed:
                entry = before.get(callbacks.entry_id)
                if entry is not None and (
                    entry.correlation == marker.correlation
                    or (entry.kind is EntryKind.WAKE and not entry.withdrawn)
                ):
                    self._end_marker(EndedHow.FORFEITED, "its queued continuation was removed")
                    break
        for callbacks in removed:
            self._emit(EntryCanceled(session=self.id, entry=callbacks.entry_id, reason=reason))
        for entry_id, error in notify_all_canceled(removed, reason):
            log.warning("cancellation callback of %s failed: %r", entry_id, error)
        self._schedule_sweep()

    # ------------------------------------------------------------ turn settings

    def set_thinking(self, level: str) -> None:
        """Change the thinking level: mid-turn it is applied at the next step; else from now."""
        self._alive()
        if self._thinking is not None:
            self._thinking.pending = level
        else:
            self.thinking_level = level

    def set_scratchpad(self, text: str | None) -> None:
        """The live scratchpad text passed to every request (never persisted, R26)."""
        self.scratchpad = text

    # ------------------------------------------------------------ stops

    def stop(self) -> str:
        """AS-30: a user Stop.

        The owed continuation is withdrawn first (R6, R11), the stream (or the preparing turn)
        is stopped with reason ``user``, then the queue is restored to the input.

        Returns:
            The queued user-authored text given back for the composer (AS-17); synthetic
            entries are cancelled, never given back.
        """
        self._alive()
        self._end_marker(EndedHow.WITHDRAWN, "user stop")
        if self._prepared_abort is not None:
            self._prepared_abort.cancel(AbortReason.USER.value)
        self._soft_stop_in_flight = False
        self._active_tools.clear()
        self._manager.request_stop_nowait(self.id, reason=AbortReason.USER)
        restored = self.restore_queue()
        self._flush_voids_soon()
        return restored

    def hard_stop(self) -> None:
        """TD-7: a task hard stop: clear the queue with ``hard_stop`` first, then stop (system)."""
        self._alive()
        self.clear_queue("hard stop", hard_stop=True)
        if self._prepared_abort is not None:
            self._prepared_abort.cancel(AbortReason.SYSTEM.value)
        self._manager.request_stop_nowait(self.id, reason=AbortReason.SYSTEM)
