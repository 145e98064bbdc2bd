"""The conformance fixtures: every ``Store`` implementation, opened on a fresh backing."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from persistence import MemoryStore, SqliteStore, Store

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Store]:
    """A factory of store objects over one backing: calling it again "reopens" the same data."""
    if request.param == "memory":
        shared = MemoryStore()
        return lambda: shared
    if request.param == "postgres":
        from persistence.postgres import PostgresStore

        url: str = request.getfixturevalue("pg_url")
        return lambda: PostgresStore(url)
    return lambda: SqliteStore(tmp_path / "t.db")


@pytest.fixture
async def store(make_store: Callable[[], Store]) -> AsyncIterator[Store]:
    async with make_store() as opened:
        yield opened
