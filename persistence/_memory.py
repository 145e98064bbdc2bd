"""The in-memory store: plain dicts, the same behaviour as SQLite, nothing durable.

Records are frozen Structs, so the store shares them with callers; it never hands out its own
containers. A commit checks everything before it changes anything, and contains no ``await``,
so it is atomic with respect to other tasks. Closing keeps the contents: a closed and
reopened ``MemoryStore`` holds what it held, like a database file.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Self

import msgspec

from persistence import _checks
from persistence._errors import UsageError
from persistence._open_receipts import OpenReceipts, open_in
from persistence._partial import assemble, check_chunk
from persistence.records import (
    AbandonMarker,
    AbandonQuery,
    Boundary,
    Committed,
    CutState,
    HandleQuery,
    HandleRecord,
    HistoryRow,
    OperationRecord,
    OpState,
    QueuedEntryRecord,
    QueueQuery,
    QueueSnapshot,
    ReceiptQuery,
    RecoverableCut,
    RecoveryScan,
    RowKind,
    SessionLoad,
    SessionRecord,
    SessionTail,
    TurnEnvelope,
)

if TYPE_CHECKING:
    from collections.abc import Sequence, Set
    from types import TracebackType


class _SessionData:
    """One session's rows, indexed both ways."""

    __slots__ = (
        "abandon",
        "auto_retry",
        "by_id",
        "by_seq",
        "envelopes",
        "queue",
        "queue_version",
        "record",
    )

    def __init__(self, record: SessionRecord) -> None:
        self.record = record
        self.by_id: dict[str, HistoryRow] = {}
        self.by_seq: dict[int, str] = {}
        self.envelopes: dict[str, TurnEnvelope] = {}
        self.queue: tuple[QueuedEntryRecord, ...] = ()
        self.queue_version = 0
        self.abandon: AbandonMarker | None = None
        #: The auto-retry preference (AS-32): on unless a boundary switched it off.
        self.auto_retry = True


_EMPTY = _SessionData(SessionRecord(id="", model=""))
_NONE: frozenset[str] = frozenset()
_NOTHING = Committed()


class MemoryStore:
    """A :class:`~persistence.Store` held in memory (tests, ``--memory`` runs)."""

    def __init__(self) -> None:
        self._sessions: dict[str, _SessionData] = {}
        self._operations: dict[str, OperationRecord] = {}
        self._handles: dict[str, HandleRecord] = {}
        #: Session -> stream -> position -> part (B4); like receipts, no session record needed.
        self._partials: dict[str, dict[str, dict[int, bytes]]] = {}
        self._open = False
        self._owner: str | None = None

    @classmethod
    def opened(cls) -> MemoryStore:
        """A new store, already open (no I/O to wait for): a stream manager's own receipts."""
        store = cls()
        store._open, store._owner = True, secrets.token_hex(16)
        return store

    def __repr__(self) -> str:
        rows = sum(len(data.by_id) for data in self._sessions.values())
        state = "open" if self._open else "closed"
        return f"<MemoryStore {state} sessions={len(self._sessions)} rows={rows}>"

    async def open(self) -> None:
        """Open the store, minting a new owner token.

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
        is refused), and a reopen mints a new token, so a commit with the old one is refused.
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

    # -- writes ---------------------------------------------------------------------------------

    async def commit(self, session: str, boundary: Boundary, *, owner: str | None) -> Committed:
        """Make one boundary of ``session`` durable, all or nothing (see ``Store.commit``).

        Raises:
            StaleOwner: ``owner`` is not the current owner.
            UsageError: See ``Store.commit``; nothing is written.
        """
        if not self._open:
            raise _checks.not_open()
        if owner is None or owner != self._owner:  # ``_checks.fence``, inlined: every commit
            _checks.fence(session, self._owner, owner)
        if (
            boundary.create is None
            and boundary.envelope is None
            and boundary.queue is None
            and boundary.abandon is None
            and not boundary.clear_abandon
            and boundary.auto_retry is None
            and not (boundary.rows or boundary.delete or boundary.cut_states or boundary.handles)
        ):  # receipts (and partial parts): the most frequent boundary, nothing to check
            _checks.check_receipts(session, boundary.operations)
            if boundary.partial is not None or boundary.drop_partials:
                check_chunk(session, boundary.partial, boundary.drop_partials)
                self._put_partial(session, boundary)
            for record in boundary.operations:
                self._operations[record.op_id] = record
            return _NOTHING
        _checks.check_boundary(session, boundary)
        check_chunk(session, boundary.partial, boundary.drop_partials)
        deleted = self._apply(session, boundary)
        return Committed(deleted=deleted) if deleted else _NOTHING

    def _apply(self, session: str, boundary: Boundary) -> int:
        """Check the boundary against the store, then write it; how many rows it deleted."""
        data, create = self._sessions.get(session), boundary.create
        if create is not None and data is not None and data.record != create:
            raise _checks.session_conflict(data.record, create)
        existing = data if data is not None else _EMPTY
        doomed = {r for r in boundary.delete if r in existing.by_id} if boundary.delete else _NONE
        if (
            boundary.rows
            or boundary.envelope is not None
            or boundary.queue is not None
            or boundary.abandon is not None
            or boundary.clear_abandon
            or boundary.auto_retry is not None
        ):
            if data is None and create is None:
                raise _checks.unknown_session(session)
            self._check_rows(existing, doomed, boundary.rows)
        cuts = self._check_cuts(session, existing, doomed, boundary) if boundary.cut_states else ()
        # Everything is checked: from here on nothing raises.
        if data is None and create is not None:
            data = self._sessions[session] = _SessionData(create)
        if data is not None:
            _write_session(data, boundary, doomed, cuts)
        for record in boundary.operations:
            self._operations[record.op_id] = record
        for handle in boundary.handles:
            self._handles[handle.handle_id] = handle
        if boundary.partial is not None or boundary.drop_partials:
            self._put_partial(session, boundary)
        return len(doomed)

    def _put_partial(self, session: str, boundary: Boundary) -> None:
        """Drop the streams' partials the boundary names, then store its chunk (checked)."""
        mine = self._partials.get(session)
        if mine is not None:
            for stream in boundary.drop_partials:
                mine.pop(stream, None)
        chunk = boundary.partial
        if chunk is not None and chunk.parts:  # a chunk of no parts stores no stream
            if mine is None:
                mine = self._partials[session] = {}
            parts = mine.setdefault(chunk.stream, {})
            for position, body in enumerate(chunk.parts, chunk.start):
                parts[position] = body
        if mine is not None and not mine:
            del self._partials[session]

    @staticmethod
    def _check_rows(data: _SessionData, doomed: Set[str], rows: Sequence[HistoryRow]) -> None:
        for row in rows:
            if row.row_id in data.by_id and row.row_id not in doomed:
                raise _checks.duplicate_row_id(row)
            holder = data.by_seq.get(row.seq)
            if holder is not None and holder not in doomed:
                raise _checks.duplicate_seq(row, holder)

    @staticmethod
    def _check_cuts(
        session: str, data: _SessionData, doomed: Set[str], boundary: Boundary
    ) -> list[HistoryRow]:
        """The rows the boundary's cut states leave, checked (nothing is changed yet)."""
        added = {row.row_id: row for row in boundary.rows} if boundary.rows else {}
        moved: dict[str, HistoryRow] = {}
        for change in boundary.cut_states:
            row = moved.get(change.row_id) or added.get(change.row_id)
            if row is None and change.row_id not in doomed:
                row = data.by_id.get(change.row_id)
            if row is None:
                raise _checks.no_row(session, change.row_id)
            if row.cut is None:
                raise _checks.no_cut(session, change.row_id)
            cut = msgspec.structs.replace(row.cut, state=_checks.cut_state(change.state))
            moved[change.row_id] = msgspec.structs.replace(row, cut=cut)
        return list(moved.values())

    # -- reads ----------------------------------------------------------------------------------

    async def load(self, session: str, *, envelopes: bool = True) -> SessionLoad | None:
        """The session's record, its rows by seq and (unless not asked for) its envelopes."""
        self._check_open()
        data = self._sessions.get(session)
        if data is None:
            return None
        return SessionLoad(
            record=data.record,
            rows=tuple(data.by_id[data.by_seq[seq]] for seq in sorted(data.by_seq)),
            envelopes=tuple(data.envelopes.values()) if envelopes else (),
            queue=tuple(sorted(data.queue, key=_position)),
            queue_version=data.queue_version,
            abandon=data.abandon,
            auto_retry=data.auto_retry,
            partials=tuple(
                assemble(stream, parts.items())
                for stream, parts in self._partials.get(session, {}).items()
            ),
        )

    async def sessions(self) -> list[SessionRecord]:
        """Every session, ordered by id."""
        self._check_open()
        return [self._sessions[key].record for key in sorted(self._sessions)]

    async def scan_recoverable(self) -> RecoveryScan:
        """Every session with an owed cut record: its owed rows and the rows after them."""
        self._check_open()
        cuts: list[RecoverableCut] = []
        tails: list[SessionTail] = []
        for name in sorted(self._sessions):
            data = self._sessions[name]
            rows = [data.by_id[data.by_seq[seq]] for seq in sorted(data.by_seq)]
            owed = [r for r in rows if r.cut is not None and r.cut.state is CutState.OWED]
            if not owed:
                tail = _tail(data, rows)
                if tail is not None:
                    tails.append(tail)
            if owed:
                after = tuple(r for r in rows if r.seq > owed[-1].seq)
                streams = tuple(data.envelopes)
                cuts.append(
                    RecoverableCut(
                        session=data.record,
                        owed=tuple(owed),
                        after=after,
                        streams=streams,
                        queue_version=data.queue_version,
                    )
                )
        queued = tuple(name for name in sorted(self._sessions) if self._sessions[name].queue)
        return RecoveryScan(cuts=tuple(cuts), queued=queued, tails=tuple(tails))

    async def receipts(
        self,
        session: str | None = None,
        *,
        op_id: str | None = None,
        states: frozenset[OpState] | None = None,
        recent: int | None = None,
    ) -> ReceiptQuery:
        """Open receipts first (indeterminate, then requested and running), then recent others."""
        self._check_open()
        if op_id is not None:
            found = self._operations.get(op_id)
            candidates = [] if found is None else [found]
        else:
            candidates = list(self._operations.values())
        records = _checks.order_receipts(
            candidates, session=session, op_id=op_id, states=states, recent=recent
        )
        return ReceiptQuery(records=records)

    async def open_receipts(self, session: str | None = None) -> OpenReceipts:
        """The receipts that may still be running (``Store.open_receipts``); none is damaged."""
        self._check_open()
        return open_in(self._operations.values(), session)

    async def handles(self, *, owner: str | None = None, target: str | None = None) -> HandleQuery:
        """Handle records by ``handle_id``, only ``owner``'s and ``target``'s when given."""
        self._check_open()
        records = tuple(
            self._handles[key]
            for key in sorted(self._handles)
            if (owner is None or self._handles[key].owner == owner)
            and (target is None or self._handles[key].target == target)
        )
        return HandleQuery(records=records)

    async def queued(self, session: str | None = None) -> QueueQuery:
        """The durable queue entries, by session then position (``session``'s only, when given)."""
        self._check_open()
        names = sorted(self._sessions) if session is None else [session]
        records: list[QueuedEntryRecord] = []
        versions: list[tuple[str, int]] = []
        for name in names:
            data = self._sessions.get(name)
            if data is None:
                continue
            records.extend(sorted(data.queue, key=_position))
            if data.queue_version:
                versions.append((name, data.queue_version))
        return QueueQuery(records=tuple(records), versions=tuple(versions))

    async def abandon_markers(self) -> AbandonQuery:
        """Every session's abandon marker, by session id."""
        self._check_open()
        markers = tuple(
            (name, marker)
            for name in sorted(self._sessions)
            if (marker := self._sessions[name].abandon) is not None
        )
        return AbandonQuery(markers=markers)


def _write_session(
    data: _SessionData, boundary: Boundary, doomed: Set[str], cuts: Sequence[HistoryRow]
) -> None:
    """Write the session's parts of a checked boundary (nothing raises here)."""
    for row_id in doomed:
        del data.by_seq[data.by_id.pop(row_id).seq]
    for row in boundary.rows:
        data.by_id[row.row_id] = row
        data.by_seq[row.seq] = row.row_id
    for row in cuts:
        data.by_id[row.row_id] = row
    if boundary.envelope is not None:
        data.envelopes[boundary.envelope.stream] = boundary.envelope
    if boundary.queue is not None:
        _replace_queue(data, boundary.queue)
    if boundary.clear_abandon:
        data.abandon = None
    if boundary.abandon is not None:
        data.abandon = boundary.abandon
    if boundary.auto_retry is not None:
        data.auto_retry = boundary.auto_retry


def _tail(data: _SessionData, rows: Sequence[HistoryRow]) -> SessionTail | None:
    """The session's unanswered tail (PS-4), or ``None`` when its last turn was answered."""
    last = next((r for r in reversed(rows) if r.kind is not RowKind.SYSTEM), None)
    if last is None or last.kind not in _UNANSWERED:
        return None
    start = max((i for i, r in enumerate(rows) if r.kind is RowKind.USER), default=0)
    envelope = next(reversed(data.envelopes.values()), None) if data.envelopes else None
    return SessionTail(
        session=data.record,
        rows=tuple(rows[start:]),
        last_seq=rows[-1].seq,
        streams=tuple(data.envelopes),
        envelope=envelope,
        envelope_ended=envelope is not None and any(r.stream == envelope.stream for r in rows),
        queue_version=data.queue_version,
        abandon=data.abandon,
        auto_retry=data.auto_retry,
    )


#: The kinds of a last (non-system) row that leave a turn unanswered (PS-4).
_UNANSWERED = frozenset({RowKind.USER, RowKind.SENTINEL, RowKind.PARTIAL, RowKind.SUMMARY})


def _replace_queue(data: _SessionData, snapshot: QueueSnapshot) -> None:
    """A snapshot newer than the stored queue replaces it, keeping the entries it says to."""
    if snapshot.version > data.queue_version:
        written = {entry.entry_id for entry in snapshot.entries}  # upserted: they win over keep
        kept = tuple(
            e for e in data.queue if e.entry_id in snapshot.keep and e.entry_id not in written
        )
        data.queue = (*kept, *snapshot.entries)
        data.queue_version = snapshot.version


def _position(record: QueuedEntryRecord) -> tuple[int, str]:
    """The read order of queued entries: by position, then entry id (as SQLite's index)."""
    return record.position, record.entry_id
