"""The session's turn phase: one enum, one table, one function that raises (AS-1, AS-2).

``IDLE``: nothing runs. ``PREPARING``: a send, a drained entry or a resume has claimed the turn
and is doing pre-stream work (validation, persistence, history, request, registration).
``STREAMING``: a stream emitted ``stream-start``. ``COMPLETING``: the session is processing a
stream's end, abort or error; a new turn may start from here and takes ownership.
``DISPOSED``: torn down; nothing leaves it. ``BROKEN``: an internal error (an engine bug: an
illegal move halfway through a decision) stopped the session; it refuses every input but
disposal (:class:`BrokenSession`), and the host reopens it from the store
(``Engine.reopen_session``). Any phase may break; that move is not a rule of this table.

Every move to ``IDLE`` schedules the stranded-turn sweep (AS-2); that is the session shell's
job, not this table's.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from persistence import TurnkeeperError


class Phase(StrEnum):
    """Where a session's turn is (the ``phase`` event of ``docs/trace.md``)."""

    IDLE = "idle"
    PREPARING = "preparing"
    STREAMING = "streaming"
    COMPLETING = "completing"
    DISPOSED = "disposed"
    BROKEN = "broken"


_P = Phase
TRANSITIONS: Final[frozenset[tuple[Phase, Phase]]] = frozenset(
    {
        (_P.IDLE, _P.PREPARING),
        (_P.IDLE, _P.DISPOSED),
        (_P.PREPARING, _P.STREAMING),
        (_P.PREPARING, _P.COMPLETING),  # a pre-stream failure routed to the stream-error path
        (_P.PREPARING, _P.IDLE),
        (_P.PREPARING, _P.DISPOSED),
        (_P.STREAMING, _P.COMPLETING),
        (_P.STREAMING, _P.DISPOSED),
        (_P.COMPLETING, _P.IDLE),
        (_P.COMPLETING, _P.PREPARING),  # a drained entry or follow-up takes the turn over
        (_P.COMPLETING, _P.DISPOSED),
        (_P.BROKEN, _P.DISPOSED),  # a broken session is disposed, then reopened from the store
    }
)


class IllegalTransition(TurnkeeperError):
    """A phase move the table does not allow (an engine bug, or a call in the wrong state)."""

    def __init__(self, session: str, current: Phase, to: Phase) -> None:
        super().__init__(f"session {session}: phase {current} -> {to} is not allowed")
        self.session = session
        self.current = current
        self.to = to


class BrokenSession(TurnkeeperError):
    """The session broke on an internal error; it takes no input but disposal.

    ``Engine.reopen_session`` disposes it and opens it again from what the store holds.
    """

    def __init__(self, session: str, why: str) -> None:
        super().__init__(
            f"session {session} is broken ({why}); reopen it from the store (Engine.reopen_session)"
        )
        self.session = session
        self.why = why


def next_phase(session: str, current: Phase, to: Phase) -> Phase:
    """Return ``to`` when the table allows ``current -> to``; raise and change nothing if not."""
    if (current, to) not in TRANSITIONS:
        raise IllegalTransition(session, current, to)
    return to
