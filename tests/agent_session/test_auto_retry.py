"""Auto-retry of a failed stream (AS-32, AS-33, R36, R38, R44, TD-6, PS-8).

A retryable stream error is retried after a backoff on the engine's clock, under what the
failed attempt left, on the model it reached; anything that ends the turn meanwhile (a Stop, a
new user row, a refused admission) abandons it with a reason.
"""

from __future__ import annotations

import msgspec
import pytest

from agent_session import EngineConfig, PreStreamFailure, RetryAbandoned, RetryScheduled
from agent_session._retry import GiveUp, RetryBook, RetryPolicy, Schedule, decide
from persistence import (
    AbandonMarker,
    Boundary,
    HandleStatus,
    HistoryRow,
    MemoryStore,
    RowKind,
    SessionRecord,
    UsageError,
)
from stream_manager import (
    ErrorKind,
    ErrorType,
    Failed,
    FellBack,
    ModelFallbackProgress,
    ScriptStep,
    StreamEnded,
    StreamFailed,
    StreamStarted,
)
from tests.agent_session.support import T_, HookTool, Rig, X, session_rig
from tests.agent_session.test_as_send_rules import wake_tool

#: Values unlike every default: a 2.5 s first backoff, two retries, an 8-step turn.
CONFIG = EngineConfig(max_stream_steps=8, retry_backoff_s=2.5, retry_max_attempts=2)
RETRYABLE = ScriptStep(error="retryable")


Timed = list[tuple[object, float]]


def started(times: Timed) -> list[tuple[str, int, str, float]]:
    return [(e.cause, e.budget, e.model, t) for e, t in times if isinstance(e, StreamStarted)]


def timed(r: Rig) -> Timed:
    """Each event from now on, with the virtual time it was told at."""
    times: Timed = []
    r.on(lambda e: times.append((e, r.clock.now())))
    return times


async def test_as32_r36_a_retryable_failure_is_retried_after_the_backoff_under_its_remainder() -> (
    None
):
    async with session_rig(
        {"M": [T_("bash"), T_("bash"), RETRYABLE, X("built")]}, config=CONFIG
    ) as r:
        times = timed(r)
        r.session().send("build it")
        await r.settle()
        (failed,) = r.of(StreamFailed)
        assert failed.remaining == 6  # two steps spent of eight
        assert r.of(RetryScheduled) == [
            RetryScheduled(session="s1", stream="s1/1", attempt=1, budget=6)
        ]
        assert started(times) == [("send", 8, "M", 0.0), ("retry", 6, "M", 2.5)]
        kinds = await r.kinds()
        assert kinds.count(RowKind.USER) == 1  # the retry streams from history: no new row
        assert kinds[-1] is RowKind.ASSISTANT
        assert not r.of(RetryAbandoned)
        assert not r.session().owes()


async def test_as32_the_backoff_doubles_and_the_turn_is_abandoned_after_max_attempts() -> None:
    async with session_rig({"M": [RETRYABLE] * 3}, config=CONFIG) as r:
        times = timed(r)
        r.session().send("build it")
        await r.settle()
        assert [e.attempt for e in r.of(RetryScheduled)] == [1, 2]
        assert [t for _, _, _, t in started(times)] == [0.0, 2.5, 7.5]  # 2.5 s, then 5 s
        (abandoned,) = r.of(RetryAbandoned)
        assert "2 retries failed" in abandoned.why
        assert not r.session().owes()


async def test_as32_as24_a_successful_end_resets_the_attempts() -> None:
    script = [RETRYABLE, X("one"), RETRYABLE, X("two")]
    async with session_rig({"M": script}, config=CONFIG) as r:
        r.session().send("first")
        await r.settle()
        r.session().send("second")
        await r.settle()
        assert [e.attempt for e in r.of(RetryScheduled)] == [1, 1]


async def test_as32_ps8_a_non_retryable_failure_abandons_at_once_and_stores_its_marker() -> None:
    async with session_rig({"M": [ScriptStep(error="terminal"), X("never")]}, config=CONFIG) as r:
        r.session().send("deploy it")
        await r.settle()
        assert not r.of(RetryScheduled)
        (abandoned,) = r.of(RetryAbandoned)
        assert "provider_rejected" in abandoned.why
        assert [e.cause for e in r.of(StreamStarted)] == ["send"]
        loaded = await r.store.load("s1")
        assert loaded is not None
        assert loaded.abandon == AbandonMarker(reason="provider_rejected", user_row="s1:r1")


async def test_as32_an_engine_without_auto_retry_retries_nothing_and_says_nothing() -> None:
    off = EngineConfig(max_stream_steps=8, auto_retry=False)
    async with session_rig({"M": [RETRYABLE, X("never")]}, config=off) as r:
        r.session().send("build it")
        await r.settle()
        assert [e.cause for e in r.of(StreamStarted)] == ["send"]
        assert not r.of(RetryScheduled)
        assert not r.of(RetryAbandoned)


async def test_as32_a_stale_backoff_does_nothing_when_it_fires() -> None:
    # the first retry (due at 2.5 s) is superseded by a user message whose stream runs a 1 s
    # tool and fails too: its retry is due at 3.5 s; the first timer must not start it early
    script = [RETRYABLE, T_("bash"), RETRYABLE, X("fixed")]
    async with session_rig(
        {"M": script}, config=CONFIG, tools=[HookTool("bash", duration_s=1.0)]
    ) as r:
        times = timed(r)
        sent: list[str] = []

        def send_once(event: object) -> None:
            if isinstance(event, RetryScheduled) and not sent:
                sent.append("sent")
                r.session().send("try the other way")

        r.on(send_once)
        r.session().send("build it")
        await r.settle()
        assert [c for c, _, _, _ in started(times)] == ["send", "queue", "retry"]
        assert started(times)[-1][3] == 3.5
        (superseded,) = r.of(RetryAbandoned)
        assert superseded.why.startswith("retry of s1/1:")


async def test_as30_ar06_a_user_stop_cancels_the_pending_retry_and_marks_the_turn_aborted() -> None:
    async with session_rig({"M": [RETRYABLE, X("never")]}, config=CONFIG) as r:

        def stop_when_scheduled(event: object) -> None:
            if isinstance(event, RetryScheduled):
                r.session().stop()

        r.on(stop_when_scheduled)
        r.session().send("build it")
        await r.settle()
        assert [e.cause for e in r.of(StreamStarted)] == ["send"]
        (abandoned,) = r.of(RetryAbandoned)
        assert "user stop" in abandoned.why
        loaded = await r.store.load("s1")
        assert loaded is not None
        assert loaded.abandon == AbandonMarker(reason="aborted", user_row="s1:r1")


async def test_r38_a_retry_runs_on_the_model_it_reached_and_its_refusal_goes_down_the_chain() -> (
    None
):
    scripts = {
        "A": [ScriptStep(refuse=True)],
        "B": [RETRYABLE, ScriptStep(refuse=True)],
        "C": [X("answered by C")],
    }
    async with session_rig(
        scripts, config=CONFIG, fallbacks={"A": ["B", "C"]}, sessions=(("s1", "A"),)
    ) as r:
        r.session().send("do it")
        await r.settle()
        retry = [e for e in r.of(StreamStarted) if e.cause == "retry"]
        (failed,) = r.of(StreamFailed)
        assert [(e.model, e.budget) for e in retry] == [("B", failed.remaining)]
        assert failed.remaining == 7  # A's refused step was spent (R37)
        hops = [(e.from_, e.to, e.refused) for e in r.of(FellBack)]
        assert hops[-1] == ("B", "C", ("A", "B"))  # the original chain, not B's own
        assert [e.stream for e in r.of(StreamEnded)] == [retry[0].stream]


async def test_as32_a_retry_that_fails_before_its_stream_goes_through_the_failure_path_again() -> (
    None
):
    class FailingTwice:
        def __init__(self) -> None:
            self.checks = 0

        async def check(self, session: str, purpose: str) -> None:
            if purpose == "resume":
                self.checks += 1
                if self.checks <= 1:
                    raise PreStreamFailure("pricing gate down")

    gate = FailingTwice()
    async with session_rig({"M": [RETRYABLE, X("built")]}, config=CONFIG, gate=gate) as r:
        times = timed(r)
        r.session().send("build it")
        await r.settle()
        assert [e.attempt for e in r.of(RetryScheduled)] == [1, 2]
        assert started(times)[-1][0::3] == ("retry", 7.5)
        assert not r.of(RetryAbandoned)


async def test_r44_a_retry_asks_the_goal_again_and_a_paused_goal_abandons_it() -> None:
    async with session_rig({"G": [RETRYABLE, X("never")]}, config=CONFIG, sessions=()) as r:
        session = await r.engine.open_session("g1", model="G", goal="goal-7")
        r.engine.goals.set("goal-7", "active")  # type: ignore[attr-defined]

        def pause(event: object) -> None:
            if isinstance(event, RetryScheduled):
                r.engine.goals.set("goal-7", "paused")  # type: ignore[attr-defined]

        r.on(pause)
        session.send("work towards it")
        await r.settle()
        assert [e.cause for e in r.of(StreamStarted)] == ["send"]
        (abandoned,) = r.of(RetryAbandoned)
        assert "admission refused" in abandoned.why
        assert "goal-7" in abandoned.why


async def test_td6_a_delegated_turn_with_a_retry_pending_stays_running_and_settles_on_its_end() -> (
    None
):
    async with session_rig(
        {"M": [RETRYABLE, X("report")]}, config=CONFIG, sessions=(("lead", "M"), ("worker", "M"))
    ) as r:
        statuses: list[HandleStatus] = []

        def watch(event: object) -> None:
            if isinstance(event, RetryScheduled):
                statuses.append(r.engine.delegations.record("h-5").status)

        r.on(watch)
        delegation = r.engine.delegate("lead", "worker", "h-5", "investigate")
        await r.settle()
        assert statuses == [HandleStatus.ACTIVE]  # the retry owns the turn: nobody settled it
        assert r.engine.delegations.record("h-5").status is HandleStatus.COMPLETED
        retry = [e for e in r.of(StreamStarted) if e.cause == "retry"]
        assert [e.handle for e in retry] == ["h-5"]
        del delegation


# ---------------------------------------------------------------- the decision, unit by unit


def failure(
    *, remaining: int = 5, kind: ErrorKind = ErrorKind.RETRYABLE, wait: float | None = None
) -> Failed:
    return Failed(
        stream="s/3",
        type=ErrorType.PROVIDER_ERROR if kind is ErrorKind.RETRYABLE else ErrorType.QUOTA,
        kind=kind,
        message="boom",
        remaining=remaining,
        model="m",
        progress=ModelFallbackProgress(requested_model="m"),
        parts=(),
        retry_after=wait,
    )


def test_r36_a_failure_with_no_steps_left_is_never_retried() -> None:
    plan = decide(RetryPolicy(), RetryBook(), failure(remaining=0))
    assert isinstance(plan, GiveUp)
    assert "no steps left" in plan.why


def test_as32_a_provider_retry_after_longer_than_the_backoff_wins() -> None:
    policy = RetryPolicy(backoff_s=0.5)
    assert decide(policy, RetryBook(), failure(wait=7.25)) == Schedule(1, 7.25)
    assert decide(policy, RetryBook(), failure(wait=0.1)) == Schedule(1, 0.5)


def test_as32_the_backoff_is_capped() -> None:
    policy = RetryPolicy(backoff_s=1.5, cap_s=4.0, max_attempts=10)
    book = RetryBook()
    delays = [decide(policy, book, failure()) for _ in range(4)]
    assert delays == [Schedule(1, 1.5), Schedule(2, 3.0), Schedule(3, 4.0), Schedule(4, 4.0)]


def test_as32_a_session_that_turned_it_off_is_not_retried() -> None:
    book = RetryBook()
    book.off = True
    plan = decide(RetryPolicy(), book, failure())
    assert isinstance(plan, GiveUp)
    assert "turned off" in plan.why


@pytest.mark.parametrize("field", ["retry_backoff_s", "retry_max_attempts"])
def test_as32_a_negative_retry_setting_is_refused_naming_it(field: str) -> None:
    with pytest.raises(UsageError, match=field):
        msgspec.convert({field: -1}, EngineConfig)


# ---------------------------------------------------------------- the persisted preference


async def test_as32_ar06_a_session_turned_off_stays_off_after_a_restart() -> None:
    store = MemoryStore()
    async with session_rig({"M": []}, config=CONFIG, store=store) as r:
        await r.session().set_auto_retry(False)
        loaded = await store.load("s1")
        assert loaded is not None
        assert loaded.auto_retry is False
    async with session_rig(
        {"M": [RETRYABLE, X("never")]}, config=CONFIG, store=store, sessions=()
    ) as r:
        session = await r.engine.open_session("s1", model="M")
        # an agent's wake is no user send: it does not turn the preference back on
        session.enqueue("the build finished", kind="wake")
        await r.settle()
        assert [e.cause for e in r.of(StreamStarted)] == ["queue"]
        assert not r.of(RetryScheduled)
        (abandoned,) = r.of(RetryAbandoned)
        assert "turned off for this session" in abandoned.why


async def test_as32_a_user_send_turns_it_on_again_durably() -> None:
    store = MemoryStore()
    async with session_rig({"M": [RETRYABLE, X("built")]}, config=CONFIG, store=store) as r:
        await r.session().set_auto_retry(False)
        await r.session().send("build it")
        await r.settle()
        assert [e.cause for e in r.of(StreamStarted)] == ["send", "retry"]
        loaded = await store.load("s1")
        assert loaded is not None
        assert loaded.auto_retry is True


async def test_as32_turning_it_off_abandons_the_waiting_retry() -> None:
    async with session_rig({"M": [RETRYABLE, X("never")]}, config=CONFIG) as r:
        r.session().send("build it")
        await r.time.run_until(1.0)  # the retry is due at 2.5 s
        assert len(r.of(RetryScheduled)) == 1
        await r.session().set_auto_retry(False)
        await r.settle()
        assert [e.cause for e in r.of(StreamStarted)] == ["send"]
        (abandoned,) = r.of(RetryAbandoned)
        assert "turned off" in abandoned.why


async def test_as32_ps4_a_crashed_turn_of_a_session_turned_off_is_not_retried_at_startup() -> None:
    store = MemoryStore()
    user = HistoryRow(session="s1", seq=1, row_id="s1:r1", kind=RowKind.USER, body=b'{"text":"go"}')
    async with store:  # what a dead process left: the user's row, the preference off
        created = Boundary(create=SessionRecord(id="s1", model="M"), rows=(user,), auto_retry=False)
        await store.commit("s1", created, owner=store.owner)
    async with session_rig({"M": [X("never")]}, config=CONFIG, store=store, sessions=()) as r:
        await r.settle()
        assert not r.of(StreamStarted)
        (abandoned,) = r.of(RetryAbandoned)
        assert "turned off for this session" in abandoned.why


async def test_as24_a_retry_stream_that_ends_resets_the_attempts_within_one_turn() -> None:
    # send fails -> retry 1 runs and is cut by a wake (a normal end) -> the wake is withdrawn
    # and the turn resumes -> the resume fails: with no new user row in between, only the
    # retry stream's end can make this retry attempt 1 again
    script = [RETRYABLE, T_("task_await"), RETRYABLE, X("done")]
    async with session_rig({"M": script}, config=CONFIG, tools=[wake_tool(lambda: r)]) as r:

        def withdraw(event: object) -> None:
            if isinstance(event, StreamEnded) and len(r.of(StreamEnded)) == 1:
                r.session().withdraw("W", "consumed")

        r.on(withdraw)
        r.session().send("build it")
        await r.settle()
        assert [e.cause for e in r.of(StreamStarted)] == ["send", "retry", "resume", "retry"]
        assert [e.attempt for e in r.of(RetryScheduled)] == [1, 1]
