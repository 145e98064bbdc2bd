"""The engine's writes carry the owner token it opened the store with (the fence, end to end)."""

from __future__ import annotations

import pytest

from agent_session import Engine
from persistence import MemoryStore, StaleOwner
from stream_manager import ScriptedModel


async def test_an_engine_whose_store_changed_owners_has_its_commits_refused() -> None:
    store = MemoryStore()
    async with Engine(store=store, models={"M": ScriptedModel("M", [])}) as engine:
        await engine.open_session("s1", model="M")
        await store.close()
        await store.open()  # another owner now: the engine's token is stale
        with pytest.raises(StaleOwner):
            await engine.open_session("s2", model="M")
        assert [record.id for record in await store.sessions()] == ["s1"]
