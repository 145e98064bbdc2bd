"""Seeding and reading stores in tests, through the port's verbs (commit, load, scan, receipts).

Seeds commit with the store's *current* owner token (a test plays the owner); reads turn the
port's tuples into the lists the assertions compare.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import anyio

from persistence import Boundary, CutState, CutStateChange, MemoryStore

if TYPE_CHECKING:
    from persistence import (
        AbandonMarker,
        Committed,
        HandleRecord,
        HistoryRow,
        OperationRecord,
        PartialChunk,
        QueueSnapshot,
        SessionRecord,
        Store,
        TurnEnvelope,
    )


def owner(store: Store) -> str:
    """The open store's owner token."""
    token = store.owner
    assert token is not None, "the store is not open read-write"
    return token


async def commit(
    store: Store,
    session: str,
    *,
    create: SessionRecord | None = None,
    rows: Iterable[HistoryRow] = (),
    delete: Iterable[str] = (),
    cut_states: Iterable[tuple[str, CutState]] = (),
    envelope: TurnEnvelope | None = None,
    operations: Iterable[OperationRecord] = (),
    handles: Iterable[HandleRecord] = (),
    queue: QueueSnapshot | None = None,
    abandon: AbandonMarker | None = None,
    clear_abandon: bool = False,
    drop_partials: Iterable[str] = (),
    partial: PartialChunk | None = None,
) -> Committed:
    """One boundary of ``session``, committed as the store's current owner."""
    boundary = Boundary(
        create=create,
        rows=tuple(rows),
        delete=tuple(delete),
        cut_states=tuple(CutStateChange(row_id=r, state=s) for r, s in cut_states),
        envelope=envelope,
        operations=tuple(operations),
        handles=tuple(handles),
        queue=queue,
        abandon=abandon,
        clear_abandon=clear_abandon,
        drop_partials=tuple(drop_partials),
        partial=partial,
    )
    return await store.commit(session, boundary, owner=owner(store))


async def put_receipts(store: Store, *records: OperationRecord) -> None:
    """Write receipts, one commit per record (as the runner writes them one by one)."""
    for record in records:
        await commit(store, record.session, operations=(record,))


async def history(store: Store, session: str = "s1") -> list[HistoryRow]:
    """The session's rows by seq (empty for an unknown session)."""
    loaded = await store.load(session)
    return [] if loaded is None else list(loaded.rows)


async def envelopes(store: Store, session: str = "s1") -> list[TurnEnvelope]:
    """The session's envelopes, in first-written order."""
    loaded = await store.load(session)
    return [] if loaded is None else list(loaded.envelopes)


async def owed(store: Store, session: str | None = None) -> list[HistoryRow]:
    """Rows whose cut record is owed, by (session, seq): what startup recovery would find.

    A session the scan reports corrupt fails the test (nothing is read as "not owed").
    """
    scan = await store.scan_recoverable()
    assert not scan.corrupt, scan.corrupt
    return [
        row for cut in scan.cuts if session is None or cut.session.id == session for row in cut.owed
    ]


async def receipt(store: Store, op_id: str) -> OperationRecord | None:
    """The receipt ``op_id``, or ``None``; a corrupt one fails the test."""
    query = await store.receipts(op_id=op_id)
    assert not query.corrupt, query.corrupt
    return query.records[0] if query.records else None


class HangingStore(MemoryStore):
    """A ``MemoryStore`` whose commits, once :meth:`hang` was called, never return.

    A host store that hangs: its calls are not counted in flight, so a virtual-time driver
    moves the clock past them (the cleanup bound is what ends them).
    """

    hanging = False

    def hang(self) -> None:
        """Every commit from now on waits for ever (until cancelled)."""
        self.hanging = True

    async def commit(self, session: str, boundary: Boundary, *, owner: str | None) -> Committed:
        if self.hanging:
            await anyio.sleep_forever()
        return await super().commit(session, boundary, owner=owner)
