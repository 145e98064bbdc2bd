"""Handle records in SQLite: damaged rows are reported and skipped; a version-3 store migrates."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
import pytest

from persistence import SqliteStore, _sqlite
from tests.store_kit import commit, put_receipts, receipt

from .helpers import plain_sqlite
from .test_handles_store import ACTIVE, SETTLED
from .test_resolve_store import STUCK

if TYPE_CHECKING:
    from pathlib import Path

#: Damage to ACTIVE's row, and the start of what ``corrupt`` must say about it.
DAMAGES = {
    "not-json": ("record = x'7b22'", "handles[h-3]: $: "),
    "not-a-blob": ("record = 3", "handles[h-3]: $: Expected bytes, got int"),
    "field-type": (
        "record = json_set(record, '$.created_at', 'noon')",
        "handles[h-3]: $.created_at: Expected float, got str",
    ),
    "status-unknown": (
        "record = json_set(record, '$.status', 'paused')",
        "handles[h-3]: $.status: Invalid enum value 'paused'",
    ),
    "status-column": (
        "status = 'paused'",
        "handles[h-3]: $.status: the record says 'active', the status column says 'paused'",
    ),
    "key-differs": (
        "record = json_set(record, '$.handle_id', 'h-9')",
        "handles[h-3]: $.handle_id: the record says 'h-9', the handle_id column says 'h-3'",
    ),
    "owner-column": (
        "owner = CAST('lead' AS BLOB)",  # the right bytes, as a blob: not the owner's text
        "handles[h-3]: $.owner: the record says 'lead', the owner column says b'lead'",
    ),
    "rule-broken": (
        "record = json_set(record, '$.reason', 'early')",
        "handles[h-3]: $.reason: an active handle has none",
    ),
}


DAMAGED_ROW = "SELECT * FROM handles WHERE handle_id = 'h-3'"


@pytest.mark.parametrize("damage", sorted(DAMAGES))
async def test_a_damaged_handle_row_is_reported_with_its_key_and_field_and_skipped(
    tmp_path: Path, damage: str
) -> None:
    path = tmp_path / "h.db"
    edit, detail = DAMAGES[damage]
    async with SqliteStore(path) as store:
        await commit(store, "lead", handles=[ACTIVE, SETTLED])
    with plain_sqlite(path) as conn:
        conn.execute(f"UPDATE handles SET {edit} WHERE handle_id = 'h-3'")
        stored = conn.execute(DAMAGED_ROW).fetchall()
    async with SqliteStore(path) as store:
        query = await store.handles()
        assert query.records == (SETTLED,)
        [(key, said)] = query.corrupt
        assert key == "h-3"
        assert said.startswith(detail), said
        assert "\n" not in said
        # Another handle is still written; the damaged row stays as it was.
        await commit(store, "scout", handles=[msgspec.structs.replace(ACTIVE, handle_id="h-5")])
        assert [r.handle_id for r in (await store.handles(owner="lead")).records] == ["h-5", "h-7"]
    with plain_sqlite(path) as conn:
        assert conn.execute(DAMAGED_ROW).fetchall() == stored


async def test_a_version_3_store_migrates_keeping_its_receipts_and_takes_handles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    known = _sqlite.migrations()
    assert [m.name for m in known][3] == "0004_handles.sql"
    with monkeypatch.context() as patched:  # a store as the code before migration 0004 made it
        patched.setattr(_sqlite, "migrations", lambda: known[:3])
        async with SqliteStore(path) as store:
            await put_receipts(store, STUCK)
    with plain_sqlite(path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(3,)]
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
        assert "handles" not in tables
    async with SqliteStore(path) as store:  # migrates to the newest
        assert await receipt(store, STUCK.op_id) == STUCK
        assert (await store.handles()).records == ()
        await commit(store, "lead", handles=[SETTLED])
    async with SqliteStore(path, readonly=True) as store:
        assert (await store.handles(target="scout")).records == (SETTLED,)
    with plain_sqlite(path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(len(known),)]
        plan = conn.execute(
            "EXPLAIN QUERY PLAN SELECT record FROM handles WHERE owner = 'lead'"
        ).fetchall()
        assert "handles_owner" in str(plan)
        assert conn.execute("SELECT handle_id, owner, target, status FROM handles").fetchall() == [
            ("h-7", "lead", "scout", "completed")
        ]
