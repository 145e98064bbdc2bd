"""The one writer: every durable write of the engine's sessions goes through here.

The turn machine decides each write (a :class:`~agent_session._effects.Commit` effect) and the
session shell performs it with :meth:`Writer.write`; the engine's own writes (a session's
creation, startup recovery's record changes, the receipts a restart closes) are planned by
pure functions and written here too. Nothing else in ``agent_session`` commits (a test reads
the source to hold that).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from persistence import TurnkeeperError

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from persistence import Boundary, Committed, Store


class IncompleteWrite(TurnkeeperError):
    """A delete that must take every row it names took fewer (nothing else was changed)."""


class WriteCutShort(TurnkeeperError):
    """A write was cancelled before the store returned: it may or may not have landed.

    The session decides it failed (nothing of it is told); the store, read again at the next
    startup, says what became of it.
    """


class Writer:
    """Commits boundaries to the store port under the engine's owner token."""

    __slots__ = ("_owner", "_store")

    def __init__(self, store: Store, owner: str | None) -> None:
        self._store = store
        self._owner = owner

    def write(
        self, session: str, boundary: Boundary, *, exact: bool = False
    ) -> Awaitable[Committed]:
        """Make ``boundary`` durable in one transaction (all of it or nothing); await it.

        Not a coroutine of its own: the store's commit is awaited directly (one frame less on
        every write), checked afterwards only when ``exact``.

        Raises (when awaited):
            StaleOwner: the store has another owner now; nothing is written.
            IncompleteWrite: ``exact``, and the delete took fewer rows than it names.
            TurnkeeperError, OSError: the store's own failure; nothing is written.
        """
        commit = self._store.commit(session, boundary, owner=self._owner)
        return _exactly(session, boundary, commit) if exact else commit


async def _exactly(session: str, boundary: Boundary, commit: Awaitable[Committed]) -> Committed:
    """``commit``, refused as incomplete when its delete took fewer rows than it names."""
    committed = await commit
    if committed.deleted < len(boundary.delete):
        raise IncompleteWrite(
            f"session {session}: {committed.deleted} of {len(boundary.delete)} rows deleted"
        )
    return committed
