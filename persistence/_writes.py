"""The SQLite store's writes, as plain functions run on the connection's own thread.

Each function is one *job*: it gets the ``sqlite3`` connection inside a transaction that
``_group`` opened (``BEGIN IMMEDIATE``) and either returns the facts its verb needs or raises.
Every job is all or nothing by itself: it writes with one statement (SQLite undoes a failed
statement entirely) or inside a savepoint of its own. So a job that raises has written nothing,
and the others in its transaction are committed. Jobs never commit: the transaction's owner
does, once, for every job in it, and only then tells anyone that their write is durable.

A write job names its own refusal (it must, to undo its savepoint before it raises); read jobs
return raw rows and leave decoding them to the verbs in ``_sqlite``, on the event loop.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar

import msgspec

from persistence import _checks
from persistence._decode import Scan, decode_session
from persistence._errors import CorruptRecord, UsageError
from persistence.records import (
    Boundary,
    CutState,
    HandleRecord,
    HistoryRow,
    OperationRecord,
    PartialChunk,
    QueueSnapshot,
    SessionRecord,
)

T = TypeVar("T")

#: A write: runs on the connection's thread, inside a transaction it must not end.
Job = Callable[[sqlite3.Connection], T]

_ENCODE = msgspec.json.Encoder().encode

INSERT_ROW = (
    "INSERT INTO history_rows (session, seq, row_id, kind, stream, cut_state, cut, body) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
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
    "INSERT INTO operations "
    "(op_id, session, state, capability, target, resolved_by, resolved_at, record) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (op_id) DO UPDATE SET "
    "session = excluded.session, state = excluded.state, capability = excluded.capability, "
    "target = excluded.target, resolved_by = excluded.resolved_by, "
    "resolved_at = excluded.resolved_at, record = excluded.record"
)
PUT_HANDLE = (
    "INSERT INTO handles (handle_id, owner, target, status, record) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (handle_id) DO UPDATE SET owner = excluded.owner, target = excluded.target, "
    "status = excluded.status, record = excluded.record"
)
#: A queue snapshot's version guard: stores the version only when it is above the stored one
#: (``changes()`` is 0 when it is not, and the snapshot is then skipped whole).
PUT_QUEUE_VERSION = (
    "INSERT INTO queue_versions (session, version) VALUES (?, ?) ON CONFLICT (session) "
    "DO UPDATE SET version = excluded.version WHERE excluded.version > queue_versions.version"
)
#: Every entry of the session the snapshot neither holds nor keeps. An entry id that is not
#: text (damage) cannot be named in ``keep``: it is never deleted, for a person to see.
DROP_QUEUED = (
    "DELETE FROM queued_entries WHERE session = ? AND typeof(entry_id) = 'text' "
    "AND entry_id NOT IN (SELECT value FROM json_each(?))"
)
PUT_QUEUED = (
    "INSERT INTO queued_entries (session, entry_id, position, kind, body) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (session, entry_id) DO UPDATE SET "
    "position = excluded.position, kind = excluded.kind, body = excluded.body"
)
#: A session's abandon marker, replacing any (the foreign key refuses an unknown session).
PUT_ABANDON = (
    "INSERT INTO abandon_markers (session, reason, user_row) VALUES (?, ?, ?) "
    "ON CONFLICT (session) DO UPDATE SET reason = excluded.reason, user_row = excluded.user_row"
)
DROP_ABANDON = "DELETE FROM abandon_markers WHERE session = ?"
#: A session's auto-retry preference switched off (AS-32): only "off" is stored, replacing
#: any row (a damaged one too; the foreign key refuses an unknown session).
PUT_RETRY_OFF = (
    "INSERT INTO retry_settings (session, auto_retry) VALUES (?, 0) "
    "ON CONFLICT (session) DO UPDATE SET auto_retry = excluded.auto_retry"
)
#: Back to the default (on): the stored "off" goes.
DROP_RETRY = "DELETE FROM retry_settings WHERE session = ?"
SELECT_SESSION_ID = "SELECT 1 FROM sessions WHERE id = ?"
#: A part of a stream's partial (B4): a part stored at its position is replaced. An upsert,
#: not ``INSERT OR REPLACE``: the row keeps its rowid, which orders the streams in ``load``.
PUT_PART = (
    "INSERT INTO partial_parts (session, stream, position, body) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (session, stream, position) DO UPDATE SET body = excluded.body"
)
#: Every part of one stream's partial (B5, B6, PS-2).
DROP_PARTS = "DELETE FROM partial_parts WHERE session = ? AND stream = ?"
#: The end of a receipt's bytes when nobody resolved it: the fields migration 0003 added, all
#: unset. Left off, so such a receipt keeps the bytes it always had (they decode to the
#: defaults); the hottest write stays as short as it was.
_UNRESOLVED = b',"resolved_by":null,"resolved_at":null,"note":null}'


def row_params(row: HistoryRow) -> tuple[object, ...]:
    """The INSERT parameters of a history row, in ``INSERT_ROW`` order."""
    cut = row.cut
    return (
        row.session,
        row.seq,
        row.row_id,
        row.kind._value_,
        row.stream,
        None if cut is None else cut.state._value_,
        None if cut is None else _ENCODE(cut),
        row.body,
    )


def operation_params(record: OperationRecord) -> tuple[object, ...]:
    """The upsert parameters of a receipt, in ``PUT_OPERATION`` order.

    The capability pair is stored as its text (``client:bash``), in its column and in the
    record: the record's bytes are those it always had (``_decode`` reads them back as a pair).
    A person's resolution (``resolved_by``, ``resolved_at``) is in its columns and the record.
    """
    capability = record.capability.text
    # The same record with its capability as text, encoded at once and never used as a record
    # (a struct copy is half the cost of a dict of its fields; receipts are the hottest write).
    stored = msgspec.structs.replace(record, capability=capability)
    blob = _ENCODE(stored)
    if blob.endswith(_UNRESOLVED):
        blob = blob[: -len(_UNRESOLVED)] + b"}"
    return (
        record.op_id,
        record.session,
        record.state._value_,  # ``.value`` is a descriptor call: receipts are the hottest write
        capability,
        record.target,
        record.resolved_by,
        record.resolved_at,
        blob,
    )


def handle_params(record: HandleRecord) -> tuple[object, ...]:
    """The upsert parameters of a handle record, in ``PUT_HANDLE`` order."""
    return (
        record.handle_id,
        record.owner,
        record.target,
        record.status.value,
        _ENCODE(record),
    )


class _Queue(msgspec.Struct, frozen=True):
    """A queue snapshot encoded for its three statements (``_replace_queue``)."""

    version: int
    #: The ids the snapshot holds or keeps, as a JSON array (``DROP_QUEUED``'s parameter).
    spared: str
    entries: list[tuple[object, ...]]


def queue_plan(snapshot: QueueSnapshot) -> _Queue:
    """The statements' parameters of a (checked) queue snapshot."""
    entries: list[tuple[object, ...]] = [
        (r.session, r.entry_id, r.position, r.kind, r.body) for r in snapshot.entries
    ]
    spared = [*(r.entry_id for r in snapshot.entries), *snapshot.keep]
    return _Queue(version=snapshot.version, spared=_ENCODE(spared).decode(), entries=entries)


class _Partial(msgspec.Struct, frozen=True):
    """A boundary's ``drop_partials`` and ``partial``, as their statements' parameters."""

    #: ``DROP_PARTS`` parameters, one per dropped stream (run first).
    drops: list[tuple[str, str]]
    #: ``PUT_PART`` parameters, one per part of the chunk (run after the drops).
    parts: list[tuple[str, str, int, bytes]]

    @property
    def statements(self) -> int:
        """How many statements it runs (each list is one ``executemany``, when it has any)."""
        return bool(self.drops) + bool(self.parts)

    @property
    def single(self) -> bool:
        """Whether it runs one statement once (so it needs no savepoint of its own)."""
        return len(self.drops) + len(self.parts) == 1


def partial_plan(
    session: str, chunk: PartialChunk | None, drops: tuple[str, ...]
) -> _Partial | None:
    """The statements' parameters of a (checked) chunk and drops; ``None`` when it has neither."""
    if chunk is None and not drops:
        return None
    parts: list[tuple[str, str, int, bytes]] = []
    if chunk is not None:
        stream = chunk.stream
        parts = [
            (session, stream, position, body)
            for position, body in enumerate(chunk.parts, chunk.start)
        ]
    return _Partial(drops=[(session, stream) for stream in drops], parts=parts)


def _put_partial(db: sqlite3.Connection, pending: _Partial) -> None:
    """Drop the named streams' parts, then store the chunk's (the order ``Boundary`` says)."""
    if len(pending.drops) == 1:
        db.execute(DROP_PARTS, pending.drops[0])
    elif pending.drops:
        db.executemany(DROP_PARTS, pending.drops)
    if len(pending.parts) == 1:
        db.execute(PUT_PART, pending.parts[0])
    elif pending.parts:
        db.executemany(PUT_PART, pending.parts)


class _Plan(msgspec.Struct, frozen=True):
    """A boundary encoded on the event loop, ready to run on the connection's thread."""

    session: str
    path: str
    create: SessionRecord | None
    created: bytes | None
    doomed: str | None
    rows: list[tuple[HistoryRow, tuple[object, ...]]]
    cuts: list[tuple[str, str]]
    envelope: tuple[str, str, bytes] | None
    operations: list[tuple[object, ...]]
    handles: list[tuple[object, ...]]
    queue: _Queue | None
    #: The abandon marker's upsert parameters (``PUT_ABANDON``), when the boundary stores one.
    abandon: tuple[str, str, str | None] | None = None
    #: Remove the session's abandon marker (only when none is stored in its place).
    clear_abandon: bool = False
    #: The session's auto-retry preference to store (``None``: left as it is).
    auto_retry: bool | None = None
    #: The partial's drops and chunk (B4), run last.
    partial: _Partial | None = None

    @property
    def statements(self) -> int:
        """How many statements it runs (a batch of receipts or handles is one ``executemany``)."""
        return (
            (self.created is not None)
            + (self.doomed is not None)
            + len(self.rows)
            + len(self.cuts)
            + (self.envelope is not None)
            + min(len(self.operations), 1)
            + min(len(self.handles), 1)
            + (0 if self.queue is None else 3)  # never bare: several statements
            + (self.abandon is not None or self.clear_abandon)
            + (self.auto_retry is not None)
            + (0 if self.partial is None else self.partial.statements)
        )


class Owned(Protocol):
    """What a job reads to fence a stale writer: the store's current owner token."""

    @property
    def owner(self) -> str | None:
        """The current owner's token (``None``: nobody owns the store)."""
        ...


def commit(
    session: str, boundary: Boundary, path: str, store: Owned, owner: str | None
) -> Job[int] | None:
    """One boundary of ``session``, all or nothing; the job returns how many rows it deleted.

    ``None`` for an empty boundary (nothing to run). The job first checks, on the connection's
    thread inside the transaction, that ``owner`` still owns ``store`` (``StaleOwner`` when
    not). A boundary of one statement runs bare (SQLite undoes a failed statement whole); one
    of several runs in a savepoint of its own, so a refusal anywhere undoes all of it. Jobs
    are partial applications, not closures: receipts are two commits per tool step, and each
    closure cell is one more object for the cyclic collector.
    """
    envelope, rows, cuts = boundary.envelope, boundary.rows, boundary.cut_states
    if (
        boundary.create is None
        and not boundary.delete
        and not boundary.operations
        and not boundary.handles
        and boundary.queue is None
        and boundary.abandon is None
        and not boundary.clear_abandon
        and boundary.auto_retry is None
        and boundary.partial is None
        and not boundary.drop_partials
    ):
        # The hottest boundaries are one statement (a row, an envelope, a record's state):
        # their jobs skip the plan and run ``_apply``'s statements (``_insert``, ...) alone.
        if envelope is None and not cuts and len(rows) == 1:
            row = rows[0]
            return partial(_insert_row, store, owner, path, row, row_params(row))
        if envelope is None and not rows and len(cuts) == 1:
            row_id, state = cuts[0].row_id, _checks.cut_state(cuts[0].state).value
            return partial(_set_one_cut, store, owner, session, row_id, state)
        if envelope is not None and not rows and not cuts:
            params = (session, envelope.stream, _ENCODE(envelope))
            return partial(_put_envelope, store, owner, session, params)
    queue, abandon = boundary.queue, boundary.abandon
    if not (
        boundary.create
        or boundary.delete
        or rows
        or cuts
        or envelope
        or boundary.handles
        or queue
        or abandon
        or boundary.clear_abandon
        or boundary.auto_retry is not None
    ):
        return receipts(
            session, boundary.operations, store, owner, boundary.partial, boundary.drop_partials
        )
    plan = _Plan(
        session=session,
        path=path,
        create=boundary.create,
        created=None if boundary.create is None else _ENCODE(boundary.create),
        doomed=_ENCODE(list(boundary.delete)).decode() if boundary.delete else None,
        rows=[(row, row_params(row)) for row in boundary.rows],
        cuts=[(c.row_id, _checks.cut_state(c.state).value) for c in boundary.cut_states],
        envelope=None if envelope is None else (session, envelope.stream, _ENCODE(envelope)),
        operations=[operation_params(record) for record in boundary.operations],
        handles=[handle_params(record) for record in boundary.handles],
        queue=None if queue is None else queue_plan(queue),
        abandon=None if abandon is None else (session, abandon.reason, abandon.user_row),
        clear_abandon=boundary.clear_abandon and abandon is None,
        auto_retry=boundary.auto_retry,
        partial=partial_plan(session, boundary.partial, boundary.drop_partials),
    )
    statements = plan.statements
    if statements == 0:
        return None
    bare = (
        statements == 1
        and len(plan.operations) <= 1
        and len(plan.handles) <= 1
        and (plan.partial is None or plan.partial.single)
    )
    return partial(_run_plan, store, owner, plan, bare)


def _insert_row(
    store: Owned,
    owner: str | None,
    path: str,
    row: HistoryRow,
    params: tuple[object, ...],
    db: sqlite3.Connection,
) -> int:
    _checks.fence(row.session, store.owner, owner)
    _insert(db, row, params, path)
    return 0


def _set_one_cut(
    store: Owned, owner: str | None, session: str, row_id: str, state: str, db: sqlite3.Connection
) -> int:
    _checks.fence(session, store.owner, owner)
    _set_cut_state(db, session, row_id, state)
    return 0


def _put_envelope(
    store: Owned,
    owner: str | None,
    session: str,
    params: tuple[str, str, bytes],
    db: sqlite3.Connection,
) -> int:
    _checks.fence(session, store.owner, owner)
    _envelope(db, session, params)
    return 0


def _run_plan(
    store: Owned, owner: str | None, plan: _Plan, bare: bool, db: sqlite3.Connection
) -> int:
    _checks.fence(plan.session, store.owner, owner)
    if bare:
        return _apply(db, plan)
    db.execute("SAVEPOINT boundary")
    try:
        deleted = _apply(db, plan)
    except BaseException:
        db.execute("ROLLBACK TO boundary")
        db.execute("RELEASE boundary")
        raise
    db.execute("RELEASE boundary")
    return deleted


def receipts(
    session: str,
    records: Sequence[OperationRecord],
    store: Owned,
    owner: str | None,
    chunk: PartialChunk | None = None,
    drops: tuple[str, ...] = (),
) -> Job[int] | None:
    """A boundary of receipts (most boundaries: two per tool step), and the partial's parts.

    The receipts are one upsert each; a (checked) chunk and drops (B4) run after them in the
    same job, inside a savepoint unless the whole job is one statement run once.
    """
    if chunk is not None or drops:
        pending = partial_plan(session, chunk, drops)
        if pending is not None and pending.statements:
            many = [operation_params(record) for record in records]
            bare = not many and pending.single
            return partial(_put_with_partial, store, session, owner, many, pending, bare)
    if not records:
        return None
    if len(records) == 1:
        return partial(_put_one, store, session, owner, operation_params(records[0]))
    many = [operation_params(record) for record in records]
    return partial(_put_many, store, session, owner, many)


def _put_one(
    store: Owned,
    session: str,
    owner: str | None,
    params: tuple[object, ...],
    db: sqlite3.Connection,
) -> int:
    _checks.fence(session, store.owner, owner)
    db.execute(PUT_OPERATION, params)
    return 0


def _put_many(
    store: Owned,
    session: str,
    owner: str | None,
    many: list[tuple[object, ...]],
    db: sqlite3.Connection,
) -> int:
    _checks.fence(session, store.owner, owner)
    db.executemany(PUT_OPERATION, many)  # one statement: SQLite undoes it whole
    return 0


def _put_with_partial(
    store: Owned,
    session: str,
    owner: str | None,
    many: list[tuple[object, ...]],
    pending: _Partial,
    bare: bool,
    db: sqlite3.Connection,
) -> int:
    _checks.fence(session, store.owner, owner)
    if bare:  # one statement run once: SQLite undoes it whole
        _put_partial(db, pending)
        return 0
    db.execute("SAVEPOINT boundary")
    try:
        if len(many) == 1:
            db.execute(PUT_OPERATION, many[0])
        elif many:
            db.executemany(PUT_OPERATION, many)
        _put_partial(db, pending)
    except BaseException:
        db.execute("ROLLBACK TO boundary")
        db.execute("RELEASE boundary")
        raise
    db.execute("RELEASE boundary")
    return 0


def _apply(db: sqlite3.Connection, plan: _Plan) -> int:
    """Run a boundary's statements in order; how many rows it deleted."""
    if plan.create is not None and plan.created is not None:
        _create(db, plan.create, plan.created)
    deleted = 0
    if plan.doomed is not None:
        deleted = db.execute(DELETE_ROWS, (plan.session, plan.doomed)).rowcount
    for row, params in plan.rows:
        _insert(db, row, params, plan.path)
    for row_id, value in plan.cuts:
        _set_cut_state(db, plan.session, row_id, value)
    if plan.envelope is not None:
        _envelope(db, plan.session, plan.envelope)
    if len(plan.operations) == 1:
        db.execute(PUT_OPERATION, plan.operations[0])
    elif plan.operations:
        db.executemany(PUT_OPERATION, plan.operations)
    if plan.handles:
        db.executemany(PUT_HANDLE, plan.handles)
    if plan.queue is not None:
        _replace_queue(db, plan.session, plan.queue)
    if plan.abandon is not None or plan.clear_abandon or plan.auto_retry is not None:
        _settings(db, plan)
    if plan.partial is not None:
        _put_partial(db, plan.partial)
    return deleted


def _abandon(
    db: sqlite3.Connection, session: str, marker: tuple[str, str, str | None] | None
) -> None:
    """Store the session's abandon marker (replacing any), or remove it when ``marker`` is unset.

    Raises:
        UsageError: The session does not exist (nothing of the boundary is written).
    """
    if marker is not None:
        try:
            db.execute(PUT_ABANDON, marker)
        except sqlite3.IntegrityError:
            raise _checks.unknown_session(session) from None
        return
    cleared = db.execute(DROP_ABANDON, (session,)).rowcount
    if not cleared and db.execute(SELECT_SESSION_ID, (session,)).fetchone() is None:
        raise _checks.unknown_session(session)


def _settings(db: sqlite3.Connection, plan: _Plan) -> None:
    """The session's abandon marker, then its auto-retry preference (each when the plan has it)."""
    if plan.abandon is not None or plan.clear_abandon:
        _abandon(db, plan.session, plan.abandon)
    if plan.auto_retry is not None:
        _auto_retry(db, plan.session, plan.auto_retry)


def _auto_retry(db: sqlite3.Connection, session: str, on: bool) -> None:
    """Store the session's auto-retry preference: "off" as its row, on as no row (AS-32).

    Raises:
        UsageError: The session does not exist (nothing of the boundary is written).
    """
    if not on:
        try:
            db.execute(PUT_RETRY_OFF, (session,))
        except sqlite3.IntegrityError as exc:
            if "FOREIGN KEY" not in str(exc):
                raise
            raise _checks.unknown_session(session) from None
        return
    cleared = db.execute(DROP_RETRY, (session,)).rowcount
    if not cleared and db.execute(SELECT_SESSION_ID, (session,)).fetchone() is None:
        raise _checks.unknown_session(session)


def _replace_queue(db: sqlite3.Connection, session: str, queue: _Queue) -> None:
    """Replace the session's queue when the snapshot is newer than the stored version.

    Raises:
        UsageError: The session does not exist (the foreign keys refuse the version).
    """
    try:
        applied = db.execute(PUT_QUEUE_VERSION, (session, queue.version)).rowcount
    except sqlite3.IntegrityError:
        raise _checks.unknown_session(session) from None
    if not applied:  # stale: the one decided last was written already
        return
    db.execute(DROP_QUEUED, (session, queue.spared))
    if queue.entries:
        db.executemany(PUT_QUEUED, queue.entries)


def _insert(db: sqlite3.Connection, row: HistoryRow, params: tuple[object, ...], path: str) -> None:
    """Insert a history row; a refusal names what it tripped over."""
    try:
        db.execute(INSERT_ROW, params)
    except sqlite3.IntegrityError as exc:
        raise _row_refusal(db, row, exc, path) from None


def _envelope(db: sqlite3.Connection, session: str, params: tuple[str, str, bytes]) -> None:
    """Upsert a turn envelope; one of a session the store does not hold is refused."""
    try:
        db.execute(PUT_ENVELOPE, params)
    except sqlite3.IntegrityError:
        raise _checks.unknown_session(session) from None


def _create(db: sqlite3.Connection, record: SessionRecord, blob: bytes) -> None:
    """Insert a session unless its id exists with an identical record.

    Raises:
        UsageError: The id exists with other fields.
        CorruptRecord: The stored session fails validation.
    """
    if db.execute(INSERT_SESSION, (record.id, blob)).rowcount == 1:
        return
    stored = db.execute(SELECT_SESSION, (record.id,)).fetchone()
    if stored is not None and (existing := decode_session(tuple(stored))) != record:
        raise _checks.session_conflict(existing, record)


def _row_refusal(
    db: sqlite3.Connection, row: HistoryRow, exc: sqlite3.IntegrityError, path: str
) -> UsageError:
    """Name what a refused row tripped over (slow path: a few queries)."""
    if db.execute(SELECT_SESSION, (row.session,)).fetchone() is None:
        return _checks.unknown_session(row.session)
    if db.execute(SELECT_ROW_SHAPE, (row.session, row.row_id)).fetchone() is not None:
        return _checks.duplicate_row_id(row)
    holder = db.execute(SELECT_SEQ_HOLDER, (row.session, row.seq)).fetchone()
    if holder is not None:
        return _checks.duplicate_seq(row, str(holder[0]))
    return UsageError(f"{path}: history row refused: {exc}")


def _set_cut_state(db: sqlite3.Connection, session: str, row_id: str, value: str) -> None:
    """Set a cut record's state (column and record).

    Raises:
        UsageError: No such row, or the row has no cut record.
        CorruptRecord: The stored cut record is not JSON.
    """
    try:
        cursor = db.execute(SET_CUT_STATE, (value, value, session, row_id))
    except sqlite3.OperationalError as exc:
        if "JSON" not in str(exc):
            raise
        raise CorruptRecord(
            "history_rows", _checks.row_key(session, row_id), f"$.cut: {exc}"
        ) from None
    if cursor.rowcount == 1:
        return
    if db.execute(SELECT_ROW_SHAPE, (session, row_id)).fetchone() is None:
        raise _checks.no_row(session, row_id)
    raise _checks.no_cut(session, row_id)


def select(sql: str, params: Sequence[object]) -> Job[list[Any]]:
    """A read: its rows (it writes nothing, so sharing a transaction changes nothing for it)."""

    def job(db: sqlite3.Connection) -> list[Any]:
        return db.execute(sql, params).fetchall()

    return job


SELECT_HISTORY = (
    "SELECT session, seq, row_id, kind, stream, cut_state, cut, body "
    "FROM history_rows WHERE session = ? ORDER BY seq"
)
SELECT_ENVELOPES = (
    "SELECT session, stream, record FROM turn_envelopes WHERE session = ? ORDER BY rowid"
)

_QUEUED_COLUMNS = "SELECT session, entry_id, position, kind, body FROM queued_entries"
SELECT_QUEUED = f"{_QUEUED_COLUMNS} WHERE session = ? ORDER BY position, entry_id"
SELECT_ALL_QUEUED = f"{_QUEUED_COLUMNS} ORDER BY session, position, entry_id"
SELECT_QUEUE_VERSION = "SELECT session, version FROM queue_versions WHERE session = ?"
SELECT_QUEUE_VERSIONS = "SELECT session, version FROM queue_versions ORDER BY session"
SELECT_ABANDON = "SELECT session, reason, user_row FROM abandon_markers WHERE session = ?"
SELECT_ALL_ABANDON = "SELECT session, reason, user_row FROM abandon_markers ORDER BY session"
SELECT_RETRY = "SELECT session, auto_retry FROM retry_settings WHERE session = ?"
#: A session's partial parts in the order they were first written (an upsert keeps a row's
#: rowid): ``_decode`` groups them by stream, in the order each stream first wrote.
SELECT_PARTS = "SELECT stream, position, body FROM partial_parts WHERE session = ? ORDER BY rowid"

#: The raw load: the session row (none or one), its history rows, its envelopes, its queued
#: entries, its queue version (none or one), its abandon marker (none or one), its partial
#: parts and its auto-retry preference (none or one).
Load = tuple[list[Any], list[Any], list[Any], list[Any], list[Any], list[Any], list[Any], list[Any]]


def load(session: str, *, envelopes: bool = True) -> Job[Load]:
    """A session's record, rows, envelopes (when asked for), queue, marker, parts, preference."""
    return partial(_load, session, envelopes)


def _load(session: str, envelopes: bool, db: sqlite3.Connection) -> Load:
    return (
        db.execute(SELECT_SESSION, (session,)).fetchall(),
        db.execute(SELECT_HISTORY, (session,)).fetchall(),
        db.execute(SELECT_ENVELOPES, (session,)).fetchall() if envelopes else [],
        db.execute(SELECT_QUEUED, (session,)).fetchall(),
        db.execute(SELECT_QUEUE_VERSION, (session,)).fetchall(),
        db.execute(SELECT_ABANDON, (session,)).fetchall(),
        db.execute(SELECT_PARTS, (session,)).fetchall(),
        db.execute(SELECT_RETRY, (session,)).fetchall(),
    )


#: The raw queue: the entries, then the versions (every session's, or one's).
Queued = tuple[list[Any], list[Any]]


def queued(session: str | None) -> Job[Queued]:
    """The durable queue's entries and versions (``session``'s only, when given), one snapshot."""
    return partial(_queued, session)


def _queued(session: str | None, db: sqlite3.Connection) -> Queued:
    if session is None:
        return (
            db.execute(SELECT_ALL_QUEUED).fetchall(),
            db.execute(SELECT_QUEUE_VERSIONS).fetchall(),
        )
    return (
        db.execute(SELECT_QUEUED, (session,)).fetchall(),
        db.execute(SELECT_QUEUE_VERSION, (session,)).fetchall(),
    )


def _live_cut_rows() -> str:
    """A CTE ``live(session, seq)``: rows whose ``cut_state`` is ``owed`` or no state at all.

    One range of the partial index on ``cut_state`` per gap around the settled states (SQLite
    orders numbers before text and blobs after it), so a damaged column is found without
    reading the settled cut rows: it is reported, never an owed cut made invisible.
    """
    settled = sorted(state.value for state in CutState if state is not CutState.OWED)
    bounds: list[str | None] = [None, *settled, None]
    selects = []
    for low, high in itertools.pairwise(bounds):
        terms = [f"cut_state > '{low}'" if low else "", f"cut_state < '{high}'" if high else ""]
        where = " AND ".join(term for term in terms if term)
        selects.append(f"SELECT session, seq FROM history_rows WHERE {where}")
    return "live(session, seq) AS (" + " UNION ALL ".join(selects) + ")"


_LIVE_CTE = _live_cut_rows()
_LIVE = f"WITH {_LIVE_CTE} "
_COLUMNS = "h.session, h.seq, h.row_id, h.kind, h.stream, h.cut_state, h.cut, h.body"
_LIVE_SESSIONS = "SELECT DISTINCT session FROM live"
SCAN_OWED = (
    f"{_LIVE}SELECT {_COLUMNS} FROM live JOIN history_rows h "
    "ON h.session = live.session AND h.seq = live.seq ORDER BY h.session, h.seq"
)
SCAN_TRAILING = (
    f"{_LIVE}SELECT {_COLUMNS} FROM history_rows h JOIN "
    "(SELECT session, MAX(seq) AS seq FROM live GROUP BY session) o "
    "ON h.session = o.session AND h.seq > o.seq ORDER BY h.session, h.seq"
)
SCAN_SESSIONS = f"{_LIVE}SELECT id, record FROM sessions WHERE id IN ({_LIVE_SESSIONS})"
SCAN_STREAMS = (
    f"{_LIVE}SELECT session, stream FROM turn_envelopes WHERE session IN ({_LIVE_SESSIONS}) "
    "ORDER BY rowid"
)

#: Every session holding a queued entry, valid or damaged (through the primary key's index).
SCAN_QUEUED = "SELECT DISTINCT session FROM queued_entries ORDER BY session"

#: ``tail(session, start)``: every session that owes nothing (no ``live`` row) whose last row
#: that is not a system row is not an assistant row (a user row, a sentinel, a partial row, or
#: a damaged kind the decoding then reports; a session of system rows only is none), with the
#: seq of its last user row (``NULL``: it has none). Backward seeks of the primary key's index
#: (one per session, a second per tail); no session's history is read whole.
_TAIL_CTE = (
    "tail(session, start) AS MATERIALIZED (SELECT s.id, "
    "(SELECT h.seq FROM history_rows h WHERE h.session = s.id AND h.kind = 'user' "
    "ORDER BY h.seq DESC LIMIT 1) "
    f"FROM sessions s WHERE s.id NOT IN ({_LIVE_SESSIONS}) "
    "AND (SELECT h.kind FROM history_rows h WHERE h.session = s.id AND h.kind IS NOT 'system' "
    "ORDER BY h.seq DESC LIMIT 1) NOT IN ('assistant'))"
)
#: The tails' rows: each session's rows from its last user row on (every row when none).
SCAN_TAIL_ROWS = (
    f"WITH {_LIVE_CTE}, {_TAIL_CTE} SELECT {_COLUMNS} FROM tail JOIN history_rows h "
    "ON h.session = tail.session AND h.seq >= coalesce(tail.start, -9223372036854775808) "
    "ORDER BY h.session, h.seq"
)
#: The sessions named by ``?`` (a JSON array of ids): the follow-up reads of the tails.
_NAMED = "(SELECT value FROM json_each(?))"
SCAN_TAIL_SESSIONS = f"SELECT id, record FROM sessions WHERE id IN {_NAMED}"
SCAN_TAIL_STREAMS = (
    f"SELECT session, stream FROM turn_envelopes WHERE session IN {_NAMED} ORDER BY rowid"
)
#: Each named session's last-written envelope, and whether a row names its stream (a
#: backward seek: a stream that ended wrote its row near the end).
SCAN_LAST_ENVELOPES = (
    "SELECT e.session, e.stream, e.record, (SELECT 1 FROM history_rows h "
    "WHERE h.session = e.session AND h.stream = e.stream ORDER BY h.seq DESC LIMIT 1) "
    "FROM turn_envelopes e WHERE e.rowid IN (SELECT max(rowid) FROM turn_envelopes "
    f"WHERE session IN {_NAMED} GROUP BY session)"
)
SCAN_VERSIONS = f"SELECT session, version FROM queue_versions WHERE session IN {_NAMED}"
SCAN_ABANDON = f"SELECT session, reason, user_row FROM abandon_markers WHERE session IN {_NAMED}"
SCAN_RETRY = f"SELECT session, auto_retry FROM retry_settings WHERE session IN {_NAMED}"


def _named(*parts: list[Any]) -> str:
    """The sessions of the raw rows ``parts`` (their first column), as a JSON array.

    An id that is not text (damage) is left out: its rows fail their own decoding.
    """
    names = sorted({values[0] for part in parts for values in part if type(values[0]) is str})
    return _ENCODE(names).decode()


def scan_recoverable(db: sqlite3.Connection) -> Scan:
    """On the connection's thread: the startup scan (inside the caller's transaction)."""
    owed = db.execute(SCAN_OWED).fetchall()
    tail_rows = db.execute(SCAN_TAIL_ROWS).fetchall()
    tails, both = _named(tail_rows), _named(owed, tail_rows)
    return Scan(
        owed=owed,
        trailing=db.execute(SCAN_TRAILING).fetchall(),
        sessions=db.execute(SCAN_SESSIONS).fetchall(),
        streams=db.execute(SCAN_STREAMS).fetchall(),
        queued=db.execute(SCAN_QUEUED).fetchall(),
        versions=db.execute(SCAN_VERSIONS, (both,)).fetchall(),
        tail_rows=tail_rows,
        tail_sessions=db.execute(SCAN_TAIL_SESSIONS, (tails,)).fetchall(),
        tail_streams=db.execute(SCAN_TAIL_STREAMS, (tails,)).fetchall(),
        last_envelopes=db.execute(SCAN_LAST_ENVELOPES, (tails,)).fetchall(),
        abandon=db.execute(SCAN_ABANDON, (tails,)).fetchall(),
        retry=db.execute(SCAN_RETRY, (tails,)).fetchall(),
    )
