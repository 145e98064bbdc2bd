"""A session's tasks: one whose last effects start another goes on as that one (``_task``)."""

from __future__ import annotations

import sys

import anyio

from agent_session import EngineEvent, EntryDequeued
from message_queue import EntryKind, NewMessage
from persistence import RowKind
from tests.agent_session.support import X, session_rig


async def test_as13_a_queue_longer_than_the_recursion_limit_drains_in_order() -> None:
    # Each turn's outcome dispatches the next queued entry as the finishing task's successor:
    # a loop in that task, never a nested call, so a long queue cannot exhaust the stack.
    n = sys.getrecursionlimit() + 200
    async with session_rig({"M": [X(f"answer {i}") for i in range(n + 1)]}) as r:
        session = r.session()
        session.send("first")
        for i in range(n):
            session.enqueue_message(NewMessage(text=f"wake {i}", kind=EntryKind.WAKE, id=f"w{i}"))
        await r.settle()
        assert [e.entry for e in r.of(EntryDequeued)] == [f"w{i}" for i in range(n)]
        answers = [row for row in await r.history() if row.kind is RowKind.ASSISTANT]
        assert len(answers) == n + 1


async def test_as13_cancelled_between_a_turn_and_its_successor_the_engine_still_closes() -> None:
    # The engine's tasks are cancelled right as a turn's outcome hands the next queued entry to
    # its successor: the task ends there (the successor never runs) and the engine closes.
    dequeued: list[str] = []
    with anyio.fail_after(5), anyio.CancelScope() as scope:
        async with session_rig({"M": [X("a"), X("b"), X("c")]}) as r:
            session = r.session()

            def cancel_at_second_dequeue(event: EngineEvent) -> None:
                if isinstance(event, EntryDequeued):
                    dequeued.append(event.entry)
                    if len(dequeued) == 2:
                        scope.cancel()

            r.on(cancel_at_second_dequeue)
            session.send("first")
            for i in range(3):
                session.enqueue_message(
                    NewMessage(text=f"wake {i}", kind=EntryKind.WAKE, id=f"w{i}")
                )
            await r.settle()
    assert scope.cancelled_caught
    assert dequeued == ["w0", "w1"]
