"""OP-7 at startup: the pure plan (no engine, no store, no event loop), then the engine's seam.

:func:`plan_startup_receipts` closes the receipts a previous process left open, one boundary
per session (its receipts and the restart-note row), and lists the ``receipt`` events in the
store's order, each bound to the session whose write makes it durable. The engine commits each
boundary and tells only the events of the sessions whose write returned.
"""

from __future__ import annotations

import pytest

from agent_session._rows import RowBody, decode_body, encode_body
from agent_session._startup_receipts import (
    RESTART_EXPLANATION,
    StartupReceiptPlan,
    plan_startup_receipts,
    sessions_of,
)
from agent_session.harness.fakes import Faults, FaultyStore
from persistence import (
    Capability,
    HistoryRow,
    MemoryStore,
    OperationRecord,
    OpState,
    RowKind,
    SessionRecord,
    ToolKind,
)
from stream_manager import OutcomeCode, ReceiptWritten
from tests import store_kit
from tests.operations.support import op_rig, text

NOW = 417.25


def left_open(
    session: str, n: int, tool: str, *, state: OpState = OpState.RUNNING
) -> OperationRecord:
    """A receipt a previous process left open (values unlike any default)."""
    return OperationRecord(
        op_id=f"{session}/3/{n}/1",
        session=session,
        stream=f"{session}/3",
        call_id=f"call-{session}-{n}",
        capability=Capability(ToolKind.CLIENT, tool),
        target=f"client:{tool}#{n}",
        started_at=12.5 + n,
        deadline_at=99.0 + n,
        state=state,
        cancel_requested_at=13.0 if n == 2 else None,
        cancel_reason="user" if n == 2 else None,
    )


def row(session: str, seq: int) -> HistoryRow:
    return HistoryRow(
        session=session,
        seq=seq,
        row_id=f"{session}:r{seq}",
        kind=RowKind.USER,
        body=encode_body(RowBody(text=f"row {seq}")),
    )


A1 = left_open("alpha", 1, "deploy")
B1 = left_open("beta", 1, "migrate", state=OpState.REQUESTED)
A2 = left_open("alpha", 2, "notify")
STORE_ORDER = (A1, B1, A2)  # the sessions interleave in the store's order


def receipt(record: OperationRecord) -> ReceiptWritten:
    return ReceiptWritten(
        session=record.session,
        op=record.op_id,
        tool=record.capability.name,
        state="indeterminate",
        acknowledged=False,
        resolved_late=False,
    )


def plan_of_both() -> StartupReceiptPlan:
    histories = {"alpha": (row("alpha", 4), row("alpha", 11)), "beta": (row("beta", 2),)}
    return plan_startup_receipts(STORE_ORDER, histories, NOW)


def test_op7_startup_plan_closes_each_sessions_receipts_in_one_boundary() -> None:
    plan = plan_of_both()

    assert [write.session for write in plan.writes] == ["alpha", "beta"]
    alpha, beta = plan.writes
    assert [r.op_id for r in alpha.boundary.operations] == [A1.op_id, A2.op_id]
    assert [r.op_id for r in beta.boundary.operations] == [B1.op_id]
    for closed in (*alpha.boundary.operations, *beta.boundary.operations):
        assert closed.state is OpState.INDETERMINATE
        assert closed.outcome_code == OutcomeCode.PROCESS_RESTART
        assert closed.ended_at == NOW
        assert closed.termination_acknowledged is False
        assert closed.explanation == RESTART_EXPLANATION
        assert closed.resolved_late is False
    # What the previous process recorded stays: the durable cancel request (OP-3) too.
    [_, notify] = alpha.boundary.operations
    assert (notify.started_at, notify.deadline_at) == (14.5, 101.0)
    assert (notify.cancel_requested_at, notify.cancel_reason) == (13.0, "user")
    assert notify.cancel_acknowledged_at is None
    # Nothing else in the boundary: no session created, no row deleted, no cut moved.
    assert (alpha.boundary.create, alpha.boundary.delete, alpha.boundary.cut_states) == (
        None,
        (),
        (),
    )
    assert alpha.boundary.envelope is None


def test_op7_startup_plan_appends_a_restart_note_after_each_sessions_last_row() -> None:
    alpha, beta = plan_of_both().writes

    [note] = alpha.boundary.rows
    assert (note.session, note.seq, note.row_id, note.kind) == (
        "alpha",
        12,
        "alpha:r12",
        RowKind.SYSTEM,
    )
    assert (note.stream, note.cut) == (None, None)
    said = decode_body(note).text
    assert "deploy (operation alpha/3/1/1), notify (operation alpha/3/2/1)" in said
    assert "migrate" not in said
    [other] = beta.boundary.rows
    assert (other.seq, other.row_id) == (3, "beta:r3")
    assert "migrate (operation beta/3/1/1)" in decode_body(other).text


def test_op7_startup_plan_tells_receipts_in_store_order_across_sessions() -> None:
    plan = plan_of_both()

    assert [(told.after, told.event) for told in plan.tell] == [
        ("alpha", receipt(A1)),
        ("beta", receipt(B1)),
        ("alpha", receipt(A2)),
    ]
    assert plan.told({"alpha", "beta"}) == (receipt(A1), receipt(B1), receipt(A2))
    # A session whose write failed is told nothing; the other's events keep their order.
    assert plan.told({"beta"}) == (receipt(B1),)
    assert plan.told({"alpha"}) == (receipt(A1), receipt(A2))
    assert plan.told(()) == ()


def test_op7_a_session_without_a_readable_history_gets_no_note_but_its_receipts_close() -> None:
    gamma = left_open("gamma", 5, "backup")
    # alpha: unreadable (None); beta: no entry at all; gamma: a known session with no rows.
    plan = plan_startup_receipts((*STORE_ORDER, gamma), {"alpha": None, "gamma": ()}, NOW)

    alpha, beta, fresh = plan.writes
    assert (alpha.boundary.rows, beta.boundary.rows) == ((), ())
    assert [r.state for r in alpha.boundary.operations] == [OpState.INDETERMINATE] * 2
    assert [r.state for r in beta.boundary.operations] == [OpState.INDETERMINATE]
    [note] = fresh.boundary.rows
    assert (note.seq, note.row_id) == (1, "gamma:r1")
    assert [told.event.op for told in plan.tell] == [A1.op_id, B1.op_id, A2.op_id, gamma.op_id]


def test_op7_startup_plan_is_pure_and_empty_without_open_receipts() -> None:
    assert plan_startup_receipts((), {"alpha": (row("alpha", 1),)}, NOW) == StartupReceiptPlan()
    assert plan_of_both() == plan_of_both()  # same inputs, same plan: nothing read or stamped
    assert A1.state is OpState.RUNNING  # the inputs are left as they were
    assert sessions_of(STORE_ORDER) == ("alpha", "beta")
    assert sessions_of(()) == ()


# ---------------------------------------------------------------- the engine's seam


@pytest.mark.parametrize("failing", ["alpha", "beta"])
async def test_op7_a_failed_startup_write_tells_nothing_of_its_session_and_the_others_are_told(
    failing: str,
) -> None:
    # The store's order puts the failing session's receipts first, so its write is the first.
    other = "beta" if failing == "alpha" else "alpha"
    first, second, third = (
        left_open(failing, 1, "deploy"),
        left_open(other, 1, "migrate", state=OpState.REQUESTED),
        left_open(other, 2, "notify"),
    )
    inner = MemoryStore()
    async with inner as seeding:
        for sid in ("alpha", "beta"):
            create = SessionRecord(id=sid, model="M")
            await store_kit.commit(seeding, sid, create=create, rows=(row(sid, 6),))
        await store_kit.put_receipts(seeding, first, second, third)
    faults = Faults()
    faults.arm("store_write", 1)  # the first session's close at startup fails
    async with op_rig({"M": [text()]}, store=FaultyStore(inner, faults)) as r:
        assert r.of(ReceiptWritten) == [receipt(second), receipt(third)]
        assert (await r.receipt(first.op_id)).state is OpState.RUNNING  # still open, stored
        for told in (second, third):
            assert (await r.receipt(told.op_id)).state is OpState.INDETERMINATE
        assert [h.seq for h in await store_kit.history(r.store, failing)] == [6]
        [_, note] = await store_kit.history(r.store, other)
        assert (note.seq, note.kind) == (7, RowKind.SYSTEM)
        assert "migrate (operation" in decode_body(note).text
