"""Per-step overhead with SQLite persistence, turnkeeper beside its peers (issue item 3).

The turn is the one of ``bench.peers_memory`` (N-1 no-op tool-call steps, then text), each
system writing to its own SQLite file in a fresh temporary folder:

* turnkeeper: a real :class:`~agent_session.Engine` over :class:`~persistence.SqliteStore`
  (WAL; ``synchronous`` NORMAL and FULL; every cut, envelope and receipt committed as the turn
  runs) on the real clock. One session per turn: ``send`` then ``wait_idle`` is timed.
* LangGraph: the graph of the in-memory comparison compiled with ``AsyncSqliteSaver``
  (``durability="sync"``: every checkpoint written before the next step starts).
* pydantic-ai: ``Agent.iter``; after every node, the new messages are appended to an aiosqlite
  table (WAL, ``synchronous=NORMAL``, autocommit: one commit per node that added messages).
* OpenAI Agents SDK: ``Runner.run`` with ``SQLiteSession`` on a file (its own defaults).

Runs are interleaved (each round runs one turn of every system, in a rotated order); every
figure is the median of the measured rounds. The machine's limits are measured in the same
process: one plain ``sqlite3`` autocommit INSERT (WAL, NORMAL and FULL), one aiosqlite call
(``SELECT 1``: the thread hop) and one aiosqlite autocommit INSERT (WAL NORMAL).

Targets (WAL NORMAL): turnkeeper under 1.5x one aiosqlite commit per step, and at least 8x
faster than the fastest durable peer. A miss prints what each step costs in store verbs and
aiosqlite calls, and the top of a cProfile of one turn.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sqlite3
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
from rich.console import Console
from rich.table import Table

from agent_session import Engine, EngineConfig
from bench import _peers
from bench.step_overhead import NoopTool
from persistence import SqliteStore
from persistence._sqlite import Synchronous
from stream_manager import ScriptedModel, ScriptStep, ScriptToolCall

SIZES = (10, 100)
RUNS = 5
WARMUP = 1
LIMIT_SAMPLES = 400
TARGET_COMMITS = 1.5
TARGET_RATIO = 8.0
TK_NORMAL = "turnkeeper SqliteStore WAL NORMAL"
TK_FULL = "turnkeeper SqliteStore WAL FULL"
_TOOL_STEP = ScriptStep(tool_calls=(ScriptToolCall(tool="noop"),))
_TEXT_STEP = ScriptStep(text="done")
#: The store port's verbs.
STORE_VERBS = ("commit", "load", "sessions", "scan_recoverable", "receipts")

#: One timed turn of N steps, given the round number; returns µs per step.
Turn = Callable[[int], Awaitable[float]]


# -- turnkeeper -------------------------------------------------------------------------------


def _script(steps: int, turns: int) -> list[ScriptStep]:
    return ([_TOOL_STEP] * (steps - 1) + [_TEXT_STEP]) * turns


async def _engine(
    stack: AsyncExitStack, folder: Path, steps: int, synchronous: Synchronous
) -> tuple[Engine, ScriptedModel]:
    model = ScriptedModel("M", _script(steps, WARMUP + RUNS + 1), record=False)
    store = SqliteStore(folder / f"turnkeeper-{synchronous}-{steps}.db", synchronous=synchronous)
    engine = Engine(
        store=store,
        models={"M": model},
        tools={"noop": NoopTool()},
        config=EngineConfig(max_stream_steps=steps),
    )
    await stack.enter_async_context(engine)
    return engine, model


async def _turnkeeper_turn(engine: Engine, model: ScriptedModel, steps: int, name: str) -> float:
    session = await engine.open_session(name, model="M")
    before = model.steps_played
    start = time.perf_counter_ns()
    session.send("go")
    await session.wait_idle()
    elapsed = (time.perf_counter_ns() - start) / steps / 1_000
    if model.steps_played - before != steps:
        raise AssertionError(f"the durable turnkeeper turn did not run {steps} steps")
    return elapsed


async def turnkeeper(
    stack: AsyncExitStack, folder: Path, steps: int, synchronous: Synchronous
) -> Turn:
    """A timed durable turnkeeper turn on one engine (a fresh session each round)."""
    engine, model = await _engine(stack, folder, steps, synchronous)

    async def turn(round_: int) -> float:
        return await _turnkeeper_turn(engine, model, steps, f"s{round_}")

    return turn


# -- peers ------------------------------------------------------------------------------------


async def langgraph(stack: AsyncExitStack, folder: Path, steps: int) -> Turn:
    """A timed LangGraph turn over AsyncSqliteSaver (a fresh thread each round)."""
    saver_module = _peers._m("langgraph.checkpoint.sqlite.aio")
    path = str(folder / f"langgraph-{steps}.db")
    saver = await stack.enter_async_context(saver_module.AsyncSqliteSaver.from_conn_string(path))

    async def turn(round_: int) -> float:
        app = _peers.langgraph_builder(steps).compile(checkpointer=saver)
        config = {"configurable": {"thread_id": f"t{round_}"}, "recursion_limit": 2 * steps + 5}
        start = time.perf_counter_ns()
        state = await app.ainvoke(_peers.langgraph_input(), config, durability="sync")
        elapsed = (time.perf_counter_ns() - start) / steps / 1_000
        _peers._check(len(state["messages"]) == 2 * steps, "durable LangGraph", steps)
        return elapsed

    return turn


async def pydantic_ai(stack: AsyncExitStack, folder: Path, steps: int) -> Turn:
    """A timed pydantic-ai turn whose new messages are appended to aiosqlite after each node."""
    adapter = _peers._m("pydantic_ai.messages").ModelMessagesTypeAdapter
    db = await _wal_connection(stack, folder / f"pydantic-ai-{steps}.db", "NORMAL")
    await db.execute("CREATE TABLE messages (run TEXT, seq INTEGER, body BLOB)")

    async def turn(round_: int) -> float:
        agent = _peers.pydantic_ai_agent(steps)
        limits = _peers.no_request_limit()
        written = 0
        start = time.perf_counter_ns()
        async with agent.iter("go", usage_limits=limits) as run:
            async for _node in run:
                history = run.ctx.state.message_history
                for seq in range(written, len(history)):
                    body = adapter.dump_json(history[seq : seq + 1])
                    await db.execute(
                        "INSERT INTO messages VALUES (?, ?, ?)", (f"r{round_}", seq, body)
                    )
                written = len(history)
        elapsed = (time.perf_counter_ns() - start) / steps / 1_000
        _peers._check(written == 2 * steps, "durable pydantic-ai", steps)
        return elapsed

    return turn


async def agents_sdk(stack: AsyncExitStack, folder: Path, steps: int) -> Turn:
    """A timed Agents SDK turn with SQLiteSession on a file (a fresh session id each round)."""
    agents = _peers._m("agents")
    path = str(folder / f"agents-sdk-{steps}.db")

    async def turn(round_: int) -> float:
        agent = _peers.agents_sdk_agent(steps)
        session = agents.SQLiteSession(f"s{round_}", db_path=path)
        start = time.perf_counter_ns()
        result = await agents.Runner.run(agent, "go", max_turns=steps + 1, session=session)
        elapsed = (time.perf_counter_ns() - start) / steps / 1_000
        session.close()
        _peers._check(len(result.to_input_list()) == 2 * steps, "durable Agents SDK", steps)
        return elapsed

    return turn


# -- the machine's limits ---------------------------------------------------------------------


async def _wal_connection(
    stack: AsyncExitStack, path: Path, synchronous: Synchronous
) -> aiosqlite.Connection:
    db = await aiosqlite.connect(path, isolation_level=None)
    stack.push_async_callback(db.close)
    await db.execute("PRAGMA journal_mode = WAL")
    await db.execute(f"PRAGMA synchronous = {synchronous}")
    return db


def _sqlite3_commit_us(path: Path, synchronous: Synchronous) -> float:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute(f"PRAGMA synchronous = {synchronous}")
        db.execute("CREATE TABLE t (x BLOB)")
        samples = []
        for _ in range(LIMIT_SAMPLES):
            start = time.perf_counter_ns()
            db.execute("INSERT INTO t VALUES (?)", (b"x" * 200,))
            samples.append(time.perf_counter_ns() - start)
        return statistics.median(samples) / 1_000
    finally:
        db.close()


async def limits(folder: Path) -> dict[str, float]:
    """The machine's floor, in µs: a plain commit, an aiosqlite hop, an aiosqlite commit."""
    figures = {
        "sqlite3 commit, WAL NORMAL": _sqlite3_commit_us(folder / "plain-normal.db", "NORMAL"),
        "sqlite3 commit, WAL FULL": _sqlite3_commit_us(folder / "plain-full.db", "FULL"),
    }
    async with AsyncExitStack() as stack:
        db = await _wal_connection(stack, folder / "aiosqlite.db", "NORMAL")
        await db.execute("CREATE TABLE t (x BLOB)")
        calls, commits = [], []
        for _ in range(LIMIT_SAMPLES):
            start = time.perf_counter_ns()
            await db.execute("SELECT 1")
            calls.append(time.perf_counter_ns() - start)
            start = time.perf_counter_ns()
            await db.execute("INSERT INTO t VALUES (?)", (b"x" * 200,))
            commits.append(time.perf_counter_ns() - start)
    figures["aiosqlite call (SELECT 1)"] = statistics.median(calls) / 1_000
    figures["aiosqlite commit, WAL NORMAL"] = statistics.median(commits) / 1_000
    return figures


# -- the run ----------------------------------------------------------------------------------


async def _systems(stack: AsyncExitStack, folder: Path, steps: int) -> dict[str, Turn]:
    systems = {
        TK_NORMAL: await turnkeeper(stack, folder, steps, "NORMAL"),
        TK_FULL: await turnkeeper(stack, folder, steps, "FULL"),
    }
    if _peers.LANGGRAPH.version() and _peers.LANGGRAPH_SQLITE.version():
        systems["LangGraph AsyncSqliteSaver (sync)"] = await langgraph(stack, folder, steps)
    if _peers.PYDANTIC_AI.version():
        systems["pydantic-ai + aiosqlite per step"] = await pydantic_ai(stack, folder, steps)
    if _peers.AGENTS_SDK.version():
        systems["Agents SDK SQLiteSession (file)"] = await agents_sdk(stack, folder, steps)
    return systems


async def _measure(folder: Path) -> tuple[dict[tuple[str, int], list[float]], list[str]]:
    samples: dict[tuple[str, int], list[float]] = {}
    names: list[str] = []
    for steps in SIZES:
        async with AsyncExitStack() as stack:
            systems = await _systems(stack, folder, steps)
            names = list(systems)
            for round_ in range(WARMUP + RUNS):
                shift = round_ % len(names)
                for name in names[shift:] + names[:shift]:
                    figure = await systems[name](round_)
                    if round_ >= WARMUP:
                        samples.setdefault((name, steps), []).append(figure)
    return samples, names


async def _run_all() -> tuple[dict[tuple[str, int], list[float]], list[str], dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="turnkeeper-bench-") as name:
        folder = Path(name)
        floor = await limits(folder)
        samples, names = await _measure(folder)
        return samples, names, floor


# -- the profile of a miss --------------------------------------------------------------------


def _count_verbs(store: SqliteStore, counts: Counter[str]) -> None:
    for verb in STORE_VERBS:
        original = getattr(store, verb)

        def counted(*args: Any, _original: Any = original, _verb: str = verb, **kw: Any) -> Any:
            counts[_verb] += 1
            return _original(*args, **kw)

        setattr(store, verb, counted)


async def _profiled_turn(steps: int) -> tuple[Counter[str], int, str, float, float]:
    """One WAL NORMAL turn: store verbs, aiosqlite hops and the top of its cProfile."""
    verbs: Counter[str] = Counter()
    hops = 0
    # Any: aiosqlite's private ``_execute`` (the one thread hop of every call) is untyped.
    original_execute: Any = aiosqlite.Connection._execute

    async def counted_execute(self: aiosqlite.Connection, fn: Any, *args: Any, **kw: Any) -> Any:
        nonlocal hops
        hops += 1
        return await original_execute(self, fn, *args, **kw)

    profile = cProfile.Profile()
    with tempfile.TemporaryDirectory(prefix="turnkeeper-profile-") as name:
        async with AsyncExitStack() as stack:
            engine, model = await _engine(stack, Path(name), steps, "NORMAL")
            await _turnkeeper_turn(engine, model, steps, "warm")
            assert isinstance(engine.store, SqliteStore)
            _count_verbs(engine.store, verbs)
            aiosqlite.Connection._execute = counted_execute  # type: ignore[method-assign]
            try:
                profile.enable()
                wall = await _turnkeeper_turn(engine, model, steps, "profiled")
                profile.disable()
            finally:
                aiosqlite.Connection._execute = original_execute  # type: ignore[method-assign]
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(8)
    table: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    waiting = sum(row[2] for key, row in table.items() if "poll" in key[2] and "epoll" in key[2])
    return verbs, hops, out.getvalue(), wall, waiting * 1e6 / steps


def _print_profile(console: Console, steps: int) -> None:
    verbs, hops, profile, wall, waiting = anyio.run(_profiled_turn, steps)
    per_step = ", ".join(f"{verb} {count / steps:.2f}" for verb, count in verbs.most_common())
    console.print(
        f"profile of one WAL NORMAL turn of {steps} steps (under cProfile: {wall:,.0f} µs/step, of"
        f" which {waiting:,.0f} µs/step the event loop waits in epoll for aiosqlite's thread):"
        f" {hops / steps:.2f} aiosqlite calls per step; store verbs per step: {per_step}",
        highlight=False,
    )
    lines = [line for line in profile.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if "tottime" in line), 0)
    console.print("top of cProfile by own time (tottime):", highlight=False)
    for line in lines[start : start + 9]:
        console.print("  " + line.strip()[:104], highlight=False, markup=False)


def main() -> int:
    """Measure, print the tables and the verdicts; 0 when turnkeeper meets both targets."""
    samples, names, floor = anyio.run(_run_all)
    console = Console(width=110)
    machine = Table(title=f"the machine's limits, same run (median of {LIMIT_SAMPLES})")
    machine.add_column("operation")
    machine.add_column("µs", justify="right")
    for operation, figure in floor.items():
        machine.add_row(operation, f"{figure:,.1f}")
    console.print(machine)
    table = Table(title=f"per-step overhead, durable: µs per step (median of {RUNS} interleaved)")
    table.add_column("system")
    medians = {key: statistics.median(values) for key, values in samples.items()}
    for steps in SIZES:
        table.add_column(f"N={steps} µs/step", justify="right")
        table.add_column(f"N={steps} / tk NORMAL", justify="right")
    for name in names:
        row = [name]
        for steps in SIZES:
            figure = medians[name, steps]
            row += [f"{figure:,.0f}", f"{figure / medians[TK_NORMAL, steps]:,.1f}x"]
        table.add_row(*row)
    console.print(table)
    commit = floor["aiosqlite commit, WAL NORMAL"]
    met = True
    missed_at: list[int] = []
    for steps in SIZES:
        own = medians[TK_NORMAL, steps]
        ok = own < TARGET_COMMITS * commit
        verdict = (
            f"N={steps}: turnkeeper WAL NORMAL {own:,.0f} µs/step = {own / commit:.1f} aiosqlite "
            f"commits, target < {TARGET_COMMITS}: {'met' if ok else 'MISSED'}"
        )
        peers = [medians[name, steps] for name in names if not name.startswith("turnkeeper")]
        if peers:
            ratio = min(peers) / own
            ok_ratio = ratio >= TARGET_RATIO
            verdict += f"; fastest durable peer / turnkeeper {ratio:.2f}x, target >= "
            verdict += f"{TARGET_RATIO:.0f}x: {'met' if ok_ratio else 'MISSED'}"
            ok = ok and ok_ratio
        if not ok:
            missed_at.append(steps)
        met = met and ok
        console.print(verdict)
    if missed_at:
        _print_profile(console, missed_at[-1])
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
