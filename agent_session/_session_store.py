"""One session's read view of the store port: its history (writes go through ``_writer``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from persistence import HistoryRow, Store, StoredPartial


class SessionStore:
    """Loads one session's history rows."""

    __slots__ = ("_session", "_store")

    def __init__(self, store: Store, session: str) -> None:
        self._store = store
        self._session = session

    async def rows(self) -> list[HistoryRow]:
        """The session's history rows, by seq (empty for a session the store does not hold)."""
        return list((await self.history())[0])

    async def history(self) -> tuple[tuple[HistoryRow, ...], tuple[StoredPartial, ...]]:
        """The history rows, by seq, and the partials streams left (B4), read at once."""
        loaded = await self._store.load(self._session, envelopes=False)
        return ((), ()) if loaded is None else (loaded.rows, loaded.partials)
