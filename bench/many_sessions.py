"""Many sessions: durable steps per second with 1,000 concurrent sessions (issue item 5).

The workload: one :class:`~agent_session.Engine` in one process, on the real clock, over one
store; N sessions (1,000 by default, ``--sessions N``) are opened first (not timed), then every
session is sent ``go`` (``session.send``, one after the other, without awaiting) and
``engine.wait_idle()`` is awaited. Each session runs one turn of 20 model steps: 19 steps that
each call the no-op client tool (``bench.step_overhead.NoopTool``), then a text step. The model
is the ``ScriptedModel`` of ``stream_manager``, one per session (its script is consumed in
request order, so sessions must not share one), behind a wrapper that routes each request to
its session's model by the request's stream id and stamps ``perf_counter_ns`` when the request
arrives.

Figures, per store:

* durable steps/s: total model steps of all sessions (N x 20, checked against what the models
  played) divided by the wall time from the first ``send`` to ``engine.wait_idle()`` returning
  (every session idle);
* step latency p50 / p99: for each session, the time between consecutive model requests (19
  intervals per session: the wall time one step of one session takes, tool call and commits
  included, under the load of all the others), pooled over all sessions and all measured runs
  (the time from ``send`` to the first request and from the last request to idle is not in it);
* for information: transactions per step and writes per transaction (``SqliteStore.commits``,
  when the store has that counter), the cyclic garbage collector's share of the timed wall
  time (``gc.callbacks``) and the process's peak RSS.

Stores: ``persistence.SqliteStore`` in a fresh file in a temporary folder (WAL, ``synchronous``
NORMAL), with ``group_commit=False`` and ``group_commit=True`` (writes of different sessions
share one transaction; when the installed ``SqliteStore`` has no such keyword it is omitted, the
run says "group commit not available" and both rows run the same store), and
``persistence.MemoryStore`` for reference (not durable). One warm-up run in memory comes first;
then each of the measured rounds (3 by default, ``--runs``) runs the three in a rotated order,
with a fresh engine and store every run; steps/s is the median over the rounds.

Target: at least 20,000 durable steps/s with group commit. A miss prints what dominates: the
store verbs and aiosqlite calls per step, how long the event loop waited in epoll, and the top
20 of a cProfile (by own time) of one more group-commit run of N sessions.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import inspect
import io
import itertools
import pstats
import resource
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
from rich.console import Console
from rich.table import Table

from agent_session import Engine, EngineConfig
from bench.durable import STORE_VERBS
from bench.step_overhead import NoopTool
from persistence import MemoryStore, SqliteStore, Store
from stream_manager import ModelRequest, Part, ScriptedModel, ScriptStep, ScriptToolCall

SESSIONS = 1_000
STEPS = 20
RUNS = 3
TARGET_STEPS_PER_S = 20_000.0
PROFILE_TOP = 20
MODEL = "M"
_SCRIPT = (ScriptStep(tool_calls=(ScriptToolCall(tool="noop"),)),) * (STEPS - 1) + (
    ScriptStep(text="done"),
)

MEMORY = "MemoryStore (reference)"
NO_GROUP = "SQLite group_commit=False"
GROUP = "SQLite group_commit=True"
CONFIGS = (NO_GROUP, GROUP, MEMORY)


class StampedModel:
    """One ``ScriptedModel`` per session behind one model id; stamps every request's arrival."""

    def __init__(self, model_id: str) -> None:
        self._id = model_id
        self._scripts: dict[str, ScriptedModel] = {}
        #: perf_counter_ns at the arrival of each model request, by session.
        self.stamps: dict[str, list[int]] = {}

    @property
    def id(self) -> str:
        """The model's id."""
        return self._id

    def stream_step(self, request: ModelRequest) -> AsyncIterator[Part]:
        """Stamp the request, then play the next step of its session's script."""
        arrived = time.perf_counter_ns()
        session = request.stream.rpartition("/")[0]
        model = self._scripts.get(session)
        if model is None:
            model = self._scripts[session] = ScriptedModel(self._id, _SCRIPT, record=False)
            self.stamps[session] = []
        self.stamps[session].append(arrived)
        return model.stream_step(request)

    def steps_played(self) -> dict[str, int]:
        """Scripted steps consumed, by session."""
        return {session: model.steps_played for session, model in self._scripts.items()}


@dataclass(slots=True)
class RunResult:
    """One run of the workload."""

    steps: int
    wall_ns: int
    #: Time between consecutive model requests of one session, every session.
    latencies_ns: list[int]
    #: Transactions and writes the store committed in the timed part, when it counts them.
    commits: tuple[int, int] | None = None
    #: Time spent in the cyclic garbage collector in the timed part, and what it freed.
    gc_ns: int = 0
    gc_collected: int = 0

    @property
    def steps_per_s(self) -> float:
        """Total model steps divided by the wall time."""
        return self.steps / (self.wall_ns / 1e9)


class GcClock:
    """Adds up the time of every cyclic garbage collection while it is entered."""

    def __init__(self) -> None:
        self.ns = 0
        self.collected = 0
        self._started = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter_ns()
        else:
            self.ns += time.perf_counter_ns() - self._started
            self.collected += info["collected"]

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


@dataclass(slots=True)
class Probe:
    """Counts store verbs and aiosqlite calls and profiles the timed part of one run."""

    verbs: Counter[str] = field(default_factory=Counter)
    hops: int = 0
    profile: cProfile.Profile = field(default_factory=cProfile.Profile)
    _original: Any = None

    def start(self, store: Store) -> None:
        """Count from now on, and start the profiler."""
        for verb in STORE_VERBS if isinstance(store, SqliteStore) else ():
            original_verb: Any = getattr(store, verb)

            def counted_verb(
                *args: Any, _verb: str = verb, _of: Any = original_verb, **kw: Any
            ) -> Any:
                self.verbs[_verb] += 1
                return _of(*args, **kw)

            setattr(store, verb, counted_verb)
        # Any: aiosqlite's private ``_execute`` (the one thread hop of every call) is untyped.
        original: Any = aiosqlite.Connection._execute
        self._original = original
        probe = self

        async def counted(self: aiosqlite.Connection, fn: Any, *args: Any, **kw: Any) -> Any:
            probe.hops += 1
            return await original(self, fn, *args, **kw)

        aiosqlite.Connection._execute = counted  # type: ignore[method-assign]
        self.profile.enable()

    def stop(self) -> None:
        """Stop the profiler and the counting of aiosqlite calls."""
        self.profile.disable()
        if self._original is not None:
            aiosqlite.Connection._execute = self._original  # type: ignore[method-assign]
            self._original = None


# -- the stores -------------------------------------------------------------------------------


def group_commit_available() -> bool:
    """Whether the installed ``SqliteStore`` takes the ``group_commit`` keyword."""
    return "group_commit" in inspect.signature(SqliteStore).parameters


def _store(path: Path, group: bool) -> SqliteStore:
    """A WAL NORMAL store at ``path``; ``group_commit=group`` when the keyword exists."""
    kwargs: dict[str, Any] = {"synchronous": "NORMAL"}
    if group_commit_available():
        kwargs["group_commit"] = group
    return SqliteStore(path, **kwargs)


def _factory(config: str, folder: Path, run: int) -> Callable[[], Store]:
    if config == MEMORY:
        return MemoryStore
    group = config == GROUP
    path = folder / f"many-{'group' if group else 'nogroup'}-{run}.db"
    return lambda: _store(path, group)


# -- the workload -----------------------------------------------------------------------------


async def workload(
    store: Store,
    sessions: int,
    probe: Probe | None = None,
    *,
    prefix: str = "s",
    ready: Callable[[], Awaitable[None]] | None = None,
) -> RunResult:
    """Open ``sessions`` sessions, send to each, wait for all to be idle; time the sends-to-idle.

    ``prefix`` starts every session id (processes sharing one database need ids of their own);
    ``ready`` is awaited once the sessions are open, before the timed part (a barrier of
    several processes).
    """
    model = StampedModel(MODEL)
    engine = Engine(
        store=store,
        models={MODEL: model},
        tools={"noop": NoopTool()},
        config=EngineConfig(max_stream_steps=STEPS),
    )
    async with engine:
        opened = [await engine.open_session(f"{prefix}{i}", model=MODEL) for i in range(sessions)]
        if ready is not None:
            await ready()
        if probe is not None:
            probe.start(store)
        before = _commits(store)
        try:
            with GcClock() as collector:
                start = time.perf_counter_ns()
                for session in opened:
                    session.send("go")
                await engine.wait_idle()
                wall = time.perf_counter_ns() - start
        finally:
            if probe is not None:
                probe.stop()
        after = _commits(store)
    played = model.steps_played()
    short = {session: n for session, n in played.items() if n != STEPS}
    if len(played) != sessions or short:
        raise AssertionError(
            f"{len(played)} of {sessions} sessions reached the model; sessions that did not play"
            f" {STEPS} steps: {dict(list(short.items())[:5])}"
        )
    latencies = [
        later - earlier
        for stamps in model.stamps.values()
        for earlier, later in itertools.pairwise(stamps)
    ]
    commits = None
    if before is not None and after is not None:
        commits = (after[0] - before[0], after[1] - before[1])
    return RunResult(
        steps=sum(played.values()),
        wall_ns=wall,
        latencies_ns=latencies,
        commits=commits,
        gc_ns=collector.ns,
        gc_collected=collector.collected,
    )


def _commits(store: Store) -> tuple[int, int] | None:
    """``SqliteStore.commits`` (transactions, writes) when the store counts them."""
    # getattr: the counter comes with group commit; older stores have none.
    value = getattr(store, "commits", None)
    if isinstance(value, tuple) and len(value) == 2:
        return int(value[0]), int(value[1])
    return None


async def _measure(sessions: int, runs: int, folder: Path) -> dict[str, list[RunResult]]:
    # One warm-up run in memory (imports, caches), then the measured rounds, rotated.
    await workload(MemoryStore(), min(sessions, 100))
    results: dict[str, list[RunResult]] = {config: [] for config in CONFIGS}
    for run in range(runs):
        shift = run % len(CONFIGS)
        for config in CONFIGS[shift:] + CONFIGS[:shift]:
            store = _factory(config, folder, run)()
            results[config].append(await workload(store, sessions))
    return results


def _run_all(sessions: int, runs: int) -> dict[str, list[RunResult]]:
    with tempfile.TemporaryDirectory(prefix="turnkeeper-many-") as name:
        return anyio.run(_measure, sessions, runs, Path(name))


# -- the profile of a miss --------------------------------------------------------------------


async def _profiled(sessions: int, folder: Path) -> tuple[Probe, RunResult]:
    probe = Probe()
    result = await workload(_store(folder / "many-profiled.db", True), sessions, probe)
    return probe, result


def _print_profile(console: Console, sessions: int) -> None:
    with tempfile.TemporaryDirectory(prefix="turnkeeper-many-profile-") as name:
        probe, result = anyio.run(_profiled, sessions, Path(name))
    steps = result.steps
    out = io.StringIO()
    stats = pstats.Stats(probe.profile, stream=out).strip_dirs()
    stats.sort_stats("tottime").print_stats(PROFILE_TOP)
    table: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    waiting = sum(row[2] for key, row in table.items() if "poll" in key[2] and "epoll" in key[2])
    per_step = ", ".join(f"{verb} {count / steps:.2f}" for verb, count in probe.verbs.most_common())
    console.print(
        f"profile of one group-commit run of {sessions} sessions x {STEPS} steps (under cProfile:"
        f" {result.steps_per_s:,.0f} steps/s; the event loop waited in epoll"
        f" {waiting * 1e6 / steps:,.1f} µs per step): {probe.hops / steps:.2f} aiosqlite calls"
        f" per step; store verbs per step: {per_step or 'none counted'}",
        highlight=False,
    )
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if "tottime" in line), 0)
    console.print(f"top {PROFILE_TOP} of cProfile by own time (tottime):", highlight=False)
    for line in lines[start : start + PROFILE_TOP + 1]:
        console.print("  " + line.strip()[:104], highlight=False, markup=False)


# -- the report -------------------------------------------------------------------------------


def _ms(values_ns: list[int], quantile: int) -> float:
    """The ``quantile``-th percentile of ``values_ns``, in milliseconds."""
    if len(values_ns) < 2:
        return float(values_ns[0]) / 1e6 if values_ns else float("nan")
    return statistics.quantiles(values_ns, n=100, method="inclusive")[quantile - 1] / 1e6


def _commit_figures(results: list[RunResult]) -> tuple[str, str]:
    """Transactions per model step and writes per transaction, over all runs."""
    counted = [r for r in results if r.commits is not None and r.commits[0]]
    if not counted:
        return "-", "-"
    transactions = sum(r.commits[0] for r in counted if r.commits is not None)
    writes = sum(r.commits[1] for r in counted if r.commits is not None)
    steps = sum(r.steps for r in counted)
    return f"{transactions / steps:.3f}", f"{writes / transactions:.1f}"


def _gc_share(results: list[RunResult]) -> float:
    """The cyclic garbage collector's share of the timed wall time, over all runs."""
    return sum(r.gc_ns for r in results) / sum(r.wall_ns for r in results)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.many_sessions", description=__doc__)
    parser.add_argument("--sessions", type=int, default=SESSIONS, help="concurrent sessions")
    parser.add_argument("--runs", type=int, default=RUNS, help="measured rounds")
    arguments = parser.parse_args(argv)
    if arguments.sessions < 1 or arguments.runs < 1:
        parser.error("--sessions and --runs must be at least 1")
    return arguments


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table and the verdict; 0 when group commit meets the target."""
    arguments = _arguments(argv)
    sessions: int = arguments.sessions
    runs: int = arguments.runs
    console = Console(width=110)
    available = group_commit_available()
    if not available:
        console.print(
            "group commit not available: SqliteStore takes no group_commit keyword, so both"
            " SqliteStore rows run the same store",
            highlight=False,
        )
    results = _run_all(sessions, runs)
    rates = {
        config: statistics.median(r.steps_per_s for r in results[config]) for config in CONFIGS
    }
    table = Table(
        title=f"many sessions: {sessions:,} concurrent sessions x {STEPS} steps, one engine,"
        f" SQLite WAL NORMAL (steps/s: median of {runs} rotated runs; latency: every step)"
    )
    table.add_column("store", no_wrap=True)
    table.add_column("steps/s", justify="right")
    table.add_column("wall s", justify="right")
    table.add_column("step p50 ms", justify="right")
    table.add_column("step p99 ms", justify="right")
    table.add_column("txn/step", justify="right")
    table.add_column("writes/txn", justify="right")
    table.add_column(f"target {TARGET_STEPS_PER_S / 1000:.0f}k/s", justify="center")
    for config in CONFIGS:
        latencies = [value for r in results[config] for value in r.latencies_ns]
        rate = rates[config]
        verdict = "-" if config == MEMORY else "met" if rate >= TARGET_STEPS_PER_S else "MISSED"
        table.add_row(
            config,
            f"{rate:,.0f}",
            f"{statistics.median(r.wall_ns for r in results[config]) / 1e9:.2f}",
            f"{_ms(latencies, 50):,.1f}",
            f"{_ms(latencies, 99):,.1f}",
            *_commit_figures(results[config]),
            verdict,
        )
    console.print(table)
    gain = rates[GROUP] / rates[NO_GROUP]
    console.print(
        f"group commit gain: {gain:.2f}x (group_commit=True ÷ group_commit=False steps/s)"
        + ("" if available else " — group commit not available, both rows are the same store"),
        highlight=False,
    )
    shares = "; ".join(f"{config} {_gc_share(results[config]):.0%}" for config in CONFIGS)
    freed = sum(r.gc_collected for config in CONFIGS for r in results[config])
    console.print(
        f"cyclic GC's share of the timed wall time: {shares} (objects it freed: {freed:,})",
        highlight=False,
    )
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    console.print(
        f"in memory ÷ durable with group commit: {rates[MEMORY] / rates[GROUP]:.2f}x;"
        f" peak RSS of the process: {peak_mib:,.0f} MiB",
        highlight=False,
    )
    met = rates[GROUP] >= TARGET_STEPS_PER_S
    console.print(
        f"{sessions:,} sessions, SqliteStore WAL NORMAL with group commit: {rates[GROUP]:,.0f}"
        f" durable steps/s, target >= {TARGET_STEPS_PER_S:,.0f}: {'met' if met else 'MISSED'}"
        + ("" if available else " (group commit not available)"),
        highlight=False,
    )
    if not met:
        _print_profile(console, sessions)
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
