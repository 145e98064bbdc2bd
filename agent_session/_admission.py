"""Admission of internal continuations: the goal, the workspace and the delegated handle.

A resume is the engine continuing a turn on its own, so before it launches it asks again
whether the turn may still run (ST-8, R8, R12, R41): the goal it is attributed to still
admits work (``active``), its workspace is usable (``ok``; the stop epoch is captured) and,
for a delegated turn, its handle is still active for this session and turn. Then the one
combined probe (goal still admits, stop epoch unchanged, handle still active) is asked again
at every launch checkpoint (ST-9, R17): after the history read, after the request is built,
right before the stream registers and after the turn envelope is written. A refusal
forfeits the continuation (ST-6, ST-10): the owner is settled, no stream starts.

Goals and workspaces belong to the host. They are ports (:class:`Goals`,
:class:`Workspaces`), answered synchronously from what the host knows now; the engine ships
in-process defaults (:class:`GoalBoard`, :class:`WorkspaceBoard`) that the harness drives with
its ``goal`` and ``workspace`` ops. A port that raises is an admission read error: the
attempt failed before its stream (ST-10, counted toward R21's cap), never a refusal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

import msgspec

from agent_session.ports import PreStreamFailure

if TYPE_CHECKING:
    from message_queue import Correlation


class GoalState(StrEnum):
    """Where a goal stands; only an ``active`` goal admits more of its work."""

    ACTIVE = "active"
    PAUSED = "paused"
    REPLACED = "replaced"
    COMPLETE = "complete"


class WorkspaceState(StrEnum):
    """Where a session's workspace stands; only an ``ok`` workspace admits a launch."""

    OK = "ok"
    RENAMING = "renaming"
    ARCHIVED = "archived"
    REMOVED = "removed"


class WorkspaceStatus(msgspec.Struct, frozen=True, gc=False):
    """A workspace's state and its stop epoch (moved by every stop: rename, archive, removal)."""

    state: WorkspaceState = WorkspaceState.OK
    stop_epoch: int = 0


class Goals(Protocol):
    """The host's goals: the state of the goal a session's turns are attributed to."""

    def goal_state(self, goal: str) -> GoalState:
        """``goal``'s state now (cheap and synchronous: asked at every launch checkpoint)."""
        ...

    def pause(self, goal: str, why: str) -> None:
        """AS-4: pause ``goal`` if it is active (a user's send to it was refused: ``why``)."""
        ...


class Workspaces(Protocol):
    """The host's workspaces: the state and stop epoch of a session's workspace."""

    def workspace_status(self, session: str) -> WorkspaceStatus:
        """The workspace of ``session`` now (cheap and synchronous, like ``goal_state``)."""
        ...


class GoalBoard:
    """The in-process :class:`Goals`: every goal is ``active`` until :meth:`set` moves it."""

    __slots__ = ("_states",)

    def __init__(self) -> None:
        self._states: dict[str, GoalState] = {}

    def set(self, goal: str, state: GoalState | str) -> None:
        """Move ``goal`` to ``state``."""
        self._states[goal] = GoalState(state)

    def goal_state(self, goal: str) -> GoalState:
        return self._states.get(goal, GoalState.ACTIVE)

    def pause(self, goal: str, why: str) -> None:
        if self.goal_state(goal) is GoalState.ACTIVE:
            self._states[goal] = GoalState.PAUSED


class WorkspaceBoard:
    """The in-process :class:`Workspaces`: ``ok`` at epoch 0 until :meth:`set` moves one."""

    __slots__ = ("_status",)

    def __init__(self) -> None:
        self._status: dict[str, WorkspaceStatus] = {}

    def set(self, session: str, state: WorkspaceState | str) -> None:
        """Move the workspace of ``session`` to ``state``; every move is a stop (its epoch)."""
        now = self.workspace_status(session)
        self._status[session] = WorkspaceStatus(WorkspaceState(state), now.stop_epoch + 1)

    def workspace_status(self, session: str) -> WorkspaceStatus:
        return self._status.get(session, _OK)


_OK = WorkspaceStatus()
log = logging.getLogger("turnkeeper.session")

#: The owner's answer for a delegated turn: why its handle no longer admits it, or ``None``.
HandleProbe = Callable[["Correlation", str], "str | None"]


class AdmissionUnreadable(PreStreamFailure):
    """A goal, workspace or handle could not be read: the attempt failed before its stream."""


class Admission:
    """The engine's admission of internal continuations (one for all its sessions)."""

    __slots__ = ("_follow_ups", "_goals", "_handles", "_workspaces")

    def __init__(
        self,
        goals: Goals,
        workspaces: Workspaces,
        handles: HandleProbe,
        follow_ups: HandleProbe | None = None,
    ) -> None:
        self._goals = goals
        self._workspaces = workspaces
        self._handles = handles
        #: TD-8's question for a follow-up of a delegated turn (``handles`` when not given).
        self._follow_ups = follow_ups or handles

    def admit_follow_up(self, session: str, correlation: Correlation) -> Ticket | str:
        """TD-8, R41: a ticket for a turn continuing ``correlation``'s, or why it is refused.

        Only the handle is asked (a follow-up is the owner's or the turn's own, not the
        engine's continuing on its own: no goal, no workspace).

        Raises:
            AdmissionUnreadable: the owner raised.
        """
        ticket = Ticket(self, session, None, correlation, None)
        refusal = ticket.reasons()
        return ticket if refusal is None else refusal

    def admit(
        self, session: str, goal: str | None, correlation: Correlation | None
    ) -> Ticket | str:
        """ST-8's read: a :class:`Ticket` for the launch (the stop epoch captured), or why not.

        Raises:
            AdmissionUnreadable: a port raised (a failure before start, not a refusal).
        """
        try:
            epoch = self._workspaces.workspace_status(session).stop_epoch
            refusal = self._refusal(session, goal, correlation, epoch)
        except Exception as error:  # a host port: whatever it raises is a read error
            raise _unreadable(error) from error
        return Ticket(self, session, goal, correlation, epoch) if refusal is None else refusal

    def pause_goal(self, goal: str, why: str) -> None:
        """AS-4: pause ``goal`` (a port that raises is logged: the refusal stands anyway)."""
        try:
            self._goals.pause(goal, why)
        except Exception as error:  # a host port: what it raises must not break the send
            log.warning("the goal %s could not be paused (%s): %r", goal, why, error)

    def refusal(
        self, session: str, goal: str | None, correlation: Correlation | None, epoch: int | None
    ) -> str | None:
        """Why the goal, the workspace or the handle refuses now.

        ``epoch`` ``None`` is a follow-up's ticket: its handle alone is asked.

        Raises:
            AdmissionUnreadable: a port raised.
        """
        try:
            if epoch is None:
                return None if correlation is None else self._follow_ups(correlation, session)
            return self._refusal(session, goal, correlation, epoch)
        except Exception as error:  # a host port: whatever it raises is a read error
            raise _unreadable(error) from error

    def _refusal(
        self, session: str, goal: str | None, correlation: Correlation | None, epoch: int
    ) -> str | None:
        if goal is not None:
            state = self._goals.goal_state(goal)
            if state is not GoalState.ACTIVE:
                return f"the goal {goal} no longer admits work ({state})"
        workspace = self._workspaces.workspace_status(session)
        if workspace.state is not WorkspaceState.OK:
            return f"the workspace of {session} is {workspace.state}"
        if workspace.stop_epoch != epoch:
            return f"the workspace of {session} was stopped (epoch {workspace.stop_epoch})"
        if correlation is not None:
            return self._handles(correlation, session)
        return None


def _unreadable(error: Exception) -> AdmissionUnreadable:
    return AdmissionUnreadable(f"admission could not be read: {error!r}")


class Ticket:
    """One admitted launch: the combined probe (ST-9, R17) against what was admitted."""

    __slots__ = ("_admission", "correlation", "epoch", "error", "goal", "session")

    def __init__(
        self,
        admission: Admission,
        session: str,
        goal: str | None,
        correlation: Correlation | None,
        epoch: int | None,
    ) -> None:
        self._admission = admission
        self.session = session
        self.goal = goal
        self.correlation = correlation
        #: The workspace's stop epoch when the launch was admitted (``None``: a follow-up's).
        self.epoch = epoch
        #: A read error the probe met (the launch is then a failure before start).
        self.error: AdmissionUnreadable | None = None

    def reasons(self) -> str | None:
        """Why the launch is refused now (read errors raise :class:`AdmissionUnreadable`)."""
        return self._admission.refusal(self.session, self.goal, self.correlation, self.epoch)

    def refusal(self) -> str | None:
        """The combined probe: why the launch must stop now, or ``None``.

        Never raises (the stream manager asks it): a read error refuses the launch and is kept
        in :attr:`error`, so the caller counts the attempt as failed, not refused.
        """
        try:
            return self.reasons()
        except AdmissionUnreadable as error:
            self.error = error
            return str(error)


__all__ = [
    "Admission",
    "AdmissionUnreadable",
    "GoalBoard",
    "GoalState",
    "Goals",
    "HandleProbe",
    "Ticket",
    "WorkspaceBoard",
    "WorkspaceState",
    "WorkspaceStatus",
    "Workspaces",
]
