"""Two engines on one PostgreSQL database: a stalled holder, a peer that takes over (LS-3, LS-8).

Engine A runs a turn whose tool call hangs; A then "stalls" (its lease is made to run out on
the database's clock, as a paused or partitioned process's would). Engine B starts, claims the
session, closes the receipt A left running as ``indeterminate`` (once) and takes the turn up.
When A's tool finally returns, A's write is fenced: nothing of it lands, and A's session stops
where it is. Waits are on events (bounded by a real-time failure), never on sleeps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from agent_session import Engine, EngineConfig, EngineEvent, Recovered
from agent_session._events import SessionBroken
from persistence import LeaseLost, OpState, RowKind
from persistence.postgres import PostgresStore
from stream_manager import ScriptedModel, VirtualClock
from tests.agent_session.support import T_, HookTool, X
from tests.pg_kit import expire, sql


class Seen:
    """Records an engine's events; ``wait_for`` returns once one matching has been seen."""

    def __init__(self) -> None:
        self.events: list[EngineEvent] = []
        self._waiters: list[tuple[Callable[[EngineEvent], bool], anyio.Event]] = []

    def __call__(self, event: EngineEvent) -> None:
        self.events.append(event)
        for match, flag in self._waiters:
            if match(event):
                flag.set()

    async def wait_for(self, match: Callable[[EngineEvent], bool]) -> None:
        if any(match(e) for e in self.events):
            return
        flag = anyio.Event()
        self._waiters.append((match, flag))
        with anyio.fail_after(20):
            await flag.wait()


def engine(url: str, steps: list[Any], tool: HookTool, seen: Seen) -> Engine:
    clock = VirtualClock()
    tool.clock = clock
    return Engine(
        store=PostgresStore(url, lease=5.0),
        models={"M": ScriptedModel("M", steps, clock=clock)},
        tools={"bash": tool},
        clock=clock,
        config=EngineConfig(max_stream_steps=6, claim_every_s=3_600.0),
        observers=[seen],
    )


@pytest.mark.timeout(60)
async def test_ls8_a_peer_takes_up_the_turn_a_stalled_holder_left_and_fences_it(
    pg_url: str,
) -> None:
    hung = anyio.Event()
    started = anyio.Event()
    tool_a = HookTool("bash", gate=hung, before=lambda call: started.set())
    seen_a, seen_b = Seen(), Seen()
    a = engine(pg_url, [T_("bash"), X("A's answer")], tool_a, seen_a)
    async with a:
        session_a = await a.open_session("s1", model="M")
        await session_a.send("build it")
        with anyio.fail_after(20):
            await started.wait()  # A's tool call runs: its receipt is durable, running
        (op,) = sql(pg_url, "SELECT op_id, state, epoch FROM operations")
        assert op[1:] == ("running", 1)

        expire(pg_url, "s1")  # A stalls past its lease
        b = engine(pg_url, [X("B took it up")], HookTool("bash"), seen_b)
        async with b:
            await seen_b.wait_for(lambda e: isinstance(e, Recovered))
            await b.wait_idle()
            assert [(e.session, e.action) for e in seen_b.events if isinstance(e, Recovered)] == [
                ("s1", "retry")
            ]
            # OP-7, once: the call A left running is indeterminate, written under B's epoch.
            assert sql(pg_url, "SELECT state, epoch FROM operations") == [("indeterminate", 2)]
            assert sql(pg_url, "SELECT owner IS NOT NULL, epoch FROM sessions") == [(True, 2)]

            hung.set()  # A's tool returns at last: A's write of its result is fenced
            await seen_a.wait_for(lambda e: isinstance(e, SessionBroken))
            (broken,) = [e for e in seen_a.events if isinstance(e, SessionBroken)]
            assert broken.error.startswith(LeaseLost.__name__)
            await b.wait_idle()

            # Nothing of A's landed after B took over: the receipt stays B's indeterminate,
            # and no row of epoch 1 follows B's first row.
            assert sql(pg_url, "SELECT state, epoch FROM operations") == [("indeterminate", 2)]
            rows = sql(pg_url, "SELECT seq, epoch, kind FROM history_rows ORDER BY seq")
            first_b = next(i for i, (_, epoch, _) in enumerate(rows) if epoch == 2)
            assert all(epoch == 2 for _, epoch, _ in rows[first_b:])
            assert rows[-1][2] == RowKind.ASSISTANT.value  # B answered the turn
            assert isinstance(b.store, PostgresStore)
            assert b.store.leases.held == {"s1": 2}
            (receipt,) = (await b.store.receipts("s1")).records
            assert receipt.state is OpState.INDETERMINATE


@pytest.mark.timeout(60)
async def test_ls5_a_holder_whose_renewals_failed_too_long_starts_no_tool_call(
    pg_url: str,
) -> None:
    now = [50.0]
    store = PostgresStore(pg_url, lease=5.0, renew_every=3_600.0, clock=lambda: now[0])
    clock = VirtualClock()
    tool = HookTool("bash", clock=clock)
    seen = Seen()
    engine = Engine(
        store=store,
        models={"M": ScriptedModel("M", [T_("bash"), X("never")], clock=clock)},
        tools={"bash": tool},
        clock=clock,
        config=EngineConfig(max_stream_steps=6, auto_retry=False, claim_every_s=3_600.0),
        observers=[seen],
    )
    async with engine:
        session = await engine.open_session("s1", model="M")
        now[0] += 5.0 * 0.8 + 0.5  # no renewal for longer than the lease minus the margin
        assert not store.leases.fresh
        await session.send("build it")
        await engine.wait_idle()
        assert tool.calls == []  # the call never started
        assert sql(pg_url, "SELECT count(*) FROM operations") == [(0,)]  # nor was it recorded
