"""Startup retry (PS-2 to PS-5, R47, R57, R58, R61, R65) and abandon markers (PS-8).

Each test writes what a dead process left (rows, an envelope, receipts, an abandon marker) and
opens an engine on it: the history's unanswered tail is retried under what the turn had left,
never a fresh ceiling when the remainder is known, or left with a reason.
"""

from __future__ import annotations

import sqlite3
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import msgspec
import pytest

from agent_session import (
    EngineConfig,
    Phase,
    PhaseChanged,
    Recovered,
    RetryAbandoned,
)
from message_queue import Correlation
from persistence import (
    AbandonMarker,
    Boundary,
    CutRecord,
    CutState,
    HistoryRow,
    MemoryStore,
    OperationRecord,
    OpState,
    RowKind,
    SessionRecord,
    SqliteStore,
    Store,
    TurnEnvelope,
)
from persistence.postgres import PostgresStore
from persistence.records import Capability, ToolKind
from stream_manager import (
    FellBack,
    OpBlocked,
    Persisted,
    ScriptStep,
    ScriptToolCall,
    StreamStarted,
)
from stream_manager._op_states import target_digest
from tests.agent_session.support import T_, HookTool, Rig, X, active_handles, session_rig
from tests.store_kit import commit

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

HANDLE = Correlation(handle_id="h4", owner_session="lead", turn_id="lead:r1")


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "memory":
        return MemoryStore()
    if request.param == "postgres":
        return PostgresStore(request.getfixturevalue("pg_url"))
    return SqliteStore(tmp_path / "tk.db")


def row(
    seq: int,
    kind: RowKind,
    *,
    stream: str | None = None,
    cut: CutRecord | None = None,
    body: bytes | None = None,
) -> HistoryRow:
    text = b'{"text":"[CONTINUE]"}' if kind is RowKind.SENTINEL else b'{"text":"m%d"}' % seq
    return HistoryRow(
        session="s1",
        seq=seq,
        row_id=f"s1:r{seq}",
        kind=kind,
        body=body or text,
        stream=stream,
        cut=cut,
    )


def receipt(op_id: str, state: OpState = OpState.COMPLETED) -> OperationRecord:
    stream = op_id.rsplit("/", 2)[0]
    return OperationRecord(
        op_id=op_id,
        session="s1",
        stream=stream,
        call_id=f"c-{op_id}",
        capability=Capability(ToolKind.CLIENT, "bash"),
        target="t",
        started_at=1.0,
        state=state,
        ended_at=2.0,
    )


async def left_behind(
    store: Store,
    *rows: HistoryRow,
    envelope: TurnEnvelope | None = None,
    receipts: tuple[OperationRecord, ...] = (),
    abandon: AbandonMarker | None = None,
    model: str = "M",
) -> None:
    """What a dead process left: the session, its rows, its last envelope, its receipts."""
    async with store:
        await commit(store, "s1", create=SessionRecord(id="s1", model=model), rows=rows)
        if envelope is not None:
            await commit(store, "s1", envelope=envelope)
        for record in receipts:
            await commit(store, "s1", operations=(record,))
        if abandon is not None:
            await store.commit("s1", Boundary(abandon=abandon), owner=store.owner)


#: The arguments of the call a crash cut off after it completed (its result lost with it).
DEPLOY = {"cmd": "make deploy"}


#: The model asks for the same ``bash`` call again.
AGAIN = ScriptStep(tool_calls=(ScriptToolCall(tool="bash", args=DEPLOY),))


@asynccontextmanager
async def retried(store: Store, *steps: ScriptStep) -> AsyncIterator[tuple[Rig, HookTool]]:
    """An engine started on what a dead process left, run until quiescent, and its ``bash``."""
    bash = HookTool("bash")
    async with session_rig(
        {"M": list(steps)}, store=store, sessions=(), config=CONFIG, tools=[bash]
    ) as r:
        await r.settle()
        yield r, bash


def deployed(op_id: str) -> OperationRecord:
    """``op_id`` completed ``bash`` with ``DEPLOY``: its receipt names the same target."""
    target = target_digest(Capability(ToolKind.CLIENT, "bash"), DEPLOY, "turnkeeper")
    return msgspec.structs.replace(receipt(op_id), target=target)


def envelope(stream: str, budget: int, model: str = "M", cause: str = "send") -> TurnEnvelope:
    return TurnEnvelope(session="s1", stream=stream, model=model, budget=budget, cause=cause)


CONFIG = EngineConfig(max_stream_steps=9)


# ---------------------------------------------------------------- PS-4: what is retried


async def test_ps4_a_turn_cut_off_mid_stream_is_retried_under_what_it_had_left(
    store: Store,
) -> None:
    # the stream s1/1 started with 7 and its receipts show two finished steps: 5 left
    await left_behind(
        store,
        row(1, RowKind.USER),
        envelope=envelope("s1/1", 7),
        receipts=(receipt("s1/1/1/0"), receipt("s1/1/2/0"), receipt("s1/1/2/1")),
    )
    async with session_rig({"M": [X("answered")]}, store=store, sessions=(), config=CONFIG) as r:
        await r.settle()
        assert await r.kinds() == [RowKind.USER, RowKind.ASSISTANT]  # answered, no sentinel
    [recovered] = r.of(Recovered)
    assert (recovered.action, recovered.cut) == ("retry", "s1/1")
    [start] = r.of(StreamStarted)
    assert (start.stream, start.cause, start.budget) == ("s1/2", "recovery", 5)
    async with session_rig({"M": []}, store=store, sessions=(), config=CONFIG) as again:
        await again.settle()
    assert again.of(Recovered) == []  # answered: nothing to retry any more


async def test_ps4_a_turn_whose_stream_never_started_gets_the_whole_ceiling(
    store: Store,
) -> None:
    # the user row is durable and an older turn's envelope ended with its row: nothing spent
    await left_behind(
        store,
        row(1, RowKind.USER),
        row(2, RowKind.ASSISTANT, stream="s1/1"),
        row(3, RowKind.USER),
        envelope=envelope("s1/1", 9),
    )
    async with session_rig({"M": [X("answered")]}, store=store, sessions=(), config=CONFIG) as r:
        await r.settle()
    [start] = r.of(StreamStarted)
    assert (start.stream, start.cause, start.budget) == ("s1/2", "recovery", 9)


async def test_ps4_an_answered_history_is_not_retried(store: Store) -> None:
    await left_behind(
        store,
        row(1, RowKind.USER),
        row(2, RowKind.ASSISTANT, stream="s1/1"),
        row(3, RowKind.SYSTEM),
        envelope=envelope("s1/1", 9),
    )
    async with session_rig({"M": []}, store=store, sessions=(), config=CONFIG) as r:
        await r.settle()
    assert r.of(Recovered) == []
    assert r.of(StreamStarted) == []


async def test_ps4_startup_retry_can_be_turned_off(store: Store) -> None:
    await left_behind(store, row(1, RowKind.USER), envelope=envelope("s1/1", 7))
    config = EngineConfig(max_stream_steps=9, auto_retry=False)
    async with session_rig({"M": []}, store=store, sessions=(), config=config) as r:
        await r.settle()
    assert r.of(StreamStarted) == []


# ---------------------------------------------------------------- PS-5, R57, R58: a resume's tail


async def test_ps5_r57_r58_an_interrupted_resume_keeps_its_fallback_progress_and_correlation(
    store: Store,
) -> None:
    # a resume on fallback F (M refused; chain F, G) of a delegated turn started, consumed
    # its cut record and died: the retry runs on F under the resumed stream's budget, asks the
    # handle again (R57) and, when F refuses, goes on to G, never back to M (R58)
    record = CutRecord(
        remaining=4,
        model="F",
        requested_model="M",
        refused_models=("M",),
        chain=("F", "G"),
        handle_id=HANDLE.handle_id,
        owner_session=HANDLE.owner_session,
        turn_id=HANDLE.turn_id,
        state=CutState.CONSUMED,
    )
    await left_behind(
        store,
        row(1, RowKind.USER),
        row(2, RowKind.ASSISTANT, stream="s1/1", cut=record),
        row(3, RowKind.SENTINEL),
        envelope=envelope("s1/2", 4, model="F", cause="resume"),
    )
    await active_handles(store, (HANDLE, "s1"))
    scripts = {"M": [], "F": [ScriptStep(refuse=True)], "G": [X("answered on G")]}
    async with session_rig(
        scripts, store=store, sessions=(), config=CONFIG, fallbacks={"M": ["F", "G"]}
    ) as r:
        await r.settle()
    [start] = r.of(StreamStarted)
    assert (start.stream, start.cause, start.model, start.budget) == ("s1/3", "recovery", "F", 4)
    assert start.handle == HANDLE.handle_id
    [hop] = r.of(FellBack)
    assert (hop.from_, hop.to, hop.refused) == ("F", "G", ("M", "F"))


async def test_r57_a_retry_of_a_turn_whose_handle_is_settled_is_refused_not_run(
    store: Store,
) -> None:
    record = CutRecord(
        remaining=4,
        model="M",
        requested_model="M",
        handle_id=HANDLE.handle_id,
        owner_session=HANDLE.owner_session,
        turn_id=HANDLE.turn_id,
        state=CutState.CONSUMED,
    )
    await left_behind(
        store,
        row(1, RowKind.USER),
        row(2, RowKind.ASSISTANT, stream="s1/1", cut=record),
        row(3, RowKind.SENTINEL),
        envelope=envelope("s1/2", 4, cause="resume"),
    )
    # no active handle: the owner settled the turn before the crash
    async with session_rig({"M": []}, store=store, sessions=(), config=CONFIG) as r:
        await r.settle()
    assert r.of(StreamStarted) == []
    assert [e.action for e in r.of(Recovered)] == ["retry"]


# ---------------------------------------------------------------- R65, PS-8: not retried


async def test_r65_a_turn_with_no_steps_left_is_abandoned_with_a_marker_once(
    store: Store,
) -> None:
    await left_behind(
        store,
        row(1, RowKind.USER),
        envelope=envelope("s1/1", 2),
        receipts=(receipt("s1/1/1/0"), receipt("s1/1/2/0")),
    )
    async with session_rig({"M": []}, store=store, sessions=(), config=CONFIG) as r:
        await r.settle()
    [abandoned] = r.of(RetryAbandoned)
    assert "no steps left" in abandoned.why
    assert [e.action for e in r.of(Recovered)] == ["abandon"]
    assert [p.what for p in r.of(Persisted)] == ["abandon"]  # durable, then told
    assert r.of(StreamStarted) == []
    async with session_rig({"M": []}, store=store, sessions=(), config=CONFIG) as again:
        await again.settle()
    assert again.of(Recovered) == []  # the marker names the turn: left quietly


async def test_ps8_a_stored_abandon_marker_naming_the_tail_stops_the_retry(store: Store) -> None:
    await left_behind(
        store,
        row(1, RowKind.USER),
        envelope=envelope("s1/1", 7),
        abandon=AbandonMarker(reason="aborted", user_row="s1:r1"),
    )
    async with session_rig({"M": []}, store=store, sessions=(), config=CONFIG) as r:
        await r.settle()
    assert r.of(Recovered) == []
    assert r.of(StreamStarted) == []


async def test_ps8_a_marker_of_an_older_turn_does_not_stop_the_retry(store: Store) -> None:
    await left_behind(
        store,
        row(1, RowKind.USER),
        row(2, RowKind.PARTIAL, stream="s1/1"),
        row(3, RowKind.USER),
        envelope=envelope("s1/1", 7),
        abandon=AbandonMarker(reason="aborted", user_row="s1:r1"),
    )
    async with session_rig({"M": [X("answered")]}, store=store, sessions=(), config=CONFIG) as r:
        await r.settle()
    [start] = r.of(StreamStarted)
    assert (start.cause, start.budget) == ("recovery", 9)


# ---------------------------------------------------------------- PS-8: what writes a marker


async def marker_of(store: Store) -> AbandonMarker | None:
    if store.owner is not None:
        loaded = await store.load("s1")
    else:
        async with store:
            loaded = await store.load("s1")
    assert loaded is not None
    return loaded.abandon


async def test_ps8_a_terminal_failure_stores_the_marker_and_the_next_start_leaves_it() -> None:
    store = MemoryStore()
    async with session_rig({"M": [ScriptStep(error="terminal")]}, store=store) as r:
        r.session().send("deploy it")
        await r.settle()
    assert await marker_of(store) == AbandonMarker(reason="provider_rejected", user_row="s1:r1")
    async with session_rig({"M": []}, store=store, sessions=()) as again:
        await again.settle()
    assert again.of(StreamStarted) == []


async def test_ps8_a_retryable_failure_stores_no_marker_and_the_next_start_retries() -> None:
    store = MemoryStore()
    no_live_retry = EngineConfig(max_stream_steps=8, retry_max_attempts=0)  # ended before it
    script = [ScriptStep(error="retryable")]
    async with session_rig({"M": script}, store=store, config=no_live_retry) as r:
        r.session().send("deploy it")
        await r.settle()
    assert await marker_of(store) is None
    async with session_rig({"M": [X("deployed")]}, store=store, sessions=()) as again:
        await again.settle()
    [start] = again.of(StreamStarted)
    assert start.cause == "recovery"


async def test_ps8_a_user_stop_stores_aborted_and_a_success_clears_it() -> None:
    store = MemoryStore()
    async with session_rig({"M": [T_("bash"), X("never"), X("fine")]}, store=store) as r:
        s = r.session()

        def stop_at_tool(event: object) -> None:
            if type(event).__name__ == "ToolCallStarted":
                s.stop()

        r.on(stop_at_tool)
        s.send("build it")
        await r.settle()
        assert await marker_of(r.store) == AbandonMarker(reason="aborted", user_row="s1:r1")
        r.hooks.clear()
        await s.send("now lint it")
        await r.settle()
        assert await marker_of(r.store) is None  # the new row cleared it (AS-9)


# ---------------------------------------------------------------- R61: malformed remainders


@pytest.mark.parametrize(
    "value", ['"5"', "-2", "1.5", "{}"], ids=["text", "negative", "real", "map"]
)
async def test_r61_a_malformed_steps_remaining_abandons_the_retry_and_is_left_as_is(
    tmp_path: Path, value: str
) -> None:
    # a queued-cut partial (B6) carries the remainder; a damaged one is never read as absent
    path = tmp_path / "tk.db"
    await left_behind(
        SqliteStore(path),
        row(1, RowKind.USER),
        row(
            2,
            RowKind.PARTIAL,
            stream="s1/1",
            cut=CutRecord(remaining=3, model="M", requested_model="M"),
        ),
        envelope=envelope("s1/1", 7),
    )
    damaged = (
        b'{"remaining": ' + value.encode() + b', "model": "M", "requested_model": "M", '
        b'"state": "owed"}'
    )
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute("UPDATE history_rows SET cut = ? WHERE seq = 2", (damaged,))
    conn.close()
    async with session_rig({"M": []}, store=SqliteStore(path), sessions=(), config=CONFIG) as r:
        await r.settle()
    [abandoned] = r.of(RetryAbandoned)
    assert "remaining" in abandoned.why
    assert [e.action for e in r.of(Recovered)] == ["abandon"]
    assert r.of(StreamStarted) == []
    with sqlite3.connect(path) as conn:
        (after,) = conn.execute("SELECT cut FROM history_rows WHERE seq = 2").fetchone()
    conn.close()
    assert after == damaged  # left as it is, for a person


async def test_r55_a_retry_whose_row_names_a_malformed_correlation_is_not_run(
    store: Store,
) -> None:
    # the anchor row's correlation lacks its handle: never read as "no correlation" (R55)
    bad = b'{"text":"go","correlation":{"owner_session":"lead","turn_id":"t"}}'
    await left_behind(store, row(1, RowKind.USER, body=bad), envelope=envelope("s1/1", 7))
    async with session_rig({"M": []}, store=store, sessions=(), config=CONFIG) as r:
        await r.settle()
    [abandoned] = r.of(RetryAbandoned)
    assert "correlation" in abandoned.why
    assert r.of(StreamStarted) == []


async def test_ps8_as21_a_user_stop_while_preparing_marks_the_turn_aborted() -> None:
    store = MemoryStore()
    async with session_rig({"M": [X("never")]}, store=store) as r:
        s = r.session()

        def stop_when_written(event: object) -> None:
            if isinstance(event, PhaseChanged) and event.to is Phase.PREPARING:
                s.stop()  # accepted, no stream yet: a synthetic abort

        r.on(stop_when_written)
        s.send("build it")
        await r.settle()
    assert await marker_of(store) == AbandonMarker(reason="aborted", user_row="s1:r1")
    async with session_rig({"M": []}, store=store, sessions=()) as again:
        await again.settle()
    assert again.of(StreamStarted) == []  # the user's Stop is never undone by a restart


async def test_op9_ps4_a_retry_refuses_once_a_call_whose_result_died_with_the_stream(
    store: Store,
) -> None:
    # the interrupted stream's bash call completed, but its result lived only in that stream:
    # the retried model, not knowing, asks again: refused once (the model is told why), then
    # the same call, asked knowingly, runs
    done = deployed("s1/1/1/0")
    await left_behind(store, row(1, RowKind.USER), envelope=envelope("s1/1", 7), receipts=(done,))
    async with retried(store, AGAIN, AGAIN, X("deployed once, then again on purpose")) as (r, bash):
        pass
    [blocked] = r.of(OpBlocked)
    assert (blocked.op, blocked.blocked_by) == ("s1/2/1/0", "s1/1/1/0")
    assert len(bash.calls) == 1  # the knowing second call ran; the unknowing first did not
    first = r.models["M"].requests[1].messages[-1]
    assert "blocked_by_lost_result" in first.text or "lost" in str(first)


async def test_ps8_a_provider_configuration_change_clears_fixable_markers_only(
    store: Store,
) -> None:
    # a turn abandoned for its provider's quota is retried once the provider is fixed; one the
    # user stopped stays abandoned; nothing starts a stream at the change itself
    async with store:
        for sid, reason in (("s1", "quota"), ("s2", "aborted")):
            await commit(
                store,
                sid,
                create=SessionRecord(id=sid, model="M"),
                rows=[
                    msgspec.structs.replace(row(1, RowKind.USER), session=sid, row_id=f"{sid}:r1")
                ],
            )
            await store.commit(
                sid,
                Boundary(abandon=AbandonMarker(reason=reason, user_row=f"{sid}:r1")),
                owner=store.owner,
            )
    async with session_rig({"M": []}, store=store, sessions=(), config=CONFIG) as r:
        await r.settle()
        assert r.of(StreamStarted) == []  # both abandoned: nothing retried
        assert await r.engine.provider_changed() == ("s1",)
        await r.settle()
        assert r.of(StreamStarted) == []  # the change starts nothing
        assert [(p.session, p.what) for p in r.of(Persisted)] == [("s1", "abandon")]
        left = await r.store.abandon_markers()
        assert [sid for sid, _ in left.markers] == ["s2"]
    async with session_rig(
        {"M": [X("answered")]}, store=store, sessions=(), config=CONFIG
    ) as again:
        await again.settle()
    [start] = again.of(StreamStarted)
    assert (start.session, start.cause) == ("s1", "recovery")


async def test_ps3_a_startup_retry_that_fails_before_its_stream_backs_off_on_the_clock(
    store: Store,
) -> None:
    # the gate refuses the retry twice: attempts at 0 s, 1 s, then 3 s (1 s doubling), never
    # in a tight loop; the third starts; a fresh cap of failures would still forfeit it (R21)
    from agent_session import ResumeAttempted
    from tests.agent_session.support import FailingGate

    await left_behind(store, row(1, RowKind.USER), envelope=envelope("s1/1", 7))
    config = EngineConfig(max_stream_steps=9, resume_attempt_cap=4)
    times: list[tuple[str, float]] = []
    async with session_rig(
        {"M": [X("answered")]},
        store=store,
        sessions=(),
        config=config,
        gate=FailingGate(2, purpose="resume"),
    ) as r:
        r.on(
            lambda e: (
                times.append((e.outcome, r.clock.now())) if isinstance(e, ResumeAttempted) else None
            )
        )
        await r.settle()
    assert times == [("failed", 0.0), ("failed", 1.0), ("started", 3.0)]
    [start] = r.of(StreamStarted)
    assert (start.cause, start.budget) == ("recovery", 7)


async def test_op9_ps4_a_lost_result_stays_held_across_a_second_crash(store: Store) -> None:
    # s1/1 completed the call and died; its retry s1/2 died too before asking again: the
    # third start still knows the call ran (every unended stream of the turn counts)
    done = deployed("s1/1/1/0")
    first = msgspec.structs.replace(envelope("s1/1", 7), after_seq=1)
    await left_behind(store, row(1, RowKind.USER), envelope=first, receipts=(done,))
    async with store:
        second = msgspec.structs.replace(envelope("s1/2", 6, cause="recovery"), after_seq=1)
        await commit(store, "s1", envelope=second)
    async with retried(store, AGAIN, X("checked first")) as (r, bash):
        pass
    [blocked] = r.of(OpBlocked)
    assert blocked.blocked_by == "s1/1/1/0"
    assert bash.calls == []
