"""Stream loss, crashes and replacement engines (OP-7, OP-10, and OP-3's durable cancel request
across a crash), on a MemoryStore and on a SqliteStore file.

A crash is the rig's ``store.crash()``: no later write reaches the store, the engine is dropped,
and a new Engine (a new connection to the same file; the same MemoryStore object) opens the
store and runs startup recovery while the clock goes on.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pytest

from persistence import OperationRecord, OpState, SqliteStore, Store
from stream_manager import (
    Capability,
    FinishReason,
    OpBlocked,
    OperationStarted,
    OutcomeCode,
    ReceiptWritten,
    ScriptStep,
    StreamFailed,
    ToolCallPart,
    ToolContext,
    ToolKind,
    VirtualClock,
)
from tests import store_kit
from tests.operations.conftest import Backend
from tests.operations.support import (
    CONFIG,
    DEADLINE_S,
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
    provider_result,
    step,
    text,
)
from tests.operations.test_op_rules import receipt_events


async def stored(store: Store, op: str) -> OperationRecord:
    record = await store_kit.receipt(store, op)
    assert record is not None, f"no receipt {op}"
    return record


# ---------------------------------------------------------------- OP-7: stream loss


@pytest.mark.parametrize("how", ["stop", "hard_stop"])
async def test_op7_a_provider_tool_cut_by_a_stop_before_its_result_is_indeterminate(
    how: str,
) -> None:
    model = LiveModel("P", [LiveStep((provider_call("p0", q="weather"),), then="hang")])
    async with op_rig(models=[model], sessions=(("s1", "P"),)) as r:
        r.session().send("search")
        await r.run_until(1.0)
        op = "s1/1/1/p0"
        running = await r.receipt(op)
        assert running.state is OpState.RUNNING
        assert running.capability == Capability(ToolKind.PROVIDER, "web_search")
        r.session().stop() if how == "stop" else r.session().hard_stop()
        await r.settle()

        receipt = await r.receipt(op)
        assert receipt.state is OpState.INDETERMINATE
        assert receipt.outcome_code == OutcomeCode.STREAM_FAILURE
        assert not receipt.termination_acknowledged
        assert receipt.explanation is not None
        assert "termination not confirmed" in receipt.explanation
        [event] = receipt_events(r, op)
        assert (event.state, event.acknowledged, event.tool) == (
            "indeterminate",
            False,
            "web_search",
        )
        # It was told started (no deadline: the provider runs it) before its receipt.
        [start] = [e for e in r.of(OperationStarted) if e.op == op]
        assert (start.tool, start.deadline) == ("web_search", 0)
        assert r.events.index(start) < r.events.index(event)


async def test_op7_stream_loss_leaves_cut_calls_indeterminate_and_finished_ones_completed(
    backend: Backend,
) -> None:
    a = OpTool("a")
    model = LiveModel(
        "P",
        [
            LiveStep(
                (ToolCallPart(call_id="c0", name="a", args={"n": 1}),),
                finish=FinishReason.TOOL_CALLS,
            ),
            LiveStep(
                (provider_call("p0", q="1"), provider_result("p0"), provider_call("p1", q="2")),
                then="error",
            ),
        ],
    )
    async with op_rig(
        models=[model], tools=[a], sessions=(("s1", "P"),), store=backend.make()
    ) as r:
        r.session().send("go")
        await r.settle()

        assert r.of(StreamFailed)
        client = await r.receipt(op_id(1, 1, 0))
        assert (client.state, client.outcome_code) == (OpState.COMPLETED, "ok")
        finished = await r.receipt("s1/1/2/p0")
        assert (finished.state, finished.outcome_code) == (OpState.COMPLETED, "ok")
        cut = await r.receipt("s1/1/2/p1")
        assert cut.state is OpState.INDETERMINATE
        assert cut.outcome_code == OutcomeCode.STREAM_FAILURE  # not a tool failure
        assert not cut.termination_acknowledged


# ---------------------------------------------------------------- OP-7 / OP-10: crashes


def _crash_script() -> list[ScriptStep]:
    return [
        step(odd("a", {"hang": False}, path="/done")),  # completes before the crash
        step(call("a", path="/x"), call("b", path="/y")),  # a runs, b waits: then the crash
    ]


async def test_op7_op10_a_crash_leaves_open_receipts_indeterminate_for_a_replacement_engine(
    backend: Backend,
) -> None:
    done, running, waiting = op_id(1, 1, 0), op_id(1, 2, 0), op_id(1, 2, 1)
    a, b = OpTool("a", hang=True), OpTool("b")
    async with op_rig({"M": _crash_script()}, tools=[a, b], store=backend.make()) as r:
        r.session().send("go")
        await r.run_until(1.0)
        assert (await r.receipt(running)).state is OpState.RUNNING
        assert (await r.receipt(waiting)).state is OpState.REQUESTED
        r.store.crash()
    assert a.calls
    assert not b.calls

    # The replacement: a new engine on the same store, the clock going on.
    a2, b2 = OpTool("a"), OpTool("b")
    script = [
        step(call("a", path="/x")),  # the same call: blocked
        step(call("a", path="/z"), call("b", path="/y")),  # other args run; b's target blocked
        text(),
    ]
    # The crashed turn is not retried here (PS-4 has its own tests): this engine's turns are
    # the ones the test sends, whichever store it runs on.
    no_retry = msgspec.structs.replace(CONFIG, auto_retry=False)
    async with op_rig(
        {"M": script},
        tools=[a2, b2],
        store=backend.make(),
        clock=VirtualClock(5.0),
        config=no_retry,
    ) as r2:
        for op in (running, waiting):
            receipt = await r2.receipt(op)  # by id, from the store
            assert receipt.state is OpState.INDETERMINATE
            assert receipt.outcome_code == OutcomeCode.PROCESS_RESTART
            assert not receipt.termination_acknowledged
            assert receipt.ended_at == 5.0
            assert receipt.explanation is not None
            assert "termination not confirmed" in receipt.explanation
        assert (await r2.receipt(done)).state is OpState.COMPLETED  # it keeps completed
        assert sorted(e.op for e in r2.of(ReceiptWritten)) == [running, waiting]
        # Open + recent N: the indeterminate ones first, then at most N others.
        listed = (await r2.store.receipts(recent=1)).records
        assert [rec.op_id for rec in listed] == [running, waiting, done]
        assert [rec.op_id for rec in (await r2.store.receipts(recent=0)).records] == [
            running,
            waiting,
        ]
        # They live in the store, not in the conversation: discarding the history keeps them.
        r2.session().discard_context()
        await r2.settle()
        assert await store_kit.history(r2.store, "s1") == []
        assert [rec.op_id for rec in (await r2.store.receipts(recent=1)).records] == [
            running,
            waiting,
            done,
        ]

        # The new engine's overlap guard knows them (OP-9).
        r2.session().send("retry")
        await r2.settle()
        blocked = await r2.receipt(op_id(2, 1, 0))
        assert blocked.outcome_code == OutcomeCode.BLOCKED_BY_INDETERMINATE
        assert blocked.blocked_by == running
        assert (await r2.receipt(op_id(2, 2, 0))).state is OpState.COMPLETED
        other = await r2.receipt(op_id(2, 2, 1))
        assert (other.outcome_code, other.blocked_by) == ("blocked_by_indeterminate", waiting)
        assert [dict(c.args) for c in a2.calls] == [{"path": "/z"}]
        assert b2.calls == []
        assert [e.blocked_by for e in r2.of(OpBlocked)] == [running, waiting]


async def peek(backend: Backend, op: str) -> OperationRecord:
    """``op``'s receipt as the store holds it while no engine runs (after a crash)."""
    store = (
        backend.memory if backend.memory is not None else SqliteStore(backend.path, readonly=True)
    )
    async with store:
        return await stored(store, op)


async def test_op7_op3_a_crash_right_after_a_stop_keeps_the_durable_cancel_request(
    backend: Backend,
) -> None:
    rig: list[OpRig] = []

    async def crash(tool: ToolCallPart, context: ToolContext) -> None:
        rig[0].store.crash()  # the process dies as the tool is told to stop

    a = OpTool("a", hang=True, on_cancelled=crash)
    async with op_rig({"M": [step(call("a")), text()]}, tools=[a], store=backend.make()) as r:
        rig.append(r)
        r.session().send("go")
        await r.run_until(1.0)
        r.session().stop()
        await r.settle()
        clock_then = r.clock.now()

    # Between the crash and recovery the store shows the request: running, cancel requested.
    left = await peek(backend, op_id(1, 1, 0))
    assert left.state is OpState.RUNNING
    assert (left.cancel_requested_at, left.cancel_reason) == (1.0, "user")

    async with op_rig({"M": [text()]}, store=backend.make(), clock=VirtualClock(clock_then)) as r2:
        receipt = await r2.receipt(op_id(1, 1, 0))
        assert receipt.state is OpState.INDETERMINATE
        assert receipt.outcome_code == OutcomeCode.PROCESS_RESTART
        assert (receipt.cancel_requested_at, receipt.cancel_reason) == (1.0, "user")
        assert receipt.cancel_acknowledged_at is None
        assert not receipt.termination_acknowledged


# ---------------------------------------------------------------- OP-10: queries, reconnects


async def test_op10_receipts_are_queryable_by_id_and_as_open_plus_recent_n(
    backend: Backend,
) -> None:
    a = OpTool("a", duration_s=1.0)
    script = [
        step(call("a", n=1), call("a", n=2), call("a", n=3)),
        step(odd("a", {"hang": True, "on_cancel": "unconfirmed"}, n=4)),
        text(),
    ]
    async with op_rig({"M": script}, tools=[a], store=backend.make()) as r:
        r.session().send("go")
        await r.settle()
        ids = [op_id(1, 1, i) for i in range(3)]
        stuck = op_id(1, 2, 0)
        for op in [*ids, stuck]:
            assert (await r.receipt(op)).op_id == op
        assert await store_kit.receipt(r.store, "s1/9/9/9") is None
        assert [rec.op_id for rec in (await r.store.receipts(recent=2)).records] == [
            stuck,
            ids[2],
            ids[1],
        ]
        assert [rec.op_id for rec in (await r.store.receipts()).records] == [
            stuck,
            *reversed(ids),
        ]
        only = await r.store.receipts(states=frozenset({OpState.INDETERMINATE}))
        assert [rec.op_id for rec in only.records] == [stuck]
        assert (await r.store.receipts(session="other")).records == ()


async def test_op10_a_second_subscriber_mid_run_sees_the_same_receipts(backend: Backend) -> None:
    a = OpTool("a", duration_s=2.0)
    late: list[object] = []
    async with op_rig({"M": [step(call("a")), text()]}, tools=[a], store=backend.make()) as r:
        r.session().send("go")
        await r.run_until(1.0)
        # A second subscriber connects mid-stream: events from now on, receipts from the store.
        r.engine.add_observer(late.append)
        [started] = r.of(OperationStarted)
        async with backend.reader(r.store) as view:
            mid = await r.store.track(stored(view, started.op))
        assert (mid.op_id, mid.state) == (op_id(1, 1, 0), OpState.RUNNING)
        await r.settle()

        async with backend.reader(r.store) as view:
            after = await r.store.track(stored(view, op_id(1, 1, 0)))
        assert after.state is OpState.COMPLETED
        assert (await r.receipt(op_id(1, 1, 0))).state is OpState.COMPLETED
        seen = [e for e in late if isinstance(e, ReceiptWritten)]
        assert [(e.op, e.state) for e in seen] == [(op_id(1, 1, 0), "completed")]


async def test_op10_a_clean_restart_keeps_receipts_and_the_overlap_guard(backend: Backend) -> None:
    a = OpTool("a")
    script: Sequence[ScriptStep] = [
        step(call("a", n=1)),
        step(odd("a", {"hang": True, "on_cancel": "unconfirmed"}, n=2)),
        text(),
    ]
    async with op_rig({"M": script}, tools=[a], store=backend.make()) as r:
        r.session().send("go")
        await r.settle()
        before = await r.receipts()
        clock_then = r.clock.now()
    assert clock_then == DEADLINE_S

    a2 = OpTool("a")
    async with op_rig(
        {"M": [step(call("a", n=2), call("a", n=1)), text()]},
        tools=[a2],
        store=backend.make(),
        clock=VirtualClock(clock_then),
    ) as r2:
        assert await r2.receipts() == before  # nothing open: recovery changes nothing
        assert r2.of(ReceiptWritten) == []
        r2.session().send("again")
        await r2.settle()
        blocked = await r2.receipt(op_id(2, 1, 0))
        assert blocked.blocked_by == op_id(1, 2, 0)
        assert (await r2.receipt(op_id(2, 1, 1))).state is OpState.COMPLETED
        assert [dict(c.args) for c in a2.calls] == [{"n": 1}]
        [result, _] = last_results(r2.scripted())
        assert result.is_error
