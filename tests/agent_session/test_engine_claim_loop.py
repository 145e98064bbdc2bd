"""The engine's claim loop on PostgreSQL (LS-8): woken by every peer's release, closed cleanly.

* A peer's clean close releases its leases and notifies; the claim loop wakes at once. Every
  release wakes it, not only the first one it heard (the loop makes a new wake-up event each
  round, and the store must reach the current one). The claim rounds here run once an hour,
  so a session is taken up only when the release woke the loop.
* An engine that closes while a claim round reads the database lets that round end before it
  cancels the rest: a query cancelled half-way makes psycopg cancel it on the server, and
  anyio's repeated cancellation interrupts that too, so the connection is dropped with a
  warning. The round here is held inside its read until the close has begun.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import pytest

from agent_session import Engine, EngineConfig, Recovered
from persistence.postgres import PostgresStore
from stream_manager import ScriptedModel, VirtualClock
from tests.agent_session.support import T_, HookTool, X
from tests.agent_session.test_engine_leases import Seen


def _engine(store: PostgresStore, steps: list[Any], tool: HookTool, seen: Seen) -> Engine:
    clock = VirtualClock()
    tool.clock = clock
    return Engine(
        store=store,
        models={"M": ScriptedModel("M", steps, clock=clock)},
        tools={"bash": tool},
        clock=clock,
        config=EngineConfig(max_stream_steps=7, claim_every_s=3_600.0),
        observers=[seen],
    )


async def _hold_and_close(url: str, session_id: str) -> None:
    """A holder whose tool call hangs, closed cleanly (its leases go back, a notify)."""
    started = anyio.Event()
    tool = HookTool("bash", gate=anyio.Event(), before=lambda call: started.set())
    async with _engine(PostgresStore(url), [T_("bash")], tool, Seen()) as holder:
        session = await holder.open_session(session_id, model="M")
        await session.send("run the migration")
        with anyio.fail_after(20):
            await started.wait()


def _recovered(session_id: str) -> Callable[[Any], bool]:
    return lambda e: isinstance(e, Recovered) and e.session == session_id


@pytest.mark.timeout(90)
async def test_ls8_every_release_wakes_the_claim_loop_not_only_the_first(pg_url: str) -> None:
    seen = Seen()
    steps = [X("taken up, first"), X("taken up, second"), X("taken up, third")]
    async with _engine(PostgresStore(pg_url), steps, HookTool("bash"), seen):
        for session_id in ("mig-1", "mig-2", "mig-3"):
            await _hold_and_close(pg_url, session_id)
            await seen.wait_for(_recovered(session_id))  # fails after 20 s: no round woke


class HeldReads(PostgresStore):
    """A store whose claim round's mail read waits, once armed, until the engine's close."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.inside = anyio.Event()
        self.closing = anyio.Event()
        self.armed = False
        self.finished: bool | None = None

    async def mail_for(self, sessions: Sequence[str]) -> set[str]:
        if not self.armed:
            return await super().mail_for(sessions)
        self.armed = False
        self.finished = False
        self.inside.set()
        await self.closing.wait()
        await self._read([("SELECT pg_sleep(0.3)", ())])  # a read still running on the server
        found = await super().mail_for(sessions)
        self.finished = True
        return found

    def watch_releases(self, callback: Callable[[], None] | None) -> None:
        if callback is None:  # the engine's close begins here, before it cancels its tasks
            self.closing.set()
        super().watch_releases(callback)


@pytest.mark.timeout(60)
async def test_ls8_a_close_lets_the_claim_round_in_flight_end_its_read(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = HeldReads(pg_url)
    seen = Seen()
    engine = _engine(store, [X("unused")], HookTool("bash"), seen)
    with caplog.at_level(logging.WARNING):
        async with engine:
            store.armed = True
            engine._claim_wake.set()  # a round now, as a peer's release would wake one
            with anyio.fail_after(20):
                await store.inside.wait()
    assert store.finished is True, "the round's read was cancelled half-way"
    assert not [r for r in caplog.records if r.name == "psycopg"], caplog.text
