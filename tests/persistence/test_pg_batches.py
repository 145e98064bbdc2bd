"""The PostgreSQL store's pipelined batches (``persistence/_pg_fast.py``), on a real server.

Concurrent commits of sessions the store holds share one pipelined transaction; when one of
them cannot stand (its lease was taken, it repeats a row, it moves a cut state no row has),
the transaction is rolled back whole and the batch runs commit by commit: the one that cannot
stand is refused by name and writes nothing, every other commit of the batch lands.
"""

from __future__ import annotations

import anyio
import pytest

from persistence import Boundary, CutState, CutStateChange, LeaseLost, RowKind, UsageError
from persistence.postgres import PostgresStore
from persistence.records import HandleRecord, HandleStatus
from tests.pg_kit import sql
from tests.store_kit import commit, envelopes, history, owner

from .helpers import cut, envelope, row, session

SESSIONS = [f"b{n}" for n in range(7)]


async def held(url: str) -> PostgresStore:
    store = PostgresStore(url, lease=9.0)
    await store.open()
    for sid in SESSIONS:
        await commit(store, sid, create=session(sid), rows=[row(0, sid=sid)])
    return store


async def together(store: PostgresStore, boundaries: dict[str, Boundary]) -> dict[str, object]:
    """Commit every boundary at once (one batch); each one's result or error."""
    results: dict[str, object] = {}

    async def one(sid: str, boundary: Boundary) -> None:
        try:
            results[sid] = await store.commit(sid, boundary, owner=owner(store))
        except Exception as error:  # the test reads each one's fate
            results[sid] = error

    async with anyio.create_task_group() as tg:
        for sid, boundary in boundaries.items():
            tg.start_soon(one, sid, boundary)
    return results


async def in_order(store: PostgresStore, commits: list[tuple[str, Boundary]]) -> list[object]:
    """Start every commit at once, in this order; each one's result or error.

    The first one leads a batch of its own (a lone writer waits for nothing); the rest join the
    next batch in the order they started.
    """
    results: list[object] = [None] * len(commits)

    async def one(index: int, sid: str, boundary: Boundary) -> None:
        try:
            results[index] = await store.commit(sid, boundary, owner=owner(store))
        except Exception as error:  # the test reads each one's fate
            results[index] = error

    async with anyio.create_task_group() as tg:
        for index, (sid, boundary) in enumerate(commits):
            tg.start_soon(one, index, sid, boundary)
    return results


def handle(handle_id: str, report: str) -> HandleRecord:
    return HandleRecord(
        handle_id=handle_id,
        owner="b1",
        target="b2",
        turn_id="b2:r9",
        status=HandleStatus.COMPLETED,
        reason="filed",
        report=report,
        delivered=True,
        created_at=3.5,
        settled_at=8.25,
    )


async def test_ls3_a_session_twice_in_one_batch_writes_as_one_commit_after_the_other(
    pg_url: str,
) -> None:
    """Waves: b0's second commit deletes the row its first added and puts one at its seq."""
    store = await held(pg_url)
    try:
        fast = store.fast_batches
        results = await in_order(
            store,
            [
                ("b6", Boundary(rows=(row(1, sid="b6", kind=RowKind.ASSISTANT),))),
                ("b0", Boundary(rows=(row(1, "first", sid="b0", kind=RowKind.ASSISTANT),))),
                ("b1", Boundary(rows=(row(1, sid="b1", kind=RowKind.ASSISTANT),))),
                (
                    "b0",
                    Boundary(
                        delete=("first",),
                        rows=(row(1, "second", sid="b0", kind=RowKind.ASSISTANT),),
                    ),
                ),
            ],
        )
        assert not [r for r in results if isinstance(r, Exception)], results
        assert store.fast_batches >= fast + 1
        assert store.careful_batches == 0
        assert [r.row_id for r in await history(store, "b0")] == ["r0", "second"]
        assert [r.seq for r in await history(store, "b1")] == [0, 1]
    finally:
        await store.close()


async def test_ls3_a_key_two_commits_of_one_batch_write_keeps_the_last_value(
    pg_url: str,
) -> None:
    """One upsert statement per table: a handle written by two sessions' commits, the later wins."""
    store = await held(pg_url)
    try:
        results = await in_order(
            store,
            [
                ("b6", Boundary(rows=(row(1, sid="b6", kind=RowKind.ASSISTANT),))),
                (
                    "b1",
                    Boundary(handles=(handle("h-5", "draft"),), envelope=envelope("x", sid="b1")),
                ),
                ("b2", Boundary(handles=(handle("h-5", "final"),))),
                ("b1", Boundary(envelope=envelope("x", sid="b1", budget=3))),
                ("b3", Boundary(envelope=envelope("y", sid="b3"))),
            ],
        )
        assert not [r for r in results if isinstance(r, Exception)], results
        assert store.careful_batches == 0
        query = await store.handles()
        assert [(h.handle_id, h.report) for h in query.records] == [("h-5", "final")]
        assert [(e.stream, e.budget) for e in await envelopes(store, "b1")] == [("x", 3)]
    finally:
        await store.close()


async def test_concurrent_commits_of_held_sessions_share_one_pipelined_transaction(
    pg_url: str,
) -> None:
    store = await held(pg_url)
    try:
        fast = store.fast_batches
        results = await together(
            store,
            {sid: Boundary(rows=(row(1, sid=sid, kind=RowKind.ASSISTANT),)) for sid in SESSIONS},
        )
        assert not [r for r in results.values() if isinstance(r, Exception)]
        assert store.fast_batches > fast
        assert store.careful_batches == 0
        for sid in SESSIONS:
            assert [r.seq for r in await history(store, sid)] == [0, 1]
    finally:
        await store.close()


@pytest.mark.parametrize("breaks", ["lease", "duplicate-row", "cut-of-no-row"])
async def test_ls3_one_commit_that_cannot_stand_leaves_the_rest_of_its_batch_landed(
    pg_url: str, breaks: str
) -> None:
    store = await held(pg_url)
    try:
        bad = "b3"
        boundaries = {
            sid: Boundary(rows=(row(1, sid=sid, kind=RowKind.ASSISTANT, cut=cut()),))
            for sid in SESSIONS
        }
        if breaks == "lease":
            sql(
                pg_url,
                "UPDATE sessions SET owner = 'h/9/0123456789ab', epoch = 5 WHERE id = %s",
                (bad,),
            )
        elif breaks == "duplicate-row":
            boundaries[bad] = Boundary(rows=(row(0, "other", sid=bad),))  # seq 0 is taken
        else:
            boundaries[bad] = Boundary(
                cut_states=(CutStateChange(row_id="nowhere", state=CutState.CONSUMED),)
            )
        results = await together(store, boundaries)
        assert store.careful_batches >= 1
        error = results.pop(bad)
        expected = LeaseLost if breaks == "lease" else UsageError
        assert isinstance(error, expected), error
        assert not [r for r in results.values() if isinstance(r, Exception)]
        for sid in SESSIONS:
            seqs = [r.seq for r in await history(store, sid)]
            assert seqs == ([0] if sid == bad else [0, 1]), sid
    finally:
        await store.close()
