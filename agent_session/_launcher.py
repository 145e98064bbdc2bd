"""The stream launcher: a turn's stream from durable history, and its durable writes.

It reads the session's history, asks the stream manager for the stream and, while it runs,
gives the turn machine each milestone the stream reaches: the machine decides the write each
stands for (the ``Continue`` sentinel a history ending in tool results needs, R34; the turn
envelope when the stream is constructed, B3; the consumed continuation's record once the
stream started; the final assistant row, B5, which carries the cut record when the stream was
cut, R60) and the session's one writer performs it. The launcher is an I/O adapter: it never
writes, and turns the machine's reply (``None``, or the failed write's error) into what the
stream manager expects (a raised error stops the stream).

The launcher is the stream's host (``stream_manager.StreamHost``): it answers the manager's
queries from the turn machine and the queue, hands the cut report to the machine, and performs
the write each milestone (``Constructed``, ``Started``, ``Completed``) stands for.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from agent_session import _inputs as _in
from agent_session._compaction import summarise
from agent_session._rows import to_messages
from message_queue import DispatchMode
from persistence import HistoryRow, RowKind, TurnkeeperError
from stream_manager import (
    Constructed,
    Refused,
    Started,
    StreamRequest,
    Withdrawn,
)

if TYPE_CHECKING:
    from agent_session._admission import Ticket
    from agent_session._effects import Perform
    from agent_session._machine import TurnMachine
    from agent_session._session_store import SessionStore
    from agent_session._turn import StreamContext
    from stream_manager import (
        AbortSignal,
        Milestone,
        QueuedStopReport,
        StreamManager,
        StreamOutcome,
    )

log = logging.getLogger("turnkeeper.session")
#: The rows a launch appends for itself: a failed or refused launch takes them back.
_OWN_ROWS = frozenset({RowKind.SENTINEL, RowKind.USER})


class StreamLauncher:
    """Launches one session's streams and performs their durable writes (their ``StreamHost``)."""

    __slots__ = ("_machine", "_manager", "_perform", "_store", "_ticket")

    def __init__(
        self,
        machine: TurnMachine,
        *,
        store: SessionStore,
        manager: StreamManager,
        perform: Perform,
        ticket: Ticket | None = None,
    ) -> None:
        self._machine = machine
        self._store = store
        self._manager = manager
        self._perform = perform
        #: An admitted resume's ticket: its combined probe is SM-4's (ST-9, R17).
        self._ticket = ticket

    async def _decide(self, given: _in.Input) -> object:
        """Give the machine ``given``; perform its decision; raise the error it replies."""
        return _answer(await self._perform(self._machine.handle(given)))

    async def launch(self, context: StreamContext, abort: AbortSignal) -> StreamOutcome:
        """AS-22: stream from history under ``context``; return the stream's outcome."""
        machine = self._machine
        session = machine.id
        read, partials = await self._store.history()
        # PS-2: a partial an earlier stream left goes into history first; R34: the sentinel
        rows = await self._decide(_in.HistoryLoaded(read, partials))
        assert isinstance(rows, tuple)
        rows = await self._compacted(rows, context)  # AS-36 on send: a fresh turn over it
        # the row the launch appended for itself (a sentinel, a follow-up's row): R34, R51
        added = len(rows) > len(read) and rows[-1].kind in _OWN_ROWS
        sentinel = rows[-1] if added else None
        try:
            machine.handle(_in.Launching(context))
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
            ticket = self._ticket
            if ticket is not None and ticket.error is not None:
                raise ticket.error  # the probe could not read: a failure before start
        except BaseException:
            if sentinel is not None:  # R34: a launch that failed leaves no orphan sentinel
                with self._manager.bounded_cleanup(f"removal of the sentinel {sentinel.row_id}"):
                    await self._perform(machine.handle(_in.SentinelUnwanted(sentinel)))
            raise
        if isinstance(outcome, Refused | Withdrawn) and sentinel is not None:
            if sentinel.kind is RowKind.USER:  # R51: logged (the trace has no deletion event)
                log.info("session %s: follow-up row %s taken back", session, sentinel.row_id)
            await self._perform(machine.handle(_in.SentinelUnwanted(sentinel)))  # R34, R51
        return outcome

    async def _compacted(
        self, rows: tuple[HistoryRow, ...], context: StreamContext
    ) -> tuple[HistoryRow, ...]:
        """The history, with a summary of what precedes the turn when it is over the threshold.

        The compaction request is one call on the turn's model; a failed one is logged and the
        turn launches on its full history (the provider may refuse it: a context-limit retry
        follows, AS-34).
        """
        machine = self._machine
        plan = machine.compaction_before_launch(rows, context)
        if plan is None:
            return rows
        through, earlier = plan
        purpose = f"{machine.id}:compaction"
        complete = self._manager.complete_text
        history = to_messages(earlier)
        try:
            text = await summarise(
                complete, context.model, history, machine.compaction_prompt, purpose
            )
        except (TurnkeeperError, OSError) as error:
            log.warning("session %s: compaction before the turn failed: %s", machine.id, error)
            return rows
        compacted = await self._decide(_in.SummaryBeforeLaunch(text, through, rows))
        assert isinstance(compacted, tuple)
        return compacted

    # ------------------------------------------------------------ the stream's host

    def thinking_for_step(self) -> str | None:
        """The turn's thinking level for the next step (a mid-turn change applies here)."""
        return self._machine.thinking_for_step()

    def tool_end_queued(self) -> bool:
        """The live reader ``has_queued("tool-end")`` (MQ-8): does a queued entry cut the loop?"""
        return self._machine.queue.has_queued(DispatchMode.TOOL_END)

    def refusal(self) -> str | None:
        """SM-4's launch probe: an admitted resume's combined probe (ST-9), else nothing.

        The manager asks it right before the stream registers (after the history read, the
        sentinel write and the request's construction: nothing awaits between them) and again
        after the turn envelope is written: every checkpoint ST-9 lists.
        """
        ticket = self._ticket
        return None if ticket is None else ticket.refusal()

    def queued_stop(self, report: QueuedStopReport) -> None:
        """ST-2, R1: the machine records the owed continuation, synchronously."""
        self._machine.handle(_in.QueuedStop(report))

    async def reached(self, milestone: Milestone) -> None:
        """The machine decides the durable write the stream's milestone stands for.

        The stream manager awaits this: B3's envelope before the stream starts, the consumed
        cut's record before the first step, B5's final row before the outcome. A failed write
        raises (the machine's reply): the stream fails, ``store_write`` where it ran.
        """
        given: _in.Input
        if isinstance(milestone, Constructed):
            given = _in.EnvelopeReady(milestone.info)
        elif isinstance(milestone, Started):
            given = _in.StartReached()
        else:
            given = _in.FinalReady(milestone.ended)
        _answer(await self._perform(self._machine.handle(given)))  # not ``_decide``: one frame less


def _answer(reply: object) -> object:
    """The machine's reply to a milestone or a read: raised when it is an error."""
    if isinstance(reply, BaseException):
        raise reply
    return reply
