"""Resume latency (issue 6 item 4): a queued wake's withdrawal to the resumed stream's first step.

Each incident is a withdrawn wake, like ``docs/scenarios/withdrawn-wake.toml``, on a
fresh session of one long-lived :class:`~agent_session.Engine` per store kind
(``max_stream_steps`` 8, the real :class:`~stream_manager.SystemClock`):

1. ``send`` a message; the ScriptedModel calls ``bash``, then ``task_await`` (client tools that
   return at once);
2. an engine observer on ``task_await``'s ``op-start`` (observers are synchronous: the tool is
   running) enqueues a ``wake`` entry with mode ``tool-end``, so the loop stops at that tool
   boundary (``stop`` why=queued-message) and the cut turn is owed 6 steps;
3. an engine observer on that stream's ``stream-end`` withdraws the wake
   (``session.withdraw("wake", "withdrawn")``), exactly where the scenario does it: any later
   and the drain would dispatch the wake instead of cancelling it. **The clock starts here**,
   ``time.perf_counter_ns()`` read immediately before the ``withdraw`` call;
4. the engine then settles the first stream, cancels the withdrawn entry, goes idle, and the
   idle sweep resumes the cut turn in a new stream (``stream-start`` cause=resume, budget 6):
   the history is read, the ``[CONTINUE]`` sentinel appended, the envelope written and the cut
   record marked consumed before the model is called. **The clock stops** when the model
   receives the resumed stream's first request: a thin wrapper around the ScriptedModel reads
   ``time.perf_counter_ns()`` on entry to ``stream_step`` for step 1 of the resumed stream. That
   call is the resumed stream's first step; nothing of it has run yet.

The time to the resume's ``stream-start`` event is recorded too, for information. Every incident
is checked (the wake withdrawn, one resume stream-start with budget 6, the resumed stream ended
with ``stop``, the session idle and owing nothing) and ``session.wait_idle()`` is awaited before
the next one; nothing waits on a sleep. Stores: :class:`~persistence.MemoryStore`, and
:class:`~persistence.SqliteStore` on a file in a fresh temporary folder (WAL, ``synchronous``
NORMAL: every row, envelope, cut state and receipt committed as the turn runs).

``WARMUP`` uncounted incidents precede the ``INCIDENTS`` measured ones on the same engine
(sessions accumulate, the garbage collector stays on, nothing is tuned: SQLite's WAL
auto-checkpoint runs inside whichever commit crosses 1,000 pages, in the window or not). The
figures are p50, p99 (nearest rank) and the maximum, in µs. Targets: p99 < 1 ms in memory and
< 2 ms durable. No peer resumes a cut turn at all, so there are no peer rows.

A miss is diagnosed on a fresh engine of that store kind: ``TIMED`` more incidents with every
store call made inside the window timed (per verb; for each incident at or above the target, its
slowest call; for SqliteStore, whether SQLite restarted its WAL after a checkpoint during the
incident, read from the ``-wal`` file's header between incidents), then ``PROFILED`` more under a
cProfile enabled only inside the window (top 15 by own time). For SqliteStore, ``INCIDENTS``
more run on another fresh engine with SQLite's WAL auto-checkpoint off (``PRAGMA
wal_autocheckpoint = 0`` on the store's private connection): an experiment showing what the
checkpoint costs the tail, never a setting of the measured run.
"""

from __future__ import annotations

import cProfile
import io
import math
import pstats
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console
from rich.table import Table

from agent_session import Engine, EngineConfig, EngineEvent, Phase
from bench.durable import STORE_VERBS
from message_queue import DispatchMode, EntryKind
from persistence import MemoryStore, SqliteStore, Store
from stream_manager import (
    FinishReason,
    ModelRequest,
    OperationStarted,
    Part,
    ScriptedModel,
    ScriptStep,
    ScriptToolCall,
    StartCause,
    StreamEnded,
    StreamStarted,
    ToolCallPart,
    ToolContext,
    ToolKind,
    ToolResultPart,
)

INCIDENTS = 1_000
WARMUP = 100
TIMED = 1_000
SHOWN = 20
PROFILED = 200
MAX_STREAM_STEPS = 8
HANG_S = 30.0
RESUME_BUDGET = 6
MEMORY = "MemoryStore"
DURABLE = "SqliteStore WAL NORMAL"
TARGET_P99_US = {MEMORY: 1_000.0, DURABLE: 2_000.0}
MODEL = "m"
WAKE = "wake"
DB_NAME = "resume.db"
_SCRIPT = (
    ScriptStep(tool_calls=(ScriptToolCall(tool="bash", args={"cmd": "start-monitors"}),)),
    ScriptStep(tool_calls=(ScriptToolCall(tool="task_await"),)),
    ScriptStep(text="All three tasks passed."),
)

#: Builds the store of one engine inside a temporary folder.
StoreFactory = Callable[[Path], Store]


class ResultTool:
    """A client tool that returns a fixed output at once (the scenario's scripted tools)."""

    kind = ToolKind.CLIENT

    def __init__(self, name: str, output: str) -> None:
        self.name = name
        self._output = output

    async def execute(self, call: ToolCallPart, context: ToolContext) -> ToolResultPart:
        return ToolResultPart(call_id=call.call_id, name=call.name, output=self._output)


class StampingModel:
    """The ScriptedModel, stamping the moment it receives the first request of an armed stream."""

    def __init__(self, scripted: ScriptedModel) -> None:
        self.scripted = scripted
        self.armed: str | None = None
        self.stamp_ns: int | None = None
        #: Called right after the stamp (the diagnosis closes its measuring window here).
        self.on_stamp: Callable[[], None] | None = None

    @property
    def id(self) -> str:
        return self.scripted.id

    def reset(self) -> None:
        """Forget the last stamp (a new incident starts)."""
        self.armed = None
        self.stamp_ns = None

    def stream_step(self, request: ModelRequest) -> AsyncIterator[Part]:
        if request.stream == self.armed and request.step == 1:
            self.stamp_ns = time.perf_counter_ns()
            self.armed = None
            if self.on_stamp is not None:
                self.on_stamp()
        return self.scripted.stream_step(request)


class StoreTimer:
    """Times every store call made while ``active`` (the diagnosis of a miss only)."""

    def __init__(self, store: Store) -> None:
        self.active = False
        #: The current window's calls: (verb, ns), in the order they returned.
        self.calls: list[tuple[str, int]] = []
        for verb in STORE_VERBS:
            original = getattr(store, verb)

            async def timed(
                *args: Any, _original: Any = original, _verb: str = verb, **kw: Any
            ) -> Any:
                if not self.active:
                    return await _original(*args, **kw)
                start = time.perf_counter_ns()
                try:
                    return await _original(*args, **kw)
                finally:
                    self.calls.append((_verb, time.perf_counter_ns() - start))

            setattr(store, verb, timed)


@dataclass
class Incident:
    """What one incident's observers saw."""

    session: str
    withdrawn_ns: int | None = None
    withdrew: bool = False
    #: The first stream's stream-end: finish, steps, steps remaining.
    cut_end: tuple[FinishReason, int, int] | None = None
    resume_started_ns: int | None = None
    resume_budgets: list[int] = field(default_factory=list)
    resumed_stream: str | None = None
    resumed_finish: FinishReason | None = None
    wakes: int = 0


@dataclass(frozen=True)
class Sample:
    """One incident's figures, in ns from immediately before ``withdraw``."""

    first_step_ns: int
    stream_start_ns: int


class Bench:
    """Runs incidents one after another on one engine and times each."""

    def __init__(self, engine: Engine, model: StampingModel) -> None:
        self.engine = engine
        self.model = model
        self.current: Incident | None = None
        #: Set by the diagnosis: enabled only inside the measured window.
        self.profile: cProfile.Profile | None = None
        self.store_timer: StoreTimer | None = None
        engine.add_observer(self.on_event)
        model.on_stamp = self._close_window

    def on_event(self, event: EngineEvent) -> None:
        """The scenario's actions (enqueue, withdraw) and the checks' raw facts."""
        incident = self.current
        if incident is None or event.session != incident.session:
            return
        if isinstance(event, OperationStarted) and event.tool == "task_await":
            incident.wakes += 1
            self.engine.session(incident.session).enqueue(
                "monitored tasks finished",
                kind=EntryKind.WAKE,
                entry=WAKE,
                mode=DispatchMode.TOOL_END,
            )
        elif isinstance(event, StreamEnded):
            if event.stream == incident.resumed_stream:
                incident.resumed_finish = event.finish
            elif incident.withdrawn_ns is None:
                incident.cut_end = (event.finish, event.steps, event.remaining)
                self._withdraw(incident)
        elif isinstance(event, StreamStarted) and event.cause is StartCause.RESUME:
            incident.resume_started_ns = time.perf_counter_ns()
            incident.resume_budgets.append(event.budget)
            incident.resumed_stream = event.stream
            self.model.armed = event.stream

    def _withdraw(self, incident: Incident) -> None:
        session = self.engine.session(incident.session)
        if self.store_timer is not None:
            self.store_timer.calls = []
            self.store_timer.active = True
        if self.profile is not None:
            self.profile.enable()
        incident.withdrawn_ns = time.perf_counter_ns()
        incident.withdrew = session.withdraw(WAKE, "withdrawn")

    def _close_window(self) -> None:
        if self.profile is not None:
            self.profile.disable()
        if self.store_timer is not None:
            self.store_timer.active = False

    async def incident(self, name: str) -> Sample:
        """Run one incident on a fresh session and return its figures."""
        session = await self.engine.open_session(name, model=MODEL)
        incident = Incident(session=name)
        self.current = incident
        self.model.reset()
        played = self.model.scripted.steps_played
        session.send("start three monitored tasks and wait for them")
        with anyio.fail_after(HANG_S):  # a wedged incident fails loudly instead of hanging
            await session.wait_idle()
        self.current = None
        stamp = self.model.stamp_ns
        problems = [
            what
            for what, ok in (
                ("the wake was enqueued once", incident.wakes == 1),
                (
                    "the first stream ended tool-calls after 2 steps, 6 left",
                    incident.cut_end == (FinishReason.TOOL_CALLS, 2, RESUME_BUDGET),
                ),
                ("the wake was withdrawn", incident.withdrew),
                ("one resume started, budget 6", incident.resume_budgets == [RESUME_BUDGET]),
                (
                    "the resumed stream ended with stop",
                    incident.resumed_finish is FinishReason.STOP,
                ),
                ("the model played 3 steps", self.model.scripted.steps_played - played == 3),
                ("the model saw the resumed stream's first request", stamp is not None),
                ("the session is idle", session.phase is Phase.IDLE),
                ("the session owes nothing", not session.owes()),
            )
            if not ok
        ]
        if problems:
            raise AssertionError(f"incident {name}: not as expected: {', '.join(problems)}")
        assert stamp is not None
        assert incident.withdrawn_ns is not None
        assert incident.resume_started_ns is not None
        return Sample(
            first_step_ns=stamp - incident.withdrawn_ns,
            stream_start_ns=incident.resume_started_ns - incident.withdrawn_ns,
        )


async def _bench(stack: AsyncExitStack, store: Store, incidents: int) -> Bench:
    scripted = ScriptedModel(MODEL, _SCRIPT * incidents, record=False)
    model = StampingModel(scripted)
    engine = Engine(
        store=store,
        models={MODEL: model},
        tools={
            "bash": ResultTool("bash", "3 monitored tasks started"),
            "task_await": ResultTool("task_await", "all three tasks exited 0"),
        },
        config=EngineConfig(max_stream_steps=MAX_STREAM_STEPS),
    )
    await stack.enter_async_context(engine)
    return Bench(engine, model)


def _memory_store(folder: Path) -> Store:
    return MemoryStore()


def _durable_store(folder: Path) -> Store:
    return SqliteStore(folder / DB_NAME, synchronous="NORMAL")


STORES: dict[str, StoreFactory] = {MEMORY: _memory_store, DURABLE: _durable_store}


async def _measure(factory: StoreFactory) -> list[Sample]:
    with tempfile.TemporaryDirectory(prefix="turnkeeper-resume-") as name:
        async with AsyncExitStack() as stack:
            bench = await _bench(stack, factory(Path(name)), WARMUP + INCIDENTS)
            for n in range(WARMUP):
                await bench.incident(f"warm{n}")
            return [await bench.incident(f"s{n}") for n in range(INCIDENTS)]


async def _measure_all() -> dict[str, list[Sample]]:
    return {kind: await _measure(factory) for kind, factory in STORES.items()}


# -- figures ----------------------------------------------------------------------------------


def _percentile_us(values_ns: list[int], fraction: float) -> float:
    """The nearest-rank percentile, in µs."""
    ordered = sorted(values_ns)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1] / 1_000


@dataclass(frozen=True)
class Figures:
    """One store kind's p50, p99 and max in µs, to the first step and to stream-start."""

    p50: float
    p99: float
    max: float
    start_p50: float
    start_p99: float

    @classmethod
    def of(cls, samples: list[Sample]) -> Figures:
        first = [s.first_step_ns for s in samples]
        start = [s.stream_start_ns for s in samples]
        return cls(
            p50=_percentile_us(first, 0.50),
            p99=_percentile_us(first, 0.99),
            max=max(first) / 1_000,
            start_p50=_percentile_us(start, 0.50),
            start_p99=_percentile_us(start, 0.99),
        )


# -- the diagnosis of a miss ------------------------------------------------------------------


@dataclass
class Diagnosis:
    """Store calls inside each timed window, then a cProfile of more windows."""

    samples: list[Sample] = field(default_factory=list)
    windows: list[list[tuple[str, int]]] = field(default_factory=list)
    #: Whether SQLite restarted its WAL (after a checkpoint) during each timed incident.
    wal_restarts: list[bool] = field(default_factory=list)
    profile: str = ""
    profiled_median_us: float = 0.0


def _wal_checkpoint_sequence(wal: Path) -> int | None:
    """The checkpoint sequence number of a WAL file's header (it grows at every WAL restart).

    SQLite's file format: a WAL header is 32 bytes; bytes 12-15 are the checkpoint sequence
    number, big-endian. ``None`` when there is no WAL file (MemoryStore).
    """
    try:
        with wal.open("rb") as file:
            header = file.read(32)
    except FileNotFoundError:
        return None
    return int.from_bytes(header[12:16], "big") if len(header) == 32 else None


async def _diagnose(factory: StoreFactory) -> Diagnosis:
    """Fresh engine: warm-up, ``TIMED`` store-timed incidents, then ``PROFILED`` under cProfile."""
    diagnosis = Diagnosis()
    profile = cProfile.Profile()
    with tempfile.TemporaryDirectory(prefix="turnkeeper-resume-diagnosis-") as name:
        async with AsyncExitStack() as stack:
            bench = await _bench(stack, factory(Path(name)), WARMUP + TIMED + PROFILED)
            for n in range(WARMUP):
                await bench.incident(f"warm{n}")
            timer = bench.store_timer = StoreTimer(bench.engine.store)
            wal = Path(name) / f"{DB_NAME}-wal"
            for n in range(TIMED):
                before = _wal_checkpoint_sequence(wal)
                diagnosis.samples.append(await bench.incident(f"t{n}"))
                diagnosis.windows.append(timer.calls)
                diagnosis.wal_restarts.append(_wal_checkpoint_sequence(wal) != before)
            bench.store_timer = None
            bench.profile = profile
            profiled = [await bench.incident(f"p{n}") for n in range(PROFILED)]
    out = io.StringIO()
    pstats.Stats(profile, stream=out).strip_dirs().sort_stats("tottime").print_stats(15)
    diagnosis.profile = out.getvalue()
    diagnosis.profiled_median_us = statistics.median(s.first_step_ns for s in profiled) / 1_000
    return diagnosis


async def _without_autocheckpoint() -> list[Sample]:
    """``INCIDENTS`` durable incidents after warm-up, SQLite's WAL auto-checkpoint off."""
    with tempfile.TemporaryDirectory(prefix="turnkeeper-resume-no-checkpoint-") as name:
        async with AsyncExitStack() as stack:
            store = SqliteStore(Path(name) / DB_NAME, synchronous="NORMAL")
            bench = await _bench(stack, store, WARMUP + INCIDENTS)
            db = store._db  # private: the experiment sets a PRAGMA the store does not expose
            assert db is not None
            await db.execute("PRAGMA wal_autocheckpoint = 0")
            for n in range(WARMUP):
                await bench.incident(f"warm{n}")
            return [await bench.incident(f"s{n}") for n in range(INCIDENTS)]


def _store_table(diagnosis: Diagnosis, slow: list[int]) -> Table:
    table = Table(title="store calls inside the window (store-timed incidents)")
    table.add_column("store verb")
    table.add_column("calls / incident", justify="right")
    table.add_column("median µs", justify="right")
    table.add_column("max µs", justify="right")
    table.add_column("µs / incident", justify="right")
    table.add_column("µs / incident above target", justify="right")
    verbs = sorted({verb for window in diagnosis.windows for verb, _ in window})
    for verb in verbs:
        times = [ns for window in diagnosis.windows for v, ns in window if v == verb]
        in_slow = [ns for i in slow for v, ns in diagnosis.windows[i] if v == verb]
        table.add_row(
            verb,
            f"{len(times) / len(diagnosis.windows):.2f}",
            f"{statistics.median(times) / 1_000:,.0f}",
            f"{max(times) / 1_000:,.0f}",
            f"{sum(times) / len(diagnosis.windows) / 1_000:,.0f}",
            f"{sum(in_slow) / len(slow) / 1_000:,.0f}" if slow else "-",
        )
    return table


def _print_slow(console: Console, diagnosis: Diagnosis, slow: list[int]) -> None:
    """The incidents at or above the target: each one's slowest store call, any WAL restart."""
    first = [s.first_step_ns for s in diagnosis.samples]

    def share(indices: list[int]) -> str:
        store = sum(ns for i in indices for _, ns in diagnosis.windows[i])
        window = sum(first[i] for i in indices)
        return f"{store / window:.0%}" if window else "-"

    console.print(
        f"store calls' share of the window: {share(list(range(len(first))))} over all of them,"
        f" {share(slow)} over those at or above the target",
        highlight=False,
    )
    restarts = diagnosis.wal_restarts
    if any(restarts):
        console.print(
            f"SQLite restarted its WAL (after an auto-checkpoint) during {sum(restarts)} of the"
            f" {len(restarts)} incidents, and during {sum(restarts[i] for i in slow)} of the"
            f" {len(slow)} at or above the target",
            highlight=False,
        )
    for i in slow[:SHOWN]:
        verb, ns = max(diagnosis.windows[i], key=lambda call: call[1])
        restart = ", WAL restarted" if restarts[i] else ""
        console.print(
            f"  {first[i] / 1_000:,.0f} µs: its slowest store call {verb} {ns / 1_000:,.0f} µs"
            f"{restart}",
            highlight=False,
        )
    if len(slow) > SHOWN:
        console.print(f"  ... and {len(slow) - SHOWN} more", highlight=False)


def _print_diagnosis(console: Console, kind: str) -> None:
    diagnosis = anyio.run(_diagnose, STORES[kind])
    target_ns = TARGET_P99_US[kind] * 1_000
    first = [s.first_step_ns for s in diagnosis.samples]
    slow = [i for i, ns in enumerate(first) if ns >= target_ns]
    console.print(
        f"diagnosis of the {kind} miss, a fresh engine: {TIMED:,} more incidents with every store"
        f" call inside the window timed (p50 {_percentile_us(first, 0.5):,.0f} µs, p99"
        f" {_percentile_us(first, 0.99):,.0f} µs; {len(slow)} at or above the target):",
        highlight=False,
    )
    console.print(_store_table(diagnosis, slow))
    _print_slow(console, diagnosis, slow)
    if kind == DURABLE:
        plain = [s.first_step_ns for s in anyio.run(_without_autocheckpoint)]
        console.print(
            f"experiment: {INCIDENTS:,} incidents on a fresh engine with SQLite's WAL"
            " auto-checkpoint off (PRAGMA wal_autocheckpoint = 0 on the store's connection):"
            f" p50 {_percentile_us(plain, 0.5):,.0f} µs, p99 {_percentile_us(plain, 0.99):,.0f}"
            f" µs, {sum(ns >= target_ns for ns in plain)} at or above the target",
            highlight=False,
        )
    console.print(
        f"cProfile of {PROFILED} more incidents, enabled only inside the window (median"
        f" {diagnosis.profiled_median_us:,.0f} µs under cProfile); top 15 by own time (tottime):",
        highlight=False,
    )
    lines = [line for line in diagnosis.profile.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if "tottime" in line), 0)
    for line in lines[start : start + 16]:
        console.print("  " + line.strip()[:104], highlight=False, markup=False)


def main() -> int:
    """Measure, print the table and the verdicts; 0 when both p99 targets are met."""
    samples = anyio.run(_measure_all)
    figures = {kind: Figures.of(values) for kind, values in samples.items()}
    console = Console(width=110)
    table = Table(
        title=f"resume latency: withdraw -> the resumed stream's first model request, µs "
        f"({INCIDENTS:,} incidents after {WARMUP} warm-up)"
    )
    table.add_column("store")
    table.add_column("p50", justify="right")
    table.add_column("p99", justify="right")
    table.add_column("max", justify="right")
    table.add_column("target p99", justify="right")
    table.add_column("to stream-start p50 / p99 (info)", justify="right")
    for kind, figure in figures.items():
        table.add_row(
            kind,
            f"{figure.p50:,.0f}",
            f"{figure.p99:,.0f}",
            f"{figure.max:,.0f}",
            f"< {TARGET_P99_US[kind]:,.0f}",
            f"{figure.start_p50:,.0f} / {figure.start_p99:,.0f}",
        )
    console.print(table)
    missed: list[str] = []
    for kind, figure in figures.items():
        target = TARGET_P99_US[kind]
        ok = figure.p99 < target
        console.print(
            f"resume latency, {kind}: p99 {figure.p99:,.0f} µs (p50 {figure.p50:,.0f}), "
            f"target < {target:,.0f} µs: {'met' if ok else 'MISSED'}",
            highlight=False,
        )
        if not ok:
            missed.append(kind)
    for kind in missed:
        _print_diagnosis(console, kind)
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
