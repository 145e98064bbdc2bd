"""Operation receipts in both stores (OP-10): upsert, lookup, "open + recent N", corrupt rows."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from persistence import MemoryStore, OperationRecord, OpState, SqliteStore, Store, UsageError
from tests.store_kit import commit, put_receipts, receipt

from .helpers import client


def record(op_id: str, state: OpState, session: str = "s1", at: float = 1.0) -> OperationRecord:
    return OperationRecord(
        op_id=op_id,
        session=session,
        stream=f"{session}/1",
        call_id=f"c-{op_id}",
        capability=client("bash"),
        target="client:bash#abc",
        started_at=at,
        deadline_at=at + 60,
        state=state,
    )


@pytest.fixture(params=["memory", "sqlite"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "r.db")


async def test_op10_receipts_upsert_and_survive_reopen(make: Store) -> None:
    async with make as store:
        await put_receipts(store, record("a", OpState.REQUESTED))
        await put_receipts(store, record("a", OpState.RUNNING))
        assert (await receipt(store, "a")) == record("a", OpState.RUNNING)
        assert await receipt(store, "missing") is None
    async with make as store:
        found = await receipt(store, "a")
        assert found is not None
        assert found.state is OpState.RUNNING


async def test_op10_open_receipts_first_then_recent_terminal_newest_first(make: Store) -> None:
    async with make as store:
        for op_id, state in [
            ("done1", OpState.COMPLETED),
            ("run", OpState.RUNNING),
            ("lost", OpState.INDETERMINATE),
            ("done2", OpState.FAILED),
            ("done3", OpState.TIMED_OUT),
            ("other", OpState.COMPLETED),
        ]:
            await put_receipts(store, record(op_id, state, "s2" if op_id == "other" else "s1"))
        query = await store.receipts("s1", recent=2)
        assert [r.op_id for r in query.records] == ["lost", "run", "done3", "done2"]
        everything = await store.receipts()
        assert [r.op_id for r in everything.records][:2] == ["lost", "run"]
        assert len(everything.records) == 6
        only = await store.receipts(states=frozenset({OpState.INDETERMINATE}))
        assert [r.op_id for r in only.records] == ["lost"]


async def test_op10_a_corrupt_receipt_is_reported_by_id_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    async with SqliteStore(path) as store:
        await commit(
            store,
            "s1",
            operations=[record("good", OpState.COMPLETED), record("bad", OpState.COMPLETED)],
        )
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE operations SET record = CAST(json_set(CAST(record AS TEXT), "
            "'$.started_at', 'yesterday') AS BLOB) WHERE op_id = 'bad'"
        )
    async with SqliteStore(path) as store:
        query = await store.receipts()
        assert [r.op_id for r in query.records] == ["good"]
        assert [op_id for op_id, _ in query.corrupt] == ["bad"]
        assert "$.started_at" in query.corrupt[0][1]
        alone = await store.receipts(op_id="bad")
        assert alone.records == ()
        assert [op_id for op_id, _ in alone.corrupt] == ["bad"]
        assert alone.corrupt[0][1].startswith("operations[bad]: $.started_at")
    with sqlite3.connect(path) as conn:  # never dropped or rewritten
        assert conn.execute("SELECT count(*) FROM operations").fetchone() == (2,)


async def test_an_opened_memory_store_owns_itself_from_the_start() -> None:
    # What a StreamManager used without a store writes its receipts to.
    store = MemoryStore.opened()
    assert store.owner is not None
    await commit(store, "s1", operations=[record("a", OpState.RUNNING)])
    assert await receipt(store, "a") == record("a", OpState.RUNNING)
    with pytest.raises(UsageError, match="already open"):
        await store.open()
