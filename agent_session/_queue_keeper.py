"""The durable queue of one session: what each queue change commits (``docs/session.md``).

The turn machine owns the queue; this collaborator turns it into the boundary part a change
commits (:class:`~persistence.QueueSnapshot`): every entry queued after the change, in order, with
the entry being dispatched (dequeued, not yet accepted into history nor dropped) still at the
head, so a crash while it dispatches leaves it queued. Each snapshot counts the session's queue
version one up, and a store applies only a snapshot newer than the one it holds, so the change
decided last wins whatever order the writes land in. Damaged stored entries (``keep``) ride in
every snapshot untouched, for a person to see.

Pure: no awaits, no store, no clock. Bodies are ``message_queue.encode_entry``'s JSON; an
entry's body is encoded again only when its state changed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from message_queue import EntryState, InvalidEntry, MessageQueue, decode_entry, encode_entry
from message_queue._durable import TABLE
from persistence import CorruptRecord, QueuedEntryRecord, QueueSnapshot

if TYPE_CHECKING:
    from collections.abc import Mapping

    from persistence import SessionLoad


def durable_extra(extra: Mapping[str, object]) -> None:
    """Refuse send options whose ``extra`` a durable queue entry cannot carry.

    Raises:
        InvalidEntry: a value JSON cannot carry (nothing was queued).
    """
    try:
        msgspec.json.encode(extra)
    except (TypeError, msgspec.EncodeError) as error:
        raise InvalidEntry(
            f"send options' extra must hold JSON values to be queued durably: {error}"
        ) from None


class QueueKeeper:
    """One session's queue version, dispatching entry and damaged ids (see the module)."""

    __slots__ = (
        "_bodies",
        "dispatch_stored",
        "dispatching",
        "enqueues",
        "keep",
        "session",
        "stored",
        "version",
    )

    def __init__(
        self,
        session: str,
        version: int = 0,
        keep: tuple[str, ...] = (),
        stored: frozenset[str] = frozenset(),
    ) -> None:
        self.session = session
        #: The version of the last snapshot decided (the stored one at the start).
        self.version = version
        #: The dequeued entry's state while it dispatches: still queued durably.
        self.dispatching: EntryState | None = None
        #: Stored entries that could not be read: kept in every snapshot, never rebuilt.
        self.keep = keep
        #: Enqueue commits decided and not yet settled: the drain waits for them, so an entry
        #: is never dequeued before its ``queued`` is told.
        self.enqueues = 0
        #: The entry ids the last snapshot decided holds (what the store holds once it lands);
        #: ``None`` when a queue write failed and the store's queue is not known.
        self.stored: frozenset[str] | None = stored
        #: The dispatching entry is held by the store's queue: its leaving must be committed.
        self.dispatch_stored = False
        self._bodies: dict[str, tuple[EntryState, bytes]] = {}

    def dispatch(self, state: EntryState | None) -> None:
        """The head entry was dequeued: it stays queued durably until accepted or dropped."""
        self.dispatching = state
        stored = self.stored
        self.dispatch_stored = state is not None and (stored is None or state.id in stored)

    def holds(self, entry_id: str) -> bool:
        """Whether the store's queue (as last decided) may hold ``entry_id``."""
        return self.stored is None or entry_id in self.stored

    def changed(self, queue: MessageQueue) -> bool:
        """Whether ``queue`` (with the dispatching entry) holds other entries than the store."""
        if self.stored is None:
            return True
        held = {entry.id for entry in queue}
        if self.dispatching is not None:
            held.add(self.dispatching.id)
        return held != self.stored

    def unknown(self) -> None:
        """A queue write failed: the next change commits the whole queue again."""
        self.stored = None

    def snapshot(self, queue: MessageQueue) -> QueueSnapshot:
        """The next version of the session's durable queue: what ``queue`` holds now.

        Raises:
            InvalidEntry: an entry holds a value JSON cannot carry (send options' extra).
        """
        states = queue.export()
        if self.dispatching is not None:
            states = (self.dispatching, *states)
        bodies = self._bodies
        fresh: dict[str, tuple[EntryState, bytes]] = {}
        records: list[QueuedEntryRecord] = []
        for position, state in enumerate(states):
            cached = bodies.get(state.id)
            if cached is None or cached[0] != state:
                cached = (state, encode_entry(state))
            fresh[state.id] = cached
            records.append(
                QueuedEntryRecord(
                    session=self.session,
                    entry_id=state.id,
                    position=position,
                    kind=state.kind.value,
                    body=cached[1],
                )
            )
        self._bodies = fresh
        self.stored = frozenset(fresh)
        self.version += 1
        return QueueSnapshot(version=self.version, entries=tuple(records), keep=self.keep)


class RebuiltQueue(msgspec.Struct, frozen=True, kw_only=True):
    """What a restart makes of a session's durable queue (``rebuild``).

    Attributes:
        queue: The user-authored entries, in their order, ready to drain.
        keeper: The session's queue version and damaged ids.
        dropped: The agent-initiated entries' ids: their producers died with the process,
            so they are dropped (``entry-canceled`` reason ``restart``) once a snapshot
            without them is durable.
        damaged: ``(entry id, what was wrong)`` for each entry that could not be read: kept in
            the store as it is, never rebuilt.
    """

    queue: MessageQueue
    keeper: QueueKeeper
    dropped: tuple[str, ...] = ()
    damaged: tuple[tuple[str, str], ...] = ()


def rebuild(loaded: SessionLoad) -> RebuiltQueue:
    """The session's queue as ``loaded`` holds it durably (``docs/session.md``).

    User-authored entries come back in order (withdrawn ones withdrawn); agent-initiated ones
    (wakes, reports, system messages, follow-ups) are dropped: what produced them (a background
    task, a delegated turn's owner) did not survive the process, and a report of a delegated
    turn reaches its owner through the handle's durable settlement instead. An entry whose
    body does not decode is damaged: reported, kept in the store, never dispatched half-read.
    """
    session = loaded.record.id
    queue = MessageQueue()
    states: list[EntryState] = []
    dropped: list[str] = []
    damaged = list(loaded.queue_corrupt)
    for record in loaded.queue:
        try:
            state = decode_entry(record.body, f"{session}/{record.entry_id}")
        except CorruptRecord as error:
            damaged.append((record.entry_id, str(error)))
            continue
        if state.id != record.entry_id or state.kind.value != record.kind:
            what = "id" if state.id != record.entry_id else "kind"
            damaged.append(
                (
                    record.entry_id,
                    f"{TABLE}[{session}/{record.entry_id}]: $.{what}: the body "
                    "does not match its row",
                )
            )
            continue
        if state.user_authored:
            states.append(state)
        else:
            dropped.append(state.id)
    try:
        queue.restore(states)
    except InvalidEntry as error:  # two rows claim one id or key: none of them is rebuilt
        damaged.extend((s.id, f"{TABLE}[{session}/{s.id}]: {error}") for s in states)
        queue = MessageQueue()
    keep = tuple(entry_id for entry_id, _ in damaged)
    stored = frozenset(record.entry_id for record in loaded.queue) - set(keep)
    keeper = QueueKeeper(session, loaded.queue_version, keep, stored)
    return RebuiltQueue(queue=queue, keeper=keeper, dropped=tuple(dropped), damaged=tuple(damaged))
