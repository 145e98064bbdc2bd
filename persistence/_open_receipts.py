"""The open receipts: what the overlap guard (OP-9) reads from a store (``docs/operations.md``).

``Store.open_receipts`` answers one question for the guard: which operations may still be
running somewhere? Every receipt whose ``state`` is ``requested``, ``running`` or
``indeterminate``, read through the ``operations_open`` partial index (migration 0002), so its
cost follows the open receipts, never the whole table. A row that fails validation is not
skipped: it is reported with the columns it is indexed by (session, target, state), so the
guard can hold what it might be instead of letting an identical call through.

The SQL and the decoding are here; ``SqliteStore`` and ``MemoryStore`` only delegate.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from persistence._decode import decode_operation
from persistence._errors import CorruptRecord
from persistence._text import clip
from persistence.records import OPEN_OP_STATES, OperationRecord

_COLUMNS = "SELECT op_id, state, record, session, target FROM operations"
#: The ``WHERE`` is the ``operations_open`` index's own (``OPEN_OP_STATES``), so SQLite reads
#: that index.
_OPEN = "state IN ('requested', 'running', 'indeterminate')"
SELECT_OPEN = f"{_COLUMNS} WHERE {_OPEN} ORDER BY rowid"
SELECT_OPEN_IN_SESSION = f"{_COLUMNS} WHERE {_OPEN} AND session = ? ORDER BY rowid"


class DamagedReceipt(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A stored receipt whose state column is open and whose record fails validation.

    It is placed by its indexed columns, which the store writes in the same statement as the
    record; a column that is not text reads as ``None`` (nothing can be placed by it).

    Attributes:
        op_id: Its ``op_id`` column (cut to a displayable length when it is long or not text).
        session: Its ``session`` column, or ``None`` when that is not text.
        target: Its ``target`` column, or ``None`` when that is not text.
        state: Its ``state`` column (``requested``, ``running`` or ``indeterminate``).
        detail: What is wrong with it (the ``CorruptRecord`` message, naming the field).
    """

    op_id: str
    session: str | None
    target: str | None
    state: str
    detail: str


class OpenReceipts(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What ``Store.open_receipts`` found, in the order the receipts were first written.

    Attributes:
        records: The open receipts that validate (requested, running, indeterminate).
        damaged: The rows in an open state that fail validation (never skipped silently).
    """

    records: tuple[OperationRecord, ...] = ()
    damaged: tuple[DamagedReceipt, ...] = ()


def open_query(session: str | None) -> tuple[str, tuple[str, ...]]:
    """The SQL and parameters of ``open_receipts(session)``."""
    if session is None:
        return SELECT_OPEN, ()
    return SELECT_OPEN_IN_SESSION, (session,)


def decode_open(rows: Sequence[Sequence[Any]]) -> OpenReceipts:
    """The answer from ``(op_id, state, record, session, target)`` rows."""
    records: list[OperationRecord] = []
    damaged: list[DamagedReceipt] = []
    for op_id, state, blob, session, target in rows:
        try:
            records.append(decode_operation((op_id, state, blob)))
        except CorruptRecord as error:
            damaged.append(
                DamagedReceipt(
                    op_id=clip(op_id),
                    session=session if isinstance(session, str) else None,
                    target=target if isinstance(target, str) else None,
                    state=str(state),
                    detail=str(error),
                )
            )
    return OpenReceipts(records=tuple(records), damaged=tuple(damaged))


def open_in(records: Iterable[OperationRecord], session: str | None) -> OpenReceipts:
    """The open receipts among ``records`` (a store that holds records, never bytes)."""
    return OpenReceipts(
        records=tuple(
            r for r in records if r.state in OPEN_OP_STATES and session in (None, r.session)
        )
    )
