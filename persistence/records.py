"""The records turnkeeper commits at its durable boundaries.

Every record is a frozen msgspec Struct of plain data (strings, integers, tuples, bytes, enums
and frozen Structs of them, such as a receipt's ``Capability`` pair), so a store can share it
without copying and encode it without asking the layers above.
Schema evolution follows msgspec's rules: a new field always gets a default, so a record
written by older code still decodes. Records are not tracked by the cyclic garbage collector
(``gc=False``): they hold no mutable container and can never be part of a cycle, and a process
holding thousands of sessions otherwise spends much of its time re-scanning them.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated

import msgspec

#: The largest seq a stored row may hold: exact in every JSON reader, and far enough from
#: SQLite's 64-bit limit that the next seq always fits. A stored value beyond it is damage.
MAX_SEQ = 2**53 - 1
#: The most steps a stored budget (a cut's ``remaining``, an envelope's ``budget``) may say:
#: beyond any turn's ceiling (``max_stream_steps``); a stored value beyond it is damage.
MAX_STEPS = 2**31 - 1
#: The largest cut, session or envelope record a store reads back (they hold names and ids,
#: a few hundred bytes); a larger one is damage.
MAX_RECORD_BYTES = 65_536
#: The largest receipt a store reads back (a receipt may hold a person's note).
MAX_RECEIPT_BYTES = 1_048_576
#: The largest handle record a store takes and reads back (a handle may hold a turn's report).
MAX_HANDLE_BYTES = 1_048_576
Steps = Annotated[int, msgspec.Meta(ge=0, le=MAX_STEPS)]
Seq = Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)]


class CutState(StrEnum):
    """Where a durable cut record stands (PS-6)."""

    #: The cut owes a continuation: startup recovery resumes it.
    OWED = "owed"
    #: The continuation ran; nothing is owed any more.
    CONSUMED = "consumed"
    #: Voided because the entry that cut the turn was withdrawn (PS-6).
    WITHDRAWN = "withdrawn"
    #: Voided because the continuation was forfeited (PS-6).
    FORFEITED = "forfeited"
    #: Voided for any other reason (e.g. admission no longer holds).
    VOIDED = "voided"


class RowKind(StrEnum):
    """What a history row is."""

    USER = "user"
    ASSISTANT = "assistant"
    #: An assistant message committed after an abort (``partial: true``, B6).
    PARTIAL = "partial"
    #: A ``[CONTINUE]`` sentinel (B9).
    SENTINEL = "sentinel"
    SYSTEM = "system"
    #: A compaction's summary of the history before it (AS-36), with its pending follow-up
    #: while one is owed (B7); a request reads the history from the last one on.
    SUMMARY = "summary"


class SessionRecord(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A session the store holds history for.

    Attributes:
        id: The session id, unique in the store.
        model: The session's model.
        created_seq: The history sequence number the session was created at.
        goal: The goal the session works towards, if any.
    """

    id: str
    model: str
    created_seq: Seq = 0
    goal: str | None = None


class CutRecord(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The durable record of a cut, riding on the cut's assistant row (PS-6, R60).

    It carries what startup recovery needs to rebuild the owed continuation: the remaining
    step budget, the fallback progress, the delegated-turn correlation and the goal attribution.

    Attributes:
        remaining: Model steps left in the logical turn (never negative, at most
            ``MAX_STEPS``).
        model: The model the cut stream ran on.
        requested_model: The model the turn asked for before any fallback hop.
        refused_models: Models that refused during this turn, in order (fallback progress).
        chain: The fallback chain still to try, in order.
        handle_id: The delegated handle of the correlation, if the turn is delegated.
        owner_session: The owner session of the correlation.
        turn_id: The delegated turn id of the correlation.
        goal_kind: The kind of goal the turn is attributed to, if any.
        goal_id: The goal the turn is attributed to, if any.
        state: Whether the continuation is still owed.
    """

    remaining: Steps
    model: str
    requested_model: str
    refused_models: tuple[str, ...] = ()
    chain: tuple[str, ...] = ()
    handle_id: str | None = None
    owner_session: str | None = None
    turn_id: str | None = None
    goal_kind: str | None = None
    goal_id: str | None = None
    state: CutState = CutState.OWED


class HistoryRow(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One row of a session's history log.

    Attributes:
        session: The session the row belongs to.
        seq: The row's position, assigned by the caller and strictly increasing per session.
        row_id: The row's id, unique within the session.
        kind: What the row is.
        body: The message, as msgspec JSON owned by the layer above; the store keeps it
            byte-exact and never decodes it.
        stream: The stream that wrote the row, if any.
        cut: The durable cut record, on the assistant row of a cut stream.
    """

    session: str
    seq: int
    row_id: str
    kind: RowKind
    body: bytes = b"{}"
    stream: str | None = None
    cut: CutRecord | None = None


class RecoverableCut(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A session with an owed cut record, as startup recovery reads it (PS-6).

    Plain facts, no decisions: what the rows mean (which owed record is the live one, what
    moved the conversation on) is decided above storage, in ``agent_session._recovery``.

    Attributes:
        session: The session's record.
        owed: Every row of the session whose cut record is ``owed``, by seq (never empty).
        after: Every row after the last of them, by seq.
        streams: The session's turn envelopes' stream ids, in first-written order (to
            number the next stream).
        queue_version: The session's stored queue version (0 when none was ever written):
            the recovered session's next queue snapshot must be above it.
    """

    session: SessionRecord
    owed: tuple[HistoryRow, ...]
    after: tuple[HistoryRow, ...] = ()
    streams: tuple[str, ...] = ()
    queue_version: int = 0

    @property
    def row(self) -> HistoryRow:
        """The session's last row with an owed cut record."""
        return self.owed[-1]

    @property
    def last_seq(self) -> int:
        """The seq of the session's last row."""
        return (self.after or self.owed)[-1].seq


#: The largest abandon marker reason a store holds, in UTF-8 bytes (a longer one is refused
#: when written and read back as damage).
MAX_ABANDON_REASON_BYTES = 65_536


class AbandonMarker(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A session's startup-abandon marker (PS-8): why its last turn must not be retried.

    A store refuses one a reader would call damaged (``_checks.abandon_problem``): a reason
    that is empty, not text or over :data:`MAX_ABANDON_REASON_BYTES`, a ``user_row`` that is
    not text.

    Attributes:
        reason: Why the turn was given up: a non-retryable failure's type, or ``aborted``
            (a user stopped it).
        user_row: The turn's anchor: the id of the user row it answered (a startup retry of
            that row's turn is not made; a later user row is retried as usual).
    """

    reason: str
    user_row: str | None = None


class AbandonQuery(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What ``abandon_markers()`` returns: every session's marker, by session id.

    Attributes:
        markers: ``(session, marker)`` for every stored marker that validates.
        corrupt: ``(session, what was wrong, naming the field)`` for each that does not:
            reported, never dropped or rewritten.
    """

    markers: tuple[tuple[str, AbandonMarker], ...] = ()
    corrupt: tuple[tuple[str, str], ...] = ()


class SessionTail(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A session whose history ends on a turn nothing answered, as startup reads it (PS-4).

    Plain facts, no decisions (``agent_session._recovery.plan_retry`` decides): a session
    with no owed cut record whose last row that is not a system row is a user row, a
    ``[CONTINUE]`` sentinel or a partial assistant row.

    Attributes:
        session: The session's record.
        rows: Its rows from the last user row on (every row, when it has none), by seq.
        last_seq: The seq of its last row.
        streams: Its turn envelopes' stream ids, in first-written order.
        envelope: Its last-written turn envelope (the stream that was running, if any).
        envelope_ended: A row of the session names that envelope's stream (it ended with a
            row: it was not running when the process died).
        queue_version: Its stored queue version.
        abandon: Its startup-abandon marker, if one is stored.
        auto_retry: Its auto-retry preference (AS-32): ``False`` when "off" is stored, or
            when the stored preference is damaged (read as off, and logged); ``True`` when
            nothing is stored.
    """

    session: SessionRecord
    rows: tuple[HistoryRow, ...]
    last_seq: int
    streams: tuple[str, ...] = ()
    envelope: TurnEnvelope | None = None
    envelope_ended: bool = False
    queue_version: int = 0
    abandon: AbandonMarker | None = None
    auto_retry: bool = True


class RecoveryScan(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What startup recovery needs from the store, read at once (one call in SQLite)."""

    cuts: tuple[RecoverableCut, ...] = ()
    #: Every session whose durable queue holds an entry (valid or damaged), by id: recovery
    #: opens each and rebuilds its queue (``Store.load`` reads the entries).
    queued: tuple[str, ...] = ()
    #: Every session that owes nothing and whose history ends on an unanswered turn, by id
    #: (the startup retry's candidates, PS-4).
    tails: tuple[SessionTail, ...] = ()
    #: ``(session, what was wrong)`` for every session whose owed rows, later rows or record
    #: failed validation: those sessions are left out of ``cuts`` and nothing of theirs is
    #: changed.
    corrupt: tuple[tuple[str, str], ...] = ()


class TurnEnvelope(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What a stream was constructed with (PS-1, boundary B3).

    Attributes:
        session: The session the stream runs in.
        stream: The stream id, unique within the session.
        model: The model the stream starts on.
        budget: The step budget the stream starts with.
        cause: Why the stream was started (user entry, resume, retry, ...).
        handle: The delegated handle the stream works for, if any.
        after_seq: The seq of the session's last row when the stream was constructed (the
            history it answers ends there; ``None`` in envelopes written before it was kept).
    """

    session: str
    stream: str
    model: str
    budget: Steps
    cause: str
    handle: str | None = None
    after_seq: Seq | None = None


class OpState(StrEnum):
    """Where an operation (a tool call) is (OP-8)."""

    REQUESTED = "requested"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    #: Started, and nobody can say whether it stopped (no acknowledgement, a crash).
    INDETERMINATE = "indeterminate"


#: States an operation may still leave (on its own, or by a late acknowledgement).
OPEN_OP_STATES: frozenset[OpState] = frozenset(
    {OpState.REQUESTED, OpState.RUNNING, OpState.INDETERMINATE}
)


class ToolKind(StrEnum):
    """How a tool runs (``[[tools]] kind`` in ``docs/scenarios.md``); a capability's kind.

    Defined here, at the bottom layer, because a receipt records it; ``stream_manager``
    re-exports it as ``stream_manager.ToolKind``.
    """

    #: Executed by the engine after the step finishes.
    CLIENT = "client"
    #: Executed inside the model's response; the engine only sees its result.
    PROVIDER = "provider"
    #: A required tool: its successful result ends the turn.
    COMPLETION = "completion"


class Capability(msgspec.Struct, frozen=True, gc=False):
    """What a tool call uses: the tool's kind and its name (OP-9, OP-11).

    A receipt holds the pair; a store keeps it as its :attr:`text` (``client:bash``,
    ``provider:web_search``), turned into text when written and back into the pair when read,
    and nowhere else. ``stream_manager`` re-exports it as ``stream_manager.Capability``.

    Attributes:
        kind: How the tool runs.
        name: The tool's name (never empty; it may hold colons, e.g. ``mcp:files:read``).
    """

    kind: ToolKind
    name: str

    @property
    def text(self) -> str:
        """The capability as a receipt stores and shows it: ``kind:name``."""
        return f"{self.kind._value_}:{self.name}"  # ``_value_``: ``.value`` is a slow descriptor


class OperationRecord(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """An operation's durable receipt (OP-11): identifiers, times and outcome only.

    It never holds tool arguments, outputs, credentials or file contents: the target is a
    privacy-minimised digest, and ``explanation`` is the engine's own fixed text.

    Attributes:
        op_id: Stable id derived from the call's position (stream, step, call index).
        session: The session the call ran in.
        stream: The stream whose step made the call.
        call_id: The model's tool-call id.
        capability: The tool's kind and name. A store keeps it as its text (``client:bash``,
            ``provider:web_search``); a stored value of another shape (an unknown kind, no
            name) reads back as a ``CorruptRecord``.
        target: A salted digest of what the call acted on (never the arguments themselves).
        started_at: When the record was written (clock seconds).
        deadline_at: The call's absolute deadline (clock seconds), if it has one.
        state: Where the operation is.
        cancel_requested_at: When cancellation was requested (durable before anything awaits).
        cancel_reason: Why: ``user``, ``deadline``, ``stream-stopped`` or ``shutdown``.
        cancel_acknowledged_at: When the layer acknowledged termination.
        ended_at: When the operation reached its current terminal or indeterminate state (a
            person's resolution leaves it as it was: ``resolved_at`` says when they did).
        termination_acknowledged: The layer confirmed it stopped (or it never started).
        outcome_code: Which kind of ending (OP-12), e.g. ``ok``, ``tool_error``, ``timeout``.
        explanation: A fixed sentence from the engine, e.g. "cancellation requested,
            termination not confirmed".
        resolved_late: An indeterminate state was later resolved by the same layer (OP-8).
        blocked_by: The indeterminate operation that blocked this call (OP-9).
        resolved_by: Who settled an indeterminate operation from outside the tool layer:
            ``"operator"`` (a person, ``turnkeeper resolve``), else ``None``.
        resolved_at: When they settled it (the engine's clock, or the wall clock for the CLI).
        note: What the person said they checked (their own words; redacted when printed).
    """

    op_id: str
    session: str
    stream: str
    call_id: str
    capability: Capability
    target: str
    started_at: float
    deadline_at: float | None = None
    state: OpState = OpState.REQUESTED
    cancel_requested_at: float | None = None
    cancel_reason: str | None = None
    cancel_acknowledged_at: float | None = None
    ended_at: float | None = None
    termination_acknowledged: bool = False
    outcome_code: str | None = None
    explanation: str | None = None
    resolved_late: bool = False
    blocked_by: str | None = None
    resolved_by: str | None = None
    resolved_at: float | None = None
    note: str | None = None


class ReceiptQuery(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What a receipts query found: the valid records, and the ids of rows that failed validation.

    A corrupt row is reported here by id (with the field path) and skipped, never dropped or
    rewritten.
    """

    records: tuple[OperationRecord, ...] = ()
    corrupt: tuple[tuple[str, str], ...] = ()


class HandleStatus(StrEnum):
    """Where a delegated turn stands (B10): running, or settled one of three ways."""

    ACTIVE = "active"
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    ERROR = "error"


class HandleRecord(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A delegated turn's handle (B10): who delegated what to whom, and how it settled.

    A boundary writes the whole record, replacing the one with its ``handle_id``; it may ride
    in any session's boundary (the owner's or the target's: whichever decided it).

    Attributes:
        handle_id: The handle's id, unique in the store.
        owner: The owner session (the one that delegated and waits for the settlement).
        target: The target session (the one whose turn runs under the handle).
        turn_id: The delegated turn: the id of its prompt row in the target's history.
        status: ``active`` until settled, then how it settled.
        deferred: The stream ids (stream-end message ids) the owner deferred on (TD-2).
        reason: Why it settled (``None`` while active).
        report: A completed turn's final report.
        delivered: The settlement reached the owner (its port accepted it); a settled handle
            not yet delivered is retried until it is (R54).
        created_at: When it was delegated, on the engine's clock.
        settled_at: When it settled, on the engine's clock.
    """

    handle_id: str
    owner: str
    target: str
    turn_id: str
    status: HandleStatus = HandleStatus.ACTIVE
    deferred: tuple[str, ...] = ()
    reason: str | None = None
    report: str | None = None
    delivered: bool = False
    created_at: float = 0.0
    settled_at: float | None = None


class HandleQuery(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What ``handles()`` returns: the valid handle records, by id, and the corrupt ones.

    Attributes:
        records: Every handle record that decoded and validated, ordered by ``handle_id``.
        corrupt: ``(handle id, what was wrong, naming the field)`` for each stored record that
            failed validation: reported, never dropped or rewritten.
    """

    records: tuple[HandleRecord, ...] = ()
    corrupt: tuple[tuple[str, str], ...] = ()


#: The largest queued entry a store takes and reads back (an entry holds a person's text).
MAX_QUEUED_BYTES = 4_194_304


class QueuedEntryRecord(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One entry of a session's durable queue (``docs/persistence.md``, "The queue").

    Attributes:
        session: The session whose queue holds it.
        entry_id: The entry's id, unique within the session's queue.
        position: Its place in the queue: entries are read back by ascending position.
        kind: Who produced it (``user``, ``wake``, ``report``, ``system``, ``follow-up``): the
            store reads it to tell user-authored entries from agent-initiated ones without
            decoding the body.
        body: The entry, as msgspec JSON owned by the layer above
            (``message_queue.encode_entry``); the store keeps it byte-exact and never decodes it.
    """

    session: str
    entry_id: str
    position: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)]
    kind: str
    body: bytes


class QueueSnapshot(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A session's whole durable queue, as one boundary leaves it.

    A snapshot replaces the session's queue (every stored entry of the session that is not in
    ``entries`` nor in ``keep`` is deleted) when its ``version`` is above the stored one, and
    does nothing when it is not: the one decided last wins, whatever order the writes land in.

    Attributes:
        version: The session's queue version this snapshot is (at least 1; each queue change
            of a session counts one up).
        entries: Every entry queued after the boundary, in order.
        keep: Ids of stored entries the layer above could not read (damaged): kept as they are,
            for a person to see, never rewritten.
    """

    version: Annotated[int, msgspec.Meta(ge=1, le=MAX_SEQ)]
    entries: tuple[QueuedEntryRecord, ...] = ()
    keep: tuple[str, ...] = ()


class QueueQuery(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What ``queued()`` returns: the durable queue entries, by session then position.

    Attributes:
        records: Every stored entry that validates, by session id, then position.
        versions: ``(session, version)`` for every session that holds a queue version.
        corrupt: ``(session/entry id, what was wrong, naming the field)`` for each stored
            entry that failed validation: reported, never dropped or rewritten.
    """

    records: tuple[QueuedEntryRecord, ...] = ()
    versions: tuple[tuple[str, int], ...] = ()
    corrupt: tuple[tuple[str, str], ...] = ()


class CutStateChange(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A boundary's move of the cut record on one of its session's rows.

    Attributes:
        row_id: The row carrying the cut record (it may be one the same boundary adds).
        state: The record's new state.
    """

    row_id: str
    state: CutState


class PartialChunk(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """B4: parts of a stream's in-progress assistant message, appended to the session's partial.

    ``parts`` are the stream's parts ``start``, ``start + 1`` ... (the stream manager's own
    encoding; the store keeps them byte-exact and never decodes them). A part already stored
    at a position is replaced.
    """

    stream: str
    start: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)]
    parts: tuple[bytes, ...]


class StoredPartial(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The parts a stream left in the session's partial, by position from 0 (PS-2).

    ``parts`` stops before the first missing position (a later part without its predecessor
    says nothing a reader could place); ``gap`` is then the first missing position.
    """

    stream: str
    parts: tuple[bytes, ...]
    gap: int | None = None


class Boundary(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What one durable boundary of one session makes durable, in one transaction.

    Every part is optional; every record must belong to the boundary's session. A store
    applies the parts in this order: ``create``, ``delete``, ``rows``, ``cut_states``,
    ``envelope``, ``operations``, ``handles``, ``queue``, the abandon marker, ``auto_retry``,
    ``drop_partials``, ``partial`` (so a boundary may replace a row by deleting and re-adding
    its id, may move the cut record of a row it adds, may accept a queued entry into history
    and take it off the queue in one transaction, and may commit a stream's partial as a row
    and drop it at once).

    Attributes:
        create: Create the session (idempotent for an identical record).
        rows: History rows to add; a taken (session, row_id) or (session, seq) is refused.
        delete: Ids of rows to delete (ids that do not exist are skipped and not counted).
        cut_states: Cut records to move.
        envelope: A turn envelope to write, replacing the one with its (session, stream).
        operations: Receipts to write, each replacing the one with its op id. They need no
            session record (a stream manager used without a session writes them too).
        handles: Delegated-turn handle records to write, each replacing the one with its
            handle id (B10). They need no session record either.
        queue: The session's whole queue after the boundary (:class:`QueueSnapshot`), applied
            only when its version is above the stored one.
        abandon: The session's startup-abandon marker to store, replacing any (PS-8).
        clear_abandon: Remove the session's startup-abandon marker (with ``abandon``: the
            marker given is stored).
        auto_retry: The session's auto-retry preference (AS-32): ``None`` leaves the stored
            one as it is, ``False`` stores "off", ``True`` removes a stored "off" (back to the
            default, on). Like the abandon marker it needs the session; a boundary of nothing
            else is a write.
        drop_partials: Streams whose partial parts are deleted (B5, B6, PS-2).
        partial: Parts of a stream's in-progress message to store (B4). Like receipts they
            need no session record.
        inbox_taken: Queue entry ids of messages posted to the session's inbox (LS-9,
            ``inbox-<id>``) this boundary accepts into history: taken off the inbox in the
            same transaction. A store without an inbox has nothing to take off.
    """

    create: SessionRecord | None = None
    rows: tuple[HistoryRow, ...] = ()
    delete: tuple[str, ...] = ()
    cut_states: tuple[CutStateChange, ...] = ()
    envelope: TurnEnvelope | None = None
    operations: tuple[OperationRecord, ...] = ()
    handles: tuple[HandleRecord, ...] = ()
    queue: QueueSnapshot | None = None
    abandon: AbandonMarker | None = None
    clear_abandon: bool = False
    auto_retry: bool | None = None
    drop_partials: tuple[str, ...] = ()
    partial: PartialChunk | None = None
    inbox_taken: tuple[str, ...] = ()


#: The queue entry id of a message posted to a session's inbox is this prefix and the inbox
#: row's id (LS-9): a boundary that queues or accepts such an entry takes the row off.
INBOX_ENTRY = "inbox-"


class Committed(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What a committed boundary did that its caller cannot know beforehand.

    Attributes:
        deleted: How many of the boundary's ``delete`` ids named rows that existed (and are
            now deleted).
    """

    deleted: int = 0


#: Where a session's auto-retry preference is kept (AS-32), and the key ``SessionLoad.corrupt``
#: reports a damaged one under.
RETRY_SETTINGS = "retry_settings"


class SessionLoad(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One session as the store holds it, read at once (one call in SQLite).

    Attributes:
        record: The session's record.
        rows: Its history rows, by seq.
        envelopes: Its turn envelopes, in the order they were first written.
        corrupt: ``(row id, what was wrong)`` for each row whose cut record failed validation
            while its ``cut_state`` column says it owes nothing: such a row is in ``rows``
            without its record (``cut`` is ``None``), and the stored record stays as it is;
            and ``(RETRY_SETTINGS, what was wrong)`` for a damaged auto-retry preference
            (read as off, kept as it is).
        queue: Its durable queue entries, by position.
        queue_version: Its queue version (0 when no queue was ever written).
        queue_corrupt: ``(entry id, what was wrong, naming the field)`` for each stored queue
            entry that failed validation: left out of ``queue``, kept in the store.
        abandon: Its startup-abandon marker (PS-8), if one is stored.
        partials: The partial parts its streams left (B4), in the order the streams first
            wrote them.
        auto_retry: Its auto-retry preference (AS-32): ``False`` when "off" is stored, or when
            the stored preference is damaged (read as off: fail safe); ``True`` when nothing
            is stored.
    """

    record: SessionRecord
    rows: tuple[HistoryRow, ...] = ()
    envelopes: tuple[TurnEnvelope, ...] = ()
    corrupt: tuple[tuple[str, str], ...] = ()
    queue: tuple[QueuedEntryRecord, ...] = ()
    queue_version: int = 0
    queue_corrupt: tuple[tuple[str, str], ...] = ()
    abandon: AbandonMarker | None = None
    partials: tuple[StoredPartial, ...] = ()
    auto_retry: bool = True


class SessionList(list[SessionRecord]):
    """What ``sessions()`` returns: the valid session records, by id, and the corrupt rows.

    A list (every valid record, in order) with one more attribute, ``corrupt``: ``(session id,
    what was wrong)`` for each stored session record that failed validation, skipped, never
    dropped or rewritten. A store that holds only typed values (``MemoryStore``) has none.
    """

    corrupt: tuple[tuple[str, str], ...]

    def __init__(
        self, records: Iterable[SessionRecord] = (), corrupt: Iterable[tuple[str, str]] = ()
    ) -> None:
        super().__init__(records)
        self.corrupt = tuple(corrupt)
