"""The pydantic-ai adapter's cost per step over HTTP, beside pydantic-ai's own ``Agent``.

Both run the same turn against the same scripted OpenAI-compatible server on 127.0.0.1
(``agent_session.harness.openai_fixture``), through the same client stack (pydantic-ai's
``OpenAIChatModel`` on an ``openai.AsyncOpenAI`` with no retries): the model calls a no-op
tool for N-1 steps, then answers ``done`` (N = 10). The server decides each reply from the
request (how many tool results it carries), so both systems get identical responses.

* **turnkeeper**: an ``Engine`` with ``PydanticAIModel`` and a no-op ``FunctionTool``, one
  fresh session per turn, ``send`` to ``wait_idle`` timed; on ``MemoryStore`` (the figure the
  target compares) and on ``SqliteStore`` WAL NORMAL (every receipt, envelope and row durable;
  for information: the Agent persists nothing).
* **pydantic-ai**: ``Agent(model, tools=[noop]).run("go")`` timed.

Runs are interleaved: each round runs one turn of every system, in an order rotated every
round, in one event loop. A figure is the median over the measured rounds of the turn's time
divided by N, in µs. Target: turnkeeper (MemoryStore) no slower per step than the Agent.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from rich.console import Console
from rich.table import Table

from agent_session import Engine, EngineConfig
from agent_session.harness.openai_fixture import (
    FixtureServer,
    Reply,
    TextReply,
    ToolCall,
    ToolCallsReply,
)
from persistence import MemoryStore, SqliteStore, Store
from stream_manager import FunctionTool
from stream_manager.models import PydanticAIModel

STEPS = 10
ROUNDS = 40
WARMUP = 5
MODEL = "fixture-model"


async def noop() -> str:
    """Do nothing."""
    return "ok"


def respond(request: Mapping[str, Any]) -> Reply:
    """A tool call until the request carries STEPS-1 tool results, then the answer."""
    done = sum(1 for message in request["messages"] if message["role"] == "tool")
    if done < STEPS - 1:
        return ToolCallsReply(calls=(ToolCall(id=f"call_{done}", name="noop", arguments="{}"),))
    return TextReply(chunks=("done",))


Turn = Callable[[int], Awaitable[None]]


async def _turnkeeper(url: str, store: Store, clients: list[AsyncOpenAI]) -> tuple[Engine, Turn]:
    model = PydanticAIModel(MODEL, model_id="m", base_url=url)
    engine = Engine(
        store=store,
        models={"m": model},
        tools={"noop": FunctionTool(noop)},
        config=EngineConfig(max_stream_steps=STEPS + 2),
    )

    async def turn(n: int) -> None:
        session = await engine.open_session(f"s{n}", model="m")
        session.send("go")
        await session.wait_idle()

    clients.append(model._client)
    return engine, turn


def _agent(url: str, clients: list[AsyncOpenAI]) -> Turn:
    client = AsyncOpenAI(base_url=url, api_key="not-needed", max_retries=0)
    clients.append(client)
    agent = Agent(OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=client)))
    agent.tool_plain(noop)

    async def turn(n: int) -> None:
        result = await agent.run("go")
        assert result.output == "done", result.output

    return turn


async def _measure() -> dict[str, list[float]]:
    clients: list[AsyncOpenAI] = []
    figures: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="turnkeeper-models-") as folder:
        async with FixtureServer(respond=respond) as server:
            memory_engine, memory_turn = await _turnkeeper(server.base_url, MemoryStore(), clients)
            sqlite = SqliteStore(Path(folder) / "bench.db", synchronous="NORMAL")
            durable_engine, durable_turn = await _turnkeeper(server.base_url, sqlite, clients)
            systems: dict[str, Turn] = {
                "turnkeeper + adapter, MemoryStore": memory_turn,
                "turnkeeper + adapter, SqliteStore WAL NORMAL": durable_turn,
                "pydantic-ai Agent": _agent(server.base_url, clients),
            }
            figures = {name: [] for name in systems}
            names = list(systems)
            async with memory_engine, durable_engine:
                for n in range(WARMUP + ROUNDS):
                    order = names[n % len(names) :] + names[: n % len(names)]
                    for name in order:
                        start = time.perf_counter_ns()
                        await systems[name](n)
                        elapsed = time.perf_counter_ns() - start
                        if n >= WARMUP:
                            figures[name].append(elapsed / STEPS / 1000)
            for client in clients:
                await client.close()
    return figures


def main() -> int:
    """Print the table; non-zero when turnkeeper is slower per step than the Agent."""
    figures = anyio.run(_measure)
    medians = {name: statistics.median(values) for name, values in figures.items()}
    agent = medians["pydantic-ai Agent"]
    table = Table(title=f"per step over HTTP, N={STEPS}, median of {ROUNDS} interleaved rounds")
    table.add_column("system")
    table.add_column("µs/step", justify="right")
    table.add_column("/ Agent", justify="right")
    for name, value in medians.items():
        table.add_row(name, f"{value:,.0f}", f"{value / agent:.2f}x")
    Console().print(table)
    ours = medians["turnkeeper + adapter, MemoryStore"]
    met = ours <= agent
    print(
        f"turnkeeper + adapter (MemoryStore) {ours:,.0f} µs/step vs pydantic-ai Agent "
        f"{agent:,.0f}: target no slower: {'met' if met else 'MISSED'}"
    )
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
