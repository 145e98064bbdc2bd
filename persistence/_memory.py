"""The in-memory store: plain dicts, the same behaviour as SQLite, nothing durable.

Records are frozen Structs, so the store shares them with callers; it never hands out its own
containers. Every verb checks everything before it changes anything, and contains no ``await``,
so a verb is atomic with respect to other tasks. Closing keeps the contents: a closed and
reopened ``MemoryStore`` holds what it held, like a database file.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Self

import msgspec

from persistence import _checks
from persistence._errors import UsageError
from persistence.records import (
    CutState,
    HistoryRow,
    OperationRecord,
    OpState,
    ReceiptQuery,
    RecoverableCut,
    RecoveryScan,
    RowKind,
    SessionRecord,
    TurnEnvelope,
)

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import TracebackType


class _SessionData:
    """One session's rows, indexed both ways."""

    __slots__ = ("by_id", "by_seq", "envelopes", "record")

    def __init__(self, record: SessionRecord) -> None:
        self.record = record
        self.by_id: dict[str, HistoryRow] = {}
        self.by_seq: dict[int, str] = {}
        self.envelopes: dict[str, TurnEnvelope] = {}


class MemoryStore:
    """A :class:`~persistence.Store` held in memory (tests, ``--memory`` runs)."""

    def __init__(self) -> None:
        self._sessions: dict[str, _SessionData] = {}
        self._operations: dict[str, OperationRecord] = {}
        self._open = False
        self._owner: str | None = None

    def __repr__(self) -> str:
        rows = sum(len(data.by_id) for data in self._sessions.values())
        state = "open" if self._open else "closed"
        return f"<MemoryStore {state} sessions={len(self._sessions)} rows={rows}>"

    async def open(self) -> None:
        """Open the store.

        Raises:
            UsageError: The store is already open.
        """
        if self._open:
            raise UsageError("the store is already open")
        self._open = True
        self._owner = secrets.token_hex(16)

    async def close(self) -> None:
        """Close the store, keeping its contents. Closing a closed store does nothing."""
        self._open = False
        self._owner = None

    @property
    def owner(self) -> str | None:
        """This owner's token: random hex minted at open, ``None`` while closed.

        As in ``SqliteStore.owner``: one object is one owner (a second open of an open store
        is refused), and a reopen mints a new token.
        """
        return self._owner

    async def __aenter__(self) -> Self:
        """Open the store and return it."""
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the store."""
        await self.close()

    def _check_open(self) -> None:
        if not self._open:
            raise _checks.not_open()

    def _session(self, session: str) -> _SessionData:
        data = self._sessions.get(session)
        if data is None:
            raise _checks.unknown_session(session)
        return data

    async def create_session(self, record: SessionRecord) -> None:
        """Create a session; idempotent for an identical record.

        Raises:
            UsageError: A session with this id exists with different fields.
        """
        self._check_open()
        data = self._sessions.get(record.id)
        if data is None:
            self._sessions[record.id] = _SessionData(record)
        elif data.record != record:
            raise _checks.session_conflict(data.record, record)

    async def sessions(self) -> list[SessionRecord]:
        """Every session, ordered by id."""
        self._check_open()
        return [self._sessions[key].record for key in sorted(self._sessions)]

    async def append(self, rows: Sequence[HistoryRow]) -> None:
        """Append history rows atomically.

        Raises:
            UsageError: An unknown session, or a (session, row_id) or (session, seq) already
                taken; nothing of the batch is written.
        """
        self._check_open()
        _checks.check_batch(rows)
        for row in rows:
            data = self._session(row.session)
            if row.row_id in data.by_id:
                raise _checks.duplicate_row_id(row)
            holder = data.by_seq.get(row.seq)
            if holder is not None:
                raise _checks.duplicate_seq(row, holder)
        for row in rows:
            data = self._sessions[row.session]
            data.by_id[row.row_id] = row
            data.by_seq[row.seq] = row.row_id

    async def update_row(self, row: HistoryRow) -> None:
        """Replace the kind, body, stream and cut of the existing row (session, row_id).

        Raises:
            UsageError: No such row, or the stored row has a different seq.
        """
        self._check_open()
        data = self._sessions.get(row.session)
        stored = None if data is None else data.by_id.get(row.row_id)
        if data is None or stored is None:
            raise _checks.no_row(row.session, row.row_id)
        if stored.seq != row.seq:
            raise _checks.seq_mismatch(row, stored.seq)
        data.by_id[row.row_id] = row

    async def delete_rows(self, session: str, row_ids: Sequence[str]) -> int:
        """Delete rows of one session atomically; return how many existed and were deleted."""
        self._check_open()
        data = self._sessions.get(session)
        if data is None:
            return 0
        deleted = 0
        for row_id in set(row_ids):
            row = data.by_id.pop(row_id, None)
            if row is not None:
                del data.by_seq[row.seq]
                deleted += 1
        return deleted

    async def history(self, session: str) -> list[HistoryRow]:
        """The session's rows, ordered by seq (empty for an unknown session)."""
        self._check_open()
        data = self._sessions.get(session)
        if data is None:
            return []
        return [data.by_id[data.by_seq[seq]] for seq in sorted(data.by_seq)]

    async def owed_cuts(self, session: str | None = None) -> list[HistoryRow]:
        """Rows whose cut record is owed, ordered by (session, seq); one session or all."""
        self._check_open()
        names = sorted(self._sessions) if session is None else [session]
        owed: list[HistoryRow] = []
        for name in names:
            owed.extend(
                row
                for row in await self.history(name)
                if row.cut is not None and row.cut.state == CutState.OWED
            )
        return owed

    async def recoverable(self) -> RecoveryScan:
        """Every session with an owed cut record, with what recovery needs to resume it."""
        self._check_open()
        cuts: list[RecoverableCut] = []
        for name in sorted(self._sessions):
            rows = await self.history(name)
            owed = [r for r in rows if r.cut is not None and r.cut.state == CutState.OWED]
            if not owed:
                continue
            last = owed[-1]
            data = self._sessions[name]
            after = [r for r in rows if r.seq > last.seq]
            cuts.append(
                RecoverableCut(
                    session=data.record,
                    row=last,
                    trailing=tuple(r.kind for r in after),
                    follower=next(
                        (r for r in after if r.kind not in (RowKind.SENTINEL, RowKind.SYSTEM)),
                        None,
                    ),
                    stale=tuple(r.row_id for r in owed[:-1]),
                    last_seq=rows[-1].seq,
                    streams=tuple(data.envelopes),
                )
            )
        return RecoveryScan(cuts=tuple(cuts))

    async def set_cut_state(self, session: str, row_id: str, state: CutState) -> None:
        """Set the state of the cut record on row (session, row_id).

        Raises:
            UsageError: No such row, or the row has no cut record.
        """
        self._check_open()
        data = self._sessions.get(session)
        row = None if data is None else data.by_id.get(row_id)
        if data is None or row is None:
            raise _checks.no_row(session, row_id)
        if row.cut is None:
            raise _checks.no_cut(session, row_id)
        cut = msgspec.structs.replace(row.cut, state=_checks.cut_state(state))
        data.by_id[row_id] = msgspec.structs.replace(row, cut=cut)

    async def put_envelope(self, envelope: TurnEnvelope) -> None:
        """Write a turn envelope, replacing the one with the same (session, stream).

        Raises:
            UsageError: The envelope's session does not exist.
        """
        self._check_open()
        self._session(envelope.session).envelopes[envelope.stream] = envelope

    async def envelopes(self, session: str) -> list[TurnEnvelope]:
        """The session's turn envelopes, in the order they were first written."""
        self._check_open()
        data = self._sessions.get(session)
        return [] if data is None else list(data.envelopes.values())

    async def put_operation(self, record: OperationRecord) -> None:
        """Write an operation's receipt, replacing the one with the same ``op_id``."""
        self._check_open()
        self._operations[record.op_id] = record

    async def put_operations(self, records: Sequence[OperationRecord]) -> None:
        """Write receipts, each replacing the one with the same ``op_id``."""
        self._check_open()
        for record in records:
            self._operations[record.op_id] = record

    async def operation(self, op_id: str) -> OperationRecord | None:
        """The receipt ``op_id``, or ``None``."""
        self._check_open()
        return self._operations.get(op_id)

    async def receipts(
        self,
        session: str | None = None,
        *,
        states: frozenset[OpState] | None = None,
        recent: int | None = None,
    ) -> ReceiptQuery:
        """Open receipts first (indeterminate, then requested and running), then recent others."""
        self._check_open()
        records = _checks.order_receipts(
            list(self._operations.values()), session=session, states=states, recent=recent
        )
        return ReceiptQuery(records=records)
