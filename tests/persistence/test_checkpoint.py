"""WAL checkpoints run on the checkpointer's thread, never inside a commit (bench/resume.py
found SQLite's automatic checkpoint, about 4 ms, inside the commits of slow resumes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from persistence import OperationRecord, OpState, SqliteStore
from persistence._checkpoint import CHECKPOINT_EVERY
from tests.store_kit import commit, put_receipts

from .helpers import client, session

if TYPE_CHECKING:
    from pathlib import Path


def receipt(n: int) -> OperationRecord:
    return OperationRecord(
        op_id=f"op{n}",
        session="s1",
        stream="s1/1",
        call_id=f"c{n}",
        capability=client("noop"),
        target="t",
        started_at=float(n),
        state=OpState.COMPLETED,
    )


async def test_the_store_connection_never_checkpoints_by_itself(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "tk.db") as store:
        assert store._db is not None
        rows = list(await store._db.execute_fetchall("PRAGMA wal_autocheckpoint"))
        assert rows[0][0] == 0


async def test_the_checkpointer_copies_the_wal_into_the_database_while_writes_go_on(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tk.db"
    async with SqliteStore(path) as store:
        await commit(store, "s1", create=session())
        checkpointer = store._checkpointer
        assert checkpointer is not None
        await checkpointer.settle()
        size_before = path.stat().st_size
        # Two rounds of CHECKPOINT_EVERY writes, each waited for: a request made while one
        # is still running is coalesced with it, so how many run during one long burst
        # depends on the thread's speed; each round here asks for exactly one.
        for round_ in range(2):
            for n in range(CHECKPOINT_EVERY):
                await put_receipts(store, receipt(round_ * CHECKPOINT_EVERY + n))
            await checkpointer.settle()
            assert checkpointer.runs == round_ + 1
        assert checkpointer.failures == 0
        # Only a checkpoint writes pages into the database file while it is open.
        assert path.stat().st_size > size_before
        assert len((await store.receipts()).records) == 2 * CHECKPOINT_EVERY
    assert store._checkpointer is None  # stopped with the store


async def test_a_read_only_store_runs_no_checkpointer(tmp_path: Path) -> None:
    path = tmp_path / "tk.db"
    async with SqliteStore(path):
        pass
    async with SqliteStore(path, readonly=True) as view:
        assert view._checkpointer is None
