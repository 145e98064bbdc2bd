"""Checks and messages both stores share, so they refuse the same misuse in the same words."""

from __future__ import annotations

from typing import TYPE_CHECKING

from persistence._errors import UsageError
from persistence.records import OPEN_OP_STATES, CutState, OperationRecord, OpState

if TYPE_CHECKING:
    from collections.abc import Sequence

    from persistence.records import HistoryRow, SessionRecord


def row_key(session: str, row_id: str) -> str:
    """The key that names a history row in messages: ``session/row_id``."""
    return f"{session}/{row_id}"


def check_batch(rows: Sequence[HistoryRow]) -> None:
    """Refuse a batch that repeats a (session, row_id) or a (session, seq) within itself.

    Raises:
        UsageError: Naming the repeated key.
    """
    ids: set[tuple[str, str]] = set()
    seqs: dict[tuple[str, int], str] = {}
    for row in rows:
        if (row.session, row.row_id) in ids:
            raise UsageError(
                f"history row {row_key(row.session, row.row_id)} appears twice in one append"
            )
        holder = seqs.get((row.session, row.seq))
        if holder is not None:
            raise duplicate_seq(row, holder)
        ids.add((row.session, row.row_id))
        seqs[(row.session, row.seq)] = row.row_id


def cut_state(value: CutState | str) -> CutState:
    """Return ``value`` as a :class:`CutState`, or raise :class:`UsageError` naming it."""
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
    """The error for appending a row whose (session, row_id) is taken."""
    return UsageError(f"history row {row_key(row.session, row.row_id)} already exists")


def duplicate_seq(row: HistoryRow, holder: str) -> UsageError:
    """The error for appending a row whose (session, seq) is held by row ``holder``."""
    return UsageError(
        f"seq {row.seq} of session {row.session!r} is already taken by history row "
        f"{row_key(row.session, holder)} (appending {row_key(row.session, row.row_id)})"
    )


def no_row(session: str, row_id: str) -> UsageError:
    """The error for a verb that names a history row the store does not hold."""
    return UsageError(f"no history row {row_key(session, row_id)}")


def seq_mismatch(row: HistoryRow, stored_seq: int) -> UsageError:
    """The error for updating a row with a seq other than the stored one."""
    return UsageError(
        f"history row {row_key(row.session, row.row_id)} has seq {stored_seq}, "
        f"not {row.seq}; a row's seq never changes"
    )


def no_cut(session: str, row_id: str) -> UsageError:
    """The error for setting the cut state of a row that carries no cut record."""
    return UsageError(f"history row {row_key(session, row_id)} has no cut record")


def order_receipts(
    records: Sequence[OperationRecord],
    *,
    session: str | None,
    states: frozenset[OpState] | None,
    recent: int | None,
) -> tuple[OperationRecord, ...]:
    """``receipts()``'s filter and order, shared by both stores (records oldest first in)."""
    chosen = [
        r
        for r in records
        if (session is None or r.session == session) and (states is None or r.state in states)
    ]
    indeterminate = [r for r in chosen if r.state is OpState.INDETERMINATE]
    running = [r for r in chosen if r.state in (OpState.REQUESTED, OpState.RUNNING)]
    done = [r for r in reversed(chosen) if r.state not in OPEN_OP_STATES]
    if recent is not None:
        done = done[: max(recent, 0)]
    return (*indeterminate, *running, *done)
