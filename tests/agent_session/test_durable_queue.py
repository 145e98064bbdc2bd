"""The durable queue (PS-1, issue "nothing a user typed is lost"): committed before ``queued``,
off the queue in the commit that accepts it, rebuilt after a restart by a documented policy.

A restart here is an engine leaving (its tasks cancelled, nothing more written) and a new one
opening the same ``MemoryStore`` (which keeps its contents when closed, like a file). The
crash itself (no write after the kill) is the harness's (``docs/scenarios``, ``make crash``).
"""

from __future__ import annotations

import anyio
import pytest

from agent_session import (
    AgentSession,
    DeliveryState,
    EntryCanceled,
    EntryDequeued,
    EntryQueued,
    Phase,
)
from message_queue import (
    CancelToken,
    EntryKind,
    MessageQueue,
    NewMessage,
    decode_entry,
    encode_entry,
)
from persistence import (
    Boundary,
    Committed,
    MemoryStore,
    QueuedEntryRecord,
    QueueSnapshot,
    SessionRecord,
)
from stream_manager import Persisted
from tests.agent_session.support import T_, FailingGate, HookTool, Rig, X, session_rig


class SpyStore(MemoryStore):
    """A MemoryStore that records every boundary, and can fail queue-only commits."""

    def __init__(self) -> None:
        super().__init__()
        self.boundaries: list[Boundary] = []
        self.fail_queue_writes = 0

    async def commit(self, session: str, boundary: Boundary, *, owner: str | None) -> Committed:
        if boundary.queue is not None and not boundary.rows and self.fail_queue_writes:
            self.fail_queue_writes -= 1
            raise OSError("the disk is full")
        done = await super().commit(session, boundary, owner=owner)
        self.boundaries.append(boundary)
        return done


async def queued_texts(store: MemoryStore, session: str = "s1") -> list[tuple[str, ...]]:
    """What the store's queue of ``session`` holds: each entry's texts, in order."""
    opened = not store.owner
    if opened:
        await store.open()
    try:
        query = await store.queued(session)
    finally:
        if opened:
            await store.close()
    return [tuple(m.text for m in decode_entry(r.body, r.entry_id).messages) for r in query.records]


async def building(r: Rig) -> AgentSession:
    """``s1`` sent "build it" and held inside its tool: busy, so what it is sent is queued."""
    s = r.session()
    s.send("build it")
    while not r.tools["bash"].calls:  # the turn's task runs up to the held tool
        await anyio.lowlevel.checkpoint()
    return s


def held_tool(gate: anyio.Event) -> HookTool:
    """A tool that runs until ``gate`` is set: the session stays busy meanwhile."""
    return HookTool("bash", gate=gate)


# ---------------------------------------------------------------- decide, persist, tell


async def test_ps1_a_message_sent_while_busy_is_committed_before_it_is_told_queued() -> None:
    store = SpyStore()
    gate = anyio.Event()
    async with session_rig(
        {"M": [T_("bash"), X("built"), X("linted")]}, tools=[held_tool(gate)], store=store
    ) as r:
        s = await building(r)
        assert s.phase is Phase.STREAMING
        delivery = s.send("and lint it", entry="lint")
        assert delivery.state is DeliveryState.PENDING  # not durable yet: not told either
        assert not r.of(EntryQueued)
        assert (await delivery).state is DeliveryState.QUEUED
        told = [e for e in r.events if isinstance(e, EntryQueued | Persisted)]
        assert [(type(e).__name__, getattr(e, "what", None)) for e in told[-2:]] == [
            ("Persisted", "queue"),
            ("EntryQueued", None),
        ]
        assert await queued_texts(store) == [("and lint it",)]
        gate.set()
        await r.settle()
    assert await queued_texts(store) == []


async def test_ps1_acceptance_takes_the_entry_off_the_queue_in_the_row_commit() -> None:
    store = SpyStore()
    gate = anyio.Event()
    async with session_rig(
        {"M": [T_("bash"), X("built"), X("linted")]}, tools=[held_tool(gate)], store=store
    ) as r:
        s = await building(r)
        await s.send("and lint it", entry="lint", mode="turn-end")
        gate.set()
        await r.settle()
    [accepting] = [
        b for b in store.boundaries if b.rows and b.rows[0].body.find(b"and lint it") >= 0
    ]
    assert accepting.queue is not None
    assert accepting.queue.entries == ()
    assert [
        b.queue.entries[0].entry_id for b in store.boundaries if b.queue and b.queue.entries
    ] == ["lint"]


async def test_ps1_an_entry_queued_on_an_idle_session_writes_no_queue() -> None:
    # dispatched at once: durable with its row, like a direct send (nothing to take back)
    store = SpyStore()
    async with session_rig({"M": [X("woken")]}, store=store) as r:
        r.session().enqueue("tasks finished", kind=EntryKind.WAKE, entry="w")
        await r.settle()
    assert [b for b in store.boundaries if b.queue is not None] == []
    assert [e.entry for e in r.of(EntryDequeued)] == ["w"]


async def test_ps1_an_agent_initiated_entry_writes_nothing_of_its_own() -> None:
    # its producer lives in this process: a wake queued and withdrawn on a busy session is
    # never worth a write (the incident's resume path stays free of queue commits)
    store = SpyStore()
    gate = anyio.Event()
    async with session_rig(
        {"M": [T_("bash"), X("built")]}, tools=[held_tool(gate)], store=store
    ) as r:
        s = await building(r)
        token = s.enqueue("tasks finished", kind=EntryKind.WAKE, entry="w", mode="turn-end")
        assert [e.entry for e in r.of(EntryQueued)] == ["w"]  # told at once
        token.cancel()
        gate.set()
        await r.settle()
    assert [b for b in store.boundaries if b.queue is not None] == []
    assert [(e.entry, e.reason) for e in r.of(EntryCanceled)] == [("w", "withdrawn")]


async def test_ps1_a_cleared_queue_is_cleared_durably() -> None:
    store = SpyStore()
    gate = anyio.Event()
    async with session_rig(
        {"M": [T_("bash"), X("built")]}, tools=[held_tool(gate)], store=store
    ) as r:
        s = await building(r)
        await s.send("one", mode="turn-end")
        await s.send("two", mode="turn-end")
        assert await queued_texts(store) == [("one", "two")]  # batched: one entry, two adds
        s.clear_queue()
        await anyio.lowlevel.checkpoint()
        assert await queued_texts(store) == []
        gate.set()
        await r.settle()


# ---------------------------------------------------------------- deliveries


async def test_ps1_a_direct_send_is_safe_once_its_row_is_durable() -> None:
    async with session_rig({"M": [X("hello back")]}) as r:
        delivery = r.session().send("hello")
        assert delivery.state is DeliveryState.PENDING
        assert (await delivery).state is DeliveryState.ACCEPTED
        assert delivery.safe
        await r.settle()


async def test_ps1_a_refused_direct_send_is_not_safe_and_says_why() -> None:
    async with session_rig({"M": []}, gate=FailingGate(1, purpose="send")) as r:
        delivery = await r.session().send("hello")
        await r.settle()
    assert delivery.state is DeliveryState.REFUSED
    assert not delivery.safe
    assert delivery.detail is not None
    assert "gate refused the send" in delivery.detail


async def test_ps1_a_queue_write_that_fails_leaves_the_message_queued_in_memory_only() -> None:
    store = SpyStore()
    gate = anyio.Event()
    async with session_rig(
        {"M": [T_("bash"), X("built"), X("linted")]}, tools=[held_tool(gate)], store=store
    ) as r:
        s = await building(r)
        store.fail_queue_writes = 1
        delivery = await s.send("and lint it", mode="turn-end")
        assert delivery.state is DeliveryState.NOT_DURABLE
        assert not delivery.safe
        assert delivery.detail is not None
        assert "the disk is full" in delivery.detail
        assert [e.entry for e in r.of(EntryQueued)] == [delivery.message]  # queued all the same
        gate.set()
        await r.settle()
    assert [q.messages[-1].text for q in r.models["M"].requests][-1] == "and lint it"  # it ran


# ---------------------------------------------------------------- after a restart


async def busy_with_queue(
    store: MemoryStore, *messages: NewMessage, sends: tuple[str, ...]
) -> None:
    """An engine whose turn is held in a tool while ``messages``, then ``sends`` queue; it stops.

    An agent-initiated message commits nothing of its own: it is durable only because a user's
    send after it commits the whole queue.
    """
    gate = anyio.Event()
    async with session_rig({"M": [T_("bash")]}, tools=[held_tool(gate)], store=store) as r:
        s = await building(r)
        for message in messages:
            s.enqueue_message(message)
        for text in sends:
            assert (await s.send(text, mode="turn-end")).safe
        for _ in range(20):  # let their commits land
            await anyio.lowlevel.checkpoint()
    # leaving the rig shuts the engine down with the turn in flight


async def test_ps1_a_message_queued_when_the_process_stopped_is_answered_after_it() -> None:
    store = MemoryStore()
    await busy_with_queue(store, sends=("and lint it", "then test it"))
    assert await queued_texts(store) == [("and lint it", "then test it")]
    async with session_rig({"M": [X("linted and tested")]}, store=store) as r:
        await r.settle()
    requests = r.models["M"].requests
    assert [q.messages[-1].text for q in requests] == ["and lint it\nthen test it"]  # once, batched
    assert await queued_texts(store) == []


@pytest.mark.parametrize("kind", [EntryKind.WAKE, EntryKind.REPORT, EntryKind.SYSTEM])
async def test_ps1_an_agent_initiated_entry_is_dropped_at_restart_with_reason_restart(
    kind: EntryKind,
) -> None:
    store = MemoryStore()
    agent = NewMessage(text=f"a {kind} from a dead producer", kind=kind, id="a1", sealed=True)
    await busy_with_queue(store, agent, sends=("and lint it",))
    assert len(await queued_texts(store)) == 2
    async with session_rig({"M": [X("linted")]}, store=store) as r:
        await r.settle()
    canceled = [(e.entry, e.reason) for e in r.of(EntryCanceled)]
    assert canceled == [("a1", "restart")]
    [dropped] = [i for i, e in enumerate(r.events) if isinstance(e, EntryCanceled)]
    before = r.events[dropped - 1]
    assert isinstance(before, Persisted)
    assert before.what == "queue"
    assert [q.messages[-1].text for q in r.models["M"].requests] == ["and lint it"]
    assert await queued_texts(store) == []


async def test_ps1_a_withdrawn_user_entry_is_rebuilt_withdrawn_and_never_runs() -> None:
    store = MemoryStore()
    token = CancelToken()
    user = NewMessage(text="never mind this", kind=EntryKind.USER, id="u1", cancel_token=token)
    gate = anyio.Event()
    async with session_rig({"M": [T_("bash")]}, tools=[held_tool(gate)], store=store) as r:
        s = await building(r)
        s.enqueue_message(user)
        for _ in range(10):
            await anyio.lowlevel.checkpoint()
        token.cancel("typed by mistake")  # committed withdrawn: a restart must not run it
        for _ in range(10):
            await anyio.lowlevel.checkpoint()
    assert await queued_texts(store) == [("never mind this",)]
    async with session_rig({"M": [X("built")]}, store=store) as r:  # the build turn, retried
        await r.settle()
    assert [(e.entry, e.reason) for e in r.of(EntryCanceled)] == [("u1", "typed by mistake")]
    [retried] = r.models["M"].requests
    assert [m.text for m in retried.messages][-1] != "never mind this"
    assert retried.stream == "s1/2"
    assert await queued_texts(store) == []


async def test_ps1_a_damaged_queued_entry_is_kept_and_never_dispatched_half_read() -> None:
    store = MemoryStore()
    async with store:
        owner = store.owner
        await store.commit("s1", Boundary(create=SessionRecord(id="s1", model="M")), owner=owner)
        queue = MessageQueue()
        queue.add(NewMessage(text="and lint it"))
        (state,) = queue.export()
        records = (
            QueuedEntryRecord(
                session="s1", entry_id="bad", position=0, kind="user", body=b'{"id": 7}'
            ),
            QueuedEntryRecord(
                session="s1", entry_id=state.id, position=1, kind="user", body=encode_entry(state)
            ),
        )
        snapshot = QueueSnapshot(version=3, entries=records)
        await store.commit("s1", Boundary(queue=snapshot), owner=owner)
    async with session_rig({"M": [X("linted"), X("more")]}, store=store) as r:
        await r.settle()
        await r.session().send("one more")
        await r.settle()
    assert [q.messages[-1].text for q in r.models["M"].requests][:1] == ["and lint it"]
    async with store:
        left = await store.queued("s1")
    assert [rec.entry_id for rec in left.records] == ["bad"]  # kept for a person to see


class StuckQueueStore(SpyStore):
    """A store whose queue-only commits never return (a disk that hangs)."""

    async def commit(self, session: str, boundary: Boundary, *, owner: str | None) -> Committed:
        if boundary.queue is not None and not boundary.rows:
            await anyio.Event().wait()
        return await super().commit(session, boundary, owner=owner)


async def test_ps1_a_delivery_whose_queue_write_is_cut_short_is_settled_not_durable() -> None:
    # nobody awaiting a send waits for ever: the engine closing cuts the write short, and the
    # delivery says the message is not durable
    store = StuckQueueStore()
    gate = anyio.Event()
    async with session_rig({"M": [T_("bash")]}, tools=[held_tool(gate)], store=store) as r:
        s = await building(r)
        delivery = s.send("and lint it", mode="turn-end")
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
        assert not delivery.settled  # its write hangs
    assert delivery.state is DeliveryState.NOT_DURABLE
    assert delivery.detail is not None
    assert "cut short" in delivery.detail
