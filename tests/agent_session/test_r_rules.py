"""The review-finding rules (R1 to R65) on the owed continuation, through the session.

Rules whose main test sits with its ST rule (R1, R3, R4, R7, R9, R15, R18, R20, R21, R23, R26,
R27, R29, R32, R34, R43, R45, R64, R65) are named there too (``test_st2_r1_...``); these are
the rest, and second angles on some of those. Helpers come from ``test_st_rules``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import anyio
import pytest

from agent_session import (
    ContinuationEnded,
    ContinuationOwed,
    EngineConfig,
    EngineEvent,
    EntryCanceled,
    EntryDequeued,
    Persisted,
    Phase,
    PreStreamFailure,
    QueueCleared,
)
from message_queue import Correlation, EntryKind
from persistence import CutState, HistoryRow, RowKind
from stream_manager import (
    AbortReason,
    ScriptStep,
    ScriptToolCall,
    StreamAborted,
    StreamFailed,
    StreamStarted,
    ToolCallPart,
    ToolCallStarted,
    ToolKind,
)
from tests.agent_session.support import T_, HookTool, P, X, session_rig
from tests.agent_session.test_as_send_rules import HookStore
from tests.agent_session.test_st_rules import (
    C2,
    REFUSE,
    C,
    Gate,
    Once,
    Trap,
    TrapStore,
    Wakes,
    both,
    hows,
    incident,
    outcomes,
    provider_pair,
    reach,
    requests,
    resume_claimed,
    resume_stream,
    starts,
    text_of,
)
from tests.store_kit import owed


def provider_call(tool: str) -> Callable[[EngineEvent], bool]:
    """The start of provider-executed ``tool``'s call (``P`` steps call ``web``)."""
    return lambda e: isinstance(e, ToolCallStarted) and e.provider and e.tool == tool


# ---------------------------------------------------------------- R2


async def test_r2_a_resume_carries_the_cut_streams_correlation() -> None:
    wakes = Wakes()
    async with session_rig(
        incident(), tools=[HookTool("task_await", before=wakes.queue)], handles=((C, "s1"),)
    ) as r:
        wakes.attach(r)
        r.session().enqueue("delegated task", kind=EntryKind.SYSTEM, correlation=C)
        await r.settle()
    assert r.of(ContinuationOwed)[0].handle == "h1"
    resumed = resume_stream(r)
    assert (resumed.handle, resumed.budget) == ("h1", 6)
    assert {q.correlation for q in requests(r, resumed.stream)} == {C}


# ---------------------------------------------------------------- R6, R11, R42


async def test_r6_r11_stop_withdraws_before_restoring_the_queue_and_aborts_the_resume() -> None:
    gate = Gate()
    held = gate.hold("resume", 1)
    wakes = Wakes()
    owed_at_restore: list[bool] = []
    async with session_rig(
        incident(), tools=[HookTool("task_await", before=wakes.queue)], gate=gate
    ) as r:
        wakes.attach(r)
        s = r.session()
        r.on(lambda e: owed_at_restore.append(s.owes()) if isinstance(e, QueueCleared) else None)
        s.send("start")
        await reach(held.reached)
        s.stop()
        held.release()
        await r.settle()
        assert (s.phase, s.owes()) == (Phase.IDLE, False)
        kinds = await r.kinds()
    assert owed_at_restore[0] is False
    (ended,) = r.of(ContinuationEnded)
    assert ended.how.value == "withdrawn"
    # Withdrawn before the restore (above); told once its record's withdrawal committed.
    (void,) = [e for e in r.of(Persisted) if e.what == "cut-void"]
    assert r.events.index(void) == r.events.index(ended) - 1
    assert outcomes(r) == ["withdrawn"]
    assert starts(r) == [("send", 8)]  # nothing registered after the Stop
    assert RowKind.SENTINEL not in kinds


async def test_r6_a_stop_during_a_tool_owes_nothing_and_cancels_the_queued_wake() -> None:
    wakes = Wakes(keep=True)
    running = anyio.Event()
    slow = HookTool("slow", before=both(wakes.queue, lambda _: running.set()), gate=anyio.Event())
    async with session_rig({"M": [T_("slow"), X("never")]}, tools=[slow]) as r:
        wakes.attach(r)
        s = r.session()
        s.send("run the slow tool")
        await reach(running)
        s.stop()
        await r.settle()
        assert (s.phase, s.owes()) == (Phase.IDLE, False)
    assert [e.reason.value for e in r.of(StreamAborted)] == ["user"]
    assert r.of(ContinuationOwed) == []
    assert [(e.entry, e.reason) for e in r.of(EntryCanceled)] == [("w1", "restored to input")]
    assert starts(r) == [("send", 8)]
    assert outcomes(r) == []


async def test_as18_r6_send_now_on_a_resumed_stream_runs_the_user_entry_resumes_nothing() -> None:
    """Send-now while the *resumed* stream runs: the user's entry goes next (ahead of a hidden
    wake queued before it), the resumed stream is stopped with reason ``user``, and that user
    interrupt leaves nothing owed (the resume had consumed the cut at its start; the interrupt
    must not owe it again), so no further resume follows."""
    wakes = Wakes()  # w1 cuts the first stream and is withdrawn at its end: the incident
    running = anyio.Event()

    def in_the_resumed_stream(_: ToolCallPart) -> None:
        s = r.session()
        s.enqueue("monitor output", kind=EntryKind.WAKE, entry="w2")  # hidden, queued first
        s.send("u", entry="u")
        running.set()

    slow = HookTool("slow", before=in_the_resumed_stream, gate=anyio.Event())  # never returns
    async with session_rig(
        {"M": [T_("bash"), T_("task_await"), T_("slow"), X("answer to u"), X("answer to w2")]},
        tools=[HookTool("task_await", before=wakes.queue), slow],
    ) as r:
        wakes.attach(r)
        s = r.session()
        s.send("start")
        await reach(running)
        resumed = resume_stream(r)
        assert (resumed.stream, resumed.budget, s.phase, s.owes()) == (
            "s1/2",
            6,
            Phase.STREAMING,
            False,
        )
        assert s.send_now()
        assert not s.owes()
        await r.settle()
        assert not s.owes()
        assert await owed(r.store) == []
        kinds = await r.kinds()
    assert [(e.stream, e.reason.value) for e in r.of(StreamAborted)] == [("s1/2", "user")]
    assert [e.entry for e in r.of(EntryDequeued)] == ["w1", "u", "w2"]
    assert starts(r) == [("send", 8), ("resume", 6), ("queue", 8), ("queue", 8)]
    assert [q.messages[-1].text for q in requests(r, "s1/3")] == ["u"]
    assert [e.cut for e in r.of(ContinuationOwed)] == ["s1/1"]  # the resumed turn: never owed
    assert hows(r) == ["consumed"]
    assert outcomes(r) == ["started"]  # one resume, none after the interrupt
    assert kinds == [
        RowKind.USER,
        RowKind.ASSISTANT,
        RowKind.SENTINEL,
        RowKind.PARTIAL,  # the resumed stream's partial, kept, with no cut record
        RowKind.USER,
        RowKind.ASSISTANT,
        RowKind.USER,
        RowKind.ASSISTANT,
    ]


async def test_r11_stop_during_the_resumes_history_read_registers_nothing() -> None:
    store = TrapStore()
    read = Trap(hold=True)
    wakes = Wakes()
    async with session_rig(
        incident(), tools=[HookTool("task_await", before=wakes.queue)], store=store
    ) as r:
        wakes.attach(r)
        s = r.session()
        hook = Once(r, resume_claimed(r), lambda: store.arm("history", trap=read))
        s.send("start")
        await reach(read.reached)
        s.stop()
        read.release()
        await r.settle()
        hook.check()
        kinds = await r.kinds()
    assert outcomes(r) == ["withdrawn"]
    assert hows(r) == ["withdrawn"]
    assert starts(r) == [("send", 8)]
    assert store.calls["put_envelope"] == 1  # only S1's: the resume never registered
    assert kinds == [RowKind.USER, RowKind.ASSISTANT]


async def test_r42_a_hard_stop_during_a_held_resume_forfeits_and_aborts_it() -> None:
    gate = Gate()
    held = gate.hold("resume", 1)
    wakes = Wakes()
    async with session_rig(
        incident(), tools=[HookTool("task_await", before=wakes.queue)], gate=gate
    ) as r:
        wakes.attach(r)
        s = r.session()
        s.send("start")
        await reach(held.reached)
        s.hard_stop()
        held.release()
        await r.settle()
        assert (s.phase, s.owes()) == (Phase.IDLE, False)
    assert hows(r) == ["forfeited"]
    assert outcomes(r) == ["withdrawn"]
    assert starts(r) == [("send", 8)]


# ---------------------------------------------------------------- R14


async def test_r14_messages_queued_while_a_resume_is_rejected_drain_after() -> None:
    gate = Gate()
    held = gate.hold("resume", 1)
    wakes = Wakes()
    async with session_rig(
        incident("answer to u"), tools=[HookTool("task_await", before=wakes.queue)], gate=gate
    ) as r:
        wakes.attach(r)
        s = r.session()
        s.send("start")
        await reach(held.reached)
        s.send("u", entry="u")  # busy: queued behind the resume
        held.release(fail=True)
        await r.settle()
        rows = await r.history()
    assert outcomes(r) == ["failed"]
    assert starts(r) == [("send", 8), ("queue", 8)]
    assert hows(r) == ["withdrawn"]  # u's row superseded the cut turn (R35)
    assert [row.kind for row in rows] == [
        RowKind.USER,
        RowKind.ASSISTANT,
        RowKind.USER,
        RowKind.ASSISTANT,
    ]
    assert text_of(rows[2]) == "u"


# ---------------------------------------------------------------- R15, R20


async def test_r15_a_soft_stop_cut_resumes_on_the_model_that_ran_it() -> None:
    wakes = Wakes(on=StreamAborted)
    async with session_rig(
        {"A": [REFUSE], "B": [P("web"), X("B resumes")]},
        fallbacks={"A": ["B"]},
        sessions=(("s1", "A"),),
    ) as r:
        wakes.attach(r)
        r.on(wakes.queue_on_provider_call)
        r.session().send("start")
        await r.settle()
    (owed,) = r.of(ContinuationOwed)
    assert (owed.model, owed.remaining) == ("B", 6)
    resumed = resume_stream(r)
    assert (resumed.model, resumed.budget) == ("B", 6)
    assert [q.model for q in requests(r, resumed.stream)] == ["B"]
    assert len(r.models["A"].requests) == 1


async def test_r20_an_applied_thinking_change_is_kept_by_the_resume() -> None:
    wakes = Wakes()

    def think_low(_: ToolCallPart) -> None:
        r.session().set_thinking("low")  # applied when step 2 is prepared

    async with session_rig(
        incident(),
        tools=[HookTool("bash", before=think_low), HookTool("task_await", before=wakes.queue)],
    ) as r:
        wakes.attach(r)
        r.session().send("start")
        await r.settle()
    assert [q.thinking_level for q in requests(r, "s1/1")] == [None, "low"]
    assert [q.thinking_level for q in requests(r, resume_stream(r).stream)] == ["low"]


# ---------------------------------------------------------------- R16, R22, R46


async def test_r16_a_system_stop_landing_on_a_pending_soft_stop_owes_nothing() -> None:
    wakes = Wakes(keep=True)
    async with session_rig({"M": [T_("bash"), provider_pair(), X("never")]}) as r:
        wakes.attach(r)
        r.on(lambda e: wakes.queue() if provider_call("web")(e) else None)
        # an interrupt cascade stops the stream directly: the soft-stop flag stays set
        hook = Once(
            r,
            provider_call("fetch"),
            lambda: r.engine.manager.request_stop_nowait("s1", reason=AbortReason.SYSTEM),
        )
        r.session().send("search")
        await r.settle()
        hook.check()
        assert not r.session().owes()
    assert [e.reason.value for e in r.of(StreamAborted)] == ["system"]
    assert r.of(ContinuationOwed) == []
    # the queued wake is a new turn with a full budget, sent once the session is idle (AS-13)
    assert len(r.dequeued_only_once_idle()) == 1
    assert starts(r) == [("send", 8), ("queue", 8)]
    assert outcomes(r) == []


async def test_r22_a_hard_stop_during_the_abort_handlers_awaits_owes_nothing() -> None:
    wakes = Wakes(keep=True)
    async with session_rig({"M": [T_("bash"), P("web"), X("never")]}) as r:
        wakes.attach(r)
        r.on(wakes.queue_on_provider_call)
        hook = Once(
            r,
            # the partial, written with its cut record in one write (R60)
            lambda e: isinstance(e, Persisted) and e.what == "cut",
            lambda: r.session().hard_stop(),  # lands after the partial's write was awaited
        )
        r.session().send("search")
        await r.settle()
        hook.check()
        assert await owed(r.store) == []  # the record written for it is voided
        assert not r.session().owes()
    assert [e.reason.value for e in r.of(StreamAborted) if e.stream] == ["queued-message"]
    assert r.of(ContinuationOwed) == []
    assert [(e.entry, e.reason) for e in r.of(EntryCanceled)] == [("w1", "hard stop")]
    assert starts(r) == [("send", 8)]
    assert outcomes(r) == []


async def test_r46_a_soft_stop_after_a_successful_required_tool_owes_nothing() -> None:
    report = ScriptStep(
        tool_calls=(
            ScriptToolCall(tool="agent_report", provider_executed=True, result={"success": True}),
        ),
        text="reported",
    )
    wakes = Wakes(keep=True)
    async with session_rig(
        {"M": [report, X("wake answered")]},
        tools=[HookTool("agent_report", kind=ToolKind.COMPLETION)],
    ) as r:
        wakes.attach(r)
        r.on(lambda e: wakes.queue() if provider_call("agent_report")(e) else None)
        r.session().send("report and finish")
        await r.settle()
    assert [e.reason.value for e in r.of(StreamAborted)] == ["queued-message"]
    assert r.of(ContinuationOwed) == []
    assert starts(r) == [("send", 8), ("queue", 8)]  # the wake runs as its own turn
    assert outcomes(r) == []


# ---------------------------------------------------------------- R19


@pytest.mark.parametrize(
    "reason", [AbortReason.SYSTEM, AbortReason.STARTUP, AbortReason.USER, None]
)
async def test_r19_a_synthetic_abort_withdraws_a_preparing_resume(
    reason: AbortReason | None,
) -> None:
    gate = Gate()
    held = gate.hold("resume", 1)
    wakes = Wakes()
    async with session_rig(
        incident(), tools=[HookTool("task_await", before=wakes.queue)], gate=gate
    ) as r:
        wakes.attach(r)
        s = r.session()
        s.send("start")
        await reach(held.reached)
        r.engine.manager.request_stop_nowait("s1", reason=reason)  # nothing registered yet
        assert [e.stream for e in r.of(StreamAborted)] == [""]
        held.release()
        await r.settle()
        assert (s.phase, s.owes()) == (Phase.IDLE, False)
    assert hows(r) == ["withdrawn"]
    assert outcomes(r) == ["withdrawn"]
    assert starts(r) == [("send", 8)]


async def test_r19_a_queued_message_synthetic_abort_keeps_the_resume() -> None:
    gate = Gate()
    held = gate.hold("resume", 1)
    wakes = Wakes()
    async with session_rig(
        incident(), tools=[HookTool("task_await", before=wakes.queue)], gate=gate
    ) as r:
        wakes.attach(r)
        r.session().send("start")
        await reach(held.reached)
        r.engine.manager.request_stop_nowait("s1", reason=AbortReason.QUEUED_MESSAGE)
        held.release()
        await r.settle()
    assert hows(r) == ["consumed"]
    assert outcomes(r) == ["started"]
    assert starts(r) == [("send", 8), ("resume", 6)]


async def test_r19_a_synthetic_abort_spares_the_marker_when_no_resume_is_preparing() -> None:
    """Only a PREPARING *resume* is withdrawn by a synthetic abort; a wake's dispatch is not.

    An earlier resume was withdrawn (Stop at its gate). Later a new cut is owed and its live
    wake is PREPARING when an interrupt cascade stops a session that has no stream: the wake
    goes on and its stream consumes the marker.
    """
    gate = Gate()
    resume_held = gate.hold("resume", 1)
    wake_held = gate.hold("send", 3)  # sends: "start", "again", then w2's dispatch
    wakes = Wakes(keep=(2,))
    async with session_rig(
        {"M": [T_("bash"), T_("task_await"), T_("task_await"), X("w2 answered")]},
        tools=[HookTool("task_await", before=wakes.queue)],
        gate=gate,
    ) as r:
        wakes.attach(r)
        s = r.session()
        s.send("start")
        await reach(resume_held.reached)
        s.stop()
        resume_held.release()
        await r.settle()
        s.send("again")
        await reach(wake_held.reached)
        assert (s.phase, s.owes()) == (Phase.PREPARING, True)
        r.engine.manager.request_stop_nowait("s1", reason=AbortReason.SYSTEM)
        wake_held.release()
        await r.settle()
    assert [e.cut for e in r.of(ContinuationOwed)] == ["s1/1", "s1/2"]
    assert hows(r) == ["withdrawn", "consumed"]
    assert starts(r) == [("send", 8), ("send", 8), ("queue", 8)]


# ---------------------------------------------------------------- R25


async def test_r25_a_resume_whose_stream_fails_is_left_to_the_error_path() -> None:
    wakes = Wakes()
    async with session_rig(
        {"M": [T_("bash"), T_("task_await"), ScriptStep(error="terminal")]},
        tools=[HookTool("task_await", before=wakes.queue)],
    ) as r:
        wakes.attach(r)
        r.session().send("start")
        await r.settle()
        s = r.session()
        assert (s.phase, s.owes(), s.continuation.failed_attempts) == (Phase.IDLE, False, 0)
    resumed = resume_stream(r)
    assert [e.stream for e in r.of(StreamFailed)] == [resumed.stream]
    assert outcomes(r) == ["started"]  # not a failed-before-start attempt, never swept again
    assert starts(r) == [("send", 8), ("resume", 6)]


# ---------------------------------------------------------------- R35


async def test_r35_a_superseding_message_withdraws_at_its_point_of_no_return() -> None:
    owed_at_start: list[bool] = []
    async with session_rig(
        {"M": [T_("bash"), X("answer to u")]},
        tools=[HookTool("bash", before=lambda _: r.session().send("u", entry="u"))],
    ) as r:
        r.on(
            lambda e: (
                owed_at_start.append(r.session().owes())
                if isinstance(e, StreamStarted) and e.cause.value == "queue"
                else None
            )
        )
        r.session().send("start")
        await r.settle()
        rows = await r.history()
    assert [e.remaining for e in r.of(ContinuationOwed)] == [7]
    assert owed_at_start == [False]  # withdrawn before u's stream-start could consume it
    assert hows(r) == ["withdrawn"]
    assert outcomes(r) == []
    assert [text_of(row) for row in rows if row.kind is RowKind.USER] == ["start", "u"]


class _RefuseSecondSend:
    """A pre-stream gate that refuses the second send it checks (the queued message)."""

    def __init__(self) -> None:
        self.sends = 0

    async def check(self, session: str, purpose: str) -> None:
        await anyio.lowlevel.checkpoint()
        if purpose == "send":
            self.sends += 1
            if self.sends == 2:
                raise PreStreamFailure("the pricing gate refused the message")


async def test_r35_a_refused_message_whose_row_is_durable_still_withdraws_the_cut() -> None:
    # AS-4 keeps a refused manual send's row. Once durable, that row is the conversation's
    # latest word: resuming the cut turn now would answer it under the cut's budget.
    async with session_rig(
        {"M": [T_("bash"), X("never said")]},
        tools=[HookTool("bash", before=lambda _: r.session().send("u", entry="u"))],
        gate=_RefuseSecondSend(),
    ) as r:
        r.session().send("start")
        await r.settle()
        rows = await r.history()
    assert [e.remaining for e in r.of(ContinuationOwed)] == [7]
    assert hows(r) == ["withdrawn"]
    assert outcomes(r) == []  # no resume answered the refused message
    assert starts(r) == [("send", 8)]
    assert [text_of(row) for row in rows if row.kind is RowKind.USER] == ["start", "u"]
    assert [e.type for e in r.of(StreamFailed)] == ["pre_stream_rejected"]


@pytest.mark.parametrize(("correlation", "how"), [(C, "consumed"), (C2, "withdrawn")])
async def test_r35_only_a_same_turn_report_continues_the_cut_turn(
    correlation: Correlation, how: str
) -> None:
    def report(_: ToolCallPart) -> None:
        r.session().enqueue("report", kind=EntryKind.REPORT, entry="rep", correlation=correlation)

    async with session_rig(
        {"M": [T_("bash"), X("report read")]}, tools=[HookTool("bash", before=report)]
    ) as r:
        r.session().enqueue("delegated task", kind=EntryKind.SYSTEM, correlation=C)
        await r.settle()
    assert marker_handle(r.of(ContinuationOwed)) == ["h1"]
    assert hows(r) == [how]
    assert starts(r) == [("queue", 8), ("queue", 8)]
    assert outcomes(r) == []


def marker_handle(owed: list[ContinuationOwed]) -> list[str | None]:
    return [e.handle for e in owed]


# ---------------------------------------------------------------- R53


async def test_r53_a_plain_clear_keeps_the_owed_continuation() -> None:
    wakes = Wakes(keep=True)
    async with session_rig(incident(), tools=[HookTool("task_await", before=wakes.queue)]) as r:
        wakes.attach(r)
        hook = Once(
            r,
            lambda e: isinstance(e, ContinuationOwed),
            lambda: r.session().clear_queue("user cleared the queue"),
        )
        r.session().send("start")
        await r.settle()
        hook.check()
    assert [(e.entry, e.reason) for e in r.of(EntryCanceled)] == [("w1", "user cleared the queue")]
    assert hows(r) == ["consumed"]
    assert outcomes(r) == ["started"]
    assert starts(r) == [("send", 8), ("resume", 6)]


async def test_r53_a_plain_clear_keeps_a_pending_soft_stop() -> None:
    wakes = Wakes(keep=True)
    async with session_rig({"M": [T_("bash"), provider_pair(), X("resumed")]}) as r:
        wakes.attach(r)
        r.on(lambda e: wakes.queue() if provider_call("web")(e) else None)
        hook = Once(
            r, provider_call("fetch"), lambda: r.session().clear_queue("user cleared the queue")
        )
        r.session().send("search")
        await r.settle()
        hook.check()
        kinds = await r.kinds()
    assert [e.reason.value for e in r.of(StreamAborted)] == ["queued-message"]
    assert [e.remaining for e in r.of(ContinuationOwed)] == [6]
    assert outcomes(r) == ["started"]
    assert starts(r) == [("send", 8), ("resume", 6)]
    assert kinds == [RowKind.USER, RowKind.PARTIAL, RowKind.ASSISTANT]


# ---------------------------------------------------------------- R56, R63, R65


async def test_r56_a_wake_dispatched_by_a_correlated_soft_stop_carries_the_correlation() -> None:
    wakes = Wakes(keep=True)
    async with session_rig({"M": [P("web"), X("wake answered")]}) as r:
        wakes.attach(r)
        r.on(wakes.queue_on_provider_call)
        r.session().enqueue("delegated task", kind=EntryKind.SYSTEM, correlation=C)
        await r.settle()
    assert [(s.cause.value, s.handle) for s in r.of(StreamStarted)] == [
        ("queue", "h1"),
        ("queue", "h1"),
    ]
    assert {q.correlation for q in requests(r, "s1/2")} == {C}
    assert hows(r) == ["consumed"]


async def test_r63_a_wake_withdrawn_after_the_soft_stop_was_requested_still_drains() -> None:
    wakes = Wakes(keep=True)
    async with session_rig({"M": [T_("bash"), provider_pair(), X("resumed")]}) as r:
        wakes.attach(r)
        r.on(lambda e: wakes.queue() if provider_call("web")(e) else None)
        hook = Once(
            r, provider_call("fetch"), lambda: r.session().withdraw("w1", "already consumed")
        )
        r.session().send("search")
        await r.settle()
        hook.check()
        kinds = await r.kinds()
    assert [e.reason.value for e in r.of(StreamAborted)] == ["queued-message"]
    assert [(e.entry, e.reason) for e in r.of(EntryCanceled)] == [("w1", "already consumed")]
    assert outcomes(r) == ["started"]
    assert starts(r) == [("send", 8), ("resume", 6)]
    assert kinds == [RowKind.USER, RowKind.PARTIAL, RowKind.ASSISTANT]


async def test_r65_a_soft_stop_with_nothing_left_owes_nothing() -> None:
    wakes = Wakes(keep=True)
    async with session_rig(
        {"M": [P("web"), X("wake answered")]}, config=EngineConfig(max_stream_steps=1)
    ) as r:
        wakes.attach(r)
        r.on(wakes.queue_on_provider_call)
        r.session().send("search")
        await r.settle()
    assert [(e.reason.value, e.remaining) for e in r.of(StreamAborted)] == [("queued-message", 0)]
    assert r.of(ContinuationOwed) == []
    assert starts(r) == [("send", 1), ("queue", 1)]
    assert outcomes(r) == []


# ---------------------------------------------------------------- R60 with ST-5


async def test_r60_st5_a_stop_while_the_cut_row_commits_leaves_no_owed_record() -> None:
    # The user stops the turn at the moment its cut row is being written. The continuation is
    # withdrawn in memory; the durable record must follow it, or a restart would resume the
    # turn the user stopped.
    store = HookStore()

    async def stop_during_the_cut_row(rows: Sequence[HistoryRow]) -> None:
        if any(row.cut is not None for row in rows):
            r.session().stop()

    def queue_wake(_: ToolCallPart) -> None:
        r.session().enqueue("done", kind=EntryKind.WAKE, entry="w")

    store.before_append = stop_during_the_cut_row
    async with session_rig(
        {"M": [T_("bash"), T_("task_await"), X("never said")]},
        tools=[HookTool("task_await", before=queue_wake)],
        store=store,
    ) as r:
        r.session().send("start and wait")
        await r.settle()
        assert [e.remaining for e in r.of(ContinuationOwed)] == [6]
        assert hows(r) == ["withdrawn"]
        assert outcomes(r) == []
        assert await owed(r.store) == []  # a restart resumes nothing
        (cut_row,) = [row for row in await r.history() if row.cut is not None]
        assert cut_row.cut is not None
        assert cut_row.cut.state is CutState.WITHDRAWN
