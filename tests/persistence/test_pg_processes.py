"""Real engine processes on one PostgreSQL: kill -9 and SIGSTOP of a lease holder (LS-3, LS-8).

Each holder is a ``tests/pg_worker.py`` process with a 2 s lease whose turn's tool call blocks
on a named pipe the test holds. The peer is an engine in this process claiming every 0.2 s.
The waits are on events and on the worker's output lines, each bounded; the only time that
passes is the lease running out on the database's clock, which is what failover is.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from agent_session import Engine, EngineConfig, Recovered
from persistence import OpState
from persistence.postgres import PostgresStore
from stream_manager import ScriptedModel, ScriptStep, SystemClock
from tests.agent_session.support import HookTool
from tests.agent_session.test_engine_leases import Seen
from tests.pg_kit import sql

ROOT = Path(__file__).resolve().parents[2]
LEASE_S = 2.0


class Worker:
    """A holder process; its standard output read line by line."""

    def __init__(self, url: str, session: str, fifo: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.pg_worker", url, session, str(fifo), "--lease", "2"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    async def line(self) -> str:
        """The next line it prints (a worker that exits first fails the test with its stderr)."""
        assert self.process.stdout is not None
        with anyio.fail_after(30):
            read = await anyio.to_thread.run_sync(self.process.stdout.readline)
        if not read:
            _, err = self.process.communicate(timeout=10)
            pytest.fail(f"the worker ended early: {err[-2000:]}")
        return read.strip()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a stopped process dies only once woken
            self.process.kill()
        self.process.communicate(timeout=10)  # and its pipes are closed


def peer(url: str, seen: Seen) -> Engine:
    clock = SystemClock()
    return Engine(
        store=PostgresStore(url, lease=LEASE_S),
        models={"M": ScriptedModel("M", [ScriptStep(text="the peer's answer")], clock=clock)},
        tools={"bash": HookTool("bash")},
        clock=clock,
        config=EngineConfig(max_stream_steps=6, claim_every_s=0.2),
        observers=[seen],
    )


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "tool.fifo"
    os.mkfifo(path)
    return path


@pytest.mark.timeout(120)
async def test_ls8_kill_9_of_a_holder_mid_tool_call_fails_over_after_the_lease(
    pg_url: str, fifo: Path
) -> None:
    worker = Worker(pg_url, "s1", fifo)
    try:
        assert await worker.line() == "tool-started"
        assert sql(pg_url, "SELECT state, epoch FROM operations") == [("running", 1)]
        worker.process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        worker.process.wait(timeout=10)
        seen = Seen()
        async with peer(pg_url, seen) as engine:
            await seen.wait_for(lambda e: isinstance(e, Recovered))
            failover = time.monotonic() - killed
            await engine.wait_idle()
            # The call the dead holder had running is indeterminate, once, never re-run.
            (receipt,) = (await engine.store.receipts("s1")).records
            assert receipt.state is OpState.INDETERMINATE
            assert sql(pg_url, "SELECT count(*), max(epoch) FROM operations") == [(1, 2)]
            kinds = [k for (k,) in sql(pg_url, "SELECT kind FROM history_rows ORDER BY seq")]
            assert kinds[-1] == "assistant"  # the turn was taken up and answered
        print(f"\nkill -9 failover: {failover:.2f} s (lease {LEASE_S:.0f} s, claims every 0.2 s)")
        assert failover < LEASE_S + 5.0
    finally:
        worker.stop()


@pytest.mark.timeout(120)
async def test_ls3_a_sigstopped_holder_writes_nothing_once_a_peer_took_over(
    pg_url: str, fifo: Path
) -> None:
    worker = Worker(pg_url, "s1", fifo)
    try:
        assert await worker.line() == "tool-started"
        worker.process.send_signal(signal.SIGSTOP)  # paused past its lease
        seen = Seen()
        async with peer(pg_url, seen) as engine:
            await seen.wait_for(lambda e: isinstance(e, Recovered))
            await engine.wait_idle()
            assert sql(pg_url, "SELECT state, epoch FROM operations") == [("indeterminate", 2)]
            worker.process.send_signal(signal.SIGCONT)
            await anyio.to_thread.run_sync(lambda: fifo.write_text("late result\n"))
            assert await worker.line() == "lease-lost"  # its next write was fenced
            assert worker.process.wait(timeout=30) == 0
            # Nothing of the old holder's landed: the receipt is still the peer's, and no row
            # carries the old epoch after the new epoch's first row.
            assert sql(pg_url, "SELECT state, epoch FROM operations") == [("indeterminate", 2)]
            epochs = [e for (e,) in sql(pg_url, "SELECT epoch FROM history_rows ORDER BY seq")]
            first_new = epochs.index(2)
            assert set(epochs[first_new:]) == {2}
    finally:
        worker.stop()


@pytest.mark.timeout(120)
async def test_ls6_a_clean_close_hands_the_session_over_at_once(pg_url: str, fifo: Path) -> None:
    """The holder closes cleanly (SIGTERM): its leases go back and its peers are told
    (``LISTEN``), so a peer that would claim only once an hour takes the turn up at once."""
    worker = Worker(pg_url, "s1", fifo)
    try:
        assert await worker.line() == "tool-started"
        seen = Seen()
        clock = SystemClock()
        slow_peer = Engine(
            store=PostgresStore(pg_url, lease=LEASE_S),
            models={"M": ScriptedModel("M", [ScriptStep(text="the peer's answer")], clock=clock)},
            tools={"bash": HookTool("bash")},
            clock=clock,
            config=EngineConfig(max_stream_steps=6, claim_every_s=3_600.0),
            observers=[seen],
        )
        async with slow_peer:
            assert seen.events == [] or not any(isinstance(e, Recovered) for e in seen.events)
            worker.process.send_signal(signal.SIGTERM)
            assert await anyio.to_thread.run_sync(lambda: worker.process.wait(timeout=30)) == 0
            closed = time.monotonic()
            await seen.wait_for(lambda e: isinstance(e, Recovered))
            handoff = time.monotonic() - closed
            await slow_peer.wait_idle()
        print(f"\ngraceful handoff: {handoff:.3f} s after the holder's exit")
        assert handoff < 5.0  # told, not a claim round of an hour
    finally:
        worker.stop()
