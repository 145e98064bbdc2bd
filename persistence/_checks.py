"""Checks and messages both stores share, so they refuse the same misuse in the same words."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from persistence._errors import StaleOwner, UsageError
from persistence._text import NotUtf8, clip
from persistence.records import (
    MAX_ABANDON_REASON_BYTES,
    MAX_HANDLE_BYTES,
    MAX_QUEUED_BYTES,
    MAX_SEQ,
    OPEN_OP_STATES,
    Capability,
    CutState,
    HandleRecord,
    HandleStatus,
    OperationRecord,
    OpState,
    ToolKind,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from persistence.records import (
        AbandonMarker,
        Boundary,
        HistoryRow,
        QueueSnapshot,
        SessionRecord,
    )


def row_key(session: str, row_id: str) -> str:
    """The key that names a history row in messages: ``session/row_id``."""
    return f"{session}/{row_id}"


def check_boundary(session: str, boundary: Boundary) -> None:
    """Refuse a boundary holding a record of another session, or a key it repeats itself.

    Raises:
        UsageError: Naming the field (and the record) that is wrong; nothing is written.
    """
    create, rows, envelope, operations = (
        boundary.create,
        boundary.rows,
        boundary.envelope,
        boundary.operations,
    )
    if create is not None and create.id != session:
        raise _foreign("create", create.id, session)
    for row in rows:
        if row.session != session:
            index = rows.index(row)
            raise _foreign(f"rows[{index}] (history row {row.row_id})", row.session, session)
        if not 0 <= row.seq <= MAX_SEQ:  # a reader would call it damage (docs/persistence.md)
            index = rows.index(row)
            raise UsageError(
                f"Boundary.rows[{index}] (history row {row.row_id}): seq {row.seq} is not in "
                f"0..{MAX_SEQ}; nothing was written"
            )
    if envelope is not None and envelope.session != session:
        raise _foreign(f"envelope (stream {envelope.stream})", envelope.session, session)
    if operations:
        check_receipts(session, operations)
    for change in boundary.cut_states:
        if type(change.state) is not CutState:
            cut_state(change.state)
    if len(rows) > 1:
        _check_rows(rows)
    if boundary.handles:
        check_handles(boundary.handles)
    if boundary.queue is not None:
        check_queue(session, boundary.queue)
    check_abandon(boundary.abandon)
    check_auto_retry(session, boundary.auto_retry)


def check_auto_retry(session: str, value: object) -> None:
    """Refuse an auto-retry preference that is neither ``None`` nor a ``bool`` (AS-32).

    Raises:
        UsageError: Naming the field and the type given; nothing is written.
    """
    if value is not None and type(value) is not bool:
        raise UsageError(
            f"Boundary.auto_retry of session {session!r} is {type(value).__name__}, not a "
            "bool; nothing was written"
        )


def check_abandon(marker: AbandonMarker | None) -> None:
    """Refuse an abandon marker a reader would call damaged (:func:`abandon_problem`).

    Raises:
        UsageError: Naming the field and what is wrong; nothing is written.
    """
    if marker is None:
        return
    problem = abandon_problem(marker.reason, marker.user_row)
    if problem is not None:
        raise UsageError(f"Boundary.abandon: {problem}; nothing was written")


def abandon_problem(reason: object, user_row: object) -> str | None:
    """What a reader would call damaged in an abandon marker (naming the field), or ``None``.

    The reason is non-empty text of at most ``MAX_ABANDON_REASON_BYTES`` in UTF-8; the user
    row is text or unset.
    """
    if type(reason) is not str:
        return f"$.reason: {_type_name(reason)}, not text"
    if not reason:
        return "$.reason: empty (a marker says why its turn was given up)"
    try:
        size = len(reason.encode())
    except UnicodeEncodeError:
        return "$.reason: not encodable as UTF-8"
    if size > MAX_ABANDON_REASON_BYTES:
        return f"$.reason: {size:,} bytes, more than {MAX_ABANDON_REASON_BYTES:,}"
    if user_row is not None and type(user_row) is not str:
        return f"$.user_row: {_type_name(user_row)}, not text"
    if user_row is not None and not _utf8(user_row):
        return "$.user_row: not encodable as UTF-8"
    return None


def _type_name(value: object) -> str:
    """A value's type as a damage message names it (stored text that is not UTF-8 says so)."""
    return repr(value) if isinstance(value, NotUtf8) else type(value).__name__


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


#: The kinds a queued entry may have (``message_queue.EntryKind``'s values).
QUEUED_KINDS = frozenset({"user", "wake", "report", "system", "follow-up"})


def check_queue(session: str, snapshot: QueueSnapshot) -> None:
    """Refuse a queue snapshot a reader would call damaged, or one of another session.

    Raises:
        UsageError: Naming the entry and what is wrong; nothing is written.
    """
    version = snapshot.version
    if type(version) is not int or not 1 <= version <= MAX_SEQ:
        raise UsageError(
            f"Boundary.queue: version {clip(repr(version))} is not an integer in 1..{MAX_SEQ}; "
            "nothing was written"
        )
    seen: set[str] = set()
    for index, record in enumerate(snapshot.entries):
        where = f"Boundary.queue.entries[{index}] ({record.entry_id!r})"
        if record.session != session:
            raise _foreign(
                f"queue.entries[{index}] (entry {record.entry_id})", record.session, session
            )
        problem = queued_problem(record)
        if problem is not None:
            raise UsageError(f"{where}: {problem}; nothing was written")
        if record.entry_id in seen:
            raise UsageError(f"{where}: the entry id is given twice; nothing was written")
        seen.add(record.entry_id)
    for index, kept in enumerate(snapshot.keep):
        if type(kept) is not str:
            raise UsageError(
                f"Boundary.queue.keep[{index}]: {clip(repr(kept))} is not an entry id (text); "
                "nothing was written"
            )


def queued_problem(record: object) -> str | None:
    """What a reader would call damaged in a queued entry record (naming the field), or ``None``."""
    entry_id = getattr(record, "entry_id", None)
    position = getattr(record, "position", None)
    kind = getattr(record, "kind", None)
    body = getattr(record, "body", None)
    if type(entry_id) is not str or not entry_id:
        return "$.entry_id: not a non-empty string"
    if type(position) is not int or not 0 <= position <= MAX_SEQ:
        return f"$.position: {clip(repr(position))} is not an integer in 0..{MAX_SEQ}"
    if type(kind) is not str or kind not in QUEUED_KINDS:
        return f"$.kind: {clip(repr(kind))} is not one of {', '.join(sorted(QUEUED_KINDS))}"
    if type(body) is not bytes or not body:
        return "$.body: not a non-empty byte string"
    if len(body) > MAX_QUEUED_BYTES:
        return f"$.body: {len(body)} bytes, more than {MAX_QUEUED_BYTES}"
    return None


def check_receipts(session: str, operations: Sequence[OperationRecord]) -> None:
    """``check_boundary`` for a boundary's receipts (all of a receipts-only boundary's checks).

    Raises:
        UsageError: A receipt of another session, or one whose capability a store cannot
            read back; nothing is written.
    """
    for record in operations:  # two receipts boundaries per tool step: one test per receipt
        capability = record.capability
        if not (
            record.session == session
            and type(capability) is Capability
            and type(capability.kind) is ToolKind
            and type(capability.name) is str
            and capability.name
        ):
            raise _receipt_problem(session, operations)


def check_handles(handles: Sequence[HandleRecord]) -> None:
    """``check_boundary`` for a boundary's handle records (B10).

    Raises:
        UsageError: A record :func:`handle_problem` finds wrong, naming its index, id and
            field, or a handle id the boundary holds twice; nothing is written.
    """
    seen: set[str] = set()
    for index, record in enumerate(handles):
        problem = handle_problem(record) or _oversized(record)
        if problem is not None:
            raise UsageError(
                f"Boundary.handles[{index}] ({record.handle_id!r}){problem}; nothing was written"
            )
        if record.handle_id in seen:
            raise UsageError(
                f"handle {record.handle_id!r} appears twice in one boundary; nothing was written"
            )
        seen.add(record.handle_id)


_ENCODE = msgspec.json.Encoder().encode
_ID_FIELDS = ("handle_id", "owner", "target", "turn_id")


def _oversized(record: HandleRecord) -> str | None:
    """Refuse a record larger than a store reads back (a reader would call it damage)."""
    size = len(_ENCODE(record))
    if size <= MAX_HANDLE_BYTES:
        return None
    return f": {size:,} bytes, more than a handle record holds ({MAX_HANDLE_BYTES:,})"


def handle_problem(record: HandleRecord) -> str | None:
    """What is wrong with a handle record, led by its field (``.owner: empty``); else ``None``.

    The rules a commit refuses by and a reader calls damage: ids are non-empty text, the
    owner is not the target, deferred ids are non-empty and distinct, ``reason`` and
    ``report`` are text when set, the status is a ``HandleStatus``, ``reason`` is set exactly
    when settled, ``report`` only on a completed handle and ``delivered`` only on a settled
    one.
    """
    return _handle_text_problem(record) or _handle_status_problem(record)


def _handle_text_problem(record: HandleRecord) -> str | None:
    """``handle_problem``'s rules for the record's ids and texts."""
    for name in _ID_FIELDS:
        value = getattr(record, name)
        if type(value) is not str or not value:
            return f".{name}: empty" if value == "" else f".{name}: {value!r} is not text"
    if record.owner == record.target:
        return f".target: {record.target!r} is the owner (a session delegates to another)"
    seen: set[str] = set()
    for index, stream in enumerate(record.deferred):
        if type(stream) is not str or not stream:
            return f".deferred[{index}]: empty" if stream == "" else f".deferred[{index}]: not text"
        if stream in seen:
            return f".deferred[{index}]: {stream!r} is there twice"
        seen.add(stream)
    for name in ("reason", "report"):
        value = getattr(record, name)
        if value is not None and type(value) is not str:
            return f".{name}: {type(value).__name__}, not text"
    return None


def _handle_status_problem(record: HandleRecord) -> str | None:
    """``handle_problem``'s rules for what a handle's status allows."""
    status = record.status
    if type(status) is not HandleStatus:
        return f".status: {status!r} is not a HandleStatus"
    settled = status is not HandleStatus.ACTIVE
    if settled and not record.reason:
        return f".reason: a {status.value} handle needs one (why it settled)"
    if not settled and record.reason is not None:
        return ".reason: an active handle has none"
    if record.report is not None and status is not HandleStatus.COMPLETED:
        return f".report: only a completed handle has one (this one is {status.value})"
    if record.delivered and not settled:
        return ".delivered: only a settled handle is delivered"
    return None


def _receipt_problem(session: str, operations: Sequence[OperationRecord]) -> UsageError:
    """The refusal of the first receipt ``check_receipts`` cannot take, named by its index."""
    for index, record in enumerate(operations):
        if record.session != session:
            return _foreign(f"operations[{index}] ({record.op_id})", record.session, session)
        if not _sound_capability(record.capability):
            return _bad_capability(index, record)
    raise AssertionError("check_receipts refused a sound boundary")  # pragma: no cover


def _foreign(field: str, belongs: str, session: str) -> UsageError:
    return UsageError(
        f"Boundary.{field} belongs to session {belongs!r}, not to {session!r}: a boundary "
        "holds one session's records"
    )


def _sound_capability(capability: object) -> bool:
    """A ``Capability`` of a ``ToolKind`` and a name: what a store can write and read back."""
    return (
        type(capability) is Capability
        and type(capability.kind) is ToolKind
        and type(capability.name) is str
        and capability.name != ""
    )


def _bad_capability(index: int, record: OperationRecord) -> UsageError:
    """Refuse a receipt whose capability is not a pair a store can read back.

    Both stores refuse it alike: SQLite would store text it then reads as corrupt, and the
    memory store would hand back what a SQLite store never could.
    """
    return UsageError(
        f"Boundary.operations[{index}] ({record.op_id}).capability is {record.capability!r}: "
        "a receipt's capability is a Capability(kind=ToolKind, name=str) with a name"
    )


def _check_rows(rows: Sequence[HistoryRow]) -> None:
    """Refuse rows that repeat a row_id or a seq among themselves (one session's rows)."""
    ids: set[str] = set()
    seqs: dict[int, str] = {}
    for row in rows:
        if row.row_id in ids:
            raise UsageError(
                f"history row {row_key(row.session, row.row_id)} appears twice in one boundary"
            )
        holder = seqs.get(row.seq)
        if holder is not None:
            raise duplicate_seq(row, holder)
        ids.add(row.row_id)
        seqs[row.seq] = row.row_id


def fence(session: str, current: str | None, given: str | None) -> None:
    """Refuse a commit whose owner token is not the store's current owner.

    Raises:
        StaleOwner: ``given`` is not ``current`` (a store without an owner, closed or
            read-only, owns nothing: every token is stale for it).
    """
    if current is None or given != current:
        raise StaleOwner(session)


def cut_state(value: CutState | str) -> CutState:
    """Return ``value`` as a :class:`CutState`, or raise :class:`UsageError` naming it."""
    if type(value) is CutState:  # the engine's own changes: nothing to parse
        return value
    try:
        return CutState(value)
    except ValueError:
        allowed = ", ".join(state.value for state in CutState)
        raise UsageError(f"unknown cut state {value!r} (expected one of: {allowed})") from None


def not_open() -> UsageError:
    """The error for a verb called on a store that is not open."""
    return UsageError("the store is not open (use `async with store:` or `await store.open()`)")


def unknown_session(session: str) -> UsageError:
    """The error for a write that names a session the store does not hold."""
    return UsageError(f"unknown session {session!r}")


def session_conflict(stored: SessionRecord, given: SessionRecord) -> UsageError:
    """The error for creating a session whose id is taken by a different record."""
    return UsageError(
        f"session {given.id!r} already exists with different fields "
        f"(stored {stored!r}, given {given!r})"
    )


def duplicate_row_id(row: HistoryRow) -> UsageError:
    """The error for adding a row whose (session, row_id) is taken."""
    return UsageError(f"history row {row_key(row.session, row.row_id)} already exists")


def duplicate_seq(row: HistoryRow, holder: str) -> UsageError:
    """The error for adding a row whose (session, seq) is held by row ``holder``."""
    return UsageError(
        f"seq {row.seq} of session {row.session!r} is already taken by history row "
        f"{row_key(row.session, holder)} (adding {row_key(row.session, row.row_id)})"
    )


def no_row(session: str, row_id: str) -> UsageError:
    """The error for a verb that names a history row the store does not hold."""
    return UsageError(f"no history row {row_key(session, row_id)}")


def no_cut(session: str, row_id: str) -> UsageError:
    """The error for setting the cut state of a row that carries no cut record."""
    return UsageError(f"history row {row_key(session, row_id)} has no cut record")


def order_receipts(
    records: Sequence[OperationRecord],
    *,
    session: str | None,
    op_id: str | None = None,
    states: frozenset[OpState] | None,
    recent: int | None,
) -> tuple[OperationRecord, ...]:
    """``receipts()``'s filter and order, shared by both stores (records oldest first in)."""
    chosen = [
        r
        for r in records
        if (session is None or r.session == session)
        and (op_id is None or r.op_id == op_id)
        and (states is None or r.state in states)
    ]
    indeterminate = [r for r in chosen if r.state is OpState.INDETERMINATE]
    running = [r for r in chosen if r.state in (OpState.REQUESTED, OpState.RUNNING)]
    done = [r for r in reversed(chosen) if r.state not in OPEN_OP_STATES]
    if recent is not None:
        done = done[: max(recent, 0)]
    return (*indeterminate, *running, *done)
