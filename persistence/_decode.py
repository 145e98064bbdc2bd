"""Reading SQLite rows back into records, validating every column and record (R61).

A value that fails validation raises :class:`~persistence.CorruptRecord` naming the table, the
row's key and the field path; it is never read as absent, and nothing is written. Every value
is bounded: a record's size (``MAX_RECORD_BYTES``), its nesting (a ``RecursionError`` of the
decoder is damage), a seq (``MAX_SEQ``) and a budget (``MAX_STEPS``); TEXT that is not UTF-8
reads as ``NotUtf8`` (``persistence._text``) and fails its column's check. A message shows a
long value cut (``clip``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

import msgspec

from persistence import _checks
from persistence._errors import CorruptRecord
from persistence._partial import decode_parts
from persistence._text import NotUtf8, clip
from persistence.records import (
    MAX_HANDLE_BYTES,
    MAX_RECEIPT_BYTES,
    MAX_RECORD_BYTES,
    MAX_SEQ,
    RETRY_SETTINGS,
    AbandonMarker,
    Capability,
    CutRecord,
    CutState,
    HandleRecord,
    HistoryRow,
    OperationRecord,
    QueuedEntryRecord,
    QueueQuery,
    RecoverableCut,
    RecoveryScan,
    RowKind,
    SessionLoad,
    SessionRecord,
    SessionTail,
    ToolKind,
    TurnEnvelope,
)

_KINDS = "|".join(re.escape(kind.value) for kind in ToolKind)
#: A stored capability: ``kind:name``, a known kind and a name of at least one character.
CAPABILITY_TEXT = Annotated[str, msgspec.Meta(pattern=f"^({_KINDS}):(?s:.)")]
_CAPABILITY_PARTS = re.compile(f"(?P<kind>{_KINDS}):(?P<name>.+)", re.DOTALL)


def _stored_operation() -> type[msgspec.Struct]:
    """A receipt as the store keeps it: ``OperationRecord``'s fields, the capability as text.

    Derived from ``OperationRecord`` (same fields, order, defaults), so a field added there is
    stored without a change here, and a stored receipt keeps its bytes (``client:bash``).
    """
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for field in msgspec.structs.fields(OperationRecord):
        annotation = CAPABILITY_TEXT if field.name == "capability" else field.type
        default = () if field.required else (field.default,)
        fields.append((field.name, annotation, *default))
    return msgspec.defstruct(
        "StoredOperationRecord", fields, frozen=True, kw_only=True, gc=False, module=__name__
    )


_CUT = msgspec.json.Decoder(CutRecord)
_SESSION = msgspec.json.Decoder(SessionRecord)
_ENVELOPE = msgspec.json.Decoder(TurnEnvelope)
_OPERATION = msgspec.json.Decoder(_stored_operation())
_HANDLE = msgspec.json.Decoder(HandleRecord)
log = logging.getLogger("turnkeeper.persistence")
_MSGSPEC_PATH = re.compile(r"^(?P<message>.*) - at `\$(?P<path>[^`]*)`$", re.DOTALL)
T = TypeVar("T")


def _decode_error(table: str, key: str, exc: msgspec.DecodeError, prefix: str) -> CorruptRecord:
    """A CorruptRecord whose detail leads with the field path, msgspec's message after it."""
    text = str(exc)
    match = _MSGSPEC_PATH.match(text)
    path, message = (match["path"], match["message"]) if match else ("", text)
    return CorruptRecord(table, key, f"${prefix}{path}: {clip(message.replace('`', ''))}")


def _decoded(
    decoder: msgspec.json.Decoder[T],
    blob: bytes | str,
    where: tuple[str, str, str],
    limit: int = MAX_RECORD_BYTES,
) -> T:
    """``blob`` decoded, or the CorruptRecord at ``where`` (table, key, field prefix).

    Raises:
        CorruptRecord: Larger than ``limit``, nested deeper than the decoder goes, not UTF-8,
            or not the record's shape.
    """
    table, key, prefix = where
    if len(blob) > limit:
        detail = f"${prefix}: {len(blob):,} bytes, more than a record holds ({limit:,})"
        raise CorruptRecord(table, key, detail)
    try:
        return decoder.decode(blob)
    except msgspec.DecodeError as exc:
        raise _decode_error(table, key, exc, prefix) from None
    except RecursionError:
        raise CorruptRecord(table, key, f"${prefix}: nested too deep to be a record") from None
    except OverflowError as exc:  # a number no Python type holds
        raise CorruptRecord(table, key, f"${prefix}: {clip(str(exc))}") from None


def _mismatch(table: str, key: str, path: str, expected: str, value: object) -> CorruptRecord:
    if isinstance(value, NotUtf8):
        return CorruptRecord(table, key, f"${path}: Expected {expected}, got {value!r}")
    return CorruptRecord(table, key, f"${path}: Expected {expected}, got {type(value).__name__}")


#: The cut states a row may hold in its ``cut_state`` column (``None``: no cut record).
CUT_STATES = frozenset(state.value for state in CutState)
#: Column values of a cut row that owes nothing: a load may skip such a row's damaged record.
_SETTLED = frozenset(CUT_STATES - {CutState.OWED.value}) | {None}


def _blob(table: str, key: str, path: str, value: object) -> CorruptRecord | None:
    """A CorruptRecord when a stored record is not a blob or text (msgspec reads only those)."""
    if type(value) in (bytes, str):
        return None
    return _mismatch(table, key, path, "bytes", value)


_ROW_KINDS = {kind.value: kind for kind in RowKind}


def _columns(values: Sequence[Any]) -> RowKind:
    """Check a history row's own columns; its kind.

    Sound columns pass one test (every history read runs this for each row); the first that
    fails is named by :func:`_column_problem`.

    Raises:
        CorruptRecord: A column fails validation.
    """
    session, seq, row_id, kind, stream, cut_state, _cut, body = values
    if (
        type(session) is str
        and type(seq) is int
        and 0 <= seq <= MAX_SEQ
        and type(row_id) is str
        and type(body) is bytes
        and (stream is None or type(stream) is str)
        and (cut_state is None or cut_state in CUT_STATES)
        and type(kind) is str
    ):
        row_kind = _ROW_KINDS.get(kind)
        if row_kind is not None:
            return row_kind
    raise _column_problem(values)


def _column_problem(values: Sequence[Any]) -> CorruptRecord:
    """The first of a history row's columns that fails validation, named."""
    session, seq, row_id, kind, stream, cut_state, _cut, body = values
    key = _checks.row_key(clip(session), clip(row_id))
    for path, value, expected in (
        (".session", session, str),
        (".seq", seq, int),
        (".row_id", row_id, str),
        (".body", body, bytes),
    ):
        if type(value) is not expected:
            return _mismatch("history_rows", key, path, expected.__name__, value)
    if not 0 <= seq <= MAX_SEQ:
        return CorruptRecord("history_rows", key, f"$.seq: {seq} is not in 0..{MAX_SEQ}")
    if stream is not None and type(stream) is not str:
        return _mismatch("history_rows", key, ".stream", "str | None", stream)
    if cut_state is not None and cut_state not in CUT_STATES:
        return CorruptRecord(
            "history_rows",
            key,
            f"$.cut_state: Invalid enum value {clip(repr(cut_state))} (not a CutState)",
        )
    return CorruptRecord("history_rows", key, f"$.kind: Invalid enum value {clip(repr(kind))}")


def _cut(session: str, row_id: str, cut_state: object, cut_blob: object) -> CutRecord | None:
    """The row's cut record, agreeing with its ``cut_state`` column.

    Raises:
        CorruptRecord: The record fails validation or disagrees with the column.
    """
    if cut_blob is None and cut_state is None:  # most rows: no cut record
        return None
    key = _checks.row_key(clip(session), clip(row_id))
    cut: CutRecord | None = None
    if cut_blob is not None:
        if not isinstance(cut_blob, bytes | str) or isinstance(cut_blob, NotUtf8):
            raise _mismatch("history_rows", key, ".cut", "bytes", cut_blob)
        cut = _decoded(_CUT, cut_blob, ("history_rows", key, ".cut"))
    if (None if cut is None else cut.state.value) != cut_state:
        raise CorruptRecord(
            "history_rows",
            key,
            f"$.cut.state: the record says {None if cut is None else cut.state.value!r}, "
            f"the cut_state column says {clip(repr(cut_state))}",
        )
    return cut


def decode_row(values: Sequence[Any]) -> HistoryRow:
    """Build a history row from its columns, validating each one.

    Raises:
        CorruptRecord: A column or the cut record fails validation.
    """
    session, seq, row_id, _kind, stream, cut_state, cut_blob, body = values
    row_kind = _columns(values)
    return HistoryRow(
        session=session,
        seq=seq,
        row_id=row_id,
        kind=row_kind,
        body=body,
        stream=stream,
        cut=_cut(session, row_id, cut_state, cut_blob),
    )


def decode_history_row(values: Sequence[Any]) -> tuple[HistoryRow, CorruptRecord | None]:
    """A row for a session's history: a damaged cut record the row does not need is skipped.

    When the ``cut_state`` column says the record owes nothing (or there is none) and only the
    record fails validation, the row comes back without it, with the problem; the history (its
    bodies) is whole, and the stored record stays as it is.

    Raises:
        CorruptRecord: A column fails validation, or the damaged record may be owed.
    """
    session, seq, row_id, _kind, stream, cut_state, cut_blob, body = values
    row_kind = _columns(values)
    problem: CorruptRecord | None = None
    try:
        cut = _cut(session, row_id, cut_state, cut_blob)
    except CorruptRecord as error:
        if cut_state not in _SETTLED:
            raise
        cut, problem = None, error
    row = HistoryRow(
        session=session, seq=seq, row_id=row_id, kind=row_kind, body=body, stream=stream, cut=cut
    )
    return row, problem


def decode_session(values: Sequence[Any]) -> SessionRecord:
    """Build a session record from its ``(id, record)`` columns.

    Raises:
        CorruptRecord: The record fails validation or names another id.
    """
    session_id, blob = values
    key = clip(str(session_id))
    wrong = _blob("sessions", key, "", blob)
    if wrong is not None:
        raise wrong
    record = _decoded(_SESSION, blob, ("sessions", key, ""))
    if record.id != session_id:
        raise CorruptRecord("sessions", key, f"$.id: the record says {clip(repr(record.id))}")
    return record


def decode_envelope(values: Sequence[Any]) -> TurnEnvelope:
    """Build a turn envelope from its ``(session, stream, record)`` columns.

    Raises:
        CorruptRecord: The record fails validation or names another (session, stream).
    """
    session, stream, blob = values
    key = f"{clip(session)}/{clip(stream)}"
    wrong = _blob("turn_envelopes", key, "", blob)
    if wrong is not None:
        raise wrong
    envelope = _decoded(_ENVELOPE, blob, ("turn_envelopes", key, ""))
    if (envelope.session, envelope.stream) != (session, stream):
        said = f"{clip(envelope.session)}/{clip(envelope.stream)}"
        raise CorruptRecord("turn_envelopes", key, f"$: the record is for {said}")
    return envelope


def decode_operation(values: Sequence[Any]) -> OperationRecord:
    """Build a receipt from its ``(op_id, state, record)`` columns.

    Raises:
        CorruptRecord: The record fails validation or disagrees with its columns.
    """
    op_id, state, blob = values
    key = clip(str(op_id))
    wrong = _blob("operations", key, "", blob)
    if wrong is not None:
        raise wrong
    where = ("operations", key, "")
    stored = msgspec.structs.asdict(_decoded(_OPERATION, blob, where, MAX_RECEIPT_BYTES))
    # The text matched CAPABILITY_TEXT: it is a known kind, a colon and a name.
    parts = _CAPABILITY_PARTS.fullmatch(stored["capability"])
    assert parts is not None
    stored["capability"] = Capability(kind=ToolKind(parts["kind"]), name=parts["name"])
    record = OperationRecord(**stored)
    if record.op_id != op_id or record.state.value != state:
        said, columns = f"{clip(record.op_id)}/{record.state.value}", f"{key}/{clip(state)}"
        raise CorruptRecord("operations", key, f"$: the record says {said}, the columns {columns}")
    return record


def decode_handle(values: Sequence[Any]) -> HandleRecord:
    """Build a handle record from its ``(handle_id, owner, target, status, record)`` columns.

    Raises:
        CorruptRecord: The record fails validation (its shape, or a rule a commit refuses
            by: ``_checks.handle_problem``) or disagrees with its columns.
    """
    handle_id, owner, target, status, blob = values
    key = clip(str(handle_id))
    wrong = _blob("handles", key, "", blob)
    if wrong is not None:
        raise wrong
    record = _decoded(_HANDLE, blob, ("handles", key, ""), MAX_HANDLE_BYTES)
    for name, column in (
        ("handle_id", handle_id),
        ("owner", owner),
        ("target", target),
        ("status", status),
    ):
        said = getattr(record, name)
        if said != column:
            raise CorruptRecord(
                "handles",
                key,
                f"$.{name}: the record says {clip(repr(str(said)))}, "
                f"the {name} column says {clip(repr(column))}",
            )
    problem = _checks.handle_problem(record)
    if problem is not None:
        raise CorruptRecord("handles", key, f"${problem}")
    return record


#: Where queued entries and queue versions are kept (``docs/persistence.md``, "The queue").
QUEUED_TABLE, VERSIONS_TABLE = "queued_entries", "queue_versions"


def _name(value: object) -> str:
    """A key column as a report names it: its exact text, or the cut repr of other values.

    Exact, since the layer above keeps a damaged entry by this id (``QueueSnapshot.keep``).
    """
    return value if type(value) is str else clip(repr(value))


def decode_queued(values: Sequence[Any]) -> QueuedEntryRecord:
    """Build a queued entry from its ``(session, entry_id, position, kind, body)`` columns.

    The body is kept as it is: the layer above decodes it (``message_queue.decode_entry``).

    Raises:
        CorruptRecord: A column fails validation (``_checks.queued_problem``, or a session
            that is not text), naming the field.
    """
    session, entry_id, position, kind, body = values
    record = QueuedEntryRecord(
        session=session, entry_id=entry_id, position=position, kind=kind, body=body
    )
    problem = _checks.queued_problem(record)
    if problem is None and type(session) is str:
        return record
    key = f"{clip(_name(session))}/{clip(_name(entry_id))}"
    raise CorruptRecord(QUEUED_TABLE, key, problem or f"$.session: {_name(session)} is not text")


def decode_queue_version(values: Sequence[Any]) -> int:
    """A session's queue version from its ``(session, version)`` columns.

    Raises:
        CorruptRecord: It is not an integer in 1..MAX_SEQ.
    """
    session, version = values
    if type(version) is int and 1 <= version <= MAX_SEQ:
        return version
    raise CorruptRecord(
        VERSIONS_TABLE,
        clip(_name(session)),
        f"$.version: {clip(repr(version))} is not an integer in 1..{MAX_SEQ}",
    )


#: Where abandon markers are kept (``docs/persistence.md``, "Abandon markers").
ABANDON_TABLE = "abandon_markers"


def decode_abandon(values: Sequence[Any]) -> AbandonMarker:
    """A session's abandon marker from its ``(session, reason, user_row)`` columns.

    Raises:
        CorruptRecord: A column a commit would refuse (``_checks.abandon_problem``: a reason
            that is empty, not text or too long, a user row that is not text), naming the field.
    """
    session, reason, user_row = values
    problem = _checks.abandon_problem(reason, user_row)
    if problem is None:
        return AbandonMarker(reason=reason, user_row=user_row)
    raise CorruptRecord(ABANDON_TABLE, clip(_name(session)), problem)


def decode_retry(values: Sequence[Any]) -> bool:
    """A session's auto-retry preference from its ``(session, auto_retry)`` columns (AS-32).

    Raises:
        CorruptRecord: The value is not the integer 0 or 1, naming ``$.auto_retry``; its
            detail says it reads as off (the readers do: :func:`_retry_or_off`).
    """
    session, value = values
    if type(value) is int and value in (0, 1):
        return value == 1
    raise CorruptRecord(
        RETRY_SETTINGS,
        clip(_name(session)),
        f"$.auto_retry: {clip(repr(value))} is not 0 or 1 (read as off)",
    )


def _retry_or_off(values: Sequence[Any]) -> tuple[bool, CorruptRecord | None]:
    """The stored preference; off, with the problem, when it is damaged.

    Fail safe: a damaged preference never retries a turn the user may have switched retries
    off for. The stored row is left as it is.
    """
    try:
        return decode_retry(values), None
    except CorruptRecord as error:
        return False, error


def _queue(
    rows: Sequence[Sequence[Any]],
) -> tuple[list[QueuedEntryRecord], list[tuple[str, str, str]]]:
    """The entries that validate, and ``(session, entry id, problem)`` for each that does not."""
    records: list[QueuedEntryRecord] = []
    damaged: list[tuple[str, str, str]] = []
    for values in rows:
        try:
            records.append(decode_queued(values))
        except CorruptRecord as error:
            damaged.append((_name(values[0]), _name(values[1]), str(error)))
    return records, damaged


def decode_queue_query(
    entries: Sequence[Sequence[Any]], versions: Sequence[Sequence[Any]]
) -> QueueQuery:
    """What ``queued()`` returns from the raw rows: damaged entries and versions reported.

    A damaged entry is reported by its ``session/entry`` key, a damaged version by its
    session; each is left out, and stays as it is in the store.
    """
    records, damaged = _queue(entries)
    corrupt = [(f"{session}/{entry_id}", detail) for session, entry_id, detail in damaged]
    good: list[tuple[str, int]] = []
    for values in versions:
        try:
            good.append((_name(values[0]), decode_queue_version(values)))
        except CorruptRecord as error:
            corrupt.append((_name(values[0]), str(error)))
    return QueueQuery(records=tuple(records), versions=tuple(good), corrupt=tuple(corrupt))


class Scan(msgspec.Struct, frozen=True, kw_only=True):
    """The raw startup scan (``_writes.scan_recoverable``), read in one transaction.

    For the sessions owing a cut: their owed rows, the rows after each one's last owed row,
    their records and envelope stream ids. Every session holding a queued entry. For the
    tails (sessions owing nothing whose history ends unanswered): their rows from the last
    user row on, records, envelope stream ids, last envelopes (with whether a row names its
    stream), abandon markers and auto-retry preferences. The queue versions of both.
    """

    owed: list[Any]
    trailing: list[Any]
    sessions: list[Any]
    streams: list[Any]
    queued: list[Any]
    versions: list[Any]
    tail_rows: list[Any]
    tail_sessions: list[Any]
    tail_streams: list[Any]
    last_envelopes: list[Any]
    abandon: list[Any]
    retry: list[Any]


def _by_session(
    raw: Sequence[Sequence[Any]], decode: Callable[[Sequence[Any]], T], corrupt: dict[str, str]
) -> dict[str, list[T]]:
    """Each session's decoded values (keyed by the first column); a failure goes to ``corrupt``."""
    decoded: dict[str, list[T]] = {}
    for values in raw:
        name = str(values[0])
        try:
            value = decode(values)
        except CorruptRecord as error:
            corrupt.setdefault(name, str(error))
            continue
        decoded.setdefault(name, []).append(value)
    return decoded


def _stream_ids(streams: Sequence[Sequence[Any]]) -> dict[str, list[str]]:
    ids: dict[str, list[str]] = {}
    for name, stream in streams:
        ids.setdefault(str(name), []).append(str(stream))
    return ids


def recovery_scan(raw: Scan) -> RecoveryScan:
    """Decode the raw scan, by session: its owed rows or its tail, its record and the rest.

    A session any of whose values fails validation (its owed or later rows, its tail's rows,
    its record, its queue version, its last envelope, its abandon marker) is reported in
    ``corrupt`` (the first problem found) and left out of ``cuts`` and ``tails``: nothing of
    it is read as absent. ``queued`` names the sessions holding a queued entry (valid or
    damaged: recovery loads each, and ``load`` reports the damage). A tail's damaged
    auto-retry preference is logged at ERROR and read as off; the tail is kept.
    """
    corrupt: dict[str, str] = {}
    owed = _by_session(raw.owed, decode_row, corrupt)
    after = _by_session(raw.trailing, decode_row, corrupt)
    tail_rows = _by_session(raw.tail_rows, decode_row, corrupt)
    records = {
        name: found[0]
        for name, found in _by_session(
            [*raw.sessions, *raw.tail_sessions], decode_session, corrupt
        ).items()
    }
    versions = _by_session(raw.versions, lambda values: decode_queue_version(values), corrupt)
    markers = _by_session(raw.abandon, decode_abandon, corrupt)
    last = _by_session(
        raw.last_envelopes, lambda values: (decode_envelope(values[:3]), bool(values[3])), corrupt
    )
    for name in (*owed, *tail_rows):
        if name not in records and name not in corrupt:
            corrupt[name] = str(
                CorruptRecord("sessions", clip(name), "$: no session row for its history")
            )

    def version(name: str) -> int:
        return versions[name][0] if name in versions else 0

    streams = _stream_ids(raw.streams)
    cuts = [
        RecoverableCut(
            session=records[name],
            owed=tuple(rows),
            after=tuple(after.get(name, ())),
            streams=tuple(streams.get(name, ())),
            queue_version=version(name),
        )
        for name, rows in owed.items()
        if name not in corrupt
    ]
    tail_streams = _stream_ids(raw.tail_streams)
    retry_off: set[str] = set()
    for values in raw.retry:
        on, problem = _retry_or_off(values)
        if problem is not None:
            log.error("%s", problem)
        if not on:
            retry_off.add(str(values[0]))
    tails = []
    for name, rows in tail_rows.items():
        if name in corrupt:
            continue
        envelope, ended = last[name][0] if name in last else (None, False)
        marker = markers.get(name)
        tails.append(
            SessionTail(
                session=records[name],
                rows=tuple(rows),
                last_seq=rows[-1].seq,
                streams=tuple(tail_streams.get(name, ())),
                envelope=envelope,
                envelope_ended=ended,
                queue_version=version(name),
                abandon=marker[0] if marker else None,
                auto_retry=name not in retry_off,
            )
        )
    return RecoveryScan(
        cuts=tuple(cuts),
        queued=tuple(_name(values[0]) for values in raw.queued),
        tails=tuple(tails),
        corrupt=tuple(sorted(corrupt.items())),
    )


def decode_load(
    session: Sequence[Sequence[Any]],
    rows: Sequence[Sequence[Any]],
    envelopes: Sequence[Sequence[Any]],
    queued: Sequence[Sequence[Any]] = (),
    version: Sequence[Sequence[Any]] = (),
    abandon: Sequence[Sequence[Any]] = (),
    parts: Sequence[Sequence[Any]] = (),
    retry: Sequence[Sequence[Any]] = (),
) -> SessionLoad | None:
    """Build a session's load from its raw rows; ``None`` when there is no session row.

    A damaged cut record of a row that owes nothing is reported in ``corrupt`` and the row
    comes back without it (:func:`decode_history_row`); a damaged queued entry is reported in
    ``queue_corrupt`` by its entry id and left out of ``queue``; a damaged partial part ends
    its stream's parts there as a gap, and is logged (:func:`~persistence._partial.decode_parts`);
    a damaged auto-retry preference reads as off and is reported in ``corrupt`` under
    ``RETRY_SETTINGS``.

    Raises:
        CorruptRecord: The session, a row's columns, a cut record that may be owed, an
            envelope, the queue version (the next snapshot's version is counted from it: one
            read as 0 would be skipped for ever) or the abandon marker (never read as "no
            marker": a turn given up would be retried) fails validation.
    """
    if not session:
        return None
    record = decode_session(session[0])
    history: list[HistoryRow] = []
    corrupt: list[tuple[str, str]] = []
    for values in rows:
        row, problem = decode_history_row(values)
        history.append(row)
        if problem is not None:
            corrupt.append((row.row_id, str(problem)))
    entries, damaged = _queue(queued) if queued else ([], [])
    auto_retry = True
    if retry:
        auto_retry, problem = _retry_or_off(retry[0])
        if problem is not None:
            corrupt.append((RETRY_SETTINGS, str(problem)))
    return SessionLoad(
        record=record,
        rows=tuple(history),
        envelopes=tuple(decode_envelope(values) for values in envelopes),
        corrupt=tuple(corrupt),
        queue=tuple(entries),
        queue_version=decode_queue_version(version[0]) if version else 0,
        queue_corrupt=tuple((entry_id, detail) for _, entry_id, detail in damaged),
        abandon=decode_abandon(abandon[0]) if abandon else None,
        partials=decode_parts(record.id, parts) if parts else (),
        auto_retry=auto_retry,
    )
