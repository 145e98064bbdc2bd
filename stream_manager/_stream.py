"""One registered stream: its state machine and what it has spent.

States (``docs/stream-manager.md``): ``STARTING`` (registered, the envelope write and launch checks
still ahead), ``STREAMING`` (processing; ``stream-start`` emitted), ``STOPPING`` (a hard stop
is tearing it down), then exactly one of ``COMPLETED`` (``stream-end`` emitted), ``ABORTED``
(``stream-abort`` emitted, or withdrawn before processing) or ``ERROR``. One table holds every
legal move; an illegal one raises and changes nothing.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Final

import anyio

from persistence import TurnkeeperError

if TYPE_CHECKING:
    from stream_manager._budget import StepBudget
    from stream_manager._events import AbortReason
    from stream_manager._fallback import ModelFallbackProgress
    from stream_manager._partial import PartialLog
    from stream_manager._parts import ModelUsage, Part


class StreamState(StrEnum):
    """Where a registered stream is in its life."""

    STARTING = "starting"
    STREAMING = "streaming"
    STOPPING = "stopping"
    COMPLETED = "completed"
    ABORTED = "aborted"
    ERROR = "error"


_S = StreamState
TRANSITIONS: Final[frozenset[tuple[StreamState, StreamState]]] = frozenset(
    {
        (_S.STARTING, _S.STREAMING),
        (_S.STARTING, _S.ABORTED),
        (_S.STREAMING, _S.STOPPING),
        (_S.STREAMING, _S.COMPLETED),
        (_S.STREAMING, _S.ERROR),
        (_S.COMPLETED, _S.ERROR),  # its final write failed: the stream ends in error instead
        (_S.STOPPING, _S.ABORTED),
    }
)


class IllegalStreamTransition(TurnkeeperError):
    """A stream was asked to move between states the table does not connect (an engine bug)."""


class ActiveStream:
    """The mutable state of one registered stream (owned by the StreamManager)."""

    __slots__ = (
        "budget",
        "done",
        "hard_reason",
        "id",
        "model",
        "partial",
        "parts",
        "progress",
        "required_in_step",
        "scope",
        "session",
        "soft_reason",
        "state",
        "step_open",
        "unwritten",
        "usage",
    )

    def __init__(
        self,
        *,
        session: str,
        stream_id: str,
        model: str,
        budget: StepBudget,
        progress: ModelFallbackProgress,
    ) -> None:
        self.session = session
        self.id = stream_id
        self.model = model
        self.budget = budget
        self.progress = progress
        self.state = StreamState.STARTING
        self.parts: list[Part] = []
        #: What its steps used, by the model that ran them (SM-14, SM-15, R59).
        self.usage: tuple[ModelUsage, ...] = ()
        #: Its durable partial (B4), when its host writes the row that takes it.
        self.partial: PartialLog | None = None
        #: A soft stop waits for the next text-end / reasoning-end / finish-step (SM-10).
        self.soft_reason: AbortReason | None = None
        #: A hard stop (or the caller's abort) cancels processing with this reason.
        self.hard_reason: AbortReason | None = None
        #: A model step is streaming (its finish has not arrived yet).
        self.step_open = False
        #: The current step produced a successful required-tool result (R46).
        self.required_in_step = False
        #: Why a write the stream needed failed while a stop was landing: told after its abort.
        self.unwritten: str | None = None
        self.scope: anyio.CancelScope | None = None
        self.done = anyio.Event()

    def move(self, to: StreamState) -> None:
        """Take one transition of the table, or raise and change nothing."""
        if (self.state, to) not in TRANSITIONS:
            raise IllegalStreamTransition(f"stream {self.id}: {self.state} -> {to} is not allowed")
        self.state = to

    def close_partial(self) -> None:
        """Its outcome is decided: no receipt write carries its parts any more (B4)."""
        if self.partial is not None:
            self.partial.close()

    @property
    def stopping(self) -> bool:
        """An abort is pending: a soft stop waits for a boundary, or a hard stop runs."""
        return self.soft_reason is not None or self.hard_reason is not None

    def __repr__(self) -> str:
        return (
            f"<ActiveStream {self.id} {self.state} model={self.model} "
            f"spent={self.budget.spent}/{self.budget.ceiling}>"
        )
