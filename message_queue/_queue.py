"""The session's FIFO of follow-up messages (MQ-1 to MQ-16, ``docs/message-queue.md``).

Theory of operation
-------------------
The queue is a deque of *entries*; each entry holds one or more *messages* (adds) that leave
together. An add joins the tail entry (batching, MQ-2) unless the tail is sealed, the add must
start an entry of its own (MQ-3, MQ-4), or the two differ in authorship (user vs synthetic).

Two views of "what is queued" coexist on purpose:

* the **raw** view (``len``, ``is_empty``) counts every entry, withdrawn ones included. Drains
  use it, so a withdrawn entry is always dequeued and its cancellation runs (MQ-8, R63);
* the **live** readers (``has_queued``, ``next_dispatch_mode``, ``next_is_wake``,
  ``next_continues``, ``all_continue``, ``first_live``) look past entries whose cancel token
  fired. Stop decisions, the owner's claim and the soft-stop classification use them, so a
  withdrawn wake never cuts a turn or makes an owner defer (MQ-7, R31, R62).

Everything here is synchronous and deterministic: no awaits, no clock, no I/O, no randomness
(``tests/test_layering.py`` enforces it). Callbacks are never run by the queue itself except
through :func:`~message_queue.notify_all_canceled`, which the caller invokes; removals hand
the callbacks back in queue order so the caller decides when cancellations run (AS-16, R32).

Interpretations (see docs/message-queue.md): "latest options win" means the latest add that
carried options; a withdrawn entry is not a predecessor in correlation revalidation (MQ-13),
as in the all-predecessors scan (R62).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import msgspec

from message_queue._durable import EntryState, MessageState
from message_queue._entries import (
    Attachment,
    CancelToken,
    Correlation,
    DispatchMode,
    EntryCallbacks,
    EntryKind,
    SendOptions,
    parse_mode,
)
from message_queue._entry_state import Add, Entry, StoredMessage, validate
from message_queue._views import (
    AddOutcome,
    Dequeued,
    EntrySnapshot,
    NewMessage,
    PrefixRemoval,
    Queued,
    Rejected,
    RejectReason,
    Restored,
)
from message_queue.errors import InvalidEntry, QueueEmpty, UnknownEntry

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator


class MessageQueue:
    """An ordered queue of entries with batching, dedupe keys and cancel-aware readers.

    Not thread-safe and not async: one session owns one queue and calls it from its event loop.
    """

    __slots__ = ("_by_id", "_entries", "_keys", "_next_id")

    def __init__(self) -> None:
        self._entries: deque[Entry] = deque()
        self._by_id: dict[str, Entry] = {}  # entry ids and message ids
        self._keys: dict[str, Entry] = {}  # dedupe key -> the entry holding it
        self._next_id = 0

    # ------------------------------------------------------------------ adding

    def add(self, message: NewMessage) -> AddOutcome:
        """Queue one message (MQ-1 to MQ-5).

        Returns:
            :class:`Queued` naming the entry it landed in, or :class:`Rejected` (MQ-1: empty
            text and no attachments), in which case nothing changed.

        Raises:
            InvalidEntry: unknown kind or mode, an id already queued, inconsistent metadata.
        """
        return self._add(message, key=None, removable_key=False)

    def add_once(self, message: NewMessage, key: str, *, removable: bool = False) -> AddOutcome:
        """Queue ``message`` under dedupe ``key`` unless an entry already holds it (MQ-9).

        Args:
            message: the add.
            key: the dedupe key; it is released when its entry dispatches or is removed.
            removable: a removable key seals the entry, so it can later be removed by prefix.

        Returns:
            :class:`Queued`, or :class:`Rejected` with ``DUPLICATE_KEY`` or ``EMPTY``.
        """
        if not key:
            raise InvalidEntry("a dedupe key must be a non-empty string")
        return self._add(message, key=key, removable_key=removable)

    def _add(self, message: NewMessage, *, key: str | None, removable_key: bool) -> AddOutcome:
        add = validate(message, removable_key)
        if message.id is not None and message.id in self._by_id:
            raise InvalidEntry(f"entry id {message.id!r} is already queued")
        if not message.text.strip() and not message.attachments:
            return Rejected(RejectReason.EMPTY, "a message needs non-blank text or attachments")
        if key is not None and key in self._keys:
            holder = self._keys[key].id
            return Rejected(RejectReason.DUPLICATE_KEY, f"dedupe key {key!r} is held by {holder}")
        message_id = message.id if message.id is not None else self._fresh_id()
        stored = StoredMessage(
            message_id,
            message.text,
            message.attachments,
            key,
            add.synthetic,
            add.agent_initiated,
        )
        tail = self._entries[-1] if self._entries else None
        if (
            tail is not None
            and not add.starts_entry
            and not tail.sealed
            and tail.user_authored == add.user_authored
        ):
            self._join(tail, add, stored)
            entry, into = tail, tail.id
        else:
            entry, into = self._start(add, stored), None
        self._by_id[message_id] = entry
        if key is not None:
            self._keys[key] = entry
        return Queued(entry.id, message_id, into)

    def _start(self, add: Add, stored: StoredMessage) -> Entry:
        message = add.message
        token = message.cancel_token
        if token is None and add.kind is EntryKind.WAKE:
            token = CancelToken()  # a wake is withdrawable by definition
        entry = Entry(
            id=stored.id,
            kind=add.kind,
            mode=add.mode,
            sealed=add.sealed,
            user_authored=add.user_authored,
            continuation=message.workspace_turn_continuation,
            metadata=message.metadata,
            options=message.options,
            goal_pause=message.options is not None and message.options.goal_policy == "pause",
            on_accepted=message.on_accepted,
            on_pre_stream_failure=message.on_accepted_pre_stream_failure,
            on_canceled=message.on_canceled,
            token=token,
            cancel_state=message.cancel_state,
            messages=[stored],
        )
        self._entries.append(entry)
        return entry

    @staticmethod
    def _join(entry: Entry, add: Add, stored: StoredMessage) -> None:
        """MQ-5: texts in order, files accumulate, first metadata, latest options, sticky modes."""
        message = add.message
        entry.messages.append(stored)
        if entry.metadata is None:
            entry.metadata = message.metadata
        if message.options is not None:
            entry.options = message.options
            entry.goal_pause = entry.goal_pause or message.options.goal_policy == "pause"
        if add.mode is DispatchMode.TOOL_END:
            entry.mode = DispatchMode.TOOL_END  # tool-end is sticky: turn-end never downgrades
        entry.continuation = entry.continuation or message.workspace_turn_continuation

    def _fresh_id(self) -> str:
        while True:
            self._next_id += 1
            candidate = f"q{self._next_id}"
            if candidate not in self._by_id:
                return candidate

    # ------------------------------------------------------------------ raw view

    def __len__(self) -> int:
        """Entries held, withdrawn ones included (the raw size drains use, MQ-8)."""
        return len(self._entries)

    @property
    def is_empty(self) -> bool:
        """Raw emptiness: ``False`` while any entry, even a withdrawn one, is queued (MQ-8)."""
        return not self._entries

    def __iter__(self) -> Iterator[EntrySnapshot]:
        """Snapshots of every entry, head first, withdrawn ones included."""
        return (entry.snapshot() for entry in tuple(self._entries))

    def get(self, entry_id: str) -> EntrySnapshot | None:
        """The entry holding ``entry_id`` (an entry or message id), or ``None``."""
        entry = self._by_id.get(entry_id)
        return entry.snapshot() if entry is not None else None

    def holds_dedupe_key(self, key: str) -> bool:
        """Whether an entry holds ``key``."""
        return key in self._keys

    def holds_only_dedupe_key(self, key: str) -> bool:
        """True only for exactly one entry with exactly one add, holding ``key`` (MQ-9)."""
        if len(self._entries) != 1:
            return False
        messages = self._entries[0].messages
        return len(messages) == 1 and messages[0].dedupe_key == key

    # ------------------------------------------------------------------ live readers

    def _live(self) -> Iterator[Entry]:
        return (entry for entry in self._entries if not entry.withdrawn)

    def _first_live(self) -> Entry | None:
        for entry in self._entries:
            if not entry.withdrawn:
                return entry
        return None

    def first_live(self) -> EntrySnapshot | None:
        """The first entry whose cancel token has not fired (MQ-7)."""
        entry = self._first_live()
        return entry.snapshot() if entry is not None else None

    def has_queued(self, mode: DispatchMode | str | None = None) -> bool:
        """MQ-8: a live entry exists and, when ``mode`` is given, the first live one has it."""
        entry = self._first_live()
        if entry is None:
            return False
        if mode is None:
            return True
        return entry.mode is (mode if isinstance(mode, DispatchMode) else parse_mode(mode))

    def next_dispatch_mode(self) -> DispatchMode:
        """The first live entry's mode; ``tool-end`` when none is live (MQ-6, MQ-7)."""
        entry = self._first_live()
        return entry.mode if entry is not None else DispatchMode.TOOL_END

    def aggregate_dispatch_mode(self) -> DispatchMode:
        """``tool-end`` if any live entry is ``tool-end`` or none is live, else ``turn-end``."""
        modes = {entry.mode for entry in self._live()}
        if not modes or DispatchMode.TOOL_END in modes:
            return DispatchMode.TOOL_END
        return DispatchMode.TURN_END

    def next_is_wake(self) -> bool:
        """Whether the first live entry is a background wake (MQ-7)."""
        entry = self._first_live()
        return entry is not None and entry.kind is EntryKind.WAKE

    def next_continues(self, correlation: Correlation) -> bool:
        """Whether the first live entry carries ``correlation`` (MQ-7, R31)."""
        entry = self._first_live()
        return entry is not None and entry.correlation == correlation

    def all_continue(self, correlation: Correlation) -> bool:
        """Whether every live entry carries ``correlation`` (MQ-7, R62).

        Withdrawn entries are ignored entirely, so a queue holding only withdrawn entries has
        no predecessor and answers ``True``.
        """
        return all(entry.correlation == correlation for entry in self._live())

    def visible(self) -> list[EntrySnapshot]:
        """The user-authored entries, in order (MQ-15); hidden ones are never shown."""
        return [entry.snapshot() for entry in self._entries if entry.user_authored]

    # ------------------------------------------------------------------ withdrawing

    def withdraw(self, entry_id: str, reason: str = CancelToken.DEFAULT_REASON) -> bool:
        """Fire the cancel token of the entry holding ``entry_id``.

        The entry stays queued (raw view) for a drain or removal to cancel.

        Returns:
            ``True`` when this call withdrew it, ``False`` when it was already withdrawn.

        Raises:
            UnknownEntry: no entry holds that id.
            InvalidEntry: the entry has no cancel token, so nobody may withdraw it.
        """
        entry = self._by_id.get(entry_id)
        if entry is None:
            raise UnknownEntry(f"no queued entry {entry_id!r}")
        if entry.token is None:
            raise InvalidEntry(f"entry {entry.id!r} has no cancel token and cannot be withdrawn")
        return entry.token.cancel(reason)

    # ------------------------------------------------------------------ leaving

    def _release(self, entry: Entry) -> None:
        for message in entry.messages:
            self._release_message(message)

    def _release_message(self, message: StoredMessage) -> None:
        self._by_id.pop(message.id, None)
        if message.dedupe_key is not None:
            self._keys.pop(message.dedupe_key, None)

    def _remove_entries(self, doomed: Iterable[Entry]) -> list[EntryCallbacks]:
        doomed_ids = {id(entry) for entry in doomed}
        if not doomed_ids:
            return []
        kept: deque[Entry] = deque()
        removed: list[EntryCallbacks] = []
        for entry in self._entries:
            if id(entry) in doomed_ids:
                self._release(entry)
                self._by_id.pop(entry.id, None)
                removed.append(entry.callbacks())
            else:
                kept.append(entry)
        self._entries = kept
        return removed

    def dequeue_next(self) -> Dequeued:
        """Remove the head entry, withdrawn or not, and hand it over (MQ-14).

        Raises:
            QueueEmpty: the queue holds no entry (check ``is_empty`` first).
        """
        if not self._entries:
            raise QueueEmpty("dequeue_next on an empty queue")
        entry = self._entries.popleft()
        state = state_of(entry)
        self._release(entry)
        self._by_id.pop(entry.id, None)
        messages = entry.messages
        attachments = tuple(a for m in messages for a in m.attachments)
        options = entry.options
        if entry.goal_pause and (options is None or options.goal_policy != "pause"):
            base = options if options is not None else SendOptions()
            options = msgspec.structs.replace(base, goal_policy="pause")
        return Dequeued(
            entry_id=entry.id,
            kind=entry.kind,
            mode=entry.mode,
            text="\n".join(m.text for m in messages),
            options=options,
            metadata=entry.metadata,
            attachments=attachments or None,
            synthetic=all(m.synthetic for m in messages),
            agent_initiated=all(m.agent_initiated for m in messages),
            user_authored=entry.user_authored,
            workspace_turn_continuation=entry.continuation,
            callbacks=entry.callbacks(),
            cancel_token=entry.token,
            cancel_state=entry.cancel_state,
            state=state,
        )

    def clear(self) -> list[EntryCallbacks]:
        """Empty the queue (MQ-16).

        Returns:
            Every entry's callbacks, in queue order, for the caller to notify.
        """
        removed = self._remove_entries(list(self._entries))
        self._keys.clear()
        return removed

    def restore_to_input(self) -> Restored:
        """Give the visible content back and clear everything (MQ-15, AS-17).

        User-authored texts and attachments come back for the composer; every entry leaves,
        and synthetic ones are to be cancelled, never restored.
        """
        texts: list[str] = []
        attachments: list[Attachment] = []
        for entry in self._entries:
            if entry.user_authored:
                texts.extend(m.text for m in entry.messages)
                attachments.extend(a for m in entry.messages for a in m.attachments)
        return Restored("\n".join(texts), tuple(attachments), self.clear())

    def remove_by_dedupe_key_prefix(self, prefix: str) -> PrefixRemoval:
        """Remove every message whose dedupe key starts with ``prefix`` (MQ-10).

        An entry that keeps messages stays, with fewer adds; an entry that loses all of them
        leaves and its callbacks come back. An empty prefix removes nothing.
        """
        if not prefix:
            return PrefixRemoval(0, [])
        count = 0
        emptied: list[Entry] = []
        for entry in self._entries:
            doomed = [
                m
                for m in entry.messages
                if m.dedupe_key is not None and m.dedupe_key.startswith(prefix)
            ]
            if not doomed:
                continue
            count += len(doomed)
            if len(doomed) == len(entry.messages):
                emptied.append(entry)
                continue
            for message in doomed:
                self._release_message(message)
            self._by_id[entry.id] = entry  # the entry keeps its id when its first add leaves
            entry.messages = [m for m in entry.messages if m not in doomed]
        return PrefixRemoval(count, self._remove_entries(emptied))

    def drop_only_dedupe_key(self, key: str) -> list[EntryCallbacks]:
        """Remove the queue's only entry when its only add holds ``key`` (MQ-9's reader).

        Anything else queued, or a second add batched with it, keeps it: the callbacks of the
        entry removed come back (none when nothing was).
        """
        if not self.holds_only_dedupe_key(key):
            return []
        return self._remove_entries([self._entries[0]])

    def remove_workspace_turn(self, handle_id: str) -> list[EntryCallbacks]:
        """Remove the entries whose workspace-turn metadata names ``handle_id`` (MQ-11)."""
        doomed = [
            entry
            for entry in self._entries
            if entry.correlation is not None and entry.correlation.handle_id == handle_id
        ]
        return self._remove_entries(doomed)

    # ------------------------------------------------------------------ reordering

    def prioritize_next_user_entry(self) -> bool:
        """Move the oldest user-authored entry to the head (MQ-12); ``False`` if there is none."""
        for index, entry in enumerate(self._entries):
            if entry.user_authored:
                if index:
                    del self._entries[index]
                    self._entries.appendleft(entry)
                self._revalidate_correlations()
                return True
        return False

    def set_visible_dispatch_mode(self, mode: DispatchMode | str) -> bool:
        """Give every user-authored entry ``mode`` and move them ahead of hidden ones (MQ-12).

        Returns:
            ``False`` when no user-authored entry is queued (nothing changes).
        """
        new_mode = parse_mode(mode)
        visible = [entry for entry in self._entries if entry.user_authored]
        if not visible:
            return False
        for entry in visible:
            entry.mode = new_mode
        hidden = [entry for entry in self._entries if not entry.user_authored]
        self._entries = deque(visible + hidden)
        self._revalidate_correlations()
        return True

    def _revalidate_correlations(self) -> None:
        """MQ-13: strip stale continuations queued behind unrelated work.

        Walking live entries from the head, once an entry without a correlation or with a
        different one than the first correlated entry has been seen, every later entry flagged
        as a workspace-turn continuation loses its metadata and its cancellation callbacks (a
        stale report must not settle a superseded turn). Original prompts keep theirs.
        """
        first: Correlation | None = None
        superseded = False
        for entry in self._live():
            if superseded and entry.continuation:
                entry.metadata = None
                entry.on_canceled = None
                entry.on_pre_stream_failure = None
                continue
            correlation = entry.correlation
            if correlation is None or (first is not None and correlation != first):
                superseded = True
            elif first is None:
                first = correlation

    # ------------------------------------------------------------------ durability

    def export(self) -> tuple[EntryState, ...]:
        """Every entry's durable state, head first, withdrawn ones included (no live parts)."""
        return tuple(state_of(entry) for entry in self._entries)

    def restore(self, states: Iterable[EntryState]) -> None:
        """Queue rebuilt entries after the ones held, in order, as they were kept.

        Each gets no callbacks and, when it had a cancel token, a fresh one (fired with the
        kept reason when it had been withdrawn). Ids the queue makes from now on never clash
        with a rebuilt one.

        Raises:
            InvalidEntry: an entry or message id, or a dedupe key, is already held.
        """
        for state in states:
            ids = {state.id, *(m.id for m in state.messages)}
            keys = [m.dedupe_key for m in state.messages if m.dedupe_key is not None]
            taken = [i for i in ids if i in self._by_id] + [k for k in keys if k in self._keys]
            if taken:
                raise InvalidEntry(f"entry {state.id!r}: {taken[0]!r} is already queued")
            token = None
            if state.withdrawable:
                token = CancelToken()
                if state.withdrawn:
                    token.cancel(state.withdrawn_reason or CancelToken.DEFAULT_REASON)
            entry = Entry(
                id=state.id,
                kind=state.kind,
                mode=state.mode,
                sealed=state.sealed,
                user_authored=state.user_authored,
                continuation=state.continuation,
                metadata=state.metadata,
                options=state.options,
                goal_pause=state.goal_pause,
                on_accepted=None,
                on_pre_stream_failure=None,
                on_canceled=None,
                token=token,
                cancel_state=None,
                messages=[
                    StoredMessage(
                        m.id, m.text, m.attachments, m.dedupe_key, m.synthetic, m.agent_initiated
                    )
                    for m in state.messages
                ],
            )
            self._entries.append(entry)
            for identifier in ids:
                self._by_id[identifier] = entry
                if identifier[:1] == "q" and identifier[1:].isdigit():  # one _fresh_id made
                    self._next_id = max(self._next_id, int(identifier[1:]))
            for key in keys:
                self._keys[key] = entry

    # ------------------------------------------------------------------ introspection

    def __repr__(self) -> str:
        live = [entry for entry in self._entries if not entry.withdrawn]
        sealed = sum(entry.sealed for entry in self._entries)
        tool_end = sum(entry.mode is DispatchMode.TOOL_END for entry in live)
        return (
            f"<MessageQueue [{len(self._entries)} entries: {len(live)} live, "
            f"{len(self._entries) - len(live)} withdrawn, {sealed} sealed | "
            f"modes: {tool_end} tool-end, {len(live) - tool_end} turn-end | "
            f"keys: {len(self._keys)}]>"
        )


def state_of(entry: Entry) -> EntryState:
    """The durable state of ``entry`` (its live parts left out)."""
    token = entry.token
    return EntryState(
        id=entry.id,
        kind=entry.kind,
        mode=entry.mode,
        messages=tuple(
            MessageState(
                id=m.id,
                text=m.text,
                attachments=m.attachments,
                dedupe_key=m.dedupe_key,
                synthetic=m.synthetic,
                agent_initiated=m.agent_initiated,
            )
            for m in entry.messages
        ),
        sealed=entry.sealed,
        user_authored=entry.user_authored,
        continuation=entry.continuation,
        metadata=entry.metadata,
        options=entry.options,
        goal_pause=entry.goal_pause,
        withdrawable=token is not None,
        withdrawn=token is not None and token.cancelled,
        withdrawn_reason=token.reason if token is not None else None,
    )
