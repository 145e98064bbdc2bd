"""What of a queued entry outlives the process: its durable state, split from the live parts.

An entry's texts, attachments, kind, mode, dedupe keys, metadata, options, batching and place
in order are plain data (:class:`EntryState`): the session commits them when the entry is
queued and drops them in the commit that accepts or cancels it (``docs/message-queue.md``,
"The durable queue"). What lives only in the producer's process (its callbacks, its cancel
token's listeners, a cancel state) is never part of it: a rebuilt entry has no callbacks, and
a fresh token when it had one (fired when it had been withdrawn).

:func:`encode_entry` and :func:`decode_entry` are the one encoding (msgspec JSON); a body that
does not decode, or decodes to an entry the queue would never have made, is reported as a
:class:`~persistence.CorruptRecord` naming the field and never rebuilt half-read.
"""

from __future__ import annotations

import msgspec

from message_queue._entries import (
    Attachment,
    DispatchMode,
    EntryKind,
    MessageMetadata,
    MetadataType,
    SendOptions,
)
from message_queue.errors import InvalidEntry
from persistence import CorruptRecord, clip

#: Where a damaged queued entry is reported (its table in ``docs/persistence.md``).
TABLE = "queued_entries"


class MessageState(msgspec.Struct, frozen=True, kw_only=True, gc=False, omit_defaults=True):
    """One add of a queued entry, as it is kept durably."""

    id: str
    text: str
    attachments: tuple[Attachment, ...] = ()
    dedupe_key: str | None = None
    synthetic: bool = False
    agent_initiated: bool = False


class EntryState(msgspec.Struct, frozen=True, kw_only=True, gc=False, omit_defaults=True):
    """A queued entry without its live parts (callbacks, cancel token listeners).

    Attributes:
        id: The entry's id (its first add's id).
        kind: Who produced it.
        mode: When it wants to run.
        sealed: It absorbs no later add (MQ-3).
        user_authored: A visible entry (MQ-15).
        continuation: It continues a delegated turn (MQ-13).
        metadata: Its first add's metadata (MQ-5).
        options: Its latest options (MQ-5).
        goal_pause: A ``pause`` goal policy was seen in it (sticky).
        withdrawable: It had a cancel token (a rebuilt one gets a fresh token).
        withdrawn: The token had fired (the rebuilt one is fired with ``withdrawn_reason``).
        withdrawn_reason: Why it was withdrawn.
        messages: Its adds, in order (never empty).
    """

    id: str
    kind: EntryKind
    mode: DispatchMode
    messages: tuple[MessageState, ...]
    sealed: bool = False
    user_authored: bool = True
    continuation: bool = False
    metadata: MessageMetadata | None = None
    options: SendOptions | None = None
    goal_pause: bool = False
    withdrawable: bool = False
    withdrawn: bool = False
    withdrawn_reason: str | None = None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(EntryState)


def encode_entry(state: EntryState) -> bytes:
    """``state`` as the body of its durable row.

    Raises:
        InvalidEntry: a send option's ``extra`` holds a value JSON cannot carry.
    """
    try:
        return _encoder.encode(state)
    except (TypeError, msgspec.EncodeError) as error:
        raise InvalidEntry(
            f"entry {state.id!r} cannot be kept durably: {error} (send options' extra "
            "must hold JSON values)"
        ) from None


def decode_entry(body: bytes, key: str) -> EntryState:
    """The entry a durable row's ``body`` holds; ``key`` names the row in the report.

    Raises:
        CorruptRecord: the body does not decode to an entry, or to one the queue never makes
            (no adds, blank ids, a correlation without workspace-turn metadata).
    """
    try:
        state = _decoder.decode(body)
    except msgspec.ValidationError as error:
        detail, _, path = str(error).partition(" - at `")
        raise CorruptRecord(TABLE, key, f"{path.rstrip('`') or '$'}: {clip(detail, 300)}") from None
    except msgspec.DecodeError as error:
        raise CorruptRecord(TABLE, key, f"$: not an entry: {clip(str(error), 300)}") from None
    problem = _problem(state)
    if problem is not None:
        raise CorruptRecord(TABLE, key, problem)
    return state


def _problem(state: EntryState) -> str | None:
    """What makes a decoded entry one the queue could never have held, or ``None``."""
    if not state.id:
        return "$.id: an entry needs an id"
    if not state.messages:
        return "$.messages: an entry holds at least one message"
    for index, message in enumerate(state.messages):
        if not message.id:
            return f"$.messages[{index}].id: a message needs an id"
    metadata = state.metadata
    if metadata is not None:
        workspace = metadata.type is MetadataType.WORKSPACE_TURN
        if workspace and metadata.correlation is None:
            return "$.metadata.correlation: workspace-turn metadata needs a correlation"
        if not workspace and metadata.correlation is not None:
            return f"$.metadata.correlation: {metadata.type} metadata carries no correlation"
    if state.withdrawn and not state.withdrawable:
        return "$.withdrawn: an entry without a cancel token cannot be withdrawn"
    return None
