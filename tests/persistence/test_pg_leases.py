"""Session leases with an epoch fence (LS-1 to LS-7), against a real PostgreSQL server.

Two ``PostgresStore`` objects on one database are two engine incarnations. A lease "runs out"
by moving its expiry into the past on the database's clock (the one that judges it), never by
sleeping.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import psycopg
import pytest

from persistence import LeaseLost, RowKind, StaleOwner
from persistence._pg_owner import OWNER_PATTERN
from persistence.postgres import Leases, PostgresStore
from tests.pg_kit import expire, sql
from tests.store_kit import commit, history, owner

from .helpers import row, session

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


def lease_of(url: str, sid: str) -> tuple[str | None, int]:
    found = sql(url, "SELECT owner, epoch FROM sessions WHERE id = %s", (sid,))
    return found[0][0], found[0][1]


def epochs(url: str, sid: str) -> list[tuple[int, int]]:
    """``(seq, epoch)`` of every history row of ``sid``."""
    return [
        (s, e)
        for s, e in sql(
            url, "SELECT seq, epoch FROM history_rows WHERE session = %s ORDER BY seq", (sid,)
        )
    ]


@pytest.fixture
async def pair(pg_url: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    async with PostgresStore(pg_url, lease=7.0) as a, PostgresStore(pg_url, lease=7.0) as b:
        yield a, b


async def test_ls1_each_open_is_an_incarnation_with_its_own_owner_id(pg_url: str) -> None:
    async with PostgresStore(pg_url) as a, PostgresStore(pg_url) as b:
        first = owner(a)
        assert re.fullmatch(r"[^/\s]+/\d+/[0-9a-f]{12}", first)
        assert owner(b) != first
    async with PostgresStore(pg_url) as again:
        assert owner(again) != first  # a reopen is a new incarnation


async def test_ls2_create_takes_the_session_at_epoch_one(pair: tuple[PostgresStore, ...]) -> None:
    a, _ = pair
    await commit(a, "s1", create=session("s1"), rows=[row(0)])
    assert a.leases.epoch("s1") == 1
    assert lease_of(a._url, "s1") == (owner(a), 1)


async def test_ls3_a_peer_cannot_write_a_live_lease(pair: tuple[PostgresStore, ...]) -> None:
    a, b = pair
    await commit(a, "s1", create=session("s1"), rows=[row(0)])
    with pytest.raises(LeaseLost) as lost:
        await commit(b, "s1", rows=[row(1)])
    assert lost.value.holder == owner(a)
    assert lost.value.epoch == 1
    assert isinstance(lost.value, StaleOwner)
    assert [r.seq for r in await history(a)] == [0]
    assert lease_of(a._url, "s1") == (owner(a), 1)


async def test_ls2_an_expired_lease_is_taken_with_the_next_epoch(
    pair: tuple[PostgresStore, ...],
) -> None:
    a, b = pair
    await commit(a, "s1", create=session("s1"), rows=[row(0)])
    expire(a._url, "s1")
    assert await b.acquire("s1") == 2
    assert lease_of(a._url, "s1") == (owner(b), 2)
    await commit(b, "s1", rows=[row(1)])
    assert epochs(a._url, "s1") == [(0, 1), (1, 2)]


async def test_ls3_the_old_holder_writes_nothing_once_a_peer_took_over(
    pair: tuple[PostgresStore, ...],
) -> None:
    a, b = pair
    await commit(a, "s1", create=session("s1"), rows=[row(0)])
    expire(a._url, "s1")
    await commit(b, "s1", rows=[row(1)])  # b's first write takes the session (epoch 2)
    with pytest.raises(LeaseLost) as lost:
        await commit(a, "s1", rows=[row(2, kind=RowKind.ASSISTANT)])
    assert (lost.value.held, lost.value.epoch, lost.value.holder) == (1, 2, owner(b))
    assert "s1" in a.leases.lost
    # Lost stays lost: even once b's lease runs out too, a's stale writer is never let back in.
    expire(a._url, "s1")
    with pytest.raises(LeaseLost):
        await commit(a, "s1", rows=[row(2)])
    assert epochs(a._url, "s1") == [(0, 1), (1, 2)]


async def test_ls3_a_refused_write_leaves_every_part_of_its_boundary_unwritten(
    pair: tuple[PostgresStore, ...],
) -> None:
    a, b = pair
    await commit(a, "s1", create=session("s1"), rows=[row(0)])
    expire(a._url, "s1")
    await b.acquire("s1")
    with pytest.raises(LeaseLost):
        await commit(a, "s1", rows=[row(1)], cut_states=[])
    loaded = await a.load("s1")
    assert loaded is not None
    assert [r.seq for r in loaded.rows] == [0]


async def test_ls3_a_lost_session_is_written_again_only_once_taken_anew(
    pair: tuple[PostgresStore, ...],
) -> None:
    a, b = pair
    await commit(a, "s1", create=session("s1"), rows=[row(0)])
    expire(a._url, "s1")
    await b.acquire("s1")
    with pytest.raises(LeaseLost):
        await commit(a, "s1", rows=[row(1)])
    await b.release(["s1"])
    assert await a.acquire("s1") == 3
    await commit(a, "s1", rows=[row(1)])
    assert epochs(a._url, "s1") == [(0, 1), (1, 3)]


async def test_ls4_a_renewal_extends_every_lease_and_names_the_lost_ones(
    pair: tuple[PostgresStore, ...],
) -> None:
    a, b = pair
    for sid in ("s1", "s2"):
        await commit(a, sid, create=session(sid), rows=[row(0, sid=sid)])
    expire(a._url, "s1")
    expire(a._url, "s2")
    await b.acquire("s2")
    assert await a.renew() == {"s2"}
    assert a.leases.held == {"s1": 1}
    (live,) = sql(a._url, "SELECT lease_expires > now() FROM sessions WHERE id = 's1'")
    assert live == (True,)  # renewed: s1 is a's again, for a whole lease


async def test_ls4_a_renewal_runs_one_statement_whatever_the_number_held(
    pair: tuple[PostgresStore, ...],
) -> None:
    a, _ = pair
    for n in range(6):
        await commit(a, f"s{n}", create=session(f"s{n}"))
    before = sql(
        a._url, "SELECT count(*) FROM sessions WHERE lease_expires > now() + interval '6 second'"
    )
    assert before == [(6,)]
    calls = a.leases.renewals
    assert await a.renew() == set()
    assert a.leases.renewals == calls + 1


async def test_ls5_a_holder_whose_renewals_fail_is_stale_before_a_peer_may_take() -> None:
    now = [100.0]
    leases = Leases(lease=9.0, clock=lambda: now[0])
    seen = [leases.fresh]
    leases.failed()
    now[0] += 9.0 * 0.8 - 0.01
    seen.append(leases.fresh)
    now[0] += 0.02  # past the lease minus the margin: a peer may take within 1.8 s
    seen.append(leases.fresh)
    leases.renewed([], {})
    seen.append(leases.fresh)
    assert seen == [True, True, False, True]


async def test_ls6_a_clean_close_releases_the_leases_at_once(pg_url: str) -> None:
    async with PostgresStore(pg_url) as a:
        await commit(a, "s1", create=session("s1"), rows=[row(0)])
    assert lease_of(pg_url, "s1") == (None, 1)
    async with PostgresStore(pg_url) as b:
        assert await b.acquire("s1") == 2  # no wait for the lease to run out


@pytest.mark.parametrize(
    ("owner_value", "epoch", "expiry"),
    [
        ("", 1, "now() - interval '1 second'"),
        ("someone-else", 1, "now() - interval '1 second'"),
        ("h/1/0123456789ab", -4, "now() - interval '1 second'"),
        ("h/1/0123456789ab", 1, "NULL"),
    ],
)
async def test_ls7_a_malformed_lease_row_is_never_taken(
    pg_url: str, owner_value: str, epoch: int, expiry: str
) -> None:
    async with PostgresStore(pg_url) as a:
        await commit(a, "s1", create=session("s1"))
    sql(
        pg_url,
        f"UPDATE sessions SET owner = %s, epoch = %s, lease_expires = {expiry} WHERE id = 's1'",
        (owner_value, epoch),
    )
    async with PostgresStore(pg_url) as b:
        assert await b.acquire("s1") is None
        with pytest.raises(LeaseLost):
            await commit(b, "s1", rows=[row(0)])
        (reported,) = await b.lease_rows()
    assert lease_of(pg_url, "s1") == (owner_value, epoch)
    assert reported.session == "s1"
    assert reported.problem is not None


async def test_ls3_a_take_waits_for_a_fenced_write_in_flight(
    pair: tuple[PostgresStore, ...],
) -> None:
    """The fence reads the lease FOR KEY SHARE and a take locks FOR UPDATE: no take lands
    inside a holder's transaction, so no row of the old epoch commits after the new epoch's."""
    from persistence import _pg_sql

    a, _ = pair
    await commit(a, "s1", create=session("s1"))
    expire(a._url, "s1")
    with psycopg.connect(a._url) as holder, psycopg.connect(a._url, autocommit=True) as peer:
        holder.execute(_pg_sql.FENCE, {"id": "s1", "owner": owner(a)})  # a's write, open
        peer.execute("SET lock_timeout = '50ms'")
        take = {"id": "s1", "owner": "h/2/0123456789ab", "lease": 5.0, "pattern": OWNER_PATTERN}
        with pytest.raises(psycopg.errors.LockNotAvailable):
            peer.execute(_pg_sql.TAKE, take)
        holder.commit()
        assert peer.execute(_pg_sql.TAKE, take).fetchall() == [(2,)]


async def test_ls3_concurrent_commits_share_a_transaction_each_fenced(
    pair: tuple[PostgresStore, ...],
) -> None:
    import anyio

    a, b = pair
    await commit(b, "taken", create=session("taken"))

    async def one(sid: str) -> None:
        await commit(a, sid, create=session(sid), rows=[row(0, sid=sid)])

    async def refused() -> None:
        with pytest.raises(LeaseLost):
            await commit(a, "taken", rows=[row(0, sid="taken")])

    async with anyio.create_task_group() as tg:
        for n in range(12):
            tg.start_soon(one, f"c{n}")
        tg.start_soon(refused)
    assert a.leases.held == {f"c{n}": 1 for n in range(12)}
    assert sql(a._url, "SELECT count(*) FROM history_rows") == [(12,)]


async def test_ls7_a_sound_lease_row_reports_its_owner_epoch_and_expiry(
    pair: tuple[PostgresStore, ...],
) -> None:
    a, _ = pair
    await commit(a, "s1", create=session("s1"))
    (found,) = await a.lease_rows()
    assert (found.session, found.owner, found.epoch, found.expired) == ("s1", owner(a), 1, False)
    assert found.expires is not None
    assert found.problem is None


# -- LS-8: recovery is claiming expired leases ---------------------------------------------------


async def seed_owed(store: PostgresStore, sid: str) -> None:
    """A session a crashed holder left with a turn unanswered (its last row a user row)."""
    await commit(store, sid, create=session(sid), rows=[row(0, sid=sid)])


async def test_ls8_a_claim_takes_only_expired_sessions_with_work(pg_url: str) -> None:
    async with PostgresStore(pg_url) as dead:
        await seed_owed(dead, "owed")
        await commit(dead, "idle", create=session("idle"), rows=[row(0, sid="idle")])
        await commit(dead, "idle", rows=[row(1, sid="idle", kind=RowKind.ASSISTANT)])
        await seed_owed(dead, "live")
    # ``dead`` closed cleanly: every lease went back. Give "live" a live peer again.
    async with PostgresStore(pg_url) as peer, PostgresStore(pg_url) as claimer:
        assert await peer.acquire("live") == 2
        claimed = await claimer.claim(10)
        assert claimed == {"owed": 2}
        assert lease_of(pg_url, "idle") == (None, 1)
        assert lease_of(pg_url, "live") == (owner(peer), 2)
        assert await claimer.claim(10) == {}  # held now: never claimed twice


async def test_ls8_processes_claiming_together_split_the_work_and_none_twice(pg_url: str) -> None:
    import anyio

    async with PostgresStore(pg_url) as dead:
        for n in range(40):
            await seed_owed(dead, f"s{n:02d}")
    stores = [PostgresStore(pg_url) for _ in range(4)]
    got: list[dict[str, int]] = [{} for _ in stores]
    for store in stores:
        await store.open()
    try:

        async def drain(index: int) -> None:
            while claimed := await stores[index].claim(3):
                assert len(claimed) <= 3
                got[index].update(claimed)

        async with anyio.create_task_group() as tg:
            for index in range(4):
                tg.start_soon(drain, index)
        everyone = [sid for part in got for sid in part]
        assert sorted(everyone) == [f"s{n:02d}" for n in range(40)]  # each exactly once
        assert all(epoch == 2 for part in got for epoch in part.values())
        for index, store in enumerate(stores):
            assert store.leases.held == got[index]
    finally:
        for store in stores:
            await store.close()


async def test_ls8_a_claim_limit_must_be_positive(pair: tuple[PostgresStore, ...]) -> None:
    from persistence import UsageError

    a, _ = pair
    with pytest.raises(UsageError, match="claim limit"):
        await a.claim(0)


def test_ls4_a_session_taken_while_a_renewal_runs_is_not_lost() -> None:
    """The renewal's statement sees the sessions committed before it: one taken meanwhile is
    missing from its rows and must not be called lost (found by the fleet benchmark)."""
    leases = Leases(lease=7.0)
    leases.committed({"old": 3, "retaken": 4}, set())
    before = dict(leases.held)
    leases.committed({"new": 1, "retaken": 5}, set())  # committed while the renewal ran
    gone = leases.renewed([("old", 3)], before)
    assert gone == set()
    assert leases.held == {"old": 3, "new": 1, "retaken": 5}
    assert leases.renewed([("new", 1), ("retaken", 5)], dict(leases.held)) == {"old"}


async def test_ls8_a_scan_of_some_sessions_reads_what_the_whole_scan_says_of_them(
    pg_url: str,
) -> None:
    from tests.persistence.test_pg_storm import seed as seed_owed_fleet

    await seed_owed_fleet(pg_url, 9)  # s0000..s0008, each owing a cut
    async with PostgresStore(pg_url) as store:
        for n in range(3):  # and three tails (an unanswered user row)
            await seed_owed(store, f"t{n}")
        whole = await store.scan_recoverable()
        chosen = {"s0002", "s0005", "t1", "nobody"}
        part = await store.scan_recoverable_of(chosen)
    assert [c.session.id for c in part.cuts] == ["s0002", "s0005"]
    assert [t.session.id for t in part.tails] == ["t1"]
    assert part.cuts == tuple(c for c in whole.cuts if c.session.id in chosen)
    assert part.tails == tuple(t for t in whole.tails if t.session.id in chosen)


async def test_ls6_a_close_gives_the_leases_back_even_when_its_connection_was_lost(
    pg_url: str,
) -> None:
    """An engine shutting down cancels its tasks; psycopg closes a connection whose query was
    cancelled, so the release must not count on the old one (the fleet test found it)."""
    store = PostgresStore(pg_url)
    await store.open()
    await commit(store, "s1", create=session("s1"))
    assert store._writer is not None
    await store._writer.close()
    await store.close()
    assert lease_of(pg_url, "s1") == (None, 1)
