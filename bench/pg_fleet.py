"""Many engine processes on one PostgreSQL: steps/s, a step's durable write, failover, recovery.

Starts a throwaway PostgreSQL server (``tests/pg_server.py``: ``fsync`` and
``synchronous_commit`` on, a Unix socket) and measures (issue 26):

* **steps/s, four processes over 1,000 sessions**: four engine processes
  (``python -m bench.pg_fleet --worker``), each with its own ``PostgresStore`` and 250
  sessions of ``bench.many_sessions``'s turn (19 steps calling a no-op tool, then a text
  step). Every process opens its sessions, then all start together (a barrier on standard
  input); the figure is every process's model steps over the wall time from the first start
  to the last end. p50 / p99 of a step's durable write: the time of every ``commit`` of every
  process (group commit shares one transaction among the commits that arrive while one is in
  flight). Beside it, the same turn on ``SqliteStore`` in one process (1,000 sessions).
* **kill -9 failover**: a holder process (``tests/pg_worker.py``, the default 10 s lease) runs
  a turn whose tool call hangs; it is killed with ``SIGKILL``; a peer engine claiming every
  0.5 s (the default) takes the turn up. The figure is the time from the kill to the peer's
  ``recovered`` event (target: within the lease plus 1 s).
* **graceful handoff**: the same holder closes its engine cleanly instead (its leases go back
  at once); the time from its exit to the peer's ``recovered`` (target: under 1 s).
* **recovery of 10,000 owed sessions split over four processes**: 10,000 sessions each owing
  a cut; four engine processes start together with a claim limit of 2,500 each; the figure is
  the time from their start to the last ``recovered`` turn answered.

Targets: at least 5,000 steps/s in aggregate, a step's write p99 under 20 ms, failover within
the lease plus 1 s, handoff under 1 s. The process exits non-zero when one is missed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import psycopg
from rich.console import Console
from rich.table import Table

from agent_session import Engine, EngineConfig, Recovered
from bench.many_sessions import STEPS, workload
from persistence import Boundary, Committed, SqliteStore
from persistence.postgres import DEFAULT_LEASE_S, PostgresStore
from stream_manager import ScriptedModel, ScriptStep, StreamEnded, SystemClock
from tests import pg_server
from tests.agent_session.support import HookTool

ROOT = Path(__file__).resolve().parent.parent
PROCESSES = 4
SESSIONS = 1_000
OWED = 10_000
TARGET_STEPS_PER_S = 5_000.0
TARGET_P99_MS = 20.0
TARGET_HANDOFF_S = 1.0


class TimedStore(PostgresStore):
    """A ``PostgresStore`` that times every commit (what one durable write takes)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.times_ns: list[int] = []

    async def commit(self, session: str, boundary: Boundary, *, owner: str | None) -> Committed:
        began = time.perf_counter_ns()
        try:
            return await super().commit(session, boundary, owner=owner)
        finally:
            self.times_ns.append(time.perf_counter_ns() - began)


# -- the worker processes -----------------------------------------------------------------------


async def _worker(url: str, prefix: str, sessions: int) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)  # what went wrong, if anything
    store = TimedStore(url)
    went: list[float] = []

    async def barrier() -> None:
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        went.append(time.monotonic())
        store.times_ns.clear()  # the timed part only

    result = await workload(store, sessions, prefix=prefix, ready=barrier)
    print(
        json.dumps(
            {
                "steps": result.steps,
                "start": went[0],
                "end": went[0] + result.wall_ns / 1e9,
                "writes_ns": store.times_ns,
            }
        ),
        flush=True,
    )


def _together(commands: list[list[str]]) -> list[dict[str, Any]]:
    """Start a process per command, let them all go at once (a barrier), their JSON reports."""
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.pg_fleet", *command],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for command in commands
    ]
    for worker in workers:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "ready"
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()
    return [json.loads(w.communicate(timeout=900)[0].strip().splitlines()[-1]) for w in workers]


def _fleet(url: str) -> dict[str, Any]:
    """Four worker processes over 1,000 sessions, started together; their pooled figures."""
    share = SESSIONS // PROCESSES
    reports = _together([["--worker", url, f"p{n}-", str(share)] for n in range(PROCESSES)])
    steps = sum(r["steps"] for r in reports)
    wall = max(r["end"] for r in reports) - min(r["start"] for r in reports)
    writes = [value for r in reports for value in r["writes_ns"]]
    return {"steps": steps, "wall": wall, "writes": writes}


async def _sqlite_turn() -> dict[str, Any]:
    """The same turn on ``SqliteStore`` in one process, 1,000 sessions."""
    with tempfile.TemporaryDirectory(prefix="turnkeeper-fleet-") as folder:
        result = await workload(SqliteStore(Path(folder) / "t.db"), SESSIONS)
    return {"steps": result.steps, "wall": result.wall_ns / 1e9}


# -- failover and handoff -----------------------------------------------------------------------


async def _peer_recovers(url: str, after: Any) -> float:
    """Start a peer engine, run ``after()`` (the holder's end); seconds until it recovered."""
    recovered = anyio.Event()
    clock = SystemClock()
    engine = Engine(
        store=PostgresStore(url),
        models={"M": ScriptedModel("M", [ScriptStep(text="taken up")], clock=clock)},
        tools={"bash": HookTool("bash")},
        clock=clock,
        config=EngineConfig(max_stream_steps=6),
        observers=[lambda e: recovered.set() if isinstance(e, Recovered) else None],
    )
    async with engine:
        ended = after()
        with anyio.fail_after(60):
            await recovered.wait()
        return time.monotonic() - float(ended)


def _holder(url: str, session: str, fifo: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.pg_worker", url, session, str(fifo), "--lease", "10"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "tool-started"
    return holder


def _failover(url: str) -> float:
    with tempfile.TemporaryDirectory(prefix="turnkeeper-fifo-") as folder:
        fifo = Path(folder) / "tool.fifo"
        os.mkfifo(fifo)
        holder = _holder(url, "failover", fifo)

        def kill() -> float:
            holder.send_signal(signal.SIGKILL)
            at = time.monotonic()
            holder.communicate(timeout=10)
            return at

        return anyio.run(_peer_recovers, url, kill)


def _handoff(url: str) -> float:
    """The holder asks for a clean close: its engine ends, its leases go back."""
    with tempfile.TemporaryDirectory(prefix="turnkeeper-fifo-") as folder:
        fifo = Path(folder) / "tool.fifo"
        os.mkfifo(fifo)
        holder = _holder(url, "handoff", fifo)

        def close() -> float:
            holder.send_signal(signal.SIGTERM)
            holder.communicate(timeout=30)
            return time.monotonic()

        return anyio.run(_peer_recovers, url, close)


# -- recovery of 10,000 owed sessions -----------------------------------------------------------


def _seed_owed(url: str, count: int) -> None:
    """``count`` sessions each owing a cut, written in bulk (as a crashed fleet leaves them)."""
    cut = (
        b'{"remaining":3,"model":"M","requested_model":"M","refused_models":[],"chain":[],'
        b'"state":"owed"}'
    )
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cursor:
        sessions = [(f"o{n:05d}", b'{"id":"o%05d","model":"M"}' % n) for n in range(count)]
        cursor.executemany("INSERT INTO sessions (id, record) VALUES (%s, %s)", sessions)
        rows: list[tuple[object, ...]] = []
        for sid, _ in sessions:
            rows.append((sid, 1, f"{sid}:r1", "user", None, None, None, b'{"text":"go"}', 1))
            rows.append(
                (sid, 2, f"{sid}:r2", "assistant", f"{sid}/1", "owed", cut, b'{"text":"cut"}', 1)
            )
        cursor.executemany(
            "INSERT INTO history_rows (session, seq, row_id, kind, stream, cut_state, cut, body,"
            " epoch) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            rows,
        )
        envelope = b'{"session":"%s","stream":"%s/1","model":"M","budget":8,"cause":"send"}'
        cursor.executemany(
            "INSERT INTO turn_envelopes (session, stream, record) VALUES (%s, %s, %s)",
            [(sid, f"{sid}/1", envelope % (sid.encode(), sid.encode())) for sid, _ in sessions],
        )


async def _recoverer(url: str, share: int) -> None:
    answered = 0
    done = anyio.Event()

    def observe(event: Any) -> None:
        nonlocal answered
        if isinstance(event, StreamEnded):
            answered += 1
            if answered >= share:
                done.set()

    clock = SystemClock()
    engine = Engine(
        store=PostgresStore(url),
        models={"M": ScriptedModel("M", [ScriptStep(text="done")] * share, clock=clock)},
        clock=clock,
        config=EngineConfig(max_stream_steps=8, claim_limit=share, claim_every_s=0.5),
        observers=[observe],
    )
    print("ready", flush=True)
    await anyio.to_thread.run_sync(sys.stdin.readline)
    began = time.monotonic()
    async with engine:
        with anyio.fail_after(600):
            await done.wait()
        await engine.wait_idle()
    print(json.dumps({"start": began, "end": time.monotonic(), "answered": answered}), flush=True)


def _recovery(url: str) -> float:
    _seed_owed(url, OWED)
    share = OWED // PROCESSES
    reports = _together([["--recoverer", url, str(share)] for _ in range(PROCESSES)])
    assert sum(r["answered"] for r in reports) == OWED, reports
    return float(max(r["end"] for r in reports) - min(r["start"] for r in reports))


# -- the table ----------------------------------------------------------------------------------


def _database(server: pg_server.PgServer, name: str) -> str:
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = server.url(name)
    anyio.run(_migrate, url)
    return url


async def _migrate(url: str) -> None:
    async with PostgresStore(url):
        pass


def _ms(values_ns: list[int], quantile: int) -> float:
    return statistics.quantiles(values_ns, n=100, method="inclusive")[quantile - 1] / 1e6


def main(argv: list[str] | None = None) -> int:
    """Measure and print the table; 0 when every target is met."""
    parser = argparse.ArgumentParser(prog="python -m bench.pg_fleet", description=__doc__)
    parser.add_argument("--worker", nargs=3, metavar=("URL", "PREFIX", "SESSIONS"))
    parser.add_argument("--recoverer", nargs=2, metavar=("URL", "SHARE"))
    arguments = parser.parse_args(argv)
    if arguments.worker:
        url, prefix, sessions = arguments.worker
        anyio.run(_worker, url, prefix, int(sessions))
        return 0
    if arguments.recoverer:
        url, share = arguments.recoverer
        anyio.run(_recoverer, url, int(share))
        return 0
    console = Console(width=120)
    server = pg_server.start()
    try:
        fleet = _fleet(_database(server, "fleet"))
        sqlite = anyio.run(_sqlite_turn)
        failover = _failover(_database(server, "failover"))
        handoff = _handoff(_database(server, "handoff"))
        recovery = _recovery(_database(server, "recovery"))
    finally:
        server.stop()
    rate = fleet["steps"] / fleet["wall"]
    p50, p99 = _ms(fleet["writes"], 50), _ms(fleet["writes"], 99)
    table = Table(title="many engine processes on one PostgreSQL (synchronous_commit on)")
    table.add_column("figure")
    table.add_column("measured", justify="right")
    table.add_column("target", justify="right")
    table.add_column("verdict")
    rows = [
        (
            f"steps/s, {PROCESSES} processes x {SESSIONS // PROCESSES} sessions x {STEPS} steps",
            f"{rate:,.0f}",
            f">= {TARGET_STEPS_PER_S:,.0f}",
            rate >= TARGET_STEPS_PER_S,
        ),
        ("a step's durable write p50 / p99, ms", f"{p50:.2f} / {p99:.2f}", "p99 < 20", p99 < 20),
        (
            f"the same turn on SqliteStore, one process, {SESSIONS} sessions, steps/s",
            f"{sqlite['steps'] / sqlite['wall']:,.0f}",
            "-",
            None,
        ),
        (
            f"kill -9 failover, lease {DEFAULT_LEASE_S:.0f} s, s",
            f"{failover:.2f}",
            f"<= {DEFAULT_LEASE_S + 1:.0f}",
            failover <= DEFAULT_LEASE_S + 1,
        ),
        ("graceful handoff, s", f"{handoff:.2f}", "< 1", handoff < TARGET_HANDOFF_S),
        (
            f"recovery of {OWED:,} owed sessions over {PROCESSES} processes, s",
            f"{recovery:.2f}",
            "-",
            None,
        ),
    ]
    missed = False
    for figure, measured, target, ok in rows:
        verdict = "-" if ok is None else "met" if ok else "MISSED"
        missed |= ok is False
        table.add_row(figure, measured, target, verdict)
    console.print(table)
    console.print(f"durable writes timed: {len(fleet['writes']):,}", highlight=False)
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
