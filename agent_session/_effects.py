"""What the turn machine asks its shell to do: the effects, performed in order.

The machine (``_machine``) decides and returns these; the session shell (``_session``) performs
them one after the other and feeds what comes back (a committed row, the end of a flush) to the
machine as its next input (:class:`Feed`). Effects are plain frozen values (msgspec Structs: a
turn makes dozens of them, and a Struct is made four times faster than a frozen dataclass): a
test can read what the machine decided without an event loop, a store or a stream.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

import msgspec

from agent_session._continuation import Marker
from agent_session._events import EngineEvent
from agent_session._turn import TurnInput
from message_queue import CancelToken, EntryCallbacks
from persistence import HistoryRow
from stream_manager import AbortReason


class Emit(msgspec.Struct, frozen=True):
    """Tell the engine's observers ``event``: decided, and durable when it says so."""

    event: EngineEvent


class Flush(msgspec.Struct, frozen=True):
    """Make every queued cut-record change durable, in order, telling each after its commit.

    Awaited where it stands: the effects after it run once the changes are durable. From a
    synchronous host call (nothing to await) it and everything after it run in a task.
    """


class CommitRows(msgspec.Struct, frozen=True):
    """Append ``rows`` in one write, report it as ``persisted`` ``what``, then feed ``then``.

    ``then`` is the machine's next input: ``None`` when the rows are durable, else the failed
    write's message (nothing of it was written; a failed write is a result like any other).
    """

    rows: tuple[HistoryRow, ...]
    what: str
    then: Callable[[str | None], list[Effect]]


class Feed(msgspec.Struct, frozen=True):
    """Give the machine its next input once the effects before this one are done.

    ``step`` is the machine's continuation of the decision it split at an await (a commit, a
    flush); it returns the effects to perform next.
    """

    step: Callable[[], list[Effect]]


class ScheduleSweep(msgspec.Struct, frozen=True):
    """AS-2: run the idle sweep once the current handler's synchronous work is done."""


class StopStream(msgspec.Struct, frozen=True):
    """Ask the session's stream (or its launch) to stop."""

    reason: AbortReason
    soft: bool = False


class AbortPrepared(msgspec.Struct, frozen=True):
    """Fire the abort signal of the turn being prepared (if one is)."""

    reason: AbortReason


class AbortResume(msgspec.Struct, frozen=True):
    """Fire the abort signal of the resume in flight: its continuation ended."""


class Dispatch(msgspec.Struct, frozen=True):
    """AS-13: run the send pipeline for the dequeued entry ``turn``."""

    turn: TurnInput
    token: CancelToken | None


class StartResume(msgspec.Struct, frozen=True):
    """ST-8: resume the cut ``marker`` (attempt ``attempt``); PREPARING is already claimed."""

    marker: Marker
    attempt: int


class CancelRemoved(msgspec.Struct, frozen=True):
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


#: The work a task leaves to run after it (see :data:`Work`).
Successors = list["Work"]

#: What a session task runs. It is given its *successors*: work that the task's last effects
#: start (the next queued send, the sweep) goes there and runs after it, in the same task
#: (``AgentSession._task``), in the order a task of its own would have started it.
Work = Callable[[Successors], Coroutine[Any, Any, None]]


class Perform(Protocol):
    """The shell's effect performer: ``effects`` in order.

    Given ``then`` (the running task's successors, at the task's end only), what the effects
    start is left there instead of in a task of its own.
    """

    def __call__(self, effects: list[Effect], then: Successors | None = None, /) -> Awaitable[None]:
        """Perform ``effects``."""
        ...
