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
from tests.pg_kit import sql
from tests.store_kit import commit, history, owner

from .helpers import cut, row, session

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
