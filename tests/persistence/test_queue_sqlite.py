"""The durable queue in SQLite: damaged rows reported and kept, the SQL version guard, its cost.

Damage is made with raw SQL on a closed store (``plain_sqlite``); "kept" is checked by reading
the raw row back after a later snapshot, byte for byte.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from persistence import CorruptRecord, QueueQuery, SqliteStore, _writes
from persistence.records import MAX_QUEUED_BYTES
from tests.store_kit import commit

from .helpers import plain_sqlite
from .test_queue_store import Q1, Q2, Q3, entry, seeded, snapshot

if TYPE_CHECKING:
    from pathlib import Path

#: Damage to q2's row, and the start of what a reader must say about it.
DAMAGES = {
    "position-text": ("position = 'two'", "$.position: 'two' is not an integer in 0.."),
    "position-real": ("position = 2.5", "$.position: 2.5 is not an integer in 0.."),
    "position-negative": ("position = -1", "$.position: -1 is not an integer in 0.."),
    "kind-unknown": ("kind = 'robot'", "$.kind: 'robot' is not one of follow-up, report"),
    "kind-blob": ("kind = CAST('wake' AS BLOB)", "$.kind: b'wake' is not one of"),
    "body-text": ("body = 'build finished'", "$.body: not a non-empty byte string"),
    "body-integer": ("body = 5", "$.body: not a non-empty byte string"),
    "body-empty": ("body = x''", "$.body: not a non-empty byte string"),
    "body-not-utf8-text": ("body = CAST(x'7bff' AS TEXT)", "$.body: not a non-empty byte string"),
    "body-too-large": (
        f"body = zeroblob({MAX_QUEUED_BYTES + 1})",
        f"$.body: {MAX_QUEUED_BYTES + 1} bytes, more than {MAX_QUEUED_BYTES}",
    ),
}
RAW = "SELECT * FROM queued_entries WHERE session = 'lead' AND entry_id = 'q2'"


def raw(path: Path, sql: str = RAW) -> list[tuple[object, ...]]:
    """Rows as stored (text as its bytes: the damage may be text that is not UTF-8)."""
    with plain_sqlite(path) as conn:
        conn.text_factory = bytes
        return conn.execute(sql).fetchall()


async def damaged_store(path: Path, edit: str, sql: str = RAW) -> list[tuple[object, ...]]:
    """A store whose ``lead`` queue holds q1, q2 (damaged by ``edit``), q3; q2's raw row."""
    async with SqliteStore(path) as store:
        await seeded(store, Q1, Q2, Q3)
    with plain_sqlite(path) as conn:
        conn.execute(f"UPDATE queued_entries SET {edit} WHERE entry_id = 'q2'")
    return raw(path, sql)


@pytest.mark.parametrize("damage", sorted(DAMAGES))
async def test_a_damaged_queued_entry_is_reported_naming_its_field_and_kept_while_kept(
    tmp_path: Path, damage: str
) -> None:
    path = tmp_path / "q.db"
    edit, said = DAMAGES[damage]
    stored = await damaged_store(path, edit)
    async with SqliteStore(path) as store:
        found = await store.load("lead")
        assert found is not None
        assert found.queue == (Q1, Q3)
        [(entry_id, detail)] = found.queue_corrupt
        assert entry_id == "q2"
        assert detail.startswith(f"queued_entries[lead/q2]: {said}"), detail
        assert "\n" not in detail
        assert len(detail) < 400  # a damaged value is shown cut, never whole
        query = await store.queued()
        assert query.records == (Q1, Q3)
        assert query.corrupt == (("lead/q2", detail),)
        # A later snapshot that keeps it (as the engine does) neither deletes nor rewrites it.
        await commit(store, "lead", queue=snapshot(4, Q3, keep=("q2",)))
        again = await store.load("lead")
        assert again is not None
        assert (again.queue, again.queue_corrupt) == ((Q3,), ((entry_id, detail),))
        assert (await store.scan_recoverable()).queued == ("lead",)
    assert raw(path) == stored


async def test_a_damaged_entry_a_snapshot_does_not_keep_goes_with_it(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    await damaged_store(path, "kind = 'robot'")
    async with SqliteStore(path) as store:
        await commit(store, "lead", queue=snapshot(4, Q1))
        found = await store.load("lead")
        assert found is not None
        assert (found.queue, found.queue_corrupt) == ((Q1,), ())


async def test_an_entry_id_that_is_not_text_is_reported_and_never_deleted(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    blobs = "SELECT * FROM queued_entries WHERE typeof(entry_id) = 'blob'"
    stored = await damaged_store(path, "entry_id = CAST('q2' AS BLOB)", blobs)
    assert len(stored) == 1
    async with SqliteStore(path) as store:
        found = await store.load("lead")
        assert found is not None
        [(entry_id, detail)] = found.queue_corrupt
        assert entry_id == "b'q2'"
        assert detail.startswith("queued_entries[lead/b'q2']: $.entry_id: not a non-empty string")
        await commit(store, "lead", queue=snapshot(4))  # keep cannot name it: it stays
        assert (await store.queued()).corrupt == (("lead/b'q2'", detail),)
    assert raw(path, blobs) == stored


async def test_the_store_never_decodes_a_body(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    opaque = entry("q9", 1)
    async with SqliteStore(path) as store:
        await seeded(store, Q1)
    with plain_sqlite(path) as conn:
        conn.execute("UPDATE queued_entries SET body = x'7b22' WHERE entry_id = 'q1'")
    async with SqliteStore(path, readonly=True) as store:
        found = await store.load("lead")
        assert found is not None
        assert [(e.entry_id, e.body) for e in found.queue] == [("q1", b'{"')]
        assert opaque.body != b'{"'


async def test_a_damaged_queue_version_fails_the_load_and_is_reported_by_queued(
    tmp_path: Path,
) -> None:
    path = tmp_path / "q.db"
    async with SqliteStore(path) as store:
        await seeded(store, Q1)
    with plain_sqlite(path) as conn:
        conn.execute("UPDATE queue_versions SET version = 'three'")
    async with SqliteStore(path) as store:
        with pytest.raises(CorruptRecord) as caught:
            await store.load("lead")
        error = caught.value
        assert (error.table, error.key, error.field) == ("queue_versions", "lead", "$.version")
        assert await store.queued() == QueueQuery(records=(Q1,), corrupt=(("lead", str(error)),))
        await commit(store, "lead", queue=snapshot(9, Q2))  # the guard never passes text
        assert (await store.queued()).records == (Q1,)


async def test_the_queue_is_read_through_its_index_without_a_sort(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    async with SqliteStore(path) as store:
        await seeded(store, Q1)
    with plain_sqlite(path) as conn:
        for sql, params in (
            (_writes.SELECT_QUEUED, ("lead",)),
            (_writes.SELECT_ALL_QUEUED, ()),
            (_writes.SCAN_QUEUED, ()),
        ):
            plan = str(conn.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall())
            assert "TEMP B-TREE" not in plan, (sql, plan)
            assert "INDEX" in plan, (sql, plan)
        plan = str(conn.execute(f"EXPLAIN QUERY PLAN {_writes.SELECT_QUEUED}", ("l",)).fetchall())
        assert "queued_entries_position" in plan
