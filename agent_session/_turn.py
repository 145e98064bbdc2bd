"""Plain values a turn carries through the session: its input and its stream context."""

from __future__ import annotations

import msgspec

from message_queue import (
    Attachment,
    CancelState,
    CancelToken,
    Correlation,
    Dequeued,
    EntryCallbacks,
    EntryKind,
    SendFailure,
    SendOptions,
)
from stream_manager import ModelFallbackProgress, StartCause


class TurnInput(msgspec.Struct, frozen=True, kw_only=True):
    """One message about to go through the send pipeline (a direct send or a drained entry)."""

    text: str
    kind: EntryKind = EntryKind.USER
    entry_id: str | None = None
    attachments: tuple[Attachment, ...] = ()
    options: SendOptions | None = None
    correlation: Correlation | None = None
    callbacks: EntryCallbacks | None = None
    cancel_token: CancelToken | None = None
    cancel_state: CancelState | None = None
    cause: StartCause = StartCause.SEND
    #: The message came off the queue (the drain already claimed PREPARING).
    dispatched: bool = False

    @classmethod
    def from_dequeued(cls, entry: Dequeued) -> TurnInput:
        """The pipeline input of a drained queue entry."""
        return cls(
            text=entry.text,
            kind=entry.kind,
            entry_id=entry.entry_id,
            attachments=entry.attachments or (),
            options=entry.options,
            correlation=entry.metadata.correlation if entry.metadata else None,
            callbacks=entry.callbacks,
            cancel_token=entry.cancel_token,
            cancel_state=entry.cancel_state,
            cause=StartCause.QUEUE,
            dispatched=True,
        )

    def canceled(self) -> bool:
        """Whether the producer has withdrawn it (AS-3); it can change across any await."""
        return self.cancel_token is not None and self.cancel_token.cancelled


class StreamContext(msgspec.Struct, frozen=True, kw_only=True):
    """What the session knows about the stream it is launching or running."""

    model: str
    cause: StartCause
    options: SendOptions = msgspec.field(default_factory=SendOptions)
    step_budget: int | None = None
    progress: ModelFallbackProgress | None = None
    correlation: Correlation | None = None
    thinking_level: str | None = None
    extra_system_context: str | None = None
    agent_initiated: bool = False
    #: For a resume: the cut it continues and the attempt number.
    resume_of: tuple[str, int] | None = None


class Accepted(msgspec.Struct, frozen=True):
    """The send crossed acceptance and its turn ran (to an end, abort, error or refusal)."""


class CanceledBeforeAcceptance(msgspec.Struct, frozen=True):
    """AS-3: the producer withdrew the message before the point of no return."""

    reason: str


class SendRefused(msgspec.Struct, frozen=True):
    """The send failed before acceptance (validation, the pre-stream gate, a store failure)."""

    failure: SendFailure


PipelineResult = Accepted | CanceledBeforeAcceptance | SendRefused
