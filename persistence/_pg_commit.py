"""The PostgreSQL store's boundaries: one job per commit, fenced by the session's lease.

A job runs inside a batch's transaction (``_postgres``; group commit shares one transaction
among concurrent writers) in a savepoint of its own, so a job that raises has written nothing
and the others of its batch commit. Its first statement is the *fence*: for a session this
process holds, the holder's epoch read ``FOR KEY SHARE`` (a peer's take waits until this
transaction ends, so no row of an old epoch lands after the new epoch's first row); for one it
does not hold, the take (one conditional update bumping the epoch, only when the session is
unowned or its lease ran out by the database's clock). A fence that fails raises
:class:`~persistence.LeaseLost` and the job writes nothing. Every history row and receipt
carries the epoch it was written under.

The parameters are made on the event loop from the same encodings the SQLite store uses
(``_writes``), so both stores keep the same bytes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import psycopg
from psycopg import errors as pg_errors

from persistence import _checks
from persistence import _pg_sql as sql
from persistence._decode import decode_session
from persistence._errors import CorruptRecord, LeaseLost, UsageError
from persistence._pg_owner import OWNER_PATTERN
from persistence._writes import (
    handle_params,
    operation_params,
    partial_plan,
    queue_plan,
    row_params,
)
from persistence.records import INBOX_ENTRY, Boundary, HistoryRow, QueuedEntryRecord, SessionRecord

_ENCODE = msgspec.json.Encoder().encode


@dataclass(slots=True)
class Txn:
    """One batch's transaction: its connection and the leases its jobs took or lost.

    ``held`` is the store's view (committed takes); ``taken`` holds this transaction's takes,
    which count only once it commits; ``lost`` the sessions a fence found taken by a peer.
    """

    conn: psycopg.AsyncConnection[Any]
    owner: str
    lease: float
    held: Mapping[str, int]
    lost_before: frozenset[str] | set[str]
    taken: dict[str, int] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)

    def epoch_of(self, session: str) -> int | None:
        """The epoch this process holds ``session`` at (``None``: it holds none)."""
        taken = self.taken.get(session)
        return taken if taken is not None else self.held.get(session)


#: A commit's job: what it deleted, once the batch's transaction holds its writes.
PgJob = Callable[[Txn], Awaitable[int]]


class _Refused(Exception):
    """An integrity error inside a savepoint: named once the savepoint is rolled back."""

    def __init__(self, error: psycopg.errors.IntegrityError) -> None:
        super().__init__(str(error))
        self.error = error


#: A statement's parameters: by position or by name.
Params = Sequence[Any] | Mapping[str, Any]


async def _one(conn: psycopg.AsyncConnection[Any], query: str, params: Params) -> Any:
    cursor = await conn.execute(query, params)
    return await cursor.fetchone()


async def _lease_lost(txn: Txn, session: str, held: int | None) -> LeaseLost:
    """The refusal of a write to ``session``, naming who holds it now."""
    found = await _one(txn.conn, sql.HOLDER, {"id": session})
    txn.lost.add(session)
    holder, epoch = (None, None) if found is None else (found[0], found[1])
    return LeaseLost(session, held=held, epoch=epoch, holder=holder)


async def fence(txn: Txn, session: str, create: SessionRecord | None, blob: bytes | None) -> int:
    """Check (or take) ``session``'s lease in this transaction; the epoch to write under.

    ``0`` when the session does not exist and the boundary creates none (receipts, handles
    and partial parts need no session; anything else is then refused by a foreign key).

    Raises:
        LeaseLost: A peer holds the session, or took it since this process did.
        UsageError: ``create`` differs from the stored session of that id.
    """
    held = txn.epoch_of(session)
    if create is not None and blob is not None:
        params = {"id": session, "record": blob, "owner": txn.owner, "lease": txn.lease}
        if await _one(txn.conn, sql.CREATE_SESSION, params) is not None:
            txn.taken[session] = 1
            return 1
        stored = await _one(txn.conn, sql.SELECT_SESSION, (session,))
        if stored is not None and (existing := decode_session(tuple(stored))) != create:
            raise _checks.session_conflict(existing, create)
    if held is not None:
        found = await _one(txn.conn, sql.FENCE, {"id": session, "owner": txn.owner})
        if found is None or found[0] != held:
            raise await _lease_lost(txn, session, held)
        return held
    if session in txn.lost_before:
        raise await _lease_lost(txn, session, None)
    params = {"id": session, "owner": txn.owner, "lease": txn.lease, "pattern": OWNER_PATTERN}
    taken = await _one(txn.conn, sql.TAKE, params)
    if taken is not None:
        txn.taken[session] = int(taken[0])
        return int(taken[0])
    if await _one(txn.conn, sql.SELECT_SESSION_ID, (session,)) is None:
        return 0
    raise await _lease_lost(txn, session, None)


class Plan(msgspec.Struct, frozen=True):
    """A boundary's statements' parameters, made on the event loop."""

    session: str
    create: SessionRecord | None
    created: bytes | None
    doomed: list[str] | None
    rows: list[tuple[HistoryRow, tuple[object, ...]]]
    cuts: list[tuple[str, str]]
    envelope: tuple[str, str, bytes] | None
    operations: list[tuple[object, ...]]
    handles: list[tuple[object, ...]]
    queue_version: int | None
    spared: list[str]
    queued: list[tuple[object, ...]]
    abandon: tuple[str, str, str | None] | None
    clear_abandon: bool
    auto_retry: bool | None
    part_drops: list[tuple[str, str]]
    parts: list[tuple[str, str, int, bytes]]
    #: The inbox rows (LS-9) the queue snapshot holds as entries ``inbox-<id>``.
    inbox: list[int]


def plan(session: str, boundary: Boundary) -> Plan | None:
    """The parameters of a checked boundary; ``None`` when it writes nothing."""
    queue = None if boundary.queue is None else queue_plan(boundary.queue)
    pending = partial_plan(session, boundary.partial, boundary.drop_partials)
    made = Plan(
        session=session,
        create=boundary.create,
        created=None if boundary.create is None else _ENCODE(boundary.create),
        doomed=list(boundary.delete) if boundary.delete else None,
        rows=[(row, row_params(row)) for row in boundary.rows],
        cuts=[(c.row_id, _checks.cut_state(c.state).value) for c in boundary.cut_states],
        envelope=None
        if boundary.envelope is None
        else (session, boundary.envelope.stream, _ENCODE(boundary.envelope)),
        operations=[operation_params(record) for record in boundary.operations],
        handles=[handle_params(record) for record in boundary.handles],
        queue_version=None if queue is None else queue.version,
        spared=[] if queue is None else msgspec.json.decode(queue.spared, type=list[str]),
        queued=[] if queue is None else queue.entries,
        abandon=None
        if boundary.abandon is None
        else (session, boundary.abandon.reason, boundary.abandon.user_row),
        clear_abandon=boundary.clear_abandon and boundary.abandon is None,
        auto_retry=boundary.auto_retry,
        part_drops=[] if pending is None else pending.drops,
        parts=[] if pending is None else pending.parts,
        inbox=_inbox_ids(
            (*(() if boundary.queue is None else boundary.queue.entries),),
            boundary.inbox_taken,
        ),
    )
    empty = not (
        made.create
        or made.doomed
        or made.rows
        or made.cuts
        or made.envelope
        or made.operations
        or made.handles
        or made.queue_version is not None
        or made.abandon
        or made.clear_abandon
        or made.auto_retry is not None
        or made.part_drops
        or made.parts
        or made.inbox
    )
    return None if empty else made


def _inbox_ids(entries: tuple[QueuedEntryRecord, ...], accepted: tuple[str, ...]) -> list[int]:
    """The inbox rows a boundary takes off (LS-9), by id.

    The entries named ``inbox-<id>`` its queue snapshot holds, and those it accepts.
    """
    found: list[int] = []
    for entry_id in (*(entry.entry_id for entry in entries), *accepted):
        number = entry_id.removeprefix(INBOX_ENTRY)
        if number != entry_id and number.isdigit():
            found.append(int(number))
    return sorted(set(found))


def job(made: Plan) -> PgJob:
    """The job that applies ``made`` in a savepoint of its own (see module)."""

    async def run(txn: Txn) -> int:
        before = dict(txn.taken)
        try:
            async with txn.conn.transaction():
                return await _apply(txn, made)
        except _Refused as refused:
            txn.taken = before
            raise await _refusal(txn.conn, made, refused.error) from None
        except BaseException:
            txn.taken = before
            raise

    return run


async def _many(conn: psycopg.AsyncConnection[Any], query: str, params: list[Any]) -> None:
    if len(params) == 1:
        await conn.execute(query, params[0])
    elif params:
        async with conn.cursor() as cursor:
            await cursor.executemany(query, params)


async def _apply(txn: Txn, made: Plan) -> int:
    """Run a boundary's statements in ``Boundary``'s order; how many rows it deleted."""
    conn, session = txn.conn, made.session
    epoch = await fence(txn, session, made.create, made.created)
    try:
        deleted = 0
        if made.doomed:
            cursor = await conn.execute(sql.DELETE_ROWS, (session, made.doomed))
            deleted = max(cursor.rowcount, 0)
        await _many(conn, sql.INSERT_ROW, [(*params, epoch) for _, params in made.rows])
        for row_id, state in made.cuts:
            await _set_cut_state(conn, session, row_id, state)
        if made.envelope is not None:
            await conn.execute(sql.PUT_ENVELOPE, made.envelope)
        await _many(conn, sql.PUT_OPERATION, [(*params, epoch) for params in made.operations])
        await _many(conn, sql.PUT_HANDLE, made.handles)
        if made.queue_version is not None:
            await _replace_queue(conn, made)
        elif made.inbox:  # accepted without a queue write of its own
            await conn.execute(sql.TAKE_INBOX, (session, made.inbox))
        await _settings(conn, made)
        await _many(conn, sql.DROP_PARTS, made.part_drops)
        await _many(conn, sql.PUT_PART, made.parts)
    except pg_errors.IntegrityError as error:
        raise _Refused(error) from None
    return deleted


async def _set_cut_state(
    conn: psycopg.AsyncConnection[Any], session: str, row_id: str, state: str
) -> None:
    params = {"state": state, "session": session, "row_id": row_id}
    try:
        cursor = await conn.execute(sql.SET_CUT_STATE, params)
    except pg_errors.DataError as exc:  # the stored cut record is not JSON (or not UTF-8)
        detail = str(exc).splitlines()[0]
        raise CorruptRecord(
            "history_rows", _checks.row_key(session, row_id), f"$.cut: {detail}"
        ) from None
    if cursor.rowcount == 1:
        return
    if await _one(conn, sql.SELECT_ROW_SHAPE, (session, row_id)) is None:
        raise _checks.no_row(session, row_id)
    raise _checks.no_cut(session, row_id)


async def _replace_queue(conn: psycopg.AsyncConnection[Any], made: Plan) -> None:
    cursor = await conn.execute(sql.PUT_QUEUE_VERSION, (made.session, made.queue_version))
    if cursor.rowcount != 1:  # stale: the one decided last was written already
        return
    await conn.execute(sql.DROP_QUEUED, (made.session, made.spared))
    await _many(conn, sql.PUT_QUEUED, made.queued)
    if made.inbox:  # LS-9: queued now, so off the inbox, in this same transaction
        await conn.execute(sql.TAKE_INBOX, (made.session, made.inbox))


async def _settings(conn: psycopg.AsyncConnection[Any], made: Plan) -> None:
    """The abandon marker, then the auto-retry preference (each when the plan has one)."""
    session = made.session
    if made.abandon is not None:
        await conn.execute(sql.PUT_ABANDON, made.abandon)
    elif made.clear_abandon:
        cleared = await conn.execute(sql.DROP_ABANDON, (session,))
        if not cleared.rowcount and await _one(conn, sql.SELECT_SESSION_ID, (session,)) is None:
            raise _checks.unknown_session(session)
    if made.auto_retry is False:
        await conn.execute(sql.PUT_RETRY_OFF, (session,))
    elif made.auto_retry:
        cleared = await conn.execute(sql.DROP_RETRY, (session,))
        if not cleared.rowcount and await _one(conn, sql.SELECT_SESSION_ID, (session,)) is None:
            raise _checks.unknown_session(session)


async def _refusal(
    conn: psycopg.AsyncConnection[Any], made: Plan, error: pg_errors.IntegrityError
) -> UsageError:
    """Name what a refused boundary tripped over (after its savepoint was rolled back)."""
    session = made.session
    if isinstance(error, pg_errors.ForeignKeyViolation):
        return _checks.unknown_session(session)
    doomed = set(made.doomed or ())
    for row, _ in made.rows:
        if row.row_id not in doomed and await _one(
            conn, sql.SELECT_ROW_SHAPE, (session, row.row_id)
        ):
            return _checks.duplicate_row_id(row)
        holder = await _one(conn, sql.SELECT_SEQ_HOLDER, (session, row.seq))
        if holder is not None and str(holder[0]) not in doomed:
            return _checks.duplicate_seq(row, str(holder[0]))
    return UsageError(f"session {session!r}: boundary refused: {str(error).splitlines()[0]}")
