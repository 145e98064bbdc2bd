"""Group commit: concurrent writers share one transaction, and nobody is told too early.

The promise (``docs/persistence.md``): the writes of many sessions may ride in one
transaction, yet no session hears that its boundary is durable before the commit. Each test
would fail if that promise were broken: writes not shared (the gain gone), a writer returning
before its commit (read back through a separate plain ``sqlite3`` connection at the moment it
returns), or one writer's bad write taking the others' good writes down with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

from persistence import Boundary, OperationRecord, OpState, SqliteStore, UsageError
from tests.store_kit import commit, history, put_receipts

from .helpers import client, envelope, plain_sqlite, row, session

if TYPE_CHECKING:
    from pathlib import Path

WRITERS = 40


def receipt(n: int, session_id: str = "s1") -> OperationRecord:
    return OperationRecord(
        op_id=f"op{n}",
        session=session_id,
        stream=f"{session_id}/1",
        call_id=f"c{n}",
        capability=client("noop"),
        target="t",
        started_at=float(n),
        state=OpState.RUNNING,
    )


def stored_op_ids(path: Path) -> set[str]:
    with plain_sqlite(path) as conn:
        return {str(r[0]) for r in conn.execute("SELECT op_id FROM operations").fetchall()}


async def test_concurrent_writers_share_transactions_and_each_is_durable_when_told(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tk.db"
    seen_at_return: dict[str, bool] = {}
    async with SqliteStore(path) as store:
        await commit(store, "s1", create=session())
        before = store.commits

        async def writer(n: int) -> None:
            await put_receipts(store, receipt(n))
            # Told durable: another connection must see it now (not after a later commit).
            seen_at_return[f"op{n}"] = f"op{n}" in stored_op_ids(path)

        async with anyio.create_task_group() as group:
            for n in range(WRITERS):
                group.start_soon(writer, n)
        transactions = store.commits[0] - before[0]
        writes = store.commits[1] - before[1]

    assert writes == WRITERS
    assert transactions < WRITERS // 4, "concurrent writes should share transactions"
    assert seen_at_return == {f"op{n}": True for n in range(WRITERS)}


async def test_without_group_commit_every_write_is_its_own_transaction(tmp_path: Path) -> None:
    path = tmp_path / "tk.db"
    async with SqliteStore(path, group_commit=False) as store:
        await commit(store, "s1", create=session())
        before = store.commits
        async with anyio.create_task_group() as group:
            for n in range(10):
                group.start_soon(put_receipts, store, receipt(n))
        assert (store.commits[0] - before[0], store.commits[1] - before[1]) == (10, 10)
    assert stored_op_ids(path) == {f"op{n}" for n in range(10)}


async def test_a_refused_write_in_a_shared_transaction_loses_nothing_of_the_others(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tk.db"
    errors: list[BaseException] = []
    async with SqliteStore(path) as store:
        await commit(store, "s1", create=session(), rows=[row(1)])
        before = store.commits

        async def bad_rows() -> None:
            try:  # seq 1 taken: refused, the whole boundary (its receipt too)
                await commit(store, "s1", rows=[row(2), row(1)], operations=[receipt(98)])
            except UsageError as error:
                errors.append(error)

        async def bad_envelope() -> None:
            try:
                await commit(store, "nobody", envelope=envelope(sid="nobody"))
            except UsageError as error:
                errors.append(error)

        async with anyio.create_task_group() as group:
            for n in range(10):
                group.start_soon(put_receipts, store, receipt(n))
                if n == 4:
                    group.start_soon(bad_rows)
                    group.start_soon(bad_envelope)
        assert store.commits[0] - before[0] < 12  # they did share
        assert [r.seq for r in await history(store)] == [1]
    assert sorted(type(e).__name__ for e in errors) == ["UsageError", "UsageError"]
    assert any("nobody" in str(e) for e in errors)
    assert stored_op_ids(path) == {f"op{n}" for n in range(10)}


async def test_a_writer_cancelled_while_waiting_still_has_its_write_committed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tk.db"
    async with SqliteStore(path) as store:
        await commit(store, "s1", create=session())
        async with anyio.create_task_group() as group:
            for n in range(5):
                group.start_soon(put_receipts, store, receipt(n))
            with anyio.CancelScope() as scope:
                scope.cancel()
                await put_receipts(store, receipt(99))  # shielded: the write lands
                await anyio.lowlevel.checkpoint()  # the cancellation is delivered here
            assert scope.cancelled_caught
    assert "op99" in stored_op_ids(path)


async def test_a_closed_store_refuses_a_write_before_it_joins_a_transaction(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "tk.db")
    with pytest.raises(UsageError, match="not open"):
        await store.commit("s1", Boundary(operations=(receipt(1),)), owner="any")


async def test_concurrent_reads_share_the_writers_calls_and_see_committed_rows(
    tmp_path: Path,
) -> None:
    async with SqliteStore(tmp_path / "tk.db") as store:
        await commit(store, "s1", create=session(), rows=[row(1), row(2)])
        before = store.commits
        seen: list[int] = []

        async def reader() -> None:
            seen.append(len(await history(store)))

        async with anyio.create_task_group() as group:
            for _ in range(20):
                group.start_soon(reader)
        assert seen == [2] * 20
        assert store.commits[1] - before[1] == 20
        assert store.commits[0] - before[0] < 10
