"""Bytes per idle session holding a 20-message history, turnkeeper beside its peers (item 7).

Every session gets its history by running 10 real turns (a user message, a text answer: 20
messages). Measured with ``tracemalloc``: after warm-up sessions (one-time caches), the traced
memory is read after ``gc.collect()``, then ``SESSIONS`` more sessions are built and kept, and
the growth divided by ``SESSIONS`` is the figure.

* turnkeeper, SqliteStore: an Engine whose sessions' history lives in the store's file; what
  is counted is what the engine keeps per idle session (the target applies to this row).
* turnkeeper, MemoryStore: the same with the history in memory (for information).
* pydantic-ai: the run's ``all_messages()`` list a host would keep.
* LangGraph: the graph state's ``messages`` list a host would keep (no checkpointer).
* Agents SDK: the ``to_input_list()`` items a host would keep (a session's item list).

The ScriptedModel records every request it receives; that record is cleared before reading,
so it does not count against turnkeeper.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import anyio
from rich.console import Console
from rich.table import Table

from agent_session import Engine
from bench import _peers
from persistence import MemoryStore, SqliteStore, Store
from stream_manager import ScriptedModel, ScriptStep

SESSIONS = 60
WARM = 5
TURNS = 10
TARGET_BYTES = 4_000
TK_SQLITE = "turnkeeper, SqliteStore (history on disk)"
TK_MEMORY = "turnkeeper, MemoryStore (history in memory)"

#: Builds one idle session with its history and returns what the host keeps for it.
Build = Callable[[int], Awaitable[object]]


#: The allocation sites that grew most with turnkeeper's SqliteStore sessions (the profile).
TOP_SITES: list[tuple[str, float]] = []


async def _grow(
    build: Build, before_reading: Callable[[], None] = lambda: None, *, sites: bool = False
) -> float:
    kept = [await build(index) for index in range(WARM)]
    before_reading()
    gc.collect()
    baseline = tracemalloc.get_traced_memory()[0]
    first = tracemalloc.take_snapshot() if sites else None
    kept += [await build(WARM + index) for index in range(SESSIONS)]
    before_reading()
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - baseline
    if first is not None:
        diff = tracemalloc.take_snapshot().compare_to(first, "lineno")
        TOP_SITES[:] = [(str(stat.traceback[0]), stat.size_diff / SESSIONS) for stat in diff[:8]]
    del kept
    return grown / SESSIONS


async def _turnkeeper(store: Store, *, sites: bool = False) -> float:
    sessions = WARM + SESSIONS
    model = ScriptedModel("M", [ScriptStep(text="answer")] * (sessions * TURNS))
    async with AsyncExitStack() as stack:
        engine = await stack.enter_async_context(Engine(store=store, models={"M": model}))

        async def build(index: int) -> object:
            session = await engine.open_session(f"s{index}", model="M")
            for turn in range(TURNS):
                session.send(f"message {turn}")
                await session.wait_idle()
            return session

        return await _grow(build, model.requests.clear, sites=sites)


async def _pydantic_ai() -> float:
    agent = _peers.pydantic_ai_agent(1)  # a one-step script: every run answers with text

    async def build(index: int) -> object:
        history: list[Any] = []
        for turn in range(TURNS):
            agent_ = _peers.pydantic_ai_agent(1)
            result = await agent_.run(f"message {turn}", message_history=history)
            history = result.all_messages()
        return history

    del agent
    return await _grow(build)


async def _langgraph() -> float:
    core_messages = _peers._m("langchain_core.messages")

    async def build(index: int) -> object:
        messages: list[Any] = []
        for turn in range(TURNS):
            app = _peers.langgraph_builder(1).compile()
            state = await app.ainvoke(
                {"messages": [*messages, core_messages.HumanMessage(f"message {turn}")]}
            )
            messages = state["messages"]
        return messages

    return await _grow(build)


async def _agents_sdk() -> float:
    runner = _peers._m("agents").Runner

    async def build(index: int) -> object:
        items: list[Any] = []
        for turn in range(TURNS):
            agent = _peers.agents_sdk_agent(1)
            new = {"role": "user", "content": f"message {turn}"}
            result = await runner.run(agent, [*items, new], max_turns=2)
            items = result.to_input_list()
        return items

    return await _grow(build)


async def _measure() -> dict[str, float]:
    figures: dict[str, float] = {}
    with TemporaryDirectory(prefix="turnkeeper-memory-") as name:
        figures[TK_SQLITE] = await _turnkeeper(SqliteStore(Path(name) / "memory.db"), sites=True)
    figures[TK_MEMORY] = await _turnkeeper(MemoryStore())
    peers: dict[_peers.Peer, Callable[[], Awaitable[float]]] = {
        _peers.PYDANTIC_AI: _pydantic_ai,
        _peers.LANGGRAPH: _langgraph,
        _peers.AGENTS_SDK: _agents_sdk,
    }
    for peer, measure in peers.items():
        version = peer.version()
        if version is not None:
            figures[f"{peer.name} {version}"] = await measure()
    return figures


def measure() -> dict[str, float]:
    """Bytes per idle session with a 20-message history, by system."""
    tracemalloc.start()
    try:
        return anyio.run(_measure)
    finally:
        tracemalloc.stop()


def main() -> int:
    """Measure, print the table and the verdict; 0 when turnkeeper meets its target."""
    figures = measure()
    console = Console(width=110)
    table = Table(
        title=f"memory: bytes per idle session, {2 * TURNS}-message history "
        f"(tracemalloc, {SESSIONS} sessions)"
    )
    table.add_column("system")
    table.add_column("bytes / session", justify="right")
    table.add_column("/ turnkeeper (SqliteStore)", justify="right")
    own = figures[TK_SQLITE]
    for name, figure in figures.items():
        table.add_row(name, f"{figure:,.0f}", f"{figure / own:,.1f}x")
    console.print(table)
    ok = own < TARGET_BYTES
    console.print(
        f"turnkeeper (SqliteStore) {own:,.0f} bytes per idle session, target < "
        f"{TARGET_BYTES:,}: {'met' if ok else 'MISSED'}"
    )
    if not ok:
        console.print("what dominates it: the allocation sites that grew most, bytes per session:")
        for site, size in TOP_SITES:
            console.print(f"  {size:>8,.0f}  {site}", highlight=False, markup=False)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
