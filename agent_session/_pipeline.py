"""The send pipeline: one message from the gate to its stream (AS-3 to AS-10).

Gate, validate, persist the user row, cross the point of no return (AS-8), accept, launch.
The producer may withdraw the message until that point: its cancel signal is checked before
anything and after every await, and a withdrawn message takes back exactly its own row. The
pipeline is an I/O adapter: every decision that changes the session (the user row and its
rollback, a superseded continuation, PREPARING claimed, the turn's context) is the turn
machine's, made from the input the pipeline gives it; the pipeline performs the awaits between
them and reads the machine's reply (a durable row, or the write's error).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from agent_session import _inputs as _in
from agent_session._admission import AdmissionUnreadable
from agent_session._events import EntryCanceled
from agent_session._turn import (
    Accepted,
    CanceledBeforeAcceptance,
    PipelineResult,
    SendRefused,
    StreamContext,
)
from agent_session.ports import PreStreamFailure
from message_queue import EntryKind, SendFailure
from persistence import HistoryRow, TurnkeeperError
from stream_manager import ErrorKind, LaunchRefused, Refused, StreamFailed

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from agent_session._admission import Ticket
    from agent_session._effects import Perform, Successors
    from agent_session._events import EngineEvent
    from agent_session._machine import TurnMachine
    from agent_session._session_store import SessionStore
    from agent_session._turn import TurnInput
    from agent_session.ports import PreStreamGate
    from stream_manager import StreamOutcome

log = logging.getLogger("turnkeeper.session")

_DISPOSED = SendRefused(SendFailure(type="disposed", message="the session was disposed"))


class SendPipeline:
    """Runs one send at a time through gate, validation, persistence and acceptance."""

    __slots__ = (
        "_admit",
        "_emit",
        "_gate",
        "_launch",
        "_machine",
        "_outcome",
        "_pause_goal",
        "_perform",
        "_store",
    )

    def __init__(
        self,
        machine: TurnMachine,
        *,
        store: SessionStore,
        gate: PreStreamGate,
        emit: Callable[[EngineEvent], None],
        perform: Perform,
        launch: Callable[[StreamContext, Ticket | None], Awaitable[StreamOutcome]],
        admit: Callable[[TurnInput], Ticket | str | None],
        pause_goal: Callable[[str], None],
        outcome: Callable[[StreamOutcome, StreamContext], _in.Input] = _in.Outcome,
    ) -> None:
        self._machine = machine
        #: The machine's input for a launched turn's outcome (the session's: a lost lease,
        #: LS-3, is not an outcome like the others).
        self._outcome = outcome
        self._store = store
        self._gate = gate
        #: What the pipeline itself found (a cancellation, a failure before the stream): never
        #: a write, which only the machine decides and the writer tells.
        self._emit = emit
        self._perform = perform
        self._launch = launch
        #: R41 for a follow-up of a delegated turn: its handle (and workspace) admit it?
        self._admit = admit
        #: AS-4: a refused manual send pauses the session's active goal (``why``).
        self._pause_goal = pause_goal

    async def run(self, turn: TurnInput, then: Successors) -> PipelineResult:
        """AS-13: whatever goes wrong in one send, the session goes on (IDLE, drain again).

        ``then`` is the running task's successors: what the turn's outcome starts (the next
        queued send, the sweep) runs after the send, in the same task.
        """
        try:
            return await self._pipeline(turn, then)
        except Exception as error:  # an unexpected failure must not kill the session's drain
            log.exception("send of %s failed", turn.entry_id or "a direct message")
            failure = SendFailure(type="unknown", message=f"{type(error).__name__}: {error}")
            return SendRefused(failure)

    async def _pipeline(self, turn: TurnInput, then: Successors) -> PipelineResult:
        machine = self._machine
        if turn.canceled():  # AS-3: checked before anything, and after every await below
            return self._cancel_before_acceptance(turn)
        try:
            await self._gate.check(machine.id, "send")
        except PreStreamFailure as error:
            return await self._gate_refused(turn, error)
        if self._disposed():
            return _DISPOSED
        if turn.canceled():
            return self._cancel_before_acceptance(turn)
        failure = machine.validate(turn)
        if failure is not None:
            return SendRefused(failure)
        try:
            ticket = self._admit(turn)  # TD-8, R41: a follow-up of a stopped turn never runs
        except AdmissionUnreadable as error:
            return SendRefused(SendFailure(type="pre_stream_failure", message=str(error)))
        if isinstance(ticket, str):
            return self._refused(ticket)
        row = await self._perform(machine.handle(_in.UserRowWanted(turn)))
        if not isinstance(row, HistoryRow):
            return SendRefused(SendFailure(type="store_write", message=str(row)))
        if self._disposed():
            return _DISPOSED
        if turn.canceled() and not await self._row_stays(row):
            return self._cancel_before_acceptance(turn)
        # AS-8: the point of no return (a withdrawn entry whose row could not be taken back
        # crosses it too: the row is durable, so the entry is accepted like any other).
        # A row that does not continue the cut turn supersedes it.
        await self._perform(machine.handle(_in.Supersede(turn, "superseded by a send (R35)")))
        refused = await self._accept(turn)
        if refused is not None:
            return refused
        return await self._launch_accepted(machine.turn_context(turn), then, ticket, row)

    def _disposed(self) -> bool:
        """Whether the session was disposed (it can become so across any await)."""
        return self._machine.disposed

    async def _accept(self, turn: TurnInput) -> SendRefused | None:
        """AS-9, AS-10: ``on_accepted`` (a failure is an error result), then PREPARING."""
        if turn.callbacks is not None and turn.callbacks.on_accepted is not None:
            try:
                turn.callbacks.on_accepted()
            except Exception as error:
                log.warning("on_accepted of %s failed: %r", turn.entry_id, error)
                return SendRefused(SendFailure(type="on_accepted", message=str(error)))
        await self._perform(self._machine.handle(_in.TurnAccepted(turn)))
        return None

    async def _launch_accepted(
        self,
        context: StreamContext,
        then: Successors,
        ticket: Ticket | None = None,
        row: HistoryRow | None = None,
    ) -> PipelineResult:
        """AS-10, AS-22: launch an accepted turn; a failure before its stream is reported.

        The outcome's path (its rows, the drain) runs after the launch, outside this guard:
        a write failing there is the machine's input, never a failure "before the stream".
        An admitted follow-up whose launch probe refused it takes its row back first (R51).
        """
        try:
            outcome = await self._launch(context, ticket)
        except (TurnkeeperError, OSError) as error:
            log.warning("the turn failed before its stream started: %s", error)
            self._emit(
                StreamFailed(
                    session=self._machine.id,
                    stream="",
                    kind=ErrorKind.RETRYABLE,
                    remaining=context.step_budget or 0,
                    type="pre_stream_failure",
                    message=str(error),
                )
            )
            return SendRefused(SendFailure(type="pre_stream_failure", message=str(error)))
        if ticket is not None and row is not None and isinstance(outcome, Refused):
            await self._take_back(row)
        await self._perform(self._machine.handle(self._outcome(outcome, context)), then)
        return Accepted()

    async def _take_back(self, row: HistoryRow) -> None:
        """R51: the refused follow-up's row goes (a failed delete is logged; the row stays)."""
        if await self._perform(self._machine.handle(_in.Rollback(row))) is not None:
            log.warning("the refused follow-up's row %s could not be taken back", row.row_id)

    def _refused(self, why: str) -> SendRefused:
        """A follow-up its handle or workspace no longer admits: nothing written, no stream."""
        self._emit(LaunchRefused(session=self._machine.id, why=why))
        return SendRefused(SendFailure(type="admission_refused", message=why))

    async def _gate_refused(self, turn: TurnInput, error: PreStreamFailure) -> SendRefused:
        """AS-4: a refused manual send keeps the user's row and surfaces a stream error.

        The kept row is durable, so it supersedes an owed continuation like any send's (R35):
        a resume must not answer a message the gate refused.
        """
        machine = self._machine
        failure = SendFailure(type="pre_stream", message=str(error))
        if turn.kind is EntryKind.USER and machine.validate(turn) is None:
            row = await self._perform(machine.handle(_in.UserRowWanted(turn)))
            if not isinstance(row, HistoryRow):  # the row is lost with the send: say both
                message = f"{error}; the message was not kept: {row}"
                return SendRefused(SendFailure(type="store_write", message=message))
            why = "superseded by a refused send's row (R35)"
            await self._perform(machine.handle(_in.Supersede(turn, why)))
            # PS-8: its row stays unanswered; a startup must not retry a refused message
            await self._perform(machine.handle(_in.GiveUp("pre_stream_rejected")))
            self._pause_goal(f"a message was refused before its stream: {error}")
            self._emit(
                StreamFailed(
                    session=machine.id,
                    stream="",
                    kind=ErrorKind.TERMINAL,
                    remaining=0,
                    type="pre_stream_rejected",
                    message=str(error),
                )
            )
        return SendRefused(failure)

    def _cancel_before_acceptance(self, turn: TurnInput) -> CanceledBeforeAcceptance:
        reason = (turn.cancel_token.reason if turn.cancel_token else None) or "withdrawn"
        if turn.cancel_state is not None:
            turn.cancel_state.canceled_before_acceptance = True
        if turn.entry_id is not None:
            self._emit(EntryCanceled(session=self._machine.id, entry=turn.entry_id, reason=reason))
        if turn.callbacks is not None:
            try:
                turn.callbacks.notify_canceled(reason)
            except Exception as error:
                log.warning("on_canceled of %s failed: %r", turn.entry_id, error)
        return CanceledBeforeAcceptance(reason)

    async def _row_stays(self, row: HistoryRow) -> bool:
        """AS-3: delete exactly this send's row; whether it is still in history after that."""
        failed = await self._perform(self._machine.handle(_in.Rollback(row)))
        if failed is not None and row.row_id in {r.row_id for r in await self._store.rows()}:
            log.warning("rollback of %s failed; accepting the entry", row.row_id)
            return True
        return False
