"""persistence: the durable records and the Store port.

Owns the records turnkeeper commits at its durable boundaries (plain msgspec Structs: history
rows with their cut records, sessions, turn envelopes, operation receipts), the ``Store``
protocol (commit one session's durable boundary, load a session, scan for recovery, query
receipts) and its SQLite and in-memory implementations, migrations, and the read-only SQLite
open that ``turnkeeper inspect`` and ``receipts`` use, and the lock that gives a SQLite store
one owning process. It tells a PostgreSQL URL from a path and masks its password
(``is_postgres_url``, ``masked``) without psycopg; the store itself is
``persistence.postgres``. It also holds the root of turnkeeper's error tree, because it is the
one package every other package may import.

Must never import: ``agent_session``, ``stream_manager``, ``message_queue`` (it is the bottom
layer; the packages above convert their domain objects to and from its records).
"""

from persistence._errors import (
    CorruptRecord,
    DamagedStore,
    ForeignStore,
    LeaseLost,
    MigrationRequired,
    NotATurnkeeperStore,
    StaleOwner,
    StoreError,
    StoreLocked,
    TurnkeeperError,
    UnsupportedSchemaVersion,
    UsageError,
)
from persistence._logging import quiet_aiosqlite
from persistence._memory import MemoryStore
from persistence._open_receipts import DamagedReceipt, OpenReceipts
from persistence._requests import Reply, Request, RequestKind, Withdrawn
from persistence._resolve import (
    OPERATOR,
    OPERATOR_OUTCOMES,
    NotResolvable,
    Resolution,
    as_resolution,
    checked_note,
    found_receipt,
    resolve_operation,
    resolved,
)
from persistence._sqlite import SqliteStore
from persistence._text import clip
from persistence._urls import is_postgres_url, masked
from persistence.records import (
    INBOX_ENTRY,
    MAX_SEQ,
    MAX_STEPS,
    OPEN_OP_STATES,
    RETRY_SETTINGS,
    AbandonMarker,
    AbandonQuery,
    Boundary,
    Capability,
    Committed,
    CutRecord,
    CutState,
    CutStateChange,
    HandleQuery,
    HandleRecord,
    HandleStatus,
    HistoryRow,
    OperationRecord,
    OpState,
    PartialChunk,
    QueuedEntryRecord,
    QueueQuery,
    QueueSnapshot,
    ReceiptQuery,
    RecoverableCut,
    RecoveryScan,
    RowKind,
    SessionList,
    SessionLoad,
    SessionRecord,
    SessionTail,
    StoredPartial,
    ToolKind,
    TurnEnvelope,
)
from persistence.store import LeaseBook, LeasedStore, Store

__all__ = [
    "INBOX_ENTRY",
    "MAX_SEQ",
    "MAX_STEPS",
    "OPEN_OP_STATES",
    "OPERATOR",
    "OPERATOR_OUTCOMES",
    "RETRY_SETTINGS",
    "AbandonMarker",
    "AbandonQuery",
    "Boundary",
    "Capability",
    "Committed",
    "CorruptRecord",
    "CutRecord",
    "CutState",
    "CutStateChange",
    "DamagedReceipt",
    "DamagedStore",
    "ForeignStore",
    "HandleQuery",
    "HandleRecord",
    "HandleStatus",
    "HistoryRow",
    "LeaseBook",
    "LeaseLost",
    "LeasedStore",
    "MemoryStore",
    "MigrationRequired",
    "NotATurnkeeperStore",
    "NotResolvable",
    "OpState",
    "OpenReceipts",
    "OperationRecord",
    "PartialChunk",
    "QueueQuery",
    "QueueSnapshot",
    "QueuedEntryRecord",
    "ReceiptQuery",
    "RecoverableCut",
    "RecoveryScan",
    "Reply",
    "Request",
    "RequestKind",
    "Resolution",
    "RowKind",
    "SessionList",
    "SessionLoad",
    "SessionRecord",
    "SessionTail",
    "SqliteStore",
    "StaleOwner",
    "Store",
    "StoreError",
    "StoreLocked",
    "StoredPartial",
    "ToolKind",
    "TurnEnvelope",
    "TurnkeeperError",
    "UnsupportedSchemaVersion",
    "UsageError",
    "Withdrawn",
    "as_resolution",
    "checked_note",
    "clip",
    "found_receipt",
    "is_postgres_url",
    "masked",
    "resolve_operation",
    "resolved",
]

# aiosqlite's records never carry a row or the owner token (persistence/_logging.py).
quiet_aiosqlite()
