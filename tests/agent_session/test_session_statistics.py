"""One view of a session: ``statistics()`` is what ``wait_idle``, ``describe()`` and tests read.

``busy`` (a turn is claimed, or a manual send is in preflight: a ``send`` now queues) and
``settled`` (nothing running, scheduled or being written: what ``wait_idle`` waits for) are
two notions with two names; a session can be neither (its turn ended, its sweep not yet run).
"""

from __future__ import annotations

import anyio

from agent_session import AgentSession, Phase, PhaseChanged, SessionStatistics
from message_queue import DispatchMode, EntryKind
from persistence import Boundary, Committed, MemoryStore
from stream_manager import ToolCallPart
from tests.agent_session.support import T_, HookTool, X, session_rig


class HoldingStore(MemoryStore):
    """A MemoryStore whose first commit that deletes rows waits until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.reached = anyio.Event()
        self.release = anyio.Event()

    async def commit(self, session: str, boundary: Boundary, *, owner: str | None) -> Committed:
        if boundary.delete and not self.reached.is_set():
            self.reached.set()
            await self.release.wait()
        return await super().commit(session, boundary, owner=owner)


async def test_statistics_read_mid_turn_the_phase_the_queue_the_tools_and_the_task() -> None:
    seen: list[tuple[SessionStatistics, str]] = []

    def queue_and_look(_: ToolCallPart) -> None:
        s = r.session()
        s.enqueue("later", kind=EntryKind.WAKE, entry="w9", mode=DispatchMode.TURN_END)
        seen.append((s.statistics(), s.describe()))

    async with session_rig(
        {"M": [T_("bash"), X("first answer"), X("the wake's answer")]},
        tools=[HookTool("bash", before=queue_and_look)],
    ) as r:
        r.session().send("go")
        await r.settle()
        after = r.session().statistics()
    [(during, described)] = seen
    assert during == SessionStatistics(
        session="s1", phase=Phase.STREAMING, queued=("w9",), tools=1, tasks=1
    )
    assert (during.busy, during.settled) == (True, False)
    assert described == "<AgentSession s1 streaming queue=1 tools=1 tasks=1>"
    assert after == SessionStatistics(session="s1", phase=Phase.IDLE)  # nothing else is set
    assert (after.busy, after.settled) == (False, True)


async def test_busy_and_settled_are_two_notions_a_turn_just_ended_is_neither() -> None:
    seen: list[tuple[bool, bool, SessionStatistics]] = []

    async with session_rig({"M": [X("only answer")]}) as r:
        s = r.session()

        def at_idle(event: object) -> None:
            if isinstance(event, PhaseChanged) and event.to is Phase.IDLE:
                seen.append((s.busy, s.settled, s.statistics()))

        r.on(at_idle)
        s.send("go")
        await s.wait_idle()
        assert (s.busy, s.settled) == (False, True)
    [(busy, settled, stats)] = seen
    assert (busy, settled) == (False, False)  # a send would go now, yet wait_idle waits
    assert (stats.busy, stats.settled) == (busy, settled)
    assert stats.phase is Phase.IDLE
    assert stats.sweep_scheduled  # AS-2: every arrival at IDLE schedules the sweep
    assert stats.tasks == 2  # the turn's task, and the sweep to run after it in that task


async def test_wait_idle_waits_for_a_host_calls_write_in_flight() -> None:
    """An edit truncates history from the host's own task: no session task counts it, yet the
    session is not settled until that write returned (``statistics().writing``)."""
    store = HoldingStore()
    returned: list[SessionStatistics] = []
    async with session_rig({"M": [X("first"), X("after the edit")]}, store=store) as r:
        s = r.session()
        s.send("go")
        await r.settle()
        first_user_row = (await r.history())[0].row_id

        async def waiter() -> None:
            await s.wait_idle()
            returned.append(s.statistics())

        async with anyio.create_task_group() as tg:
            tg.start_soon(s.edit, first_user_row, "instead")
            await store.reached.wait()
            during = s.statistics()
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert returned == []  # the truncation is still being written
            store.release.set()
        await r.settle()
    assert during == SessionStatistics(session="s1", phase=Phase.IDLE, writing=1)
    assert (during.busy, during.settled) == (False, False)
    [after] = returned
    assert after.settled


async def test_one_name_each_disposed_is_a_property_and_settled_replaces_idle() -> None:
    assert not hasattr(AgentSession, "is_disposed")
    assert not hasattr(AgentSession, "idle")
    async with session_rig({"M": [X("unused")]}) as r:
        s = r.session()
        assert not s.statistics().disposed
        s.enqueue("pending", kind=EntryKind.WAKE, entry="w4", mode=DispatchMode.TURN_END)
        await s.dispose()
        assert s.disposed
        await s.wait_idle()
        stats = s.statistics()
    assert stats.disposed
    assert stats.phase is Phase.DISPOSED
    assert stats.settled
    assert s.describe() == "<AgentSession s1 disposed>"
