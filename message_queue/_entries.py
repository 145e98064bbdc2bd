"""What the queue holds: kinds, modes, metadata, options, cancel tokens and callbacks.

Everything here is plain data or a tiny synchronous object. Nothing awaits, reads a clock or
does I/O; a cancel token's callbacks run synchronously inside ``cancel()``.

Vocabulary:

* an *entry* is one dispatchable unit: one or more batched *messages* (adds) that leave the queue
  together;
* a *withdrawn* entry is one whose cancel token fired. It must not start a turn, but it stays in
  the queue until a drain dequeues it (and cancels it before acceptance) or a removal takes it;
* *user-authored* entries are the visible ones (queue card, restore-to-input); synthetic and
  agent-initiated entries are hidden (MQ-15).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, Literal, TypeVar

import msgspec

from message_queue.errors import InvalidEntry

R = TypeVar("R")


class EntryKind(StrEnum):
    """Who produced an entry; ``queued.kind`` in ``docs/trace.md``."""

    #: A message the user typed.
    USER = "user"
    #: A background-task wake: synthetic, agent-initiated, sealed, ``tool-end``, cancelable.
    WAKE = "wake"
    #: A delegated turn's report to its owner.
    REPORT = "report"
    #: An engine- or host-generated system message (heartbeat, notice).
    SYSTEM = "system"
    #: A compaction follow-up.
    FOLLOW_UP = "follow-up"


class DispatchMode(StrEnum):
    """When a queued entry wants to run (MQ-6)."""

    #: At the next tool boundary: its presence stops the model loop after the step's results.
    TOOL_END = "tool-end"
    #: After the running stream ends on its own.
    TURN_END = "turn-end"


class MetadataType(StrEnum):
    """The kinds of message metadata the queue treats specially (MQ-3, MQ-4)."""

    PLAIN = "plain"
    COMPACTION_REQUEST = "compaction-request"
    AGENT_SKILL = "agent-skill"
    WORKSPACE_TURN = "workspace-turn"


GoalPolicy = Literal["pause", "continue"]


def parse_kind(value: EntryKind | str) -> EntryKind:
    """Return ``value`` as an :class:`EntryKind`, or raise :class:`InvalidEntry` naming it."""
    try:
        return EntryKind(value)
    except ValueError:
        allowed = ", ".join(k.value for k in EntryKind)
        raise InvalidEntry(f"unknown entry kind {value!r} (expected one of: {allowed})") from None


def parse_mode(value: DispatchMode | str) -> DispatchMode:
    """Return ``value`` as a :class:`DispatchMode`, or raise :class:`InvalidEntry` naming it."""
    try:
        return DispatchMode(value)
    except ValueError:
        allowed = ", ".join(m.value for m in DispatchMode)
        raise InvalidEntry(
            f"unknown dispatch mode {value!r} (expected one of: {allowed})"
        ) from None


class Correlation(msgspec.Struct, frozen=True, kw_only=True):
    """The delegated-turn correlation a stream or entry carries."""

    handle_id: str
    owner_session: str
    turn_id: str


class Attachment(msgspec.Struct, frozen=True, kw_only=True):
    """A file part sent with a message."""

    media_type: str
    url: str
    filename: str | None = None


class MessageMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """Metadata of one add; the first metadata of an entry wins (MQ-5)."""

    type: MetadataType = MetadataType.PLAIN
    #: Required for ``workspace-turn`` metadata: the delegated turn this message belongs to.
    correlation: Correlation | None = None
    #: Snapshot references (prompt or skill snapshots); any seals the entry (MQ-3).
    snapshot_refs: tuple[str, ...] = ()


class SendOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Send options of one add; the latest options of an entry win (MQ-5).

    The dispatch mode is deliberately not an option: it is the add's own argument and never
    leaves the queue (MQ-14).
    """

    model: str | None = None
    thinking_level: str | None = None
    agent_id: str | None = None
    #: A goal-intervention policy; ``pause`` is sticky inside an entry (MQ-5).
    goal_policy: GoalPolicy | None = None
    #: Host-specific options the queue carries without reading.
    extra: Mapping[str, object] = msgspec.field(default_factory=dict)


class SendFailure(msgspec.Struct, frozen=True, kw_only=True):
    """Why an accepted entry failed before its stream started."""

    type: str
    message: str


OnAccepted = Callable[[], None]
OnAcceptedPreStreamFailure = Callable[[SendFailure], None]
OnCanceled = Callable[[str], None]


@dataclass(slots=True)
class CancelState:
    """State shared by an entry's producer and its dispatcher.

    The dispatcher sets ``canceled_before_acceptance`` when it cancels a dequeued entry whose
    token fired before the point of no return (AS-3), so the producer can tell that nothing of
    its message was accepted.
    """

    canceled_before_acceptance: bool = False


class OneShot(Generic[R]):
    """A signal fired once, with a reason; the first fire wins.

    Listeners run synchronously, in the order they were added, inside :meth:`fire`. It is
    the mechanism of an entry's :class:`CancelToken` (a free-text reason) and of a launch's
    ``stream_manager.AbortSignal`` (``OneShot[AbortReason]``).
    """

    __slots__ = ("_listeners", "_reason")

    def __init__(self) -> None:
        self._reason: R | None = None
        self._listeners: list[Callable[[R], None]] = []

    @property
    def fired(self) -> bool:
        """Whether the signal has fired."""
        return self._reason is not None

    @property
    def reason(self) -> R | None:
        """The reason it fired with, or ``None`` while it has not."""
        return self._reason

    def fire(self, reason: R) -> bool:
        """Fire the signal with ``reason`` (a later fire changes nothing).

        Returns:
            ``True`` when this call fired it, ``False`` when it had already fired.
        """
        if self._reason is not None:
            return False
        self._reason = reason
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener(reason)
        return True

    def add_listener(self, listener: Callable[[R], None]) -> None:
        """Call ``listener(reason)`` when the signal fires (at once if it already has)."""
        if self._reason is not None:
            listener(self._reason)
        else:
            self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[R], None]) -> None:
        """Forget ``listener`` (no error when it was never added or already ran)."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def __repr__(self) -> str:
        state = f"fired {self._reason!s}" if self._reason is not None else "live"
        return f"<{type(self).__name__} {state}>"


class CancelToken(OneShot[str]):
    """A cancel signal any producer of an entry may fire, once.

    Firing it *withdraws* the entry: every cancel-aware reader looks past it (MQ-7) while it
    stays in the queue for a drain or removal to cancel.
    """

    __slots__ = ()

    DEFAULT_REASON = "withdrawn"

    @property
    def cancelled(self) -> bool:
        """Whether the token has fired."""
        return self._reason is not None

    def cancel(self, reason: str = DEFAULT_REASON) -> bool:
        """Fire the token with ``reason`` (why the producer withdrew its entry).

        Returns:
            ``True`` when this call fired it, ``False`` when it had already fired.
        """
        return self.fire(reason)


class EntryCallbacks(msgspec.Struct, frozen=True):
    """The callbacks of an entry, as a removal or dequeue hands them back."""

    entry_id: str
    on_accepted: OnAccepted | None = None
    on_accepted_pre_stream_failure: OnAcceptedPreStreamFailure | None = None
    on_canceled: OnCanceled | None = None

    @property
    def has_cancellation(self) -> bool:
        """Whether a removal has anything to tell this entry's producer."""
        return self.on_canceled is not None or self.on_accepted_pre_stream_failure is not None

    def notify_canceled(self, reason: str) -> None:
        """Tell the producer its entry left without running (AS-16).

        ``on_canceled(reason)`` when present, else ``on_accepted_pre_stream_failure`` with an
        ``unknown`` failure carrying the reason; exactly one of them runs.
        """
        if self.on_canceled is not None:
            self.on_canceled(reason)
        elif self.on_accepted_pre_stream_failure is not None:
            self.on_accepted_pre_stream_failure(SendFailure(type="unknown", message=reason))


def notify_all_canceled(removed: list[EntryCallbacks], reason: str) -> list[tuple[str, Exception]]:
    """Run each removed entry's cancellation in order; a failing callback stops none of the rest.

    Returns:
        ``(entry_id, error)`` for every callback that raised, for the caller to log.
    """
    errors: list[tuple[str, Exception]] = []
    for callbacks in removed:
        try:
            callbacks.notify_canceled(reason)
        except Exception as error:  # a producer's bug must not stop the other notifications
            errors.append((callbacks.entry_id, error))
    return errors
