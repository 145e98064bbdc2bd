"""Small builders for queue tests: a background wake ``W``, a user message, a report ``R(C)``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from message_queue import (
    Attachment,
    CancelToken,
    Correlation,
    DispatchMode,
    EntryKind,
    MessageMetadata,
    MessageQueue,
    MetadataType,
    NewMessage,
    Queued,
    SendFailure,
    SendOptions,
)

if TYPE_CHECKING:
    from collections.abc import Callable

C = Correlation(handle_id="h1", owner_session="ow", turn_id="t1")
C2 = Correlation(handle_id="h2", owner_session="ow", turn_id="t2")


@dataclass
class Log:
    """Records every callback call, in order, as (entry, callback, argument)."""

    calls: list[tuple[str, str, str]] = field(default_factory=list)

    def canceled(self, name: str) -> Callable[[str], None]:
        def on_canceled(reason: str) -> None:
            self.calls.append((name, "on_canceled", reason))

        return on_canceled

    def failed(self, name: str) -> Callable[[SendFailure], None]:
        def on_failure(failure: SendFailure) -> None:
            self.calls.append((name, "on_accepted_pre_stream_failure", failure.message))

        return on_failure


def user(
    text: str,
    *,
    mode: DispatchMode = DispatchMode.TOOL_END,
    id: str | None = None,
    options: SendOptions | None = None,
    metadata: MessageMetadata | None = None,
    attachments: tuple[Attachment, ...] = (),
) -> NewMessage:
    return NewMessage(
        text=text,
        kind=EntryKind.USER,
        mode=mode,
        id=id,
        options=options,
        metadata=metadata,
        attachments=attachments,
    )


def wake(name: str, token: CancelToken | None = None, log: Log | None = None) -> NewMessage:
    return NewMessage(
        text=f"wake {name}",
        id=name,
        kind=EntryKind.WAKE,
        mode=DispatchMode.TOOL_END,
        cancel_token=token or CancelToken(),
        on_canceled=log.canceled(name) if log else None,
    )


def report(
    name: str, correlation: Correlation = C, log: Log | None = None, continuation: bool = True
) -> NewMessage:
    return NewMessage(
        text=f"report {name}",
        id=name,
        kind=EntryKind.REPORT,
        metadata=MessageMetadata(type=MetadataType.WORKSPACE_TURN, correlation=correlation),
        workspace_turn_continuation=continuation,
        on_canceled=log.canceled(name) if log else None,
        on_accepted_pre_stream_failure=log.failed(name) if log else None,
    )


def queued(queue: MessageQueue, message: NewMessage) -> Queued:
    outcome = queue.add(message)
    assert isinstance(outcome, Queued), outcome
    return outcome
