"""A recovery storm on PostgreSQL: owed sessions, four engines starting together (LS-8).

A crashed fleet left ``STORM_SESSIONS`` sessions each owing a cut (``TURNKEEPER_STORM`` sets
the size; ``make test`` runs 200, ``make test-pg`` 1,000). Four engines, each on its own store
(its own incarnation), start at once with a claim limit of 64: every session is claimed by
exactly one of them, resumed once and answered once; the drain time is printed.
"""

from __future__ import annotations

import os
import time
from typing import Any

import anyio
import pytest

from agent_session import Engine, EngineConfig, Recovered
from persistence import CutRecord, HistoryRow, RowKind, SessionRecord, TurnEnvelope
from persistence.postgres import PostgresStore
from stream_manager import ScriptedModel, ScriptStep, StreamEnded, VirtualClock
from tests.agent_session.test_engine_leases import Seen
from tests.pg_kit import sql
from tests.store_kit import commit

STORM_SESSIONS = int(os.environ.get("TURNKEEPER_STORM", "200"))
ENGINES = 4


async def seed(url: str, count: int) -> None:
    """What ``count`` crashed sessions leave: a user row and a cut assistant row owing a turn."""
    owed = CutRecord(remaining=3, model="M", requested_model="M", refused_models=(), chain=())

    async def one(store: PostgresStore, n: int) -> None:
        sid = f"s{n:04d}"
        rows = [
            HistoryRow(
                session=sid, seq=1, row_id=f"{sid}:r1", kind=RowKind.USER, body=b'{"text":"go"}'
            ),
            HistoryRow(
                session=sid,
                seq=2,
                row_id=f"{sid}:r2",
                kind=RowKind.ASSISTANT,
                body=b'{"text":"cut"}',
                stream=f"{sid}/1",
                cut=owed,
            ),
        ]
        envelope = TurnEnvelope(session=sid, stream=f"{sid}/1", model="M", budget=8, cause="send")
        await commit(
            store, sid, create=SessionRecord(id=sid, model="M"), rows=rows, envelope=envelope
        )

    async with PostgresStore(url) as store, anyio.create_task_group() as tg:
        for n in range(count):
            tg.start_soon(one, store, n)
    # The seeding store closed cleanly and gave its leases back: they are all claimable now.


@pytest.mark.timeout(600)
async def test_ls8_a_recovery_storm_is_split_over_four_engines_each_session_once(
    pg_url: str,
) -> None:
    await seed(pg_url, STORM_SESSIONS)
    seen = [Seen() for _ in range(ENGINES)]
    all_ended = anyio.Event()

    def ended() -> int:
        return sum(isinstance(e, StreamEnded) for s in seen for e in s.events)

    def count(event: Any) -> None:
        if isinstance(event, StreamEnded) and ended() >= STORM_SESSIONS:
            all_ended.set()

    engines = []
    for index in range(ENGINES):
        clock = VirtualClock()
        steps = [ScriptStep(text=f"engine {index} answers")] * STORM_SESSIONS
        engines.append(
            Engine(
                store=PostgresStore(pg_url),
                models={"M": ScriptedModel("M", steps, clock=clock)},
                clock=clock,
                config=EngineConfig(max_stream_steps=8, claim_limit=64, claim_every_s=0.2),
                observers=[seen[index], count],
            )
        )
    began = time.monotonic()
    async with anyio.create_task_group() as tg:
        for engine in engines:
            await tg.start(_run, engine, all_ended)
    drain = time.monotonic() - began

    recovered = [str(e.session) for s in seen for e in s.events if isinstance(e, Recovered)]
    assert sorted(recovered) == [f"s{n:04d}" for n in range(STORM_SESSIONS)]  # each once
    shares = [sum(isinstance(e, Recovered) for e in s.events) for s in seen]
    assert sum(shares) == STORM_SESSIONS
    assert ended() == STORM_SESSIONS  # each resumed turn answered once
    answers = sql(pg_url, "SELECT count(*) FROM history_rows WHERE kind = 'assistant' AND seq > 2")
    assert answers == [(STORM_SESSIONS,)]
    assert sql(pg_url, "SELECT count(*) FROM history_rows WHERE cut_state = 'owed'") == [(0,)]
    print(
        f"\nrecovery storm: {STORM_SESSIONS} sessions, {ENGINES} engines, shares {shares}, "
        f"drained in {drain:.2f} s"
    )


async def _run(
    engine: Engine, all_ended: anyio.Event, *, task_status: Any = anyio.TASK_STATUS_IGNORED
) -> None:
    """Start ``engine`` (its start claims), report started, run until every turn ended."""
    async with engine:
        task_status.started()
        with anyio.fail_after(300):
            await all_ended.wait()
            await engine.wait_idle()
