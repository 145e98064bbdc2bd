"""A person settles an indeterminate operation through the Engine (issue 12; OP-8, OP-9).

``Engine.resolve_operation`` writes the settled receipt durably and releases the running
engine's overlap guard: the identical call that was blocked before runs after. A resolution
survives a restart (the next engine loads only what is still indeterminate), whether the engine
or the store-level function (``turnkeeper resolve``'s) wrote it. Anything but an indeterminate
operation is refused and nothing is written; an execute that ends after a person settled it
resolves nothing late.
"""

from __future__ import annotations

import msgspec
import pytest

from persistence import (
    OPERATOR,
    MemoryStore,
    NotResolvable,
    OperationRecord,
    OpState,
    Resolution,
    UsageError,
    resolve_operation,
)
from stream_manager import (
    Capability,
    OpBlocked,
    OutcomeCode,
    ReceiptWritten,
    ToolKind,
    VirtualClock,
)
from stream_manager._op_guard import OverlapGuard, OverlapPolicy
from tests.operations.conftest import Backend
from tests.operations.support import (
    GRACE_S,
    OpRig,
    OpTool,
    call,
    last_results,
    odd,
    op_id,
    op_rig,
    step,
    text,
)

A1 = op_id(1, 1, 0)
NOTE = "checked /etc/x on the host: it was written at 09:14"


def _receipt_events(r: OpRig, op: str) -> list[tuple[str, bool, bool]]:
    return [(e.state, e.acknowledged, e.resolved_late) for e in r.of(ReceiptWritten) if e.op == op]


@pytest.mark.parametrize(
    ("as_", "state", "outcome", "acknowledged"),
    [
        (Resolution.COMPLETED, OpState.COMPLETED, OutcomeCode.OPERATOR_COMPLETED, False),
        (Resolution.FAILED, OpState.FAILED, OutcomeCode.OPERATOR_FAILED, False),
        (Resolution.NOT_RUN, OpState.CANCELLED, OutcomeCode.OPERATOR_NOT_RUN, True),
    ],
)
async def test_op9_a_settled_operation_no_longer_blocks_the_identical_call(
    backend: Backend, as_: Resolution, state: OpState, outcome: OutcomeCode, acknowledged: bool
) -> None:
    a = OpTool("a")
    script = [
        step(odd("a", {"hang": True, "on_cancel": "ignore"}, path="/etc/x")),  # indeterminate
        step(call("a", path="/etc/x")),  # blocked
        text("blocked"),
        step(call("a", path="/etc/x")),  # after the resolution: runs
        text("ran"),
    ]
    async with op_rig({"M": script}, tools=[a], store=backend.make()) as r:
        r.session().send("go")
        await r.settle()
        stuck = await r.receipt(A1)
        assert stuck.state is OpState.INDETERMINATE
        assert (await r.receipt(op_id(1, 2, 0))).blocked_by == A1
        await r.run_until(37.5)

        returned = await r.engine.resolve_operation(A1, as_=as_.value, note=NOTE)

        stored = await r.receipt(A1)
        assert stored == returned
        assert stored == msgspec.structs.replace(
            stuck,
            state=state,
            outcome_code=outcome.value,
            termination_acknowledged=acknowledged,
            explanation=stored.explanation,
            resolved_by=OPERATOR,
            resolved_at=37.5,  # the engine's clock
            note=NOTE,
        )
        assert not stored.resolved_late
        assert r.store.states_of(A1)[-2:] == ["indeterminate", state.value]
        assert _receipt_events(r, A1)[-1] == (state.value, acknowledged, False)

        r.session().send("again")
        await r.settle()
        again = await r.receipt(op_id(2, 1, 0))
        assert (again.state, again.outcome_code, again.blocked_by) == (
            OpState.COMPLETED,
            "ok",
            None,
        )
        assert not last_results(r.scripted())[0].is_error
        assert [dict(c.args) for c in a.calls] == [{"path": "/etc/x"}, {"path": "/etc/x"}]
        assert [e.op for e in r.of(OpBlocked)] == [op_id(1, 2, 0)]  # only the one before


@pytest.mark.parametrize("by", ["engine", "store"])
async def test_op9_a_resolution_survives_a_restart(backend: Backend, by: str) -> None:
    a = OpTool("a")
    first = [step(odd("a", {"hang": True, "on_cancel": "ignore"}, path="/etc/x")), text()]
    async with op_rig({"M": first}, tools=[a], store=backend.make()) as r:
        r.session().send("go")
        await r.settle()
        assert (await r.receipt(A1)).state is OpState.INDETERMINATE
        if by == "engine":
            await r.engine.resolve_operation(A1, as_=Resolution.NOT_RUN, note=NOTE)
    if by == "store":  # no engine holds the store: what `turnkeeper resolve` does
        async with backend.make() as store:
            await resolve_operation(store, A1, Resolution.NOT_RUN, note=NOTE, at=61.0)

    a2 = OpTool("a")
    second = [step(call("a", path="/etc/x")), text("ran")]
    async with op_rig(
        {"M": second}, tools=[a2], store=backend.make(), clock=VirtualClock(70.0)
    ) as r2:
        settled = await r2.receipt(A1)
        assert (settled.state, settled.resolved_by, settled.note) == (
            OpState.CANCELLED,
            OPERATOR,
            NOTE,
        )
        r2.session().send("again")
        await r2.settle()
        assert [dict(c.args) for c in a2.calls] == [{"path": "/etc/x"}]
        assert r2.of(OpBlocked) == []
        ran = [rec for rec in await r2.receipts() if rec.op_id != A1]
        assert [(rec.state, rec.outcome_code) for rec in ran] == [(OpState.COMPLETED, "ok")]


async def test_op8_an_execute_that_ends_after_a_person_settled_it_resolves_nothing_late() -> None:
    a = OpTool("a", hang=True, ack_delay_s=GRACE_S + 5.0)
    async with op_rig({"M": [step(call("a", path="/x")), text()]}, tools=[a]) as r:
        r.session().send("go")
        await r.run_until(1.0)
        r.session().stop()
        await r.run_until(1.0 + GRACE_S + 0.5)
        assert (await r.receipt(A1)).state is OpState.INDETERMINATE
        await r.engine.resolve_operation(A1, as_="failed", note=NOTE)
        await r.settle()  # the execute acknowledges at 1 + grace + 5: too late to matter
        assert a.ends  # it did end
        receipt = await r.receipt(A1)
        assert (receipt.state, receipt.resolved_by, receipt.resolved_late) == (
            OpState.FAILED,
            OPERATOR,
            False,
        )
        assert receipt.resolved_at == 1.0 + GRACE_S + 0.5
        assert _receipt_events(r, A1) == [("indeterminate", False, False), ("failed", False, False)]


async def test_op8_only_an_indeterminate_operation_is_settled_and_a_refusal_writes_nothing() -> (
    None
):
    a = OpTool("a")
    script = [
        step(odd("a", {"hang": True, "on_cancel": "ignore"}, path="/etc/x")),
        step(call("a", path="/etc/x"), call("a", path="/etc/y")),  # blocked, completed
        text(),
    ]
    async with op_rig({"M": script}, tools=[a]) as r:
        r.session().send("go")
        await r.settle()
        writes = list(r.store.writes)
        before = await r.receipts()
        for op, state in [
            ("s1/9/9/9", None),
            (op_id(1, 2, 0), OpState.FAILED),
            (op_id(1, 2, 1), OpState.COMPLETED),
        ]:
            with pytest.raises(NotResolvable) as caught:
                await r.engine.resolve_operation(op, as_="completed", note=NOTE)
            assert (caught.value.op_id, caught.value.state) == (op, state)
        with pytest.raises(UsageError, match="unknown resolution 'done'"):
            await r.engine.resolve_operation(A1, as_="done", note=NOTE)
        with pytest.raises(UsageError, match="needs a note"):
            await r.engine.resolve_operation(A1, as_="completed", note="  ")
        assert r.store.writes == writes
        assert await r.receipts() == before


def _held(op: str, target: str = "client:a#1") -> OperationRecord:
    return OperationRecord(
        op_id=op,
        session="s1",
        stream="s1/1",
        call_id=op,
        capability=Capability(kind=ToolKind.CLIENT, name="a"),
        target=target,
        started_at=0.0,
        state=OpState.INDETERMINATE,
    )


@pytest.mark.parametrize("policy", [OverlapPolicy.BLOCK, OverlapPolicy.SESSION])
def test_op9_every_indeterminate_holder_of_a_target_blocks_until_each_is_settled(
    policy: OverlapPolicy,
) -> None:
    # A crash can leave identical calls of one step open: each is indeterminate after it.
    guard = OverlapGuard(policy, MemoryStore.opened())
    first, second = _held("s1/1/1/0"), _held("s1/1/1/1")
    guard.hold(first)
    guard.hold(second)
    capability = first.capability
    assert guard.blocker("n", "s1", capability, first.target) == first.op_id
    guard.release(first)
    assert guard.blocker("n", "s1", capability, first.target) == second.op_id
    guard.release(second)
    assert guard.blocker("n", "s1", capability, first.target) is None
