"""Streaming partials (PS-1 B4) and the leftover partial a stream start commits (PS-2).

A stream's parts are durable as it runs: each receipt write carries the parts the store does
not hold yet, so a step's call is durable with its receipts and a result with the receipt that
completes it. The final row (B5) and the abort row (B6) drop the partial in their commit; what
a failed or crashed stream left is committed as a ``partial`` row by the next row the session
appends, before it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

from agent_session._rows import decode_body
from persistence import (
    Boundary,
    Committed,
    MemoryStore,
    OpState,
    PartialChunk,
    RowKind,
    SessionRecord,
    SqliteStore,
    Store,
)
from persistence.postgres import PostgresStore
from stream_manager import (
    Finish,
    FinishReason,
    OpBlocked,
    Persisted,
    ScriptStep,
    ToolCallPart,
    ToolResultPart,
    decode_parts,
    encode_part,
)
from tests.agent_session.support import T_, HookTool, X, session_rig
from tests.agent_session.test_startup_retry import (
    AGAIN,
    CONFIG,
    DEPLOY,
    deployed,
    envelope,
    left_behind,
    retried,
    row,
)
from tests.store_kit import commit

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "memory":
        return MemoryStore()
    if request.param == "postgres":
        return PostgresStore(request.getfixturevalue("pg_url"))
    return SqliteStore(tmp_path / "tk.db")


async def test_ps1_b4_a_step_and_a_result_are_durable_with_their_receipts(store: Store) -> None:
    # "lint" completes, then "pack" waits: the store holds lint's call, its finish and its
    # result (with its completed receipt), and pack's call; the final row drops all of it
    waiting, running = anyio.Event(), anyio.Event()
    pack = HookTool("pack", gate=waiting, before=lambda _call: running.set())
    lint = HookTool("lint", output="lint clean")
    async with session_rig(
        {"M": [T_("lint"), T_("pack"), X("packed")]}, store=store, tools=[lint, pack]
    ) as r:
        r.session().send("lint and pack it")
        with anyio.fail_after(5):
            await running.wait()
        loaded = await r.store.load("s1")
        assert loaded is not None
        [partial] = loaded.partials
        parts = decode_parts("s1", partial)
        kinds = [type(p).__name__ for p in parts]
        assert kinds == ["ToolCallPart", "Finish", "ToolResultPart", "ToolCallPart", "Finish"]
        result = parts[2]
        assert isinstance(result, ToolResultPart)
        assert result.output == "lint clean"
        receipts = (await r.store.receipts("s1")).records
        by_call = {rec.call_id: rec.state for rec in receipts}
        assert by_call[result.call_id] is OpState.COMPLETED
        waiting.set()
        await r.settle()
        loaded = await r.store.load("s1")
        assert loaded is not None
        assert loaded.partials == ()
        assert await r.kinds() == [RowKind.USER, RowKind.ASSISTANT]


class Recording(MemoryStore):
    """A memory store that keeps every boundary it committed."""

    def __init__(self) -> None:
        super().__init__()
        self.boundaries: list[Boundary] = []

    async def commit(self, session: str, boundary: Boundary, *, owner: str | None) -> Committed:
        done = await super().commit(session, boundary, owner=owner)
        self.boundaries.append(boundary)
        return done


async def test_ps1_b4_a_result_rides_the_write_of_the_receipt_that_completes_it() -> None:
    store = Recording()
    lint = HookTool("lint", output="lint clean")
    async with session_rig({"M": [T_("lint"), X("clean")]}, store=store, tools=[lint]) as r:
        r.session().send("lint it")
        await r.settle()
    [completing] = [
        b for b in store.boundaries if any(o.state is OpState.COMPLETED for o in b.operations)
    ]
    assert completing.partial is not None
    [stored] = completing.partial.parts
    assert b'"output":"lint clean"' in stored
    assert b'"tool-result"' in stored


async def test_ps2_a_call_the_crash_left_without_a_result_is_answered_in_the_row(
    store: Store,
) -> None:
    # the crash cut "pack" while it ran: the committed partial answers it (unknown), so the
    # retried request holds no call without a result (a real API refuses one)
    await left_behind(store, row(1, RowKind.USER), envelope=envelope("s1/1", 7))
    parts = (ToolCallPart(call_id="c-pack", name="pack"), Finish(reason=FinishReason.TOOL_CALLS))
    async with store:
        chunk = PartialChunk(stream="s1/1", start=0, parts=tuple(encode_part(p) for p in parts))
        await commit(store, "s1", partial=chunk)
    async with session_rig({"M": [X("checked")]}, store=store, sessions=(), config=CONFIG) as r:
        await r.settle()
        rows = await r.history()
    [answer] = decode_body(rows[1]).tool_results
    assert answer.call_id == "c-pack"
    assert answer.is_error
    assert "unknown" in str(answer.output)


async def test_ps2_a_partial_a_crash_left_is_committed_before_the_retry(store: Store) -> None:
    # the dead stream s1/1 ran bash (completed, its result durable in the partial): the retry
    # commits that partial as a row first, so the model sees the call and its result, and a
    # knowing repeat of the call is not refused as a lost result
    done = deployed("s1/1/1/0")
    call = ToolCallPart(call_id=done.call_id, name="bash", args=DEPLOY)
    parts = (
        call,
        Finish(reason=FinishReason.TOOL_CALLS),
        ToolResultPart(call_id=done.call_id, name="bash", output="deployed v7"),
    )
    await left_behind(store, row(1, RowKind.USER), envelope=envelope("s1/1", 7), receipts=(done,))
    async with store:
        chunk = PartialChunk(stream="s1/1", start=0, parts=tuple(encode_part(p) for p in parts))
        await commit(store, "s1", partial=chunk)
    async with retried(store, AGAIN, X("deployed twice, knowingly")) as (r, bash):
        rows = await r.history()
        loaded = await r.store.load("s1")
    assert [x.kind for x in rows] == [RowKind.USER, RowKind.PARTIAL, RowKind.ASSISTANT]
    assert rows[1].stream == "s1/1"
    assert rows[1].cut is None
    assert decode_body(rows[1]).tool_results[0].output == "deployed v7"
    assert loaded is not None
    assert loaded.partials == ()
    first = r.models["M"].requests[0].messages
    assert [m.role.value for m in first] == ["user", "assistant", "tool"]
    assert r.of(OpBlocked) == []
    assert len(bash.calls) == 1
    told = [e for e in r.of(Persisted) if e.what == "partial"]
    assert [e.id for e in told] == [rows[1].row_id]


async def test_ps2_a_failed_streams_parts_go_into_history_before_the_next_user_row(
    store: Store,
) -> None:
    # the stream fails after its lint step: its parts stay; the next send commits them as a
    # partial row before its own row, every call answered; nothing is left in the store
    failing = ScriptStep(error="terminal")
    lint = HookTool("lint", output="lint clean")
    async with session_rig(
        {"M": [T_("lint"), failing, X("answered")]}, store=store, tools=[lint]
    ) as r:
        r.session().send("lint it")
        await r.settle()
        assert await r.kinds() == [RowKind.USER]
        r.session().send("and now?")
        await r.settle()
        rows = await r.history()
        loaded = await r.store.load("s1")
    assert [x.kind for x in rows] == [
        RowKind.USER,
        RowKind.PARTIAL,
        RowKind.USER,
        RowKind.ASSISTANT,
    ]
    body = decode_body(rows[1])
    assert [c.name for c in body.tool_calls] == ["lint"]
    assert [res.output for res in body.tool_results] == ["lint clean"]
    assert loaded is not None
    assert loaded.partials == ()
    last = r.models["M"].requests[-1].messages
    assert [m.role.value for m in last] == ["user", "assistant", "tool", "user"]


async def test_ps2_a_damaged_partial_is_kept_and_not_committed(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "tk.db")
    async with store:
        await commit(store, "s1", create=SessionRecord(id="s1", model="M"))
        await commit(store, "s1", partial=PartialChunk(stream="s1/9", start=0, parts=(b"{",)))
    async with session_rig({"M": [X("fine")]}, store=store, sessions=(("s1", "M"),)) as r:
        r.session().send("hello")
        await r.settle()
        kinds = await r.kinds()
        loaded = await r.store.load("s1")
    assert kinds == [RowKind.USER, RowKind.ASSISTANT]
    assert loaded is not None
    assert [p.stream for p in loaded.partials] == ["s1/9"]


async def test_ps2_as6_an_edit_that_cuts_the_turn_drops_the_parts_its_failed_stream_left(
    store: Store,
) -> None:
    lint = HookTool("lint", output="lint clean")
    async with session_rig(
        {"M": [T_("lint"), ScriptStep(error="terminal"), X("answered anew")]},
        store=store,
        tools=[lint],
    ) as r:
        r.session().send("lint it")
        await r.settle()
        [first] = await r.history()
        await r.session().edit(first.row_id, "format it instead")
        await r.settle()
        rows = await r.history()
        loaded = await r.store.load("s1")
    assert [x.kind for x in rows] == [RowKind.USER, RowKind.ASSISTANT]
    assert decode_body(rows[0]).text == "format it instead"
    assert loaded is not None
    assert loaded.partials == ()
