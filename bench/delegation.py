"""Delegated-turn settlement latency (issue 23): the child's stream-end to the owner's settlement.

One long-lived :class:`~agent_session.Engine` per store kind (the real
:class:`~stream_manager.SystemClock`), two sessions, ``lead`` and ``worker``. Each incident is
the deferred turn of ``docs/scenarios/delegated-withdrawn-wake.toml``: ``lead`` delegates a turn
to ``worker`` under a new handle; the worker's first stream calls ``bash`` then ``job_wait``
(client tools that return at once); an observer on ``job_wait``'s ``op-start`` queues a wake,
so the loop is cut at that tool boundary, and withdraws the wake on the stream's ``stream-end``;
the owner's claim defers on the owed cut; the idle sweep resumes the turn, whose text answer
ends it ``stop``. **The clock starts** at that resumed stream's ``stream-end`` (read in the
observer) and **stops** at the owner's ``settled`` event for the handle: the handle record's
write (``completed``, with the report) and the telling, after the stream's own final row.
``session.wait_idle()`` and ``Delegation.settled()`` are awaited before the next incident;
nothing waits on a sleep. Every incident is checked: one ``claim`` (``defer``), one
``settled`` (``completed``), two streams of the turn.

Figures: p50, p99 (nearest rank) and the maximum, in µs, after ``WARMUP`` uncounted incidents.
There is no target (the issue asks for the figure); the run exits 0 unless an incident is not
as expected.
"""

from __future__ import annotations

import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from rich.console import Console
from rich.table import Table

from agent_session import Engine, EngineConfig, EngineEvent, HandleClaimed, HandleSettled
from bench.resume import ResultTool, _percentile_us
from message_queue import DispatchMode, EntryKind
from persistence import MemoryStore, SqliteStore, Store
from stream_manager import (
    FinishReason,
    OperationStarted,
    ScriptedModel,
    ScriptStep,
    ScriptToolCall,
    StreamEnded,
)

INCIDENTS = 500
WARMUP = 50
HANG_S = 30.0
MODEL = "m"
WAKE = "job-done"
_SCRIPT = (
    ScriptStep(tool_calls=(ScriptToolCall(tool="bash", args={"cmd": "make check &"}),)),
    ScriptStep(tool_calls=(ScriptToolCall(tool="job_wait", args={}),)),
    ScriptStep(text="Build check passed."),
)


@dataclass
class Incident:
    """What one incident's observer saw."""

    handle: str
    ends: list[str] = field(default_factory=list)
    ended_ns: int | None = None
    settled_ns: int | None = None
    claims: list[str] = field(default_factory=list)
    settled: list[str] = field(default_factory=list)


class Bench:
    """Runs delegated turns one after another on one engine and times each settlement."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.current: Incident | None = None
        engine.add_observer(self.on_event)

    def on_event(self, event: EngineEvent) -> None:
        incident = self.current
        if incident is None:
            return
        if isinstance(event, OperationStarted) and event.tool == "job_wait":
            self.engine.session("worker").enqueue(
                "job finished", kind=EntryKind.WAKE, entry=WAKE, mode=DispatchMode.TOOL_END
            )
        elif isinstance(event, StreamEnded) and event.session == "worker":
            incident.ends.append(event.finish.value)
            if event.finish is FinishReason.TOOL_CALLS:
                self.engine.session("worker").withdraw(WAKE, "withdrawn")
            else:
                incident.ended_ns = time.perf_counter_ns()
        elif isinstance(event, HandleClaimed) and event.handle == incident.handle:
            incident.claims.append(event.answer)
        elif isinstance(event, HandleSettled) and event.handle == incident.handle:
            incident.settled_ns = time.perf_counter_ns()
            incident.settled.append(event.status)

    async def incident(self, n: int) -> int:
        """One delegated turn, deferred and then completed; the latency in ns."""
        incident = Incident(handle=f"review-{n}")
        self.current = incident
        delegation = self.engine.delegate("lead", "worker", incident.handle, "run the check")
        with anyio.fail_after(HANG_S):  # a wedged incident fails loudly instead of hanging
            await delegation.settled()
            await self.engine.wait_idle()
        self.current = None
        expected = (["tool-calls", "stop"], ["defer"], ["completed"])
        if (incident.ends, incident.claims, incident.settled) != expected:
            raise AssertionError(f"incident {n}: not as expected: {incident}")
        assert incident.ended_ns is not None
        assert incident.settled_ns is not None
        return incident.settled_ns - incident.ended_ns


async def _measure(store: Store) -> list[int]:
    scripted = ScriptedModel(MODEL, _SCRIPT * (WARMUP + INCIDENTS), record=False)
    engine = Engine(
        store=store,
        models={MODEL: scripted},
        tools={
            "bash": ResultTool("bash", "started"),
            "job_wait": ResultTool("job_wait", "job exited 0"),
        },
        config=EngineConfig(max_stream_steps=7),
    )
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(engine)
        await engine.open_session("lead", model=MODEL)
        await engine.open_session("worker", model=MODEL)
        bench = Bench(engine)
        for n in range(WARMUP):
            await bench.incident(n)
        return [await bench.incident(WARMUP + n) for n in range(INCIDENTS)]


async def _measure_all() -> dict[str, list[int]]:
    with tempfile.TemporaryDirectory(prefix="turnkeeper-delegation-") as name:
        return {
            "MemoryStore": await _measure(MemoryStore()),
            "SqliteStore WAL NORMAL": await _measure(
                SqliteStore(Path(name) / "delegation.db", synchronous="NORMAL")
            ),
        }


def main() -> int:
    """Measure and print the table (no target: the figure is information)."""
    samples = anyio.run(_measure_all)
    console = Console(width=110)
    table = Table(
        title="delegated turn: the child's stream-end -> the owner's settled, µs "
        f"({INCIDENTS:,} incidents after {WARMUP} warm-up)"
    )
    for column in ("store", "p50", "p99", "max"):
        table.add_column(column, justify="left" if column == "store" else "right")
    for kind, values in samples.items():
        table.add_row(
            kind,
            f"{_percentile_us(values, 0.50):,.0f}",
            f"{_percentile_us(values, 0.99):,.0f}",
            f"{max(values) / 1_000:,.0f}",
        )
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
