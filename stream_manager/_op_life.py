"""One client call's lifecycle, decided in one pure place (``docs/operations.md``, the table).

Theory of operation
-------------------
An :class:`OpLife` holds what is known of one call: its receipt as last decided, its phase,
why cancellation was requested, whether its execute has ended. Each input (started, the
execute's end, a recorded completion, the deadline, a cancel request, the grace interval over,
a drop before dispatch, a refusal, shutdown) is a method that moves it and returns the effects
the runner (``_operations``) performs, in order: write a receipt, tell it, cancel the scope,
arm a timer, hold the overlap guard, give the model its result (``Finish`` is the ending's
three steps in their order: durable, told, given). No awaits, no clock reads
(every input carries its time), no store.

The rules it keeps:

* one terminal receipt per call (an ``indeterminate`` one may be resolved once more, late, by
  its own layer: OP-8); every receipt is written before it is told (``Finish`` and
  ``Resolve`` write, then tell);
* a result that arrives before the terminal receipt is decided is the result, whatever was
  requested: ``completed`` (or ``failed`` for an error answer), given to the model;
* ``cancelled`` and ``timed_out`` only when the layer acknowledged (its execute ended after the
  request); no acknowledgement within the grace interval is ``indeterminate`` (OP-3);
* a lost transport mid-call is ``indeterminate`` ("the server went away before answering"); a
  server that was down so nothing was sent is ``failed`` ``unavailable``;
* the model is given exactly one result per call, with the receipt that ends it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Final

from persistence import OperationRecord, OpState
from stream_manager._op_answers import failed_result, receipt_answer
from stream_manager._op_states import (
    TRANSPORT_LOST,
    UNCONFIRMED,
    UNCONFIRMED_AT_SHUTDOWN,
    CancelWhy,
    OutcomeCode,
    advance,
    cancel_requested,
)
from stream_manager._parts import ToolCallPart, ToolResultPart


class Phase(enum.Enum):
    """Where a call is (in memory; its receipt says what is durable)."""

    #: Requested; not dispatched (it waits behind a sibling, or has not started).
    WAITING = "waiting"
    #: Its execute runs.
    RUNNING = "running"
    #: Cancellation requested; its end is awaited, at most the grace interval.
    CANCELLING = "cancelling"
    #: ``indeterminate``, and its execute may still end: a late end resolves it (OP-8).
    LINGERING = "lingering"
    #: Nothing more to decide.
    ENDED = "ended"


class Exit(enum.Enum):
    """How the execute ended."""

    #: It returned a result (a success or an error answer).
    RETURNED = "returned"
    #: It raised (a tool-runtime failure).
    RAISED = "raised"
    #: It ended without a result: the cancellation propagated (an acknowledgement).
    CANCELLED = "cancelled"
    #: The layer below could not confirm termination (``TerminationUnconfirmed``).
    UNCONFIRMED = "unconfirmed"
    #: Sent, and the transport broke before an answer (``ToolTransportLost``).
    LOST = "lost"
    #: Never sent: the server is down (``ToolUnavailable``).
    UNAVAILABLE = "unavailable"


# ---------------------------------------------------------------- effects


class Write:
    """Write ``record`` durably (a failure is ``WriteFailed``: the stream fails)."""

    __slots__ = ("record",)

    def __init__(self, record: OperationRecord) -> None:
        self.record = record


class RequestCancel:
    """Write the cancel request ``record``, tell ``op-cancel-requested``, cancel the scope."""

    __slots__ = ("record", "why")

    def __init__(self, record: OperationRecord, why: CancelWhy) -> None:
        self.record = record
        self.why = why


class Arm:
    """Arm the grace timer: the end of the grace interval is at ``at``."""

    __slots__ = ("at",)

    def __init__(self, at: float) -> None:
        self.at = at


class Hold:
    """``record`` is indeterminate: the overlap guard holds its target (OP-9)."""

    __slots__ = ("record",)

    def __init__(self, record: OperationRecord) -> None:
        self.record = record


class Resolve:
    """A late end: release ``held`` from the guard, then write and tell ``record`` (OP-8)."""

    __slots__ = ("held", "record")

    def __init__(self, held: OperationRecord, record: OperationRecord) -> None:
        self.held = held
        self.record = record


class Run:
    """Arm the deadline timer for ``at``, then hand the call to the stream's worker."""

    __slots__ = ("at",)

    def __init__(self, at: float) -> None:
        self.at = at


class Finish:
    """The call's end: write ``record`` durably, then tell it, then give the model ``result``.

    One effect for the three steps every ending takes, in this order (durable, told, given).
    """

    __slots__ = ("record", "result")

    def __init__(self, record: OperationRecord, result: ToolResultPart) -> None:
        self.record = record
        self.result = result


class Abandon:
    """Stop waiting for the execute: cancel its scope.

    If it has not ended, it keeps only its own task (its worker is retired, OP-6).
    """

    __slots__ = ()


class Linger:
    """Keep watching the execute: a late end resolves the indeterminate receipt (OP-8)."""

    __slots__ = ()


ABANDON: Final = Abandon()
LINGER: Final = Linger()

Effect = Write | RequestCancel | Arm | Run | Finish | Hold | Resolve | Abandon | Linger
Effects = Sequence[Effect]
_NONE: Final[tuple[Effect, ...]] = ()

_NOT_DISPATCHED: Final = "cancelled before it was dispatched; nothing ran"
_UNAVAILABLE: Final = "not run: the tool's server is unavailable; nothing was sent"


class OpLife:
    """One call's lifecycle: inputs in, effects out (see the module docs)."""

    __slots__ = ("call", "closing", "exited", "grace_s", "phase", "record", "why")

    def __init__(
        self, record: OperationRecord, call: ToolCallPart, *, grace_s: float, closing: bool
    ) -> None:
        #: The receipt as last decided (written by the effects that carry it).
        self.record = record
        self.call = call
        self.grace_s = grace_s
        self.phase = Phase.WAITING
        #: Why cancellation was requested (the first reason stands), if it was.
        self.why: CancelWhy | None = None
        #: The execute has ended (however).
        self.exited = False
        #: The engine shuts down: nothing is resolved late from now on.
        self.closing = closing

    # ------------------------------------------------------------ inputs

    def start(self, now: float) -> Effects:
        """Its turn came: ``running`` (unless admission wrote it so), its deadline armed."""
        if self.phase is not Phase.WAITING:
            return _NONE
        self.phase = Phase.RUNNING
        assert self.record.deadline_at is not None
        run = Run(self.record.deadline_at)
        if self.record.state is OpState.RUNNING:
            return (run,)
        self.record = advance(self.record, OpState.RUNNING, now=now)
        return (Write(self.record), run)

    def refuse(
        self, now: float, outcome: OutcomeCode, explanation: str, result: ToolResultPart
    ) -> Effects:
        """It is not run (no such tool, arguments its schema refuses): ``failed``."""
        if self.phase is not Phase.WAITING:
            return _NONE
        return self._end(
            OpState.FAILED, now, outcome, result, acknowledged=True, explanation=explanation
        )

    def exit(self, now: float, how: Exit, result: ToolResultPart | None) -> Effects:
        """The execute ended: ``result`` is what it returned (or the failure it raised)."""
        self.exited = True
        phase = self.phase
        if phase is Phase.RUNNING:
            return self._settle(now, how, result)
        if phase is Phase.CANCELLING:
            return self._acknowledged(now, how, result)
        if phase is Phase.LINGERING:
            return self._late(now, how, result)
        return _NONE

    def recorded(self, now: float, result: ToolResultPart) -> Effects:
        """OP-5: the tool recorded its completion; its execute's end may never come."""
        if self.phase not in (Phase.RUNNING, Phase.CANCELLING) or self.exited:
            return _NONE
        state, outcome = _answered(result)
        if outcome is OutcomeCode.OK:
            outcome = OutcomeCode.COMPLETION_SIGNAL_LOST
        return (*self._end(state, now, outcome, result), ABANDON)

    def deadline(self, now: float) -> Effects:
        """The deadline passed while it ran: cancellation is requested (OP-2)."""
        return self.cancel(now, CancelWhy.DEADLINE)

    def cancel(self, now: float, why: CancelWhy) -> Effects:
        """Cancellation is requested: durably first, then the scope, then the grace timer."""
        phase = self.phase
        if phase is Phase.WAITING:  # it never ran: its request is durable, then it is dropped
            if self.why is None:
                self.why = why
                self.record = cancel_requested(self.record, now=now, why=why)
                return (RequestCancel(self.record, why),)
            return _NONE
        if phase is not Phase.RUNNING:
            return _NONE
        self.phase = Phase.CANCELLING
        self.why = why
        self.record = cancel_requested(self.record, now=now, why=why)
        request = RequestCancel(self.record, why)
        if self.exited:  # its task was cancelled from outside: this request explains it
            return (request, *self._acknowledged(now, Exit.CANCELLED, None))
        return (request, Arm(now + self.grace_s))

    def cancel_at_admission(self, now: float, why: CancelWhy) -> None:
        """The stream stopped while the step's receipts were written: the request goes along.

        The runner writes the step's receipts again, as one write, and tells the requests.
        """
        self.why = why
        self.record = cancel_requested(self.record, now=now, why=why)

    def drop(self, now: float) -> Effects:
        """OP-4: a call that never ran is ``cancelled`` before dispatch, acknowledged."""
        if self.phase is not Phase.WAITING:
            return _NONE
        return self._end(
            OpState.CANCELLED,
            now,
            OutcomeCode.CANCELLED,
            None,  # the stopped result, stating the receipt that ends it
            acknowledged=True,
            explanation=_NOT_DISPATCHED,
        )

    def grace_over(self, now: float) -> Effects:
        """No acknowledgement within the grace interval: ``indeterminate`` (OP-3)."""
        if self.phase is not Phase.CANCELLING:
            return _NONE
        effects = self._indeterminate(now, self._cancel_outcome(), self._unconfirmed())
        if self.closing:
            return (*effects, ABANDON)
        self.phase = Phase.LINGERING
        return (*effects, ABANDON, LINGER)

    def shutdown(self) -> Effects:
        """The engine shuts down: an end seen from now on resolves nothing (OP-8)."""
        self.closing = True
        if self.phase is Phase.LINGERING:
            self.phase = Phase.ENDED
        return _NONE

    def settle(self, record: OperationRecord) -> None:
        """A person settled the indeterminate receipt (``record``): a late end resolves nothing."""
        self.record = record
        self.phase = Phase.ENDED

    def unsettle(self, record: OperationRecord) -> None:
        """The person's settlement was not written: it is indeterminate (``record``) again."""
        self.record = record
        self.phase = Phase.ENDED if self.exited or self.closing else Phase.LINGERING

    def abandon(self) -> None:
        """A write failed: the stream fails; nothing more is decided for this call."""
        self.phase = Phase.ENDED

    # ------------------------------------------------------------ decisions

    def _settle(self, now: float, how: Exit, result: ToolResultPart | None) -> Effects:
        """It ended by itself, nothing requested.

        Ended without a result (its task cancelled from outside: the engine tearing its tasks
        down) is decided by the next input: the stop that follows it, or the deadline.
        """
        if how is Exit.CANCELLED:
            return _NONE
        if how is Exit.RETURNED and result is not None:
            state, outcome = _answered(result)
            return self._end(state, now, outcome, result)
        if how is Exit.LOST:
            return self._indeterminate(now, OutcomeCode.TRANSPORT_LOST, TRANSPORT_LOST)
        if how is Exit.UNAVAILABLE:
            return self._unavailable(now, result)
        if how is not Exit.RAISED or result is None:  # unconfirmed, nothing requested
            result = failed_result(self.call, "the tool ended without a result")
        return self._end(OpState.FAILED, now, OutcomeCode.TOOL_ERROR, result)

    def _acknowledged(self, now: float, how: Exit, result: ToolResultPart | None) -> Effects:
        """It ended after the cancel request, within the grace interval."""
        if how is Exit.RETURNED and result is not None:  # it answered first: that is the result
            state, outcome = _answered(result)
            return self._end(state, now, outcome, result, acknowledged=True)
        if how is Exit.UNCONFIRMED:
            return self._indeterminate(now, self._cancel_outcome(), self._unconfirmed())
        if how is Exit.LOST:
            return self._indeterminate(now, OutcomeCode.TRANSPORT_LOST, TRANSPORT_LOST)
        if how is Exit.UNAVAILABLE:
            return self._unavailable(now, result)
        return self._end(
            self._cancelled_state(),
            now,
            self._cancel_outcome(),
            None,  # the stopped result, stating the receipt that ends it
            acknowledged=True,
        )

    def _late(self, now: float, how: Exit, result: ToolResultPart | None) -> Effects:
        """OP-8: the same layer ends after its receipt said ``indeterminate``."""
        self.phase = Phase.ENDED
        if self.closing or how in (Exit.UNCONFIRMED, Exit.LOST):
            return _NONE  # no acknowledgement: the receipt says what is known
        if how is Exit.RETURNED and result is not None:
            state, outcome = _answered(result)
        elif how is Exit.UNAVAILABLE:
            state, outcome = OpState.FAILED, OutcomeCode.UNAVAILABLE
        else:
            state, outcome = self._cancelled_state(), self._cancel_outcome()
        held = self.record
        self.record = advance(held, state, now=now, outcome=outcome, acknowledged=True)
        return (Resolve(held, self.record),)

    def _end(
        self,
        state: OpState,
        now: float,
        outcome: OutcomeCode,
        result: ToolResultPart | None,
        *,
        acknowledged: bool | None = None,
        explanation: str | None = None,
    ) -> Effects:
        self.phase = Phase.ENDED
        self.record = advance(
            self.record,
            state,
            now=now,
            outcome=outcome,
            acknowledged=acknowledged,
            explanation=explanation,
        )
        return (Finish(self.record, result if result is not None else self._stopped_result()),)

    def _indeterminate(self, now: float, outcome: OutcomeCode, explanation: str) -> Effects:
        self.phase = Phase.ENDED
        self.record = advance(
            self.record,
            OpState.INDETERMINATE,
            now=now,
            outcome=outcome,
            acknowledged=False,
            explanation=explanation,
        )
        told = failed_result(
            self.call,
            "indeterminate",
            op=self.record.op_id,
            detail=f"{explanation}; it may or may not have run",
        )
        if self.why is not None and outcome is not OutcomeCode.TRANSPORT_LOST:
            told = self._stopped_result()
        return (Hold(self.record), Finish(self.record, told))

    def _unavailable(self, now: float, result: ToolResultPart | None) -> Effects:
        detail = _error_of(result) or "the tool's server is unavailable"
        told = failed_result(self.call, "unavailable", detail=f"{detail}; nothing was sent")
        return self._end(
            OpState.FAILED,
            now,
            OutcomeCode.UNAVAILABLE,
            told,
            acknowledged=True,
            explanation=_UNAVAILABLE,
        )

    def _cancelled_state(self) -> OpState:
        return OpState.TIMED_OUT if self.why is CancelWhy.DEADLINE else OpState.CANCELLED

    def _cancel_outcome(self) -> OutcomeCode:
        return OutcomeCode.TIMEOUT if self.why is CancelWhy.DEADLINE else OutcomeCode.CANCELLED

    def _unconfirmed(self) -> str:
        return UNCONFIRMED_AT_SHUTDOWN if self.why is CancelWhy.SHUTDOWN else UNCONFIRMED

    def _stopped_result(self) -> ToolResultPart:
        """What the model is told of a call stopped without an answer: its receipt, stated."""
        if self.why is CancelWhy.DEADLINE:
            detail = "the call passed its deadline; cancellation was requested"
            return receipt_answer(self.call, self.record, error="timeout", detail=detail)
        return receipt_answer(self.call, self.record, error="cancelled")


def _answered(result: ToolResultPart) -> tuple[OpState, OutcomeCode]:
    """A tool's own answer: ``completed``, or ``failed`` when it answered an error."""
    if result.is_error:
        return OpState.FAILED, OutcomeCode.CAPABILITY_ERROR
    return OpState.COMPLETED, OutcomeCode.OK


def _error_of(result: ToolResultPart | None) -> str | None:
    if result is None or not isinstance(result.output, dict):
        return None
    error = result.output.get("error")
    return error if isinstance(error, str) else None
