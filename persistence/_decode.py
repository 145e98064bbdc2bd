"""Reading SQLite rows back into records, validating every column and record (R61).

A value that fails validation raises :class:`~persistence.CorruptRecord` naming the table, the
row's key and the field path; it is never read as absent, and nothing is written.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import msgspec

from persistence import _checks
from persistence._errors import CorruptRecord
from persistence.records import (
    CutRecord,
    HistoryRow,
    OperationRecord,
    RecoverableCut,
    RecoveryScan,
    RowKind,
    SessionRecord,
    TurnEnvelope,
)

_CUT = msgspec.json.Decoder(CutRecord)
_SESSION = msgspec.json.Decoder(SessionRecord)
_ENVELOPE = msgspec.json.Decoder(TurnEnvelope)
_OPERATION = msgspec.json.Decoder(OperationRecord)
_MSGSPEC_PATH = re.compile(r"^(?P<message>.*) - at `\$(?P<path>[^`]*)`$", re.DOTALL)


def _decode_error(table: str, key: str, exc: msgspec.DecodeError, prefix: str) -> CorruptRecord:
    """A CorruptRecord whose detail leads with the field path, msgspec's message after it."""
    text = str(exc)
    match = _MSGSPEC_PATH.match(text)
    path, message = (match["path"], match["message"]) if match else ("", text)
    return CorruptRecord(table, key, f"${prefix}{path}: {message.replace('`', '')}")


def _mismatch(table: str, key: str, path: str, expected: str, value: object) -> CorruptRecord:
    return CorruptRecord(table, key, f"${path}: Expected {expected}, got {type(value).__name__}")


def decode_row(values: Sequence[Any]) -> HistoryRow:
    """Build a history row from its columns, validating each one.

    Raises:
        CorruptRecord: A column or the cut record fails validation.
    """
    session, seq, row_id, kind, stream, cut_state, cut_blob, body = values
    key = _checks.row_key(str(session), str(row_id))
    for path, value, expected in (
        (".session", session, str),
        (".seq", seq, int),
        (".row_id", row_id, str),
        (".body", body, bytes),
    ):
        if type(value) is not expected:
            raise _mismatch("history_rows", key, path, expected.__name__, value)
    if stream is not None and type(stream) is not str:
        raise _mismatch("history_rows", key, ".stream", "str | None", stream)
    try:
        row_kind = RowKind(kind)
    except ValueError:
        raise CorruptRecord("history_rows", key, f"$.kind: Invalid enum value {kind!r}") from None
    cut: CutRecord | None = None
    if cut_blob is not None:
        try:
            cut = _CUT.decode(cut_blob)
        except msgspec.DecodeError as exc:
            raise _decode_error("history_rows", key, exc, ".cut") from None
    if (None if cut is None else cut.state.value) != cut_state:
        raise CorruptRecord(
            "history_rows",
            key,
            f"$.cut.state: the record says {None if cut is None else cut.state.value!r}, "
            f"the cut_state column says {cut_state!r}",
        )
    return HistoryRow(
        session=session, seq=seq, row_id=row_id, kind=row_kind, body=body, stream=stream, cut=cut
    )


def decode_session(values: Sequence[Any]) -> SessionRecord:
    """Build a session record from its ``(id, record)`` columns.

    Raises:
        CorruptRecord: The record fails validation or names another id.
    """
    session_id, blob = values
    try:
        record = _SESSION.decode(blob)
    except msgspec.DecodeError as exc:
        raise _decode_error("sessions", str(session_id), exc, "") from None
    if record.id != session_id:
        raise CorruptRecord("sessions", str(session_id), f"$.id: the record says {record.id!r}")
    return record


def decode_envelope(values: Sequence[Any]) -> TurnEnvelope:
    """Build a turn envelope from its ``(session, stream, record)`` columns.

    Raises:
        CorruptRecord: The record fails validation or names another (session, stream).
    """
    session, stream, blob = values
    key = f"{session}/{stream}"
    try:
        envelope = _ENVELOPE.decode(blob)
    except msgspec.DecodeError as exc:
        raise _decode_error("turn_envelopes", key, exc, "") from None
    if (envelope.session, envelope.stream) != (session, stream):
        raise CorruptRecord(
            "turn_envelopes", key, f"$: the record is for {envelope.session}/{envelope.stream}"
        )
    return envelope


def decode_operation(values: Sequence[Any]) -> OperationRecord:
    """Build a receipt from its ``(op_id, state, record)`` columns.

    Raises:
        CorruptRecord: The record fails validation or disagrees with its columns.
    """
    op_id, state, blob = values
    try:
        record = _OPERATION.decode(blob)
    except msgspec.DecodeError as exc:
        raise _decode_error("operations", str(op_id), exc, "") from None
    if record.op_id != op_id or record.state.value != state:
        raise CorruptRecord(
            "operations",
            str(op_id),
            f"$: the record says {record.op_id}/{record.state.value}, the columns {op_id}/{state}",
        )
    return record


def recovery_scan(
    owed: Sequence[Sequence[Any]],
    trailing: Sequence[Sequence[Any]],
    sessions: Sequence[Sequence[Any]],
    streams: Sequence[Sequence[Any]],
) -> RecoveryScan:
    """Decode the raw scan: owed rows by session (the last one is the candidate)."""
    corrupt: dict[str, str] = {}
    by_session: dict[str, list[HistoryRow]] = {}
    for values in owed:
        name = str(values[0])
        try:
            by_session.setdefault(name, []).append(decode_row(values))
        except CorruptRecord as error:
            corrupt.setdefault(name, str(error))
    records: dict[str, SessionRecord] = {}
    for values in sessions:
        try:
            records[str(values[0])] = decode_session(values)
        except CorruptRecord as error:
            corrupt.setdefault(str(values[0]), str(error))
    after: dict[str, list[Sequence[Any]]] = {}
    for values in trailing:
        after.setdefault(str(values[0]), []).append(values)
    stream_ids: dict[str, list[str]] = {}
    for name, stream in streams:
        stream_ids.setdefault(str(name), []).append(str(stream))
    cuts: list[RecoverableCut] = []
    for name, rows in by_session.items():
        if name in corrupt or name not in records:
            continue
        last = rows[-1]
        tail = after.get(name, [])
        try:
            moved_on = _trailing(name, tail)
        except CorruptRecord as error:
            corrupt[name] = str(error)
            continue
        kinds, follower = moved_on
        cuts.append(
            RecoverableCut(
                session=records[name],
                row=last,
                trailing=kinds,
                follower=follower,
                stale=tuple(r.row_id for r in rows[:-1]),
                last_seq=max([last.seq, *(int(values[1]) for values in tail)]),
                streams=tuple(stream_ids.get(name, ())),
            )
        )
    return RecoveryScan(cuts=tuple(cuts), corrupt=tuple(sorted(corrupt.items())))


#: Rows that leave a cut at its session's tail (see ``RecoverableCut``).
_TAIL_KINDS = frozenset({RowKind.SENTINEL, RowKind.SYSTEM})


def _trailing(
    session: str, tail: Sequence[Sequence[Any]]
) -> tuple[tuple[RowKind, ...], HistoryRow | None]:
    """The kinds of the rows after a cut, and the first of them that moved the turn on.

    Raises:
        CorruptRecord: A row's kind is not a kind, or the follower fails validation.
    """
    kinds: list[RowKind] = []
    follower: HistoryRow | None = None
    for values in tail:
        try:
            kind = RowKind(values[3])
        except ValueError:
            key = _checks.row_key(session, f"seq {values[1]}")
            raise CorruptRecord("history_rows", key, f"$.kind: {values[3]!r}") from None
        kinds.append(kind)
        if follower is None and kind not in _TAIL_KINDS:
            follower = decode_row(values)
    return tuple(kinds), follower
