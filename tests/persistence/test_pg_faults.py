"""PostgreSQL faults an engine survives (LS-2, LS-4): a killed connection, a skewed clock.

* The holder's write connection is killed by the server (``pg_terminate_backend``): the write
  in flight fails as an ordinary failed write, the next one connects again, and the lease is
  as it was (same owner, same epoch): nothing was taken from the holder.
* The renewal connection is killed: the next renewal connects again and renews.
* The engine's clock is an hour off: leases are judged by the database's ``now()`` alone, so
  takes, expiries and a whole turn are exactly as with a right clock.
* The server crashes (``pg_ctl -m immediate``) while an engine is recovering what a crashed
  fleet left: the writes in flight fail as failed writes, the engine goes on, and once it is
  started again every owed turn is answered exactly once.
"""

from __future__ import annotations

import logging
import time

import anyio
import pytest

from agent_session import Engine, EngineConfig
from persistence import RowKind, StoreError
from persistence.postgres import PostgresStore
from stream_manager import ScriptedModel, StreamEnded, SystemClock
from tests.agent_session.support import X
from tests.agent_session.test_engine_leases import Seen
from tests.persistence.helpers import row, session
from tests.persistence.test_pg_storm import seed
from tests.pg_kit import sql
from tests.pg_server import PgServer
from tests.store_kit import commit, history, owner


def kill_backend(url: str, pid: int) -> None:
    assert sql(url, "SELECT pg_terminate_backend(%s)", (pid,)) == [(True,)]


async def test_ls4_a_killed_write_connection_fails_one_write_and_keeps_the_lease(
    pg_url: str,
) -> None:
    async with PostgresStore(pg_url, lease=8.0) as store:
        await commit(store, "s1", create=session("s1"), rows=[row(0)])
        assert store._writer is not None
        kill_backend(pg_url, store._writer.info.backend_pid)
        with pytest.raises(StoreError):
            await commit(store, "s1", rows=[row(1)])
        await commit(store, "s1", rows=[row(1)])  # connected again
        assert [r.seq for r in await history(store)] == [0, 1]
        assert sql(pg_url, "SELECT owner, epoch FROM sessions") == [(owner(store), 1)]
        assert store.leases.held == {"s1": 1}


async def test_ls4_a_killed_renewal_connection_renews_at_the_next_round(pg_url: str) -> None:
    async with PostgresStore(pg_url, lease=8.0, renew_every=3_600.0) as store:
        await commit(store, "s1", create=session("s1"))
        assert await store.renew() == set()
        renewer = store._renewer
        assert renewer is not None
        assert renewer._conn is not None
        kill_backend(pg_url, renewer._conn.info.backend_pid)
        failures = store.leases.failures
        await store.renew()  # the killed connection: one failure, counted, never raised
        assert store.leases.failures == failures + 1
        assert await store.renew() == set()  # connected again
        assert store.leases.failures == 0
        assert store.leases.held == {"s1": 1}


class SkewedClock(SystemClock):
    """The engine's wall clock, an hour ahead."""

    def now(self) -> float:
        return super().now() + 3_600.0


@pytest.mark.timeout(60)
async def test_ls2_an_engine_clock_an_hour_off_changes_nothing(pg_url: str) -> None:
    seen = Seen()
    clock = SkewedClock()
    engine = Engine(
        store=PostgresStore(pg_url, lease=6.0, clock=lambda: time.monotonic() + 3_600.0),
        models={"M": ScriptedModel("M", [X("on time")], clock=clock)},
        clock=clock,
        config=EngineConfig(max_stream_steps=4, claim_every_s=3_600.0),
        observers=[seen],
    )
    async with engine:
        opened = await engine.open_session("s1", model="M")
        await opened.send("what time is it")
        await seen.wait_for(lambda e: isinstance(e, StreamEnded))
        await engine.wait_idle()
        # The lease runs out lease seconds after the database's now, not the engine's.
        (left,) = sql(pg_url, "SELECT extract(epoch FROM lease_expires - now()) FROM sessions")[0]
        assert 0 < float(left) <= 6.0
        assert engine.store.leases.fresh  # type: ignore[attr-defined]
    kinds = [k for (k,) in sql(pg_url, "SELECT kind FROM history_rows ORDER BY seq")]
    assert kinds == [RowKind.USER.value, RowKind.ASSISTANT.value]


def answers(url: str) -> dict[str, int]:
    """Each session's answers after its cut row (seq 2)."""
    rows = sql(
        url,
        "SELECT session, count(*) FROM history_rows WHERE kind = 'assistant' AND seq > 2 "
        "GROUP BY session",
    )
    return {str(sid): int(n) for sid, n in rows}


def recoverer(url: str, seen: Seen, count: int) -> Engine:
    clock = SystemClock()
    return Engine(
        store=PostgresStore(url, lease=4.0),
        models={"M": ScriptedModel("M", [X("answered")] * count, clock=clock)},
        clock=clock,
        config=EngineConfig(
            max_stream_steps=8, claim_limit=8, claim_every_s=0.2, retry_backoff_s=0.05
        ),
        observers=[seen],
    )


@pytest.mark.timeout(120)
async def test_ls8_a_server_crash_during_recovery_loses_and_repeats_no_turn(
    pg_url: str, pg_server: PgServer
) -> None:
    import anyio

    sessions = 24
    await seed(pg_url, sessions)
    seen = Seen()
    async with recoverer(pg_url, seen, sessions) as first:
        await seen.wait_for(lambda e: isinstance(e, StreamEnded))
        await anyio.to_thread.run_sync(pg_server.restart_immediate)  # mid-recovery
        with anyio.move_on_after(3):  # it goes on; what failed stays owed or retries
            await first.wait_idle()
    assert all(n == 1 for n in answers(pg_url).values())  # never twice
    again = Seen()
    async with recoverer(pg_url, again, sessions) as second:  # the next start takes the rest
        with anyio.fail_after(60):
            while len(answers(pg_url)) < sessions:
                await again.wait_for(lambda e: isinstance(e, StreamEnded))
                again.events.clear()
        await second.wait_idle()
    assert answers(pg_url) == {f"s{n:04d}": 1 for n in range(sessions)}
    assert sql(pg_url, "SELECT count(*) FROM history_rows WHERE cut_state = 'owed'") == [(0,)]


async def _query_running(url: str, text: str) -> None:
    """Return once a backend runs a query containing ``text`` (bounded by a failure)."""
    with anyio.fail_after(20):
        while not sql(  # noqa: ASYNC110 - the server's state has no event to wait on
            url,
            "SELECT 1 FROM pg_stat_activity WHERE state = 'active' AND query LIKE %s"
            " AND pid <> pg_backend_pid()",
            (f"%{text}%",),
        ):
            await anyio.sleep(0.01)


@pytest.mark.timeout(60)
async def test_ls4_a_read_cancelled_half_way_ends_on_the_server_and_keeps_its_connection(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A read cancelled in the middle of its query (an engine closing while a session loads)
    # used to have psycopg cancel it on the server, interrupted again by anyio's repeated
    # cancellation: the connection dropped, with a warning. The read now ends first.
    async with PostgresStore(pg_url) as store:
        assert await store._read([("SELECT 1", ())]) == [[(1,)]]
        reader = store._reader
        assert reader is not None
        finished: list[bool] = []
        with caplog.at_level(logging.WARNING):
            async with anyio.create_task_group() as group:

                async def read() -> None:
                    await store._read([("SELECT pg_sleep(0.4), 'held read'", ())])
                    finished.append(True)

                group.start_soon(read)
                await _query_running(pg_url, "held read")
                group.cancel_scope.cancel()
        assert finished == []  # the caller was cancelled all the same
        assert store._reader is reader
        assert not reader.closed
        assert not reader.broken
        assert await store._read([("SELECT 2", ())]) == [[(2,)]]
    assert not [r for r in caplog.records if r.name == "psycopg"], caplog.text
