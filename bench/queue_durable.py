"""µs per queued message, durable (issue 24): the durable queue's cost on SQLite.

Every session is kept busy (its turn is held inside a tool call), so each message a user sends
is queued, and ``await session.send(...)`` returns once the queue's new state is committed
(``Delivery.state`` ``queued``). Timed:

* **1 session**: M messages sent one after the other, each awaited before the next (every
  message its own commit: the latency a user sees);
* **1,000 sessions**: one message to each session, all sent at once and awaited together (the
  group commit shares transactions between sessions: the throughput of many users).

Figures: µs per message (the timed wall ÷ messages), transactions and writes per message
(``SqliteStore.commits``), median of RUNS runs on WAL NORMAL. No target (information): the issue
asks for one durable write per queued message and a shared commit for a batch.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import anyio
from rich.console import Console
from rich.table import Table

from agent_session import DeliveryState, Engine, EngineConfig
from persistence import SqliteStore
from stream_manager import (
    ScriptedModel,
    ScriptStep,
    ScriptToolCall,
    ToolCallPart,
    ToolContext,
    ToolKind,
    ToolResultPart,
)

RUNS = 5
SOLO_MESSAGES = 300
SESSIONS = 1_000


class HeldTool:
    """A client tool that holds its call until ``release`` is set: the session stays busy."""

    name = "hold"
    kind = ToolKind.CLIENT

    def __init__(self, sessions: int) -> None:
        self.release = anyio.Event()
        self.all_started = anyio.Event()
        self._left = sessions

    async def execute(self, call: ToolCallPart, context: ToolContext) -> ToolResultPart:
        self._left -= 1
        if self._left == 0:
            self.all_started.set()
        await self.release.wait()
        return ToolResultPart(call_id=call.call_id, name=call.name, output="ok")


async def one_run(folder: Path, sessions: int, per_session: int) -> tuple[float, float, float]:
    """(µs per message, transactions per message, writes per message) of one run."""
    steps = [ScriptStep(tool_calls=(ScriptToolCall(tool="hold"),))] * sessions
    steps += [ScriptStep(text="done")] * (sessions * (per_session + 1))
    model = ScriptedModel("m", steps)
    tool = HeldTool(sessions)
    store = SqliteStore(folder / f"q-{sessions}-{time.monotonic_ns()}.db")
    config = EngineConfig(max_stream_steps=4, recover_at_start=False)
    async with Engine(store=store, models={"m": model}, tools={"hold": tool}, config=config) as e:
        opened = [await e.open_session(f"s{i}", model="m") for i in range(sessions)]
        for session in opened:
            session.send("start")
        await tool.all_started.wait()  # every turn is held in its tool: every session busy
        before = store.commits
        began = time.perf_counter_ns()
        if sessions == 1:
            for n in range(per_session):
                delivery = await opened[0].send(f"message {n}", mode="turn-end")
                assert delivery.state is DeliveryState.QUEUED, delivery
        else:
            deliveries = [s.send("one more thing", mode="turn-end") for s in opened]
            for delivery in deliveries:
                assert (await delivery).state is DeliveryState.QUEUED, delivery
        wall = time.perf_counter_ns() - began
        after = store.commits
        messages = sessions * per_session
        tool.release.set()
        await e.wait_idle()
    transactions = (after[0] - before[0]) / messages
    writes = (after[1] - before[1]) / messages
    return wall / 1000 / messages, transactions, writes


async def main() -> None:
    console = Console()
    rows: list[tuple[str, float, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="turnkeeper-queue-bench-") as tmp:
        for label, sessions, each in (
            (f"1 session, {SOLO_MESSAGES} messages one after another", 1, SOLO_MESSAGES),
            (f"{SESSIONS:,} sessions, one message each, at once", SESSIONS, 1),
        ):
            results = [await one_run(Path(tmp), sessions, each) for _ in range(RUNS)]
            rows.append(
                (
                    label,
                    statistics.median(r[0] for r in results),
                    statistics.median(r[1] for r in results),
                    statistics.median(r[2] for r in results),
                )
            )
    table = Table(title="durable queue: µs per queued message (SqliteStore WAL NORMAL)")
    for column in ("workload", "µs / message", "transactions / message", "writes / message"):
        table.add_column(column)
    for label, us, transactions, writes in rows:
        table.add_row(label, f"{us:,.1f}", f"{transactions:.3f}", f"{writes:.2f}")
    console.print(table)


if __name__ == "__main__":
    anyio.run(main)
