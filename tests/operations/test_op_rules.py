"""Tool operations as durable receipts: rules OP-1 to OP-12 (``docs/operations.md``).

Each test drives a real Engine on virtual time (deadline 10 s, acknowledgement interval 2 s,
fixed for all of them) and asserts what would change if its rule were removed: the
receipts in the store, the order in which they were written, the trace events, what the tool
saw and what the model was given. Tests marked with the ``backend`` fixture run on a
MemoryStore and on a SqliteStore file. Restart recovery (OP-7, OP-10) is in
``test_op_recovery.py``; the nested MCP layer (OP-3) in ``test_op_mcp.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import anyio
import msgspec
import pytest

from agent_session import Engine, EngineConfig
from agent_session.harness.trace import event_name as tag
from agent_session.harness.virtual_time import VirtualTime
from persistence import Boundary, Committed, MemoryStore, OperationRecord, OpState
from stream_manager import (
    Capability,
    OpBlocked,
    OpCancelRequested,
    OperationStarted,
    OutcomeCode,
    Persisted,
    ReceiptWritten,
    ScriptedModel,
    ScriptStep,
    ScriptToolCall,
    StreamEnded,
    ToolCallPart,
    ToolContext,
    ToolKind,
    VirtualClock,
)
from stream_manager._op_states import UNCONFIRMED
from tests import store_kit
from tests.operations.conftest import Backend
from tests.operations.support import (
    CONFIG,
    DEADLINE_S,
    GRACE_S,
    LiveModel,
    LiveStep,
    OpRig,
    OpTool,
    call,
    last_results,
    odd,
    op_id,
    op_rig,
    provider_call,
    step,
    text,
)

A1 = op_id(1, 1, 0)  # the first client call of the first step of the first stream
B1 = op_id(1, 1, 1)  # its sibling


def op_events(r: OpRig, op: str) -> list[str]:
    """The names of the trace events about ``op``, in order."""
    return [tag(e) for e in r.events if getattr(e, "op", None) == op]


def receipt_events(r: OpRig, op: str) -> list[ReceiptWritten]:
    return [e for e in r.of(ReceiptWritten) if e.op == op]


async def durable(backend: Backend, r: OpRig, op: str) -> OperationRecord | None:
    """``op``'s receipt as another connection sees it (counted as a store call)."""

    async def read() -> OperationRecord | None:
        async with backend.reader(r.store) as view:
            return await store_kit.receipt(view, op)

    return await r.store.track(read())


def error_of(output: object) -> Mapping[str, object]:
    assert isinstance(output, Mapping), output
    return output


# ---------------------------------------------------------------- OP-1


async def test_op1_requested_is_durable_before_execute_and_running_starts_after_the_lock(
    backend: Backend,
) -> None:
    seen: dict[str, tuple[OperationRecord | None, OperationRecord | None]] = {}
    rig: list[OpRig] = []

    async def look(tool: ToolCallPart, context: ToolContext) -> None:
        seen[context.op_id] = (
            await durable(backend, rig[0], A1),
            await durable(backend, rig[0], B1),
        )

    a = OpTool("a", duration_s=1.0, on_start=look)
    b = OpTool("b", duration_s=1.0, on_start=look)
    async with op_rig(
        {"M": [step(call("a", n=1), call("b", n=2)), text()]},
        tools=[a, b],
        store=backend.make(),
    ) as r:
        rig.append(r)
        r.session().send("go")
        await r.settle()

        # While a runs, its receipt says running and b's (behind the lock) says requested.
        a_seen, b_seen = seen[A1]
        assert a_seen is not None
        assert b_seen is not None
        assert a_seen.state is OpState.RUNNING
        assert (a_seen.started_at, a_seen.deadline_at) == (0.0, DEADLINE_S)
        assert b_seen.state is OpState.REQUESTED
        assert b_seen.deadline_at == b_seen.started_at + DEADLINE_S
        # b runs only once a's receipt is terminal.
        a_then, b_then = seen[B1]
        assert a_then is not None
        assert b_then is not None
        assert a_then.state is OpState.COMPLETED
        assert b_then.state is OpState.RUNNING
        assert b_then.started_at == 0.0  # requested with the step, before anything ran

        # The step's receipts are one write before anything runs; a, dispatched at once, is
        # written running in it (requested and running together); b is running only later.
        assert [(w.op_id, w.state.value) for w in r.store.writes] == [
            (A1, "running"),
            (B1, "requested"),
            (A1, "completed"),
            (B1, "running"),
            (B1, "completed"),
        ]
        assert r.store.write_calls[0] == (A1, B1)
        # The durable write (persisted) precedes op-start, which precedes the execute.
        names = [
            tag(e)
            for e in r.events
            if getattr(e, "op", None) == A1 or (isinstance(e, Persisted) and e.id == A1)
        ]
        assert names[:3] == ["persisted", "op-start", "persisted"]
        start = r.of(OperationStarted)[0]
        assert (start.op, start.tool, start.stream, start.deadline) == (A1, "a", "s1/1", 10_000)
        assert [w.ended_at for w in r.store.writes if w.op_id == A1] == [None, 1.0]


# ---------------------------------------------------------------- OP-2


async def test_op2_deadline_acknowledged_is_timed_out_and_the_model_gets_a_timeout_result() -> None:
    a = OpTool("a", hang=True, ack_delay_s=0.5)
    async with op_rig({"M": [step(call("a")), text("after the timeout")]}, tools=[a]) as r:
        r.session().send("go")
        await r.settle()

        receipt = await r.receipt(A1)
        assert receipt.state is OpState.TIMED_OUT
        assert receipt.termination_acknowledged
        assert receipt.outcome_code == OutcomeCode.TIMEOUT
        assert receipt.cancel_reason == "deadline"
        assert receipt.cancel_requested_at == DEADLINE_S
        assert receipt.cancel_acknowledged_at == receipt.ended_at == DEADLINE_S + 0.5
        assert a.cancels == [DEADLINE_S]
        [result] = last_results(r.scripted())
        assert result.is_error
        assert error_of(result.output)["error"] == "timeout"
        assert error_of(result.output)["op"] == A1
        # The step settled and the loop went on to the next model step.
        assert r.scripted().steps_played == 2
        assert [e.finish for e in r.of(StreamEnded)] == ["stop"]
        assert r.session().statistics().settled
        assert [e.why for e in r.of(OpCancelRequested)] == ["deadline"]


async def test_op2_deadline_unacknowledged_is_indeterminate_after_the_grace_interval() -> None:
    a = OpTool("a", hang=True, on_cancel="ignore")
    async with op_rig({"M": [step(call("a")), text("after the timeout")]}, tools=[a]) as r:
        r.session().send("go")
        await r.run_until(DEADLINE_S + GRACE_S - 0.01)
        pending = await r.receipt(A1)
        assert pending.state is OpState.RUNNING
        assert pending.cancel_requested_at == DEADLINE_S
        await r.settle()

        receipt = await r.receipt(A1)
        assert receipt.state is OpState.INDETERMINATE
        assert not receipt.termination_acknowledged
        assert receipt.outcome_code == OutcomeCode.TIMEOUT
        assert receipt.explanation == UNCONFIRMED
        assert receipt.ended_at == DEADLINE_S + GRACE_S
        assert receipt.cancel_acknowledged_at is None
        [result] = last_results(r.scripted())
        assert result.is_error
        assert error_of(result.output)["error"] == "timeout"
        assert [e.finish for e in r.of(StreamEnded)] == ["stop"]
        assert r.session().statistics().settled
        assert a.ends == []  # it still runs: nobody claims it stopped


async def test_op2_a_tools_own_deadline_bounds_its_call() -> None:
    a = OpTool("a", hang=True, deadline_s=3.0)
    async with op_rig({"M": [step(call("a")), text()]}, tools=[a]) as r:
        r.session().send("go")
        await r.settle()
        receipt = await r.receipt(A1)
        assert receipt.deadline_at == 3.0
        assert r.of(OperationStarted)[0].deadline == 3_000
        assert receipt.state is OpState.TIMED_OUT
        assert receipt.cancel_requested_at == receipt.ended_at == 3.0


# ---------------------------------------------------------------- OP-3


async def test_op3_stop_during_a_client_tool_acknowledged_is_cancelled(backend: Backend) -> None:
    a = OpTool("a", hang=True, ack_delay_s=0.1)
    async with op_rig({"M": [step(call("a")), text()]}, tools=[a], store=backend.make()) as r:
        r.session().send("go")
        await r.run_until(1.0)
        r.session().stop()
        await r.settle()

        receipt = await r.receipt(A1)
        assert receipt.state is OpState.CANCELLED
        assert receipt.termination_acknowledged
        assert receipt.outcome_code == OutcomeCode.CANCELLED
        assert receipt.cancel_reason == "user"
        assert receipt.cancel_requested_at == 1.0
        assert receipt.cancel_acknowledged_at == receipt.ended_at == 1.1
        assert a.cancels == [1.0]
        # op-start < op-cancel-requested < one receipt
        assert op_events(r, A1) == ["op-start", "op-cancel-requested", "receipt"]
        [event] = receipt_events(r, A1)
        assert (event.state, event.acknowledged, event.tool) == ("cancelled", True, "a")
        assert [e.why for e in r.of(OpCancelRequested)] == ["user"]
        assert r.store.states_of(A1) == ["running", "running", "cancelled"]


async def test_op3_stop_unacknowledged_is_indeterminate_after_exactly_the_grace_interval() -> None:
    a = OpTool("a", hang=True, on_cancel="ignore")
    async with op_rig({"M": [step(call("a")), text()]}, tools=[a]) as r:
        r.session().send("go")
        await r.run_until(1.0)
        r.session().stop()
        await r.run_until(1.0 + GRACE_S - 0.001)
        waiting = await r.receipt(A1)
        assert waiting.state is OpState.RUNNING
        assert waiting.cancel_requested_at == 1.0
        await r.settle()

        receipt = await r.receipt(A1)
        assert receipt.state is OpState.INDETERMINATE
        assert not receipt.termination_acknowledged
        assert receipt.explanation == "cancellation requested, termination not confirmed"
        assert receipt.outcome_code == OutcomeCode.CANCELLED
        assert receipt.ended_at == 1.0 + GRACE_S
        assert receipt.cancel_acknowledged_at is None
        assert op_events(r, A1) == ["op-start", "op-cancel-requested", "receipt"]
        [event] = receipt_events(r, A1)
        assert (event.state, event.acknowledged) == ("indeterminate", False)


async def test_op3_a_layer_that_reports_termination_unconfirmed_is_indeterminate() -> None:
    a = OpTool("a", hang=True, on_cancel="unconfirmed", ack_delay_s=0.5)
    async with op_rig({"M": [step(call("a")), text()]}, tools=[a]) as r:
        r.session().send("go")
        await r.run_until(1.0)
        r.session().stop()
        await r.settle()

        receipt = await r.receipt(A1)
        assert receipt.state is OpState.INDETERMINATE
        assert not receipt.termination_acknowledged
        assert receipt.explanation == UNCONFIRMED
        assert receipt.ended_at == 1.5  # when the layer answered, not the grace interval
        assert not receipt.resolved_late  # its end was no acknowledgement
        assert len(receipt_events(r, A1)) == 1


async def test_op3_the_cancel_request_is_durable_before_termination_is_awaited(
    backend: Backend,
) -> None:
    seen: list[OperationRecord | None] = []
    events_then: list[str] = []
    rig: list[OpRig] = []

    async def on_cancelled(tool: ToolCallPart, context: ToolContext) -> None:
        events_then.extend(op_events(rig[0], context.op_id))
        seen.append(await durable(backend, rig[0], context.op_id))

    a = OpTool("a", hang=True, on_cancelled=on_cancelled, ack_delay_s=0.1)
    async with op_rig({"M": [step(call("a")), text()]}, tools=[a], store=backend.make()) as r:
        rig.append(r)
        r.session().send("go")
        await r.run_until(1.0)
        r.session().stop()
        await r.settle()

        [then] = seen
        assert then is not None
        assert then.state is OpState.RUNNING  # still running: only the request is recorded
        assert then.cancel_requested_at == 1.0
        assert then.cancel_reason == "user"
        assert then.cancel_acknowledged_at is None
        assert events_then == ["op-start", "op-cancel-requested"]
        assert (await r.receipt(A1)).state is OpState.CANCELLED


async def test_op3_a_stop_records_every_open_operations_cancel_request_before_awaiting_any(
    backend: Backend,
) -> None:
    """OP-3 for a step's waiting sibling: the stop's request is durable at once for it too.

    ``a`` ignores its cancellation, so awaiting its termination takes the whole grace interval;
    ``b`` waits behind it on the sequential lock (SM-6).
    """
    seen: list[OperationRecord | None] = []
    rig: list[OpRig] = []

    async def on_cancelled(tool: ToolCallPart, context: ToolContext) -> None:
        seen.append(await durable(backend, rig[0], B1))

    a = OpTool("a", hang=True, on_cancel="ignore", on_cancelled=on_cancelled)
    b = OpTool("b")
    async with op_rig(
        {"M": [step(call("a"), call("b")), text()]}, tools=[a, b], store=backend.make()
    ) as r:
        rig.append(r)
        r.session().send("go")
        await r.run_until(1.0)
        r.session().stop()
        await r.settle()

        assert (await r.receipt(A1)).state is OpState.INDETERMINATE
        sibling = await r.receipt(B1)
        assert sibling.state is OpState.CANCELLED
        assert b.calls == []
        # The stop came at 1.0; b's request must not wait for a's (unconfirmed) termination.
        assert sibling.cancel_requested_at == 1.0
        [then] = seen
        assert then is not None
        assert then.cancel_requested_at == 1.0


@pytest.mark.parametrize("how", ["hard_stop", "dispose"])
async def test_op3_hard_stops_and_disposal_cancel_running_operations(how: str) -> None:
    a = OpTool("a", hang=True, ack_delay_s=0.2)
    async with op_rig({"M": [step(call("a")), text()]}, tools=[a]) as r:
        r.session().send("go")
        await r.run_until(1.0)
        if how == "hard_stop":
            r.session().hard_stop()
            await r.settle()
        else:
            async with anyio.create_task_group() as tg:  # dispose waits for the stream's end
                tg.start_soon(r.session().dispose)
                await r.settle()
        receipt = await r.receipt(A1)
        assert receipt.state is OpState.CANCELLED
        assert receipt.termination_acknowledged
        assert receipt.cancel_reason == "stream-stopped"
        assert receipt.cancel_acknowledged_at == 1.2
        assert a.cancels == [1.0]


async def test_op3_engine_shutdown_cancels_running_operations() -> None:
    a = OpTool("a", hang=True)
    async with op_rig({"M": [step(call("a")), text()]}, tools=[a]) as r:
        r.session().send("go")
        await r.run_until(1.0)
    assert a.cancels == [1.0]
    final = r.store.writes[-1]
    assert (final.op_id, final.state) == (A1, OpState.CANCELLED)
    assert final.cancel_reason == "shutdown"
    assert final.termination_acknowledged


# ---------------------------------------------------------------- OP-4


@pytest.mark.parametrize(("how", "why"), [("stop", "user"), ("hard_stop", "stream-stopped")])
async def test_op4_a_call_waiting_behind_a_sibling_is_cancelled_and_never_runs(
    backend: Backend, how: str, why: str
) -> None:
    a = OpTool("a", hang=True, ack_delay_s=0.1)
    b = OpTool("b")
    async with op_rig(
        {"M": [step(call("a"), call("b")), text()]}, tools=[a, b], store=backend.make()
    ) as r:
        r.session().send("go")
        await r.run_until(1.0)
        assert (await r.receipt(B1)).state is OpState.REQUESTED
        r.session().stop() if how == "stop" else r.session().hard_stop()
        await r.settle()
        await r.run_until(100.0)  # nothing starts it afterwards

        receipt = await r.receipt(B1)
        assert receipt.state is OpState.CANCELLED
        assert receipt.termination_acknowledged
        assert receipt.cancel_requested_at is not None
        assert receipt.cancel_reason == why
        assert receipt.outcome_code == OutcomeCode.CANCELLED
        # never running; the second write is the durable cancel request (OP-3)
        assert r.store.states_of(B1) == ["requested", "requested", "cancelled"]
        assert b.calls == []
        assert op_events(r, B1) == ["op-start", "op-cancel-requested", "receipt"]
        [event] = receipt_events(r, B1)
        assert (event.state, event.acknowledged) == ("cancelled", True)
        assert (await r.receipt(A1)).state is OpState.CANCELLED


class _StopDuringAdmission(MemoryStore):
    """A store that runs ``hook`` the moment a step's receipts are being written."""

    hook: Callable[[], object] | None = None

    async def commit(self, session: str, boundary: Boundary, *, owner: str | None) -> Committed:
        if len(boundary.operations) > 1:  # a step's receipts: one write
            hook, self.hook = self.hook, None
            if hook is not None:
                hook()
            await anyio.lowlevel.checkpoint()  # the stop lands here, before the write
        return await super().commit(session, boundary, owner=owner)


@pytest.mark.parametrize("how", ["stop", "hard_stop"])
async def test_op4_a_stop_during_the_admission_write_runs_nothing_and_traces_in_order(
    how: str,
) -> None:
    a, b = OpTool("a"), OpTool("b")
    store = _StopDuringAdmission()
    script = [step(call("a", path="/one"), call("b", path="/two")), text()]
    async with op_rig({"M": script}, tools=[a, b], store=store) as r:
        store.hook = r.session().stop if how == "stop" else r.session().hard_stop
        r.session().send("go")
        await r.settle()
        assert a.calls == b.calls == []
        assert r.store.states_of(A1)[1:] == ["requested", "cancelled"]  # never said running
        for op in (A1, B1):
            receipt = await r.receipt(op)
            assert (receipt.state, receipt.termination_acknowledged) == (OpState.CANCELLED, True)
            # Told in docs/trace.md's order: the operation exists, its stop is asked, it ends.
            assert [n for n in op_events(r, op) if n != "persisted"] == [
                "op-start",
                "op-cancel-requested",
                "receipt",
            ]


# ---------------------------------------------------------------- OP-5


@pytest.mark.parametrize("stuck", [False, True], ids=["cancellable", "never-ends"])
async def test_op5_a_lost_completion_signal_delivers_the_recorded_result(
    backend: Backend, stuck: bool
) -> None:
    a = OpTool("a", duration_s=0.5, output={"rows": 3}, lose_completion=True, stuck=stuck)
    async with op_rig({"M": [step(call("a")), text()]}, tools=[a], store=backend.make()) as r:
        r.session().send("go")
        await r.settle()

        receipt = await r.receipt(A1)
        assert receipt.state is OpState.COMPLETED
        assert receipt.outcome_code == OutcomeCode.COMPLETION_SIGNAL_LOST
        assert receipt.ended_at == 0.5  # at the record, well before the 10 s deadline
        [result] = last_results(r.scripted())
        assert not result.is_error
        assert result.output == {"rows": 3}
        assert [e.finish for e in r.of(StreamEnded)] == ["stop"]
        assert r.clock.now() == 0.5
        assert len(receipt_events(r, A1)) == 1


# ---------------------------------------------------------------- OP-6


@pytest.mark.parametrize("stuck", [False, True], ids=["cancellable", "never-ends"])
async def test_op6_a_missing_completion_event_does_not_wedge_the_next_call(stuck: bool) -> None:
    a = OpTool("a", duration_s=0.5, lose_completion=True, stuck=stuck)
    b = OpTool("b", duration_s=0.25)
    started: list[float] = []

    async def note(tool: ToolCallPart, context: ToolContext) -> None:
        started.append(b.clock.now())

    b.on_start = note
    async with op_rig({"M": [step(call("a")), step(call("b")), text()]}, tools=[a, b]) as r:
        r.session().send("go")
        await r.settle()

        second = await r.receipt(op_id(1, 2, 0))
        assert second.state is OpState.COMPLETED
        assert second.outcome_code == OutcomeCode.OK
        assert started == [0.5]  # it ran at once, not after a deadline
        assert second.ended_at == 0.75
        assert [e.finish for e in r.of(StreamEnded)] == ["stop"]
        assert r.session().statistics().settled


async def test_op6_an_indeterminate_call_does_not_wedge_the_next_call() -> None:
    a = OpTool("a", hang=True, on_cancel="ignore")
    b = OpTool("b", duration_s=0.25)
    async with op_rig({"M": [step(call("a")), step(call("b")), text()]}, tools=[a, b]) as r:
        r.session().send("go")
        await r.settle()

        assert (await r.receipt(A1)).state is OpState.INDETERMINATE
        second = await r.receipt(op_id(1, 2, 0))
        assert second.state is OpState.COMPLETED
        assert second.started_at == DEADLINE_S + GRACE_S
        assert second.ended_at == DEADLINE_S + GRACE_S + 0.25
        assert len(b.calls) == 1
        assert r.session().statistics().settled


# ---------------------------------------------------------------- OP-8


async def test_op8_a_late_acknowledgement_resolves_indeterminate_as_resolved_late() -> None:
    a = OpTool("a", hang=True, ack_delay_s=GRACE_S + 1.0)
    script = [
        step(call("a", path="/x")),  # stopped: the stream ends here
        step(odd("a", {"hang": False}, path="/x")),
        text("again"),
    ]
    async with op_rig({"M": script}, tools=[a]) as r:
        r.session().send("go")
        await r.run_until(1.0)
        r.session().stop()
        await r.run_until(1.0 + GRACE_S + 0.5)
        first = await r.receipt(A1)
        assert first.state is OpState.INDETERMINATE
        assert not first.resolved_late
        await r.settle()

        receipt = await r.receipt(A1)
        assert receipt.state is OpState.CANCELLED
        assert receipt.resolved_late
        assert receipt.termination_acknowledged
        assert receipt.cancel_acknowledged_at == receipt.ended_at == 1.0 + GRACE_S + 1.0
        assert [(e.state, e.acknowledged) for e in receipt_events(r, A1)] == [
            ("indeterminate", False),
            ("cancelled", True),
        ]
        # Resolved, it no longer holds the overlap guard: the same call runs again.
        r.session().send("again")
        await r.settle()
        again = await r.receipt(op_id(2, 1, 0))
        assert again.state is OpState.COMPLETED
        assert len(a.calls) == 2


async def test_op8_a_late_completion_resolves_a_timed_out_operation_as_completed() -> None:
    a = OpTool("a", hang=True, on_cancel="finish", ack_delay_s=GRACE_S + 1.0)
    async with op_rig({"M": [step(call("a")), text()]}, tools=[a]) as r:
        r.session().send("go")
        await r.settle()
        receipt = await r.receipt(A1)
        assert receipt.state is OpState.COMPLETED
        assert receipt.resolved_late
        assert receipt.ended_at == DEADLINE_S + GRACE_S + 1.0
        assert [e.state for e in receipt_events(r, A1)] == ["indeterminate", "completed"]
        [result] = last_results(r.scripted())
        assert error_of(result.output)["error"] == "timeout"  # the model was not kept waiting


async def test_op8_silence_never_resolves_an_indeterminate_operation() -> None:
    a = OpTool("a", hang=True, on_cancel="ignore")
    async with op_rig({"M": [step(call("a")), text()]}, tools=[a]) as r:
        r.session().send("go")
        await r.run_until(1.0)
        r.session().stop()
        await r.settle()
        await r.run_until(10_000.0)
        receipt = await r.receipt(A1)
        assert receipt.state is OpState.INDETERMINATE
        assert not receipt.resolved_late
        assert not receipt.termination_acknowledged
        assert [e.state for e in receipt_events(r, A1)] == ["indeterminate"]


async def test_op8_a_late_unconfirmed_end_is_no_resolution() -> None:
    # The layer below answers after the grace interval, but only to say it cannot confirm the
    # stop: the receipt already says so; nothing is resolved, nothing is written twice.
    a = OpTool("a", hang=True, on_cancel="unconfirmed", ack_delay_s=GRACE_S + 3.0)
    async with op_rig({"M": [step(call("a", path="/late")), text("moved on")]}, tools=[a]) as r:
        r.session().send("go")
        await r.settle()
        assert a.ends == [DEADLINE_S + GRACE_S + 3.0]  # it did end, after the receipt
        receipt = await r.receipt(A1)
        assert receipt.state is OpState.INDETERMINATE
        assert not receipt.resolved_late
        assert [(e.state, e.resolved_late) for e in receipt_events(r, A1)] == [
            ("indeterminate", False)
        ]


async def test_op8_a_late_acknowledgement_is_traced_as_resolved_late() -> None:
    a = OpTool("a", hang=True, ack_delay_s=GRACE_S + 0.5)
    async with op_rig({"M": [step(call("a", path="/slow")), text("moved on")]}, tools=[a]) as r:
        r.session().send("go")
        await r.settle()
        assert [(e.state, e.acknowledged, e.resolved_late) for e in receipt_events(r, A1)] == [
            ("indeterminate", False, False),
            ("timed_out", True, True),
        ]


async def test_op8_an_engine_shutdown_writes_no_acknowledgement_it_did_not_receive() -> None:
    """Shut down while a call ignores its cancellation: the receipt stays indeterminate, says
    why, and the tool ending after the engine has gone is no acknowledgement."""
    clock = VirtualClock()
    a = OpTool("a", hang=True, on_cancel="ignore", clock=clock)
    store = MemoryStore()
    events: list[object] = []
    model = ScriptedModel("M", [step(call("a", path="/stuck")), text()], clock=clock)
    engine = Engine(
        store=store,
        models={"M": model},
        tools={"a": a},
        clock=clock,
        config=CONFIG,
        observers=[events.append],
    )
    stop, gone = anyio.Event(), anyio.Event()

    async def host() -> None:
        async with engine:
            await engine.open_session("s1", model="M")
            engine.session("s1").send("go")
            await stop.wait()
        gone.set()

    time = VirtualTime(clock)
    async with anyio.create_task_group() as group:
        group.start_soon(host)
        await time.run_until(1.0)
        assert a.calls
        assert not a.cancels
        stop.set()  # the engine shuts down: the stream stops, the call is asked to stop
        await time.run_until(DEADLINE_S)  # the grace interval passes on the clock
        assert not gone.is_set()  # the engine still waits for the call's own task ...
        a.release()  # ... which ends only now, the engine having given up on it
        await gone.wait()
    async with store:  # the engine closed it; reopen to read what it left
        receipt = await store_kit.receipt(store, A1)
    assert receipt is not None
    assert receipt.state is OpState.INDETERMINATE
    assert receipt.cancel_reason == "shutdown"
    assert not receipt.termination_acknowledged
    assert not receipt.resolved_late
    assert receipt.explanation is not None
    assert "shut down" in receipt.explanation
    receipts = [e for e in events if isinstance(e, ReceiptWritten) and e.op == A1]
    assert [(e.state, e.acknowledged) for e in receipts] == [("indeterminate", False)]


# ---------------------------------------------------------------- OP-9


def _indeterminate_then(*calls: ScriptToolCall) -> dict[str, list[ScriptStep]]:
    """A first step whose call times out unacknowledged, then a step making ``calls``."""
    return {
        "M": [
            step(odd("a", {"hang": True, "on_cancel": "ignore"}, path="/etc/x")),
            step(*calls),
            text(),
        ]
    }


async def test_op9_a_second_call_on_an_indeterminate_target_is_blocked(backend: Backend) -> None:
    a = OpTool("a")
    second = op_id(1, 2, 0)
    other = op_id(1, 2, 1)
    script = _indeterminate_then(call("a", path="/etc/x"), call("a", path="/etc/y"))
    async with op_rig(script, tools=[a], store=backend.make()) as r:
        r.session().send("go")
        await r.settle()

        assert (await r.receipt(A1)).state is OpState.INDETERMINATE
        blocked = await r.receipt(second)
        assert blocked.state is OpState.FAILED
        assert blocked.outcome_code == OutcomeCode.BLOCKED_BY_INDETERMINATE
        assert blocked.blocked_by == A1
        assert r.store.states_of(second) == ["failed"]  # nothing requested, nothing ran
        [event] = r.of(OpBlocked)
        assert (event.op, event.tool, event.blocked_by) == (second, "a", A1)
        assert "op-start" not in op_events(r, second)
        first_result, other_result = last_results(r.scripted())
        assert first_result.is_error
        assert error_of(first_result.output) == {
            "error": "blocked_by_indeterminate",
            "blocked_by": A1,
        }
        # The call with other arguments is not blocked; the blocked one never executed.
        assert not other_result.is_error
        assert (await r.receipt(other)).state is OpState.COMPLETED
        assert [dict(c.args) for c in a.calls] == [{"path": "/etc/x"}, {"path": "/etc/y"}]


async def test_op9_policy_session_blocks_any_call_while_one_is_indeterminate() -> None:
    a, b = OpTool("a"), OpTool("b")
    config = EngineConfig(
        max_stream_steps=8,
        tool_deadline_s=DEADLINE_S,
        cancel_grace_s=GRACE_S,
        overlap_policy="session",
    )
    script = _indeterminate_then(call("b", q=1))
    async with op_rig(script, tools=[a, b], config=config) as r:
        r.session().send("go")
        await r.settle()
        blocked = await r.receipt(op_id(1, 2, 0))
        assert blocked.outcome_code == OutcomeCode.BLOCKED_BY_INDETERMINATE
        assert blocked.blocked_by == A1
        assert b.calls == []


async def test_op9_policy_warn_blocks_nothing(caplog: pytest.LogCaptureFixture) -> None:
    a = OpTool("a")
    config = EngineConfig(
        max_stream_steps=8,
        tool_deadline_s=DEADLINE_S,
        cancel_grace_s=GRACE_S,
        overlap_policy="warn",
    )
    script = _indeterminate_then(call("a", path="/etc/x"))
    async with op_rig(script, tools=[a], config=config) as r:
        r.session().send("go")
        await r.settle()
        again = await r.receipt(op_id(1, 2, 0))
        assert again.state is OpState.COMPLETED
        assert r.of(OpBlocked) == []
        assert len(a.calls) == 2
        # ... but it says so: the run goes ahead beside an operation nobody could confirm.
        [warning] = [rec for rec in caplog.records if rec.name == "turnkeeper.operations"]
        assert op_id(1, 1, 0) in warning.getMessage()
        assert op_id(1, 2, 0) in warning.getMessage()


# ---------------------------------------------------------------- OP-11

SECRETS = (
    "sk-live-ABC123",
    "Bearer eyJhbGciOiJIUzI1NiJ9",
    "password=hunter2",
    "sessionid=c0ffee42",
)
#: Fragments that must not survive either (a secret split or re-encoded would still leak them).
FRAGMENTS = ("ABC123", "eyJhbGciOi", "hunter2", "c0ffee42")
SECRET_ARGS: dict[str, object] = {
    "api_key": SECRETS[0],
    "headers": {"Authorization": SECRETS[1]},
    "body": SECRETS[2],
    "cookie": SECRETS[3],
}


async def test_op11_receipts_and_trace_hold_no_planted_secrets(backend: Backend) -> None:
    leak = " ".join(SECRETS)
    ok = OpTool("fetch", output={"page": leak})
    raising = OpTool("login", raises=f"auth failed for {leak}")
    failing = OpTool("render", fail=f"render failed with {leak}")
    hanging = OpTool("curl", hang=True, on_cancel="ignore")
    script = [
        step(
            call("fetch", **SECRET_ARGS),
            call("login", **SECRET_ARGS),
            call("render", **SECRET_ARGS),
            call("curl", **SECRET_ARGS),
        ),
        step(call("curl", **SECRET_ARGS)),  # blocked by the indeterminate one
        text(),
    ]
    async with op_rig(
        {"M": script}, tools=[ok, raising, failing, hanging], store=backend.make()
    ) as r:
        r.session().send("go")
        await r.settle()

        records = await r.receipts()
        assert {rec.outcome_code for rec in records} == {
            "ok",
            "tool_error",
            "capability_error",
            "timeout",
            "blocked_by_indeterminate",
        }
        # The secrets did flow through the engine (the model saw them) ...
        seen_by_model = b"".join(
            msgspec_json(m) for req in r.scripted().requests for m in req.messages
        )
        assert all(s.encode() in seen_by_model for s in SECRETS)
        # ... but no receipt, no trace event and no target holds any of them.
        for blob in [msgspec_json(rec) for rec in records] + [msgspec_json(e) for e in r.events]:
            for secret in (*SECRETS, *FRAGMENTS):
                assert secret.encode() not in blob, (secret, blob)
        for rec in records:
            assert rec.target.startswith(rec.capability.text + "#")
            assert all(fragment not in rec.target for fragment in FRAGMENTS)
        # The target is a digest: same arguments, same target (for the guard), never the args.
        curl = [rec for rec in records if rec.capability == Capability(ToolKind.CLIENT, "curl")]
        assert len({rec.target for rec in curl}) == 1


def msgspec_json(value: object) -> bytes:
    return msgspec.json.encode(value)


# ---------------------------------------------------------------- OP-12


async def test_op12_outcome_codes_distinguish_the_layer_that_ended_the_operation() -> None:
    a = OpTool("a")
    provider_model = LiveModel("P", [LiveStep((provider_call("p0", q="x"),), then="hang")])
    script = [
        # stream 1: raised, capability error, ok; then a timeout nobody acknowledges
        step(
            odd("a", {"raises": "boom"}, n=1),
            odd("a", {"fail": "the page would not render"}, n=2),
            call("a", n=3),
            odd("a", {"lose_completion": True}, n=6),
        ),
        step(odd("a", {"hang": True, "on_cancel": "ignore"}, n=4)),
        text(),
        # stream 2: the same call again, blocked
        step(call("a", n=4)),
        text(),
        # stream 3: a stop while a call runs, acknowledged
        step(odd("a", {"hang": True}, n=5)),
    ]
    # A receipt a previous process left running: startup recovery closes it.
    store = MemoryStore()
    async with store:
        await store_kit.put_receipts(
            store,
            OperationRecord(
                op_id="s0/1/1/0",
                session="s0",
                stream="s0/1",
                call_id="s0/1/1/c0",
                capability=Capability(ToolKind.CLIENT, "a"),
                target="client:a#0",
                started_at=0.0,
                deadline_at=DEADLINE_S,
                state=OpState.RUNNING,
            ),
        )
    async with op_rig(
        {"M": script},
        tools=[a],
        models=[provider_model],
        sessions=(("s1", "M"), ("s2", "P")),
        store=store,
    ) as r:
        r.session().send("go")
        await r.settle()
        r.session().send("again")
        await r.settle()
        r.session().send("and again")
        await r.run_until(r.clock.now() + 1.0)
        r.session().stop()
        r.session("s2").send("search")
        await r.run_until(r.clock.now() + 1.0)
        r.session("s2").stop()
        await r.settle()

        codes = {rec.op_id: (rec.state.value, rec.outcome_code) for rec in await r.receipts()}
        assert codes == {
            op_id(1, 1, 0): ("failed", "tool_error"),
            op_id(1, 1, 1): ("failed", "capability_error"),
            op_id(1, 1, 2): ("completed", "ok"),
            op_id(1, 1, 3): ("completed", "completion_signal_lost"),
            op_id(1, 2, 0): ("indeterminate", "timeout"),
            op_id(2, 1, 0): ("failed", "blocked_by_indeterminate"),
            op_id(3, 1, 0): ("cancelled", "cancelled"),
            "s2/1/1/p0": ("indeterminate", "stream_failure"),
            "s0/1/1/0": ("indeterminate", "process_restart"),
        }


async def test_op12_an_unknown_tool_is_a_transport_failure() -> None:
    async with op_rig({"M": [step(call("nope", x=1)), text()]}, tools=[OpTool("a")]) as r:
        r.session().send("go")
        await r.settle()
        receipt = await r.receipt(A1)
        assert receipt.state is OpState.FAILED
        # OutcomeCode.TRANSPORT_ERROR: "the tool's transport or controller failed (a lost
        # connection, an unknown tool)" -- not the capability's own failure.
        assert receipt.outcome_code == OutcomeCode.TRANSPORT_ERROR
        [result] = last_results(r.scripted())
        assert result.is_error
