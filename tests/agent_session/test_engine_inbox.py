"""A message to any session from any engine (LS-9), against a real PostgreSQL server.

Engine B posts to a session engine A holds: A's listener hears the notification and the
message runs as A's next turn, queued exactly once; a session nobody holds is taken by the
engine that hears it; with A's listener gone, A's claim rounds poll the inbox instead.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from agent_session import Engine, EngineConfig
from persistence import MemoryStore, RowKind, UsageError
from persistence.postgres import PostgresStore
from stream_manager import ScriptedModel, StreamEnded, VirtualClock
from tests.agent_session.support import X
from tests.agent_session.test_engine_leases import Seen
from tests.persistence.helpers import session as record
from tests.pg_kit import sql
from tests.store_kit import commit


def engine(url: str, answers: int, seen: Seen, *, claim_every_s: float = 3_600.0) -> Engine:
    clock = VirtualClock()
    return Engine(
        store=PostgresStore(url, lease=6.0),
        models={"M": ScriptedModel("M", [X(f"answer {n}") for n in range(answers)], clock=clock)},
        clock=clock,
        config=EngineConfig(max_stream_steps=4, claim_every_s=claim_every_s),
        observers=[seen],
    )


def user_texts(url: str, sid: str) -> list[str]:
    rows = sql(
        url,
        "SELECT body FROM history_rows WHERE session = %s AND kind = %s ORDER BY seq",
        (sid, RowKind.USER.value),
    )
    return [bytes(body).decode() for (body,) in rows]


def ended(seen: Seen, sid: str) -> Any:
    return lambda e: isinstance(e, StreamEnded) and e.session == sid


@pytest.mark.timeout(60)
async def test_ls9_a_message_a_peer_posts_runs_as_the_holders_next_turn(pg_url: str) -> None:
    seen_a, seen_b = Seen(), Seen()
    async with engine(pg_url, 1, seen_a) as a, engine(pg_url, 0, seen_b) as b:
        await a.open_session("s1", model="M")
        entry = await b.post("s1", "hello from b")
        assert entry.startswith("inbox-")
        await seen_a.wait_for(ended(seen_a, "s1"))
        await a.wait_idle()
        assert sql(pg_url, "SELECT count(*) FROM inbox") == [(0,)]
        (text,) = user_texts(pg_url, "s1")
        assert "hello from b" in text
        assert not [e for e in seen_b.events if isinstance(e, StreamEnded)]
        assert "s1" not in b.store.leases.held  # type: ignore[attr-defined]


@pytest.mark.timeout(60)
async def test_ls9_a_session_nobody_holds_is_taken_by_the_engine_that_hears(pg_url: str) -> None:
    async with PostgresStore(pg_url) as creator:
        await commit(creator, "s2", create=record("s2", model="M"))
    # ``creator`` closed cleanly: nobody holds s2 now.
    seen = Seen()
    async with engine(pg_url, 1, seen) as b:
        await b.post("s2", "anyone there?")
        await seen.wait_for(ended(seen, "s2"))
        await b.wait_idle()
        assert "s2" in b.store.leases.held  # type: ignore[attr-defined]
        assert len(user_texts(pg_url, "s2")) == 1


@pytest.mark.timeout(60)
async def test_ls9_with_the_listener_gone_the_claim_rounds_deliver(pg_url: str) -> None:
    seen_a = Seen()
    async with engine(pg_url, 1, seen_a, claim_every_s=0.2) as a:
        await a.open_session("s1", model="M")
        listener = a.store._listener  # type: ignore[attr-defined]
        await listener.stop()  # a listening connection dropped for good
        async with PostgresStore(pg_url) as other:
            await other.post("s1", "polled, not heard")
        await seen_a.wait_for(ended(seen_a, "s1"))
        await a.wait_idle()
        assert len(user_texts(pg_url, "s1")) == 1
        assert sql(pg_url, "SELECT count(*) FROM inbox") == [(0,)]


@pytest.mark.timeout(60)
async def test_ls9_a_message_taken_again_and_again_is_queued_once(pg_url: str) -> None:
    seen = Seen()
    async with engine(pg_url, 2, seen) as a:
        await a.open_session("s1", model="M")
        await a.post("s1", "just once")
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(a._poll_mail)  # the fallback racing the notification
        await seen.wait_for(ended(seen, "s1"))
        await a.wait_idle()
        assert len(user_texts(pg_url, "s1")) == 1
        assert sum(isinstance(e, StreamEnded) for e in seen.events) == 1


async def test_ls9_posting_needs_a_shared_store() -> None:
    async with Engine(store=MemoryStore(), models={}) as alone:
        with pytest.raises(UsageError, match="PostgresStore"):
            await alone.post("s1", "nowhere")


async def test_ls9_a_post_to_an_unknown_session_is_refused(pg_url: str) -> None:
    async with PostgresStore(pg_url) as store:
        with pytest.raises(UsageError, match="unknown session"):
            await store.post("ghost", "boo")
        with pytest.raises(UsageError, match="blank"):
            await store.post("ghost", "   ")
    assert sql(pg_url, "SELECT count(*) FROM inbox") == [(0,)]
