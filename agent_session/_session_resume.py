"""AgentSession: the stranded-turn sweep and resume, user actions and disposal.

See ``_session`` for the theory of operation and ``_session_turns`` for the turn machinery
this class builds on.
"""

from __future__ import annotations

import logging

from agent_session._continuation import (
    EndedHow,
    ForfeitAtCap,
    Marker,
    StartResume,
    SweepSnapshot,
    apply_sweep,
    owe,
    plan_sweep,
    resume_failed,
)
from agent_session._events import EntryCanceled, ResumeAttempted
from agent_session._phases import Phase
from agent_session._session import ThinkingHolder
from agent_session._session_turns import SessionTurns
from agent_session._turn import StreamContext, TurnInput
from agent_session.ports import PreStreamFailure
from message_queue import CancelToken
from persistence import TurnkeeperError, UsageError
from stream_manager import AbortReason, Refused, StartCause, StreamOutcome, Withdrawn

log = logging.getLogger("turnkeeper.session")


class AgentSession(SessionTurns):
    """One conversation: its phase, queue, owed continuation and turns (``docs/session.md``)."""

    __slots__ = ()

    # ------------------------------------------------------------ the sweep

    def _schedule_sweep(self) -> None:
        if self._sweep_scheduled or self.disposed:
            return
        self._sweep_scheduled = True

        async def sweep() -> None:
            self._sweep_scheduled = False
            self._sweep()

        self._run(sweep)

    def _sweep(self) -> None:
        """ST-7: resume a stranded turn when every precondition holds; idempotent."""
        snapshot = SweepSnapshot(
            disposed=self.disposed,
            phase=self.phase,
            queue_empty=self.queue.is_empty,
            manual_in_preflight=self._manual_preflight,
        )
        action = plan_sweep(self.continuation, snapshot, self._config.resume_attempt_cap)
        if isinstance(action, ForfeitAtCap):
            self._end_marker(
                EndedHow.FORFEITED,
                f"{action.failed_attempts} resume attempts failed before a stream started (R21)",
            )
            self._flush_voids_soon()
        elif isinstance(action, StartResume):
            self.continuation = apply_sweep(self.continuation, action)
            self._set_phase(Phase.PREPARING)  # R7: claimed before any await
            self._thinking = ThinkingHolder(action.marker.thinking_level)
            abort = CancelToken()
            self._resume_abort = abort
            self._run(lambda: self._resume(action.marker, action.attempt, abort))

    def adopt_owed(self, marker: Marker, row_id: str) -> None:
        """PS-6: owe ``marker``, rebuilt at startup from the durable record on ``row_id``.

        The record on that row then follows the marker as if this process had cut the turn
        (consumed when a stream starts, voided when the continuation is withdrawn or
        forfeited). Nothing starts yet: :meth:`sweep_now` (or the next idle transition) does.
        """
        self.continuation, _ = owe(self.continuation, marker)
        self._cut_rows[marker.cut] = row_id

    def sweep_now(self) -> bool:
        """Run the idle sweep at once; return whether it started a resume.

        The resume's outcome is reported later, as its ``resume`` event.
        """
        self._sweep()
        return self.continuation.resume_in_flight

    async def _resume(self, marker: Marker, attempt: int, abort: CancelToken) -> None:
        """ST-8 to ST-10: gates, then the history path under the marker's budget and chain."""
        log.info(
            "Resuming turn stranded by a withdrawn queued message: cut=%s model=%s budget=%d "
            "correlation=%s attempt=%d",
            marker.cut,
            marker.model,
            marker.step_budget,
            marker.correlation,
            attempt,
        )  # ST-14, R45
        context = StreamContext(
            model=marker.model,
            cause=StartCause.RESUME,
            options=marker.options,
            step_budget=marker.step_budget,
            progress=marker.progress,
            correlation=marker.correlation,
            thinking_level=marker.thinking_level,
            extra_system_context=marker.extra_system_context,
            agent_initiated=marker.agent_initiated,
            resume_of=(marker.cut, attempt),
        )
        try:
            await self._gate.check(self.id, "resume")
            if abort.cancelled:
                outcome: StreamOutcome = Withdrawn(abort.reason or "withdrawn")
            else:
                outcome = await self._stream_with_history(context, abort)
        except (PreStreamFailure, TurnkeeperError, OSError) as error:
            self._resume_failed(marker, attempt, error)
            return
        if isinstance(outcome, Refused | Withdrawn):
            self._on_not_started(outcome, context)
            await self._flush_voids()
        else:
            await self._on_outcome(outcome, context)

    def _resume_failed(self, marker: Marker, attempt: int, error: BaseException) -> None:
        """ST-10: failed before start; owed still (R4), counted (R21), swept again (R43)."""
        log.info("resume of %s failed before its stream started: %s", marker.cut, error)
        self.continuation = resume_failed(self.continuation)
        self._resume_abort = None
        self._emit(
            ResumeAttempted(session=self.id, cut=marker.cut, attempt=attempt, outcome="failed")
        )
        self._to_idle_from(Phase.PREPARING)
        self._drain_if_idle()

    # ------------------------------------------------------------ user actions

    def send_now(self) -> bool:
        """AS-18: send the oldest queued user message now, interrupting what runs (``user``).

        Returns:
            ``False`` when no user-authored entry is queued (nothing changes).
        """
        self._alive()
        if not self.queue.prioritize_next_user_entry():
            return False
        self._end_marker(EndedHow.WITHDRAWN, "send now")  # a user interrupt withdraws (R6)
        self._flush_voids_soon()
        if self.phase is Phase.IDLE:
            self._drain_if_idle()
            return True
        self._send_now = True
        if self._prepared_abort is not None:
            self._prepared_abort.cancel(AbortReason.USER.value)
        self._manager.request_stop_nowait(self.id, reason=AbortReason.USER)
        return True

    async def edit(self, row_id: str, text: str) -> str:
        """AS-6: replace user row ``row_id`` and everything after it with a new send of ``text``.

        A running turn is interrupted (``user``) and its partial abandoned; the owed
        continuation is withdrawn (ST-5); queued input is restored (and returned) before the
        history is truncated; then ``text`` is sent like any message.

        Raises:
            UsageError: ``row_id`` is not a row of this session's history.
        """
        self._alive()
        rows = await self._store.history(self.id)
        target = next((row for row in rows if row.row_id == row_id), None)
        if target is None:
            raise UsageError(f"session {self.id}: no history row {row_id!r} to edit")
        failure = self._validate(TurnInput(text=text))
        if failure is not None:  # AS-5: validated before any history change
            raise UsageError(f"session {self.id}: {failure.message}")
        self._end_marker(EndedHow.WITHDRAWN, "history edited")
        await self._flush_voids()
        self._defer_drain = True
        try:
            if self.phase not in (Phase.IDLE, Phase.COMPLETING):
                self._abandon_partial = True
                if self._prepared_abort is not None:
                    self._prepared_abort.cancel(AbortReason.USER.value)
                self._manager.request_stop_nowait(self.id, reason=AbortReason.USER)
            await self.wait_idle()
            self._abandon_partial = False  # only the interrupt above may drop a partial
            restored = self.restore_queue()
            doomed = [
                row.row_id for row in await self._store.history(self.id) if row.seq >= target.seq
            ]
            await self._store.delete_rows(self.id, doomed)
        finally:
            self._defer_drain = False
        self.send(text)
        return restored

    def discard_context(self) -> None:
        """R27: a context-discarding history mutation forfeits the owed continuation.

        The history is cleared (in a task; ``wait_idle`` waits for it). Allowed only while the
        session is idle.

        Raises:
            UsageError: the session is busy.
        """
        self._alive()
        if self.busy:
            raise UsageError(f"session {self.id}: history can be discarded only while idle")
        self._end_marker(EndedHow.FORFEITED, "the history was discarded (R27)")

        async def discard() -> None:
            await self._flush_voids()
            rows = await self._store.history(self.id)
            await self._store.delete_rows(self.id, [row.row_id for row in rows])

        self._run(discard)

    # ------------------------------------------------------------ disposal

    async def dispose(self) -> None:
        """AS-31: forfeit the owed continuation (R27), abort a resume (R18), stop the stream."""
        if self.disposed:
            return
        self._end_marker(EndedHow.FORFEITED, "session disposed")
        await self._flush_voids()
        if self._prepared_abort is not None:
            self._prepared_abort.cancel(AbortReason.SYSTEM.value)
        self.disposed = True
        removed = self.queue.clear()
        for callbacks in removed:
            self._emit(EntryCanceled(session=self.id, entry=callbacks.entry_id, reason="disposed"))
        await self._manager.stop_stream(self.id, reason=AbortReason.SYSTEM)
        if self.phase is not Phase.DISPOSED:
            self._set_phase(Phase.DISPOSED)
        self._check_idle()

    def owes(self) -> bool:
        """Whether a continuation is owed right now."""
        return self.continuation.marker is not None

    def describe(self) -> str:
        """A one-line state summary for logs and tests."""
        marker = self.continuation.marker
        owed = f"owed {marker.cut} ({marker.step_budget} left)" if marker else "nothing owed"
        return f"<AgentSession {self.id} {self.phase} | {owed} | {self.queue!r}>"
