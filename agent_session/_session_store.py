"""One session's view of the store port: its boundaries, committed under the engine's owner."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from persistence import Boundary, Committed, HistoryRow, Store


class SessionStore:
    """Commits one session's durable boundaries and loads its history, fenced by ``owner``."""

    __slots__ = ("_owner", "_session", "_store")

    def __init__(self, store: Store, session: str, owner: str | None) -> None:
        self._store = store
        self._session = session
        self._owner = owner

    async def commit(self, boundary: Boundary) -> Committed:
        """Make ``boundary`` durable in one transaction (all of it or nothing).

        Raises:
            StaleOwner: the store has another owner now; nothing is written.
        """
        return await self._store.commit(self._session, boundary, owner=self._owner)

    async def rows(self) -> list[HistoryRow]:
        """The session's history rows, by seq (empty for a session the store does not hold)."""
        loaded = await self._store.load(self._session, envelopes=False)
        return [] if loaded is None else list(loaded.rows)
