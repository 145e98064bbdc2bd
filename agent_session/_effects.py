"""What the turn machine asks its shell to do: the effects, performed in order.

The machine (``_machine``) decides and returns these; the session shell (``_session``) performs
them one after the other and feeds what comes back (a committed row, the end of a flush) to the
machine as its next input (:class:`Feed`). Effects are plain frozen values: a test can read
what the machine decided without an event loop, a store or a stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from agent_session._continuation import Marker
    from agent_session._events import EngineEvent
    from agent_session._turn import TurnInput
    from message_queue import CancelToken, EntryCallbacks
    from persistence import HistoryRow
    from stream_manager import AbortReason


@dataclass(frozen=True, slots=True)
class Emit:
    """Tell the engine's observers ``event``: decided, and durable when it says so."""

    event: EngineEvent


@dataclass(frozen=True, slots=True)
class Flush:
    """Make every queued cut-record change durable, in order, telling each after its commit.

    Awaited where it stands: the effects after it run once the changes are durable. From a
    synchronous host call (nothing to await) it and everything after it run in a task.
    """


@dataclass(frozen=True, slots=True)
class CommitRows:
    """Append ``rows`` in one write, then report it as ``persisted`` ``what``."""

    rows: tuple[HistoryRow, ...]
    what: str


@dataclass(frozen=True, slots=True)
class Feed:
    """Give the machine its next input once the effects before this one are done.

    ``step`` is the machine's continuation of the decision it split at an await (a commit, a
    flush); it returns the effects to perform next.
    """

    step: Callable[[], list[Effect]]


@dataclass(frozen=True, slots=True)
class ScheduleSweep:
    """AS-2: run the idle sweep once the current handler's synchronous work is done."""


@dataclass(frozen=True, slots=True)
class StopStream:
    """Ask the session's stream (or its launch) to stop."""

    reason: AbortReason
    soft: bool = False


@dataclass(frozen=True, slots=True)
class AbortPrepared:
    """Fire the abort signal of the turn being prepared (if one is)."""

    reason: AbortReason


@dataclass(frozen=True, slots=True)
class AbortResume:
    """Fire the abort signal of the resume in flight: its continuation ended."""


@dataclass(frozen=True, slots=True)
class Dispatch:
    """AS-13: run the send pipeline for the dequeued entry ``turn``."""

    turn: TurnInput
    token: CancelToken | None


@dataclass(frozen=True, slots=True)
class StartResume:
    """ST-8: resume the cut ``marker`` (attempt ``attempt``); PREPARING is already claimed."""

    marker: Marker
    attempt: int


@dataclass(frozen=True, slots=True)
class CancelRemoved:
    """R32: run the cancellation callbacks of entries removed from the queue."""

    removed: tuple[EntryCallbacks, ...]
    reason: str


Effect = (
    Emit
    | Flush
    | CommitRows
    | Feed
    | ScheduleSweep
    | StopStream
    | AbortPrepared
    | AbortResume
    | Dispatch
    | StartResume
    | CancelRemoved
)
