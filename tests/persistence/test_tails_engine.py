"""The store's tails and abandon markers under a real engine's startup, on both stores (PS-4, PS-8).

A store is seeded the way a crashed process leaves it: a session whose last row is the
user's (its turn never answered). An engine that runs the session's model retries the turn;
one that does not gives it up, writing the abandon marker, and the next startup reads the
marker back through the scan's tail and leaves the turn quietly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from agent_session import Engine, Recovered, RetryAbandoned
from persistence import AbandonMarker, RowKind
from stream_manager import ScriptedModel, StreamStarted
from tests.agent_session.support import X
from tests.store_kit import commit

from .helpers import row, session

if TYPE_CHECKING:
    from collections.abc import Callable

    from agent_session import EngineEvent
    from persistence import Store

#: Seconds a startup may take at most (far beyond a real one: a hang fails instead).
HANG = 30


async def crashed_turn(store: Store) -> None:
    """``lead`` on model ``M``: an answered turn, then the user's row ``lead:r3`` unanswered."""
    async with store:
        await commit(
            store,
            "lead",
            create=session("lead", model="M"),
            rows=[
                row(1, "lead:r1", sid="lead"),
                row(2, "lead:r2", sid="lead", kind=RowKind.ASSISTANT),
                row(3, "lead:r3", sid="lead"),
            ],
        )


async def start(store: Store, models: dict[str, ScriptedModel]) -> list[EngineEvent]:
    events: list[EngineEvent] = []
    with anyio.fail_after(HANG):
        async with Engine(store=store, models=models, observers=[events.append]) as engine:
            await engine.wait_idle()
    return events


async def test_ps4_an_unanswered_turn_is_retried_at_startup_on_both_stores(
    make_store: Callable[[], Store],
) -> None:
    await crashed_turn(make_store())
    model = ScriptedModel("M", [X("answered after the crash")])
    events = await start(make_store(), {"M": model})
    assert [(e.action, e.session) for e in events if isinstance(e, Recovered)] == [
        ("retry", "lead")
    ]
    assert [e.cause for e in events if isinstance(e, StreamStarted)] == ["recovery"]
    async with make_store() as store:
        loaded = await store.load("lead")
        assert loaded is not None
        assert loaded.rows[-1].kind.value == "assistant"
        assert loaded.abandon is None
        assert (await store.scan_recoverable()).tails == ()  # answered: no tail now


async def test_ps8_a_turn_given_up_is_marked_and_left_quietly_at_the_next_startup(
    make_store: Callable[[], Store],
) -> None:
    await crashed_turn(make_store())
    other = {"N": ScriptedModel("N", [])}  # this engine does not run M
    first = await start(make_store(), other)
    [abandoned] = [e for e in first if isinstance(e, RetryAbandoned)]
    assert "not run here" in abandoned.why
    async with make_store() as store:
        loaded = await store.load("lead")
        assert loaded is not None
        assert loaded.abandon == AbandonMarker(reason=abandoned.why, user_row="lead:r3")
        [tail] = (await store.scan_recoverable()).tails
        assert tail.abandon == loaded.abandon
    second = await start(make_store(), other)
    assert not [e for e in second if isinstance(e, RetryAbandoned | Recovered)], second
    assert not [e for e in second if isinstance(e, StreamStarted)]
