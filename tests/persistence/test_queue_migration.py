"""A store of schema 4 (before the durable queue) and migration 0005 (issue 24).

A read-write open migrates it in one transaction, keeping what it held; a read-only open is
refused and leaves it untouched; ``SqliteStore.migrate`` migrates without ever creating one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from persistence import (
    MigrationRequired,
    NotATurnkeeperStore,
    QueueQuery,
    SqliteStore,
    StoreError,
    StoreLocked,
    UnsupportedSchemaVersion,
    _connection,
    _migrations,
    _sqlite,
)
from tests.store_kit import commit, history

from .helpers import plain_sqlite, row, session
from .helpers import snapshot as files
from .test_handles_store import SETTLED
from .test_queue_store import Q1, entry, snapshot

if TYPE_CHECKING:
    from pathlib import Path

KNOWN = _sqlite.migrations()
NEWEST = len(KNOWN)


async def schema_4_store(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store as the code before migration 0005 made it: a session, a row, a handle."""
    assert [m.name for m in KNOWN][4] == "0005_queue.sql"
    with monkeypatch.context() as patched:
        patched.setattr(_sqlite, "migrations", lambda: KNOWN[:4])
        async with SqliteStore(path) as store:
            await commit(
                store, "lead", create=session("lead"), rows=[row(1, sid="lead")], handles=[SETTLED]
            )
    with plain_sqlite(path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(4,)]


def tables(path: Path) -> set[str]:
    with plain_sqlite(path) as conn:
        return {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}


async def test_a_schema_4_store_gets_0005_in_one_transaction_keeping_what_it_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    await schema_4_store(path, monkeypatch)
    statements: list[str] = []
    real = _connection.connect

    async def traced(database: str, *, uri: bool = False) -> object:
        db = await real(database, uri=uri)
        await db.set_trace_callback(statements.append)
        return db

    monkeypatch.setattr(_sqlite, "connect", traced)
    async with SqliteStore(path) as store:
        assert await history(store, "lead") == [row(1, sid="lead")]
        assert (await store.handles()).records == (SETTLED,)
        assert await store.queued() == QueueQuery()
        await commit(store, "lead", queue=snapshot(1, Q1))
    begin = statements.index("BEGIN IMMEDIATE")
    end = statements.index("COMMIT", begin)
    writes = [s for s in statements[begin + 1 : end] if not s.startswith("SELECT")]
    later = [statement for migration in KNOWN[4:] for statement in migration.statements]
    assert writes == [*later, f"UPDATE schema_version SET version = {NEWEST}"]
    assert not [s for s in statements[:begin] if s.startswith(("CREATE", "UPDATE", "INSERT"))]
    with plain_sqlite(path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(NEWEST,)]
        assert conn.execute("SELECT session, entry_id FROM queued_entries").fetchall() == [
            ("lead", "q1")
        ]


async def test_a_failing_migration_after_0005_leaves_the_store_at_schema_4(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    await schema_4_store(path, monkeypatch)
    before = files(tmp_path)
    broken = _migrations.Migration(
        NEWEST + 1,
        "9999_broken.sql",
        _migrations.split_statements("INSERT INTO nowhere VALUES (1);"),
    )
    monkeypatch.setattr(_sqlite, "migrations", lambda: (*KNOWN, broken))
    with pytest.raises(StoreError, match="no such table: nowhere"):
        await SqliteStore(path).open()
    with plain_sqlite(path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(4,)]
    assert not tables(path) & {"queued_entries", "queue_versions"}
    assert files(tmp_path).keys() == before.keys()


async def test_a_readonly_open_of_a_schema_4_store_is_refused_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    await schema_4_store(path, monkeypatch)
    before = files(tmp_path)
    with pytest.raises(MigrationRequired) as caught:
        await SqliteStore(path, readonly=True).open()
    assert (caught.value.found, caught.value.supported) == (4, NEWEST)
    assert files(tmp_path) == before


async def test_migrate_brings_a_schema_4_store_to_the_newest_and_then_does_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    await schema_4_store(path, monkeypatch)
    assert await SqliteStore.migrate(path) == (4, NEWEST)
    assert "queued_entries" in tables(path)
    assert await SqliteStore.migrate(path) == (NEWEST, NEWEST)
    assert sorted(files(tmp_path)) == ["old.db"]  # its -wal, -shm and .lock went on close
    async with SqliteStore(path, readonly=True) as store:
        assert await history(store, "lead") == [row(1, sid="lead")]


@pytest.mark.parametrize("content", [None, b""], ids=["missing", "empty"])
async def test_migrate_never_creates_a_store(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "new.db"
    if content is not None:
        path.write_bytes(content)
    before = files(tmp_path)
    with pytest.raises(NotATurnkeeperStore, match=r"new\.db is not a turnkeeper store"):
        await SqliteStore.migrate(path)
    assert files(tmp_path) == before


async def test_migrate_refuses_a_newer_store_and_an_owned_one_untouched(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    async with SqliteStore(path) as store:
        await commit(store, "lead", create=session("lead"), queue=snapshot(2, entry("q4", 3)))
        with pytest.raises(StoreLocked):
            await SqliteStore.migrate(path)
    with plain_sqlite(path) as conn:
        conn.execute("UPDATE schema_version SET version = 99")
    before = files(tmp_path)
    with pytest.raises(UnsupportedSchemaVersion, match="schema version 99"):
        await SqliteStore.migrate(path)
    assert files(tmp_path) == before
