"""Stop and resolve from any engine process (LS-10), against a real PostgreSQL server.

Engine B stops a turn engine A runs, and resolves a receipt of a session A holds: each is a
request A hears, carries out and answers, and B returns A's answer. A request nobody answers
in time is withdrawn and never carried out; a session nobody holds is taken by the engine
that hears the request (B's own listener, here).
"""

from __future__ import annotations

import anyio
import pytest

from agent_session import Engine, EngineConfig, RequestUnanswered
from persistence import (
    OPERATOR,
    MemoryStore,
    OperationRecord,
    OpState,
    UsageError,
)
from persistence.postgres import PostgresStore
from stream_manager import ScriptedModel, StreamAborted, VirtualClock
from tests.agent_session.support import T_, HookTool, X
from tests.agent_session.test_engine_leases import Seen
from tests.persistence.helpers import client
from tests.persistence.helpers import session as record
from tests.pg_kit import sql
from tests.store_kit import commit, put_receipts

STUCK = OperationRecord(
    op_id="s1/9/3/1",
    session="s1",
    stream="s1/9",
    call_id="c4",
    capability=client("deploy"),
    target="client:deploy#51cc",
    started_at=30.5,
    deadline_at=90.5,
    state=OpState.INDETERMINATE,
    ended_at=91.5,
    outcome_code="process_restart",
    explanation="the process stopped while the call ran",
)


def engine(
    url: str, steps: list[object], tool: HookTool, seen: Seen, *, timeout_s: float = 20.0
) -> Engine:
    clock = VirtualClock()
    tool.clock = clock
    return Engine(
        store=PostgresStore(url, lease=7.0),
        models={"M": ScriptedModel("M", steps, clock=clock)},  # type: ignore[arg-type]
        tools={"bash": tool},
        clock=clock,
        config=EngineConfig(max_stream_steps=6, claim_every_s=3_600.0, request_timeout_s=timeout_s),
        observers=[seen],
    )


@pytest.mark.timeout(60)
async def test_ls10_a_peer_stops_the_holders_turn_and_gets_its_queue_back(pg_url: str) -> None:
    started, gate = anyio.Event(), anyio.Event()
    tool = HookTool("bash", gate=gate, before=lambda call: started.set())
    seen_a, seen_b = Seen(), Seen()
    async with engine(pg_url, [T_("bash"), X("never")], tool, seen_a) as a:
        session = await a.open_session("s1", model="M")
        await session.send("build it")
        with anyio.fail_after(20):
            await started.wait()  # A's turn runs its tool call
        await session.send("and then deploy")  # queued behind the running turn
        async with engine(pg_url, [], HookTool("bash"), seen_b) as b:
            restored = await b.stop("s1")
            assert restored == "and then deploy"  # A's queue, given back through B
            assert "s1" not in b.store.leases.held  # type: ignore[attr-defined]
        await seen_a.wait_for(lambda e: isinstance(e, StreamAborted) and e.session == "s1")
        await a.wait_idle()
        (aborted,) = [e for e in seen_a.events if isinstance(e, StreamAborted)]
        assert aborted.reason.value == "user"
        assert sql(pg_url, "SELECT state FROM operations") == [("cancelled",)]
        assert sql(pg_url, "SELECT count(*) FROM requests") == [(0,)]


@pytest.mark.timeout(60)
async def test_ls10_a_peer_resolves_a_receipt_of_a_session_the_holder_holds(pg_url: str) -> None:
    seen_a, seen_b = Seen(), Seen()
    async with engine(pg_url, [], HookTool("bash"), seen_a) as a:
        await a.open_session("s1", model="M")
        await put_receipts(a.store, STUCK)  # written under A's lease (epoch 1)
        async with engine(pg_url, [], HookTool("bash"), seen_b) as b:
            settled = await b.resolve_operation(
                STUCK.op_id, as_="completed", note="the deploy log on b7 shows release 41"
            )
            assert "s1" not in b.store.leases.held  # type: ignore[attr-defined]
        assert (settled.state, settled.resolved_by) == (OpState.COMPLETED, OPERATOR)
        assert settled.note == "the deploy log on b7 shows release 41"
        # Written by A, the holder, under its epoch: B took no lease.
        assert sql(pg_url, "SELECT state, epoch FROM operations") == [("completed", 1)]
        assert sql(pg_url, "SELECT owner IS NOT NULL, epoch FROM sessions") == [(True, 1)]


@pytest.mark.timeout(60)
async def test_ls10_a_request_nobody_answers_is_withdrawn_and_never_carried_out(
    pg_url: str,
) -> None:
    started, gate = anyio.Event(), anyio.Event()
    tool = HookTool("bash", gate=gate, before=lambda call: started.set())
    seen_a, seen_b = Seen(), Seen()
    async with engine(pg_url, [T_("bash"), X("A's answer")], tool, seen_a) as a:
        session = await a.open_session("s1", model="M")
        await a.store._listener.stop()  # type: ignore[attr-defined]  # A hears nothing
        await session.send("build it")
        with anyio.fail_after(20):
            await started.wait()
        async with engine(pg_url, [], HookTool("bash"), seen_b, timeout_s=0.4) as b:
            with pytest.raises(RequestUnanswered, match="withdrawn and not carried out") as no:
                await b.stop("s1")
        assert (no.value.session, no.value.kind, no.value.begun) == ("s1", "stop", False)
        assert sql(pg_url, "SELECT count(*) FROM requests") == [(0,)]
        await a._poll_requests()  # A's fallback poll finds nothing to carry out
        gate.set()
        await a.wait_idle()
        assert not [e for e in seen_a.events if isinstance(e, StreamAborted)]  # never stopped


@pytest.mark.timeout(60)
async def test_ls10_a_stop_for_a_session_nobody_holds_is_carried_out_by_its_taker(
    pg_url: str,
) -> None:
    async with PostgresStore(pg_url) as creator:
        await commit(creator, "s2", create=record("s2", model="M"))
    seen = Seen()
    async with engine(pg_url, [], HookTool("bash"), seen) as b:
        assert await b.stop("s2") == ""  # nothing was queued
        assert "s2" in b.store.leases.held  # type: ignore[attr-defined]
        assert "s2" in b.sessions
    assert sql(pg_url, "SELECT count(*) FROM requests") == [(0,)]


async def test_ls10_on_a_store_of_one_process_stop_needs_the_session_open_here() -> None:
    async with Engine(store=MemoryStore(), models={"M": ScriptedModel("M", [])}) as alone:
        await alone.open_session("s1", model="M")
        assert await alone.stop("s1") == ""
        with pytest.raises(UsageError, match="s9"):
            await alone.stop("s9")


def test_ls10_the_request_timeout_must_be_positive() -> None:
    with pytest.raises(UsageError, match="request_timeout_s"):
        EngineConfig(request_timeout_s=0.0)
