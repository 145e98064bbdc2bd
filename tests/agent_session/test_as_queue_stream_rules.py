"""AgentSession rules AS-12 to AS-31 (``docs/rules.md``): queue dispatch, stream events,
the provider-executed tool soft stop, Stop, edit and dispose.

Each test drives the engine through the session API with the rig of ``support.py`` and asserts
what would change if its rule were removed. Where a rule names a mux product feature the port
does not have (the background-process layer's tool-end flag, goal accounting and continuation,
compaction, the auto-retry manager and abandon marker, usage pricing), a comment says so and the
generic part is tested.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

import anyio
import pytest

from agent_session import (
    AgentSession,
    ContinuationEnded,
    ContinuationOwed,
    DeliveryState,
    EngineConfig,
    EngineEvent,
    EntryCanceled,
    EntryDequeued,
    EntryQueued,
    Persisted,
    Phase,
    PhaseChanged,
    QueueCleared,
    ResumeAttempted,
    SessionDisposed,
)
from agent_session._rows import decode_body
from message_queue import (
    DispatchMode,
    EntryKind,
    MessageMetadata,
    MetadataType,
    NewMessage,
    SendFailure,
    SendOptions,
)
from persistence import HistoryRow, RowKind
from stream_manager import (
    AbortReason,
    Finish,
    FinishReason,
    LoopStopped,
    ModelRequest,
    Part,
    ScriptStep,
    ScriptToolCall,
    StepCompleted,
    StreamAborted,
    StreamEnded,
    StreamFailed,
    StreamStarted,
    TextPart,
    ToolCallEnded,
    ToolCallPart,
    ToolCallStarted,
    ToolKind,
    ToolResultPart,
)
from tests.agent_session.support import T_, HookTool, P, Rig, X, session_rig
from tests.agent_session.test_as_send_rules import (
    CUT_SCRIPT,
    BlockingGate,
    C,
    Calls,
    Hold,
    HookStore,
    causes,
    phases,
    texts,
    wake,
    wake_tool,
    withdraw_at_first_stream_end,
)
from tests.store_kit import history

# ---------------------------------------------------------------- helpers


class PartsModel:
    """A model whose steps are explicit part lists; a :class:`Hold` in a list pauses the step.

    The ScriptedModel always streams a provider call and its result back to back and client
    calls after the text; sibling and interleaving cases (AS-20; a soft stop that waits for every
    provider call of the step) need other orders.
    """

    def __init__(self, model_id: str, steps: Sequence[Sequence[Part | Hold]]) -> None:
        self._id = model_id
        self._steps = [list(step) for step in steps]
        self.requests: list[ModelRequest] = []

    @property
    def id(self) -> str:
        return self._id

    def stream_step(self, request: ModelRequest) -> AsyncIterator[Part]:
        self.requests.append(request)
        return self._play(self._steps.pop(0))

    async def _play(self, step: list[Part | Hold]) -> AsyncIterator[Part]:
        for item in step:
            if isinstance(item, Hold):
                await item.wait()
            else:
                yield item


def text_step(text: str) -> list[Part | Hold]:
    return [TextPart(text=text), Finish(reason=FinishReason.STOP)]


def provider_call(call: str, tool: str = "web_search") -> ToolCallPart:
    return ToolCallPart(call_id=call, name=tool, provider_executed=True)


def provider_result(call: str, tool: str = "web_search") -> ToolResultPart:
    return ToolResultPart(call_id=call, name=tool, output={"ok": True}, provider_executed=True)


def spy_stops(r: Rig, monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, AbortReason | None]]:
    """Record every ``request_stop_nowait`` the session makes: ``(soft, reason)``."""
    manager = r.engine.manager
    real = manager.request_stop_nowait
    stops: list[tuple[bool, AbortReason | None]] = []

    def spy(session: str, *, soft: bool = False, reason: AbortReason | None = None) -> None:
        stops.append((soft, reason))
        real(session, soft=soft, reason=reason)

    monkeypatch.setattr(manager, "request_stop_nowait", spy)
    return stops


def queued(r: Rig, entry: str) -> bool:
    return any(e.entry == entry for e in r.of(EntryQueued))


def wake_at_provider_call(r_of: Callable[[], Rig], calls: Calls | None = None) -> None:
    """Queue wake ``W`` when the first provider-executed call starts (before its result)."""
    r = r_of()

    def hook(event: EngineEvent) -> None:
        if isinstance(event, ToolCallStarted) and event.provider and not queued(r, "W"):
            r.session().enqueue_message(wake("W", calls))

    r.on(hook)


def report(text: str, calls: Calls | None = None) -> NewMessage:
    """A same-turn report for correlation ``C``: sealed, continuing the delegated turn."""
    return NewMessage(
        text=text,
        kind=EntryKind.REPORT,
        id="R",
        metadata=MessageMetadata(type=MetadataType.WORKSPACE_TURN, correlation=C),
        workspace_turn_continuation=True,
        on_canceled=calls.canceled if calls else None,
    )


def soft_cut_script(*after: ScriptStep) -> list[ScriptStep]:
    """A client step, then a provider-tool step that a queued wake soft-stops."""
    return [T_("bash"), P("web_search"), *after]


async def rows(r: Rig) -> list[HistoryRow]:
    return await r.history()


# ---------------------------------------------------------------- AS-12
# The background-process layer's "tool-end dispatch pending" flag has no port; the step loop's
# live reader (the stream's has_queued_tool_end) is what the queued entry reaches.


async def test_as12_input_while_streaming_is_queued_and_waits_for_the_boundary() -> None:
    async with session_rig(
        {"M": [T_("bash"), X("answer to u")]},
        tools=[HookTool("bash", before=lambda _: r.session().send("u"))],
    ) as r:
        r.session().send("start")
        await r.settle()
        (queued,) = r.of(EntryQueued)
        assert (queued.kind, queued.mode, queued.into) == ("user", "tool-end", None)
        (stop,) = r.of(LoopStopped)[:1]
        assert stop.why == "queued-message"
        first_end = r.of(StreamEnded)[0]
        (dequeued,) = r.of(EntryDequeued)
        assert r.events.index(queued) < r.events.index(first_end) < r.events.index(dequeued)
        assert causes(r) == ["send", "queue"]


async def test_as12_a_send_while_another_is_in_preflight_is_queued() -> None:
    async with session_rig({"M": [X("for a"), X("for b")]}) as r:
        session = r.session()
        session.send("a")
        delivery = await session.send("b")
        assert delivery.state is DeliveryState.QUEUED  # durable in the queue, told queued
        assert len(r.of(EntryQueued)) == 1
        await r.settle()
        assert causes(r) == ["send", "queue"]
        assert [q.messages[-1].text for q in r.models["M"].requests] == ["a", "b"]


# ---------------------------------------------------------------- AS-13


async def test_as13_q16_a_failing_queued_send_does_not_block_the_next() -> None:
    calls = Calls()
    async with session_rig({"M": [X("for B")]}) as r:
        session = r.session()
        session.enqueue_message(wake("A", calls, options=SendOptions(model="bad")))
        session.send("B")
        await r.settle()
        assert calls.names() == ["failed"]
        assert calls.failures[0].type == "invalid_model_string"
        assert next(e.entry for e in r.of(EntryDequeued)) == "A"
        assert len(r.of(EntryDequeued)) == 2
        assert causes(r) == ["queue"]
        assert r.models["M"].requests[0].messages[-1].text == "B"
        assert session.phase is Phase.IDLE


async def test_as13_q10_a_withdrawn_head_is_canceled_then_the_next_entry_dispatches() -> None:
    calls = Calls()
    readers: list[tuple[bool, DispatchMode, bool]] = []

    def queue_then_withdraw(_: ToolCallPart) -> None:
        session = r.session()
        session.enqueue_message(wake("W", calls))
        session.send("u", entry="u", mode="turn-end")
        session.withdraw("W", "consumed")
        queue = session.queue
        readers.append(
            (queue.has_queued(DispatchMode.TOOL_END), queue.next_dispatch_mode(), queue.is_empty)
        )

    async with session_rig(
        {"M": [T_("bash"), X("S1 done"), X("answer to u")]},
        tools=[HookTool("bash", before=queue_then_withdraw)],
    ) as r:
        r.session().send("start")
        await r.settle()
        assert readers == [(False, DispatchMode.TURN_END, False)]
        assert [s.why for s in r.of(LoopStopped)] == ["finished", "finished"]
        assert calls.log == [("canceled", "consumed")]
        assert all(decode_body(row).entry_kind != "wake" for row in await rows(r))
        assert [e.entry for e in r.of(EntryDequeued)] == ["W", "u"]
        assert causes(r) == ["send", "queue"]
        assert r.models["M"].requests[-1].messages[-1].text == "u"
        assert r.session().phase is Phase.IDLE


async def test_as13_q01_plain_user_messages_batch_into_one_send() -> None:
    def queue_two(_: ToolCallPart) -> None:
        r.session().send("a")
        r.session().send("b")

    async with session_rig(
        {"M": [T_("bash"), X("ok")]}, tools=[HookTool("bash", before=queue_two)]
    ) as r:
        r.session().send("start")
        await r.settle()
        first, second = r.of(EntryQueued)
        assert second.into == first.entry
        assert len(r.of(EntryDequeued)) == 1
        assert r.models["M"].requests[-1].messages[-1].text == "a\nb"
        history = await rows(r)
        assert [row.kind for row in history] == [
            RowKind.USER,
            RowKind.ASSISTANT,
            RowKind.USER,
            RowKind.ASSISTANT,
        ]
        assert decode_body(history[1]).finish == "tool-calls"
        assert decode_body(history[2]).text == "a\nb"


async def test_as13_q03_each_drain_dispatches_one_sealed_entry() -> None:
    def queue_report_then_user(_: ToolCallPart) -> None:
        r.session().enqueue_message(report("the report"))
        r.session().send("x")

    async with session_rig(
        {"M": [T_("bash"), X("after R"), X("after x")]},
        tools=[HookTool("bash", before=queue_report_then_user)],
    ) as r:
        r.session().send("start")
        await r.settle()
        assert [e.into for e in r.of(EntryQueued)] == [None, None]
        assert [s.handle for s in r.of(StreamStarted)] == [None, "h1", None]
        requests = r.models["M"].requests
        assert [q.messages[-1].text for q in requests[1:]] == ["the report", "x"]
        assert (requests[1].correlation, requests[2].correlation) == (C, None)


async def test_as13_the_drain_claims_preparing_synchronously() -> None:
    async with session_rig({"M": [X("for the wake"), X("for x")]}) as r:
        session = r.session()
        session.enqueue("monitors finished", kind=EntryKind.WAKE, entry="W")
        assert session.phase is Phase.PREPARING
        assert (await session.send("x")).state is DeliveryState.QUEUED  # behind the dequeued
        assert [e.kind for e in r.of(EntryQueued)] == ["wake", "user"]
        await r.settle()
        assert causes(r) == ["queue", "queue"]
        assert [q.messages[-1].text for q in r.models["M"].requests] == ["monitors finished", "x"]


async def test_as13_an_exception_in_one_dispatch_does_not_stop_the_drain() -> None:
    store = HookStore()

    async def io_error_for_a(batch: Sequence[HistoryRow]) -> None:
        if decode_body(batch[0]).text == "A":
            raise OSError("the disk went away")

    store.before_append = io_error_for_a
    async with session_rig({"M": [X("for B")]}, store=store) as r:
        session = r.session()
        session.enqueue_message(NewMessage(text="A", kind=EntryKind.SYSTEM, id="A", sealed=True))
        session.send("B")
        await r.settle()
        assert causes(r) == ["queue"]
        assert r.models["M"].requests[0].messages[-1].text == "B"
        assert session.phase is Phase.IDLE


# ---------------------------------------------------------------- AS-14


async def test_as14_an_empty_drain_after_a_canceled_cutter_resumes_the_turn() -> None:
    async with session_rig({"M": CUT_SCRIPT}, tools=[wake_tool(lambda: r)]) as r:
        withdraw_at_first_stream_end(lambda: r)
        r.session().send("start")
        await r.settle()
        (canceled,) = r.of(EntryCanceled)
        resume_start = r.of(StreamStarted)[1]
        assert r.events.index(canceled) < r.events.index(resume_start)
        assert (resume_start.cause, resume_start.budget) == ("resume", 6)
        assert not r.session().owes()


async def test_as14_a_non_empty_drain_dispatches_instead_of_sweeping() -> None:
    def queue_user_behind(event: EngineEvent) -> None:
        if isinstance(event, StreamEnded) and len(r.of(StreamEnded)) == 1:
            r.session().send("u")

    async with session_rig(
        {"M": [*CUT_SCRIPT[:2], X("answer to u")]}, tools=[wake_tool(lambda: r)]
    ) as r:
        withdraw_at_first_stream_end(lambda: r)
        r.on(queue_user_behind)
        r.session().send("start")
        await r.settle()
        assert [e.entry for e in r.of(EntryCanceled)] == ["W"]
        assert causes(r) == ["send", "queue"]
        assert r.of(ResumeAttempted) == []
        assert [e.how for e in r.of(ContinuationEnded)] == ["withdrawn"]


# ---------------------------------------------------------------- AS-15
# Goal continuation, compaction handling and plan/compact agents have no port.


async def test_as15_q07a_a_turn_end_entry_dispatches_at_the_natural_stream_end() -> None:
    queued: list[bool] = []

    def queue_turn_end(_: ToolCallPart) -> None:
        if not queued:
            queued.append(True)
            r.session().send("u", mode="turn-end")

    async with session_rig(
        {"M": [T_("bash"), T_("bash"), X("done"), X("answer to u")]},
        tools=[HookTool("bash", before=queue_turn_end)],
    ) as r:
        r.session().send("start")
        await r.settle()
        first_end = r.of(StreamEnded)[0]
        assert (first_end.finish, first_end.steps) == ("stop", 3)
        assert r.of(ContinuationOwed) == []
        assert causes(r) == ["send", "queue"]
        assert r.events.index(first_end) < r.events.index(r.of(EntryDequeued)[0])


async def test_as15_a_waiting_edit_keeps_the_stream_end_from_draining() -> None:
    store = HookStore()
    hold = Hold()

    async def hold_the_final_write(batch: Sequence[HistoryRow]) -> None:
        if batch[0].kind is RowKind.ASSISTANT and not hold.reached.is_set():
            await hold.wait()

    store.before_append = hold_the_final_write
    queue_at_idle: list[int] = []

    def record_queue_at_idle(event: EngineEvent) -> None:
        if isinstance(event, PhaseChanged) and event.to is Phase.IDLE and not queue_at_idle:
            queue_at_idle.append(len(r.session().queue))

    async with session_rig({"M": [X("first answer"), X("edited answer")]}, store=store) as r:
        r.on(record_queue_at_idle)
        session = r.session()
        session.send("original")
        await hold.reached.wait()
        session.send("wait for the end", mode="turn-end")
        (target,) = await rows(r)
        async with anyio.create_task_group() as tg:
            tg.start_soon(session.edit, target.row_id, "edited")
            await anyio.wait_all_tasks_blocked()
            hold.release()
        await r.settle()
        # The stream ended with the entry still queued; the edit restored it, nobody sent it.
        assert queue_at_idle == [1]
        assert r.of(EntryDequeued) == []
        assert [q.messages[-1].text for q in r.models["M"].requests] == ["original", "edited"]


# ---------------------------------------------------------------- AS-16
# The session has clear_queue, remove_dedupe and restore_queue; it exposes no
# removeQueuedWorkspaceTurn or dropQueuedMessageWithOnlyDedupeKey (the queue has them).


async def test_as16_q14_clear_notifies_every_callback_in_order() -> None:
    order: list[tuple[str, str]] = []

    def r_canceled(reason: str) -> None:
        order.append(("R", reason))
        raise RuntimeError("a producer's callback bug")

    def s_failed(failure: SendFailure) -> None:
        order.append(("S", f"{failure.type}: {failure.message}"))

    async with session_rig({"M": [ScriptStep(text="half", hang=True)]}) as r:
        session = r.session()
        session.send("go")
        await anyio.wait_all_tasks_blocked()
        session.send("u")
        session.enqueue_message(
            NewMessage(
                text="report",
                kind=EntryKind.REPORT,
                id="R",
                metadata=MessageMetadata(type=MetadataType.WORKSPACE_TURN, correlation=C),
                workspace_turn_continuation=True,
                on_canceled=r_canceled,
            ),
        )
        session.enqueue_message(
            NewMessage(
                text="heartbeat",
                kind=EntryKind.SYSTEM,
                id="S",
                on_accepted_pre_stream_failure=s_failed,
            ),
        )
        session.enqueue_message(
            NewMessage(
                text="wake",
                kind=EntryKind.WAKE,
                id="W",
                on_canceled=lambda reason: order.append(("W", reason)),
            ),
        )
        assert len(session.queue) == 4
        session.clear_queue("cleared by test")
        assert len(session.queue) == 0
        assert order == [
            ("R", "cleared by test"),
            ("S", "unknown: cleared by test"),
            ("W", "cleared by test"),
        ]
        (cleared,) = r.of(QueueCleared)
        assert len(cleared.entries) == 4
        assert not cleared.hard_stop
        assert [e.reason for e in r.of(EntryCanceled)] == ["cleared by test"] * 4
        session.stop()
        await r.settle()
        assert causes(r) == ["send"]


async def test_as16_a_hard_stop_clear_forfeits_before_callbacks_run() -> None:
    owed_at_cancel: list[bool] = []

    def clear_hard_at_stream_end(event: EngineEvent) -> None:
        if isinstance(event, StreamEnded) and len(r.of(StreamEnded)) == 1:
            r.session().clear_queue("task stopped", hard_stop=True)

    def queue_wake(_: ToolCallPart) -> None:
        r.session().enqueue_message(
            NewMessage(
                text="wake",
                kind=EntryKind.WAKE,
                id="W",
                on_canceled=lambda _: owed_at_cancel.append(r.session().owes()),
            ),
        )

    async with session_rig(
        {"M": CUT_SCRIPT}, tools=[HookTool("task_await", before=queue_wake)]
    ) as r:
        r.on(clear_hard_at_stream_end)
        r.session().send("start")
        await r.settle()
        assert owed_at_cancel == [False]
        assert [e.how for e in r.of(ContinuationEnded)] == ["forfeited"]
        assert causes(r) == ["send"]


async def test_as16_a_plain_clear_keeps_the_continuation_and_sweeps_after_callbacks() -> None:
    owed_at_cancel: list[bool] = []

    def clear_at_stream_end(event: EngineEvent) -> None:
        if isinstance(event, StreamEnded) and len(r.of(StreamEnded)) == 1:
            r.session().clear_queue("user cleared")

    def queue_wake(_: ToolCallPart) -> None:
        r.session().enqueue_message(
            NewMessage(
                text="wake",
                kind=EntryKind.WAKE,
                id="W",
                on_canceled=lambda _: owed_at_cancel.append(r.session().owes()),
            ),
        )

    async with session_rig(
        {"M": CUT_SCRIPT}, tools=[HookTool("task_await", before=queue_wake)]
    ) as r:
        r.on(clear_at_stream_end)
        r.session().send("start")
        await r.settle()
        assert owed_at_cancel == [True]
        assert causes(r) == ["send", "resume"]
        assert [e.how for e in r.of(ContinuationEnded)] == ["consumed"]


async def test_as16_removing_the_owed_turns_queued_continuation_forfeits_first() -> None:
    """R32: a live wake while a correlated continuation is owed is that turn's terminal path."""
    owed_at_cancel: list[bool] = []

    def clear_at_stream_end(event: EngineEvent) -> None:
        if isinstance(event, StreamEnded) and len(r.of(StreamEnded)) == 1:
            r.session().clear_queue("user cleared")

    def queue_wake(_: ToolCallPart) -> None:
        r.session().enqueue_message(
            NewMessage(
                text="wake",
                kind=EntryKind.WAKE,
                id="W",
                on_canceled=lambda _: owed_at_cancel.append(r.session().owes()),
            ),
        )

    async with session_rig(
        {"M": [T_("task_await"), X("never")]}, tools=[HookTool("task_await", before=queue_wake)]
    ) as r:
        r.on(clear_at_stream_end)
        r.session().enqueue("delegated work", kind=EntryKind.REPORT, correlation=C)
        await r.settle()
        assert r.of(ContinuationOwed)[0].handle == "h1"
        assert owed_at_cancel == [False]
        assert [e.how for e in r.of(ContinuationEnded)] == ["forfeited"]
        assert causes(r) == ["queue"]


async def test_as16_q09_remove_by_dedupe_prefix_keeps_unrelated_messages() -> None:
    async with session_rig({"M": [ScriptStep(text="half", hang=True)]}) as r:
        session = r.session()
        session.send("go")
        await anyio.wait_all_tasks_blocked()
        for text, key in (("p1", "prog:1"), ("p2", "prog:2")):
            session.enqueue_message(NewMessage(text=text, kind=EntryKind.SYSTEM), dedupe_key=key)
        assert len(session.queue) == 1
        assert session.remove_dedupe("prog:1") == 1
        (entry,) = list(session.queue)
        assert (entry.texts, entry.dedupe_keys) == (("p2",), ("prog:2",))
        assert r.of(EntryCanceled) == []
        session.stop()
        await r.settle()


async def _keyed_wake_removed_at_the_cut(
    key: str, remove: Callable[[AgentSession], list[object]]
) -> tuple[Rig, Calls, list[object]]:
    """A wake keyed ``key`` cuts the turn; ``remove`` runs at the cut stream's end."""
    calls = Calls()
    said: list[object] = []

    def remove_at_stream_end(event: EngineEvent) -> None:
        if isinstance(event, StreamEnded) and len(r.of(StreamEnded)) == 1:
            said.extend(remove(r.session()))

    def queue_keyed_wake(_: ToolCallPart) -> None:
        r.session().enqueue_message(wake("W", calls), dedupe_key=key)

    async with session_rig(
        {"M": CUT_SCRIPT}, tools=[HookTool("task_await", before=queue_keyed_wake)]
    ) as r:
        r.on(remove_at_stream_end)
        r.session().send("start")
        await r.settle()
    return r, calls, said


async def test_as16_an_emptied_keyed_entry_is_notified_and_the_sweep_resumes() -> None:
    r, calls, said = await _keyed_wake_removed_at_the_cut(
        "wake:1", lambda s: [s.remove_dedupe("wake:", "no longer needed")]
    )
    assert said == [1]
    assert calls.log == [("canceled", "no longer needed")]
    assert causes(r) == ["send", "resume"]


async def test_as16_dropping_a_lone_keyed_wake_notifies_it_and_the_sweep_resumes() -> None:
    r, calls, said = await _keyed_wake_removed_at_the_cut(
        "wake:4",
        lambda s: [
            s.drop_only_dedupe_key("wake:4", "the monitor caught up"),
            s.drop_only_dedupe_key("wake:4"),  # gone already
        ],
    )
    assert said == [True, False]
    assert calls.log == [("canceled", "the monitor caught up")]
    assert causes(r) == ["send", "resume"]


# ---------------------------------------------------------------- AS-17


async def _q02_queue(r: Rig, calls: Calls) -> None:
    session = r.session()
    session.send("go")
    await anyio.wait_all_tasks_blocked()
    session.send("a")
    session.enqueue_message(
        NewMessage(text="heartbeat", kind=EntryKind.SYSTEM, id="s", on_canceled=calls.canceled),
    )
    session.send("b")
    assert len(session.queue) == 3
    assert [e.texts for e in session.queue.visible()] == [("a",), ("b",)]


async def test_as17_q02_restore_gives_back_only_user_text_and_cancels_the_rest() -> None:
    calls = Calls()
    async with session_rig({"M": [ScriptStep(text="half", hang=True)]}) as r:
        await _q02_queue(r, calls)
        session = r.session()
        assert session.restore_queue() == "a\nb"
        assert calls.log == [("canceled", "restored to input")]
        assert len(session.queue) == 0
        assert session.restore_queue() == ""
        session.stop()
        await r.settle()
        assert causes(r) == ["send"]
        assert r.of(EntryDequeued) == []


async def test_as17_q02_stop_gives_the_queued_user_text_back() -> None:
    """Stop restores the queue to the input: the user's queued text comes back, hidden
    synthetic entries do not."""
    calls = Calls()
    async with session_rig({"M": [ScriptStep(text="half", hang=True)]}) as r:
        await _q02_queue(r, calls)
        stop: Callable[[], object] = r.session().stop
        restored = stop()
        await r.settle()
        assert calls.log == [("canceled", "restored to input")]
        assert causes(r) == ["send"]
        assert restored == "a\nb"


# ---------------------------------------------------------------- AS-18


async def test_as18_q18_send_now_prioritizes_the_users_entry_over_hidden_work() -> None:
    async with session_rig(
        {"M": [ScriptStep(text="half", hang=True), X("for u"), X("for s")]}
    ) as r:
        session = r.session()
        session.send("go")
        await anyio.wait_all_tasks_blocked()
        session.enqueue_message(NewMessage(text="heartbeat", kind=EntryKind.SYSTEM, id="s"))
        session.send("u", entry="u")
        assert session.send_now()
        await r.settle()
        (abort,) = r.of(StreamAborted)
        assert abort.reason == "user"
        assert [e.entry for e in r.of(EntryDequeued)] == ["u", "s"]
        assert [q.messages[-1].text for q in r.models["M"].requests[1:]] == ["u", "heartbeat"]


async def test_as18_send_now_that_preempted_a_preparing_turn_leaves_later_aborts_alone() -> None:
    """The send-now drain belongs to the interrupt it made; a later system abort goes IDLE.

    The entry queued behind it is then sent by the idle drain (AS-13: an idle session never
    holds a live entry), not by the abort path as a leaked send-now drain would."""
    store = HookStore()
    hold = Hold()

    async def hold_first_envelope(_: object) -> None:
        if not hold.reached.is_set():
            await hold.wait()

    store.before_envelope = hold_first_envelope
    async with session_rig(
        {"M": [ScriptStep(text="for u", hang=True), X("never")]}, store=store
    ) as r:
        session = r.session()
        session.send("a")
        await hold.reached.wait()
        session.send("u", entry="u")
        assert session.send_now()
        hold.release()
        await anyio.wait_all_tasks_blocked()
        assert causes(r) == ["queue"]
        session.send("later", entry="later", mode="turn-end")
        r.engine.manager.request_stop_nowait("s1", reason=AbortReason.SYSTEM)
        await r.settle()
        assert r.of(StreamAborted)[-1].reason == "system"
        assert [e.entry for e in r.of(EntryDequeued)] == ["u", "later"]
        later = r.events.index(r.of(EntryDequeued)[-1])
        since_abort = r.events[r.events.index(r.of(StreamAborted)[-1]) : later]
        assert [e.to for e in since_abort if isinstance(e, PhaseChanged)] == [
            Phase.COMPLETING,
            Phase.IDLE,
        ]
        assert causes(r) == ["queue", "queue"]


# ---------------------------------------------------------------- AS-19


async def test_as19_stream_start_moves_to_streaming_and_consumes_the_owed_continuation() -> None:
    async with session_rig(
        {"M": [*CUT_SCRIPT, X("after the wake")]}, tools=[wake_tool(lambda: r)]
    ) as r:
        r.session().send("start")
        await r.settle()
        wake_start = r.of(StreamStarted)[1]
        (consumed,) = r.of(ContinuationEnded)
        after = r.events[r.events.index(wake_start) + 1 :]
        assert isinstance(after[0], PhaseChanged)
        assert after[0].to is Phase.STREAMING
        # The consumed record commits first; then the consumption is told (durable, then told).
        assert isinstance(after[1], Persisted)
        assert (after[1].what, after[1].id) == ("cut-void", "s1:r2")
        assert consumed is after[2]
        assert (consumed.how, consumed.cut) == ("consumed", r.of(StreamStarted)[0].stream)
        assert wake_start.stream in consumed.why
        assert r.of(ResumeAttempted) == []


# ---------------------------------------------------------------- AS-20
# No replayed tool calls exist in the port; every tool-call-start is live.


async def test_as20_a_client_call_in_flight_blocks_the_provider_soft_stop() -> None:
    step: list[Part | Hold] = [
        ToolCallPart(call_id="c1", name="bash"),
        provider_call("p1"),
        provider_result("p1"),
        TextPart(text="searched"),
        Finish(reason=FinishReason.TOOL_CALLS),
    ]
    async with session_rig({}, models=[PartsModel("M", [step, text_step("after W")])]) as r:
        wake_at_provider_call(lambda: r)
        r.session().send("start")
        await r.settle()
        assert next(e.why for e in r.of(LoopStopped)) == "queued-message"
        assert r.of(StreamAborted) == []
        assert r.of(StreamEnded)[0].finish == "tool-calls"


async def test_as27_sw10_the_provider_soft_stop_waits_for_known_siblings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    step: list[Part | Hold] = [
        provider_call("p1"),
        provider_call("p2"),
        provider_result("p1"),
        TextPart(text="mid "),
        provider_result("p2"),
        TextPart(text="tail"),
        Finish(reason=FinishReason.STOP),
    ]
    async with session_rig({}, models=[PartsModel("M", [step, text_step("after W")])]) as r:
        stops = spy_stops(r, monkeypatch)
        wake_at_provider_call(lambda: r)
        r.session().send("start")
        await r.settle()
        assert stops == [(True, AbortReason.QUEUED_MESSAGE)]
        ends = [e.call for e in r.of(ToolCallEnded)]
        assert ends == ["p1", "p2"]
        partial = [row for row in await rows(r) if row.kind is RowKind.PARTIAL]
        assert decode_body(partial[0]).text == "mid tail"


# ---------------------------------------------------------------- AS-21
# Lifecycle snapshots, goal user-stop records and the abandon marker have no port.


async def test_as21_sw12b_a_stop_with_nothing_registered_is_a_synthetic_startup_abort() -> None:
    async with session_rig({"M": []}) as r:
        r.engine.manager.request_stop_nowait("s1")
        await r.settle()
        (abort,) = r.of(StreamAborted)
        assert (abort.stream, abort.reason) == ("", "startup")
        assert r.of(PhaseChanged) == []
        assert r.session().phase is Phase.IDLE


async def _resume_held(r: Rig, gate: BlockingGate) -> None:
    withdraw_at_first_stream_end(lambda: r)
    gate.armed = True
    r.session().send("start")
    await gate.hold.reached.wait()
    await anyio.wait_all_tasks_blocked()
    assert r.session().phase is Phase.PREPARING


async def test_as21_r19_a_system_abort_withdraws_a_preparing_resume() -> None:
    gate = BlockingGate("resume")
    async with session_rig({"M": CUT_SCRIPT}, tools=[wake_tool(lambda: r)], gate=gate) as r:
        await _resume_held(r, gate)
        phase_events = len(r.of(PhaseChanged))
        r.engine.manager.request_stop_nowait("s1", reason=AbortReason.SYSTEM)
        assert len(r.of(PhaseChanged)) == phase_events  # a synthetic abort moves no phase
        assert not r.session().owes()
        gate.hold.release()
        await r.settle()
        assert [e.how for e in r.of(ContinuationEnded)] == ["withdrawn"]
        assert [e.outcome for e in r.of(ResumeAttempted)] == ["withdrawn"]
        assert causes(r) == ["send"]
        assert r.session().phase is Phase.IDLE


async def test_as21_a_queued_message_abort_leaves_a_preparing_resume_alone() -> None:
    gate = BlockingGate("resume")
    async with session_rig({"M": CUT_SCRIPT}, tools=[wake_tool(lambda: r)], gate=gate) as r:
        await _resume_held(r, gate)
        r.engine.manager.request_stop_nowait("s1", reason=AbortReason.QUEUED_MESSAGE)
        assert r.session().owes()
        gate.hold.release()
        await r.settle()
        assert causes(r) == ["send", "resume"]
        assert [e.outcome for e in r.of(ResumeAttempted)] == ["started"]


async def test_as21_a_synthetic_abort_clears_a_pending_soft_stop() -> None:
    """A system stop landing while the soft-stop abort is handled: no continuation, and the
    abort path drains nothing (the wake is sent by the idle drain once the session is idle)."""
    store = HookStore()
    hold = Hold()
    hold_partial_commit(store, hold)
    async with session_rig({"M": soft_cut_script(X("never"))}, store=store) as r:
        wake_at_provider_call(lambda: r)
        r.session().send("start")
        await hold.reached.wait()
        assert r.of(StreamAborted)[0].reason == "queued-message"
        r.engine.manager.request_stop_nowait("s1", reason=AbortReason.SYSTEM)
        assert [(e.stream, e.reason) for e in r.of(StreamAborted)][1:] == [("", "system")]
        hold.release()
        await r.settle()
        assert r.of(ContinuationOwed) == []
        assert len(r.dequeued_only_once_idle()) == 1
        assert causes(r) == ["send", "queue"]


# ---------------------------------------------------------------- AS-22
# No file-change notification rows and no compaction in the port.


async def test_as22_a_resume_after_a_normal_cut_appends_a_continue_sentinel() -> None:
    async with session_rig({"M": CUT_SCRIPT}, tools=[wake_tool(lambda: r)]) as r:
        withdraw_at_first_stream_end(lambda: r)
        r.session().send("start")
        await r.settle()
        assert await r.kinds() == [
            RowKind.USER,
            RowKind.ASSISTANT,
            RowKind.SENTINEL,
            RowKind.ASSISTANT,
        ]
        resume_request = r.models["M"].requests[-1]
        assert resume_request.messages[-1].text == "[CONTINUE]"
        assert resume_request.step_ceiling == 6


async def test_as22_a_resume_after_a_soft_stop_cut_appends_no_sentinel() -> None:
    def withdraw_at_abort(event: EngineEvent) -> None:
        if isinstance(event, StreamAborted) and event.stream:
            r.session().withdraw("W", "consumed")

    async with session_rig({"M": soft_cut_script(X("resumed"))}) as r:
        wake_at_provider_call(lambda: r)
        r.on(withdraw_at_abort)
        r.session().send("start")
        await r.settle()
        assert causes(r) == ["send", "resume"]
        assert await r.kinds() == [RowKind.USER, RowKind.PARTIAL, RowKind.ASSISTANT]


async def test_as22_r34_a_withdrawn_resume_removes_its_sentinel() -> None:
    store = HookStore()
    hold = Hold()

    async def hold_the_resumes_envelope(_: object) -> None:
        if any(row.kind is RowKind.SENTINEL for row in await history(store, "s1")):
            await hold.wait()

    store.before_envelope = hold_the_resumes_envelope
    async with session_rig({"M": CUT_SCRIPT}, tools=[wake_tool(lambda: r)], store=store) as r:
        withdraw_at_first_stream_end(lambda: r)
        r.session().send("start")
        await hold.reached.wait()
        assert RowKind.SENTINEL in await r.kinds()
        r.session().stop()
        hold.release()
        await r.settle()
        assert causes(r) == ["send"]
        assert await r.kinds() == [RowKind.USER, RowKind.ASSISTANT]
        assert [e.outcome for e in r.of(ResumeAttempted)] == ["withdrawn"]


# ---------------------------------------------------------------- AS-23
# Goal accounting, compaction queue clears and auto-retry reporting have no port; the
# effective-model part of R59 shows on the partial row.


async def test_as23_a_user_stop_while_streaming_commits_the_partial_and_idles() -> None:
    async with session_rig({"M": [ScriptStep(text="half an answer", hang=True)]}) as r:
        r.session().send("go")
        await anyio.wait_all_tasks_blocked()
        r.session().stop()
        await r.settle()
        (abort,) = r.of(StreamAborted)
        assert abort.reason == "user"
        assert phases(r)[-2:] == [
            (Phase.STREAMING, Phase.COMPLETING),
            (Phase.COMPLETING, Phase.IDLE),
        ]
        assert await texts(r) == [(RowKind.USER, "go"), (RowKind.PARTIAL, "half an answer")]


async def test_as23_an_aborted_partial_is_recorded_under_the_effective_model() -> None:
    async with session_rig(
        {"M": [ScriptStep(refuse=True)], "B": [ScriptStep(text="from B", hang=True)]},
        fallbacks={"M": ["B"]},
    ) as r:
        r.session().send("go")
        await anyio.wait_all_tasks_blocked()
        r.session().stop()
        await r.settle()
        (partial,) = [row for row in await rows(r) if row.kind is RowKind.PARTIAL]
        assert decode_body(partial).model == "B"


async def test_as23_a_hard_abort_goes_idle_then_the_idle_drain_sends_the_queue() -> None:
    async with session_rig({"M": [ScriptStep(text="half", hang=True), X("never")]}) as r:
        session = r.session()
        session.send("go")
        await anyio.wait_all_tasks_blocked()
        session.send("later", mode="turn-end")
        r.engine.manager.request_stop_nowait("s1", reason=AbortReason.SYSTEM)
        await r.settle()
        assert r.of(StreamAborted)[0].reason == "system"
        assert session.phase is Phase.IDLE
        assert r.dequeued_only_once_idle() == [r.of(EntryDequeued)[0].entry]
        assert causes(r) == ["send", "queue"]
        assert len(session.queue) == 0


# ---------------------------------------------------------------- AS-24


async def test_as24_sw01_a_cut_is_owed_before_its_stream_end_is_processed() -> None:
    at_stream_end: list[tuple[bool, Phase]] = []

    def look_at_stream_end(event: EngineEvent) -> None:
        if isinstance(event, StreamEnded) and not at_stream_end:
            at_stream_end.append((r.session().owes(), r.session().phase))

    async with session_rig(
        {"M": [T_("bash"), T_("task_await"), T_("bash"), X("done")]},
        tools=[wake_tool(lambda: r)],
    ) as r:
        r.on(look_at_stream_end)
        r.session().send("start")
        await r.settle()
        assert at_stream_end == [(True, Phase.STREAMING)]
        (owed,) = r.of(ContinuationOwed)
        assert (owed.remaining, owed.model) == (6, "M")
        first = r.of(StreamStarted)[0].stream
        assert len([s for s in r.of(StepCompleted) if s.stream == first]) == 2
        history = await rows(r)
        assert [row.kind for row in history[:2]] == [RowKind.USER, RowKind.ASSISTANT]
        assert decode_body(history[1]).finish == "tool-calls"


async def test_as24_a_drained_entry_takes_over_from_completing() -> None:
    async with session_rig(
        {"M": [X("first"), X("second")]},
    ) as r:
        r.session().send("a")
        r.session().send("b", mode="turn-end")
        await r.settle()
        assert phases(r) == [
            (Phase.IDLE, Phase.PREPARING),
            (Phase.PREPARING, Phase.STREAMING),
            (Phase.STREAMING, Phase.COMPLETING),
            (Phase.COMPLETING, Phase.PREPARING),
            (Phase.PREPARING, Phase.STREAMING),
            (Phase.STREAMING, Phase.COMPLETING),
            (Phase.COMPLETING, Phase.IDLE),
        ]


# ---------------------------------------------------------------- AS-25
# In-session context retries, goal accounting and auto-retry scheduling have no port. R25's
# withdrawal at entry is not reachable here: every stream that can fail has reached STREAMING,
# which consumed any owed continuation first (ST-4); what is tested is that the failed
# continuation is not resumed as well.


async def test_as25_a_stream_error_goes_completing_then_idle_and_is_reported() -> None:
    async with session_rig({"M": [ScriptStep(error="terminal"), X("later")]}) as r:
        r.session().send("go")
        await r.settle()
        (error,) = r.of(StreamFailed)
        assert error.kind == "terminal"
        assert phases(r)[-2:] == [
            (Phase.STREAMING, Phase.COMPLETING),
            (Phase.COMPLETING, Phase.IDLE),
        ]
        r.session().send("again")
        await r.settle()
        assert causes(r) == ["send", "send"]


async def test_as25_st10_a_failed_continuation_is_retried_never_resumed_too() -> None:
    script = [T_("task_await"), ScriptStep(error="retryable"), X("done")]
    async with session_rig({"M": script}, tools=[wake_tool(lambda: r)]) as r:
        r.session().send("start")
        await r.settle()
        assert [e.how for e in r.of(ContinuationEnded)] == ["consumed"]
        (failed,) = r.of(StreamFailed)
        assert causes(r) == ["send", "queue", "retry"]  # the retry owns it: no resume as well
        assert r.of(StreamStarted)[-1].budget == failed.remaining
        assert not r.session().owes()
        assert r.session().phase is Phase.IDLE


# ---------------------------------------------------------------- AS-26


async def test_as26_a_provider_tool_result_is_preempted_inside_its_step() -> None:
    step = ScriptStep(
        tool_calls=(
            ScriptToolCall(tool="web_search", provider_executed=True, result={"ok": True}),
            ScriptToolCall(tool="bash"),
        ),
        text="found it",
    )
    async with session_rig({"M": [T_("bash"), step, X("after W")]}) as r:
        wake_at_provider_call(lambda: r)
        r.session().send("start")
        await r.settle()
        first = r.of(StreamStarted)[0].stream
        (abort,) = r.of(StreamAborted)
        assert (abort.reason, abort.remaining) == ("queued-message", 6)
        # The step never reached its finish or its client call: the stop landed mid-step.
        assert len([s for s in r.of(StepCompleted) if s.stream == first]) == 1
        assert len(r.tools["bash"].calls) == 1
        assert [e.why for e in r.of(LoopStopped)] == ["finished"]


# ---------------------------------------------------------------- AS-27


async def test_as27_sw09_a_provider_result_soft_stops_for_a_queued_tool_end_entry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with session_rig({"M": soft_cut_script(X("after W"))}) as r:
        stops = spy_stops(r, monkeypatch)
        wake_at_provider_call(lambda: r)
        r.session().send("start")
        await r.settle()
        assert stops == [(True, AbortReason.QUEUED_MESSAGE)]
        (abort,) = r.of(StreamAborted)
        assert (abort.reason, abort.remaining) == ("queued-message", 6)
        (owed,) = r.of(ContinuationOwed)
        assert (owed.remaining, owed.model) == (6, "M")
        (partial,) = [row for row in await rows(r) if row.kind is RowKind.PARTIAL]
        assert decode_body(partial).text == "partial text"
        assert partial.cut is not None
        assert (partial.cut.remaining, partial.cut.model, partial.cut.requested_model) == (
            6,
            "M",
            "M",
        )
        assert causes(r) == ["send", "queue"]


async def test_as27_a_turn_end_entry_does_not_soft_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    def queue_turn_end(event: EngineEvent) -> None:
        if isinstance(event, ToolCallStarted) and event.provider and not r.of(EntryQueued):
            r.session().send("later", mode="turn-end")

    async with session_rig({"M": soft_cut_script(X("done"), X("for later"))}) as r:
        stops = spy_stops(r, monkeypatch)
        r.on(queue_turn_end)
        r.session().send("start")
        await r.settle()
        assert stops == []
        assert r.of(StreamAborted) == []
        assert causes(r) == ["send", "queue"]


async def test_as27_a_withdrawn_entry_does_not_soft_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    def queue_withdrawn(event: EngineEvent) -> None:
        if isinstance(event, ToolCallStarted) and event.provider and not r.of(EntryQueued):
            token = r.session().enqueue("wake", kind=EntryKind.WAKE, entry="W")
            token.cancel("consumed")

    async with session_rig({"M": soft_cut_script(X("done"))}) as r:
        stops = spy_stops(r, monkeypatch)
        r.on(queue_withdrawn)
        r.session().send("start")
        await r.settle()
        assert stops == []
        assert r.of(StreamAborted) == []
        assert [e.entry for e in r.of(EntryCanceled)] == ["W"]
        assert causes(r) == ["send"]


async def test_as27_one_soft_stop_per_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    two_providers = ScriptStep(
        tool_calls=(
            ScriptToolCall(tool="web_search", provider_executed=True, result={"ok": True}),
            ScriptToolCall(tool="web_fetch", provider_executed=True, result={"ok": True}),
        ),
        text="both",
    )
    async with session_rig({"M": [two_providers, X("after W")]}) as r:
        stops = spy_stops(r, monkeypatch)
        wake_at_provider_call(lambda: r)
        r.session().send("start")
        await r.settle()
        assert len([e for e in r.of(ToolCallEnded) if e.provider]) == 2
        assert stops == [(True, AbortReason.QUEUED_MESSAGE)]


# ---------------------------------------------------------------- AS-28


def hold_partial_commit(store: HookStore, hold: Hold) -> None:
    async def before_append(batch: Sequence[HistoryRow]) -> None:
        if batch[0].kind is RowKind.PARTIAL and not hold.reached.is_set():
            await hold.wait()

    store.before_append = before_append


async def test_as28_r22_a_hard_stop_during_the_abort_handler_owes_nothing() -> None:
    calls = Calls()
    store = HookStore()
    hold = Hold()
    hold_partial_commit(store, hold)
    async with session_rig({"M": soft_cut_script(X("never"))}, store=store) as r:
        wake_at_provider_call(lambda: r, calls)
        r.session().send("start")
        await hold.reached.wait()
        assert r.of(StreamAborted)[0].reason == "queued-message"
        r.session().hard_stop()
        hold.release()
        await r.settle()
        assert r.of(ContinuationOwed) == []
        assert calls.log == [("canceled", "hard stop")]
        assert causes(r) == ["send"]
        assert r.session().phase is Phase.IDLE


async def test_as28_sw11_a_hard_stop_during_a_pending_soft_stop_is_a_hard_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = Calls()
    hold = Hold()
    step: list[Part | Hold] = [
        provider_call("p1"),
        provider_result("p1"),
        hold,
        TextPart(text="late text"),
        Finish(reason=FinishReason.STOP),
    ]
    async with session_rig({}, models=[PartsModel("M", [step])]) as r:
        stops = spy_stops(r, monkeypatch)
        wake_at_provider_call(lambda: r, calls)
        r.session().send("start")
        await hold.reached.wait()
        assert stops == [(True, AbortReason.QUEUED_MESSAGE)]
        r.session().hard_stop()
        await r.settle()
        (abort,) = r.of(StreamAborted)
        assert abort.reason == "system"
        assert r.of(ContinuationOwed) == []
        assert calls.log == [("canceled", "hard stop")]
        assert causes(r) == ["send"]


async def test_as28_a_successful_required_tool_in_the_cut_step_owes_nothing() -> None:
    async with session_rig(
        {"M": [P("agent_report"), X("after W")]},
        tools=[HookTool("agent_report", kind=ToolKind.COMPLETION)],
    ) as r:
        wake_at_provider_call(lambda: r)
        r.session().send("start")
        await r.settle()
        assert r.of(StreamAborted)[0].reason == "queued-message"
        assert r.of(ContinuationOwed) == []
        assert causes(r) == ["send", "queue"]


async def test_as28_a_soft_stop_with_no_steps_left_owes_nothing() -> None:
    async with session_rig(
        {"M": soft_cut_script(X("after W"))}, config=EngineConfig(max_stream_steps=2)
    ) as r:
        wake_at_provider_call(lambda: r)
        r.session().send("start")
        await r.settle()
        (abort,) = r.of(StreamAborted)
        assert (abort.reason, abort.remaining) == ("queued-message", 0)
        assert r.of(ContinuationOwed) == []
        assert causes(r) == ["send", "queue"]


async def test_as28_r56_a_wake_cutter_is_stamped_with_the_cut_streams_correlation() -> None:
    async with session_rig({"M": [P("web_search"), X("after W")]}) as r:
        wake_at_provider_call(lambda: r)
        r.session().enqueue("delegated work", kind=EntryKind.REPORT, correlation=C)
        await r.settle()
        assert r.of(ContinuationOwed)[0].handle == "h1"
        wake_start = r.of(StreamStarted)[1]
        assert (wake_start.cause, wake_start.handle) == ("queue", "h1")
        assert r.models["M"].requests[-1].correlation == C
        wake_row = next(row for row in await rows(r) if decode_body(row).entry_kind == "wake")
        assert decode_body(wake_row).correlation == C
        assert [e.how for e in r.of(ContinuationEnded)] == ["consumed"]


async def test_as28_r29_an_unrelated_cutter_forfeits_a_correlated_continuation_first() -> None:
    def queue_user(event: EngineEvent) -> None:
        if isinstance(event, ToolCallStarted) and event.provider and not queued(r, "u"):
            r.session().send("u", entry="u")

    async with session_rig({"M": [P("web_search"), X("for u")]}) as r:
        r.on(queue_user)
        r.session().enqueue("delegated work", kind=EntryKind.REPORT, correlation=C)
        await r.settle()
        (ended,) = r.of(ContinuationEnded)
        assert ended.how == "forfeited"
        u_dequeued = next(e for e in r.of(EntryDequeued) if e.entry == "u")
        assert r.events.index(ended) < r.events.index(u_dequeued)
        assert causes(r) == ["queue", "queue"]
        assert r.of(ResumeAttempted) == []


async def test_as28_a_withdrawn_cutter_still_drains_and_the_turn_resumes() -> None:
    calls = Calls()

    def withdraw_at_abort(event: EngineEvent) -> None:
        if isinstance(event, StreamAborted) and event.stream:
            r.session().withdraw("W", "consumed")

    async with session_rig({"M": soft_cut_script(X("resumed"))}) as r:
        wake_at_provider_call(lambda: r, calls)
        r.on(withdraw_at_abort)
        r.session().send("start")
        await r.settle()
        assert calls.log == [("canceled", "consumed")]
        assert [(s.cause, s.budget) for s in r.of(StreamStarted)] == [("send", 8), ("resume", 6)]
        assert [e.how for e in r.of(ContinuationEnded)] == ["consumed"]


async def test_as28_an_emptied_queue_goes_idle_and_the_sweep_resumes() -> None:
    def clear_at_abort(event: EngineEvent) -> None:
        if isinstance(event, StreamAborted) and event.stream:
            r.session().clear_queue("user cleared")

    async with session_rig({"M": soft_cut_script(X("resumed"))}) as r:
        wake_at_provider_call(lambda: r)
        r.on(clear_at_abort)
        r.session().send("start")
        await r.settle()
        assert [(s.cause, s.budget) for s in r.of(StreamStarted)] == [("send", 8), ("resume", 6)]
        assert r.of(EntryDequeued) == []


# ---------------------------------------------------------------- AS-29


async def test_as29_a_user_stop_after_the_soft_stop_landed_owes_and_dispatches_nothing() -> None:
    calls = Calls()
    store = HookStore()
    hold = Hold()
    hold_partial_commit(store, hold)
    async with session_rig({"M": soft_cut_script(X("never"))}, store=store) as r:
        wake_at_provider_call(lambda: r, calls)
        r.session().send("start")
        await hold.reached.wait()
        assert r.of(StreamAborted)[0].reason == "queued-message"
        r.session().stop()
        hold.release()
        await r.settle()
        assert r.of(ContinuationOwed) == []
        assert calls.log == [("canceled", "restored to input")]
        assert causes(r) == ["send"]
        assert r.session().phase is Phase.IDLE


# ---------------------------------------------------------------- AS-30
# Pending auto-retry cancellation has no port.


async def test_as30_stop_withdraws_the_continuation_before_restoring_the_queue() -> None:
    owed_at_cancel: list[tuple[bool, str]] = []

    def stop_at_stream_end(event: EngineEvent) -> None:
        if isinstance(event, StreamEnded) and len(r.of(StreamEnded)) == 1:
            r.session().stop()

    def queue_wake(_: ToolCallPart) -> None:
        r.session().enqueue_message(
            NewMessage(
                text="wake",
                kind=EntryKind.WAKE,
                id="W",
                on_canceled=lambda why: owed_at_cancel.append((r.session().owes(), why)),
            ),
        )

    async with session_rig(
        {"M": CUT_SCRIPT}, tools=[HookTool("task_await", before=queue_wake)]
    ) as r:
        r.on(stop_at_stream_end)
        r.session().send("start")
        await r.settle()
        assert owed_at_cancel == [(False, "restored to input")]
        (ended,) = r.of(ContinuationEnded)
        assert (ended.how, ended.why) == ("withdrawn", "user stop")
        assert causes(r) == ["send"]
        # A hard stop on a stream that already ended emits no abort.
        assert r.of(StreamAborted) == []


async def test_as30_stop_while_idle_with_a_continuation_owed_withdraws_it() -> None:
    stopped: list[bool] = []

    def stop_at_idle(event: EngineEvent) -> None:
        idle = isinstance(event, PhaseChanged) and event.to is Phase.IDLE
        if idle and r.of(EntryCanceled) and not stopped:
            stopped.append(True)
            r.session().stop()

    async with session_rig({"M": CUT_SCRIPT}, tools=[wake_tool(lambda: r)]) as r:
        withdraw_at_first_stream_end(lambda: r)
        r.on(stop_at_idle)
        r.session().send("start")
        await r.settle()
        assert stopped == [True]
        assert [e.how for e in r.of(ContinuationEnded)] == ["withdrawn"]
        assert causes(r) == ["send"]
        assert r.of(ResumeAttempted) == []


async def test_as30_stop_aborts_an_in_flight_resume() -> None:
    gate = BlockingGate("resume")
    async with session_rig({"M": CUT_SCRIPT}, tools=[wake_tool(lambda: r)], gate=gate) as r:
        await _resume_held(r, gate)
        r.session().stop()
        assert not r.session().owes()
        gate.hold.release()
        await r.settle()
        assert causes(r) == ["send"]
        assert [e.outcome for e in r.of(ResumeAttempted)] == ["withdrawn"]
        assert r.session().phase is Phase.IDLE


async def test_as30_stop_while_streaming_aborts_with_reason_user() -> None:
    calls = Calls()
    async with session_rig({"M": [ScriptStep(text="half", hang=True)]}) as r:
        session = r.session()
        session.send("go")
        await anyio.wait_all_tasks_blocked()
        session.enqueue_message(wake("W", calls))
        session.stop()
        await r.settle()
        (abort,) = r.of(StreamAborted)
        assert abort.reason == "user"
        assert calls.log == [("canceled", "restored to input")]
        assert await r.kinds() == [RowKind.USER, RowKind.PARTIAL]
        assert causes(r) == ["send"]


# ---------------------------------------------------------------- AS-31
# The retained settlement retry of R54 needs the TurnOwner port, which is not here yet.


async def test_as31_dispose_while_streaming_stops_and_keeps_no_partial() -> None:
    async with session_rig({"M": [ScriptStep(text="half", hang=True), X("never")]}) as r:
        session = r.session()
        session.send("go")
        await anyio.wait_all_tasks_blocked()
        session.send("later", mode="turn-end")
        await session.dispose()
        await r.settle()
        (abort,) = r.of(StreamAborted)
        assert abort.reason == "system"
        assert session.phase is Phase.DISPOSED
        assert await r.kinds() == [RowKind.USER]
        assert [e.reason for e in r.of(EntryCanceled)] == ["disposed"]
        assert r.of(EntryDequeued) == []
        with pytest.raises(SessionDisposed):
            session.send("after")


async def test_as31_dispose_forfeits_an_owed_continuation() -> None:
    async with session_rig({"M": CUT_SCRIPT}, tools=[wake_tool(lambda: r)]) as r:
        withdraw_at_first_stream_end(lambda: r)
        async with anyio.create_task_group() as tg:

            def dispose_at_idle(event: EngineEvent) -> None:
                idle = isinstance(event, PhaseChanged) and event.to is Phase.IDLE
                if idle and r.of(EntryCanceled):
                    tg.start_soon(r.session().dispose)

            r.on(dispose_at_idle)
            r.session().send("start")
            await r.settle()
        assert [e.how for e in r.of(ContinuationEnded)] == ["forfeited"]
        assert causes(r) == ["send"]
        assert r.session().phase is Phase.DISPOSED


async def test_as31_dispose_aborts_an_in_flight_resume() -> None:
    gate = BlockingGate("resume")
    async with session_rig({"M": CUT_SCRIPT}, tools=[wake_tool(lambda: r)], gate=gate) as r:
        await _resume_held(r, gate)
        await r.session().dispose()
        gate.hold.release()
        await r.settle()
        assert [e.how for e in r.of(ContinuationEnded)] == ["forfeited"]
        assert causes(r) == ["send"]
        assert r.session().phase is Phase.DISPOSED


async def test_as31_a_send_in_preflight_at_dispose_starts_nothing() -> None:
    gate = BlockingGate("send")
    gate.armed = True
    async with session_rig({"M": [X("never")]}, gate=gate) as r:
        session = r.session()
        session.send("go")
        await gate.hold.reached.wait()
        await session.dispose()
        gate.hold.release()
        await r.settle()
        assert r.of(StreamStarted) == []
        assert session.phase is Phase.DISPOSED
