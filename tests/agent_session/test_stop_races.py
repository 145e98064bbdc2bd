"""Stops and sends told inside an event's emission (a scenario action runs there): the engine
stays consistent and reaches idle (SM-14, AS-13).

Found by the generated interleavings of ``test_idle_drain.py``: each of these wedged the
session (an illegal transition raised inside the turn, the session left streaming or a phase
move made twice).
"""

from __future__ import annotations

from agent_session import EngineEvent, EntryDequeued, Phase
from message_queue import EntryKind
from stream_manager import (
    LoopStopped,
    ScriptStep,
    StreamAborted,
    StreamFailed,
    StreamStarted,
    ToolCallPart,
)
from tests.agent_session.support import T_, HookTool, X, session_rig


async def test_sm14_a_hard_stop_landing_while_a_step_fails_aborts_the_stream() -> None:
    """The step raises after the stop moved the stream to stopping: the abort wins."""
    async with session_rig({"M": [ScriptStep(error="retryable")]}) as r:
        session = r.session()

        def stop_at_start(event: EngineEvent) -> None:
            if isinstance(event, StreamStarted):
                session.stop()

        r.on(stop_at_start)
        session.send("go")
        await r.settle()
        assert [e.reason for e in r.of(StreamAborted)] == ["user"]
        assert r.of(StreamFailed) == []
        assert session.phase is Phase.IDLE


async def test_sm14_a_hard_stop_told_inside_the_loop_stopped_event_aborts_the_stream() -> None:
    """A Stop inside ``stop`` (the loop's decision, before ``stream-end``): the abort wins."""
    script = [T_("bash"), X("never said")]
    async with session_rig({"M": script}, tools=[HookTool("bash")]) as r:
        session = r.session()

        def wake_then_stop(event: EngineEvent) -> None:
            if isinstance(event, LoopStopped):
                session.stop()

        def wake(_: ToolCallPart) -> None:
            session.enqueue("w", kind=EntryKind.WAKE, entry="w")

        r.tools["bash"].before = wake
        r.on(wake_then_stop)
        session.send("go")
        await r.settle()
        assert [e.reason for e in r.of(StreamAborted)] == ["user"]
        assert session.phase is Phase.IDLE
        assert not session.owes()


async def test_as13_an_entry_queued_inside_the_dequeued_event_queues_behind_it() -> None:
    async with session_rig({"M": [X("first"), X("second")]}) as r:
        session = r.session()

        def queue_another(event: EngineEvent) -> None:
            if isinstance(event, EntryDequeued) and event.entry == "w1":
                session.enqueue("second", kind=EntryKind.WAKE, entry="w2")

        r.on(queue_another)
        session.enqueue("first", kind=EntryKind.WAKE, entry="w1")
        await r.settle()
        assert [e.entry for e in r.of(EntryDequeued)] == ["w1", "w2"]
        assert session.phase is Phase.IDLE
        assert len(r.of(StreamAborted)) == 0
        assert len(session.queue) == 0
