"""The auto-retry preference in SQLite (AS-32): table ``retry_settings``, damage, 0008.

Only "off" is stored: a row ``(session, 0)``; ``Boundary.auto_retry=True`` deletes it. A row
whose ``auto_retry`` is not 0 or 1 (a hand edit) is damage, and reads as off (fail safe: a
damaged preference never retries a turn the user may have switched it off for): ``load``
reports it in ``SessionLoad.corrupt`` under ``retry_settings``, the startup scan logs it at
ERROR and keeps the tail, with ``auto_retry`` false. The row is left as it is.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import aiosqlite
import pytest

from persistence import Boundary, MigrationRequired, SqliteStore, UsageError, _connection, _sqlite
from tests.store_kit import commit, history, owner, receipt

from .helpers import plain_sqlite, session
from .test_retry_pref_store import OFF, ON, op, preference, put, seeded
from .test_tails_store import lead, loaded, tail_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable
    from pathlib import Path

KNOWN = _sqlite.migrations()
NEWEST = len(KNOWN)
RAW = "SELECT session, auto_retry, typeof(auto_retry) FROM retry_settings ORDER BY session"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "r.db"


def stored(path: Path) -> list[tuple[Any, ...]]:
    """The ``retry_settings`` rows as stored (text as its bytes: it may not be UTF-8)."""
    with plain_sqlite(path) as conn:
        conn.text_factory = bytes
        return conn.execute(RAW).fetchall()


async def test_as32_off_is_one_row_and_on_deletes_it_surviving_reopens(db: Path) -> None:
    async with SqliteStore(db) as store:
        await seeded(store)
        await put(store, OFF)
    assert stored(db) == [(b"lead", 0, b"integer")]
    async with SqliteStore(db, readonly=True) as store:
        assert await preference(store) == (False, False)
    async with SqliteStore(db) as store:
        assert await preference(store) == (False, False)
        await put(store, OFF)  # stored again: still the one row
        assert stored(db) == [(b"lead", 0, b"integer")]
        await put(store, ON)
    assert stored(db) == []
    async with SqliteStore(db) as store:
        assert await preference(store) == (True, True)


async def test_as32_a_stored_1_reads_as_on(db: Path) -> None:
    """1 is in the column's range (an INTEGER 0/1); only a value outside it is damage."""
    async with SqliteStore(db) as store:
        await seeded(store)
    with plain_sqlite(db) as conn:
        conn.execute("INSERT INTO retry_settings VALUES ('lead', 1)")
    async with SqliteStore(db) as store:
        assert await preference(store) == (True, True)
        assert (await loaded(store)).corrupt == ()


#: Hand damage to lead's preference (nothing stored before it: "on"), and what a reader says.
DAMAGES = {
    "seven": ("7", "$.auto_retry: 7 is not 0 or 1"),
    "negative": ("-1", "$.auto_retry: -1 is not 0 or 1"),
    "text": ("'x'", "$.auto_retry: 'x' is not 0 or 1"),
    "real": ("0.5", "$.auto_retry: 0.5 is not 0 or 1"),
    "blob": ("x'00'", r"$.auto_retry: b'\x00' is not 0 or 1"),
    "text-not-utf8": (
        "CAST(x'ff' AS TEXT)",
        "$.auto_retry: <text that is not UTF-8, 1 bytes> is not 0 or 1",
    ),
}


@pytest.mark.parametrize("case", list(DAMAGES))
async def test_as32_a_damaged_preference_is_reported_read_as_off_and_kept(
    db: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    value, said = DAMAGES[case]
    async with SqliteStore(db) as store:
        await seeded(store)
    with plain_sqlite(db) as conn:
        conn.execute(f"INSERT INTO retry_settings VALUES ('lead', {value})")
    before = stored(db)
    detail = f"retry_settings[lead]: {said} (read as off)"
    caplog.set_level(logging.ERROR, logger="turnkeeper.persistence")
    async with SqliteStore(db, readonly=True) as store:
        found = await loaded(store)
        assert (found.auto_retry, found.corrupt) == (False, (("retry_settings", detail),))
        assert found.rows == (lead(3),)  # the rest of the session loads as usual
        assert not caplog.records  # load reports it in ``corrupt``
        scan = await store.scan_recoverable()
    assert scan.corrupt == ()  # the tail is kept, its recovery planned above storage
    [tail] = scan.tails
    assert (tail.session.id, tail.rows, tail.auto_retry) == ("lead", (lead(3),), False)
    assert [r.getMessage() for r in caplog.records] == [detail]
    assert stored(db) == before  # nothing stored was changed


async def test_as32_a_write_replaces_a_damaged_preference(db: Path) -> None:
    async with SqliteStore(db) as store:
        await seeded(store)
    with plain_sqlite(db) as conn:
        conn.execute("INSERT INTO retry_settings VALUES ('lead', 'x')")
    async with SqliteStore(db) as store:
        await put(store, OFF)
        assert stored(db) == [(b"lead", 0, b"integer")]
        await put(store, ON)
        assert await preference(store) == (True, True)
    assert stored(db) == []


async def test_as32_a_failed_preference_write_rolls_back_its_whole_boundary(db: Path) -> None:
    """Fault injected in the preference's own statement (a trigger): the row and receipt go."""
    async with SqliteStore(db) as store:
        await seeded(store)
    with plain_sqlite(db) as conn:
        conn.execute(
            "CREATE TRIGGER fault BEFORE INSERT ON retry_settings "
            "BEGIN SELECT RAISE(ABORT, 'injected fault'); END"
        )
    async with SqliteStore(db) as store:
        for boundary in (
            Boundary(rows=(lead(4),), operations=(op(1),), auto_retry=False),
            Boundary(operations=(op(1),), auto_retry=False),
        ):
            with pytest.raises(UsageError, match="injected fault"):
                await put(store, boundary)
            assert await history(store, "lead") == [lead(3)]
            assert await receipt(store, "lead/op1") is None
            assert await preference(store) == (True, True)


# -- statements and calls ---------------------------------------------------------------------


class Trace:
    """aiosqlite calls (thread hops) and the statements SQLite ran, from the fixture on."""

    def __init__(self) -> None:
        self.hops = 0
        self.statements: list[str] = []

    def verbs(self) -> list[str]:
        """Each write's first three words, the transaction's BEGIN and COMMIT cut off."""
        inner = self.statements[1:-1]
        return [" ".join(s.split()[:3]) for s in inner]

    def clear(self) -> None:
        self.hops, self.statements[:] = 0, []


@pytest.fixture
async def traced(db: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Any, Trace]]:
    """An open store on ``db`` (the ``lead`` tail seeded) and a trace that starts empty."""
    trace = Trace()
    real: Callable[..., Awaitable[Any]] = aiosqlite.Connection._execute

    async def counting(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        trace.hops += 1
        return await real(self, fn, *args, **kwargs)

    async with SqliteStore(db) as store:
        await seeded(store)
        assert store._db is not None
        await store._db.set_trace_callback(trace.statements.append)
        monkeypatch.setattr(aiosqlite.Connection, "_execute", counting)
        trace.clear()
        yield store, trace


async def test_as32_a_lone_preference_is_one_bare_statement_in_one_call(
    traced: tuple[Any, Trace],
) -> None:
    store, trace = traced
    await put(store, OFF)
    assert (trace.hops, trace.statements[0], trace.statements[-1]) == (
        1,
        "BEGIN IMMEDIATE",
        "COMMIT",
    )
    assert trace.verbs() == ["INSERT INTO retry_settings"]
    trace.clear()
    await put(store, ON)
    assert (trace.hops, trace.verbs()) == (1, ["DELETE FROM retry_settings"])


async def test_as32_receipts_with_a_preference_leave_the_receipts_short_path(
    traced: tuple[Any, Trace],
) -> None:
    store, trace = traced
    await put(store, Boundary(operations=(op(1),), auto_retry=False))
    assert trace.hops == 1
    assert trace.verbs() == [
        "SAVEPOINT boundary",
        "INSERT INTO operations",
        "INSERT INTO retry_settings",
        "RELEASE boundary",
    ]


async def test_as32_load_and_the_scan_read_the_preference_in_their_one_call(
    traced: tuple[Any, Trace],
) -> None:
    store, trace = traced
    await put(store, OFF)
    trace.clear()
    assert (await loaded(store)).auto_retry is False
    assert trace.hops == 1
    assert any("FROM retry_settings" in s for s in trace.statements)
    trace.clear()
    tail = await tail_of(store)
    assert tail is not None
    assert (tail.auto_retry, trace.hops) == (False, 1)
    assert any("FROM retry_settings" in s for s in trace.statements)


# -- migration 0008 -----------------------------------------------------------------------------


async def schema_7_store(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store as the code before migration 0008 made it: a tail, a receipt, an abandon marker."""
    assert KNOWN[7].name == "0008_retry_settings.sql"
    with monkeypatch.context() as patched:
        patched.setattr(_sqlite, "migrations", lambda: KNOWN[:7])
        async with SqliteStore(path) as store:
            await seeded(store)
            await commit(store, "lead", operations=[op(1)])
    with plain_sqlite(path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(7,)]


async def test_as32_a_schema_7_store_gets_0008_in_one_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    await schema_7_store(path, monkeypatch)
    with pytest.raises(MigrationRequired) as caught:
        await SqliteStore(path, readonly=True).open()
    assert (caught.value.found, caught.value.supported) == (7, NEWEST)
    statements: list[str] = []
    real = _connection.connect

    async def traced(database: str, *, uri: bool = False) -> object:
        conn = await real(database, uri=uri)
        await conn.set_trace_callback(statements.append)
        return conn

    monkeypatch.setattr(_sqlite, "connect", traced)
    async with SqliteStore(path) as store:  # a read-write open migrates
        assert await preference(store) == (True, True)
    begin = statements.index("BEGIN IMMEDIATE")
    end = statements.index("COMMIT", begin)
    writes = [s for s in statements[begin + 1 : end] if not s.startswith("SELECT")]
    assert writes == [*KNOWN[7].statements, f"UPDATE schema_version SET version = {NEWEST}"]
    assert not [s for s in statements[:begin] if s.startswith(("CREATE", "UPDATE", "INSERT"))]
    monkeypatch.undo()
    async with SqliteStore(path) as store:
        assert await history(store, "lead") == [lead(3)]
        assert await receipt(store, "lead/op1") == op(1)
        await put(store, OFF)
    async with SqliteStore(path, readonly=True) as store:
        assert await preference(store) == (False, False)


async def test_as32_retry_settings_refuses_a_row_of_an_unknown_session(db: Path) -> None:
    """The foreign key to ``sessions``: the store's own refusal, whatever the caller checked."""
    async with SqliteStore(db) as store:
        await commit(store, "lead", create=session("lead"))
        with pytest.raises(UsageError, match="unknown session 'ghost'"):
            await store.commit("ghost", OFF, owner=owner(store))
    assert stored(db) == []
