"""A delegated turn whose owner runs in another engine process (LS-11), on a real server.

Engine A holds the owner session, engine B the target. A writes the handle and posts the
prompt in one transaction (fenced by the owner's lease); B takes the prompt with its handle,
runs the turn, decides its settlement and writes it under the target's lease; A hears the
settlement (a ``pg_notify``, or its claim round's poll) and its ``Delegation.settled()``
returns. The owner's interrupt is a request to the target's holder (LS-10).
"""

from __future__ import annotations

import anyio
import pytest

from agent_session import Engine, EngineConfig, HandleSettled
from persistence import HandleStatus, UsageError
from persistence.postgres import PostgresStore
from stream_manager import Persisted, ScriptedModel, StreamAborted, StreamStarted, VirtualClock
from tests.agent_session.support import T_, HookTool, X
from tests.agent_session.test_engine_leases import Seen
from tests.persistence.helpers import session as record
from tests.pg_kit import expire, sql
from tests.store_kit import commit


def engine(url: str, steps: list[object], seen: Seen, tool: HookTool | None = None) -> Engine:
    clock = VirtualClock()
    tool = tool or HookTool("bash")
    tool.clock = clock
    return Engine(
        store=PostgresStore(url, lease=7.0),
        models={"M": ScriptedModel("M", steps, clock=clock)},  # type: ignore[arg-type]
        tools={"bash": tool},
        clock=clock,
        config=EngineConfig(max_stream_steps=5, claim_every_s=3_600.0, request_timeout_s=20.0),
        observers=[seen],
    )


def stored(url: str, handle: str) -> list[tuple[str, str, str]]:
    return sql(url, "SELECT owner, target, status FROM handles WHERE handle_id = %s", (handle,))


@pytest.mark.timeout(60)
async def test_ls11_a_turn_delegated_to_a_peers_session_settles_in_the_owners_engine(
    pg_url: str,
) -> None:
    seen_a, seen_b = Seen(), Seen()
    async with (
        engine(pg_url, [], seen_a) as a,
        engine(pg_url, [X("plan ready: 3 parts")], seen_b) as b,
    ):
        await a.open_session("lead", model="M")
        await b.open_session("crew", model="M")
        delegation = a.delegate("lead", "crew", "h-plan-7", "write the plan")
        with anyio.fail_after(20):
            settled = await delegation.settled()
        assert (settled.status, settled.report) == (HandleStatus.COMPLETED, "plan ready: 3 parts")
        assert a.delegations.record("h-plan-7").status is HandleStatus.COMPLETED
        assert stored(pg_url, "h-plan-7") == [("lead", "crew", "completed")]
        # B ran the turn in the session it holds; A never took it.
        assert "crew" in b.store.leases.held  # type: ignore[attr-defined]
        assert "crew" not in a.store.leases.held  # type: ignore[attr-defined]
        assert "crew" not in a.sessions
        assert sql(pg_url, "SELECT count(*) FROM inbox") == [(0,)]


@pytest.mark.timeout(60)
async def test_ls11_with_the_owners_listener_gone_its_claim_round_hears_the_settlement(
    pg_url: str,
) -> None:
    seen_a, seen_b = Seen(), Seen()
    async with engine(pg_url, [], seen_a) as a, engine(pg_url, [X("done by b")], seen_b) as b:
        await a.open_session("lead", model="M")
        await b.open_session("crew", model="M")
        await a.store._listener.stop()  # type: ignore[attr-defined]  # A hears nothing
        delegation = a.delegate("lead", "crew", "h-quiet-2", "count the files")
        await seen_b.wait_for(lambda e: isinstance(e, HandleSettled) and e.handle == "h-quiet-2")
        assert stored(pg_url, "h-quiet-2") == [("lead", "crew", "completed")]
        assert a.delegations.record("h-quiet-2").status is HandleStatus.ACTIVE  # not heard yet
        await a._poll_handles()  # the fallback poll of a claim round
        with anyio.fail_after(5):
            settled = await delegation.settled()
        assert (settled.status, settled.report) == (HandleStatus.COMPLETED, "done by b")


@pytest.mark.timeout(60)
async def test_ls11_the_owner_interrupts_a_turn_its_peer_runs(pg_url: str) -> None:
    started, gate = anyio.Event(), anyio.Event()
    tool = HookTool("bash", gate=gate, before=lambda call: started.set())
    seen_a, seen_b = Seen(), Seen()
    async with (
        engine(pg_url, [], seen_a) as a,
        engine(pg_url, [T_("bash"), X("never")], seen_b, tool) as b,
    ):
        await a.open_session("lead", model="M")
        await b.open_session("crew", model="M")
        delegation = a.delegate("lead", "crew", "h-long-4", "run the long job")
        with anyio.fail_after(20):
            await started.wait()  # B's turn runs its tool call
        with pytest.raises(UsageError, match="interrupt_delegated"):
            a.interrupt_handle("h-long-4")  # the decision is the target's holder's
        assert await a.interrupt_delegated("h-long-4") is True
        with anyio.fail_after(5):
            settled = await delegation.settled()
        assert (settled.status, settled.reason) == (
            HandleStatus.INTERRUPTED,
            "interrupted by its owner",
        )
        await seen_b.wait_for(lambda e: isinstance(e, StreamAborted) and e.session == "crew")
        assert stored(pg_url, "h-long-4") == [("lead", "crew", "interrupted")]
        assert await a.interrupt_delegated("h-long-4") is False  # already interrupted
        assert sql(pg_url, "SELECT count(*) FROM requests") == [(0,)]


@pytest.mark.timeout(60)
async def test_ls11_a_prompt_for_a_session_nobody_holds_runs_where_it_is_taken(
    pg_url: str,
) -> None:
    async with PostgresStore(pg_url) as creator:
        await commit(creator, "crew", create=record("crew", model="M"))
    seen = Seen()
    async with engine(pg_url, [X("taken and done")], seen) as a:
        await a.open_session("lead", model="M")
        delegation = a.delegate("lead", "crew", "h-free-9", "tidy up")
        with anyio.fail_after(20):
            settled = await delegation.settled()
        assert (settled.status, settled.report) == (HandleStatus.COMPLETED, "taken and done")
        assert "crew" in a.store.leases.held  # type: ignore[attr-defined]


@pytest.mark.timeout(60)
async def test_ls11_a_delegation_to_a_session_that_does_not_exist_never_starts(
    pg_url: str,
) -> None:
    async with engine(pg_url, [], Seen()) as a:
        await a.open_session("lead", model="M")
        delegation = a.delegate("lead", "nobody-3", "h-void-1", "anything")
        with anyio.fail_after(10), pytest.raises(UsageError, match="nobody-3"):
            await delegation.settled()
        assert stored(pg_url, "h-void-1") == []
        assert sql(pg_url, "SELECT count(*) FROM inbox") == [(0,)]


@pytest.mark.timeout(90)
async def test_ls11_a_peer_that_claims_the_target_finishes_the_turn_and_the_owner_hears(
    pg_url: str,
) -> None:
    hung, started = anyio.Event(), anyio.Event()
    tool_b = HookTool("bash", gate=hung, before=lambda call: started.set())
    seen_a, seen_b, seen_c = Seen(), Seen(), Seen()
    async with (
        engine(pg_url, [], seen_a) as a,
        engine(pg_url, [T_("bash"), X("B's answer")], seen_b, tool_b) as b,
        engine(pg_url, [X("C took the turn up")], seen_c) as c,  # knows no handle yet
    ):
        await a.open_session("lead", model="M")
        await b.open_session("crew", model="M")
        delegation = a.delegate("lead", "crew", "h-fail-6", "deploy release 41")
        with anyio.fail_after(20):
            await started.wait()  # B runs the turn's tool call
        expire(pg_url, "crew")  # B stalls past its lease
        assert await c.claim_expired() == ("crew",)  # C's claim round takes the turn up
        with anyio.fail_after(20):
            settled = await delegation.settled()
        assert (settled.status, settled.report) == (HandleStatus.COMPLETED, "C took the turn up")
        assert "crew" in c.store.leases.held  # type: ignore[attr-defined]
        assert stored(pg_url, "h-fail-6") == [("lead", "crew", "completed")]
        hung.set()  # B's call returns at last: its write is fenced, nothing of it lands
        await b.wait_idle()
        await c.wait_idle()
        assert stored(pg_url, "h-fail-6") == [("lead", "crew", "completed")]
        assert sql(pg_url, "SELECT state, epoch FROM operations") == [("indeterminate", 2)]


@pytest.mark.timeout(60)
async def test_ls11_a_prompt_whose_turn_was_interrupted_before_it_was_taken_never_runs(
    pg_url: str,
) -> None:
    seen_a, seen_b = Seen(), Seen()
    async with engine(pg_url, [], seen_a) as a, engine(pg_url, [X("never")], seen_b) as b:
        await a.open_session("lead", model="M")
        await b.open_session("crew", model="M")
        await b.store._listener.stop()  # type: ignore[attr-defined]  # B hears nothing
        delegation = a.delegate("lead", "crew", "h-late-5", "too late")
        await seen_a.wait_for(lambda e: isinstance(e, Persisted) and e.id == "h-late-5")
        asked = anyio.Event()
        ask = a.store.ask  # type: ignore[attr-defined]

        async def posted(*args: object) -> int:
            number: int = await ask(*args)
            asked.set()
            return number

        a.store.ask = posted  # type: ignore[attr-defined]

        async def answer() -> None:
            await asked.wait()
            await b._poll_requests()  # B's claim round answers the interrupt

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(answer)
            assert await a.interrupt_delegated("h-late-5") is True
        settled = await delegation.settled()
        assert settled.status is HandleStatus.INTERRUPTED
        await b._poll_mail()  # the prompt is found, its turn settled: dropped unqueued
        await b.wait_idle()
        assert sql(pg_url, "SELECT count(*) FROM inbox") == [(0,)]
        assert not [e for e in seen_b.events if isinstance(e, StreamStarted)]
        assert stored(pg_url, "h-late-5") == [("lead", "crew", "interrupted")]


@pytest.mark.timeout(60)
async def test_ls11_an_engine_that_starts_leaves_a_peers_delegated_turn_alone(
    pg_url: str,
) -> None:
    hung, started = anyio.Event(), anyio.Event()
    tool = HookTool("bash", gate=hung, before=lambda call: started.set())
    seen_a, seen_d = Seen(), Seen()
    async with engine(pg_url, [T_("bash"), X("A's own answer")], seen_a, tool) as a:
        await a.open_session("lead", model="M")
        await a.open_session("crew", model="M")
        delegation = a.delegate("lead", "crew", "h-home-8", "a turn of A's own")
        with anyio.fail_after(20):
            await started.wait()
        async with engine(pg_url, [], seen_d) as d:  # its startup settles only what it holds
            assert d.delegations.record("h-home-8").status is HandleStatus.ACTIVE
            assert not d.delegations.retrying  # no settlement of it was even tried
            assert stored(pg_url, "h-home-8") == [("lead", "crew", "active")]
            hung.set()
            with anyio.fail_after(20):
                settled = await delegation.settled()
            assert (settled.status, settled.report) == (HandleStatus.COMPLETED, "A's own answer")
            assert d.delegations.awaited_owners() == set()  # a peer's owner: not D's to hear
            await d._poll_handles()
            assert not [e for e in seen_d.events if isinstance(e, HandleSettled)]
            assert d._remote is not None
            await d._remote.adopt_claimed({"crew"})  # as a claim of crew would
            assert d.delegations.record("h-home-8").status is HandleStatus.COMPLETED
