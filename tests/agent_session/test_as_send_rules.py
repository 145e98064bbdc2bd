"""AgentSession rules AS-1 to AS-11 (``docs/rules.md``): turn phase and the send pipeline.

Each test drives the engine through the session API with the rig of ``support.py`` and asserts
what would change if its rule were removed. Product features the port replaces or does not have
(goal service, PDF checks, skill/prompt/file snapshots, on-send compaction, the auto-retry
manager and its abandon marker, the retained terminal lifecycle snapshot) are named in a
comment where a rule mentions them; the generic part of the rule is what is tested.

The helpers here (callback recorder, hookable store and gates, ``put``) are shared with
``test_as_queue_stream_rules.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

import anyio
import pytest

from agent_session import (
    ContinuationEnded,
    ContinuationOwed,
    EngineEvent,
    EntryCanceled,
    EntryDequeued,
    GoalState,
    Persisted,
    Phase,
    PhaseChanged,
    PreStreamFailure,
    ResumeAttempted,
)
from agent_session._rows import decode_body
from message_queue import (
    CancelState,
    CancelToken,
    Correlation,
    EntryKind,
    MessageMetadata,
    MetadataType,
    NewMessage,
    SendFailure,
    SendOptions,
)
from persistence import (
    Boundary,
    Committed,
    HistoryRow,
    MemoryStore,
    RowKind,
    SessionLoad,
    StoreError,
    TurnEnvelope,
    UsageError,
)
from stream_manager import (
    Finish,
    FinishReason,
    ModelRequest,
    Part,
    ScriptStep,
    StreamAborted,
    StreamEnded,
    StreamFailed,
    StreamStarted,
    TextPart,
    ToolCallPart,
)
from tests.agent_session.support import (
    T_,
    FailingGate,
    HookTool,
    Rig,
    X,
    session_rig,
)

C = Correlation(handle_id="h1", owner_session="ow", turn_id="t1")
C2 = Correlation(handle_id="h2", owner_session="ow", turn_id="t2")


# ---------------------------------------------------------------- helpers


@dataclass
class Calls:
    """Records one entry's callbacks, in order."""

    log: list[tuple[str, str]] = field(default_factory=list)
    failures: list[SendFailure] = field(default_factory=list)

    def accepted(self) -> None:
        self.log.append(("accepted", ""))

    def failed(self, failure: SendFailure) -> None:
        self.failures.append(failure)
        self.log.append(("failed", failure.type))

    def canceled(self, reason: str) -> None:
        self.log.append(("canceled", reason))

    def names(self) -> list[str]:
        return [name for name, _ in self.log]


def wake(
    entry: str,
    calls: Calls | None = None,
    *,
    token: CancelToken | None = None,
    state: CancelState | None = None,
    options: SendOptions | None = None,
    on_accepted: Callable[[], None] | None = None,
    correlation: Correlation | None = None,
) -> NewMessage:
    """A background wake (synthetic, sealed, tool-end, cancelable) with recorded callbacks."""
    metadata = None
    if correlation is not None:
        metadata = MessageMetadata(type=MetadataType.WORKSPACE_TURN, correlation=correlation)
    return NewMessage(
        text=f"wake {entry}",
        kind=EntryKind.WAKE,
        id=entry,
        options=options,
        metadata=metadata,
        cancel_token=token or CancelToken(),
        cancel_state=state,
        on_accepted=on_accepted or (calls.accepted if calls else None),
        on_accepted_pre_stream_failure=calls.failed if calls else None,
        on_canceled=calls.canceled if calls else None,
    )


def text_of(row: HistoryRow) -> str:
    return decode_body(row).text


async def texts(r: Rig) -> list[tuple[RowKind, str]]:
    return [(row.kind, text_of(row)) for row in await r.history()]


def phases(r: Rig) -> list[tuple[Phase, Phase]]:
    return [(e.from_, e.to) for e in r.of(PhaseChanged)]


def causes(r: Rig) -> list[str]:
    return [str(s.cause) for s in r.of(StreamStarted)]


AsyncRowsHook = Callable[[Sequence[HistoryRow]], Awaitable[None]]


class HookStore(MemoryStore):
    """A MemoryStore whose commits can be intercepted by a test (by what they carry)."""

    def __init__(self) -> None:
        super().__init__()
        #: Awaited before a commit that carries rows.
        self.before_append: AsyncRowsHook | None = None
        #: Called with the rows a ``load`` read, before they are returned.
        self.before_history: Callable[[list[HistoryRow]], None] | None = None
        #: Awaited before a commit that carries a turn envelope.
        self.before_envelope: Callable[[TurnEnvelope], Awaitable[None]] | None = None
        #: ``None``: delete normally; an int: report that count and write nothing.
        self.delete_reports: int | None = None
        #: Delete normally but report this count (a failure report after a real delete).
        self.delete_misreports: int | None = None

    async def commit(self, session: str, boundary: Boundary, *, owner: str | None) -> Committed:
        if boundary.rows and self.before_append is not None:
            await self.before_append(boundary.rows)
        if boundary.envelope is not None and self.before_envelope is not None:
            await self.before_envelope(boundary.envelope)
        if boundary.delete and self.delete_reports is not None:
            return Committed(deleted=self.delete_reports)
        done = await super().commit(session, boundary, owner=owner)
        if boundary.delete and self.delete_misreports is not None:
            return Committed(deleted=self.delete_misreports)
        return done

    async def load(self, session: str, *, envelopes: bool = True) -> SessionLoad | None:
        loaded = await super().load(session, envelopes=envelopes)
        if loaded is not None and self.before_history is not None:
            self.before_history(list(loaded.rows))
        return loaded


class Hold:
    """A one-shot pause point: ``await hold.wait()`` blocks until ``release()``."""

    def __init__(self) -> None:
        self.reached = anyio.Event()
        self._released = anyio.Event()

    async def wait(self) -> None:
        self.reached.set()
        await self._released.wait()

    def release(self) -> None:
        self._released.set()


class BlockingGate:
    """A pre-stream gate that, once armed for ``purpose``, holds its next check at ``hold``.

    After the hold is released the check refuses when ``refuse`` is set, else passes.
    """

    def __init__(self, purpose: str) -> None:
        self.purpose = purpose
        self.armed = False
        self.refuse = False
        self.hold = Hold()
        self.checks: list[str] = []

    async def check(self, session: str, purpose: str) -> None:
        self.checks.append(purpose)
        await anyio.lowlevel.checkpoint()
        if purpose == self.purpose and self.armed:
            self.armed = False
            await self.hold.wait()
            if self.refuse:
                raise PreStreamFailure(f"gate refused the {purpose}")


def wake_tool(r_of: Callable[[], Rig], name: str = "task_await", entry: str = "W") -> HookTool:
    """A tool that queues a background wake ``W`` while it runs."""

    def queue_wake(_: ToolCallPart) -> None:
        r_of().session().enqueue("monitors finished", kind=EntryKind.WAKE, entry=entry)

    return HookTool(name, before=queue_wake)


def withdraw_at_first_stream_end(r_of: Callable[[], Rig], entry: str = "W") -> None:
    """Withdraw ``entry`` inside the first stream-end (before the session drains)."""
    r = r_of()

    def hook(event: EngineEvent) -> None:
        if isinstance(event, StreamEnded) and len(r.of(StreamEnded)) == 1:
            r.session().withdraw(entry, "consumed")

    r.on(hook)


#: The incident's shape: a wake queued during step 2 cuts the turn with 6 steps left.
CUT_SCRIPT = [T_("bash"), T_("task_await"), X("All three tasks passed.")]


# ---------------------------------------------------------------- AS-1


async def test_as1_idle_expires_the_turns_thinking_holder() -> None:
    def change_thinking(_: ToolCallPart) -> None:
        r.session().set_thinking("high")

    async with session_rig(
        {"M": [T_("bash"), X("one"), X("two")]},
        tools=[HookTool("bash", before=change_thinking)],
    ) as r:
        session = r.session()
        session.send("first", options=SendOptions(thinking_level="low"))
        await r.settle()
        first = r.models["M"].requests
        # The mid-turn change went to the turn's holder and applied at the next step.
        assert [q.thinking_level for q in first] == ["low", "high"]
        assert session.thinking_level is None
        # At IDLE the holder has expired: a change now is the session's, and the next turn
        # starts from it (a stale holder would swallow it and the turn would run with None).
        session.set_thinking("medium")
        assert r.session().thinking_level == "medium"
        session.send("second")
        await r.settle()
        assert r.models["M"].requests[-1].thinking_level == "medium"


async def test_as1_idle_releases_wait_idle_waiters() -> None:
    released: list[Phase] = []
    async with session_rig({"M": [ScriptStep(text="half", hang=True)]}) as r:
        session = r.session()
        session.send("go")

        async def waiter() -> None:
            await session.wait_idle()
            released.append(session.phase)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert session.phase is Phase.STREAMING
            assert released == []
            session.stop()
        await r.settle()
        assert released == [Phase.IDLE]


# ---------------------------------------------------------------- AS-2


async def test_as2_an_idle_transition_after_a_refused_cutter_resumes_the_turn() -> None:
    """The cutter fails before acceptance; the move to IDLE sweeps and the turn resumes."""
    calls = Calls()

    def queue_wake(_: ToolCallPart) -> None:
        r.session().enqueue_message(wake("W", calls))

    gate = FailingGate()

    def refuse_the_wake(event: EngineEvent) -> None:
        if isinstance(event, EntryDequeued) and event.entry == "W":
            gate.count = 1

    async with session_rig(
        {"M": CUT_SCRIPT}, tools=[HookTool("task_await", before=queue_wake)], gate=gate
    ) as r:
        r.on(refuse_the_wake)
        r.session().send("start")
        await r.settle()
        assert calls.names() == ["failed"]
        assert causes(r) == ["send", "resume"]
        assert [s.budget for s in r.of(StreamStarted)] == [8, 6]
        assert r.session().phase is Phase.IDLE


async def test_as2_the_sweep_runs_after_the_idle_handlers_synchronous_work() -> None:
    """A send made inside the IDLE transition is seen by the sweep: it supersedes, no resume."""
    sent: list[bool] = []

    def send_at_idle(event: EngineEvent) -> None:
        if (
            isinstance(event, PhaseChanged)
            and event.to is Phase.IDLE
            and r.of(EntryCanceled)
            and not sent
        ):
            sent.append(True)
            r.session().send("a new request")

    async with session_rig(
        {"M": [*CUT_SCRIPT, X("answer to the new request")]},
        tools=[wake_tool(lambda: r)],
    ) as r:
        withdraw_at_first_stream_end(lambda: r)
        r.on(send_at_idle)
        r.session().send("start")
        await r.settle()
        assert sent == [True]
        assert causes(r) == ["send", "send"]
        assert [e.how for e in r.of(ContinuationEnded)] == ["withdrawn"]
        assert r.of(ResumeAttempted) == []


class SeeingModel:
    """Answers every step with ``ok`` and keeps each request it was given."""

    def __init__(self, model_id: str) -> None:
        self.id = model_id
        self.requests: list[ModelRequest] = []

    def stream_step(self, request: ModelRequest) -> AsyncIterator[Part]:
        self.requests.append(request)
        return self._answer()

    async def _answer(self) -> AsyncIterator[Part]:
        yield TextPart(text="ok")
        yield Finish(reason=FinishReason.STOP)


def withdraw_when_its_row_is_written(
    token: CancelToken,
) -> Callable[[Sequence[HistoryRow]], Awaitable[None]]:
    """A store hook: the wake's producer withdraws it while its user row is being written."""

    async def withdraw(rows: Sequence[HistoryRow]) -> None:
        if any(decode_body(row).entry_kind == "wake" for row in rows):
            token.cancel("consumed")

    return withdraw


# ---------------------------------------------------------------- AS-3


async def test_as3_q11_a_withdraw_while_the_row_persists_rolls_it_back() -> None:
    calls = Calls()
    token = CancelToken()
    state = CancelState()
    store = HookStore()

    store.before_append = withdraw_when_its_row_is_written(token)
    async with session_rig({"M": [X("never")]}, store=store) as r:
        r.session().enqueue_message(wake("W", calls, token=token, state=state))
        await r.settle()
        assert await r.history() == []
        assert calls.log == [("canceled", "consumed")]
        assert state.canceled_before_acceptance
        assert [(e.entry, e.reason) for e in r.of(EntryCanceled)] == [("W", "consumed")]
        assert r.of(StreamStarted) == []
        assert r.session().phase is Phase.IDLE


async def test_as3_q12_a_failed_rollback_whose_row_remains_accepts_the_entry() -> None:
    calls = Calls()
    token = CancelToken()
    state = CancelState()
    store = HookStore()
    store.delete_reports = 0  # the atomic delete fails and deletes nothing

    store.before_append = withdraw_when_its_row_is_written(token)
    async with session_rig({"M": [X("ok")]}, store=store) as r:
        r.session().enqueue_message(wake("W", calls, token=token, state=state))
        await r.settle()
        assert calls.log == [("accepted", "")]
        assert not state.canceled_before_acceptance
        assert causes(r) == ["queue"]
        assert await texts(r) == [(RowKind.USER, "wake W"), (RowKind.ASSISTANT, "ok")]
        assert r.of(EntryCanceled) == []


async def test_as3_an_entry_accepted_after_a_failed_rollback_keeps_its_turn_settings() -> None:
    """A failed rollback accepts the entry: its turn is the turn any accepted entry gets.

    The model sees the send's options, the session's thinking level and the live scratchpad,
    exactly as the same entry accepted without a withdrawal would have.
    """
    token = CancelToken()
    store = HookStore()
    store.delete_reports = 0  # the atomic delete fails and deletes nothing

    store.before_append = withdraw_when_its_row_is_written(token)
    model = SeeingModel("M2")
    async with session_rig({"M": []}, models=[model], store=store) as r:
        session = r.session()
        session.set_scratchpad("SCRATCH-7")
        session.set_thinking("low")
        options = SendOptions(model="M2", thinking_level="high")
        session.enqueue_message(wake("W", token=token, options=options))
        await r.settle()
        assert [(q.extra_system_context, q.thinking_level) for q in model.requests] == [
            ("SCRATCH-7", "high")
        ]
        assert causes(r) == ["queue"]


async def test_as3_a_failed_rollback_whose_row_is_gone_still_cancels() -> None:
    calls = Calls()
    token = CancelToken()
    store = HookStore()
    store.delete_misreports = 0  # the delete went through but reported a failure

    store.before_append = withdraw_when_its_row_is_written(token)
    async with session_rig({"M": [X("never")]}, store=store) as r:
        r.session().enqueue_message(wake("W", calls, token=token))
        await r.settle()
        assert calls.log == [("canceled", "consumed")]
        assert await r.history() == []
        assert r.of(StreamStarted) == []


async def test_as3_a_withdraw_during_the_pre_stream_gate_writes_nothing() -> None:
    calls = Calls()
    token = CancelToken()
    state = CancelState()

    class WithdrawingGate:
        async def check(self, session: str, purpose: str) -> None:
            await anyio.lowlevel.checkpoint()
            token.cancel()  # no reason given: the default reason applies

    async with session_rig({"M": [X("never")]}, gate=WithdrawingGate()) as r:
        r.session().enqueue_message(wake("W", calls, token=token, state=state))
        await r.settle()
        assert calls.log == [("canceled", CancelToken.DEFAULT_REASON)]
        assert state.canceled_before_acceptance
        assert r.of(Persisted) == []
        assert await r.history() == []
        assert r.of(StreamStarted) == []
        assert r.session().phase is Phase.IDLE


# ---------------------------------------------------------------- AS-4
# The pricing gate of budgeted goals is the PreStreamGate port; pausing an active goal does
# not apply (no goal service in the port).


async def test_as4_a_refused_manual_send_keeps_its_row_and_surfaces_a_stream_error() -> None:
    async with session_rig({"M": [X("never")]}, gate=FailingGate(1, "send")) as r:
        r.session().send("hello")
        await r.settle()
        assert await texts(r) == [(RowKind.USER, "hello")]
        (error,) = r.of(StreamFailed)
        assert (error.stream, error.type) == ("", "pre_stream_rejected")
        assert r.of(StreamStarted) == []
        assert r.session().phase is Phase.IDLE


async def test_as4_a_refused_synthetic_send_only_reports_the_pre_stream_failure() -> None:
    calls = Calls()
    async with session_rig({"M": [X("never")]}, gate=FailingGate(1, "send")) as r:
        r.session().enqueue_message(wake("W", calls))
        await r.settle()
        assert calls.names() == ["failed"]
        assert calls.failures[0].type == "pre_stream"
        assert await r.history() == []
        assert r.of(StreamFailed) == []
        assert r.of(StreamStarted) == []
        assert r.session().phase is Phase.IDLE


async def test_as4_a_refused_manual_send_pauses_the_active_goal_and_a_synthetic_one_does_not() -> (
    None
):
    calls = Calls()
    async with session_rig({"M": [X("never")]}, gate=FailingGate(2, "send")) as r:
        planner = await r.engine.open_session("planner", model="M", goal="ship-3")
        planner.enqueue_message(wake("W", calls))
        await r.settle()
        assert r.engine.goals.goal_state("ship-3") is GoalState.ACTIVE  # synthetic: only fails
        planner.send("ship it")
        await r.settle()
        assert r.engine.goals.goal_state("ship-3") is GoalState.PAUSED
        assert r.engine.goals.goal_state("other-goal") is GoalState.ACTIVE


def delegated(kind: EntryKind, entry: str, correlation: Correlation, calls: Calls) -> NewMessage:
    """A synthetic entry of a delegated turn (a ``report`` or ``system`` message) that hears of
    everything: accepted, a pre-stream failure, a cancellation."""
    return NewMessage(
        text=f"{kind} {entry}",
        kind=kind,
        id=entry,
        metadata=MessageMetadata(type=MetadataType.WORKSPACE_TURN, correlation=correlation),
        workspace_turn_continuation=True,
        cancel_token=CancelToken(),
        on_accepted=calls.accepted,
        on_accepted_pre_stream_failure=calls.failed,
        on_canceled=calls.canceled,
    )


@pytest.mark.parametrize("kind", [EntryKind.REPORT, EntryKind.SYSTEM])
async def test_as4_a_refused_report_or_system_entry_only_fails(kind: EntryKind) -> None:
    calls = Calls()
    gate = FailingGate(1, "send")
    async with session_rig({"M": [X("for u")]}, gate=gate) as r:
        session = r.session()
        session.enqueue_message(delegated(kind, "E", C2, calls))  # idle: dispatched at once
        session.send("u", entry="u")  # busy: queued behind it, drained once E is refused
        await r.settle()
        assert calls.log == [("failed", "pre_stream")]  # not accepted, not cancelled
        assert calls.failures[0].message == "gate refused the send"
        assert await texts(r) == [(RowKind.USER, "u"), (RowKind.ASSISTANT, "for u")]
        assert r.of(StreamFailed) == []
        assert r.of(EntryCanceled) == []
        assert [e.entry for e in r.of(EntryDequeued)] == ["E", "u"]
        assert [(str(s.cause), s.handle) for s in r.of(StreamStarted)] == [("queue", None)]
        assert gate.checks == ["send", "send"]
        assert session.phase is Phase.IDLE


async def test_as13_a_raising_pre_stream_failure_callback_does_not_stop_the_drain() -> None:
    # The host's callback raises when told its refused entry failed: the refusal still ends
    # the send (PREPARING released), and the user's message queued behind it is drained.
    def failed(failure: SendFailure) -> None:
        raise RuntimeError(f"host callback broke on {failure.type}")

    async with session_rig({"M": [X("for u")]}, gate=FailingGate(1, "send")) as r:
        session = r.session()
        entry = delegated(EntryKind.REPORT, "E", C2, Calls())
        session.enqueue_message(replace(entry, on_accepted_pre_stream_failure=failed))
        session.send("u", entry="u")
        await r.settle()
        assert await texts(r) == [(RowKind.USER, "u"), (RowKind.ASSISTANT, "for u")]
        assert [e.entry for e in r.of(EntryDequeued)] == ["E", "u"]
        assert session.phase is Phase.IDLE


@pytest.mark.parametrize("kind", [EntryKind.REPORT, EntryKind.SYSTEM])
async def test_as4_a_refused_synthetic_entry_leaves_the_owed_continuation_alone(
    kind: EntryKind,
) -> None:
    # A turn is cut by an entry of a delegated turn (C2), which the gate then refuses. A
    # refused synthetic send keeps no row, so it supersedes nothing (R35): the cut turn is
    # still owed and is resumed, under its remainder. (The cut turn is not a delegated one:
    # a delegated turn's owner would answer the claim at the cut, ST-15, and be told "no".)
    calls = Calls()
    gate = FailingGate(0, "send")

    def queue_other_turn(_: ToolCallPart) -> None:
        gate.count = 1  # refuse the next send: this entry's
        r.session().enqueue_message(delegated(kind, "E", C2, calls))

    async with session_rig(
        {"M": [T_("bash"), X("resumed answer")]},
        tools=[HookTool("bash", before=queue_other_turn)],
        gate=gate,
    ) as r:
        r.session().enqueue("scheduled task", kind=EntryKind.SYSTEM)
        await r.settle()
        kinds = await r.kinds()
        assert not r.session().owes()
    assert calls.log == [("failed", "pre_stream")]
    assert r.of(StreamFailed) == []
    assert [(e.cut, e.remaining, e.handle) for e in r.of(ContinuationOwed)] == [("s1/1", 7, None)]
    assert [e.how for e in r.of(ContinuationEnded)] == ["consumed"]
    assert [(str(s.cause), s.budget, s.handle) for s in r.of(StreamStarted)] == [
        ("queue", 8, None),
        ("resume", 7, None),
    ]
    assert gate.checks == ["send", "send", "resume"]
    assert kinds == [RowKind.USER, RowKind.ASSISTANT, RowKind.SENTINEL, RowKind.ASSISTANT]


# ---------------------------------------------------------------- AS-5
# PDF support and size checks do not apply (no PDF handling in the port).


async def test_as5_an_invalid_model_is_refused_before_any_row_is_written() -> None:
    calls = Calls()
    async with session_rig({"M": [X("never")]}) as r:
        session = r.session()
        session.send("hello", options=SendOptions(model="bad"))
        await r.settle()
        session.enqueue_message(wake("W", calls, options=SendOptions(model="not:known")))
        await r.settle()
        assert await r.history() == []
        assert r.of(Persisted) == []
        assert r.of(StreamStarted) == []
        assert calls.failures[0].type == "invalid_model_string"


async def test_as5_an_invalid_edit_leaves_history_and_the_turn_alone() -> None:
    async with session_rig({"M": [X("first answer"), ScriptStep(text="half", hang=True)]}) as r:
        session = r.session()
        session.send("first")
        await r.settle()
        before = await r.history()
        session.send("second")
        await anyio.wait_all_tasks_blocked()
        assert session.phase is Phase.STREAMING
        with pytest.raises(UsageError):
            await session.edit(before[0].row_id, "   ")
        # Nothing was truncated and the running turn was not interrupted.
        assert session.phase is Phase.STREAMING
        assert [row.row_id for row in await r.history()][:2] == [row.row_id for row in before]
        assert len(await r.history()) == 3
        session.stop()
        await r.settle()


# ---------------------------------------------------------------- AS-6


async def test_as6_edit_while_streaming_abandons_the_partial_and_resends() -> None:
    async with session_rig(
        {"M": [ScriptStep(text="half an answer", hang=True), X("edited answer")]}
    ) as r:
        session = r.session()
        session.send("original")
        await anyio.wait_all_tasks_blocked()
        session.send("queued meanwhile")
        (target,) = await r.history()
        restored = await session.edit(target.row_id, "edited")
        await r.settle()
        assert restored == "queued meanwhile"
        (abort,) = r.of(StreamAborted)
        assert abort.reason == "user"
        assert await texts(r) == [(RowKind.USER, "edited"), (RowKind.ASSISTANT, "edited answer")]
        assert causes(r) == ["send", "send"]
        assert len(session.queue) == 0


async def test_as6_edit_preempts_a_preparing_turn() -> None:
    store = HookStore()
    hold = Hold()

    async def hold_first_envelope(_: TurnEnvelope) -> None:
        if not hold.reached.is_set():
            await hold.wait()

    store.before_envelope = hold_first_envelope
    async with session_rig({"M": [X("edited answer")]}, store=store) as r:
        session = r.session()
        session.send("original")
        await hold.reached.wait()
        assert session.phase is Phase.PREPARING
        (target,) = await r.history()
        async with anyio.create_task_group() as tg:
            tg.start_soon(session.edit, target.row_id, "edited")
            await anyio.wait_all_tasks_blocked()
            hold.release()
        await r.settle()
        assert len(r.of(StreamStarted)) == 1
        assert await texts(r) == [(RowKind.USER, "edited"), (RowKind.ASSISTANT, "edited answer")]
        assert r.models["M"].requests[0].messages[-1].text == "edited"
        assert r.session().phase is Phase.IDLE


async def test_as6_edit_defers_the_queue_flush_until_it_has_restored_the_queue() -> None:
    """The stream completes while the edit waits for idle: the queue is not drained."""
    store = HookStore()
    hold = Hold()

    async def hold_the_final_write(rows: Sequence[HistoryRow]) -> None:
        if rows[0].kind is RowKind.ASSISTANT and not hold.reached.is_set():
            await hold.wait()

    store.before_append = hold_the_final_write
    async with session_rig({"M": [X("first answer"), X("edited answer")]}, store=store) as r:
        session = r.session()
        session.send("original")
        await hold.reached.wait()
        session.send("queued meanwhile", mode="turn-end")
        (target,) = await r.history()
        restored: list[str] = []

        async def edit() -> None:
            restored.append(await session.edit(target.row_id, "edited"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(edit)
            await anyio.wait_all_tasks_blocked()
            hold.release()
        await r.settle()
        assert restored == ["queued meanwhile"]
        assert r.of(EntryDequeued) == []
        assert causes(r) == ["send", "send"]
        assert await texts(r) == [(RowKind.USER, "edited"), (RowKind.ASSISTANT, "edited answer")]


async def test_as6_an_edit_that_interrupted_nothing_does_not_drop_a_later_partial() -> None:
    """``abandonPartial`` belongs to the edit's own interrupt, not to a later user Stop."""
    store = HookStore()
    hold = Hold()

    async def hold_the_final_write(rows: Sequence[HistoryRow]) -> None:
        if rows[0].kind is RowKind.ASSISTANT and not hold.reached.is_set():
            await hold.wait()

    store.before_append = hold_the_final_write
    async with session_rig(
        {"M": [X("first answer"), ScriptStep(text="kept partial", hang=True)]}, store=store
    ) as r:
        session = r.session()
        session.send("original")
        await hold.reached.wait()
        (target,) = await r.history()
        async with anyio.create_task_group() as tg:
            tg.start_soon(session.edit, target.row_id, "edited")
            await anyio.wait_all_tasks_blocked()
            hold.release()
        await anyio.wait_all_tasks_blocked()
        assert session.phase is Phase.STREAMING
        session.stop()
        await r.settle()
        assert await texts(r) == [(RowKind.USER, "edited"), (RowKind.PARTIAL, "kept partial")]


# ---------------------------------------------------------------- AS-7
# File-mention, skill and prompt snapshots and on-send compaction do not exist in the port:
# a send appends exactly its user row.


async def test_as7_a_send_appends_its_user_row_after_history_before_streaming() -> None:
    async with session_rig({"M": [X("one"), X("two")]}) as r:
        r.session().send("first")
        await r.settle()
        r.session().send("second")
        await r.settle()
        assert await texts(r) == [
            (RowKind.USER, "first"),
            (RowKind.ASSISTANT, "one"),
            (RowKind.USER, "second"),
            (RowKind.ASSISTANT, "two"),
        ]
        persisted = [e for e in r.of(Persisted) if e.what == "user-row"]
        second_start = r.of(StreamStarted)[1]
        assert len(persisted) == 2
        assert r.events.index(persisted[1]) < r.events.index(second_start)


async def test_as7_a_rollback_deletes_only_the_canceled_sends_row() -> None:
    calls = Calls()
    token = CancelToken()
    store = HookStore()

    store.before_append = withdraw_when_its_row_is_written(token)
    async with session_rig({"M": [X("one")]}, store=store) as r:
        r.session().send("first")
        await r.settle()
        before = await r.history()
        r.session().enqueue_message(wake("W", calls, token=token))
        await r.settle()
        assert await r.history() == before
        assert calls.log == [("canceled", "consumed")]


# ---------------------------------------------------------------- AS-8
# The port has no goal synchronization; its point of no return is the check after the user
# row is durable. Withdrawals after it are ignored.


async def test_as8_q13_a_withdraw_at_acceptance_is_ignored() -> None:
    calls = Calls()
    token = CancelToken()

    def accept_then_withdraw() -> None:
        calls.accepted()
        token.cancel("too late")

    async with session_rig({"M": [X("ok")]}) as r:
        r.session().enqueue_message(wake("W", calls, token=token, on_accepted=accept_then_withdraw))
        await r.settle()
        assert calls.log == [("accepted", "")]
        assert causes(r) == ["queue"]
        assert await texts(r) == [(RowKind.USER, "wake W"), (RowKind.ASSISTANT, "ok")]
        assert r.of(EntryCanceled) == []


async def test_as8_a_withdraw_during_the_launch_is_ignored() -> None:
    calls = Calls()
    token = CancelToken()
    store = HookStore()

    def withdraw_once_the_row_is_read(rows: list[HistoryRow]) -> None:
        if any(decode_body(row).entry_kind == "wake" for row in rows):
            token.cancel("too late")

    store.before_history = withdraw_once_the_row_is_read
    async with session_rig({"M": [X("ok")]}, store=store) as r:
        r.session().enqueue_message(wake("W", calls, token=token))
        await r.settle()
        assert token.cancelled
        assert calls.log == [("accepted", "")]
        assert causes(r) == ["queue"]
        assert (RowKind.USER, "wake W") in await texts(r)


async def test_as8_a_user_row_crossing_the_horizon_withdraws_the_owed_continuation() -> None:
    """A ``tool-end`` user message cuts the turn: a new turn, the marker ends at its row (R35)."""
    async with session_rig(
        {"M": [T_("bash"), X("answer to u")]},
        tools=[HookTool("bash", before=lambda _: r.session().send("u"))],
    ) as r:
        r.session().send("start")
        await r.settle()
        (owed,) = r.of(ContinuationOwed)
        assert owed.remaining == 7
        (ended,) = r.of(ContinuationEnded)
        assert ended.how == "withdrawn"
        u_row = [e for e in r.of(Persisted) if e.what == "user-row"][1]
        second_start = r.of(StreamStarted)[1]
        assert r.events.index(u_row) < r.events.index(ended) < r.events.index(second_start)
        assert [s.budget for s in r.of(StreamStarted)] == [8, 8]
        assert r.of(ResumeAttempted) == []


async def test_as8_a_wake_row_continues_the_cut_turn() -> None:
    async with session_rig(
        {"M": [*CUT_SCRIPT, X("after the wake")]}, tools=[wake_tool(lambda: r)]
    ) as r:
        r.session().send("start")
        await r.settle()
        assert [e.how for e in r.of(ContinuationEnded)] == ["consumed"]
        assert causes(r) == ["send", "queue"]


async def test_as8_a_row_of_the_markers_correlation_continues_and_another_withdraws() -> None:
    for cutter, how in ((C, "consumed"), (C2, "withdrawn")):

        def queue_report(_: ToolCallPart, cutter: Correlation = cutter) -> None:
            r.session().enqueue("report", kind=EntryKind.REPORT, correlation=cutter)

        async with session_rig(
            {"M": [T_("task_await"), X("after the report")]},
            tools=[HookTool("task_await", before=queue_report)],
        ) as r:
            r.session().enqueue("delegated work", kind=EntryKind.REPORT, correlation=C)
            await r.settle()
            (owed,) = r.of(ContinuationOwed)
            assert owed.handle == "h1"
            assert [e.how for e in r.of(ContinuationEnded)] == [how], cutter


# ---------------------------------------------------------------- AS-9
# The startup-abandon marker, auto-retry re-enabling and lastAutoRetryResumeRequest belong to
# the auto-retry manager, which the port does not have.


async def test_as9_on_accepted_runs_once_before_the_stream_starts() -> None:
    starts_at_acceptance: list[int] = []

    def accepted() -> None:
        starts_at_acceptance.append(len(r.of(StreamStarted)))

    async with session_rig({"M": [X("ok")]}) as r:
        r.session().enqueue_message(wake("W", on_accepted=accepted))
        await r.settle()
        assert starts_at_acceptance == [0]
        assert causes(r) == ["queue"]


async def test_as9_acceptance_opens_a_fresh_thinking_holder_for_the_turn() -> None:
    def change_thinking(_: ToolCallPart) -> None:
        r.session().set_thinking("high")

    async with session_rig(
        {"M": [T_("bash"), T_("bash"), X("done")]},
        tools=[HookTool("bash", before=change_thinking)],
    ) as r:
        r.session().set_thinking("low")
        r.session().send("go")
        await r.settle()
        assert [q.thinking_level for q in r.models["M"].requests] == ["low", "high", "high"]
        assert r.session().thinking_level == "low"


async def test_as9_a_failing_on_accepted_is_an_error_result() -> None:
    calls = Calls()

    def broken_on_accepted() -> None:
        raise RuntimeError("the producer's bookkeeping failed")

    async with session_rig({"M": [X("for B")]}) as r:
        session = r.session()
        session.enqueue_message(wake("A", calls, on_accepted=broken_on_accepted))
        session.send("B")
        await r.settle()
        assert calls.names() == ["failed"]
        assert causes(r) == ["queue"]
        assert r.models["M"].requests[0].messages[-1].text == "B"
        assert session.phase is Phase.IDLE


# ---------------------------------------------------------------- AS-10


async def test_as10_an_accepted_send_goes_preparing_streaming_completing_idle() -> None:
    async with session_rig({"M": [X("ok")]}) as r:
        r.session().send("go")
        await r.settle()
        assert phases(r) == [
            (Phase.IDLE, Phase.PREPARING),
            (Phase.PREPARING, Phase.STREAMING),
            (Phase.STREAMING, Phase.COMPLETING),
            (Phase.COMPLETING, Phase.IDLE),
        ]


async def test_as10_a_launch_failure_after_acceptance_is_reported_and_the_queue_goes_on() -> None:
    calls = Calls()
    store = HookStore()
    failed_once: list[bool] = []

    async def fail_the_wakes_envelope(_: TurnEnvelope) -> None:
        if not failed_once:
            failed_once.append(True)
            raise StoreError("disk full")

    store.before_envelope = fail_the_wakes_envelope
    async with session_rig({"M": [X("for B")]}, store=store) as r:
        session = r.session()
        session.enqueue_message(wake("A", calls))
        session.send("B")
        await r.settle()
        assert calls.names()[0] == "accepted"
        assert calls.names()[1:] == ["failed"] or len(r.of(StreamFailed)) == 1
        assert len(r.of(StreamStarted)) == 1
        assert r.models["M"].requests[0].messages[-1].text == "B"
        assert session.phase is Phase.IDLE


async def test_as10_a_withdrawn_launch_returns_to_idle_and_drains() -> None:
    store = HookStore()
    hold = Hold()

    async def hold_first_envelope(_: TurnEnvelope) -> None:
        if not hold.reached.is_set():
            await hold.wait()

    store.before_envelope = hold_first_envelope
    async with session_rig({"M": [X("answer to u")]}, store=store) as r:
        session = r.session()
        session.send("a")
        await hold.reached.wait()
        session.send("u")
        assert session.send_now()
        hold.release()
        await r.settle()
        assert causes(r) == ["queue"]
        assert r.models["M"].requests[0].messages[-1].text == "u"
        assert (Phase.PREPARING, Phase.IDLE) in phases(r)
        assert session.phase is Phase.IDLE


# ---------------------------------------------------------------- AS-11
# External manual follow-ups have no port; the manual-preflight half is tested.


async def test_as11_a_manual_send_in_preflight_holds_the_sweep_then_a_failure_resweeps() -> None:
    gate = BlockingGate("send")
    sent: list[bool] = []

    def send_at_idle(event: EngineEvent) -> None:
        idle = isinstance(event, PhaseChanged) and event.to is Phase.IDLE
        if idle and r.of(EntryCanceled) and not sent:
            sent.append(True)
            gate.armed = True
            r.session().send("doomed", options=SendOptions(model="bad"))

    async with session_rig({"M": CUT_SCRIPT}, tools=[wake_tool(lambda: r)], gate=gate) as r:
        withdraw_at_first_stream_end(lambda: r)
        r.on(send_at_idle)
        session = r.session()
        session.send("start")
        await gate.hold.reached.wait()
        await anyio.wait_all_tasks_blocked()
        # The sweep ran (IDLE, queue empty, a marker owed) but yielded to the preflight send.
        assert session.phase is Phase.IDLE
        assert session.owes()
        assert r.of(ResumeAttempted) == []
        assert causes(r) == ["send"]
        gate.hold.release()
        await r.settle()
        assert causes(r) == ["send", "resume"]
        assert [e.outcome for e in r.of(ResumeAttempted)] == ["started"]
        assert not session.owes()


# ---------------------------------------------------------------- AS-3: withdraw by name
# A producer that kept only the entry's name withdraws through ``AgentSession.withdraw``; the
# session must reach the entry after it left the queue and before the point of no return.


def _withdraw_wake_at(r: Rig, moment: Callable[[EngineEvent, bool], bool], out: list[bool]) -> None:
    """Withdraw wake ``W`` by name, once, inside the first event ``moment`` picks after it left
    the queue (``moment(event, dequeued)``)."""
    dequeued = False

    def hook(event: EngineEvent) -> None:
        nonlocal dequeued
        if isinstance(event, EntryDequeued) and event.entry == "W":
            dequeued = True
        if not out and moment(event, dequeued):
            out.append(r.session().withdraw("W", "read by its own await"))

    r.on(hook)


async def test_as3_withdraw_by_name_reaches_an_entry_dequeued_but_not_yet_accepted() -> None:
    withdrawn: list[bool] = []
    async with session_rig({"M": [X("first"), X("never")]}) as r:
        _withdraw_wake_at(r, lambda e, dq: dq and isinstance(e, EntryDequeued), withdrawn)
        r.session().send("hello")
        r.session().enqueue("monitors finished", kind=EntryKind.WAKE, entry="W", mode="turn-end")
        await r.settle()
        assert withdrawn == [True]
        canceled = [(e.entry, e.reason) for e in r.of(EntryCanceled)]
        assert canceled == [("W", "read by its own await")]
        assert len(r.of(StreamStarted)) == 1  # the wake never streamed
        assert await texts(r) == [(RowKind.USER, "hello"), (RowKind.ASSISTANT, "first")]
        assert r.session().phase is Phase.IDLE


async def test_as3_withdraw_by_name_after_the_row_persisted_rolls_the_row_back() -> None:
    withdrawn: list[bool] = []

    def after_its_row(event: EngineEvent, dequeued: bool) -> bool:
        return dequeued and isinstance(event, Persisted) and event.what == "user-row"

    async with session_rig({"M": [X("first"), X("never")]}) as r:
        _withdraw_wake_at(r, after_its_row, withdrawn)
        r.session().send("hello")
        r.session().enqueue("monitors finished", kind=EntryKind.WAKE, entry="W", mode="turn-end")
        await r.settle()
        assert withdrawn == [True]
        assert [e.reason for e in r.of(EntryCanceled)] == ["read by its own await"]
        assert len(r.of(StreamStarted)) == 1
        assert await texts(r) == [(RowKind.USER, "hello"), (RowKind.ASSISTANT, "first")]
