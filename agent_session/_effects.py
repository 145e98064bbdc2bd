"""What the turn machine asks its shell to do: the effects, performed in order.

The machine (``_machine``) decides and returns these; the session shell (``_session``) performs
them one after the other and feeds what comes back (a :class:`Commit`'s ``then`` or ``failed``
input, a :class:`Next` follow-up) to the machine as its next input. Effects are plain frozen
values holding no closures (msgspec Structs: a turn makes dozens of them, and a Struct is made
four times faster than a frozen dataclass), so an effect list prints and compares: a test can
read what the machine decided without an event loop, a store or a stream.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

import msgspec

from agent_session._continuation import Marker
from agent_session._delegation import ChildEvent
from agent_session._events import EngineEvent
from agent_session._inputs import Input, WriteFailure
from agent_session._turn import TurnInput
from message_queue import CancelToken, EntryCallbacks
from persistence import Boundary
from stream_manager import AbortReason, ChatMessage, Persisted


class Emit(msgspec.Struct, frozen=True):
    """Tell the engine's observers ``event``: decided, and durable when it says so."""

    event: EngineEvent


class Commit(msgspec.Struct, frozen=True):
    """Make ``boundary`` durable in one transaction; then report, tell and go on.

    The shell's one writer commits it and, once ``COMMIT`` returned, emits ``tell`` in order
    (decided, durable, told: a ``persisted`` report among them) and gives the machine
    ``then``. When nothing of it was written (a failed write is a result like any other) it
    gives the machine ``failed`` with the error filled in, and tells nothing. ``exact``: a
    delete that took fewer rows than it names counts as failed.

    Awaited where it stands: the effects after it run once it is settled. From a synchronous
    host call (nothing to await) it runs in a task and the effects after it run at once.
    """

    boundary: Boundary
    tell: tuple[EngineEvent | Persisted, ...] = ()
    then: Input | None = None
    failed: WriteFailure | None = None
    #: What the boundary is, for the log line of a failed write.
    what: str = "boundary"
    exact: bool = False


class Next(msgspec.Struct, frozen=True):
    """Give the machine ``input`` once the effects before this one are done.

    A rule that tells something and then goes on splits there: the rest of its decision is
    this input, handled where it stands in the effect list.
    """

    input: Input


class Reply(msgspec.Struct, frozen=True):
    """The machine's answer to the call or adapter that gave it this decision's input."""

    value: object


class ScheduleSweep(msgspec.Struct, frozen=True):
    """AS-2: run the idle sweep once the current handler's synchronous work is done."""


class BackOff(msgspec.Struct, frozen=True):
    """PS-3, AS-32: wait ``delay_s`` on the engine's clock, then ``BackOffOver(generation)``.

    The machine ignores the end of a backoff that is no longer its latest (``generation``).
    """

    delay_s: float
    generation: int = 0


class RunCompaction(msgspec.Struct, frozen=True):
    """AS-36: one compaction request on ``model``: the history and ``prompt``, its text back.

    The shell answers ``Summarized`` (the text) or ``CompactionFailed``.
    """

    stream: str
    model: str
    prompt: str
    #: What the failed stream said that no row holds yet (its leftover, PS-2), after history.
    tail: tuple[ChatMessage, ...] = ()


class StopStream(msgspec.Struct, frozen=True):
    """Ask the session's stream (or its launch) to stop."""

    reason: AbortReason
    soft: bool = False


class AbortPrepared(msgspec.Struct, frozen=True):
    """Fire the abort signal of the turn being prepared (if one is)."""

    reason: AbortReason


class AbortResume(msgspec.Struct, frozen=True):
    """Fire the abort signal of the resume in flight: its continuation ended.

    ``reason``: why (a user Stop's ``user``; ``system`` for every other ending).
    """

    reason: AbortReason = AbortReason.SYSTEM


class Dispatch(msgspec.Struct, frozen=True):
    """AS-13: run the send pipeline for the dequeued entry ``turn``."""

    turn: TurnInput
    token: CancelToken | None


class StartResume(msgspec.Struct, frozen=True):
    """ST-8: resume the cut ``marker`` (attempt ``attempt``); PREPARING is already claimed."""

    marker: Marker
    attempt: int


class TellOwner(msgspec.Struct, frozen=True):
    """Tell the owner of a delegated turn what a stream of this session did (TD-1 to TD-11).

    Performed as a call-out: the owner may claim (ST-15) from inside it; what that decides
    waits in the inbox, its answer does not.
    """

    child: ChildEvent


class CancelRemoved(msgspec.Struct, frozen=True):
    """R32: run the cancellation callbacks of entries removed from the queue."""

    removed: tuple[EntryCallbacks, ...]
    reason: str


Effect = (
    Emit
    | Commit
    | Next
    | Reply
    | ScheduleSweep
    | BackOff
    | RunCompaction
    | StopStream
    | AbortPrepared
    | AbortResume
    | Dispatch
    | StartResume
    | CancelRemoved
    | TellOwner
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

    def __call__(
        self, effects: list[Effect], then: Successors | None = None, /
    ) -> Awaitable[object]:
        """Perform ``effects``; return the machine's last ``Reply`` (``None`` without one)."""
        ...
