"""message_queue: the session's queue of follow-up messages.

Owns entries and their batching and sealing, dispatch modes, dedupe keys, cancel tokens and the
cancel-aware readers that look past withdrawn entries (rules MQ-1 to MQ-16). It is pure: no
I/O, no awaits, no clock, no randomness. What of an entry outlives the process is its
``EntryState`` (``export`` / ``restore``, ``encode_entry`` / ``decode_entry``); the session
commits it (``docs/message-queue.md``, "The durable queue").

May import ``persistence`` (for the error root). Must never import ``stream_manager`` or
``agent_session``, nor anything that does I/O or reads time (``anyio``, ``asyncio``,
``aiosqlite``, ``sqlite3``, ``time``, ``random``, ``os``).
"""

from message_queue._durable import EntryState, MessageState, decode_entry, encode_entry
from message_queue._entries import (
    Attachment,
    CancelState,
    CancelToken,
    Correlation,
    DispatchMode,
    EntryCallbacks,
    EntryKind,
    GoalPolicy,
    MessageMetadata,
    MetadataType,
    OneShot,
    SendFailure,
    SendOptions,
    notify_all_canceled,
)
from message_queue._queue import MessageQueue
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

__all__ = [
    "AddOutcome",
    "Attachment",
    "CancelState",
    "CancelToken",
    "Correlation",
    "Dequeued",
    "DispatchMode",
    "EntryCallbacks",
    "EntryKind",
    "EntrySnapshot",
    "EntryState",
    "GoalPolicy",
    "InvalidEntry",
    "MessageMetadata",
    "MessageQueue",
    "MessageState",
    "MetadataType",
    "NewMessage",
    "OneShot",
    "PrefixRemoval",
    "QueueEmpty",
    "Queued",
    "RejectReason",
    "Rejected",
    "Restored",
    "SendFailure",
    "SendOptions",
    "UnknownEntry",
    "decode_entry",
    "encode_entry",
    "notify_all_canceled",
]
