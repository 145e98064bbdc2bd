"""OP-7 at startup: a pure plan for the receipts a previous process left open.

A receipt still ``requested`` or ``running`` when an engine opens the store belongs to a
process that stopped with the call open: nobody can confirm how it ended, so it becomes
``indeterminate`` (``process_restart``, termination not confirmed). The engine reads those
receipts and each of their sessions' histories, then :func:`plan_startup_receipts` decides,
with no store, clock or await:

* per session, in the order its first receipt comes in the store's order, ONE boundary: the
  session's closed receipts and a system row telling its model which calls the restart left
  unknown (``docs/operations.md``: every call's fate reaches the model). A session whose
  history could not be read (unknown, or damaged) has no place for that row: its receipts are
  still closed, with no row;
* the ``receipt`` events to tell, in the store's order across sessions, each naming the
  session whose write must be durable before it is told.

The engine then commits each boundary (a failed one leaves that session's receipts open in the
store, held by the overlap guard) and tells :meth:`StartupReceiptPlan.told` for the sessions
whose write returned.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

import msgspec

from agent_session._rows import RowBody, encode_body, restart_note, row_id
from persistence import Boundary, HistoryRow, OperationRecord, OpState, RowKind
from stream_manager import ReceiptWritten
from stream_manager._op_states import OutcomeCode, advance

#: The explanation every receipt closed at startup carries.
RESTART_EXPLANATION = "the process stopped while it was open; termination not confirmed"


class SessionClose(msgspec.Struct, frozen=True, kw_only=True):
    """One session's startup write: its closed receipts, and the restart note where it fits."""

    session: str
    boundary: Boundary


class PlannedReceipt(msgspec.Struct, frozen=True, kw_only=True):
    """A ``receipt`` event, told only once the write of session ``after`` is durable."""

    after: str
    event: ReceiptWritten


class StartupReceiptPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What startup writes for the open receipts (one boundary per session) and then tells."""

    writes: tuple[SessionClose, ...] = ()
    #: In the store's order of the open receipts, across sessions.
    tell: tuple[PlannedReceipt, ...] = ()

    def told(self, written: Collection[str]) -> tuple[ReceiptWritten, ...]:
        """The events to tell when the sessions in ``written`` are durable, in store order."""
        return tuple(planned.event for planned in self.tell if planned.after in written)


def sessions_of(stale_records: Iterable[OperationRecord]) -> tuple[str, ...]:
    """The sessions of ``stale_records``, each once, in the order its first receipt comes."""
    return tuple(dict.fromkeys(record.session for record in stale_records))


def plan_startup_receipts(
    stale_records: Sequence[OperationRecord],
    histories: Mapping[str, Sequence[HistoryRow] | None],
    now: float,
) -> StartupReceiptPlan:
    """Close ``stale_records`` (open receipts, in the store's order) at ``now``.

    ``histories`` holds each session's rows as read, ``None`` (or no entry) where they could
    not be read: that session's boundary then has no restart-note row.
    """
    closed: dict[str, list[OperationRecord]] = {}
    tell: list[PlannedReceipt] = []
    for record in stale_records:
        closed.setdefault(record.session, []).append(_closed(record, now))
        tell.append(PlannedReceipt(after=record.session, event=_told(record)))
    writes = tuple(
        SessionClose(
            session=session,
            boundary=Boundary(
                rows=_note(session, of_session, histories.get(session)),
                operations=tuple(of_session),
            ),
        )
        for session, of_session in closed.items()
    )
    return StartupReceiptPlan(writes=writes, tell=tuple(tell))


def _closed(record: OperationRecord, now: float) -> OperationRecord:
    return advance(
        record,
        OpState.INDETERMINATE,
        now=now,
        outcome=OutcomeCode.PROCESS_RESTART,
        acknowledged=False,
        explanation=RESTART_EXPLANATION,
    )


def _told(record: OperationRecord) -> ReceiptWritten:
    return ReceiptWritten(
        session=record.session,
        op=record.op_id,
        tool=record.capability.name,
        state=OpState.INDETERMINATE.value,
        acknowledged=False,
        resolved_late=False,
    )


def _note(
    session: str, closed: Sequence[OperationRecord], history: Sequence[HistoryRow] | None
) -> tuple[HistoryRow, ...]:
    """The system row telling ``session``'s model which calls the restart left unknown."""
    if history is None:
        return ()
    seq = 1 + max((row.seq for row in history), default=0)
    return (
        HistoryRow(
            session=session,
            seq=seq,
            row_id=row_id(session, seq),
            kind=RowKind.SYSTEM,
            body=encode_body(RowBody(text=restart_note(closed))),
        ),
    )
