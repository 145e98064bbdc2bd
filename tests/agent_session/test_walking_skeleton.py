"""The incident (a withdrawn wake) end to end through the Python API: the session's view."""

from __future__ import annotations

from agent_session import ContinuationEnded, ContinuationOwed, EngineEvent, Phase, ResumeAttempted
from message_queue import EntryKind
from persistence import RowKind
from stream_manager import StreamEnded, StreamStarted, ToolCallPart
from tests.agent_session.support import T_, HookTool, X, session_rig


async def test_st01_withdrawn_wake_resumes_the_interrupted_turn() -> None:
    def queue_wake(_: ToolCallPart) -> None:
        r.session().enqueue("monitors finished", kind=EntryKind.WAKE, entry="wake")

    def withdraw_at_first_stream_end(event: EngineEvent) -> None:
        if isinstance(event, StreamEnded) and len(r.of(StreamStarted)) == 1:
            r.session().withdraw("wake", "the model read the output itself")

    async with session_rig(
        {"M": [T_("bash"), T_("task_await"), X("All three tasks passed.")]},
        tools=[HookTool("task_await", before=queue_wake)],
    ) as r:
        r.on(withdraw_at_first_stream_end)
        r.session().send("start three monitored tasks and wait")
        await r.settle()
        session = r.session()
        assert session.phase is Phase.IDLE
        assert not session.owes()
        (owed,) = r.of(ContinuationOwed)
        assert (owed.remaining, owed.model) == (6, "M")
        starts = r.of(StreamStarted)
        assert [(s.cause, s.budget) for s in starts] == [("send", 8), ("resume", 6)]
        assert [e.how for e in r.of(ContinuationEnded)] == ["consumed"]
        assert [e.outcome for e in r.of(ResumeAttempted)] == ["started"]
        assert await r.kinds() == [
            RowKind.USER,
            RowKind.ASSISTANT,
            RowKind.SENTINEL,
            RowKind.ASSISTANT,
        ]
