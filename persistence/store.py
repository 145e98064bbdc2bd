"""The Store port: the few verbs the engine needs from durable storage.

Two implementations share one conformance suite (``tests/persistence``): ``MemoryStore`` for
tests and ``--memory`` runs, ``SqliteStore`` for everything durable. The port is shaped by the
engine's durable boundaries: one :meth:`Store.commit` per boundary of one session (what the
boundary makes durable is a :class:`~persistence.Boundary`), one :meth:`Store.load` per
session, one scan for startup recovery, one receipts query, one query of the open receipts
(the overlap guard's) and one handles query. A PostgreSQL
store with leases implements the same verbs; the owner token every commit carries is its fence.

A commit is one durable boundary: when it returns, what it wrote is committed (and with
``synchronous=FULL``, on disk); when it raises, it wrote nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Self, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping, Sequence
    from types import TracebackType

    from persistence._open_receipts import OpenReceipts
    from persistence._requests import Reply, Request, RequestKind, Withdrawn
    from persistence.records import (
        AbandonQuery,
        Boundary,
        Committed,
        HandleQuery,
        HandleRecord,
        OpState,
        QueueQuery,
        ReceiptQuery,
        RecoveryScan,
        SessionLoad,
        SessionRecord,
    )


class Store(Protocol):
    """Durable storage for sessions: history rows, cut records, envelopes, receipts, handles.

    A store is opened before use and closed after; ``async with store:`` does both. Opening a
    read-write store makes its opener the store's owner (:attr:`owner`). Misuse (a duplicate
    key, an unknown session or row, a record of another session, a closed store) raises
    :class:`~persistence.UsageError`; a commit by a writer that is not the current owner
    raises its subclass :class:`~persistence.StaleOwner`; a stored value that fails
    validation when read raises :class:`~persistence.CorruptRecord`.
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

    @property
    def owner(self) -> str | None:
        """The current owner's token, minted when the store was opened read-write.

        ``None`` while the store is closed or read-only (it owns nothing then). A writer reads
        it once, when it comes to own the store, and passes it to every :meth:`commit`.
        """
        ...

    async def commit(self, session: str, boundary: Boundary, *, owner: str | None) -> Committed:
        """Make one durable boundary of ``session`` durable, all of it or nothing.

        The parts are applied in the order ``create``, ``delete``, ``rows``, ``cut_states``,
        ``envelope``, ``operations``, ``handles``, ``queue``, in one transaction. A queue
        snapshot whose version is not above the session's stored one is skipped (the rest of
        the boundary is applied).

        Raises:
            StaleOwner: ``owner`` is not the store's current owner.
            UsageError: A record of the boundary belongs to another session (the message
                names the field); the session does not exist (for rows, cut states and the
                envelope; operations and handles need none); a handle record a store cannot
                take (``_checks.handle_problem``) or one handle id twice; a row's (session,
                row_id) or (session, seq) is taken; a cut state names a row that does not exist
                or has no cut record; ``create`` differs from the stored session with that
                id; the store is closed or read-only. Nothing of the boundary is written.
            CorruptRecord: A stored value the commit had to read fails validation (nothing
                is written).
        """
        ...

    async def load(self, session: str, *, envelopes: bool = True) -> SessionLoad | None:
        """The session's record, its rows by seq and its envelopes; ``None`` when unknown.

        ``envelopes=False`` leaves the envelopes unread (``SessionLoad.envelopes`` is empty): a
        launch reads the history at every turn and needs no envelope, which grow with every
        stream the session ever ran.

        Raises:
            CorruptRecord: A stored value of the session fails validation.
        """
        ...

    async def sessions(self) -> list[SessionRecord]:
        """Every session, ordered by id.

        Raises:
            CorruptRecord: A stored session fails validation.
        """
        ...

    async def scan_recoverable(self) -> RecoveryScan:
        """Every session with an owed cut record, with the rows recovery reads (one read).

        The store only reads: what the rows mean is ``agent_session._recovery``'s to decide.
        A session whose owed rows, later rows or record fail validation is reported in
        ``corrupt`` (never read as "nothing owed") and left out of ``cuts``.
        """
        ...

    async def receipts(
        self,
        session: str | None = None,
        *,
        op_id: str | None = None,
        states: frozenset[OpState] | None = None,
        recent: int | None = None,
    ) -> ReceiptQuery:
        """Receipts: every open one (requested, running, indeterminate) plus recent others.

        Args:
            session: Only this session's receipts.
            op_id: Only the receipt with this op id (at most one).
            states: Only receipts in these states.
            recent: At most this many of the others (terminal ones), newest first; ``None``
                for all of them.

        Returns:
            Indeterminate receipts first, then requested and running, then the terminal ones
            newest first; a row that fails validation is reported in ``corrupt`` and skipped.
        """
        ...

    async def open_receipts(self, session: str | None = None) -> OpenReceipts:
        """Every receipt that may still be running: ``requested``, ``running``, ``indeterminate``.

        What the overlap guard (OP-9) holds. Read through an index of the open states, so it
        costs what the open receipts cost, whatever the number of terminal ones.

        Args:
            session: Only this session's open receipts.

        Returns:
            The records that validate, in the order they were first written; a row in an open
            state that fails validation is reported in ``damaged`` with its session, target
            and state columns (never skipped silently).
        """
        ...

    async def handles(self, *, owner: str | None = None, target: str | None = None) -> HandleQuery:
        """Delegated-turn handle records (B10), ordered by ``handle_id``.

        Args:
            owner: Only handles this session delegated.
            target: Only handles whose turn runs in this session (both: handles matching
                both).

        Returns:
            The records that validate; a stored record that fails validation is reported in
            ``corrupt`` (its id and what was wrong, naming the field) and skipped.
        """
        ...

    async def queued(self, session: str | None = None) -> QueueQuery:
        """The durable queue: every stored entry (of ``session`` only, when given).

        Returns:
            The entries that validate, by session then position; the sessions' queue
            versions; a stored entry that fails validation is reported in ``corrupt`` (its
            ``session/entry`` key and what was wrong, naming the field) and skipped.
        """
        ...

    async def abandon_markers(self) -> AbandonQuery:
        """Every session's startup-abandon marker (PS-8), by session id.

        Returns:
            The markers that validate; a stored one that fails validation is reported in
            ``corrupt`` (its session and what was wrong, naming the field) and skipped.
        """
        ...


class LeaseBook(Protocol):
    """What an engine reads of its leases (``persistence._pg_leases.Leases``)."""

    @property
    def held(self) -> Mapping[str, int]:
        """Each session this incarnation holds, with its epoch."""
        ...

    @property
    def lost(self) -> frozenset[str]:
        """The sessions a peer took from this incarnation (LS-3)."""
        ...

    @property
    def fresh(self) -> bool:
        """Whether the last renewal is recent enough to start a side effect (LS-5)."""
        ...


@runtime_checkable
class LeasedStore(Store, Protocol):
    """A store many engine processes share, each session leased to one (``PostgresStore``).

    Its commits are fenced by the session's lease (``LeaseLost``, LS-3); an engine on it
    recovers only what it holds, and claims what dead owners left (LS-8).
    """

    @property
    def leases(self) -> LeaseBook:
        """This incarnation's leases."""
        ...

    async def claim(self, limit: int) -> dict[str, int]:
        """Take up to ``limit`` expired or unowned sessions with work; each one's epoch."""
        ...

    async def acquire(self, session: str) -> int | None:
        """Take one session (``None``: a peer holds it, or it does not exist)."""
        ...

    async def scan_recoverable_of(self, sessions: Collection[str]) -> RecoveryScan:
        """The startup scan of ``sessions`` only (the ones this engine holds)."""
        ...

    async def release(self, sessions: Sequence[str]) -> set[str]:
        """Give back the leases of ``sessions``; the ones released."""
        ...

    def watch_releases(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` whenever a peer gives its leases back (``None``: stop)."""
        ...

    def watch_inbox(self, callback: Callable[[str], None] | None) -> None:
        """Call ``callback(session)`` whenever a message is posted to a session (LS-9)."""
        ...

    async def post(self, session: str, text: str) -> str:
        """Post a message to any session, from any process; its queue entry id."""
        ...

    async def inbox(self, session: str) -> tuple[tuple[str, str, str | None], ...]:
        """The messages posted to ``session`` not yet queued: ``(entry id, text, handle)``."""
        ...

    async def drop_mail(self, session: str, entry: str) -> None:
        """Take ``entry`` off ``session``'s inbox unqueued (a prompt whose turn settled)."""
        ...

    async def delegate(self, record: HandleRecord, text: str) -> str:
        """Write ``record`` and post its prompt to its target in one transaction (LS-11)."""
        ...

    async def handles_into(self, sessions: Sequence[str]) -> HandleQuery:
        """The handles of turns delegated into any of ``sessions``, any status."""
        ...

    async def notify_handle(self, owner: str) -> None:
        """Tell ``owner``'s engine that a handle of ``owner``'s was written here."""
        ...

    def watch_handles(self, callback: Callable[[str], None] | None) -> None:
        """Call ``callback(owner)`` whenever a handle of ``owner`` is written elsewhere."""
        ...

    async def mail_for(self, sessions: Sequence[str]) -> set[str]:
        """Which of ``sessions`` have messages waiting."""
        ...

    def watch_requests(self, callback: Callable[[str], None] | None) -> None:
        """Call ``callback(session)`` whenever a request is posted for a session (LS-10)."""
        ...

    def watch_answers(self, callback: Callable[[int], None] | None) -> None:
        """Call ``callback(request id)`` whenever a holder answers a request (LS-10)."""
        ...

    async def ask(self, session: str, kind: RequestKind, body: dict[str, str]) -> int:
        """Ask ``session``'s holder, in whichever process, to carry out ``kind``; its id."""
        ...

    async def requests(self, session: str) -> tuple[Request, ...]:
        """The requests for ``session`` not answered yet, oldest first."""
        ...

    async def asked_for(self, sessions: Sequence[str]) -> set[str]:
        """Which of ``sessions`` have requests not answered yet."""
        ...

    async def answer(self, request: int, reply: Reply) -> bool:
        """Answer ``request`` (begun); ``False`` when its asker withdrew it (nothing written)."""
        ...

    async def take_answer(self, request: int) -> Reply | None:
        """The reply to ``request``, taken; ``None`` while it is not answered."""
        ...

    async def begin(self, request: int) -> bool:
        """The holder takes ``request`` on; ``False`` when its asker withdrew it."""
        ...

    async def withdraw(self, request: int) -> Withdrawn:
        """Withdraw ``request`` unanswered: ``withdrawn``, ``begun`` or ``answered``."""
        ...
