"""What the queue keeps per entry, and how an add is validated and classified (MQ-1 to MQ-5).

Internal to ``message_queue``: ``_queue.MessageQueue`` owns the entries; callers see snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from message_queue._entries import (
    Attachment,
    CancelState,
    CancelToken,
    Correlation,
    DispatchMode,
    EntryCallbacks,
    EntryKind,
    MessageMetadata,
    MetadataType,
    OnAccepted,
    OnAcceptedPreStreamFailure,
    OnCanceled,
    SendOptions,
    parse_kind,
    parse_mode,
)
from message_queue._views import EntrySnapshot, NewMessage
from message_queue.errors import InvalidEntry

# (synthetic, agent_initiated) when the add does not say.
_AUTHORSHIP_DEFAULTS: dict[EntryKind, tuple[bool, bool]] = {
    EntryKind.USER: (False, False),
    EntryKind.WAKE: (True, True),
    EntryKind.REPORT: (True, True),
    EntryKind.SYSTEM: (True, False),
    EntryKind.FOLLOW_UP: (True, False),
}

# Metadata that seals the entry it starts (MQ-3).
_SEALING_METADATA = frozenset({MetadataType.AGENT_SKILL, MetadataType.WORKSPACE_TURN})


@dataclass(slots=True)
class StoredMessage:
    id: str
    text: str
    attachments: tuple[Attachment, ...]
    dedupe_key: str | None
    synthetic: bool
    agent_initiated: bool


@dataclass(slots=True, eq=False)
class Entry:
    id: str
    kind: EntryKind
    mode: DispatchMode
    sealed: bool
    user_authored: bool
    continuation: bool
    metadata: MessageMetadata | None
    options: SendOptions | None
    goal_pause: bool
    on_accepted: OnAccepted | None
    on_pre_stream_failure: OnAcceptedPreStreamFailure | None
    on_canceled: OnCanceled | None
    token: CancelToken | None
    cancel_state: CancelState | None
    messages: list[StoredMessage] = field(default_factory=list)

    @property
    def withdrawn(self) -> bool:
        return self.token is not None and self.token.cancelled

    @property
    def correlation(self) -> Correlation | None:
        return self.metadata.correlation if self.metadata is not None else None

    def callbacks(self) -> EntryCallbacks:
        return EntryCallbacks(
            entry_id=self.id,
            on_accepted=self.on_accepted,
            on_accepted_pre_stream_failure=self.on_pre_stream_failure,
            on_canceled=self.on_canceled,
        )

    def snapshot(self) -> EntrySnapshot:
        messages = self.messages
        return EntrySnapshot(
            id=self.id,
            kind=self.kind,
            mode=self.mode,
            sealed=self.sealed,
            user_authored=self.user_authored,
            workspace_turn_continuation=self.continuation,
            withdrawn=self.withdrawn,
            texts=tuple(m.text for m in messages),
            dedupe_keys=tuple(m.dedupe_key for m in messages if m.dedupe_key is not None),
            attachments=tuple(a for m in messages for a in m.attachments),
            metadata=self.metadata,
            options=self.options,
            adds=len(messages),
            has_on_canceled=self.on_canceled is not None,
            has_on_accepted_pre_stream_failure=self.on_pre_stream_failure is not None,
        )


@dataclass(frozen=True, slots=True)
class Add:
    """A validated add: parsed kind and mode, resolved authorship, decided sealing."""

    message: NewMessage
    kind: EntryKind
    mode: DispatchMode
    synthetic: bool
    agent_initiated: bool
    sealed: bool
    starts_entry: bool

    @property
    def user_authored(self) -> bool:
        return not (self.synthetic or self.agent_initiated)


def must_seal(message: NewMessage, kind: EntryKind, removable_key: bool) -> bool:
    """MQ-3: the add starts a sealed entry that never absorbs later adds."""
    metadata = message.metadata
    return (
        message.sealed
        or kind is EntryKind.WAKE
        or removable_key
        or (metadata is not None and metadata.type in _SEALING_METADATA)
        or (metadata is not None and bool(metadata.snapshot_refs))
        or message.on_accepted is not None
        or message.on_accepted_pre_stream_failure is not None
        or message.on_canceled is not None
        or message.cancel_token is not None
    )


def validate(message: NewMessage, removable_key: bool) -> Add:
    kind = parse_kind(message.kind)
    mode = parse_mode(message.mode)
    metadata = message.metadata
    if metadata is not None:
        if metadata.type is MetadataType.WORKSPACE_TURN and metadata.correlation is None:
            raise InvalidEntry("workspace-turn metadata needs a correlation (handle, owner, turn)")
        if metadata.type is not MetadataType.WORKSPACE_TURN and metadata.correlation is not None:
            raise InvalidEntry(f"a correlation needs workspace-turn metadata, not {metadata.type}")
    default_synthetic, default_agent = _AUTHORSHIP_DEFAULTS[kind]
    synthetic = default_synthetic if message.synthetic is None else message.synthetic
    agent = default_agent if message.agent_initiated is None else message.agent_initiated
    sealed = must_seal(message, kind, removable_key)
    compaction = metadata is not None and metadata.type is MetadataType.COMPACTION_REQUEST
    return Add(message, kind, mode, synthetic, agent, sealed, starts_entry=sealed or compaction)
