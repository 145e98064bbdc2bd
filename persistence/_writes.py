"""The SQLite store's writes, as plain functions run on the connection's own thread.

Each function is one *job*: it gets the ``sqlite3`` connection inside a transaction that
``_group`` opened (``BEGIN IMMEDIATE``) and either returns the facts its verb needs or raises.
Every job is all or nothing by itself: it writes with one statement (SQLite undoes a failed
statement entirely) or inside a savepoint of its own. So a job that raises has written nothing,
and the others in its transaction are committed. Jobs never commit: the transaction's owner
does, once, for every job in it, and only then tells anyone that their write is durable.

Jobs return raw facts (row counts, a stored row's shape) and leave interpreting them (decoding,
naming the error) to the verbs in ``_sqlite``, which run on the event loop.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import msgspec

from persistence import _checks
from persistence._errors import CorruptRecord, UsageError
from persistence.records import HistoryRow, OperationRecord

T = TypeVar("T")

#: A write: runs on the connection's thread, inside a transaction it must not end.
Job = Callable[[sqlite3.Connection], T]

_ENCODE = msgspec.json.Encoder().encode

INSERT_ROW = (
    "INSERT INTO history_rows (session, seq, row_id, kind, stream, cut_state, cut, body) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
UPDATE_ROW = (
    "UPDATE history_rows SET kind = ?, stream = ?, cut_state = ?, cut = ?, body = ? "
    "WHERE session = ? AND row_id = ? AND seq = ?"
)
DELETE_ROWS = (
    "DELETE FROM history_rows WHERE session = ? AND row_id IN (SELECT value FROM json_each(?))"
)
SET_CUT_STATE = (
    "UPDATE history_rows "
    "SET cut_state = ?, cut = CAST(json_set(CAST(cut AS TEXT), '$.state', ?) AS BLOB) "
    "WHERE session = ? AND row_id = ? AND cut IS NOT NULL"
)
SELECT_ROW_SHAPE = "SELECT seq, cut IS NOT NULL FROM history_rows WHERE session = ? AND row_id = ?"
SELECT_SEQ_HOLDER = "SELECT row_id FROM history_rows WHERE session = ? AND seq = ?"
INSERT_SESSION = "INSERT INTO sessions (id, record) VALUES (?, ?) ON CONFLICT (id) DO NOTHING"
SELECT_SESSION = "SELECT id, record FROM sessions WHERE id = ?"
PUT_ENVELOPE = (
    "INSERT INTO turn_envelopes (session, stream, record) VALUES (?, ?, ?) "
    "ON CONFLICT (session, stream) DO UPDATE SET record = excluded.record"
)
PUT_OPERATION = (
    "INSERT INTO operations (op_id, session, state, capability, target, record) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (op_id) DO UPDATE SET session = excluded.session, "
    "state = excluded.state, capability = excluded.capability, target = excluded.target, "
    "record = excluded.record"
)


def row_params(row: HistoryRow) -> tuple[object, ...]:
    """The INSERT parameters of a history row, in ``INSERT_ROW`` order."""
    cut = row.cut
    return (
        row.session,
        row.seq,
        row.row_id,
        row.kind.value,
        row.stream,
        None if cut is None else cut.state.value,
        None if cut is None else _ENCODE(cut),
        row.body,
    )


def operation_params(record: OperationRecord) -> tuple[object, ...]:
    """The upsert parameters of a receipt, in ``PUT_OPERATION`` order."""
    return (
        record.op_id,
        record.session,
        record.state.value,
        record.capability,
        record.target,
        _ENCODE(record),
    )


def create_session(session_id: str, record: bytes) -> Job[Sequence[Any] | None]:
    """Insert a session unless its id exists; the stored row when it did (to compare)."""

    def job(db: sqlite3.Connection) -> Sequence[Any] | None:
        if db.execute(INSERT_SESSION, (session_id, record)).rowcount == 1:
            return None
        stored = db.execute(SELECT_SESSION, (session_id,)).fetchone()
        return None if stored is None else tuple(stored)

    return job


def append(rows: Sequence[HistoryRow], path: str) -> Job[None]:
    """Insert history rows, all or none; a refusal names the row it tripped over."""
    params = [row_params(row) for row in rows]

    def job(db: sqlite3.Connection) -> None:
        db.execute("SAVEPOINT append_rows")
        try:
            db.executemany(INSERT_ROW, params)
        except sqlite3.IntegrityError as exc:
            db.execute("ROLLBACK TO append_rows")
            db.execute("RELEASE append_rows")
            raise _append_refusal(db, rows, exc, path) from None
        db.execute("RELEASE append_rows")

    return job


def _append_refusal(
    db: sqlite3.Connection, rows: Sequence[HistoryRow], exc: sqlite3.IntegrityError, path: str
) -> UsageError:
    """Name the row a refused append tripped over (slow path: a few queries per row)."""
    for row in rows:
        if db.execute(SELECT_SESSION, (row.session,)).fetchone() is None:
            return _checks.unknown_session(row.session)
        if db.execute(SELECT_ROW_SHAPE, (row.session, row.row_id)).fetchone() is not None:
            return _checks.duplicate_row_id(row)
        holder = db.execute(SELECT_SEQ_HOLDER, (row.session, row.seq)).fetchone()
        if holder is not None:
            return _checks.duplicate_seq(row, str(holder[0]))
    return UsageError(f"{path}: append refused: {exc}")


def update_row(row: HistoryRow) -> Job[Sequence[Any] | None]:
    """Replace a row's kind, body, stream and cut; ``None``, or the stored shape when refused."""
    params = row_params(row)

    def job(db: sqlite3.Connection) -> Sequence[Any] | None:
        cursor = db.execute(UPDATE_ROW, (*params[3:], row.session, row.row_id, row.seq))
        if cursor.rowcount == 1:
            return None
        return _shape(db, row.session, row.row_id)

    return job


def delete_rows(session: str, row_ids: Sequence[str]) -> Job[int]:
    """Delete rows of one session in one statement; how many were deleted."""
    ids = _ENCODE(list(row_ids)).decode()

    def job(db: sqlite3.Connection) -> int:
        return db.execute(DELETE_ROWS, (session, ids)).rowcount

    return job


def set_cut_state(session: str, row_id: str, value: str) -> Job[Sequence[Any] | None]:
    """Set a cut record's state (column and record); ``None``, or the row's shape if refused.

    Raises:
        CorruptRecord: The stored cut record is not JSON (nothing is written).
    """

    def job(db: sqlite3.Connection) -> Sequence[Any] | None:
        try:
            cursor = db.execute(SET_CUT_STATE, (value, value, session, row_id))
        except sqlite3.OperationalError as exc:
            if "JSON" not in str(exc):
                raise
            raise CorruptRecord(
                "history_rows", _checks.row_key(session, row_id), f"$.cut: {exc}"
            ) from None
        if cursor.rowcount == 1:
            return None
        return _shape(db, session, row_id)

    return job


def _shape(db: sqlite3.Connection, session: str, row_id: str) -> Sequence[Any]:
    """``(seq, has_cut)`` of a stored row, or ``()`` when there is no such row."""
    found = db.execute(SELECT_ROW_SHAPE, (session, row_id)).fetchone()
    return () if found is None else tuple(found)


def put_envelope(session: str, stream: str, record: bytes) -> Job[None]:
    """Write a turn envelope (upsert by session and stream).

    Raises:
        UsageError: The envelope's session does not exist.
    """

    def job(db: sqlite3.Connection) -> None:
        try:
            db.execute(PUT_ENVELOPE, (session, stream, record))
        except sqlite3.IntegrityError:
            raise _checks.unknown_session(session) from None

    return job


def select(sql: str, params: Sequence[object]) -> Job[list[Any]]:
    """A read: its rows (it writes nothing, so sharing a transaction changes nothing for it)."""

    def job(db: sqlite3.Connection) -> list[Any]:
        return db.execute(sql, params).fetchall()

    return job


def put_operations(records: Sequence[OperationRecord]) -> Job[None]:
    """Write receipts (upsert by op id), all or none."""
    params = [operation_params(record) for record in records]

    def job(db: sqlite3.Connection) -> None:
        if len(params) == 1:
            db.execute(PUT_OPERATION, params[0])
            return
        db.execute("SAVEPOINT put_operations")
        try:
            db.executemany(PUT_OPERATION, params)
        except BaseException:
            db.execute("ROLLBACK TO put_operations")
            db.execute("RELEASE put_operations")
            raise
        db.execute("RELEASE put_operations")

    return job


#: The raw startup scan: owed rows, rows after each session's last owed row, session records
#: and envelope stream ids of those sessions (decoded by the store, on the loop).
Scan = tuple[list[Any], list[Any], list[Any], list[Any]]

_OWED_SESSIONS = "SELECT DISTINCT session FROM history_rows WHERE cut_state = 'owed'"
SCAN_OWED = (
    "SELECT session, seq, row_id, kind, stream, cut_state, cut, body "
    "FROM history_rows WHERE cut_state = 'owed' ORDER BY session, seq"
)
SCAN_TRAILING = (
    "SELECT h.session, h.seq, h.row_id, h.kind, h.stream, h.cut_state, h.cut, h.body "
    "FROM history_rows h JOIN "
    "(SELECT session, MAX(seq) AS seq FROM history_rows WHERE cut_state = 'owed' "
    "GROUP BY session) o ON h.session = o.session AND h.seq > o.seq ORDER BY h.session, h.seq"
)
SCAN_SESSIONS = f"SELECT id, record FROM sessions WHERE id IN ({_OWED_SESSIONS})"
SCAN_STREAMS = (
    f"SELECT session, stream FROM turn_envelopes WHERE session IN ({_OWED_SESSIONS}) ORDER BY rowid"
)


def scan_recoverable(db: sqlite3.Connection) -> Scan:
    """On the connection's thread: the startup scan (inside the caller's transaction)."""
    return (
        db.execute(SCAN_OWED).fetchall(),
        db.execute(SCAN_TRAILING).fetchall(),
        db.execute(SCAN_SESSIONS).fetchall(),
        db.execute(SCAN_STREAMS).fetchall(),
    )
