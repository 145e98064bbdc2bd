"""The session's partial in SQLite (B4): table ``partial_parts``, its statements, damage, 0007.

Damage is made with raw SQL on a closed store (``plain_sqlite``). A damaged part never fails
``load``: it is logged naming ``partial_parts[session/stream/position]`` and its stream's
parts stop there (a gap), so a damaged partial is never read as whole.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import aiosqlite
import anyio
import pytest

from agent_session.cli import main
from persistence import (
    MigrationRequired,
    SqliteStore,
    StoredPartial,
    UsageError,
    _connection,
    _sqlite,
)
from tests.store_kit import commit, history, receipt

from .helpers import plain_sqlite, row, session
from .test_partial_store import FIRST, SECOND, P, chunk, op, partials

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable
    from pathlib import Path

KNOWN = _sqlite.migrations()
NEWEST = len(KNOWN)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "p.db"


async def seeded(path: Path, *parts: bytes) -> None:
    """A closed store: session lead, FIRST's parts ``parts`` from position 0, SECOND's P[4]."""
    async with SqliteStore(path) as store:
        await commit(store, "lead", create=session("lead"), partial=chunk(FIRST, 0, *parts))
        await commit(store, "lead", partial=chunk(SECOND, 0, P[4]))


async def test_b4_gap_stops_the_read_of_a_position_deleted_by_hand(db: Path) -> None:
    await seeded(db, *P[:4])
    with plain_sqlite(db) as conn:
        conn.execute("DELETE FROM partial_parts WHERE stream = ? AND position = 2", (FIRST,))
    async with SqliteStore(db, readonly=True) as store:
        assert await partials(store) == (
            StoredPartial(stream=FIRST, parts=(P[0], P[1]), gap=2),
            StoredPartial(stream=SECOND, parts=(P[4],)),
        )


#: Hand damage to FIRST's parts 0..3, what load then reads of FIRST, and what the log names.
DAMAGES = {
    "position-text": (
        "UPDATE partial_parts SET position = 'x' WHERE stream = 'lead/9' AND position = 2",
        StoredPartial(stream=FIRST, parts=P[:2], gap=2),
        "partial_parts[lead/lead/9/x]: $.position: 'x' is not a position",
    ),
    "position-real": (
        "UPDATE partial_parts SET position = 1.5 WHERE stream = 'lead/9' AND position = 1",
        StoredPartial(stream=FIRST, parts=P[:1], gap=1),
        "partial_parts[lead/lead/9/1.5]: $.position: 1.5 is not a position",
    ),
    "position-negative": (
        "UPDATE partial_parts SET position = -1 WHERE stream = 'lead/9' AND position = 0",
        StoredPartial(stream=FIRST, parts=(), gap=0),
        "partial_parts[lead/lead/9/-1]: $.position: -1 is not a position",
    ),
    "extra-row-unplaced": (  # every position is there: the damaged row still marks a gap
        "INSERT INTO partial_parts VALUES ('lead', 'lead/9', 'end', x'00')",
        StoredPartial(stream=FIRST, parts=P[:4], gap=4),
        "partial_parts[lead/lead/9/end]: $.position",
    ),
    "body-text": (
        "UPDATE partial_parts SET body = 'plain' WHERE stream = 'lead/9' AND position = 3",
        StoredPartial(stream=FIRST, parts=P[:3], gap=3),
        "partial_parts[lead/lead/9/3]: $.body: str, not a blob",
    ),
    "body-not-utf8-text": (
        "UPDATE partial_parts SET body = CAST(x'ff61' AS TEXT) "
        "WHERE stream = 'lead/9' AND position = 1",
        StoredPartial(stream=FIRST, parts=P[:1], gap=1),
        "partial_parts[lead/lead/9/1]: $.body: NotUtf8, not a blob",
    ),
}


@pytest.mark.parametrize("case", list(DAMAGES))
async def test_b4_a_damaged_part_is_a_gap_and_is_logged(
    db: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    await seeded(db, *P[:4])
    sql, first, said = DAMAGES[case]
    with plain_sqlite(db) as conn:
        conn.execute(sql)
    caplog.set_level(logging.ERROR, logger="turnkeeper.persistence")
    async with SqliteStore(db) as store:
        loaded = await store.load("lead")
        assert loaded is not None
        assert loaded.partials == (first, StoredPartial(stream=SECOND, parts=(P[4],)))
        assert loaded.record == session("lead")
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert errors[0].startswith(said), errors
    with plain_sqlite(db) as conn:  # nothing stored was changed
        assert conn.execute("SELECT count(*) FROM partial_parts").fetchone()[0] == (
            6 if case == "extra-row-unplaced" else 5
        )


async def test_b4_a_part_whose_stream_is_not_text_is_skipped_and_logged(
    db: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await seeded(db, P[0])
    with plain_sqlite(db) as conn:
        conn.execute("UPDATE partial_parts SET stream = x'6c65' WHERE stream = ?", (SECOND,))
    caplog.set_level(logging.ERROR, logger="turnkeeper.persistence")
    async with SqliteStore(db, readonly=True) as store:
        assert await partials(store) == (StoredPartial(stream=FIRST, parts=(P[0],)),)
    [said] = [r.getMessage() for r in caplog.records]
    assert said.startswith("partial_parts[lead/b'le'/0]: $.stream: not text"), said


# -- statements and calls ---------------------------------------------------------------------


class Trace:
    """aiosqlite calls (thread hops) and the statements SQLite ran, from ``start()`` on."""

    def __init__(self) -> None:
        self.hops = 0
        self.statements: list[str] = []

    def verbs(self) -> list[str]:
        """Each statement's first words (``INSERT INTO partial_parts``), BEGIN/COMMIT cut off."""
        inner = self.statements[1:-1]
        return [" ".join(s.split()[:3]) if s.startswith(("INSERT", "DELETE")) else s for s in inner]


@pytest.fixture
async def traced(db: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Any, Trace]]:
    """An open store on ``db`` (session lead made) and a trace that starts empty."""
    trace = Trace()
    real: Callable[..., Awaitable[Any]] = aiosqlite.Connection._execute

    async def counting(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        trace.hops += 1
        return await real(self, fn, *args, **kwargs)

    async with SqliteStore(db) as store:
        await commit(store, "lead", create=session("lead"))
        assert store._db is not None
        await store._db.set_trace_callback(trace.statements.append)
        monkeypatch.setattr(aiosqlite.Connection, "_execute", counting)
        trace.statements.clear()
        yield store, trace


async def test_b4_receipt_and_chunk_are_one_call_in_one_savepoint(
    traced: tuple[Any, Trace],
) -> None:
    store, trace = traced
    await commit(store, "lead", operations=[op(1)], partial=chunk(FIRST, 0, P[0]))
    assert trace.hops == 1
    assert trace.statements[0] == "BEGIN IMMEDIATE"
    assert trace.statements[-1] == "COMMIT"
    assert trace.verbs() == [
        "SAVEPOINT boundary",
        "INSERT INTO operations",
        "INSERT INTO partial_parts",
        "RELEASE boundary",
    ]


async def test_b4_a_lone_part_runs_bare_and_drops_run_before_the_chunk(
    traced: tuple[Any, Trace],
) -> None:
    store, trace = traced
    await commit(store, "lead", partial=chunk(FIRST, 0, P[0]))
    assert trace.verbs() == ["INSERT INTO partial_parts"]
    trace.statements.clear()
    answer = row(2, "lead:r2", sid="lead")
    await commit(
        store, "lead", rows=[answer], drop_partials=[FIRST, SECOND], partial=chunk(SECOND, 0, *P)
    )
    assert trace.verbs() == [
        "SAVEPOINT boundary",
        "INSERT INTO history_rows",
        *["DELETE FROM partial_parts"] * 2,
        *["INSERT INTO partial_parts"] * len(P),
        "RELEASE boundary",
    ]
    assert trace.hops == 2


async def test_b4_a_failed_chunk_write_rolls_back_its_whole_boundary(db: Path) -> None:
    """Fault injected in the chunk's own statement (a trigger): its receipts, rows go too."""
    async with SqliteStore(db) as store:
        await commit(store, "lead", create=session("lead"), partial=chunk(FIRST, 0, P[0]))
    with plain_sqlite(db) as conn:
        conn.execute(
            "CREATE TRIGGER fault BEFORE INSERT ON partial_parts WHEN NEW.position = 1 "
            "BEGIN SELECT RAISE(ABORT, 'injected fault'); END"
        )
    async with SqliteStore(db) as store:
        for rows in ([], [row(3, "lead:r3", sid="lead")]):
            with pytest.raises(UsageError, match="injected fault"):  # IntegrityError, translated
                await commit(
                    store,
                    "lead",
                    rows=rows,
                    operations=[op(2), op(3)],
                    drop_partials=[SECOND],
                    partial=chunk(FIRST, 0, b"new", P[1]),
                )
            assert await receipt(store, "lead/op2") is None
            assert await history(store, "lead") == []
            assert await partials(store) == (StoredPartial(stream=FIRST, parts=(P[0],)),)
        await commit(store, "lead", operations=[op(4)], partial=chunk(FIRST, 0, b"next"))
        assert await partials(store) == (StoredPartial(stream=FIRST, parts=(b"next",)),)


# -- migration 0007 -----------------------------------------------------------------------------


async def schema_6_store(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store as the code before migration 0007 made it: a session, a row, a receipt."""
    assert KNOWN[6].name == "0007_partials.sql"
    with monkeypatch.context() as patched:
        patched.setattr(_sqlite, "migrations", lambda: KNOWN[:6])
        async with SqliteStore(path) as store:
            await commit(
                store,
                "lead",
                create=session("lead"),
                rows=[row(1, "lead:r1", sid="lead")],
                operations=[op(1)],
            )
    with plain_sqlite(path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(6,)]


async def test_b4_a_schema_6_store_gets_0007_in_one_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    await schema_6_store(path, monkeypatch)
    with pytest.raises(MigrationRequired) as caught:
        await SqliteStore(path, readonly=True).open()
    assert (caught.value.found, caught.value.supported) == (6, NEWEST)
    statements: list[str] = []
    real = _connection.connect

    async def traced(database: str, *, uri: bool = False) -> object:
        conn = await real(database, uri=uri)
        await conn.set_trace_callback(statements.append)
        return conn

    monkeypatch.setattr(_sqlite, "connect", traced)
    assert await SqliteStore.migrate(path) == (6, NEWEST)
    begin = statements.index("BEGIN IMMEDIATE")
    end = statements.index("COMMIT", begin)
    writes = [s for s in statements[begin + 1 : end] if not s.startswith("SELECT")]
    later = [statement for migration in KNOWN[6:] for statement in migration.statements]
    assert writes == [*later, f"UPDATE schema_version SET version = {NEWEST}"]
    monkeypatch.undo()
    async with SqliteStore(path) as store:
        assert await history(store, "lead") == [row(1, "lead:r1", sid="lead")]
        assert await receipt(store, "lead/op1") == op(1)
        await commit(store, "lead", operations=[op(2)], partial=chunk(FIRST, 0, P[2]))
        assert await partials(store) == (StoredPartial(stream=FIRST, parts=(P[2],)),)


def test_b4_inspect_refuses_a_schema_6_store_naming_migrate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    anyio.run(schema_6_store, path, monkeypatch)
    assert main(["inspect", "--db", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"turnkeeper inspect: {path} has schema version 6 and needs migrating to {NEWEST}; "
        f"read-only commands never migrate: run `turnkeeper migrate --db {path}`\n"
    )


# -- inspect ------------------------------------------------------------------------------------


def test_b4_inspect_shows_each_stored_partial_and_its_gap(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    anyio.run(seeded, db, *P[:4])
    with plain_sqlite(db) as conn:
        conn.execute("DELETE FROM partial_parts WHERE stream = ? AND position = 1", (FIRST,))
    assert main(["inspect", "--db", str(db)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if line.startswith("partial")] == [
        f"partial: stream {FIRST} of session lead, 1 part, gap at 1",
        f"partial: stream {SECOND} of session lead, 1 part",
    ]
    with plain_sqlite(db) as conn:
        conn.execute("INSERT INTO partial_parts VALUES ('lead', ?, 1, x'01')", (SECOND,))
    assert main(["inspect", "--db", str(db), "lead"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if line.startswith("partial")] == [
        f"partial: stream {FIRST} of session lead, 1 part, gap at 1",
        f"partial: stream {SECOND} of session lead, 2 parts",
    ]
