"""Values that go into and come out of the queue.

``NewMessage`` is what a producer adds; ``Queued`` / ``Rejected`` is the answer; the snapshots,
``Dequeued`` and ``Restored`` are read-only views of what the queue holds.
They are frozen dataclasses rather than msgspec Structs because they carry callbacks and live
cancel tokens, which are never serialized (the durable queue rows are persistence's records).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import msgspec

from message_queue._durable import EntryState
from message_queue._entries import (
    Attachment,
    CancelState,
    CancelToken,
    Correlation,
    DispatchMode,
    EntryCallbacks,
    EntryKind,
    MessageMetadata,
    OnAccepted,
    OnAcceptedPreStreamFailure,
    OnCanceled,
    SendOptions,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class NewMessage:
    """One add, as a producer hands it to :meth:`MessageQueue.add`.

    ``synthetic`` and ``agent_initiated`` default from the kind: a user message is neither; a
    wake and a report are both; system messages and follow-ups are synthetic only. A wake is
    always sealed and always gets a cancel token (one is made when none is given).
    """

    text: str = ""
    kind: EntryKind | str = EntryKind.USER
    mode: DispatchMode | str = DispatchMode.TOOL_END
    #: The message's id; the entry it starts takes the same id. ``None``: the queue makes one.
    id: str | None = None
    attachments: tuple[Attachment, ...] = ()
    metadata: MessageMetadata | None = None
    options: SendOptions | None = None
    sealed: bool = False
    synthetic: bool | None = None
    agent_initiated: bool | None = None
    #: The message continues a delegated turn (a same-turn report); see MQ-13.
    workspace_turn_continuation: bool = False
    on_accepted: OnAccepted | None = None
    on_accepted_pre_stream_failure: OnAcceptedPreStreamFailure | None = None
    on_canceled: OnCanceled | None = None
    cancel_token: CancelToken | None = None
    cancel_state: CancelState | None = None


class RejectReason(StrEnum):
    """Why an add was refused; nothing in the queue changed."""

    #: MQ-1: the trimmed text is empty and there are no attachments.
    EMPTY = "empty"
    #: MQ-9: ``add_once`` with a dedupe key some entry already holds.
    DUPLICATE_KEY = "duplicate-key"


@dataclass(frozen=True, slots=True)
class Queued:
    """An accepted add."""

    entry_id: str
    message_id: str
    #: The entry it batched into, or ``None`` when it started a new entry.
    into: str | None


@dataclass(frozen=True, slots=True)
class Rejected:
    """A refused add, with a sentence saying why."""

    reason: RejectReason
    detail: str


AddOutcome = Queued | Rejected


@dataclass(frozen=True, slots=True, kw_only=True)
class EntrySnapshot:
    """A read-only view of one entry."""

    id: str
    kind: EntryKind
    mode: DispatchMode
    sealed: bool
    user_authored: bool
    workspace_turn_continuation: bool
    withdrawn: bool
    texts: tuple[str, ...]
    dedupe_keys: tuple[str, ...]
    attachments: tuple[Attachment, ...]
    metadata: MessageMetadata | None
    options: SendOptions | None
    adds: int
    has_on_canceled: bool
    has_on_accepted_pre_stream_failure: bool

    @property
    def correlation(self) -> Correlation | None:
        """The delegated-turn correlation of the entry's metadata, if any."""
        return self.metadata.correlation if self.metadata is not None else None


class Dequeued(msgspec.Struct, frozen=True, kw_only=True):
    """What :meth:`MessageQueue.dequeue_next` hands the dispatcher (MQ-14)."""

    entry_id: str
    kind: EntryKind
    mode: DispatchMode
    #: The entry's texts joined with a newline.
    text: str
    #: The latest options with the sticky goal policy merged in; never a dispatch mode.
    options: SendOptions | None
    #: The first metadata added.
    metadata: MessageMetadata | None
    #: The file parts, or ``None`` when there are none.
    attachments: tuple[Attachment, ...] | None
    #: Every add was synthetic.
    synthetic: bool
    #: Every add was agent-initiated.
    agent_initiated: bool
    user_authored: bool
    workspace_turn_continuation: bool
    callbacks: EntryCallbacks
    cancel_token: CancelToken | None
    cancel_state: CancelState | None
    #: The entry's durable state as it was queued (kept durably until it is accepted or
    #: dropped: a crash while it dispatches leaves it queued).
    state: EntryState | None = None

    @property
    def withdrawn(self) -> bool:
        """Whether the entry's cancel token has fired (the dispatcher must cancel it)."""
        return self.cancel_token is not None and self.cancel_token.cancelled


@dataclass(frozen=True, slots=True)
class PrefixRemoval:
    """What :meth:`MessageQueue.remove_by_dedupe_key_prefix` did (MQ-10)."""

    #: How many keyed messages were removed.
    removed_messages: int
    #: The entries that lost every message and left the queue, in queue order.
    removed_entries: list[EntryCallbacks]


@dataclass(frozen=True, slots=True)
class Restored:
    """What :meth:`MessageQueue.restore_to_input` gives back (MQ-15, AS-17)."""

    #: The visible (user-authored) texts joined with a newline; empty when none were queued.
    text: str
    attachments: tuple[Attachment, ...]
    #: Every entry that left, in queue order; run their cancellations (synthetic ones are
    #: cancelled, never restored).
    removed: list[EntryCallbacks]
