"""Tails and abandon markers in SQLite: damage reported and kept, one call, the indexes read.

Damage is made with raw SQL on a closed store (``plain_sqlite``). A damaged abandon marker is
never read as "no marker" (the engine would retry a turn given up): the scan reports its
session in ``corrupt`` and leaves it out of ``tails``, and ``load`` raises ``CorruptRecord``
naming ``abandon_markers[session]`` and the field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import aiosqlite
import pytest

from persistence import (
    CorruptRecord,
    MigrationRequired,
    QueueSnapshot,
    RowKind,
    SqliteStore,
    _sqlite,
    _writes,
)
from persistence.records import MAX_ABANDON_REASON_BYTES
from tests.store_kit import commit

from .helpers import cut, envelope, plain_sqlite, row, session
from .test_tails_store import GIVEN_UP, lead

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

#: Damage to lead's marker, and the start of what a reader must say about it. (A number in
#: these TEXT columns is stored as its text: only blobs and text can be damage there.)
DAMAGES = {
    "reason-empty": ("reason = ''", "$.reason: empty"),
    "reason-blob": ("reason = x'61626f72746564'", "$.reason: bytes, not text"),
    "reason-not-utf8": (
        "reason = CAST(x'61ff' AS TEXT)",
        "$.reason: <text that is not UTF-8, 2 bytes>, not text",
    ),
    "reason-too-long": (
        f"reason = printf('%.{MAX_ABANDON_REASON_BYTES + 1}c', 'r')",
        f"$.reason: {MAX_ABANDON_REASON_BYTES + 1:,} bytes, more than",
    ),
    "user-row-not-utf8": (
        "user_row = CAST(x'ff' AS TEXT)",
        "$.user_row: <text that is not UTF-8, 1 bytes>, not text",
    ),
    "user-row-blob": ("user_row = x'6c6561643a7233'", "$.user_row: bytes, not text"),
}
RAW = "SELECT * FROM abandon_markers WHERE session = 'lead'"


def raw(path: Path, sql: str = RAW) -> list[tuple[object, ...]]:
    """Rows as stored (text as its bytes: the damage may be text that is not UTF-8)."""
    with plain_sqlite(path) as conn:
        conn.text_factory = bytes
        return conn.execute(sql).fetchall()


async def a_tail(path: Path) -> None:
    """``lead`` ends on its user row ``lead:r3``, its marker ``GIVEN_UP``; ``scout`` likewise."""
    async with SqliteStore(path) as store:
        await commit(
            store, "lead", create=session("lead"), rows=[lead(1), lead(3)], abandon=GIVEN_UP
        )
        await commit(store, "scout", create=session("scout"), rows=[row(1, sid="scout")])


def damage(path: Path, sql: str) -> None:
    with plain_sqlite(path) as conn:
        conn.execute(sql)


@pytest.mark.parametrize("name", sorted(DAMAGES))
async def test_ps8_a_damaged_marker_is_reported_by_the_scan_and_load_and_kept(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / "t.db"
    edit, said = DAMAGES[name]
    await a_tail(path)
    damage(path, f"UPDATE abandon_markers SET {edit} WHERE session = 'lead'")
    stored = raw(path)
    async with SqliteStore(path) as store:
        scan = await store.scan_recoverable()
        [(sid, detail)] = scan.corrupt
        assert (sid, [t.session.id for t in scan.tails]) == ("lead", ["scout"])
        assert detail.startswith(f"abandon_markers[lead]: {said}"), detail
        assert len(detail) < 400  # a damaged value is shown cut, never whole
        with pytest.raises(CorruptRecord) as caught:
            await store.load("lead")
        error = caught.value
        field = said.split(":")[0]
        assert (error.table, error.key, error.field) == ("abandon_markers", "lead", field)
        assert str(error) == detail
        await commit(store, "lead", rows=[lead(4)])  # a later write leaves the marker as it is
    assert raw(path) == stored


async def test_ps8_a_damaged_marker_is_read_the_same_by_a_readonly_store(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    await a_tail(path)
    damage(path, "UPDATE abandon_markers SET user_row = x'39' WHERE session = 'lead'")
    async with SqliteStore(path, readonly=True) as store:
        scan = await store.scan_recoverable()
        assert [sid for sid, _ in scan.corrupt] == ["lead"]
        with pytest.raises(CorruptRecord, match=r"abandon_markers\[lead\]: \$\.user_row"):
            await store.load("lead")


async def test_ps8_a_new_marker_replaces_a_damaged_one(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    await a_tail(path)
    damage(path, "UPDATE abandon_markers SET reason = x'35' WHERE session = 'lead'")
    async with SqliteStore(path) as store:
        await commit(store, "lead", abandon=GIVEN_UP)
        loaded = await store.load("lead")
        assert loaded is not None
        assert loaded.abandon == GIVEN_UP
        assert (await store.scan_recoverable()).corrupt == ()


#: Damage to what a tail is built from, and the table its report names.
TAIL_DAMAGES = {
    "last-kind": (
        "UPDATE history_rows SET kind = 'robot' WHERE session = 'lead' AND seq = 3",
        "history_rows[lead/lead:r3]: $.kind",
    ),
    "tail-body": (
        "UPDATE history_rows SET body = 'text' WHERE session = 'lead' AND seq = 3",
        "history_rows[lead/lead:r3]: $.body",
    ),
    "session-record": ("UPDATE sessions SET record = x'7b' WHERE id = 'lead'", "sessions[lead]"),
    "queue-version": (
        "INSERT INTO queue_versions VALUES ('lead', 'three')",
        "queue_versions[lead]: $.version",
    ),
    "last-envelope": (
        "INSERT INTO turn_envelopes VALUES ('lead', 'lead/1', x'7b')",
        "turn_envelopes[lead/lead/1]",
    ),
}


@pytest.mark.parametrize("name", sorted(TAIL_DAMAGES))
async def test_ps4_a_damaged_value_of_a_tail_reports_its_session(tmp_path: Path, name: str) -> None:
    path = tmp_path / "t.db"
    edit, said = TAIL_DAMAGES[name]
    await a_tail(path)
    damage(path, edit)
    async with SqliteStore(path) as store:
        scan = await store.scan_recoverable()
        [(sid, detail)] = scan.corrupt
        assert (sid, [t.session.id for t in scan.tails]) == ("lead", ["scout"])
        assert detail.startswith(said), detail


async def test_ps6_a_damaged_queue_version_of_an_owed_session_is_reported(tmp_path: Path) -> None:
    """Read as 0 it would make every later snapshot of the recovered session stale."""
    path = tmp_path / "t.db"
    owed = row(2, sid="owing", kind=RowKind.ASSISTANT, cut=cut(remaining=2))
    async with SqliteStore(path) as store:
        await commit(
            store, "owing", create=session("owing"), rows=[owed], queue=QueueSnapshot(version=4)
        )
    damage(path, "UPDATE queue_versions SET version = 2.5")
    async with SqliteStore(path) as store:
        scan = await store.scan_recoverable()
        assert scan.cuts == ()
        [(sid, detail)] = scan.corrupt
        assert (sid, detail.split(": ")[0]) == ("owing", "queue_versions[owing]")


# -- one call, through the indexes --------------------------------------------------------------


async def test_ps4_the_scan_with_tails_is_one_aiosqlite_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.db"
    await a_tail(path)
    hops: list[str] = []
    real: Callable[..., Awaitable[Any]] = aiosqlite.Connection._execute

    async def counting(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(fn, "__name__", repr(fn)))
        return await real(self, fn, *args, **kwargs)

    for readonly in (False, True):
        async with SqliteStore(path, readonly=readonly) as store:
            monkeypatch.setattr(aiosqlite.Connection, "_execute", counting)
            scan = await store.scan_recoverable()
            monkeypatch.undo()
            assert len(hops) == 1, hops
            hops.clear()
            assert [t.session.id for t in scan.tails] == ["lead", "scout"]


def _plan(conn: Any, sql: str, *params: object) -> str:
    return " | ".join(str(step[3]) for step in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))


async def test_ps4_the_tails_are_found_without_reading_the_whole_history(tmp_path: Path) -> None:
    """Each session is classified by seeks of the primary key's index, never a table scan."""
    path = tmp_path / "t.db"
    await a_tail(path)
    async with SqliteStore(path) as store:
        await commit(store, "lead", envelope=envelope("lead/1", sid="lead"))
    named = '["lead", "scout"]'
    with plain_sqlite(path) as conn:
        plan = _plan(conn, _writes.SCAN_TAIL_ROWS)
        assert "MATERIALIZE tail" in plan, plan
        assert "SCAN h" not in plan, plan
        assert "SCAN history_rows" not in plan, plan
        assert plan.count("SEARCH h USING INDEX sqlite_autoindex_history_rows_1") == 3, plan
        for sql in (
            _writes.SCAN_TAIL_SESSIONS,
            _writes.SCAN_TAIL_STREAMS,
            _writes.SCAN_LAST_ENVELOPES,
            _writes.SCAN_VERSIONS,
            _writes.SCAN_ABANDON,
        ):
            plan = _plan(conn, sql, named)
            assert "SCAN json_each" in plan, (sql, plan)
            scans = [step for step in plan.split(" | ") if step.startswith("SCAN")]
            assert scans == ["SCAN json_each VIRTUAL TABLE INDEX 1:"], (sql, plan)


# -- migration 0006 -----------------------------------------------------------------------------


async def test_ps8_a_schema_5_store_gains_abandon_markers_keeping_what_it_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    known = _sqlite.migrations()
    assert [m.name for m in known][5] == "0006_abandon.sql"
    with monkeypatch.context() as patched:
        patched.setattr(_sqlite, "migrations", lambda: known[:5])
        async with SqliteStore(path) as store:
            await commit(
                store,
                "lead",
                create=session("lead"),
                rows=[lead(1), lead(3)],
                queue=QueueSnapshot(version=6),
            )
    with pytest.raises(MigrationRequired) as caught:
        await SqliteStore(path, readonly=True).open()
    assert (caught.value.found, caught.value.supported) == (5, len(known))
    async with SqliteStore(path) as store:
        [tail] = (await store.scan_recoverable()).tails
        assert (tail.rows, tail.queue_version, tail.abandon) == ((lead(3),), 6, None)
        await commit(store, "lead", abandon=GIVEN_UP)
    async with SqliteStore(path, readonly=True) as store:
        loaded = await store.load("lead")
        assert loaded is not None
        assert (loaded.rows, loaded.abandon) == ((lead(1), lead(3)), GIVEN_UP)


async def test_ps8_abandon_markers_lists_every_marker_and_reports_a_damaged_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.db"
    await a_tail(path)
    async with SqliteStore(path) as store:
        found = await store.abandon_markers()
        assert [sid for sid, _ in found.markers] == ["lead"]
        assert found.corrupt == ()
    damage(path, "UPDATE abandon_markers SET user_row = x'39' WHERE session = 'lead'")
    async with SqliteStore(path, readonly=True) as store:
        found = await store.abandon_markers()
    assert found.markers == ()
    [(sid, detail)] = found.corrupt
    assert (sid, detail.startswith("abandon_markers[lead]: $.user_row")) == ("lead", True)
