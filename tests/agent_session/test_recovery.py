"""Startup recovery of owed cuts: PS-6, R60 (durable normal cut), R61 (malformed, not absent).

Most tests seed a store the way a crashed process leaves it (a user row, the cut stream's
final assistant row carrying an ``owed`` cut record, its envelope) and start an engine on it;
one lets a real engine cut a turn and "crash" right after the cut row committed. Each test
would fail if its rule were dropped: nothing resumed, the budget reset, a second sentinel, a
stale record resumed, a corrupt record read as "nothing owed" or overwritten.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

import anyio
import msgspec
import pytest

from agent_session import (
    ContinuationEnded,
    ContinuationOwed,
    Engine,
    EngineConfig,
    HandleSettled,
    Phase,
    Recovered,
    ResumeAttempted,
)
from agent_session.harness.fakes import Faults, FaultyStore
from message_queue import Correlation
from persistence import (
    CutRecord,
    CutState,
    HandleRecord,
    HandleStatus,
    HistoryRow,
    MemoryStore,
    RowKind,
    SessionRecord,
    SqliteStore,
    Store,
    TurnEnvelope,
    UsageError,
)
from persistence.postgres import PostgresStore
from stream_manager import FellBack, Persisted, ScriptedModel, ScriptStep, StreamStarted
from tests import store_kit
from tests.agent_session.support import T_, HookTool, X, active_handles, session_rig
from tests.operations.support import LedgerStore
from tests.store_kit import commit

if TYPE_CHECKING:
    from pathlib import Path


DELEGATED = Correlation(handle_id="h1", owner_session="owner", turn_id="t1")
#: The delegated turns of the seeded cut records (``correlated``, and the all-fields record).
H1 = Correlation(handle_id="h1", owner_session="ow", turn_id="t1")
H9 = Correlation(handle_id="h9", owner_session="owner", turn_id="t9")


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "memory":
        return MemoryStore()
    if request.param == "postgres":
        return PostgresStore(request.getfixturevalue("pg_url"))
    return SqliteStore(tmp_path / "tk.db")


def cut(remaining: int = 3, model: str = "M") -> CutRecord:
    return CutRecord(
        remaining=remaining,
        model=model,
        requested_model=model,
        refused_models=(),
        chain=(),
    )


def row(
    sid: str, seq: int, kind: RowKind, *, stream: str | None = None, cut: CutRecord | None = None
) -> HistoryRow:
    body = b'{"text":"[CONTINUE]"}' if kind is RowKind.SENTINEL else b'{"text":"m%d"}' % seq
    return HistoryRow(
        session=sid,
        seq=seq,
        row_id=f"{sid}:r{seq}",
        kind=kind,
        body=body,
        stream=stream,
        cut=cut,
    )


async def seed(
    store: Store,
    sid: str = "s1",
    *,
    record: CutRecord | None = None,
    after: tuple[RowKind, ...] = (),
) -> None:
    """What a process that crashed right after a cut leaves behind."""
    async with store:
        rows = [
            row(sid, 1, RowKind.USER),
            row(sid, 2, RowKind.ASSISTANT, stream=f"{sid}/1", cut=record or cut()),
        ]
        rows += [row(sid, 3 + n, kind) for n, kind in enumerate(after)]
        await commit(store, sid, create=SessionRecord(id=sid, model="M"), rows=rows)
        await commit(
            store,
            sid,
            envelope=TurnEnvelope(
                session=sid, stream=f"{sid}/1", model="M", budget=8, cause="send"
            ),
        )


async def test_ps6_an_owed_normal_cut_is_resumed_at_startup_under_its_remaining_steps(
    store: Store,
) -> None:
    await seed(store, record=cut(remaining=3))
    async with session_rig({"M": [X("answered")]}, store=store, sessions=()) as r:
        await r.settle()
        assert [(e.action, e.session) for e in r.of(Recovered)] == [("resume", "s1")]
        (start,) = r.of(StreamStarted)
        assert (start.stream, start.cause, start.budget, start.model) == ("s1/2", "resume", 3, "M")
        assert await r.kinds() == [
            RowKind.USER,
            RowKind.ASSISTANT,
            RowKind.SENTINEL,
            RowKind.ASSISTANT,
        ]
        request = r.models["M"].requests[0]
        assert [m.role for m in request.messages][-1] == "user"  # the [CONTINUE] sentinel
        assert r.session().owes() is False
        # R60: the durable record followed the marker: consumed, so no second recovery.
        assert await store_kit.owed(r.store) == []
    async with session_rig({"M": []}, store=store, sessions=()) as again:
        await again.settle()
        assert again.of(Recovered) == []
        assert again.of(StreamStarted) == []


async def test_ps6_r60_every_field_of_the_durable_record_reaches_the_resumed_stream(
    store: Store,
) -> None:
    # None of these is a default: the cut ran on beta after alpha refused, with gamma next in
    # the chain, five steps left, for delegated turn h9. Dropping any field when the record is
    # written or read changes what the resumed stream does.
    record = CutRecord(
        remaining=5,
        model="beta",
        requested_model="alpha",
        refused_models=("alpha",),
        chain=("beta", "gamma"),
        handle_id="h9",
        owner_session="owner",
        turn_id="t9",
    )
    await seed(store, record=record)
    await active_handles(store, (H9, "s1"))
    scripts = {"alpha": [], "beta": [ScriptStep(refuse=True)], "gamma": [X("from gamma")]}
    async with session_rig(
        scripts,
        store=store,
        sessions=(),
        fallbacks={"alpha": ["beta", "gamma"]},
    ) as r:
        await r.settle()
        (start,) = r.of(StreamStarted)
        assert (start.model, start.budget, start.handle) == ("beta", 5, "h9")
        (hop,) = r.of(FellBack)
        assert (hop.from_, hop.to, hop.refused) == ("beta", "gamma", ("alpha", "beta"))
        assert not r.models["alpha"].requests  # the requested model is not asked again
        assert await store_kit.owed(r.store) == []


async def test_ps6_a_cut_followed_only_by_its_sentinel_gets_no_second_sentinel(
    store: Store,
) -> None:
    await seed(store, after=(RowKind.SENTINEL,))  # the crash came at B9
    async with session_rig({"M": [X()]}, store=store, sessions=()) as r:
        await r.settle()
        assert [e.action for e in r.of(Recovered)] == ["resume"]
        assert (await r.kinds()).count(RowKind.SENTINEL) == 1
        assert len(r.of(StreamStarted)) == 1


async def test_ps6_a_cut_that_is_no_longer_the_tail_is_voided_not_resumed(store: Store) -> None:
    await seed(store, after=(RowKind.USER, RowKind.ASSISTANT))
    async with session_rig({"M": []}, store=store, sessions=()) as r:
        await r.settle()
        (event,) = r.of(Recovered)
        assert event.action == "abandon"
        assert "not the tail" in event.why
        (void,) = [e for e in r.of(Persisted) if e.what == "cut-void"]
        assert r.events.index(void) < r.events.index(event)  # durable, then told
        assert r.of(StreamStarted) == []
        (stored,) = [h for h in await r.history() if h.cut is not None]
        assert stored.cut is not None
        assert stored.cut.state is CutState.VOIDED
        assert [e.id for e in r.of(Persisted) if e.what == "cut-void"] == ["s1:r2"]


HANDLE = b'"correlation":{"handle_id":"h1","owner_session":"ow","turn_id":"t1"}'
OTHER = b'"correlation":{"handle_id":"h2","owner_session":"ow","turn_id":"t2"}'


def correlated(remaining: int) -> CutRecord:
    return CutRecord(
        remaining=remaining,
        model="M",
        requested_model="M",
        refused_models=(),
        chain=(),
        handle_id="h1",
        owner_session="ow",
        turn_id="t1",
    )


async def follow(store: Store, body: bytes) -> None:
    """The row a crashed process made durable after the cut, and then streamed nothing for."""
    async with store:
        await commit(
            store,
            "s1",
            rows=[HistoryRow(session="s1", seq=3, row_id="s1:r3", kind=RowKind.USER, body=body)],
        )


@pytest.mark.parametrize(
    "body",
    [
        b'{"text":"monitors finished","entry_kind":"wake"}',
        b'{"text":"monitors finished","entry_kind":"report",' + HANDLE + b"}",
    ],
    ids=["wake", "same-turn-report"],
)
async def test_ps6_a_cut_followed_by_a_row_that_continues_it_resumes_after_that_row(
    store: Store, body: bytes
) -> None:
    # AS-8: the durable row continues the cut turn; its stream never started, so the resume
    # starts it, under the cut's budget, with that row as the last word (no sentinel).
    await seed(store, record=correlated(remaining=4))
    await active_handles(store, (H1, "s1"))
    await follow(store, body)
    async with session_rig(
        {"M": [X("read the monitors")]},
        store=store,
        sessions=(),
    ) as r:
        await r.settle()
        assert [e.action for e in r.of(Recovered)] == ["resume"]
        (start,) = r.of(StreamStarted)
        assert (start.cause, start.budget, start.handle) == ("resume", 4, "h1")
        assert r.models["M"].requests[0].messages[-1].text == "monitors finished"
        assert RowKind.SENTINEL not in await r.kinds()
        assert await store_kit.owed(r.store) == []


@pytest.mark.parametrize(
    "body",
    [b'{"text":"actually, stop"}', b'{"text":"other turn","entry_kind":"report",' + OTHER + b"}"],
    ids=["user", "other-turn-report"],
)
async def test_ps6_r35_a_cut_superseded_by_a_durable_row_is_withdrawn_not_resumed(
    store: Store, body: bytes
) -> None:
    # R35: the durable row did not continue the cut turn, so it superseded it; answering that
    # row is the startup retry's (PS-4), never the cut turn's resume: a fresh stream (nothing
    # of the new turn was spent), its ending told after its void
    await seed(store, record=correlated(remaining=4))
    await follow(store, body)
    async with session_rig({"M": [X("answered")]}, store=store, sessions=()) as r:
        await r.settle()
        (event, retry) = r.of(Recovered)
        assert event.action == "abandon"
        assert "R35" in event.why
        assert "s1:r3" in event.why
        assert retry.action == "retry"
        starts = [(s.cause, s.budget) for s in r.of(StreamStarted)]
        if b"report" in body:  # another turn's report: its handle is not active, refused (R57)
            assert starts == []
        else:
            assert starts == [("recovery", 8)]
        [ended] = [e for e in r.of(ContinuationEnded) if e.cut == "s1/1"]
        assert ended.how == "withdrawn"
        assert await store_kit.owed(r.store) == []
        (stored,) = [h for h in await r.history() if h.cut is not None]
        assert stored.cut is not None
        assert stored.cut.state is CutState.WITHDRAWN
        assert [e.id for e in r.of(Persisted) if e.what == "cut-void"] == ["s1:r2"]


async def test_ps6_a_record_with_no_steps_left_owes_nothing_and_is_voided(store: Store) -> None:
    await seed(store, record=cut(remaining=0))
    async with session_rig({"M": []}, store=store, sessions=()) as r:
        await r.settle()
        assert [e.action for e in r.of(Recovered)] == ["abandon"]
        assert r.of(StreamStarted) == []
        assert await store_kit.owed(r.store) == []


async def test_ps6_a_cut_on_a_model_this_engine_lacks_stays_owed_untouched(store: Store) -> None:
    await seed(store, record=cut(model="gone"))
    async with session_rig({"M": []}, store=store, sessions=()) as r:
        await r.settle()
        (event,) = r.of(Recovered)
        assert (event.action, "'gone'" in event.why) == ("abandon", True)
        assert r.of(StreamStarted) == []
        assert [h.row_id for h in await store_kit.owed(r.store)] == ["s1:r2"]


async def test_ps6_only_the_latest_owed_cut_of_a_session_is_resumed(store: Store) -> None:
    async with store:
        await commit(
            store,
            "s1",
            create=SessionRecord(id="s1", model="M"),
            rows=[
                row("s1", 1, RowKind.USER),
                row("s1", 2, RowKind.ASSISTANT, stream="s1/1", cut=cut(remaining=5)),
                row("s1", 3, RowKind.SENTINEL),
                row("s1", 4, RowKind.ASSISTANT, stream="s1/2", cut=cut(remaining=2)),
            ],
        )
    async with session_rig({"M": [X()]}, store=store, sessions=()) as r:
        await r.settle()
        (start,) = r.of(StreamStarted)
        assert (start.budget, start.stream) == (2, "s1/3")
        states = {h.row_id: h.cut.state for h in await r.history() if h.cut is not None}
        assert states == {"s1:r2": CutState.VOIDED, "s1:r4": CutState.CONSUMED}


async def test_ps6_recovery_can_be_turned_off(store: Store) -> None:
    await seed(store)
    config = EngineConfig(max_stream_steps=8, recover_at_start=False)
    async with session_rig({"M": []}, store=store, sessions=(), config=config) as r:
        await r.settle()
        assert r.of(Recovered) == []
        assert r.of(StreamStarted) == []
        assert len(await store_kit.owed(r.store)) == 1


async def test_r61_a_malformed_cut_record_abandons_that_session_only_and_is_left_as_is(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tk.db"
    await seed(SqliteStore(path), "bad")
    await seed(SqliteStore(path), "good")
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute(
            "UPDATE history_rows SET cut = CAST(? AS BLOB) WHERE session = 'bad' AND seq = 2",
            (b'{"remaining": "three", "model": "M", "requested_model": "M", "state": "owed"}',),
        )
        (before,) = conn.execute("SELECT cut FROM history_rows WHERE session='bad' AND seq=2")
    conn.close()
    async with session_rig({"M": [X()]}, store=SqliteStore(path), sessions=()) as r:
        await r.settle()
        events = {e.session: e for e in r.of(Recovered)}
        assert events["good"].action == "resume"
        assert events["bad"].action == "abandon"
        assert "bad:r2" in events["bad"].why
        assert "remaining" in events["bad"].why
        assert [s.stream for s in r.of(StreamStarted)] == ["good/2"]
    with sqlite3.connect(path) as conn:
        (after,) = conn.execute("SELECT cut FROM history_rows WHERE session='bad' AND seq=2")
    conn.close()
    assert after == before  # never read as absent, never overwritten


async def test_r60_a_crash_right_after_a_real_cut_is_resumed_by_the_next_engine(
    tmp_path: Path,
) -> None:
    """A real turn cuts at a tool boundary for a queued wake; the process dies as the cut
    row commits (before the wake runs); the next engine resumes the cut under its budget."""
    path = tmp_path / "tk.db"
    dying = LedgerStore(SqliteStore(path))
    with anyio.CancelScope() as crash:
        async with session_rig(
            {"M": [T_("bash"), T_("task_await"), X("never reached")]},
            tools=[
                HookTool("task_await", before=lambda _call: queue_wake()),
            ],
            store=dying,
        ) as r:

            def queue_wake() -> None:
                r.session().enqueue("monitors finished", kind="wake", mode="tool-end")

            def die_at_the_cut(event: object) -> None:
                if isinstance(event, Persisted) and event.what == "cut":
                    dying.crash()  # no later write reaches the file
                    crash.cancel()

            r.on(die_at_the_cut)
            r.session().send("start and wait")
            await r.settle()
    async with session_rig({"M": [X("resumed")]}, store=SqliteStore(path), sessions=()) as again:
        await again.settle()
        assert [e.action for e in again.of(Recovered)] == ["resume"]
        (start,) = again.of(StreamStarted)
        assert (start.cause, start.budget) == ("resume", 6)
        assert again.models["M"].requests, "the resumed stream called the model"
        assert await store_kit.owed(again.store) == []


async def test_r60_a_real_cut_after_a_hop_survives_a_crash_with_its_chain_and_correlation(
    tmp_path: Path,
) -> None:
    """A delegated turn (h1) refused by alpha runs on beta and is cut; the process dies as
    the cut row commits. The next engine resumes on beta, for h1, and when beta refuses too it
    hops to gamma with both refusals: the durable record kept the model, the chain, the
    refusals and the correlation (any one dropped on the write fails this)."""
    path = tmp_path / "tk.db"
    dying = LedgerStore(SqliteStore(path))
    chain = {"alpha": ["beta", "gamma"]}
    owed: list[int] = []
    with anyio.CancelScope() as crash:
        async with session_rig(
            {"alpha": [ScriptStep(refuse=True)], "beta": [T_("bash"), T_("task_await")]},
            tools=[HookTool("task_await", before=lambda _call: queue_wake())],
            store=dying,
            fallbacks=chain,
            sessions=(("s1", "alpha"),),
            handles=((DELEGATED, "s1"),),
        ) as r:

            def queue_wake() -> None:
                r.session().enqueue("monitors finished", kind="wake", mode="tool-end")

            def die_at_the_cut(event: object) -> None:
                if isinstance(event, ContinuationOwed):
                    owed.append(event.remaining)
                if isinstance(event, Persisted) and event.what == "cut":
                    dying.crash()
                    crash.cancel()

            r.on(die_at_the_cut)
            r.session().enqueue("delegated task", kind="system", correlation=DELEGATED)
            await r.settle()
    scripts = {"alpha": [], "beta": [ScriptStep(refuse=True)], "gamma": [X("from gamma")]}
    await active_handles(SqliteStore(path), (DELEGATED, "s1"))  # the owner's, still active
    async with session_rig(scripts, store=SqliteStore(path), sessions=(), fallbacks=chain) as a:
        await a.settle()
        (start,) = a.of(StreamStarted)
        assert (start.model, start.budget, start.handle) == ("beta", owed[0], "h1")
        (hop,) = a.of(FellBack)
        assert (hop.from_, hop.to, hop.refused) == ("beta", "gamma", ("alpha", "beta"))
        assert await store_kit.owed(a.store) == []


class CountingGate:
    """A pre-stream gate that holds every resume until released, counting those it holds."""

    def __init__(self) -> None:
        self.holding = 0
        self.most = 0
        self.release = anyio.Event()

    async def check(self, session: str, purpose: str) -> None:
        self.holding += 1
        self.most = max(self.most, self.holding)
        try:
            await self.release.wait()
        finally:
            self.holding -= 1


async def test_ps6_recovered_resumes_start_at_most_recovery_concurrency_at_once(
    store: Store,
) -> None:
    for n in range(10):
        await seed(store, f"s{n}")
    gate = CountingGate()
    config = EngineConfig(max_stream_steps=8, recovery_concurrency=3)
    async with session_rig(
        {"M": [X()] * 10}, store=store, sessions=(), config=config, gate=gate
    ) as r:
        await anyio.wait_all_tasks_blocked()
        assert gate.holding == 3
        gate.release.set()
        await r.settle()
        assert gate.most == 3
        assert len(r.of(StreamStarted)) == 10
        assert await store_kit.owed(r.store) == []


async def test_ps6_wait_idle_right_after_the_engine_started_covers_the_recovered_turn(
    store: Store,
) -> None:
    """Issue 12 item 7: the engine's start must not look idle before its resumes began.

    The recovered session is held busy from its plan until its resume has an outcome, so an
    ``engine.wait_idle()`` awaited at once returns only after the resumed turn answered.
    """
    await seed(store, record=cut(remaining=2, model="M2"))
    answering = ScriptedModel("M2", [X("answered after the restart")])
    async with Engine(store=store, models={"M": ScriptedModel("M", []), "M2": answering}) as e:
        await e.wait_idle()
        assert answering.steps_played == 1
        assert e.session("s1").owes() is False
        assert e.session("s1").phase is Phase.IDLE


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_stream_steps", 2**31),
        ("max_stream_steps", 0),
        ("resume_attempt_cap", 0),
        ("recovery_concurrency", 0),
    ],
)
def test_r61_an_engine_config_a_store_could_not_read_back_is_refused(
    field: str, value: int
) -> None:
    """A step ceiling above what a stored cut may hold (``MAX_STEPS``) would write cuts that
    read back as damage; the config is refused at construction, naming the field."""
    with pytest.raises(UsageError, match=f"^EngineConfig.{field} must be"):
        EngineConfig(**{field: value})  # type: ignore[arg-type]


async def test_ps6_an_abandon_whose_write_failed_is_not_told_and_is_planned_again() -> None:
    """Recovery decides to void a cut with no steps left; that write fails at startup. An
    abandon is its write: nothing is told, the record stays owed, and the next start (whose
    write succeeds) abandons it and tells so."""
    store = MemoryStore()
    await seed(store, record=cut(remaining=0))
    faults = Faults()
    faults.arm("store_write", 1)
    async with session_rig({"M": []}, store=FaultyStore(store, faults), sessions=()) as r:
        await r.settle()
        assert r.of(Recovered) == []
        assert [h.row_id for h in await store_kit.owed(store)] == ["s1:r2"]
    async with session_rig({"M": []}, store=store, sessions=()) as r:
        await r.settle()
        assert [e.action for e in r.of(Recovered)] == ["abandon"]
        assert await store_kit.owed(store) == []


async def test_r57_ps5_a_recovered_soft_stop_cut_whose_handle_was_stopped_is_refused(
    store: Store,
) -> None:
    """CR-06: a correlated soft-stop cut (its partial stamped with 6 steps left) survives a
    crash; its owner interrupted the handle while the process was down. Recovery brings the
    correlation back and asks the handle again: refused, no stream, no [CONTINUE], and no
    second settlement."""
    record = CutRecord(
        remaining=6,
        model="M",
        requested_model="M",
        handle_id="h4",
        owner_session="lead",
        turn_id="t4",
    )
    async with store:
        rows = [row("s1", 1, RowKind.USER), row("s1", 2, RowKind.PARTIAL, stream="s1/1")]
        rows[1] = msgspec.structs.replace(rows[1], cut=record)
        await commit(store, "s1", create=SessionRecord(id="s1", model="M"), rows=rows)
        stopped = HandleRecord(
            handle_id="h4",
            owner="lead",
            target="s1",
            turn_id="t4",
            status=HandleStatus.INTERRUPTED,
            reason="interrupted by its owner",
        )
        await commit(store, "lead", handles=(stopped,))
    async with session_rig({"M": [X("never")]}, store=store, sessions=()) as r:
        await r.settle()
        kinds = await r.kinds()
    (attempt,) = r.of(ResumeAttempted)
    assert (attempt.cut, attempt.outcome) == ("s1/1", "refused")
    assert r.of(StreamStarted) == []
    assert r.of(HandleSettled) == []  # settled already: the forfeit's settlement is a no-op
    assert kinds == [RowKind.USER, RowKind.PARTIAL]
    (ended,) = r.of(ContinuationEnded)
    assert ended.why == "admission refused: the handle h4 is settled interrupted"
