"""The store backends the operation tests run on: a MemoryStore and a SqliteStore file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from persistence import MemoryStore, SqliteStore, Store


@dataclass
class Backend:
    """Makes the store an engine opens; a ``MemoryStore`` is one object across restarts."""

    kind: str
    path: Path
    memory: MemoryStore | None

    def make(self) -> Store:
        """The store for the next engine (a new connection to the same file for SQLite)."""
        return self.memory if self.memory is not None else SqliteStore(self.path)

    @asynccontextmanager
    async def reader(self, live: Store) -> AsyncIterator[Store]:
        """Another view of what is durable: a second, read-only connection for SQLite."""
        if self.memory is not None:
            yield live
            return
        async with SqliteStore(self.path, readonly=True) as store:
            yield store


@pytest.fixture(params=["memory", "sqlite"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    kind = str(request.param)
    return Backend(kind, tmp_path / "ops.db", MemoryStore() if kind == "memory" else None)
