"""A write the cleanup bound cut short is decided as failed: nothing of it is told.

The stream manager bounds its shielded milestone awaits (``CLEANUP_S``); when a host store
hangs on the final row of a cut turn, the bound cancels the write. Its outcome is unknown, so
the machine decides it failed, as it would a write that raised: the cut it carried never
existed (no ``owed``, nothing owed in memory), and the stream ends in ``store_write``.
"""

from __future__ import annotations

import anyio

from agent_session import ContinuationOwed, EngineConfig
from persistence import Boundary, Committed, MemoryStore, RowKind
from stream_manager import StreamFailed
from tests.agent_session.support import T_, HookTool, X, session_rig

BOUND_S = 6.0  # not the default bound


class CutRowHangs(MemoryStore):
    """Commits of a row carrying a cut record never return (until cancelled)."""

    async def commit(self, session: str, boundary: Boundary, *, owner: str | None) -> Committed:
        if any(row.cut is not None for row in boundary.rows):
            await anyio.sleep_forever()
        return await super().commit(session, boundary, owner=owner)


async def test_st3_a_cut_rows_write_cut_short_by_the_bound_owes_nothing() -> None:
    config = EngineConfig(max_stream_steps=8, cleanup_s=BOUND_S)
    store = CutRowHangs()

    def queue_wake(_: object) -> None:
        r.session().enqueue("monitors finished", kind="wake", entry="W")

    tools = [HookTool("task_await", before=queue_wake)]
    script = [T_("task_await"), X("never: the cut turn is not resumed"), X("the wake's turn")]
    async with session_rig({"M": script}, tools=tools, store=store, config=config) as r:
        r.session().send("start the tasks")
        await r.settle()
        assert r.of(ContinuationOwed) == []
        assert not r.session().owes()
        assert [e.type for e in r.of(StreamFailed)] == ["store_write"]
        assert all(row.cut is None for row in await r.history())
        assert RowKind.ASSISTANT in await r.kinds()  # the wake ran as a turn of its own
