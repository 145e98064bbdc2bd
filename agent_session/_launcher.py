"""The stream launcher: a turn's stream from durable history, and its durable writes.

It reads the session's history (adding the ``Continue`` sentinel a history ending in tool
results needs, R34), asks the stream manager for the stream and makes durable what the stream
manager asks for while it runs: the turn envelope when the stream is constructed (B3), the
consumed continuation's record once the stream started, and the final assistant row (B5),
which carries the cut record when the stream was cut (R60). What each write means for the
session is the turn machine's to decide; the launcher only performs and reports back.

The launcher is the stream's host (``stream_manager.StreamHost``): it answers the manager's
queries from the turn machine and the queue, hands the cut report to the machine, and performs
the write each milestone (``Constructed``, ``Started``, ``Completed``) stands for.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from agent_session._rows import (
    CONTINUE_TEXT,
    RowBody,
    encode_body,
    needs_continue_sentinel,
    to_messages,
)
from message_queue import DispatchMode
from persistence import Boundary, HistoryRow, RowKind, TurnEnvelope, TurnkeeperError
from stream_manager import (
    Constructed,
    Persisted,
    Refused,
    Started,
    StreamRequest,
    Withdrawn,
    WriteFailed,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from agent_session._effects import Effect
    from agent_session._events import EngineEvent
    from agent_session._machine import TurnMachine
    from agent_session._session_store import SessionStore
    from agent_session._turn import StreamContext
    from stream_manager import (
        AbortSignal,
        Ended,
        Milestone,
        QueuedStopReport,
        StreamInfo,
        StreamManager,
        StreamOutcome,
    )

log = logging.getLogger("turnkeeper.session")


class StreamLauncher:
    """Launches one session's streams and performs their durable writes (their ``StreamHost``)."""

    __slots__ = ("_emit", "_flush", "_machine", "_manager", "_perform", "_store")

    def __init__(
        self,
        machine: TurnMachine,
        *,
        store: SessionStore,
        manager: StreamManager,
        emit: Callable[[EngineEvent], None],
        perform: Callable[[list[Effect]], Awaitable[None]],
        flush: Callable[[], Awaitable[str | None]],
    ) -> None:
        self._machine = machine
        self._store = store
        self._manager = manager
        self._emit = emit
        self._perform = perform
        self._flush = flush

    async def launch(self, context: StreamContext, abort: AbortSignal) -> StreamOutcome:
        """AS-22: stream from history under ``context``; return the stream's outcome."""
        machine = self._machine
        session = machine.id
        rows = await self._store.rows()
        sentinel: HistoryRow | None = None
        if needs_continue_sentinel(rows):
            sentinel = machine.new_row(RowKind.SENTINEL, encode_body(RowBody(text=CONTINUE_TEXT)))
            await self._store.commit(Boundary(rows=(sentinel,)))
            self._emit(Persisted(session=session, what="sentinel", id=sentinel.row_id))
            rows = [*rows, sentinel]
        try:
            machine.launching(context)
            request = StreamRequest(
                session=session,
                model=context.model,
                messages=to_messages(rows),  # a damaged row raises here: the sentinel goes too
                stream_id=machine.next_stream_id(),
                cause=context.cause,
                handle=context.correlation.handle_id if context.correlation else None,
                step_budget=context.step_budget,
                fallback_progress=context.progress,
                correlation=context.correlation,
                extra_system_context=context.extra_system_context,
                abort=abort,
                host=self,
            )
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
            await self._store.commit(Boundary(delete=(sentinel.row_id,)))
        except TurnkeeperError as error:  # the launch's own failure is what the caller reports
            log.warning("could not remove the sentinel %s: %s", sentinel.row_id, error)

    # ------------------------------------------------------------ the stream's host

    def thinking_for_step(self) -> str | None:
        """The turn's thinking level for the next step (a mid-turn change applies here)."""
        return self._machine.thinking_for_step()

    def tool_end_queued(self) -> bool:
        """The live reader ``has_queued("tool-end")`` (MQ-8): does a queued entry cut the loop?"""
        return self._machine.queue.has_queued(DispatchMode.TOOL_END)

    def refusal(self) -> str | None:
        """SM-4's launch probe: the session refuses nothing yet (admission is not built)."""
        return None

    def queued_stop(self, report: QueuedStopReport) -> None:
        """ST-2, R1: the machine records the owed continuation, synchronously."""
        self._machine.queued_stop(report)

    async def reached(self, milestone: Milestone) -> None:
        """Perform the durable write the stream's milestone stands for."""
        if isinstance(milestone, Constructed):
            await self._write_envelope(milestone.info)
        elif isinstance(milestone, Started):
            await self._started()
        else:
            await self._write_final(milestone.ended)

    async def _write_envelope(self, info: StreamInfo) -> None:
        """B3: the durable turn envelope, written when the stream is constructed."""
        context = self._machine.context
        envelope = TurnEnvelope(
            session=info.session,
            stream=info.stream,
            model=info.model,
            budget=info.budget,
            cause=context.cause.value,
            handle=context.correlation.handle_id if context.correlation else None,
        )
        await self._store.commit(Boundary(envelope=envelope))
        self._emit(Persisted(session=info.session, what="envelope", id=info.stream))

    async def _started(self) -> None:
        """The stream started: commit the consumed cut's record, then tell it (and the resume).

        The stream manager awaits this before the stream's first step.
        """
        failed = await self._flush()
        if failed is not None:  # the cut is owed still: no step of this stream may run
            raise WriteFailed(f"the start of the stream could not be written: {failed}")
        await self._perform(self._machine.started_durable())

    async def _write_final(self, ended: Ended) -> None:
        """B5: the final assistant row; a cut's row carries the durable cut record (R60).

        A failed write ends the stream in a ``store_write`` error; the cut it carried is
        dropped untold (nothing of it is durable).
        """
        row = self._machine.final_row(ended)
        try:
            await self._store.commit(Boundary(rows=(row,)))
        except (TurnkeeperError, OSError) as error:
            self._machine.final_failed(ended)
            raise WriteFailed(
                f"the final row {row.row_id} could not be written: {error}"
            ) from error
        what = "cut" if row.cut is not None else "assistant"
        self._emit(Persisted(session=row.session, what=what, id=row.row_id))
        await self._perform(self._machine.final_written(row))
