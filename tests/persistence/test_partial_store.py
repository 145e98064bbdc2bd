"""The session's partial (B4, PS-2) in both stores: chunks by position, drops, the gap rule.

``Boundary.partial`` upserts a stream's parts at ``start``, ``start + 1`` ...; a stored part
at a position is replaced. ``Boundary.drop_partials`` deletes every part of the streams it
names, before the boundary's chunk is written. ``load`` returns one ``StoredPartial`` per
stream, in the order the streams first wrote a part, its parts by position up to the first
missing one (``gap``). Like receipts, chunks need no session record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from persistence import (
    Boundary,
    MemoryStore,
    OperationRecord,
    OpState,
    PartialChunk,
    RowKind,
    StoredPartial,
    UsageError,
)
from tests.store_kit import commit, history, owner, receipt

from .helpers import client, row, session

if TYPE_CHECKING:
    from persistence import Store

#: Streams whose text order differs from the order they write in (``lead/9`` writes first).
FIRST, SECOND = "lead/9", "lead/10"
#: Parts as the stream manager might encode them: distinct, byte-exact, one not UTF-8.
P = (b'{"t":"text","v":"Plan"}', b'{"t":"text","v":": read"}', b"\xff\x00raw", b"\n", b"tail")


def chunk(stream: str, start: int, *parts: bytes) -> PartialChunk:
    return PartialChunk(stream=stream, start=start, parts=parts)


def op(n: int, sid: str = "lead") -> OperationRecord:
    """A receipt, as the runner writes one beside each chunk."""
    return OperationRecord(
        op_id=f"{sid}/op{n}",
        session=sid,
        stream=FIRST,
        call_id=f"call{n}",
        capability=client("grep"),
        target="src/",
        started_at=40.0 + n,
        state=OpState.RUNNING,
    )


async def partials(store: Store, sid: str = "lead") -> tuple[StoredPartial, ...]:
    loaded = await store.load(sid)
    assert loaded is not None
    return loaded.partials


async def created(store: Store, sid: str = "lead") -> None:
    await commit(store, sid, create=session(sid, model="delta"))


async def test_ps1_b4_partial_chunks_append_and_load_in_order(store: Store) -> None:
    await created(store)
    await commit(store, "lead", operations=[op(1)], partial=chunk(FIRST, 0, *P[:3]))
    await commit(store, "lead", operations=[op(2)], partial=chunk(FIRST, 3, *P[3:]))
    assert await partials(store) == (StoredPartial(stream=FIRST, parts=P),)
    assert await receipt(store, "lead/op2") == op(2)


async def test_ps1_b4_chunk_replaces_a_stored_position(store: Store) -> None:
    await created(store)
    await commit(store, "lead", partial=chunk(FIRST, 0, *P[:3]))
    await commit(store, "lead", operations=[op(1)], partial=chunk(FIRST, 1, b"again", P[4]))
    assert await partials(store) == (StoredPartial(stream=FIRST, parts=(P[0], b"again", P[4])),)


async def test_ps2_drop_partials_then_chunk_in_one_boundary(store: Store) -> None:
    await created(store)
    await commit(store, "lead", partial=chunk(FIRST, 0, *P[:2]))
    answer = row(4, "lead:r4", sid="lead", kind=RowKind.ASSISTANT, stream=FIRST)
    await commit(
        store,
        "lead",
        rows=[answer],
        operations=[op(3)],
        drop_partials=[FIRST],
        partial=chunk(SECOND, 0, P[2]),
    )
    assert await history(store, "lead") == [answer]
    assert await partials(store) == (StoredPartial(stream=SECOND, parts=(P[2],)),)


@pytest.mark.parametrize("shape", ["receipts", "plan"])
async def test_ps2_a_drop_runs_before_its_boundarys_chunk_of_the_same_stream(
    store: Store, shape: str
) -> None:
    await created(store)
    await commit(store, "lead", partial=chunk(FIRST, 0, *P))
    rows = [row(5, "lead:r5", sid="lead")] if shape == "plan" else []
    await commit(store, "lead", rows=rows, drop_partials=[FIRST], partial=chunk(FIRST, 0, P[3]))
    assert await partials(store) == (StoredPartial(stream=FIRST, parts=(P[3],)),)


async def test_b4_a_drop_alone_deletes_only_its_streams_of_its_session(store: Store) -> None:
    await created(store)
    await created(store, "scout")
    await commit(store, "lead", partial=chunk(FIRST, 0, P[0]))
    await commit(store, "lead", partial=chunk(SECOND, 0, P[1]))
    await commit(store, "scout", partial=chunk(FIRST, 0, P[2]))
    await commit(store, "lead", drop_partials=[FIRST, "lead/unknown"])
    assert await partials(store) == (StoredPartial(stream=SECOND, parts=(P[1],)),)
    assert await partials(store, "scout") == (StoredPartial(stream=FIRST, parts=(P[2],)),)


async def test_b4_partial_needs_no_session_record(store: Store) -> None:
    await commit(store, "loose", operations=[op(7, "loose")], partial=chunk(FIRST, 0, P[1]))
    assert await store.load("loose") is None
    assert await receipt(store, "loose/op7") == op(7, "loose")
    await created(store, "loose")
    assert await partials(store, "loose") == (StoredPartial(stream=FIRST, parts=(P[1],)),)


async def test_b4_two_streams_keep_their_order(store: Store) -> None:
    await created(store)
    await commit(store, "lead", partial=chunk(FIRST, 0, P[0]))
    await commit(store, "lead", partial=chunk(SECOND, 0, P[1], P[2]))
    await commit(store, "lead", partial=chunk(FIRST, 0, b"replaced", P[3]))
    assert await partials(store) == (
        StoredPartial(stream=FIRST, parts=(b"replaced", P[3])),
        StoredPartial(stream=SECOND, parts=(P[1], P[2])),
    )
    # Dropped and written again, a stream writes first anew: it comes last.
    await commit(store, "lead", drop_partials=[FIRST], partial=chunk(FIRST, 0, P[4]))
    assert [p.stream for p in await partials(store)] == [SECOND, FIRST]


BAD = {
    "negative-start": (
        Boundary(partial=PartialChunk(stream=FIRST, start=-1, parts=(P[0],))),
        "positions -1..0 are not in 0",
    ),
    "part-not-bytes": (
        Boundary(partial=PartialChunk(stream=FIRST, start=2, parts=(P[0], "text"))),  # type: ignore[arg-type]
        r"Boundary.partial.parts\[1\] of stream 'lead/9' is str, not bytes",
    ),
    "empty-stream": (
        Boundary(partial=PartialChunk(stream="", start=0, parts=(P[0],))),
        "Boundary.partial of session 'lead' names no stream",
    ),
    "empty-drop": (
        Boundary(drop_partials=(FIRST, "")),
        r"Boundary.drop_partials\[1\] of session 'lead' is not a stream id",
    ),
}


@pytest.mark.parametrize("shape", ["receipts", "plan"])
@pytest.mark.parametrize("case", list(BAD))
async def test_b4_bad_chunk_refused_nothing_written(store: Store, case: str, shape: str) -> None:
    await created(store)
    await commit(store, "lead", partial=chunk(FIRST, 0, P[0]))
    bad, named = BAD[case]
    rows = (row(2, "lead:r2", sid="lead"),) if shape == "plan" else ()
    boundary = Boundary(
        rows=rows,
        operations=(op(5),),
        drop_partials=bad.drop_partials,
        partial=bad.partial,
    )
    with pytest.raises(UsageError, match=named):
        await store.commit("lead", boundary, owner=owner(store))
    assert await history(store, "lead") == []
    assert await receipt(store, "lead/op5") is None
    assert await partials(store) == (StoredPartial(stream=FIRST, parts=(P[0],)),)


async def test_b4_gap_stops_the_read(store: Store) -> None:
    await created(store)
    await commit(store, "lead", partial=chunk(FIRST, 0, P[0], P[1]))
    await commit(store, "lead", partial=chunk(FIRST, 3, P[3]))
    assert await partials(store) == (StoredPartial(stream=FIRST, parts=(P[0], P[1]), gap=2),)
    await commit(store, "lead", partial=chunk(FIRST, 2, P[2]))  # the gap filled
    assert await partials(store) == (StoredPartial(stream=FIRST, parts=P[:4]),)


async def test_b4_a_chunk_of_no_parts_stores_nothing(store: Store) -> None:
    await created(store)
    await commit(store, "lead", operations=[op(1)], partial=chunk(FIRST, 4))
    assert await partials(store) == ()
    assert await receipt(store, "lead/op1") == op(1)


async def test_b4_a_refused_boundary_leaves_no_chunk_behind(store: Store) -> None:
    await commit(store, "lead", create=session("lead"), rows=[row(1, "lead:r1", sid="lead")])
    with pytest.raises(UsageError, match="seq"):  # seq 1 is taken: the whole boundary goes
        await commit(
            store,
            "lead",
            rows=[row(1, "lead:r9", sid="lead")],
            operations=[op(2)],
            drop_partials=[SECOND],
            partial=chunk(FIRST, 0, *P),
        )
    assert await partials(store) == ()
    assert await receipt(store, "lead/op2") is None


async def test_b4_a_chunk_whose_start_is_no_int_is_refused_naming_it() -> None:
    store = MemoryStore()
    async with store:
        bad = PartialChunk(stream="s1/4", start=True, parts=(b"{}",))
        with pytest.raises(UsageError, match=r"partial\.start .* bool, not an int"):
            await store.commit("s1", Boundary(partial=bad), owner=store.owner)
        assert await store.load("s1") is None
