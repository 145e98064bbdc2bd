"""One view of a session: what it is doing, read in one place (``AgentSession.statistics``).

A :class:`SessionStatistics` is built on demand from the turn machine and the session shell
(nothing is stored). ``wait_idle``, ``describe()``, the machine's ``repr`` and tests read it;
its two predicates are the only definitions of ``busy`` and ``settled``.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from agent_session._phases import Phase


def turn_claimed(phase: Phase, preflight: int) -> bool:
    """``busy``: a turn is claimed (any phase but IDLE) or a manual send is in preflight."""
    return phase is not Phase.IDLE or preflight > 0


def nothing_running(phase: Phase, tasks: int, sweep_scheduled: bool, writing: int) -> bool:
    """``settled``: no turn, no task, no sweep scheduled, no write in flight.

    A broken session is settled too: nothing more runs by itself (it takes only disposal).
    """
    return (
        (phase is Phase.IDLE or phase is Phase.DISPOSED or phase is Phase.BROKEN)
        and tasks == 0
        and not sweep_scheduled
        and writing == 0
    )


class SessionStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of one session; every field but the first two defaults to "none"."""

    session: str
    phase: Phase
    #: The owed continuation's cut (its stream id), or ``None`` when nothing is owed.
    owed: str | None = None
    #: The steps the owed continuation has left (ST-12).
    owed_steps: int | None = None
    #: The live queued entries' ids, head first (withdrawn ones are counted apart).
    queued: tuple[str, ...] = ()
    #: Withdrawn entries still held; a drain cancels them (MQ-7, MQ-8).
    withdrawn: int = 0
    #: Manual sends in preflight: not yet claimed PREPARING (R3).
    preflight: int = 0
    #: The entry dequeued and not yet accepted, cancelled or failed (AS-3).
    dispatching: str | None = None
    #: A queued-message soft stop was requested and has not landed (AS-27).
    soft_stop: bool = False
    #: Tool calls of the session's stream running now.
    tools: int = 0
    #: The idle sweep is scheduled and has not run (AS-2).
    sweep_scheduled: bool = False
    #: Record changes decided and not yet handed to a write (a failed one waits for the sweep).
    pending_writes: int = 0
    #: The session's tasks running or scheduled (and holds: startup recovery's).
    tasks: int = 0
    #: Commits of this session in flight.
    writing: int = 0
    disposed: bool = False

    @property
    def busy(self) -> bool:
        """A turn is claimed or a manual send is in preflight: a ``send`` now queues (AS-12)."""
        return turn_claimed(self.phase, self.preflight)

    @property
    def settled(self) -> bool:
        """Nothing running, scheduled or being written: what ``wait_idle`` waits for."""
        return nothing_running(self.phase, self.tasks, self.sweep_scheduled, self.writing)

    def line(self, kind: str, extra: Iterable[str] = ()) -> str:
        """One line: ``<kind id phase flag ...>``, only the flags that are set, in this order."""
        flags = [
            text
            for on, text in (
                (self.owed is not None, f"owed={self.owed}({self.owed_steps})"),
                (bool(self.queued), f"queue={len(self.queued)}"),
                (self.withdrawn > 0, f"withdrawn={self.withdrawn}"),
                (self.preflight > 0, f"preflight={self.preflight}"),
                (self.dispatching is not None, f"dispatching={self.dispatching}"),
                (self.soft_stop, "soft-stop"),
                (self.tools > 0, f"tools={self.tools}"),
                (self.sweep_scheduled, "sweep"),
                (self.pending_writes > 0, f"pending={self.pending_writes}"),
                (self.tasks > 0, f"tasks={self.tasks}"),
                (self.writing > 0, f"writing={self.writing}"),
                (self.disposed and self.phase is not Phase.DISPOSED, "disposed"),
            )
            if on
        ]
        return " ".join([f"<{kind} {self.session} {self.phase}", *flags, *extra]) + ">"
