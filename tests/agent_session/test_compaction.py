"""Compaction mid-turn and its follow-up (AS-36, AS-37, R40, R44, R48, R51, PS-7).

A step whose input usage reaches ``compact_at`` of its model's window stops the stream at that
step's end (reason ``system``); one compaction request on the session's model writes a summary
row with a pending follow-up; the follow-up continues the turn under what the stopped stream
left, never a fresh ceiling, and a follow-up that cannot run is dropped with a reason.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from agent_session import (
    Compacted,
    EngineConfig,
    Recovered,
    RetryAbandoned,
)
from agent_session._rows import decode_body
from message_queue import Correlation
from persistence import (
    Boundary,
    Committed,
    HandleStatus,
    HistoryRow,
    MemoryStore,
    RowKind,
    SessionRecord,
    Store,
    StoreError,
)
from stream_manager import (
    ModelRequest,
    Part,
    Role,
    ScriptedModel,
    ScriptStep,
    ScriptToolCall,
    StreamAborted,
    StreamStarted,
    Usage,
)
from tests.agent_session.support import Rig, X, active_handles, session_rig

#: An 8-step turn on a 10,000-token window compacted at 70 %: a step of 7,000 tokens crosses.
CONFIG = EngineConfig(max_stream_steps=8, context_window=10_000, compact_at=0.7)


def T(tokens: int) -> ScriptStep:
    """A ``bash`` step that reports ``tokens`` of input."""
    return ScriptStep(
        tool_calls=(ScriptToolCall(tool="bash"),), usage=Usage(input_tokens=tokens, output_tokens=9)
    )


SUMMARY = X("The user wants the build fixed; two commands ran, one is left.")
#: Three tool steps, the third crossing the threshold; the summary; the follow-up's two steps.
SCRIPT = [T(2_000), T(4_000), T(7_000), SUMMARY, T(900), X("fixed")]


async def test_as36_r40_a_crossing_step_stops_the_stream_the_follow_up_runs_under_the_rest() -> (
    None
):
    async with session_rig({"M": SCRIPT}, config=CONFIG) as r:
        r.session().send("fix the build")
        await r.settle()
        (aborted,) = r.of(StreamAborted)
        assert (aborted.reason, aborted.remaining) == ("system", 5)
        assert r.of(Compacted) == [
            Compacted(session="s1", stream="s1/1", tokens=7_000, outcome="summarized")
        ]
        starts = [(e.cause, e.budget) for e in r.of(StreamStarted)]
        assert starts == [("send", 8), ("follow-up", 5)]  # the remainder, not a fresh 8
        rows = await r.history()
        assert [row.kind for row in rows] == [
            RowKind.USER,
            RowKind.PARTIAL,
            RowKind.SUMMARY,
            RowKind.USER,
            RowKind.ASSISTANT,
        ]
        summary, follow = decode_body(rows[2]), decode_body(rows[3])
        assert summary.follow_up is None  # cleared in the follow-up row's commit (B8)
        assert summary.text.startswith("The user wants the build fixed")
        assert (follow.text, follow.entry_kind) == ("Continue", "follow-up")
        assert follow.follow_up is not None
        assert follow.follow_up["step_budget"] == 5
        assert not r.session().owes()


async def test_as36_the_request_asks_the_history_and_the_follow_up_reads_from_the_summary() -> None:
    async with session_rig({"M": SCRIPT}, config=CONFIG) as r:
        r.session().send("fix the build")
        await r.settle()
        requests = r.models["M"].requests
        compaction = requests[3]
        assert compaction.stream == "s1/1:compaction"
        assert compaction.messages[0].text == "fix the build"  # the whole history
        assert "Summarise the conversation" in compaction.messages[-1].text
        follow_up = requests[4]
        assert [m.role for m in follow_up.messages] == [Role.SYSTEM, Role.USER]
        assert follow_up.messages[0].text.startswith("Summary of the conversation so far:")
        assert follow_up.messages[1].text == "Continue"


async def test_as36_a_models_own_window_and_compact_at_zero() -> None:
    own = EngineConfig(max_stream_steps=8, context_window=10_000, context_windows={"M": 100_000})
    async with session_rig(
        {"M": [T(9_500), X("no compaction on a larger window")]}, config=own
    ) as r:
        r.session().send("go")
        await r.settle()
        assert not r.of(Compacted)
    never = EngineConfig(max_stream_steps=8, context_window=10_000, compact_at=0.0)
    async with session_rig({"M": [T(9_999), X("never compacted")]}, config=never) as r:
        r.session().send("go")
        await r.settle()
        assert not r.of(Compacted)


async def test_r48_a_turn_stopped_with_no_steps_left_gets_a_summary_and_no_follow_up() -> None:
    three = EngineConfig(max_stream_steps=3, context_window=10_000, compact_at=0.7)
    async with session_rig({"M": [T(100), T(200), T(7_500), SUMMARY]}, config=three) as r:
        r.session().send("go")
        await r.settle()
        assert [e.cause for e in r.of(StreamStarted)] == ["send"]
        (dropped,) = r.of(RetryAbandoned)
        assert "no steps left" in dropped.why
        rows = await r.history()
        assert rows[-1].kind is RowKind.SUMMARY
        assert decode_body(rows[-1]).follow_up is None


async def test_r44_r48_a_follow_up_whose_goal_was_paused_is_dropped_settled_first() -> None:
    async with session_rig({"G": SCRIPT}, config=CONFIG, sessions=()) as r:
        session = await r.engine.open_session("g1", model="G", goal="goal-3")

        def pause(event: object) -> None:
            if isinstance(event, Compacted):
                r.engine.goals.set("goal-3", "paused")  # type: ignore[attr-defined]

        r.on(pause)
        session.send("work on the goal")
        await r.settle()
        assert [e.cause for e in r.of(StreamStarted)] == ["send"]
        (dropped,) = r.of(RetryAbandoned)
        assert dropped.why.startswith("follow-up of g1/1:")
        assert "admission refused" in dropped.why
        rows = await r.history("g1")
        assert rows[-1].kind is RowKind.SUMMARY  # no follow-up row (R51)
        assert decode_body(rows[-1]).follow_up is None  # cleared: nothing left pending


async def test_r51_a_follow_up_refused_at_its_launch_boundary_leaves_no_row() -> None:
    async with session_rig({"G": SCRIPT}, config=CONFIG, sessions=()) as r:
        session = await r.engine.open_session("g1", model="G", goal="goal-3")

        def pause(event: object) -> None:  # after the row is durable, before the stream
            if getattr(event, "what", None) == "follow-up":
                r.engine.goals.set("goal-3", "paused")  # type: ignore[attr-defined]

        r.on(pause)
        session.send("work on the goal")
        await r.settle()
        assert [e.cause for e in r.of(StreamStarted)] == ["send"]
        rows = await r.history("g1")
        assert [row.kind for row in rows][-1] is RowKind.SUMMARY  # the follow-up row went
        assert decode_body(rows[-1]).follow_up is None


async def test_as36_a_user_stop_before_the_compaction_began_calls_it_off() -> None:
    async with session_rig({"M": SCRIPT}, config=CONFIG) as r:

        def stop(event: object) -> None:
            if isinstance(event, StreamAborted):
                r.session().stop()

        r.on(stop)
        r.session().send("fix the build")
        await r.settle()
        assert [e.cause for e in r.of(StreamStarted)] == ["send"]
        assert not r.of(Compacted)
        assert (await r.history())[-1].kind is RowKind.PARTIAL


class StopsDuringCompaction:
    """A model whose compaction request sees a user Stop land while it runs."""

    def __init__(self, inner: ScriptedModel, stop: Callable[[], object]) -> None:
        self.inner, self.stop = inner, stop

    @property
    def id(self) -> str:
        return self.inner.id

    def stream_step(self, request: ModelRequest) -> AsyncIterator[Part]:
        if request.stream.endswith(":compaction"):
            self.stop()
        return self.inner.stream_step(request)


async def test_as36_a_user_stop_during_the_compaction_writes_the_summary_and_no_follow_up() -> None:
    rig: list[Rig] = []
    model = StopsDuringCompaction(ScriptedModel("M", SCRIPT), lambda: rig[0].session().stop())
    async with session_rig({}, models=[model], config=CONFIG) as r:
        rig.append(r)
        r.session().send("fix the build")
        await r.settle()
        assert [e.cause for e in r.of(StreamStarted)] == ["send"]
        rows = await r.history()
        assert rows[-1].kind is RowKind.SUMMARY
        assert decode_body(rows[-1]).follow_up is None
        (dropped,) = r.of(RetryAbandoned)
        assert "stopped by the user" in dropped.why


# ---------------------------------------------------------------- startup (PS-7)


def _row(seq: int, kind: RowKind, body: bytes, stream: str | None = None) -> HistoryRow:
    return HistoryRow(
        session="s1", seq=seq, row_id=f"s1:r{seq}", kind=kind, body=body, stream=stream
    )


def _summary(follow_up: bytes) -> bytes:
    return b'{"text":"what happened so far","follow_up":' + follow_up + b"}"


GOOD = b'{"step_budget":4,"model":"M","requested_model":"M"}'


async def _left_behind(store: Store, *rows: HistoryRow) -> None:
    async with store:
        create = Boundary(create=SessionRecord(id="s1", model="M"), rows=rows)
        await store.commit("s1", create, owner=store.owner)


async def test_ps7_a_crash_between_the_summary_and_its_follow_up_runs_it_at_startup() -> None:
    store = MemoryStore()
    await _left_behind(
        store,
        _row(1, RowKind.USER, b'{"text":"fix it"}'),
        _row(2, RowKind.PARTIAL, b'{"text":"working"}', "s1/1"),
        _row(3, RowKind.SUMMARY, _summary(GOOD), "s1/1"),
    )
    async with session_rig({"M": [X("fixed")]}, config=CONFIG, store=store, sessions=()) as r:
        await r.settle()
        (recovered,) = r.of(Recovered)
        assert (recovered.action, recovered.cut) == ("follow-up", "s1/1")
        assert [(e.cause, e.budget) for e in r.of(StreamStarted)] == [("follow-up", 4)]
        rows = await r.history()
        assert decode_body(rows[2]).follow_up is None
        assert rows[3].kind is RowKind.USER


@pytest.mark.parametrize("budget", [b'"5"', b"-2", b"1.5", b"{}", b"0"])
async def test_ps7_r48_a_malformed_or_spent_persisted_budget_drops_the_follow_up(
    budget: bytes,
) -> None:
    store = MemoryStore()
    follow = b'{"step_budget":' + budget + b',"model":"M","requested_model":"M"}'
    await _left_behind(
        store,
        _row(1, RowKind.USER, b'{"text":"fix it"}'),
        _row(2, RowKind.SUMMARY, _summary(follow), "s1/1"),
    )
    async with session_rig({"M": [X("never")]}, config=CONFIG, store=store, sessions=()) as r:
        await r.settle()
        assert not r.of(StreamStarted)  # never under a fresh ceiling
        (dropped,) = r.of(RetryAbandoned)
        assert "dropped" in dropped.why
        assert [e.action for e in r.of(Recovered)] == ["abandon"]
        rows = await r.history()
        assert decode_body(rows[-1]).follow_up is None  # cleared, the summary kept


async def test_ps7_a_crash_after_the_follow_up_row_retries_under_its_own_budget() -> None:
    store = MemoryStore()
    follow_row = b'{"text":"Continue","entry_kind":"follow-up","follow_up":' + GOOD + b"}"
    await _left_behind(
        store,
        _row(1, RowKind.USER, b'{"text":"fix it"}'),
        _row(2, RowKind.SUMMARY, b'{"text":"what happened so far"}', "s1/1"),
        _row(3, RowKind.USER, follow_row),
    )
    async with session_rig({"M": [X("fixed")]}, config=CONFIG, store=store, sessions=()) as r:
        await r.settle()
        assert [(e.cause, e.budget) for e in r.of(StreamStarted)] == [("recovery", 4)]


# ---------------------------------------------------------------- context-limit retries


CONTEXT = ScriptStep(error="context_exceeded")


async def test_as34_as35_a_context_limit_failure_is_compacted_and_continued_under_the_rest() -> (
    None
):
    script = [T(100), CONTEXT, SUMMARY, X("continued")]
    async with session_rig({"M": script}, config=CONFIG) as r:
        r.session().send("read the log")
        await r.settle()
        starts = [(e.cause, e.budget) for e in r.of(StreamStarted)]
        assert starts == [("send", 8), ("follow-up", 7)]  # the failed attempt's remainder
        compaction = r.models["M"].requests[2]
        assert [m.role for m in compaction.messages[:3]] == [Role.USER, Role.ASSISTANT, Role.TOOL]
        kinds = [row.kind for row in await r.history()]
        assert kinds[:3] == [RowKind.USER, RowKind.PARTIAL, RowKind.SUMMARY]  # one commit
        assert not r.of(RetryAbandoned)


async def test_as34_one_context_limit_retry_per_user_row() -> None:
    script = [CONTEXT, SUMMARY, CONTEXT, CONTEXT, SUMMARY, X("the second turn continued")]
    async with session_rig({"M": script}, config=CONFIG) as r:
        r.session().send("first")
        await r.settle()
        (final,) = r.of(RetryAbandoned)
        assert "one context-limit retry already ran" in final.why
        r.session().send("second")  # a new user row: its own retry
        await r.settle()
        causes = [e.cause for e in r.of(StreamStarted)]
        assert causes == ["send", "follow-up", "send", "follow-up"]


async def test_as34_a_compaction_request_over_the_limit_is_retried_once_truncated() -> None:
    script = [T(100), CONTEXT, CONTEXT, SUMMARY, X("continued")]
    async with session_rig({"M": script}, config=CONFIG) as r:
        r.session().send("read the log")
        await r.settle()
        streams = [request.stream for request in r.models["M"].requests]
        assert streams[2:4] == ["s1/1:compaction", "s1/1:compaction:truncated"]
        assert len(r.models["M"].requests[3].messages) < len(r.models["M"].requests[2].messages)
        assert [e.outcome for e in r.of(Compacted)] == ["summarized"]


async def test_as36_a_compaction_that_fails_ends_the_turn_with_a_reason() -> None:
    script = [T(100), T(200), T(7_100), ScriptStep(error="terminal")]
    async with session_rig({"M": script}, config=CONFIG) as r:
        r.session().send("go")
        await r.settle()
        assert [e.outcome for e in r.of(Compacted)] == ["failed"]
        (abandoned,) = r.of(RetryAbandoned)
        assert abandoned.why.startswith("compaction of s1/1 failed")
        assert r.session().phase.value == "idle"


async def test_ps7_r48_a_dropped_correlated_follow_up_settles_its_owner_before_clearing() -> None:
    store = MemoryStore()
    handle = Correlation(handle_id="h-7", owner_session="lead", turn_id="lead:r1")
    await active_handles(store, (handle, "s1"))
    follow = (
        b'{"step_budget":-2,"model":"M","requested_model":"M",'
        b'"handle_id":"h-7","owner_session":"lead","turn_id":"lead:r1"}'
    )
    await _left_behind(
        store,
        _row(1, RowKind.USER, b'{"text":"fix it"}'),
        _row(2, RowKind.SUMMARY, _summary(follow), "s1/1"),
    )
    async with session_rig({"M": [X("never")]}, config=CONFIG, store=store, sessions=()) as r:
        await r.settle()
        assert not r.of(StreamStarted)
        record = r.engine.delegations.record("h-7")
        assert record.status is HandleStatus.INTERRUPTED
        assert "follow-up was dropped" in (record.reason or "")
        assert decode_body((await r.history())[-1]).follow_up is None


# ---------------------------------------------------------------- on send (AS-36, R49)


async def test_as36_a_last_step_over_the_threshold_ends_its_turn_and_the_next_compacts_first() -> (
    None
):
    script = [step_text(7_500, "first answer"), SUMMARY, step_text(900, "second answer")]
    async with session_rig({"M": script}, config=CONFIG) as r:
        r.session().send("first")
        await r.settle()
        assert not r.of(StreamAborted)  # a turn's last step is left to end
        assert not r.of(Compacted)
        r.session().send("second")
        await r.settle()
        assert [c.stream for c in r.of(Compacted)] == ["s1/2"]
        second = r.models["M"].requests[-1]
        assert [m.role for m in second.messages] == [Role.SYSTEM, Role.USER]
        assert second.messages[1].text == "second"  # its own row, after the summary
        kinds = [row.kind for row in await r.history()]
        assert kinds == [
            RowKind.USER,
            RowKind.ASSISTANT,
            RowKind.USER,
            RowKind.SUMMARY,
            RowKind.ASSISTANT,
        ]


async def test_r49_an_on_send_compacted_delegated_turn_keeps_its_handle_through_a_retry() -> None:
    script = [
        step_text(7_500, "worker's first turn"),
        SUMMARY,
        ScriptStep(error="retryable"),
        X("the delegated work is done"),
    ]
    retry = EngineConfig(
        max_stream_steps=8, context_window=10_000, compact_at=0.7, retry_backoff_s=0.25
    )
    async with session_rig(
        {"M": script}, config=retry, sessions=(("lead", "M"), ("worker", "M"))
    ) as r:
        r.engine.session("worker").send("warm up")
        await r.settle()
        r.engine.delegate("lead", "worker", "h-3", "investigate the flaky test")
        await r.settle()
        worker = [e for e in r.of(StreamStarted) if e.session == "worker"]
        assert [(e.cause, e.handle) for e in worker] == [
            ("send", None),
            ("send", "h-3"),
            ("retry", "h-3"),  # the retry carries the delegated turn's correlation
        ]
        assert [c.session for c in r.of(Compacted)] == ["worker"]
        assert r.engine.delegations.record("h-3").status is HandleStatus.COMPLETED


def step_text(tokens: int, text: str) -> ScriptStep:
    """A text-only (last) step that reports ``tokens`` of input."""
    return ScriptStep(text=text, usage=Usage(input_tokens=tokens, output_tokens=5))


async def test_ps4_a_crash_after_an_on_send_summary_retries_that_turn_from_the_summary() -> None:
    store = MemoryStore()
    await _left_behind(
        store,
        _row(1, RowKind.USER, b'{"text":"first"}'),
        _row(2, RowKind.ASSISTANT, b'{"text":"first answer","finish":"stop"}', "s1/1"),
        _row(3, RowKind.USER, b'{"text":"second"}'),
        _row(4, RowKind.SUMMARY, b'{"text":"what happened so far","through":2}', "s1/2"),
    )
    async with session_rig(
        {"M": [X("second answer")]}, config=CONFIG, store=store, sessions=()
    ) as r:
        await r.settle()
        assert [e.action for e in r.of(Recovered)] == ["retry"]
        (request,) = r.models["M"].requests
        assert [(m.role, m.text.split("\n")[-1]) for m in request.messages] == [
            (Role.SYSTEM, "what happened so far"),
            (Role.USER, "second"),
        ]


class _NoSummaryStore(MemoryStore):
    """Refuses every commit that writes a summary row (the on-send compaction's)."""

    async def commit(self, session: str, boundary: Boundary, *, owner: str | None) -> Committed:
        if any(row.kind is RowKind.SUMMARY for row in boundary.rows):
            raise StoreError("the summary write failed (injected)")
        return await super().commit(session, boundary, owner=owner)


async def test_as36_an_on_send_summary_that_is_not_written_is_told_failed_and_the_turn_runs() -> (
    None
):
    script = [step_text(7_500, "first answer"), SUMMARY, step_text(900, "second answer")]
    async with session_rig({"M": script}, config=CONFIG, store=_NoSummaryStore()) as r:
        r.session().send("first")
        await r.settle()
        r.session().send("second")
        await r.settle()
        (failed,) = r.of(Compacted)
        assert (failed.stream, failed.tokens, failed.outcome) == ("s1/2", 7_500, "failed")
        second = r.models["M"].requests[-1]
        assert [m.text for m in second.messages if m.role is Role.USER] == ["first", "second"]
        kinds = [row.kind for row in await r.history()]
        assert kinds == [RowKind.USER, RowKind.ASSISTANT, RowKind.USER, RowKind.ASSISTANT]
