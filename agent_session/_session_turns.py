"""AgentSession's turn machinery: the send pipeline and the launch of a turn's stream.

See ``_session`` for the theory of operation. Rule ids in comments are defined in ``docs/rules.md``.
"""

from __future__ import annotations

import logging

import anyio

from agent_session._continuation import (
    EndedHow,
    Marker,
)
from agent_session._events import (
    EntryCanceled,
    Persisted,
)
from agent_session._phases import Phase
from agent_session._rows import (
    CONTINUE_TEXT,
    RowBody,
    body_from_parts,
    cut_record,
    encode_body,
    needs_continue_sentinel,
    to_messages,
)
from agent_session._session import ThinkingHolder
from agent_session._session_outcomes import SessionOutcomes
from agent_session._turn import (
    Accepted,
    CanceledBeforeAcceptance,
    PipelineResult,
    SendRefused,
    StreamContext,
    TurnInput,
)
from agent_session.ports import PreStreamFailure
from message_queue import CancelToken, DispatchMode, EntryKind, SendFailure, SendOptions
from persistence import HistoryRow, RowKind, TurnEnvelope, TurnkeeperError
from stream_manager import (
    Ended,
    ErrorKind,
    Refused,
    StreamFailed,
    StreamInfo,
    StreamOutcome,
    StreamRequest,
    Withdrawn,
)

log = logging.getLogger("turnkeeper.session")

_DISPOSED = SendRefused(SendFailure(type="disposed", message="the session was disposed"))


class SessionTurns(SessionOutcomes):
    """The session's turns: the send pipeline and the launch (outcomes: ``SessionOutcomes``)."""

    __slots__ = ()

    # ------------------------------------------------------------ sending

    def send(
        self,
        text: str,
        *,
        entry: str | None = None,
        mode: DispatchMode | str = DispatchMode.TOOL_END,
        options: SendOptions | None = None,
    ) -> None:
        """A user message: queued while the session is busy (AS-12), else sent now.

        Raises:
            SessionDisposed: the session is disposed.
            UsageError: the queue refused the message (blank text, a duplicate entry id).
        """
        self._alive()
        if self.busy:
            self._queue_user(text, entry, mode, options)
            return
        self._manual_preflight += 1  # R3: the sweep yields until this send claims or fails
        turn = TurnInput(text=text, entry_id=entry, options=options)

        async def direct() -> None:
            result = await self._guarded_pipeline(turn)
            if not isinstance(result, Accepted):
                self._release_preflight()
                self._to_idle_from(Phase.PREPARING)
                self._schedule_sweep()  # R3: a failed preflight send sweeps again
                self._drain_if_idle()

        self._run(direct)

    def _release_preflight(self) -> None:
        if self._manual_preflight:
            self._manual_preflight -= 1
            self._check_idle()

    async def _guarded_pipeline(self, turn: TurnInput) -> PipelineResult:
        """AS-13: whatever goes wrong in one send, the session goes on (IDLE, drain again)."""
        try:
            return await self._pipeline(turn)
        except Exception as error:  # an unexpected failure must not kill the session's drain
            log.exception("send of %s failed", turn.entry_id or "a direct message")
            failure = SendFailure(type="unknown", message=f"{type(error).__name__}: {error}")
            return SendRefused(failure)

    async def _pipeline(self, turn: TurnInput) -> PipelineResult:
        """AS-3 to AS-10: gate, validate, persist, cross the point of no return, accept, stream."""
        if turn.canceled():  # AS-3: checked before anything, and after every await below
            return self._cancel_before_acceptance(turn, [])
        try:
            await self._gate.check(self.id, "send")
        except PreStreamFailure as error:
            return await self._gate_refused(turn, error)
        if self.is_disposed():
            return _DISPOSED
        if turn.canceled():
            return self._cancel_before_acceptance(turn, [])
        failure = self._validate(turn)
        if failure is not None:
            return SendRefused(failure)
        row = self._user_row(turn)
        try:
            await self._store.append([row])
        except TurnkeeperError as error:
            return SendRefused(SendFailure(type="store_write", message=str(error)))
        self._emit(Persisted(session=self.id, what="user-row", id=row.row_id))
        if self.is_disposed():
            return _DISPOSED
        if turn.canceled():
            return await self._rollback(turn, row)
        # AS-8: the point of no return. A row that does not continue the cut turn supersedes it.
        await self._supersede(turn, "superseded by a send (R35)")
        refused = self._accept(turn)
        if refused is not None:
            return refused
        model = (turn.options.model if turn.options else None) or self.model
        thinking = (turn.options.thinking_level if turn.options else None) or self.thinking_level
        self._thinking = ThinkingHolder(thinking)  # AS-9: a fresh holder for the turn
        context = StreamContext(
            model=model,
            cause=turn.cause,
            options=turn.options or SendOptions(),
            correlation=turn.correlation,
            thinking_level=thinking,
            extra_system_context=self.scratchpad,
            agent_initiated=turn.kind is not EntryKind.USER,
        )
        return await self._launch_accepted(context)

    def _accept(self, turn: TurnInput) -> SendRefused | None:
        """AS-9, AS-10: ``on_accepted`` (a failure is an error result), then PREPARING."""
        if turn.callbacks is not None and turn.callbacks.on_accepted is not None:
            try:
                turn.callbacks.on_accepted()
            except Exception as error:
                log.warning("on_accepted of %s failed: %r", turn.entry_id, error)
                return SendRefused(SendFailure(type="on_accepted", message=str(error)))
        if not turn.dispatched:
            self._set_phase(Phase.PREPARING)
            self._release_preflight()
        return None

    async def _launch_accepted(self, context: StreamContext) -> PipelineResult:
        """AS-10, AS-22: launch an accepted turn; a failure before its stream is reported."""
        try:
            await self._launch(context, self._new_abort())
        except (TurnkeeperError, OSError) as error:
            log.warning("the turn failed before its stream started: %s", error)
            self._emit(
                StreamFailed(
                    session=self.id,
                    stream="",
                    kind=ErrorKind.RETRYABLE,
                    remaining=context.step_budget or 0,
                    type="pre_stream_failure",
                    message=str(error),
                )
            )
            return SendRefused(SendFailure(type="pre_stream_failure", message=str(error)))
        return Accepted()

    async def _supersede(self, turn: TurnInput, why: str) -> None:
        """R35: a durable row that does not continue the cut turn withdraws its continuation."""
        marker = self.continuation.marker
        if marker is not None and not self._continues(turn, marker):
            self._end_marker(EndedHow.WITHDRAWN, why)
            await self._flush_voids()

    async def _gate_refused(self, turn: TurnInput, error: PreStreamFailure) -> SendRefused:
        """AS-4: a refused manual send keeps the user's row and surfaces a stream error.

        The kept row is durable, so it supersedes an owed continuation like any send's (R35):
        a resume must not answer a message the gate refused.
        """
        failure = SendFailure(type="pre_stream", message=str(error))
        if turn.kind is EntryKind.USER and self._validate(turn) is None:
            row = self._user_row(turn)
            await self._store.append([row])
            self._emit(Persisted(session=self.id, what="user-row", id=row.row_id))
            await self._supersede(turn, "superseded by a refused send's row (R35)")
            self._emit(
                StreamFailed(
                    session=self.id,
                    stream="",
                    kind=ErrorKind.TERMINAL,
                    remaining=0,
                    type="pre_stream_rejected",
                    message=str(error),
                )
            )
        return SendRefused(failure)

    def _validate(self, turn: TurnInput) -> SendFailure | None:
        """AS-5: before any history change."""
        if not turn.text.strip() and not turn.attachments:
            return SendFailure(type="empty_message", message="a message needs text or files")
        model = (turn.options.model if turn.options else None) or self.model
        if model not in self._known_models:
            return SendFailure(type="invalid_model_string", message=f"unknown model {model!r}")
        return None

    def _user_row(self, turn: TurnInput) -> HistoryRow:
        seq = self._next_seq()
        body = RowBody(text=turn.text, entry_kind=turn.kind.value, correlation=turn.correlation)
        return HistoryRow(
            session=self.id,
            seq=seq,
            row_id=f"{self.id}:r{seq}",
            kind=RowKind.USER,
            body=encode_body(body),
        )

    @staticmethod
    def _continues(turn: TurnInput, marker: Marker) -> bool:
        """AS-8: a wake row, or a row with the marker's correlation, continues the cut turn."""
        if turn.kind is EntryKind.WAKE:
            return True
        return marker.correlation is not None and turn.correlation == marker.correlation

    def _cancel_before_acceptance(
        self, turn: TurnInput, rows: list[HistoryRow]
    ) -> CanceledBeforeAcceptance:
        reason = (turn.cancel_token.reason if turn.cancel_token else None) or "withdrawn"
        if turn.cancel_state is not None:
            turn.cancel_state.canceled_before_acceptance = True
        if turn.entry_id is not None:
            self._emit(EntryCanceled(session=self.id, entry=turn.entry_id, reason=reason))
        if turn.callbacks is not None:
            try:
                turn.callbacks.notify_canceled(reason)
            except Exception as error:
                log.warning("on_canceled of %s failed: %r", turn.entry_id, error)
        return CanceledBeforeAcceptance(reason)

    async def _rollback(self, turn: TurnInput, row: HistoryRow) -> PipelineResult:
        """AS-3: delete exactly this send's rows; if that fails and the row stays, accept."""
        try:
            deleted = await self._store.delete_rows(self.id, [row.row_id])
        except TurnkeeperError:
            deleted = 0
        if deleted == 0:
            remaining = {r.row_id for r in await self._store.history(self.id)}
            if row.row_id in remaining:
                log.warning("rollback of %s failed; accepting the entry", row.row_id)
                return await self._accept_anyway(turn)
        return self._cancel_before_acceptance(turn, [row])

    async def _accept_anyway(self, turn: TurnInput) -> PipelineResult:
        refused = self._accept(turn)
        if refused is not None:
            return refused
        context = StreamContext(model=self.model, cause=turn.cause, correlation=turn.correlation)
        return await self._launch_accepted(context)

    def _new_abort(self) -> CancelToken:
        self._prepared_abort = CancelToken()
        return self._prepared_abort

    # ------------------------------------------------------------ launching

    async def _launch(self, context: StreamContext, abort: CancelToken) -> None:
        """AS-22: stream from history, then handle the outcome."""
        outcome = await self._stream_with_history(context, abort)
        await self._on_outcome(outcome, context)

    async def _stream_with_history(
        self, context: StreamContext, abort: CancelToken
    ) -> StreamOutcome:
        rows = await self._store.history(self.id)
        sentinel: HistoryRow | None = None
        if needs_continue_sentinel(rows):
            seq = self._next_seq()
            sentinel = HistoryRow(
                session=self.id,
                seq=seq,
                row_id=f"{self.id}:r{seq}",
                kind=RowKind.SENTINEL,
                body=encode_body(RowBody(text=CONTINUE_TEXT)),
            )
            await self._store.append([sentinel])
            self._emit(Persisted(session=self.id, what="sentinel", id=sentinel.row_id))
            rows = [*rows, sentinel]
        self._stream_context = context
        request = StreamRequest(
            session=self.id,
            model=context.model,
            messages=to_messages(rows),
            stream_id=self._next_stream_id(),
            cause=context.cause,
            handle=context.correlation.handle_id if context.correlation else None,
            step_budget=context.step_budget,
            fallback_progress=context.progress,
            correlation=context.correlation,
            extra_system_context=context.extra_system_context,
            thinking_level=context.thinking_level,
            thinking_for_step=self._thinking_for_step,
            has_queued_tool_end=self._has_queued_tool_end,
            on_queued_message_stop=self._on_queued_stop,
            on_stream_constructed=self._write_envelope,
            on_started=self._on_started,
            on_complete=self._persist_final,
            abort=abort,
        )
        try:
            outcome = await self._manager.start_stream(request)
        except BaseException:
            if sentinel is not None:  # R34: a launch that failed leaves no orphan sentinel
                with anyio.CancelScope(shield=True):
                    await self._delete_sentinel(sentinel)
            raise
        if isinstance(outcome, Refused | Withdrawn) and sentinel is not None:
            await self._delete_sentinel(sentinel)  # R34
        return outcome

    async def _delete_sentinel(self, sentinel: HistoryRow) -> None:
        try:
            await self._store.delete_rows(self.id, [sentinel.row_id])
        except TurnkeeperError as error:  # the launch's own failure is what the caller reports
            log.warning("could not remove the sentinel %s: %s", sentinel.row_id, error)

    def _thinking_for_step(self) -> str | None:
        holder = self._thinking
        return holder.for_step() if holder is not None else self._stream_context.thinking_level

    def _has_queued_tool_end(self) -> bool:
        return self.queue.has_queued(DispatchMode.TOOL_END)

    async def _write_envelope(self, info: StreamInfo) -> None:
        """B3: the durable turn envelope, written when the stream is constructed."""
        context = self._stream_context
        await self._store.put_envelope(
            TurnEnvelope(
                session=self.id,
                stream=info.stream,
                model=info.model,
                budget=info.budget,
                cause=context.cause.value,
                handle=context.correlation.handle_id if context.correlation else None,
            )
        )
        self._emit(Persisted(session=self.id, what="envelope", id=info.stream))

    async def _persist_final(self, ended: Ended) -> None:
        """B5: the final assistant row; a cut's row carries the durable cut record (R60).

        The cut's ``owed`` is told once that row commits; if the continuation ended while the
        row was being written, its end follows at once (written, then told).
        """
        context = self._stream_context
        seq = self._next_seq()
        record = None
        owed = self._untold_owed
        if ended.queued_stop is not None and owed is not None and owed.cut == ended.stream:
            stop = ended.queued_stop
            record = cut_record(
                stop.steps_remaining, stop.model, stop.fallback_progress, context.correlation
            )
        row = HistoryRow(
            session=self.id,
            seq=seq,
            row_id=f"{self.id}:r{seq}",
            kind=RowKind.ASSISTANT,
            body=encode_body(body_from_parts(ended.parts, finish=ended.finish, model=ended.model)),
            stream=ended.stream,
            cut=record,
        )
        await self._store.append([row])
        self._emit(Persisted(session=self.id, what="cut" if record else "assistant", id=row.row_id))
        if record is None:
            return
        self._untold_owed = None
        assert owed is not None
        self._emit(owed)
        if self._cut_written(ended.stream, row.row_id):
            await self._flush_voids()
