"""The persisted auto-retry preference (AS-32) in both stores: on unless "off" is stored.

``Boundary.auto_retry`` is ``None`` (leave the stored preference as it is), ``False`` (store
"off") or ``True`` (remove the stored "off": back to the default). It rides in any boundary,
in its one transaction, and a boundary of nothing else commits. ``load`` serves it as
``SessionLoad.auto_retry``, the startup scan in each tail as ``SessionTail.auto_retry``: both
``True`` when nothing is stored. Like the abandon marker it needs the session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from persistence import (
    Boundary,
    Committed,
    CutState,
    CutStateChange,
    OperationRecord,
    OpState,
    PartialChunk,
    RowKind,
    UsageError,
)
from tests.store_kit import commit, history, owner, receipt

from .helpers import client, envelope, row, session
from .helpers import cut as owed_cut
from .test_tails_store import lead, loaded, tail_of

if TYPE_CHECKING:
    from collections.abc import Callable

    from persistence import Store

OFF, ON = Boundary(auto_retry=False), Boundary(auto_retry=True)


def op(n: int, sid: str = "lead") -> OperationRecord:
    """A receipt of ``sid`` (receipts ride the stores' short paths)."""
    return OperationRecord(
        op_id=f"{sid}/op{n}",
        session=sid,
        stream=f"{sid}/2",
        call_id=f"call{n}",
        capability=client("grep"),
        target="src/",
        started_at=70.0 + n,
        state=OpState.RUNNING,
    )


async def put(store: Store, boundary: Boundary, sid: str = "lead") -> Committed:
    return await store.commit(sid, boundary, owner=owner(store))


async def seeded(store: Store) -> None:
    """Session ``lead`` whose history ends on an unanswered user row: a startup-retry tail."""
    await commit(store, "lead", create=session("lead", model="gamma"), rows=[lead(3)])


async def preference(store: Store, sid: str = "lead") -> tuple[bool, bool]:
    """``(load's, the tail's)`` preference of ``sid``."""
    tail = await tail_of(store, sid)
    assert tail is not None
    return (await loaded(store, sid)).auto_retry, tail.auto_retry


async def test_as32_the_preference_is_on_when_nothing_is_stored(store: Store) -> None:
    await seeded(store)
    assert await preference(store) == (True, True)


async def test_as32_off_round_trips_in_load_and_tail_and_is_durable(
    make_store: Callable[[], Store],
) -> None:
    async with make_store() as store:
        await seeded(store)
        assert await put(store, OFF) == Committed()  # a boundary of the preference alone
        assert await preference(store) == (False, False)
    async with make_store() as store:
        assert await preference(store) == (False, False)


async def test_as32_true_removes_the_stored_off(make_store: Callable[[], Store]) -> None:
    async with make_store() as store:
        await seeded(store)
        await put(store, OFF)
        await put(store, ON)
        assert await preference(store) == (True, True)
        await put(store, ON)  # nothing stored: nothing to remove, still on
        assert await preference(store) == (True, True)
    async with make_store() as store:
        assert await preference(store) == (True, True)


async def test_as32_none_leaves_the_stored_preference_as_it_is(store: Store) -> None:
    await seeded(store)
    await put(store, OFF)
    await commit(store, "lead", rows=[lead(5)])
    await put(store, Boundary(operations=(op(1),)))
    await put(store, Boundary(partial=PartialChunk(stream="lead/2", start=0, parts=(b"p",))))
    assert await preference(store) == (False, False)


async def test_as32_it_rides_with_a_row_in_one_boundary(make_store: Callable[[], Store]) -> None:
    async with make_store() as store:
        await put(store, Boundary(create=session("lead", model="gamma"), auto_retry=False))
        await put(store, Boundary(rows=(lead(3),), auto_retry=True))
        await put(store, Boundary(rows=(lead(6),), auto_retry=False))
    async with make_store() as store:
        assert await history(store, "lead") == [lead(3), lead(6)]
        assert await preference(store) == (False, False)


#: The one-statement boundaries the stores run on their shortest paths, each with the
#: preference (a row of its own seq each time: ``on`` switches it on, then off).
LONE = {
    "row": lambda on: Boundary(rows=(lead(5 if on else 4),), auto_retry=on),
    "cut-state": lambda on: Boundary(
        cut_states=(CutStateChange(row_id="lead:r2", state=CutState.CONSUMED),), auto_retry=on
    ),
    "envelope": lambda on: Boundary(envelope=envelope("lead/2", sid="lead"), auto_retry=on),
}


@pytest.mark.parametrize("case", list(LONE))
async def test_as32_it_rides_with_a_lone_row_cut_state_or_envelope(
    make_store: Callable[[], Store], case: str
) -> None:
    cut_row = lead(2, RowKind.ASSISTANT, stream="lead/1", cut=owed_cut(remaining=4))
    async with make_store() as store:
        await commit(store, "lead", create=session("lead", model="gamma"), rows=[cut_row])
        await put(store, LONE[case](False))
        assert (await loaded(store)).auto_retry is False
    async with make_store() as store:
        assert (await loaded(store)).auto_retry is False
        await put(store, LONE[case](True))
        assert (await loaded(store)).auto_retry is True


async def test_as32_it_rides_with_receipts_and_a_partial_past_their_short_path(
    make_store: Callable[[], Store],
) -> None:
    chunk = PartialChunk(stream="lead/2", start=0, parts=(b"Plan", b": read"))
    async with make_store() as store:
        await seeded(store)
        await put(store, Boundary(operations=(op(1),), auto_retry=False))
        assert (await preference(store), await receipt(store, "lead/op1")) == (
            (False, False),
            op(1),
        )
        await put(store, Boundary(operations=(op(2), op(3)), partial=chunk, auto_retry=True))
        await put(store, Boundary(drop_partials=("lead/2",), auto_retry=False))
    async with make_store() as store:
        assert await preference(store) == (False, False)
        assert await receipt(store, "lead/op3") == op(3)
        assert (await loaded(store)).partials == ()


async def test_as32_the_preference_is_kept_per_session(store: Store) -> None:
    await seeded(store)
    await commit(store, "scout", create=session("scout"), rows=[row(1, "scout:r1", sid="scout")])
    await put(store, OFF, "scout")
    assert (await preference(store), await preference(store, "scout")) == (
        (True, True),
        (False, False),
    )


@pytest.mark.parametrize(
    "boundary",
    [OFF, ON, Boundary(operations=(op(1, "ghost"),), auto_retry=False)],
    ids=["off", "on", "off-with-a-receipt"],
)
async def test_as32_a_preference_of_an_unknown_session_is_refused(
    store: Store, boundary: Boundary
) -> None:
    with pytest.raises(UsageError, match="unknown session 'ghost'"):
        await put(store, boundary, "ghost")
    assert await store.load("ghost") is None
    assert await store.sessions() == []
    assert await receipt(store, "ghost/op1") is None  # nothing of the boundary was written


async def test_as32_a_refused_boundary_leaves_the_preference_as_it_was(store: Store) -> None:
    await seeded(store)
    await put(store, OFF)
    taken = row(3, "lead:r9", sid="lead")  # seq 3 is lead:r3's: the whole boundary goes
    with pytest.raises(UsageError, match="seq 3"):
        await put(store, Boundary(rows=(taken,), operations=(op(4),), auto_retry=True))
    assert await preference(store) == (False, False)
    assert await receipt(store, "lead/op4") is None


@pytest.mark.parametrize("value", [0, 1, "off", 0.0], ids=["0", "1", "text", "real"])
async def test_as32_a_preference_that_is_no_bool_is_refused_writing_nothing(
    store: Store, value: object
) -> None:
    await seeded(store)
    boundary = Boundary(rows=(lead(4),), auto_retry=value)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"^Boundary\.auto_retry of session 'lead' is ") as caught:
        await put(store, boundary)
    assert str(caught.value).endswith("not a bool; nothing was written"), caught.value
    assert await history(store, "lead") == [lead(3)]
    assert await preference(store) == (True, True)
