"""The inbox: a host call made while the session calls out never re-enters the interpreter.

An observer of an event the session tells (a scenario action, a host hook), a cancellation
callback or a stop the session requests is host code the shell is calling. A session call made
from there is decided at once (its answer is the call's return value), and its effects wait in
the inbox: they are performed after the call-out returns, before the next effect. So every
observer sees an event before anything a call made inside it causes.
"""

from __future__ import annotations

from agent_session import EngineEvent, EntryDequeued, EntryQueued
from agent_session.harness.trace import event_name
from message_queue import NewMessage
from message_queue._entries import OnCanceled
from stream_manager import StreamStarted
from tests.agent_session.support import X, session_rig


async def test_as16_a_clear_inside_an_event_is_seen_after_every_observer_saw_the_event() -> None:
    async with session_rig({"M": [X("first"), X("second")]}) as r:
        late: list[str] = []
        r.engine.add_observer(lambda event: late.append(event_name(event)))
        session = r.session()

        def hook(event: EngineEvent) -> None:
            if isinstance(event, StreamStarted) and event.stream == "s1/1":
                session.enqueue("entry A", kind="wake", entry="A")
                session.enqueue("entry B", kind="wake", entry="B")
            elif isinstance(event, EntryDequeued) and event.entry == "A":
                session.clear_queue("cleared inside dequeued")

        r.on(hook)
        session.send("go")
        await r.settle()
        tail = late[late.index("dequeued") :]
        assert tail[:3] == ["dequeued", "cleared", "entry-canceled"]
        assert r.names() == late  # the first observer and the late one saw the same order


async def test_as16_a_send_from_a_cancellation_callback_waits_for_the_other_callbacks() -> None:
    """Two removed entries: both callbacks run before what the first one's send causes."""
    async with session_rig({"M": [X("first"), X("the late send")]}) as r:
        session = r.session()
        log: list[str] = []

        def canceled(name: str) -> OnCanceled:
            def on_canceled(reason: str) -> None:
                log.append(f"canceled {name}")
                if name == "P":
                    session.send("sent from a callback", entry="late")

            return on_canceled

        def hook(event: EngineEvent) -> None:
            if isinstance(event, StreamStarted) and event.stream == "s1/1":
                for name in ("P", "Q"):
                    message = NewMessage(text=f"entry {name}", id=name, on_canceled=canceled(name))
                    session.enqueue_message(message)
                session.clear_queue("cleared while streaming")
            elif isinstance(event, EntryQueued) and event.entry == "late":
                log.append("queued late")

        r.on(hook)
        session.send("go")
        await r.settle()
        assert log == ["canceled P", "canceled Q", "queued late"]
        assert [row.body for row in await r.history()][-1]  # the late send ran as a turn
        assert "the late send" in str(await r.history())
