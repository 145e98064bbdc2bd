"""Hypothesis state machines over the pure operation lifecycle.

``OperationMachine`` drives the table (``stream_manager._op_states``); ``LifeMachine`` drives one
call's lifecycle as the runner decides it (``stream_manager._op_life``): every input in any
order a runner can produce, its effects performed by a model shell that checks one terminal
receipt, receipts durable before told, the honest outcomes (an answer before the terminal
receipt is the answer; a lost transport is ``indeterminate``; an unavailable server is
``failed`` ``unavailable``) and that no call's result is dropped.

Operations are created ``requested``; rules move them the way the engine does (start, complete,
fail, request cancellation, acknowledge within the grace interval, let the grace interval run
out, acknowledge late, crash, block) or try a move the table forbids. The machine keeps its own
model: the table as OP-8 states it (written out here, not imported), each operation's
state, and every terminal or indeterminate state it entered, and checks:

* exactly one authoritative ending per operation: an operation enters a terminal or
  indeterminate state once, except that an ``indeterminate`` one may be resolved once more by
  its own layer, and that resolution is marked ``resolved_late`` (OP-8);
* ``cancelled`` and ``timed_out`` only with ``termination_acknowledged`` (OP-3, OP-2);
  ``indeterminate`` never with it;
* a forbidden move raises ``IllegalOpTransition`` and leaves the record as it was;
* ``ended_at`` is set exactly when the operation is neither requested nor running;
* the first cancellation reason stands, and is recorded before any acknowledgement (OP-3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from persistence import OperationRecord, OpState
from stream_manager import Capability, ToolCallPart, ToolKind, ToolResultPart
from stream_manager._op_life import (
    LINGER,
    Arm,
    Effect,
    Exit,
    Finish,
    Hold,
    OpLife,
    Phase,
    RequestCancel,
    Resolve,
    Run,
    Write,
)
from stream_manager._op_states import (
    UNCONFIRMED,
    CancelWhy,
    IllegalOpTransition,
    OutcomeCode,
    advance,
    cancel_requested,
    requested,
)

S = OpState
#: OP-4, OP-7, OP-8, OP-9 and ``docs/operations.md``, as this machine reads them.
ALLOWED: frozenset[tuple[OpState, OpState]] = frozenset(
    {
        (S.REQUESTED, S.RUNNING),
        (S.REQUESTED, S.CANCELLED),  # OP-4: cancelled before dispatch
        (S.REQUESTED, S.FAILED),  # OP-9: blocked
        (S.REQUESTED, S.INDETERMINATE),  # OP-7: found open after a crash
        (S.RUNNING, S.COMPLETED),
        (S.RUNNING, S.FAILED),
        (S.RUNNING, S.TIMED_OUT),
        (S.RUNNING, S.CANCELLED),
        (S.RUNNING, S.INDETERMINATE),
        (S.INDETERMINATE, S.COMPLETED),  # OP-8: a late answer from the same layer
        (S.INDETERMINATE, S.FAILED),
        (S.INDETERMINATE, S.TIMED_OUT),
        (S.INDETERMINATE, S.CANCELLED),
    }
)
ENDINGS = frozenset({S.COMPLETED, S.FAILED, S.TIMED_OUT, S.CANCELLED, S.INDETERMINATE})
UNENDED = frozenset({S.REQUESTED, S.RUNNING})

ops = st.integers(min_value=0, max_value=10_000)
whys = st.sampled_from(list(CancelWhy))
targets = st.sampled_from(list(OpState))


@dataclass
class _Model:
    state: OpState = OpState.REQUESTED
    #: Every terminal or indeterminate state entered, in order.
    endings: list[OpState] = field(default_factory=list)
    why: CancelWhy | None = None
    cancel_at: float | None = None


class OperationMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[OperationRecord] = []
        self.model: list[_Model] = []
        self.now = 0.0

    # ------------------------------------------------------------ helpers

    def _pick(self, n: int) -> int:
        return n % len(self.records)

    def _move(self, index: int, to: OpState, **kwargs: Any) -> None:
        """Apply a move; the model's table decides whether it must succeed or raise."""
        before = self.records[index]
        model = self.model[index]
        if (model.state, to) not in ALLOWED:
            with pytest.raises(IllegalOpTransition):
                advance(before, to, now=self.now, **kwargs)
            assert self.records[index] == before
            return
        after = advance(before, to, now=self.now, **kwargs)
        assert after.state is to
        assert after.op_id == before.op_id
        assert after.started_at == before.started_at
        assert after.cancel_requested_at == before.cancel_requested_at
        if to is not S.RUNNING:
            assert after.ended_at == self.now
        late = model.state is S.INDETERMINATE
        assert after.resolved_late == late
        self.records[index] = after
        model.state = to
        if to in ENDINGS:
            model.endings.append(to)

    # ------------------------------------------------------------ rules

    @rule()
    def create(self) -> None:
        number = len(self.records)
        record = requested(
            op_id=f"s/1/1/{number}",
            session="s",
            stream="s/1",
            call_id=f"c{number}",
            capability=Capability(kind=ToolKind.CLIENT, name="a"),
            target="client:a#0",
            now=self.now,
            deadline_at=self.now + 10.0,
        )
        assert record.state is S.REQUESTED
        assert record.ended_at is None
        self.records.append(record)
        self.model.append(_Model())

    @rule(seconds=st.sampled_from([0.0, 0.5, 2.0]))
    def tick(self, seconds: float) -> None:
        self.now += seconds

    @precondition(lambda self: self.records)
    @rule(n=ops)
    def start(self, n: int) -> None:
        self._move(self._pick(n), S.RUNNING)

    @precondition(lambda self: self.records)
    @rule(n=ops)
    def complete(self, n: int) -> None:
        self._move(self._pick(n), S.COMPLETED, outcome=OutcomeCode.OK)

    @precondition(lambda self: self.records)
    @rule(n=ops, code=st.sampled_from([OutcomeCode.TOOL_ERROR, OutcomeCode.CAPABILITY_ERROR]))
    def fail(self, n: int, code: OutcomeCode) -> None:
        self._move(self._pick(n), S.FAILED, outcome=code)

    @precondition(lambda self: self.records)
    @rule(n=ops, why=whys)
    def request_cancel(self, n: int, why: CancelWhy) -> None:
        index = self._pick(n)
        before = self.records[index]
        model = self.model[index]
        after = cancel_requested(before, now=self.now, why=why)
        assert after.state is before.state  # a flag, never a state
        if model.why is None:
            model.why, model.cancel_at = why, self.now
        assert after.cancel_reason == model.why.value  # the first reason stands
        assert after.cancel_requested_at == model.cancel_at
        self.records[index] = after

    def _cancelled_or_timed_out(self, index: int) -> OpState:
        why = self.model[index].why
        return S.TIMED_OUT if why is CancelWhy.DEADLINE else S.CANCELLED

    def _outcome(self, index: int) -> OutcomeCode:
        why = self.model[index].why
        return OutcomeCode.TIMEOUT if why is CancelWhy.DEADLINE else OutcomeCode.CANCELLED

    @precondition(lambda self: any(m.state in UNENDED and m.why is not None for m in self.model))
    @rule(n=ops)
    def acknowledge_within_grace(self, n: int) -> None:
        """The layer stopped in time (a ``requested`` one never ran: OP-4)."""
        pending = [i for i, m in enumerate(self.model) if m.state in UNENDED and m.why]
        index = pending[n % len(pending)]
        to = self._cancelled_or_timed_out(index)
        self._move(index, to, outcome=self._outcome(index), acknowledged=True)
        record = self.records[index]
        if record.state is to:
            assert record.cancel_acknowledged_at == self.now

    @precondition(lambda self: any(m.why is not None for m in self.model))
    @rule(n=ops)
    def grace_expires_unacknowledged(self, n: int) -> None:
        asked = [i for i, m in enumerate(self.model) if m.why is not None]
        index = asked[n % len(asked)]
        self._move(
            index,
            S.INDETERMINATE,
            outcome=self._outcome(index),
            acknowledged=False,
            explanation=UNCONFIRMED,
        )

    @precondition(
        lambda self: any(m.state is S.INDETERMINATE and m.why is not None for m in self.model)
    )
    @rule(n=ops)
    def late_acknowledgement(self, n: int) -> None:
        """The layer that was asked to stop ends after all: resolved late (OP-8)."""
        unsure = [
            i for i, m in enumerate(self.model) if m.state is S.INDETERMINATE and m.why is not None
        ]
        index = unsure[n % len(unsure)]
        to = self._cancelled_or_timed_out(index)
        self._move(index, to, outcome=self._outcome(index), acknowledged=True)
        record = self.records[index]
        assert record.resolved_late
        assert record.cancel_acknowledged_at == self.now

    @precondition(lambda self: self.records)
    @rule(n=ops)
    def crash(self, n: int) -> None:
        """Startup recovery: an open (requested or running) record becomes indeterminate."""
        index = self._pick(n)
        if self.model[index].state not in UNENDED:
            return  # recovery only reads requested and running records
        self._move(
            index,
            S.INDETERMINATE,
            outcome=OutcomeCode.PROCESS_RESTART,
            acknowledged=False,
            explanation="the process stopped while it was open; termination not confirmed",
        )

    @precondition(lambda self: any(m.state is S.REQUESTED for m in self.model))
    @rule(n=ops)
    def block(self, n: int) -> None:
        waiting = [i for i, m in enumerate(self.model) if m.state is S.REQUESTED]
        index = waiting[n % len(waiting)]
        self._move(
            index,
            S.FAILED,
            outcome=OutcomeCode.BLOCKED_BY_INDETERMINATE,
            acknowledged=True,
            blocked_by="s/0/0/0",
        )
        assert self.records[index].blocked_by == "s/0/0/0"

    @precondition(lambda self: self.records)
    @rule(n=ops, to=targets)
    def illegal_move(self, n: int, to: OpState) -> None:
        index = self._pick(n)
        if (self.model[index].state, to) in ALLOWED:
            return
        before = self.records[index]
        with pytest.raises(IllegalOpTransition):
            advance(before, to, now=self.now + 1.0, acknowledged=True)
        assert self.records[index] == before

    # ------------------------------------------------------------ invariants

    @invariant()
    def records_follow_the_model(self) -> None:
        for record, model in zip(self.records, self.model, strict=True):
            assert record.state is model.state

    @invariant()
    def one_authoritative_ending(self) -> None:
        for record, model in zip(self.records, self.model, strict=True):
            endings = model.endings
            assert len(endings) <= 2
            if len(endings) == 2:
                assert endings[0] is S.INDETERMINATE
                assert endings[1] is not S.INDETERMINATE
            assert record.resolved_late == (len(endings) == 2)
            if record.state in ENDINGS:
                assert endings
                assert endings[-1] is record.state

    @invariant()
    def acknowledgement_matches_the_state(self) -> None:
        for record in self.records:
            if record.state in (S.CANCELLED, S.TIMED_OUT):
                assert record.termination_acknowledged
                assert record.cancel_requested_at is not None
            if record.state is S.INDETERMINATE:
                assert not record.termination_acknowledged
                assert record.cancel_acknowledged_at is None
                assert record.explanation is not None
            if record.cancel_acknowledged_at is not None:
                assert record.termination_acknowledged
                assert record.cancel_requested_at is not None
                assert record.cancel_acknowledged_at >= record.cancel_requested_at

    @invariant()
    def ended_at_exactly_when_ended(self) -> None:
        for record in self.records:
            assert (record.ended_at is None) == (record.state in UNENDED)
            if record.ended_at is not None:
                assert record.ended_at >= record.started_at


def test_op8_op3_operation_lifecycle_machine() -> None:
    run_state_machine_as_test(
        OperationMachine, settings=settings(max_examples=300, stateful_step_count=30)
    )


# ---------------------------------------------------------------- the runner's lifecycle


@dataclass
class _Shell:
    """What a runner would have done with one call's effects."""

    life: OpLife
    durable: list[OperationRecord] = field(default_factory=list)
    told: list[OperationRecord] = field(default_factory=list)
    given: list[ToolResultPart] = field(default_factory=list)
    held: bool = False
    dispatched: bool = False
    exited: bool = False
    deadline_armed: bool = False
    grace_armed: bool = False
    lingering: bool = False
    #: The answer the execute returned while no terminal receipt was decided, if any.
    answered_first: ToolResultPart | None = None
    how: Exit | None = None


_EXITS = st.sampled_from(list(Exit))
_ANSWERS = st.sampled_from(
    [
        ToolResultPart(call_id="c", name="a", output={"wrote": 7}),
        ToolResultPart(call_id="c", name="a", output={"error": "page too big"}, is_error=True),
    ]
)
_OPEN = (Phase.WAITING, Phase.RUNNING, Phase.CANCELLING)


class LifeMachine(RuleBasedStateMachine):
    """``OpLife`` driven by every input in any order a runner can produce; its effects are
    performed by a model shell that checks what a runner relies on."""

    def __init__(self) -> None:
        super().__init__()
        self.shells: list[_Shell] = []
        self.now = 0.0

    def _perform(self, shell: _Shell, effects: Sequence[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Write):
                shell.durable.append(effect.record)
            elif isinstance(effect, RequestCancel):
                assert effect.record.cancel_requested_at is not None
                shell.durable.append(effect.record)
            elif isinstance(effect, Resolve):
                assert shell.lingering
                assert shell.held
                assert effect.held.state is S.INDETERMINATE
                shell.held = False
                shell.durable.append(effect.record)
                shell.told.append(effect.record)
            elif isinstance(effect, Hold):
                assert effect.record.state is S.INDETERMINATE
                shell.held = True
            elif isinstance(effect, Finish):  # the runner writes, then tells, then gives
                shell.durable.append(effect.record)
                shell.told.append(effect.record)
                shell.given.append(effect.result)
            elif isinstance(effect, Arm):
                shell.grace_armed = True
            elif isinstance(effect, Run):
                assert not shell.dispatched
                shell.deadline_armed = True
                shell.dispatched = True
            elif effect is LINGER:
                shell.lingering = True

    def _shell(self, n: int) -> _Shell:
        return self.shells[n % len(self.shells)]

    @rule(running=st.booleans())
    def create(self, running: bool) -> None:
        number = len(self.shells)
        record = requested(
            op_id=f"s/1/1/{number}",
            session="s",
            stream="s/1",
            call_id="c",
            capability=Capability(kind=ToolKind.CLIENT, name="a"),
            target="client:a#0",
            now=self.now,
            deadline_at=self.now + 10.0,
        )
        if running:  # the step's first call: written running at admission
            record = advance(record, S.RUNNING, now=self.now)
        call = ToolCallPart(call_id="c", name="a", args={})
        self.shells.append(_Shell(OpLife(record, call, grace_s=2.0, closing=False)))

    @rule(seconds=st.sampled_from([0.0, 0.5, 2.0]))
    def tick(self, seconds: float) -> None:
        self.now += seconds

    @precondition(lambda self: self.shells)
    @rule(n=ops)
    def start(self, n: int) -> None:
        shell = self._shell(n)
        self._perform(shell, shell.life.start(self.now))

    @precondition(lambda self: any(s.dispatched and not s.exited for s in self.shells))
    @rule(n=ops, how=_EXITS, answer=_ANSWERS)
    def execute_ends(self, n: int, how: Exit, answer: ToolResultPart) -> None:
        live = [s for s in self.shells if s.dispatched and not s.exited]
        shell = live[n % len(live)]
        result: ToolResultPart | None = answer if how is Exit.RETURNED else None
        if how in (Exit.RAISED, Exit.UNAVAILABLE):
            result = ToolResultPart(call_id="c", name="a", output={"error": "E: x"}, is_error=True)
        if shell.life.phase in (Phase.RUNNING, Phase.CANCELLING):
            shell.how = how
            if how is Exit.RETURNED:
                shell.answered_first = answer
        shell.exited = True
        self._perform(shell, shell.life.exit(self.now, how, result))

    @precondition(lambda self: any(s.dispatched and not s.exited for s in self.shells))
    @rule(n=ops, answer=_ANSWERS)
    def completion_recorded(self, n: int, answer: ToolResultPart) -> None:
        live = [s for s in self.shells if s.dispatched and not s.exited]
        shell = live[n % len(live)]
        if shell.life.phase in (Phase.RUNNING, Phase.CANCELLING):
            shell.answered_first = answer
            shell.how = Exit.RETURNED
        self._perform(shell, shell.life.recorded(self.now, answer))

    @precondition(lambda self: any(s.deadline_armed for s in self.shells))
    @rule(n=ops)
    def deadline(self, n: int) -> None:
        armed = [s for s in self.shells if s.deadline_armed]
        shell = armed[n % len(armed)]
        self._perform(shell, shell.life.deadline(self.now))

    @precondition(lambda self: self.shells)
    @rule(n=ops, why=whys)
    def cancel(self, n: int, why: CancelWhy) -> None:
        shell = self._shell(n)
        self._perform(shell, shell.life.cancel(self.now, why))

    @precondition(lambda self: any(s.grace_armed for s in self.shells))
    @rule(n=ops)
    def grace_over(self, n: int) -> None:
        armed = [s for s in self.shells if s.grace_armed]
        shell = armed[n % len(armed)]
        self._perform(shell, shell.life.grace_over(self.now))

    @precondition(lambda self: self.shells)
    @rule(n=ops)
    def drop(self, n: int) -> None:
        shell = self._shell(n)
        self._perform(shell, shell.life.drop(self.now))

    @precondition(lambda self: self.shells)
    @rule(n=ops)
    def refuse(self, n: int) -> None:
        shell = self._shell(n)
        refused = ToolResultPart(call_id="c", name="a", output={"error": "x"}, is_error=True)
        effects = shell.life.refuse(self.now, OutcomeCode.INVALID_ARGUMENTS, "not run", refused)
        self._perform(shell, effects)

    @precondition(lambda self: self.shells)
    @rule(n=ops)
    def shutdown(self, n: int) -> None:
        shell = self._shell(n)
        self._perform(shell, shell.life.shutdown())

    # ------------------------------------------------------------ invariants

    @invariant()
    def one_terminal_receipt(self) -> None:
        for shell in self.shells:
            endings = shell.told
            assert len(endings) <= 2
            if len(endings) == 2:
                assert endings[0].state is S.INDETERMINATE
                assert endings[1].resolved_late
                assert endings[1].state is not S.INDETERMINATE
            for record in shell.durable:
                assert record.op_id == shell.life.record.op_id
            for told in shell.told:  # every receipt told was durable first
                assert any(r is told for r in shell.durable)

    @invariant()
    def never_a_result_dropped(self) -> None:
        for shell in self.shells:
            assert len(shell.given) <= 1  # one result per call
            if shell.life.phase not in _OPEN:
                assert len(shell.given) == 1
                assert shell.told  # the model learns it with a durable receipt
            if shell.given:
                assert shell.told

    @invariant()
    def honest_outcomes(self) -> None:
        for shell in self.shells:
            if not shell.told:
                continue
            first = shell.told[0]
            if shell.answered_first is not None and shell.how is Exit.RETURNED:
                # An answer before the terminal receipt is the answer, whatever was requested.
                assert shell.given == [shell.answered_first]
                if shell.answered_first.is_error:
                    assert (first.state, first.outcome_code) == (S.FAILED, "capability_error")
                else:
                    assert first.state is S.COMPLETED
                    assert first.outcome_code in ("ok", "completion_signal_lost")
            elif shell.how is Exit.LOST:
                assert (first.state, first.outcome_code) == (S.INDETERMINATE, "transport_lost")
                assert shell.held
            elif shell.how is Exit.UNAVAILABLE:
                assert (first.state, first.outcome_code) == (S.FAILED, "unavailable")
            if first.state in (S.CANCELLED, S.TIMED_OUT):
                assert first.termination_acknowledged
            if first.state is S.INDETERMINATE:
                assert not first.termination_acknowledged
                assert shell.held or len(shell.told) == 2


def test_op8_op3_the_runners_lifecycle_machine() -> None:
    run_state_machine_as_test(
        LifeMachine, settings=settings(max_examples=300, stateful_step_count=40)
    )
