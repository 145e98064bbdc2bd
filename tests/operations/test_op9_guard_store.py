"""The overlap guard answers from the store (OP-9; issue 24, item 4; ``docs/operations.md``).

Two engines in turn on one SQLite file (a clean restart, or a crash): the second refuses the
identical call (or warns, by policy) because the store says the first one's operation is
indeterminate, whatever startup recovery did with it (closed it, failed to, was turned off).
``turnkeeper resolve``, run as a real subprocess, is refused while an engine owns the store
(the engine goes on refusing) and releases the operation between two engines. A settlement
written through the store while the engine runs is seen at the next identical call, and a late
end or the engine's own resolution never overwrites it. A damaged receipt row never lets a call
through: it holds its target (or its whole session); a store the guard cannot read runs no
call. A turn resumed or retried at startup after a crash that re-issues the call is refused
at tool level, and the model is told why.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
import pytest

from persistence import (
    OPERATOR,
    MemoryStore,
    NotResolvable,
    OpenReceipts,
    OperationRecord,
    OpState,
    ReceiptQuery,
    Resolution,
    SqliteStore,
    Store,
    StoreError,
    resolve_operation,
)
from stream_manager import (
    Capability,
    OpBlocked,
    OpOverlapWarned,
    OutcomeCode,
    Persisted,
    ReceiptWritten,
    ScriptStep,
    StreamStarted,
    ToolCallPart,
    ToolContext,
    ToolKind,
    VirtualClock,
    WriteFailed,
)
from stream_manager._op_states import target_digest
from stream_manager._operations import OperationRunner
from tests import store_kit
from tests.operations.conftest import Backend
from tests.operations.support import (
    CONFIG,
    DEADLINE_S,
    GRACE_S,
    OpTool,
    call,
    last_results,
    odd,
    op_id,
    op_rig,
    step,
    text,
)
from tests.persistence.helpers import plain_sqlite

if TYPE_CHECKING:
    from pathlib import Path

A1 = op_id(1, 1, 0)  # the first engine's call that ends indeterminate
AGAIN = op_id(2, 1, 0)  # the second engine's identical call (its session's next stream)
NOTE = "checked the host: /etc/x was never written"
HUNG = {"hang": True, "on_cancel": "ignore"}  # ignores its cancel: indeterminate at 12 s
LATER = 70.0  # the second engine's clock


async def _leave_indeterminate(store: Store) -> OperationRecord:
    """A first engine whose call on ``/etc/x`` ends indeterminate; it shuts down cleanly."""
    async with op_rig(
        {"M": [step(odd("a", HUNG, path="/etc/x")), text()]}, tools=[OpTool("a")], store=store
    ) as r:
        r.session().send("write /etc/x")
        await r.settle()
        held = await r.receipt(A1)
    assert held.state is OpState.INDETERMINATE
    return held


def _again() -> dict[str, list[ScriptStep]]:
    return {"M": [step(call("a", path="/etc/x"), call("a", path="/etc/y")), text("told")]}


# ---------------------------------------------------------------- after a restart


@pytest.mark.parametrize("policy", ["block", "warn"])
async def test_op9_after_a_restart_the_identical_call_is_blocked_or_warned_by_policy(
    tmp_path: Path, policy: str
) -> None:
    path = tmp_path / "ops.db"
    await _leave_indeterminate(SqliteStore(path))

    a2 = OpTool("a")
    config = msgspec.structs.replace(CONFIG, overlap_policy=policy)
    async with op_rig(
        _again(), tools=[a2], store=SqliteStore(path), config=config, clock=VirtualClock(LATER)
    ) as r2:
        r2.session().send("again")
        await r2.settle()
        other = await r2.receipt(op_id(2, 1, 1))
        assert (other.state, other.outcome_code) == (OpState.COMPLETED, "ok")
        again = await r2.receipt(AGAIN)
        first, second = last_results(r2.scripted())
        if policy == "block":
            assert (again.state, again.outcome_code, again.blocked_by) == (
                OpState.FAILED,
                OutcomeCode.BLOCKED_BY_INDETERMINATE,
                A1,
            )
            assert again.termination_acknowledged  # nothing ran
            assert [(e.op, e.blocked_by) for e in r2.of(OpBlocked)] == [(AGAIN, A1)]
            assert first.is_error
            assert first.output == {"error": "blocked_by_indeterminate", "blocked_by": A1}
            assert [dict(c.args) for c in a2.calls] == [{"path": "/etc/y"}]
            assert r2.of(OpOverlapWarned) == []
        else:
            assert (again.state, again.blocked_by) == (OpState.COMPLETED, None)
            assert [(e.op, e.overlaps) for e in r2.of(OpOverlapWarned)] == [(AGAIN, A1)]
            assert not first.is_error
            assert [dict(c.args) for c in a2.calls] == [{"path": "/etc/x"}, {"path": "/etc/y"}]
            assert r2.of(OpBlocked) == []
        assert not second.is_error


@pytest.mark.parametrize("recover_at_start", [True, False])
async def test_op9_a_call_a_crash_left_running_is_not_re_run_by_the_startup_retry_or_a_send(
    backend: Backend, recover_at_start: bool
) -> None:
    store = backend.make
    async with op_rig(
        {"M": [step(odd("a", HUNG, path="/etc/x"))]}, tools=[OpTool("a")], store=store()
    ) as r:
        r.session().send("write /etc/x")
        await r.run_until(1.0)
        assert (await r.receipt(A1)).state is OpState.RUNNING
        r.store.crash()  # the process dies with it running: no later write lands

    a2 = OpTool("a")
    config = msgspec.structs.replace(CONFIG, recover_at_start=recover_at_start)
    async with op_rig(
        _again(),
        tools=[a2],
        store=store(),
        config=config,
        clock=VirtualClock(LATER),
        sessions=() if recover_at_start else (("s1", "M"),),
    ) as r2:
        left = await r2.receipt(A1)  # stale receipts are closed either way (OP-7)
        assert (left.state, left.outcome_code) == (OpState.INDETERMINATE, "process_restart")
        if not recover_at_start:
            r2.session().send("again")  # nothing retries the turn: the user asks again
        await r2.settle()
        (start,) = r2.of(StreamStarted)
        assert (start.stream, start.cause) == ("s1/2", "recovery" if recover_at_start else "send")
        assert (await r2.receipt(AGAIN)).blocked_by == A1
        assert [dict(c.args) for c in a2.calls] == [{"path": "/etc/y"}]
        first, _ = last_results(r2.scripted())  # the model is told why, as the call's result
        assert first.output == {"error": "blocked_by_indeterminate", "blocked_by": A1}


async def test_op9_a_receipt_of_a_session_no_engine_opened_blocks_when_it_is_opened(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ops.db"
    capability = Capability(kind=ToolKind.CLIENT, name="a")
    held = OperationRecord(  # written by another host's process, in a session never opened here
        op_id="ops/9/3/0",
        session="ops",
        stream="ops/9",
        call_id="c9",
        capability=capability,
        target=target_digest(capability, {"path": "/etc/x"}, "turnkeeper"),
        started_at=12.0,
        deadline_at=22.0,
        state=OpState.INDETERMINATE,
        ended_at=24.0,
        outcome_code="timeout",
    )
    async with SqliteStore(path) as seeding:
        await store_kit.put_receipts(seeding, held)
    a = OpTool("a")
    async with op_rig(_again(), tools=[a], store=SqliteStore(path), sessions=()) as r:
        await r.engine.open_session("ops", model="M")
        r.session("ops").send("again")
        await r.settle()
        assert (await r.receipt("ops/1/1/0")).blocked_by == held.op_id
        assert [dict(c.args) for c in a.calls] == [{"path": "/etc/y"}]


# ---------------------------------------------------------------- across processes


async def _resolve_in_a_subprocess(path: Path) -> tuple[int, str, str]:
    resolve = ("resolve", A1, "--db", str(path), "--as", "not-run", "--note", NOTE)
    done = await anyio.run_process([sys.executable, "-m", "agent_session", *resolve], check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_op9_turnkeeper_resolve_is_refused_while_an_engine_runs_and_releases_between(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ops.db"
    a = OpTool("a")
    script = [step(odd("a", HUNG, path="/etc/x")), text(), step(call("a", path="/etc/x")), text()]
    async with op_rig({"M": script}, tools=[a], store=SqliteStore(path)) as r:
        r.session().send("write /etc/x")
        await r.settle()
        held = await r.receipt(A1)
        assert held.state is OpState.INDETERMINATE

        code, out, err = await _resolve_in_a_subprocess(path)  # the engine owns the store

        assert (code, out) == (2, "")
        assert "in use by another process" in err
        assert await r.receipt(A1) == held  # nothing written
        r.session().send("again")
        await r.settle()
        assert (await r.receipt(op_id(2, 1, 0))).blocked_by == A1  # still refused
        assert len(a.calls) == 1

    code, out, err = await _resolve_in_a_subprocess(path)  # no engine: it settles it

    assert (code, err) == (0, "")
    assert f"{A1} resolved as not-run" in out
    a2 = OpTool("a")
    async with op_rig(
        {"M": [step(call("a", path="/etc/x")), text()]},
        tools=[a2],
        store=SqliteStore(path),
        clock=VirtualClock(LATER),
    ) as r2:
        settled = await r2.receipt(A1)
        assert (settled.state, settled.resolved_by, settled.note) == (
            OpState.CANCELLED,
            OPERATOR,
            NOTE,
        )
        r2.session().send("once more")
        await r2.settle()
        assert [dict(c.args) for c in a2.calls] == [{"path": "/etc/x"}]
        assert (await r2.receipt(op_id(3, 1, 0))).state is OpState.COMPLETED
        assert r2.of(OpBlocked) == []


# ---------------------------------------------------------------- settled through the store


def _late_acker() -> OpTool:
    """Stopped at 1 s, it is indeterminate at 1 + grace; it acknowledges 5 s after that."""
    return OpTool("a", hang=True, ack_delay_s=GRACE_S + 5.0)


async def test_op9_a_settlement_written_through_the_store_frees_the_identical_call(
    backend: Backend,
) -> None:
    a = _late_acker()
    script = [
        step(call("a", path="/etc/x")),
        step(odd("a", {"hang": False}, path="/etc/x")),  # the identical call: it answers
        text(),
    ]
    async with op_rig({"M": script}, tools=[a], store=backend.make()) as r:
        r.session().send("go")
        await r.run_until(1.0)
        r.session().stop()
        await r.run_until(1.0 + GRACE_S + 0.5)
        assert (await r.receipt(A1)).state is OpState.INDETERMINATE

        # Other code settles it through the engine's own store (not through the engine).
        await resolve_operation(r.engine.store, A1, Resolution.NOT_RUN, note=NOTE, at=3.75)

        r.session().send("again")
        await r.settle()
        assert r.of(OpBlocked) == []
        assert [dict(c.args) for c in a.calls] == [{"path": "/etc/x"}, {"path": "/etc/x"}]
        assert (await r.receipt(op_id(2, 1, 0))).state is OpState.COMPLETED


async def test_op8_a_late_end_never_overwrites_a_settlement_written_through_the_store(
    backend: Backend,
) -> None:
    a = _late_acker()
    async with op_rig(
        {"M": [step(call("a", path="/etc/x")), text()]}, tools=[a], store=backend.make()
    ) as r:
        r.session().send("go")
        await r.run_until(1.0)
        r.session().stop()
        await r.run_until(1.0 + GRACE_S + 0.5)
        await resolve_operation(r.engine.store, A1, Resolution.COMPLETED, note=NOTE, at=3.75)
        settled = await r.receipt(A1)

        await r.settle()  # the execute acknowledges at 1 + grace + 5: after the person

        assert a.ends == [1.0 + GRACE_S + 5.0]
        assert await r.receipt(A1) == settled
        assert [e.state for e in r.of(ReceiptWritten) if e.op == A1] == ["indeterminate"]
        with pytest.raises(NotResolvable) as refused:  # nor does the engine settle it again
            await r.engine.resolve_operation(A1, as_="failed", note="a second opinion")
        assert refused.value.state is OpState.COMPLETED
        assert await r.receipt(A1) == settled


async def test_op8_the_engine_refuses_to_settle_again_what_the_store_settled_while_it_lingers(
    backend: Backend,
) -> None:
    a = OpTool("a", hang=True, on_cancel="ignore")  # lingers: it never acknowledges
    async with op_rig(
        {"M": [step(call("a", path="/etc/x")), text()]}, tools=[a], store=backend.make()
    ) as r:
        r.session().send("go")
        await r.run_until(1.0)
        r.session().stop()
        await r.run_until(1.0 + GRACE_S + 0.5)
        await resolve_operation(r.engine.store, A1, Resolution.FAILED, note=NOTE, at=3.75)
        settled = await r.receipt(A1)

        with pytest.raises(NotResolvable) as refused:
            await r.engine.resolve_operation(A1, as_="completed", note="a second opinion")

        assert refused.value.state is OpState.FAILED
        assert await r.receipt(A1) == settled


# ---------------------------------------------------------------- a damaged receipt


def _damage(path: Path, *, target_too: bool = False) -> None:
    with plain_sqlite(path) as conn:
        conn.execute(
            "UPDATE operations SET record = CAST(json_set(CAST(record AS TEXT), "
            "'$.started_at', 'at noon') AS BLOB) WHERE op_id = ?",
            (A1,),
        )
        if target_too:
            conn.execute("UPDATE operations SET target = 'garbled' WHERE op_id = ?", (A1,))


@pytest.mark.parametrize("target_too", [False, True])
async def test_op9_a_damaged_receipt_row_never_lets_a_call_through(
    tmp_path: Path, target_too: bool, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ops.db"
    await _leave_indeterminate(SqliteStore(path))
    _damage(path, target_too=target_too)

    a2 = OpTool("a")
    with caplog.at_level(logging.ERROR, logger="turnkeeper.operations"):
        async with op_rig(
            _again(), tools=[a2], store=SqliteStore(path), clock=VirtualClock(LATER)
        ) as r2:
            r2.session().send("again")
            await r2.settle()
            again = await r2.receipt(AGAIN)
            assert (again.outcome_code, again.blocked_by) == ("blocked_by_indeterminate", A1)
            assert again.explanation is not None
            assert "damaged receipt" in again.explanation
            first, _ = last_results(r2.scripted())
            assert first.output == {
                "error": "blocked_by_indeterminate",
                "blocked_by": A1,
                "blocker_receipt": "damaged",
            }
            # Its target is known: other arguments run. Unreadable: nothing in the session does.
            expected = [] if target_too else [{"path": "/etc/y"}]
            assert [dict(c.args) for c in a2.calls] == expected
            with pytest.raises(NotResolvable) as refused:  # damaged: a person cannot settle it
                await r2.engine.resolve_operation(A1, as_="not-run", note=NOTE)
            assert refused.value.damaged
    logged = [rec.getMessage() for rec in caplog.records if A1 in rec.getMessage()]
    assert logged
    assert "damaged" in logged[0]


async def test_op9_a_damaged_terminal_receipt_holds_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ops.db"
    async with op_rig(
        {"M": [step(call("a", path="/etc/x")), text()]},
        tools=[OpTool("a")],
        store=SqliteStore(path),
    ) as r:
        r.session().send("write /etc/x")
        await r.settle()
        assert (await r.receipt(A1)).state is OpState.COMPLETED
    _damage(path)  # its state column says completed: the store wrote it with the record

    a2 = OpTool("a")
    async with op_rig(
        _again(), tools=[a2], store=SqliteStore(path), clock=VirtualClock(LATER)
    ) as r2:
        r2.session().send("again")
        await r2.settle()
        assert [dict(c.args) for c in a2.calls] == [{"path": "/etc/x"}, {"path": "/etc/y"}]


# ---------------------------------------------------------------- a resume after a restart


async def test_op9_a_turn_resumed_after_a_crash_cannot_re_run_the_indeterminate_call(
    tmp_path: Path,
) -> None:
    """The call ends indeterminate; a queued wake cuts the turn; the process dies as the cut
    row commits. The next engine resumes the owed turn, whose model issues the call again."""
    path = tmp_path / "ops.db"
    a = OpTool("a")
    with anyio.CancelScope() as crash:
        async with op_rig(
            {"M": [step(odd("a", HUNG, path="/etc/x")), text("never reached")]},
            tools=[a],
            store=SqliteStore(path),
        ) as r:

            async def wake(_call: ToolCallPart, _context: ToolContext) -> None:
                r.session().enqueue("the deploy window opened", kind="wake", mode="tool-end")

            a.on_start = wake

            def die_at_the_cut(event: object) -> None:
                if isinstance(event, Persisted) and event.what == "cut":
                    r.store.crash()  # no later write reaches the file
                    crash.cancel()

            r.on(die_at_the_cut)
            r.session().send("deploy /etc/x")
            await r.settle()
    assert crash.cancelled_caught

    a2 = OpTool("a")
    resumed = {"M": [step(call("a", path="/etc/x")), text("it may have run: ask first")]}
    async with op_rig(
        resumed, tools=[a2], store=SqliteStore(path), sessions=(), clock=VirtualClock(LATER)
    ) as r2:
        await r2.settle()
        (start,) = r2.of(StreamStarted)
        assert start.cause == "resume"
        blocked = await r2.receipt(op_id(2, 1, 0))
        assert (blocked.outcome_code, blocked.blocked_by) == ("blocked_by_indeterminate", A1)
        assert a2.calls == []  # nothing ran again
        (told,) = last_results(r2.scripted())  # the model sees why, as the call's result
        assert told.output == {"error": "blocked_by_indeterminate", "blocked_by": A1}


# ---------------------------------------------------------------- without an engine


async def test_op9_a_stream_manager_without_an_engine_reads_the_store_at_its_first_call() -> None:
    capability = Capability(kind=ToolKind.CLIENT, name="a")
    held = OperationRecord(
        op_id="s1/4/1/0",
        session="s1",
        stream="s1/4",
        call_id="c4",
        capability=capability,
        target=target_digest(capability, {"path": "/etc/x"}, "pepper"),
        started_at=3.0,
        state=OpState.RUNNING,  # a process died with it open, and no startup ran
    )
    store = MemoryStore.opened()
    await store_kit.put_receipts(store, held)
    a = OpTool("a")
    runner = OperationRunner(
        tools={"a": a},
        clock=a.clock,
        default_deadline_s=DEADLINE_S,
        emit=None,
        store=store,
        salt="pepper",
    )
    async with anyio.create_task_group() as group:
        results = await runner.run_calls(
            session="s1",
            stream="s1/5",
            step=1,
            calls=[ToolCallPart(call_id="k1", name="a", args={"path": "/etc/x"})],
            stop_why=lambda: pytest.fail("no stop"),
            spawn=group.start_soon,
        )
        runner.stream_closed("s1/5")  # a call that ran would leave its worker waiting
    assert results[0].output == {"error": "blocked_by_indeterminate", "blocked_by": held.op_id}
    assert a.calls == []


class _Unreadable(MemoryStore):
    """A store whose reads of receipts fail (after ``fail`` is set)."""

    fail = False

    async def open_receipts(self, session: str | None = None) -> OpenReceipts:
        if self.fail:
            raise StoreError("disk I/O error (injected)")
        return await super().open_receipts(session)

    async def receipts(self, *args: Any, **kwargs: Any) -> ReceiptQuery:
        if self.fail:
            raise StoreError("disk I/O error (injected)")
        return await super().receipts(*args, **kwargs)


@pytest.mark.parametrize("when", ["load", "confirm"])
async def test_op9_a_guard_that_cannot_read_the_store_runs_no_call(when: str) -> None:
    capability = Capability(kind=ToolKind.CLIENT, name="a")
    held = OperationRecord(
        op_id="s1/4/1/0",
        session="s1",
        stream="s1/4",
        call_id="c4",
        capability=capability,
        target=target_digest(capability, {"path": "/etc/x"}, "pepper"),
        started_at=3.0,
        state=OpState.INDETERMINATE,
    )
    store = _Unreadable()
    await store.open()
    await store_kit.put_receipts(store, held)
    a = OpTool("a")
    runner = OperationRunner(
        tools={"a": a},
        clock=a.clock,
        default_deadline_s=DEADLINE_S,
        emit=None,
        store=store,
        salt="pepper",
    )
    if when == "confirm":
        await runner.load_guard()  # the held call then needs its confirming read
    store.fail = True
    async with anyio.create_task_group() as group:
        with pytest.raises(WriteFailed, match=r"overlap guard could not read .*injected"):
            await runner.run_calls(
                session="s1",
                stream="s1/5",
                step=1,
                calls=[ToolCallPart(call_id="k1", name="a", args={"path": "/etc/x"})],
                stop_why=lambda: pytest.fail("no stop"),
                spawn=group.start_soon,
            )
        runner.stream_closed("s1/5")
    assert a.calls == []
    store.fail = False
    assert [r.op_id for r in (await store.receipts()).records] == [held.op_id]  # nothing written
