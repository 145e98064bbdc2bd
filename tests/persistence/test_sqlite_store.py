"""What only the SQLite store promises: its file, its PRAGMAs, its call count, its refusals.

Hand edits go through plain ``sqlite3`` (``plain_sqlite``); "left untouched" is checked by
comparing every file in the folder, byte for byte, before and after.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from typing import TYPE_CHECKING, Any

import aiosqlite
import anyio
import pytest

from persistence import (
    Boundary,
    CorruptRecord,
    CutState,
    CutStateChange,
    DamagedStore,
    MigrationRequired,
    NotATurnkeeperStore,
    OperationRecord,
    OpState,
    QueuedEntryRecord,
    QueueSnapshot,
    RowKind,
    SqliteStore,
    StaleOwner,
    StoreError,
    TurnkeeperError,
    UnsupportedSchemaVersion,
    UsageError,
    _migrations,
    _sqlite,
    _writes,
)
from tests.store_kit import commit, envelopes, history, owed, owner

from .helpers import client, cut, envelope, plain_sqlite, row, session, snapshot

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

CURRENT = _sqlite.schema_version()


def receipt(op_id: str) -> OperationRecord:
    return OperationRecord(
        op_id=op_id,
        session="s1",
        stream="s1/1",
        call_id="c1",
        capability=client("noop"),
        target="t",
        started_at=1.0,
        state=OpState.RUNNING,
    )


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "t.db"


async def make_store_file(path: Path) -> None:
    """A closed store holding one session with a user row and an owed cut row."""
    async with SqliteStore(path) as store:
        await commit(
            store,
            "s1",
            create=session(),
            rows=[row(1), row(2, "r7", kind=RowKind.ASSISTANT, cut=cut())],
            envelope=envelope(),
        )


def connection(store: SqliteStore) -> aiosqlite.Connection:
    """The store's own connection (tests only: to read PRAGMAs and trace statements)."""
    db = store._db
    assert db is not None
    return db


async def pragma(store: SqliteStore, statement: str) -> object:
    rows = list(await connection(store).execute_fetchall(statement))
    return rows[0][0]


# -- file set-up and PRAGMAs ------------------------------------------------------------------


async def test_a_new_store_is_created_in_wal_mode_with_foreign_keys_on(db_path: Path) -> None:
    async with SqliteStore(db_path) as store:
        assert await pragma(store, "PRAGMA journal_mode") == "wal"
        assert await pragma(store, "PRAGMA foreign_keys") == 1
        assert await pragma(store, "PRAGMA busy_timeout") == 5000
    with plain_sqlite(db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(CURRENT,)]


@pytest.mark.parametrize(("setting", "level"), [("NORMAL", 1), ("FULL", 2)])
async def test_the_synchronous_setting_is_applied(
    db_path: Path, setting: _sqlite.Synchronous, level: int
) -> None:
    async with SqliteStore(db_path, synchronous=setting) as store:
        assert await pragma(store, "PRAGMA synchronous") == level


def test_an_unknown_synchronous_setting_is_refused(db_path: Path) -> None:
    with pytest.raises(UsageError, match="synchronous"):
        SqliteStore(db_path, synchronous="OFF")  # type: ignore[arg-type]


async def test_an_empty_file_becomes_a_store(db_path: Path) -> None:
    await anyio.Path(db_path).write_bytes(b"")
    async with SqliteStore(db_path) as store:
        await commit(store, "s1", create=session())
        assert await store.sessions() == [session()]


async def test_a_new_store_survives_a_fresh_instance_on_the_same_file(db_path: Path) -> None:
    await make_store_file(db_path)
    async with SqliteStore(db_path, synchronous="FULL") as store:
        assert await store.sessions() == [session()]
        assert [r.row_id for r in await owed(store)] == ["r7"]
        assert await envelopes(store) == [envelope()]


async def test_a_missing_folder_is_refused_naming_it_and_nothing_is_made(tmp_path: Path) -> None:
    with pytest.raises(NotATurnkeeperStore, match=r"the folder .*/no/such does not exist"):
        await SqliteStore(tmp_path / "no" / "such" / "t.db").open()
    assert os.listdir(tmp_path) == []


async def test_a_directory_is_refused_before_a_lock_file_is_made_beside_it(tmp_path: Path) -> None:
    (tmp_path / "d.db").mkdir()
    for readonly in (False, True):
        with pytest.raises(
            NotATurnkeeperStore, match=r"d\.db is not a turnkeeper store: it is a directory"
        ):
            await SqliteStore(tmp_path / "d.db", readonly=readonly).open()
    assert os.listdir(tmp_path) == ["d.db"]


# -- refusing files that are not (this version of) a turnkeeper store -------------------------


async def test_a_file_that_is_not_sqlite_is_refused_and_left_byte_identical(
    tmp_path: Path, db_path: Path
) -> None:
    await anyio.Path(db_path).write_bytes(b"hello")
    before = snapshot(tmp_path)
    with pytest.raises(NotATurnkeeperStore, match="not a SQLite database") as caught:
        await SqliteStore(db_path).open()
    assert caught.value.path == str(db_path)
    assert snapshot(tmp_path) == before


async def test_a_foreign_sqlite_database_is_refused_and_left_byte_identical(
    tmp_path: Path, db_path: Path
) -> None:
    with plain_sqlite(db_path) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('mine')")
    before = snapshot(tmp_path)
    with pytest.raises(NotATurnkeeperStore, match="without turnkeeper's schema_version table"):
        await SqliteStore(db_path).open()
    assert snapshot(tmp_path) == before
    with plain_sqlite(db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)


async def test_a_newer_schema_version_is_refused_and_left_untouched(
    tmp_path: Path, db_path: Path
) -> None:
    await make_store_file(db_path)
    with plain_sqlite(db_path) as conn:
        conn.execute("UPDATE schema_version SET version = 99")
    before = snapshot(tmp_path)
    with pytest.raises(UnsupportedSchemaVersion, match="schema version 99") as caught:
        await SqliteStore(db_path).open()
    assert (caught.value.found, caught.value.supported) == (99, CURRENT)
    assert snapshot(tmp_path) == before
    # A read-only open refuses it too. (SQLite's WAL reader may leave an empty -wal and a
    # -shm index beside the file; the database file itself is untouched.)
    with pytest.raises(UnsupportedSchemaVersion):
        await SqliteStore(db_path, readonly=True).open()
    assert snapshot(tmp_path)[db_path.name] == before[db_path.name]


@pytest.fixture
def second_migration(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Pretend the code knows a migration 0002 with the given SQL."""
    known = _sqlite.migrations()

    def install(sql: str) -> None:
        extra = _migrations.Migration(
            CURRENT + 1, "9999_test.sql", _migrations.split_statements(sql)
        )
        monkeypatch.setattr(_sqlite, "migrations", lambda: (*known, extra))

    return install


async def test_an_older_schema_is_migrated_in_one_transaction(
    db_path: Path, second_migration: Callable[[str], None]
) -> None:
    await make_store_file(db_path)
    second_migration(
        "CREATE TABLE extra_receipts (id TEXT PRIMARY KEY);\n"
        "-- a comment between statements\n"
        "INSERT INTO extra_receipts VALUES ('x');\n"
    )
    async with SqliteStore(db_path) as store:
        assert [r.row_id for r in await history(store)] == ["r1", "r7"]
    with plain_sqlite(db_path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(CURRENT + 1,)]
        assert conn.execute("SELECT id FROM extra_receipts").fetchall() == [("x",)]


async def test_a_failing_migration_leaves_the_store_at_its_old_version(
    tmp_path: Path, db_path: Path, second_migration: Callable[[str], None]
) -> None:
    await make_store_file(db_path)
    before = snapshot(tmp_path)
    second_migration("CREATE TABLE extra_receipts (id TEXT);\nINSERT INTO nowhere VALUES (1);\n")
    with pytest.raises(StoreError, match="no such table: nowhere"):
        await SqliteStore(db_path).open()
    with plain_sqlite(db_path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(CURRENT,)]
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
        assert "extra_receipts" not in tables
    assert snapshot(tmp_path).keys() == before.keys()


async def test_readonly_refuses_a_store_that_needs_migrating_and_leaves_it_untouched(
    tmp_path: Path, db_path: Path, second_migration: Callable[[str], None]
) -> None:
    await make_store_file(db_path)
    second_migration("CREATE TABLE extra_receipts (id TEXT);\n")
    before = snapshot(tmp_path)
    with pytest.raises(
        MigrationRequired, match=f"version {CURRENT} and needs migrating to {CURRENT + 1}"
    ):
        await SqliteStore(db_path, readonly=True).open()
    assert snapshot(tmp_path)[db_path.name] == before[db_path.name]


def test_migrations_are_numbered_from_one_without_gaps() -> None:
    found = _sqlite.migrations()
    assert [m.version for m in found] == list(range(1, len(found) + 1))
    assert found[0].name == "0001_init.sql"
    assert any("history_rows_cut_state" in statement for statement in found[0].statements)


def test_split_statements_refuses_an_incomplete_statement() -> None:
    assert _migrations.split_statements("SELECT 1;\n-- trailing comment\n") == ("SELECT 1;",)
    with pytest.raises(ValueError, match="incomplete"):
        _migrations.split_statements("SELECT 1;\nCREATE TABLE t (x\n")


# -- read-only ----------------------------------------------------------------------------------


async def test_readonly_reads_everything_and_refuses_every_write(
    tmp_path: Path, db_path: Path
) -> None:
    await make_store_file(db_path)
    before = snapshot(tmp_path)[db_path.name]
    async with SqliteStore(db_path, readonly=True) as store:
        assert store.owner is None  # a read-only store owns nothing
        assert await store.sessions() == [session()]
        assert [r.row_id for r in await history(store)] == ["r1", "r7"]
        assert [r.row_id for r in (await store.scan_recoverable()).cuts[0].owed] == ["r7"]
        assert await envelopes(store) == [envelope()]
        boundaries = [
            Boundary(create=session("s2")),
            Boundary(rows=(row(3),)),
            Boundary(delete=("r1",)),
            Boundary(cut_states=(CutStateChange(row_id="r7", state=CutState.VOIDED),)),
            Boundary(envelope=envelope("st2")),
            Boundary(),
        ]
        for boundary in boundaries:
            for token in (None, "any-token"):
                with pytest.raises(UsageError, match="read-only"):
                    await store.commit("s2" if boundary.create else "s1", boundary, owner=token)
        # Even a statement slipped past the store's own check is refused by SQLite.
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            await connection(store).execute("DELETE FROM history_rows")
    assert snapshot(tmp_path)[db_path.name] == before


@pytest.mark.parametrize("content", [None, b""], ids=["missing", "empty"])
async def test_readonly_never_creates_a_store(
    tmp_path: Path, db_path: Path, content: bytes | None
) -> None:
    if content is not None:
        await anyio.Path(db_path).write_bytes(content)
    before = snapshot(tmp_path)
    with pytest.raises(NotATurnkeeperStore):
        await SqliteStore(db_path, readonly=True).open()
    assert snapshot(tmp_path) == before


async def test_readonly_refuses_a_file_that_is_not_sqlite(tmp_path: Path, db_path: Path) -> None:
    await anyio.Path(db_path).write_bytes(b"hello")
    before = snapshot(tmp_path)
    with pytest.raises(NotATurnkeeperStore, match="not a SQLite database"):
        await SqliteStore(db_path, readonly=True).open()
    assert snapshot(tmp_path) == before


# -- the cost of a durable write ----------------------------------------------------------------


class Calls:
    """Every aiosqlite call (one thread hop each) and every statement SQLite ran."""

    def __init__(self) -> None:
        self.hops: list[str] = []
        self.statements: list[str] = []

    def reset(self) -> None:
        self.hops.clear()
        self.statements.clear()


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Count aiosqlite's thread hops: wrap the one method every aiosqlite call goes through."""
    seen = Calls()
    real: Callable[..., Awaitable[Any]] = aiosqlite.Connection._execute

    async def counting(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        seen.hops.append(getattr(fn, "__name__", repr(fn)))
        return await real(self, fn, *args, **kwargs)

    monkeypatch.setattr(aiosqlite.Connection, "_execute", counting)
    return seen


async def traced(store: SqliteStore, calls: Calls) -> None:
    await connection(store).set_trace_callback(calls.statements.append)
    calls.reset()


async def test_a_single_row_commit_is_one_aiosqlite_call_and_one_insert(
    db_path: Path, calls: Calls
) -> None:
    async with SqliteStore(db_path) as store:
        await commit(store, "s1", create=session())
        await traced(store, calls)
        await commit(store, "s1", rows=[row(1)])
        assert calls.hops == ["_run_batch"]
        assert len(calls.statements) == 3
        assert (calls.statements[0], calls.statements[-1]) == ("BEGIN IMMEDIATE", "COMMIT")
        assert calls.statements[1].startswith("INSERT INTO history_rows")
        assert await history(store) == [row(1)]


@pytest.mark.parametrize(
    ("name", "boundary"),
    [
        ("cut_states", Boundary(cut_states=(CutStateChange(row_id="r7", state=CutState.VOIDED),))),
        ("delete", Boundary(delete=("r1", "r7"))),
        ("envelope", Boundary(envelope=envelope("st2"))),
        ("create", Boundary(create=session("s2"))),
        ("operations", Boundary(operations=(receipt("s1/1/1/0"),))),
    ],
)
async def test_each_single_statement_boundary_is_one_aiosqlite_call(
    db_path: Path, calls: Calls, name: str, boundary: Boundary
) -> None:
    await make_store_file(db_path)
    async with SqliteStore(db_path) as store:
        await traced(store, calls)
        await store.commit("s2" if boundary.create else "s1", boundary, owner=owner(store))
        assert calls.hops == ["_run_batch"], name
        assert len(calls.statements) == 3, name
        assert (calls.statements[0], calls.statements[-1]) == ("BEGIN IMMEDIATE", "COMMIT")


async def test_an_empty_boundary_costs_no_aiosqlite_call(db_path: Path, calls: Calls) -> None:
    async with SqliteStore(db_path) as store:
        calls.reset()
        await store.commit("s1", Boundary(), owner=owner(store))
        assert calls.hops == []


async def test_a_boundary_of_every_part_is_one_immediate_transaction(
    db_path: Path, calls: Calls
) -> None:
    await make_store_file(db_path)
    async with SqliteStore(db_path) as store:
        await traced(store, calls)
        done = await commit(
            store,
            "s1",
            create=session(),
            delete=["r1"],
            rows=[row(n, f"n{n}") for n in range(3, 8)],
            cut_states=[("r7", CutState.CONSUMED)],
            envelope=envelope("st2"),
            operations=[receipt("s1/2/1/0"), receipt("s1/2/1/1")],
        )
        assert done.deleted == 1
        assert calls.hops == ["_run_batch"]
        assert calls.statements[0] == "BEGIN IMMEDIATE"
        assert calls.statements[1] == "SAVEPOINT boundary"
        assert calls.statements[-2:] == ["RELEASE boundary", "COMMIT"]
        assert sum(s.startswith("INSERT INTO history_rows") for s in calls.statements) == 5
        assert [r.seq for r in await history(store)] == [2, 3, 4, 5, 6, 7]


async def test_a_queue_boundary_is_one_call_in_a_savepoint_with_the_guard_first(
    db_path: Path, calls: Calls
) -> None:
    await make_store_file(db_path)
    first, second = (
        QueuedEntryRecord(session="s1", entry_id=f"q{n}", position=n, kind="wake", body=b"{}")
        for n in (3, 5)
    )
    async with SqliteStore(db_path) as store:
        await commit(store, "s1", queue=QueueSnapshot(version=2, entries=(first,)))
        await traced(store, calls)
        queue = QueueSnapshot(version=3, entries=(first, second))
        await commit(store, "s1", rows=[row(8)], queue=queue)
        assert calls.hops == ["_run_batch"]
        assert calls.statements[:2] == ["BEGIN IMMEDIATE", "SAVEPOINT boundary"]
        assert [s.split(" ")[:3] for s in calls.statements[2:-2]] == [
            ["INSERT", "INTO", "history_rows"],
            ["INSERT", "INTO", "queue_versions"],  # the guard, first
            ["DELETE", "FROM", "queued_entries"],
            ["INSERT", "INTO", "queued_entries"],
            ["INSERT", "INTO", "queued_entries"],
        ]
        assert calls.statements[-2:] == ["RELEASE boundary", "COMMIT"]
        calls.reset()
        stale = QueueSnapshot(version=3, entries=(second,))
        await commit(store, "s1", queue=stale)
        assert [s.split(" ")[:3] for s in calls.statements[2:-2]] == [
            ["INSERT", "INTO", "queue_versions"]  # refused by its own WHERE: nothing else runs
        ]
        loaded = await store.load("s1")
        assert loaded is not None
        assert (loaded.queue, loaded.queue_version) == ((first, second), 3)


async def test_a_refused_boundary_is_rolled_back(db_path: Path, calls: Calls) -> None:
    async with SqliteStore(db_path) as store:
        await commit(store, "s1", create=session(), rows=[row(3)])
        await traced(store, calls)
        with pytest.raises(UsageError, match="s1/r3"):
            await commit(store, "s1", rows=[row(1), row(2), row(3)], envelope=envelope())
        assert "ROLLBACK TO boundary" in calls.statements  # its savepoint
        assert not connection(store).in_transaction
        assert [r.seq for r in await history(store)] == [3]
        assert await envelopes(store) == []


#: One boundary of each job shape the store runs (``_writes.commit``): the lone statements
#: that skip the plan, a receipt alone, and a plan of several statements.
_SHAPES = {
    "row": Boundary(rows=(row(2, "r2"),)),
    "envelope": Boundary(envelope=envelope("st2")),
    "cut_state": Boundary(cut_states=(CutStateChange(row_id="r1", state=CutState.VOIDED),)),
    "receipt": Boundary(operations=(receipt("op-9"),)),
    "plan": Boundary(rows=(row(2, "r2"),), envelope=envelope("st2")),
}


@pytest.mark.parametrize("shape", list(_SHAPES))
async def test_the_owner_is_checked_again_inside_the_transaction(db_path: Path, shape: str) -> None:
    # The fence runs on the connection's thread, in the transaction that would hold the
    # write: an owner that changed after the call was made is refused there, writing nothing.
    async with SqliteStore(db_path) as store:
        await commit(
            store, "s1", create=session(), rows=[row(1, kind=RowKind.ASSISTANT, cut=cut())]
        )
        before = await _contents(store)
        token = owner(store)
        held = store._held
        assert held is not None

        def new_owner_on_begin(statement: str) -> None:  # runs on aiosqlite's thread
            if statement == "BEGIN IMMEDIATE":
                held.owner = "the-next-owner"

        await connection(store).set_trace_callback(new_owner_on_begin)
        with pytest.raises(StaleOwner):
            await store.commit("s1", _SHAPES[shape], owner=token)
        await connection(store).set_trace_callback(lambda _: None)
        assert not connection(store).in_transaction
        assert await _contents(store) == before


async def _contents(store: SqliteStore) -> tuple[object, ...]:
    return (await history(store), await envelopes(store), (await store.receipts()).records)


async def test_a_boundary_cancelled_mid_transaction_still_commits_whole(
    db_path: Path,
) -> None:
    loop = asyncio.get_running_loop()
    async with SqliteStore(db_path) as store:
        await commit(store, "s1", create=session())
        with anyio.CancelScope() as scope:

            def cancel_on_begin(statement: str) -> None:  # runs on aiosqlite's thread
                if statement == "BEGIN IMMEDIATE":
                    loop.call_soon_threadsafe(scope.cancel)

            await connection(store).set_trace_callback(cancel_on_begin)
            await commit(store, "s1", rows=[row(n) for n in range(1, 6)])
            await anyio.lowlevel.checkpoint()
        assert scope.cancelled_caught
        await connection(store).set_trace_callback(lambda _: None)
        assert [r.seq for r in await history(store)] == [1, 2, 3, 4, 5]
        assert not connection(store).in_transaction
        await commit(store, "s1", rows=[row(9)])
    async with SqliteStore(db_path) as store:  # nothing was left in an open transaction
        assert [r.seq for r in await history(store)] == [1, 2, 3, 4, 5, 9]


async def test_the_recovery_scan_reads_owed_rows_through_the_partial_cut_state_index(
    db_path: Path,
) -> None:
    await make_store_file(db_path)
    with plain_sqlite(db_path) as conn:
        for sql in (_writes.SCAN_OWED, _writes.SCAN_TRAILING):
            plan = " ".join(str(step[3]) for step in conn.execute("EXPLAIN QUERY PLAN " + sql))
            assert "USING COVERING INDEX history_rows_cut_state" in plan or (
                "USING INDEX history_rows_cut_state" in plan
            ), plan
        plan = " ".join(
            str(step[3]) for step in conn.execute("EXPLAIN QUERY PLAN " + _writes.SCAN_OWED)
        )
        assert "SCAN" not in plan, plan  # only the owed rows are sorted, never a table read


# -- corrupt values are reported, never read as absent, never rewritten -------------------------


def corrupt(path: Path, sql: str, *params: object) -> bytes:
    """Apply a hand edit to the row s1/r7 and return the row's cut blob afterwards."""
    with plain_sqlite(path) as conn:
        conn.execute(sql, params)
        (blob,) = conn.execute(
            "SELECT cut FROM history_rows WHERE session = 's1' AND row_id = 'r7'"
        ).fetchone()
    return bytes(blob) if blob is not None else b""


VALID_CUT = b'{"remaining":3,"model":"beta","requested_model":"alpha","state":"owed"}'


@pytest.mark.parametrize(
    ("edit", "params", "detail"),
    [
        (
            "UPDATE history_rows SET cut = ? WHERE row_id = 'r7'",
            (b'{"remaining":"3","model":"beta","requested_model":"alpha","state":"owed"}',),
            "$.cut.remaining: Expected int, got str",
        ),
        (
            "UPDATE history_rows SET cut = ? WHERE row_id = 'r7'",
            (b'{"remaining":-1,"model":"beta","requested_model":"alpha","state":"owed"}',),
            "$.cut.remaining: Expected int >= 0",
        ),
        (
            "UPDATE history_rows SET cut = ? WHERE row_id = 'r7'",
            (b'{"remaining":3,"requested_model":"alpha","state":"owed"}',),
            "$.cut: Object missing required field model",
        ),
        (
            "UPDATE history_rows SET cut = ? WHERE row_id = 'r7'",
            (b'{"remaining":3,"model":"beta","requested_model":"alpha","state":"owed"',),
            "$.cut: Input data was truncated",
        ),
        (
            "UPDATE history_rows SET cut = ?, cut_state = 'bogus' WHERE row_id = 'r7'",
            (VALID_CUT.replace(b'"owed"', b'"bogus"'),),
            "$.cut_state: Invalid enum value 'bogus'",
        ),
        (
            "UPDATE history_rows SET kind = ? WHERE row_id = 'r7'",
            ("tool",),
            "$.kind: Invalid enum value 'tool'",
        ),
        (
            "UPDATE history_rows SET body = ? WHERE row_id = 'r7'",
            ("text, not bytes",),
            "$.body: Expected bytes, got str",
        ),
    ],
    ids=["type", "negative", "missing", "truncated", "state", "kind", "body"],
)
async def test_a_corrupt_row_raises_corrupt_record_and_stays_where_it_is(
    db_path: Path, edit: str, params: tuple[object, ...], detail: str
) -> None:
    await make_store_file(db_path)
    blob = corrupt(db_path, edit, *params)
    async with SqliteStore(db_path) as store:
        with pytest.raises(CorruptRecord) as caught:
            await store.load("s1")
        error = caught.value
        assert (error.table, error.key) == ("history_rows", "s1/r7")
        assert error.detail.startswith(detail), error.detail
        assert str(error).startswith(f"history_rows[s1/r7]: {detail}")
        assert isinstance(error, TurnkeeperError)
        if "cut_state" not in edit or "bogus" in edit:  # never read as "nothing owed"
            scan = await store.scan_recoverable()
            assert scan.cuts == ()
            assert [(sid, why.split(":")[0]) for sid, why in scan.corrupt] == [
                ("s1", "history_rows[s1/r7]")
            ]
        # The good row of another session still reads.
        await commit(store, "s2", create=session("s2"), rows=[row(1, sid="s2")])
        assert await history(store, "s2") == [row(1, sid="s2")]
    with plain_sqlite(db_path) as conn:
        rows = conn.execute("SELECT row_id, cut FROM history_rows WHERE session = 's1'").fetchall()
    assert [(row_id, bytes(cut_blob or b"")) for row_id, cut_blob in rows] == [
        ("r1", b""),
        ("r7", blob),
    ]


async def test_a_damaged_record_under_a_settled_cut_state_is_skipped_by_load_and_reported(
    db_path: Path,
) -> None:
    """The history is what a load serves: a cut that owes nothing is not needed for it."""
    await make_store_file(db_path)
    blob = corrupt(
        db_path, "UPDATE history_rows SET cut = x'7b', cut_state = 'voided' WHERE row_id = 'r7'"
    )
    async with SqliteStore(db_path) as store:
        loaded = await store.load("s1")
        assert loaded is not None
        assert [(r.row_id, r.cut) for r in loaded.rows] == [("r1", None), ("r7", None)]
        [(row_id, detail)] = loaded.corrupt
        assert row_id == "r7"
        assert detail.startswith("history_rows[s1/r7]: $.cut: "), detail
        assert (await store.scan_recoverable()).cuts == ()
    with plain_sqlite(db_path) as conn:
        assert conn.execute("SELECT cut FROM history_rows WHERE row_id = 'r7'").fetchone() == (
            blob,
        )


async def test_a_record_that_disagrees_with_an_owed_column_still_fails_the_load(
    db_path: Path,
) -> None:
    await make_store_file(db_path)
    corrupt(
        db_path,
        "UPDATE history_rows SET cut = ? WHERE row_id = 'r7'",
        VALID_CUT.replace(b'"owed"', b'"voided"'),
    )
    async with SqliteStore(db_path) as store:
        with pytest.raises(CorruptRecord, match=r"\$\.cut\.state: the record says 'voided'"):
            await store.load("s1")
        [(sid, detail)] = (await store.scan_recoverable()).corrupt
        assert (sid, detail.split(":")[0]) == ("s1", "history_rows[s1/r7]")


async def test_a_cut_state_on_a_cut_that_is_not_json_raises_and_writes_nothing(
    db_path: Path,
) -> None:
    await make_store_file(db_path)
    blob = corrupt(db_path, "UPDATE history_rows SET cut = ? WHERE row_id = 'r7'", b"{not json")
    async with SqliteStore(db_path) as store:
        with pytest.raises(CorruptRecord, match=r"history_rows\[s1/r7\]: \$\.cut: malformed JSON"):
            await commit(store, "s1", rows=[row(3)], cut_states=[("r7", CutState.VOIDED)])
    with plain_sqlite(db_path) as conn:
        assert conn.execute(
            "SELECT cut_state, cut FROM history_rows WHERE row_id = 'r7'"
        ).fetchone() == ("owed", blob)
        assert conn.execute("SELECT count(*) FROM history_rows").fetchone() == (2,)


async def test_a_corrupt_row_after_an_owed_cut_reports_its_session_corrupt(db_path: Path) -> None:
    # What follows the cut decides whether it is still owed (agent_session._recovery): a row
    # there that fails validation is never read as "nothing follows".
    await make_store_file(db_path)
    async with SqliteStore(db_path) as store:
        await commit(store, "s1", rows=[row(3, kind=RowKind.SENTINEL), row(4)])
    with plain_sqlite(db_path) as conn:
        conn.execute("UPDATE history_rows SET body = 'text' WHERE row_id = 'r4'")
    async with SqliteStore(db_path) as store:
        scan = await store.scan_recoverable()
    assert scan.cuts == ()
    assert scan.corrupt == (("s1", "history_rows[s1/r4]: $.body: Expected bytes, got str"),)


@pytest.mark.parametrize(
    ("table", "edit", "key", "detail"),
    [
        (
            "sessions",
            'UPDATE sessions SET record = CAST(\'{"id":"s1"}\' AS BLOB)',
            "s1",
            "$: Object missing required field model",
        ),
        (
            "sessions",
            'UPDATE sessions SET record = CAST(\'{"id":"s9","model":"a"}\' AS BLOB)',
            "s1",
            "$.id: the record says 's9'",
        ),
        (
            "turn_envelopes",
            'UPDATE turn_envelopes SET record = CAST(\'{"session":"s1"}\' AS BLOB)',
            "s1/st1",
            "$: Object missing required field stream",
        ),
    ],
    ids=["session", "session_id", "envelope"],
)
async def test_corrupt_sessions_and_envelopes_raise_corrupt_record(
    db_path: Path, table: str, edit: str, key: str, detail: str
) -> None:
    await make_store_file(db_path)
    corrupt(db_path, edit)
    async with SqliteStore(db_path) as store:
        if table == "sessions":  # skipped and reported, the others still listed
            listed = await store.sessions()
            assert list(listed) == []
            [(sid, why)] = listed.corrupt
            assert (sid, why) == (key, f"{table}[{key}]: {why.split(': ', 1)[1]}")
            assert why.split(": ", 1)[1].startswith(detail), why
        with pytest.raises(CorruptRecord) as caught:
            await store.load("s1")
        assert (caught.value.table, caught.value.key) == (table, key)
        assert caught.value.detail.startswith(detail), caught.value.detail
        assert caught.value.field == detail.split(":")[0]
        if table == "sessions":
            with pytest.raises(CorruptRecord):  # and nothing of the boundary is written
                await commit(store, "s1", create=session(), rows=[row(3)])
    with plain_sqlite(db_path) as conn:
        assert conn.execute("SELECT count(*) FROM history_rows").fetchone() == (2,)


async def test_a_corrupt_schema_version_is_reported(db_path: Path) -> None:
    await make_store_file(db_path)
    corrupt(db_path, "INSERT INTO schema_version VALUES (1)")
    before = snapshot(db_path.parent)
    for readonly in (False, True):
        with pytest.raises(
            DamagedStore, match=r"damaged turnkeeper store: schema_version\[version\]"
        ):
            await SqliteStore(db_path, readonly=readonly).open()
    assert snapshot(db_path.parent) == before


async def test_leaving_a_cancelled_scope_still_closes_the_store(db_path: Path) -> None:
    with anyio.CancelScope() as scope:
        async with SqliteStore(db_path) as store:
            await commit(store, "s1", create=session())
            scope.cancel()
            await anyio.lowlevel.checkpoint()
    assert scope.cancelled_caught
    assert store._db is None
    async with SqliteStore(db_path) as again:
        assert await again.sessions() == [session()]
