"""The Store port: the few verbs the engine needs from durable storage.

Two implementations share one conformance suite (``tests/persistence``): ``MemoryStore`` for
tests and ``--memory`` runs, ``SqliteStore`` for everything durable. The port stays narrow so a
PostgreSQL implementation with leases can be added without widening it much.

Every verb is one durable boundary: when it returns, what it wrote is committed (and with
``synchronous=FULL``, on disk); when it raises, it wrote nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Self

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import TracebackType

    from persistence.records import (
        CutState,
        HistoryRow,
        OperationRecord,
        OpState,
        ReceiptQuery,
        RecoveryScan,
        SessionRecord,
        TurnEnvelope,
    )


class Store(Protocol):
    """Durable storage for sessions, their history rows and turn envelopes.

    A store is opened before use and closed after; ``async with store:`` does both. Misuse (a
    duplicate key, an unknown session or row, a closed store) raises
    :class:`~persistence.UsageError`; a stored value that fails validation when read raises
    :class:`~persistence.CorruptRecord`.
    """

    async def open(self) -> None:
        """Open the store; creating or migrating it if the implementation does that."""
        ...

    async def close(self) -> None:
        """Close the store. Closing a closed store does nothing."""
        ...

    async def __aenter__(self) -> Self:
        """Open the store and return it."""
        ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the store."""
        ...

    async def create_session(self, record: SessionRecord) -> None:
        """Create a session.

        Idempotent for an identical record.

        Raises:
            UsageError: A session with this id exists with different fields.
        """
        ...

    async def sessions(self) -> list[SessionRecord]:
        """Every session, ordered by id."""
        ...

    async def append(self, rows: Sequence[HistoryRow]) -> None:
        """Append history rows, all in one transaction (rows may span sessions).

        Raises:
            UsageError: A row's session does not exist, or its (session, row_id) or
                (session, seq) is already taken (in the store or earlier in the batch). None
                of the batch is written.
        """
        ...

    async def update_row(self, row: HistoryRow) -> None:
        """Replace the kind, body, stream and cut of the existing row (session, row_id).

        Raises:
            UsageError: No such row, or the stored row has a different seq.
        """
        ...

    async def delete_rows(self, session: str, row_ids: Sequence[str]) -> int:
        """Delete rows of one session atomically; return how many existed and were deleted."""
        ...

    async def history(self, session: str) -> list[HistoryRow]:
        """The session's rows, ordered by seq (empty for an unknown session)."""
        ...

    async def owed_cuts(self, session: str | None = None) -> list[HistoryRow]:
        """Rows whose cut record is owed, ordered by (session, seq); one session or all."""
        ...

    async def recoverable(self) -> RecoveryScan:
        """Every session with an owed cut record, with what recovery needs to resume it.

        A session whose owed row or record fails validation is reported in ``corrupt`` (never
        read as "nothing owed") and left out of ``cuts``.
        """
        ...

    async def set_cut_state(self, session: str, row_id: str, state: CutState) -> None:
        """Set the state of the cut record on row (session, row_id).

        Raises:
            UsageError: No such row, or the row has no cut record.
        """
        ...

    async def put_envelope(self, envelope: TurnEnvelope) -> None:
        """Write a turn envelope, replacing the one with the same (session, stream).

        Raises:
            UsageError: The envelope's session does not exist.
        """
        ...

    async def envelopes(self, session: str) -> list[TurnEnvelope]:
        """The session's turn envelopes, in the order they were first written."""
        ...

    async def put_operation(self, record: OperationRecord) -> None:
        """Write an operation's receipt, replacing the one with the same ``op_id`` (one call)."""
        ...

    async def put_operations(self, records: Sequence[OperationRecord]) -> None:
        """Write receipts all in one transaction, each replacing its ``op_id``'s (one call)."""
        ...

    async def operation(self, op_id: str) -> OperationRecord | None:
        """The receipt ``op_id``, or ``None``.

        Raises:
            CorruptRecord: The stored receipt fails validation (it stays where it is).
        """
        ...

    async def receipts(
        self,
        session: str | None = None,
        *,
        states: frozenset[OpState] | None = None,
        recent: int | None = None,
    ) -> ReceiptQuery:
        """Receipts: every open one (requested, running, indeterminate) plus recent others.

        Args:
            session: Only this session's receipts.
            states: Only receipts in these states.
            recent: At most this many of the others (terminal ones), newest first; ``None``
                for all of them.

        Returns:
            Indeterminate receipts first, then requested and running, then the terminal ones
            newest first; a row that fails validation is reported in ``corrupt`` and skipped.
        """
        ...
