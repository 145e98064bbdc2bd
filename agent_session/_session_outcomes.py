"""AgentSession's reactions: stream events, stream outcomes and the drain of the queue.

See ``_session`` for the theory of operation. Rule ids in comments are defined in ``docs/rules.md``.
"""

from __future__ import annotations

import dataclasses
import logging
from abc import abstractmethod

import msgspec

from agent_session._continuation import (
    EndedHow,
    Marker,
    consume,
    owe,
    resume_settled,
    retry_safe,
)
from agent_session._events import (
    ContinuationEnded,
    ContinuationOwed,
    EntryDequeued,
    Persisted,
    ResumeAttempted,
)
from agent_session._phases import Phase
from agent_session._rows import (
    body_from_parts,
    cut_record,
    encode_body,
)
from agent_session._session import SessionCore
from agent_session._turn import (
    Accepted,
    PipelineResult,
    SendRefused,
    StreamContext,
    TurnInput,
)
from message_queue import DispatchMode, EntryKind
from persistence import CutState, HistoryRow, RowKind
from stream_manager import (
    Aborted,
    AbortReason,
    Ended,
    Failed,
    QueuedStopReport,
    Refused,
    StartCause,
    StreamAborted,
    StreamEvent,
    StreamOutcome,
    StreamStarted,
    ToolCallEnded,
    ToolCallStarted,
    Withdrawn,
)

log = logging.getLogger("turnkeeper.session")


class SessionOutcomes(SessionCore):
    """How the session reacts to its streams (events, outcomes) and drains its queue."""

    __slots__ = ()

    @abstractmethod
    async def _guarded_pipeline(self, turn: TurnInput) -> PipelineResult:
        """AS-13: run one send's pipeline; whatever goes wrong in it, the session goes on."""

    def _on_queued_stop(self, report: QueuedStopReport) -> None:
        """ST-2, R1: the cut is owed a continuation, recorded synchronously in the report.

        ``owed`` is told once the row carrying the durable cut record commits
        (``_persist_final``), never before (R60).
        """
        self._untold_owed = self._owe(report)

    def _owe(self, report: QueuedStopReport) -> ContinuationOwed | None:
        """Owe the cut's continuation; return the ``owed`` event that will tell it."""
        if report.steps_remaining <= 0:
            return None  # R65
        context = self._stream_context
        marker = Marker(
            cut=report.stream,
            model=report.model,
            step_budget=report.steps_remaining,
            progress=report.fallback_progress,
            options=msgspec.structs.replace(retry_safe(context.options), model=report.model),
            correlation=context.correlation,
            agent_initiated=context.agent_initiated,
            thinking_level=(  # R20: a pending change survives the cut
                self._thinking.at_cut() if self._thinking is not None else context.thinking_level
            ),
            extra_system_context=self.scratchpad,  # R26: the live snapshot at the cut
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

    # ------------------------------------------------------------ stream events

    def on_stream_event(self, event: StreamEvent) -> None:
        """React to the stream manager's events for this session (AS-19 to AS-21, AS-27)."""
        if isinstance(event, StreamStarted):
            self._on_stream_start(event)
        elif isinstance(event, ToolCallStarted):
            self._active_tools.add(event.call)
        elif isinstance(event, ToolCallEnded):
            self._active_tools.discard(event.call)
            if event.provider and not self._active_tools:
                self._maybe_soft_stop()
        elif isinstance(event, StreamAborted) and not event.stream:
            self._on_synthetic_abort(event.reason)

    def _on_stream_start(self, event: StreamStarted) -> None:
        """AS-19, ST-4: STREAMING consumes the owed continuation, whoever started the stream."""
        self._soft_stop_in_flight = False
        self._active_tools.clear()
        self._set_phase(Phase.STREAMING)
        self.continuation, marker = consume(self.continuation)
        if marker is not None:
            ended = ContinuationEnded(
                session=self.id,
                cut=marker.cut,
                how=EndedHow.CONSUMED,
                why=f"stream {event.stream} started",
            )
            self._void_cut_record(marker.cut, CutState.CONSUMED, ended)  # see _on_started
        resume = self._stream_context.resume_of
        if resume is not None and event.cause is StartCause.RESUME:
            self._untold_resume = ResumeAttempted(
                session=self.id, cut=resume[0], attempt=resume[1], outcome="started"
            )
            self._resume_abort = None

    async def _on_started(self) -> None:
        """The stream started: commit the consumed cut's record, then tell it (and the resume).

        The stream manager awaits this before the stream's first step.
        """
        await self._flush_voids()
        started, self._untold_resume = self._untold_resume, None
        if started is not None:
            self._emit(started)

    def _maybe_soft_stop(self) -> None:
        """AS-27: after a provider tool's result, soft-stop for a live queued tool-end entry."""
        if (
            self.phase is Phase.STREAMING
            and not self._soft_stop_in_flight
            and self.queue.has_queued(DispatchMode.TOOL_END)
        ):
            self._soft_stop_in_flight = True
            self._manager.request_stop_nowait(self.id, soft=True, reason=AbortReason.QUEUED_MESSAGE)

    def _on_synthetic_abort(self, reason: AbortReason) -> None:
        """AS-21, R19: a hard stop with no stream withdraws a PREPARING resume."""
        if reason is not AbortReason.QUEUED_MESSAGE:
            self._soft_stop_in_flight = False
            self._active_tools.clear()
        if (
            self.phase is Phase.PREPARING
            and self._resume_abort is not None
            and reason is not AbortReason.QUEUED_MESSAGE
        ):
            self._end_marker(EndedHow.WITHDRAWN, f"{reason} stop before the resume started")
            self._flush_voids_soon()

    # ------------------------------------------------------------ outcomes

    async def _on_outcome(self, outcome: StreamOutcome, context: StreamContext) -> None:
        self._tell_unwritten()
        if self.disposed:
            return
        if isinstance(outcome, Ended):
            self._set_phase(Phase.COMPLETING)  # AS-24
            self._drain()
            self._to_idle_from(Phase.COMPLETING)
        elif isinstance(outcome, Aborted):
            await self._on_abort(outcome)
        elif isinstance(outcome, Failed):
            self._set_phase(Phase.COMPLETING)  # AS-25
            self.continuation = resume_settled(self.continuation)
            self._end_marker(EndedHow.WITHDRAWN, "the stream failed; the error path owns it (R25)")
            await self._flush_voids()
            self._to_idle_from(Phase.COMPLETING)
        else:
            self._on_not_started(outcome, context)

    def _on_not_started(self, outcome: Refused | Withdrawn, context: StreamContext) -> None:
        """The launch never reached stream-start (AS-10, ST-10)."""
        self._send_now = False  # the preempted turn never streamed; the drain below serves it
        resume = context.resume_of
        if resume is not None:
            self._resume_abort = None
            self.continuation = resume_settled(self.continuation)
            how = "refused" if isinstance(outcome, Refused) else "withdrawn"
            self._emit(
                ResumeAttempted(session=self.id, cut=resume[0], attempt=resume[1], outcome=how)
            )
            if isinstance(outcome, Refused):
                self._end_marker(EndedHow.FORFEITED, f"admission refused: {outcome.why}")
        self._to_idle_from(Phase.PREPARING)
        self._drain_if_idle()

    async def _on_abort(self, aborted: Aborted) -> None:
        """AS-23, AS-28: commit the partial; a queued-message soft stop may owe a continuation.

        A soft-stop cut is one write: the partial row carries the durable cut record (R47,
        R58), and ``owed`` is told after it commits (R60).
        """
        if self.phase is Phase.STREAMING:
            self._set_phase(Phase.COMPLETING)
        meta = aborted.metadata
        report = QueuedStopReport(
            stream=aborted.stream,
            model=meta.model,
            steps_remaining=meta.steps_remaining,
            fallback_progress=meta.fallback_progress,
        )
        owes = (
            self._soft_stop_in_flight
            and aborted.reason is AbortReason.QUEUED_MESSAGE
            and not meta.required_tool_satisfied
            and meta.steps_remaining > 0
        )
        row = await self._commit_partial(aborted, cut=owes)
        # R16, R22: read the soft-stop flag again after the write: a hard stop that landed
        # meanwhile cleared it, and only the queued-message reason may owe a continuation.
        soft_stop = self._soft_stop_in_flight and aborted.reason is AbortReason.QUEUED_MESSAGE
        self._soft_stop_in_flight = False
        if owes and soft_stop:
            owed = self._owe(report)
            if row is not None:
                self._cut_rows[aborted.stream] = row.row_id
            if owed is not None:
                self._emit(owed)
        elif owes and row is not None:  # written for a cut that the hard stop took back
            self._pending_voids.append((row.row_id, CutState.VOIDED, None))
        if soft_stop:
            self._classify_cutter()
            await self._flush_voids()
            self._drain()  # AS-28: dispatch the cutter, or cancel withdrawn entries and sweep
        else:
            await self._flush_voids()
            if self._send_now:
                self._send_now = False
                self._drain()  # AS-18: the user's prioritized entry goes next
        self._to_idle_from(Phase.COMPLETING)

    async def _commit_partial(self, aborted: Aborted, *, cut: bool) -> HistoryRow | None:
        """B6: the aborted stream's partial row, with the cut record when it owes (``cut``).

        Nothing is written when the stream said nothing, or an edit abandons it (AS-6).
        """
        abandon, self._abandon_partial = self._abandon_partial, False
        if not aborted.parts or abandon:
            return None
        meta = aborted.metadata
        record = None
        if cut:
            record = cut_record(
                meta.steps_remaining,
                meta.model,
                meta.fallback_progress,
                self._stream_context.correlation,
            )
        seq = self._next_seq()
        row = HistoryRow(
            session=self.id,
            seq=seq,
            row_id=f"{self.id}:r{seq}",
            kind=RowKind.PARTIAL,
            body=encode_body(body_from_parts(aborted.parts, finish=None, model=meta.model)),
            stream=aborted.stream,
            cut=record,
        )
        await self._store.append([row])
        self._emit(Persisted(session=self.id, what="cut" if cut else "partial", id=row.row_id))
        return row

    def _classify_cutter(self) -> None:
        """AS-28 step 4: the next live entry continues the cut turn, or supersedes it.

        A wake (or an entry of the cut stream's correlation) continues it; a wake without a
        correlation is stamped with the cut stream's (R56), since a partial row gives history
        nothing to inherit from. Anything else supersedes a correlated continuation, which is
        forfeited before that entry is dispatched (R29): no owner event follows an abort cut.
        """
        marker = self.continuation.marker
        first = self.queue.first_live()
        if first is None or marker is None:
            return
        cut_correlation = self._stream_context.correlation
        if first.kind is EntryKind.WAKE:
            if first.correlation is None and cut_correlation is not None:
                self._stamp = (first.id, cut_correlation)
            return
        if marker.correlation is not None and first.correlation != marker.correlation:
            self._end_marker(EndedHow.FORFEITED, "superseded by unrelated input (R29)")

    # ------------------------------------------------------------ the drain

    def _drain_if_idle(self) -> None:
        if self.phase is Phase.IDLE and self._manual_preflight == 0:
            self._drain()

    def _drain(self) -> None:
        """AS-13: dispatch one head entry (withdrawn ones too, so they cancel), else sweep."""
        if self.disposed:
            return
        self._soft_stop_in_flight = False
        if self._defer_drain:
            return  # AS-15: an edit is waiting; it restores the queue itself
        if self.queue.is_empty:
            self._schedule_sweep()  # AS-14
            return
        entry = self.queue.dequeue_next()
        token = entry.cancel_token
        self._dispatching = (entry.entry_id, token) if token is not None else None
        self._emit(EntryDequeued(session=self.id, entry=entry.entry_id))
        self._set_phase(Phase.PREPARING)
        turn = TurnInput.from_dequeued(entry)
        stamp, self._stamp = self._stamp, None
        if stamp is not None and stamp[0] == entry.entry_id and turn.correlation is None:
            turn = dataclasses.replace(turn, correlation=stamp[1])  # R56

        async def dispatch() -> None:
            try:
                result = await self._guarded_pipeline(turn)
            finally:
                if self._dispatching is not None and self._dispatching[1] is token:
                    self._dispatching = None  # accepted, cancelled or failed: past AS-3
            if isinstance(result, SendRefused) and turn.callbacks is not None:
                callback = turn.callbacks.on_accepted_pre_stream_failure
                if callback is not None:
                    callback(result.failure)
            if not isinstance(result, Accepted):
                self._to_idle_from(Phase.PREPARING)
                self._drain_if_idle()

        self._run(dispatch)
