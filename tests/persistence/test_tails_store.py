"""Startup-retry tails and abandon markers in both stores (issue 24, PS-4, PS-8).

``scan_recoverable().tails`` names every session that owes no cut record and whose last row
that is not a system row is a user row, a ``[CONTINUE]`` sentinel or a partial row: its rows
from the last user row on, its last seq, its envelopes' streams, its last-written envelope and
whether a row names that envelope's stream, its queue version and its abandon marker.
``Boundary.abandon`` stores a session's marker (replacing any), ``clear_abandon`` removes it,
``load`` reads it back. Both stores refuse the same misuse in the same words.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from persistence import (
    AbandonMarker,
    Boundary,
    CutRecord,
    CutState,
    QueueSnapshot,
    RowKind,
    SessionTail,
    UsageError,
)
from persistence.records import MAX_ABANDON_REASON_BYTES
from tests.store_kit import commit, history, owner

from .helpers import cut as owed_cut
from .helpers import envelope, row, session

if TYPE_CHECKING:
    from collections.abc import Callable

    from persistence import HistoryRow, RecoveryScan, SessionLoad, Store

GIVEN_UP = AbandonMarker(reason="ModelNotFound: beta is not served", user_row="lead:r3")
ABORTED = AbandonMarker(reason="aborted", user_row="lead:r7")


def lead(
    seq: int,
    kind: RowKind = RowKind.USER,
    *,
    stream: str | None = None,
    cut: CutRecord | None = None,
) -> HistoryRow:
    """A row of ``lead``, its id as the engine mints them (``lead:rN``)."""
    return row(seq, f"lead:r{seq}", sid="lead", kind=kind, stream=stream, cut=cut)


async def scan(store: Store) -> RecoveryScan:
    found = await store.scan_recoverable()
    assert found.corrupt == ()
    return found


async def tail_of(store: Store, sid: str = "lead") -> SessionTail | None:
    return next((t for t in (await scan(store)).tails if t.session.id == sid), None)


async def loaded(store: Store, sid: str = "lead") -> SessionLoad:
    found = await store.load(sid)
    assert found is not None
    return found


async def seeded(store: Store, *rows: HistoryRow) -> None:
    await commit(store, "lead", create=session("lead", model="gamma"), rows=rows)


# -- which sessions are tails ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", [RowKind.USER, RowKind.SENTINEL, RowKind.PARTIAL])
async def test_ps4_a_history_ending_on_an_unanswered_row_is_a_tail(
    store: Store, kind: RowKind
) -> None:
    stream = "lead/2" if kind is RowKind.PARTIAL else None
    first = (lead(1), lead(2, RowKind.ASSISTANT, stream="lead/1"), lead(3))
    await seeded(store, *first, lead(4, kind, stream=stream))
    assert await tail_of(store) == SessionTail(
        session=session("lead", model="gamma"),
        rows=(lead(3), lead(4, kind, stream=stream)) if kind is not RowKind.USER else (lead(4),),
        last_seq=4,
    )


async def test_ps4_a_history_ending_on_an_assistant_row_is_no_tail(store: Store) -> None:
    await seeded(store, lead(1), lead(2, RowKind.ASSISTANT, stream="lead/1"))
    await commit(store, "idle", create=session("idle"))  # no rows at all
    await commit(
        store, "notes", create=session("notes"), rows=[row(1, sid="notes", kind=RowKind.SYSTEM)]
    )
    assert (await scan(store)).tails == ()


async def test_ps4_system_rows_after_the_unanswered_row_belong_to_the_tail(store: Store) -> None:
    rows = (lead(1, RowKind.ASSISTANT), lead(5), lead(6, RowKind.SYSTEM), lead(9, RowKind.SYSTEM))
    await seeded(store, *rows)
    tail = await tail_of(store)
    assert tail is not None
    assert (tail.rows, tail.last_seq) == (rows[1:], 9)


async def test_ps4_system_rows_after_an_answer_make_no_tail(store: Store) -> None:
    await seeded(store, lead(1), lead(2, RowKind.ASSISTANT), lead(3, RowKind.SYSTEM))
    assert (await scan(store)).tails == ()


async def test_ps4_a_tail_holds_its_rows_from_the_last_user_row_on(store: Store) -> None:
    rows = (
        lead(1),
        lead(2, RowKind.ASSISTANT, stream="lead/1"),
        lead(4),
        lead(5, RowKind.ASSISTANT, stream="lead/2"),
        lead(6, RowKind.SYSTEM),
        lead(8),
        lead(11, RowKind.SYSTEM),
        lead(12, RowKind.PARTIAL, stream="lead/3"),
    )
    await seeded(store, *rows)
    tail = await tail_of(store)
    assert tail is not None
    assert (tail.rows, tail.last_seq) == (rows[5:], 12)


async def test_ps4_a_tail_without_a_user_row_holds_every_row(store: Store) -> None:
    rows = (lead(0, RowKind.SYSTEM), lead(4, RowKind.ASSISTANT), lead(7, RowKind.SENTINEL))
    await seeded(store, *rows)
    tail = await tail_of(store)
    assert tail is not None
    assert (tail.rows, tail.last_seq) == (rows, 7)


async def test_ps4_a_session_owing_a_cut_is_no_tail_even_ending_on_a_user_row(
    store: Store,
) -> None:
    owed = lead(2, RowKind.ASSISTANT, stream="lead/1", cut=owed_cut(remaining=6))
    await seeded(store, lead(1), owed, lead(3))
    found = await scan(store)
    assert found.tails == ()
    assert [c.row for c in found.cuts] == [owed]
    # Once the cut is settled, the same history is a tail.
    await commit(store, "lead", cut_states=[("lead:r2", CutState.CONSUMED)])
    tail = await tail_of(store)
    assert tail is not None
    assert tail.rows == (lead(3),)


async def test_ps4_tails_are_listed_by_session_beside_the_cuts(store: Store) -> None:
    for sid in ("scout", "fixer", "apex"):
        await commit(store, sid, create=session(sid), rows=[row(1, sid=sid)])
    await commit(
        store,
        "owing",
        create=session("owing"),
        rows=[row(1, sid="owing", kind=RowKind.ASSISTANT, cut=owed_cut())],
    )
    found = await scan(store)
    assert [t.session.id for t in found.tails] == ["apex", "fixer", "scout"]
    assert [c.session.id for c in found.cuts] == ["owing"]


# -- envelopes, queue version, marker ---------------------------------------------------------


async def test_ps4_a_tail_names_its_streams_and_its_last_written_envelope(store: Store) -> None:
    await seeded(store, lead(1), lead(2, RowKind.ASSISTANT, stream="lead/1"), lead(3))
    first, second = envelope("lead/1", sid="lead", budget=11), envelope("lead/2", sid="lead")
    await commit(store, "lead", envelope=first)
    await commit(store, "lead", envelope=second)
    rewritten = envelope("lead/1", sid="lead", budget=4)  # an upsert keeps its place
    await commit(store, "lead", envelope=rewritten)
    tail = await tail_of(store)
    assert tail is not None
    assert (tail.streams, tail.envelope, tail.envelope_ended) == (
        ("lead/1", "lead/2"),
        second,
        False,
    )
    later = envelope("lead/2", sid="lead", budget=3)
    await commit(store, "lead", envelope=later)
    tail = await tail_of(store)
    assert tail is not None
    assert (tail.envelope, tail.envelope_ended) == (later, False)


async def test_ps4_a_tail_whose_last_stream_wrote_a_row_says_it_ended(store: Store) -> None:
    # The row naming the stream comes before the last user row: any row of the session counts.
    rows = (lead(1), lead(2, RowKind.ASSISTANT, stream="lead/1"), lead(3, RowKind.SYSTEM), lead(5))
    await seeded(store, *rows)
    await commit(store, "lead", envelope=envelope("lead/1", sid="lead"))
    tail = await tail_of(store)
    assert tail is not None
    assert (tail.rows, tail.envelope_ended) == ((lead(5),), True)


async def test_ps4_a_partial_row_of_the_last_stream_ends_it(store: Store) -> None:
    await seeded(store, lead(1), lead(2, RowKind.PARTIAL, stream="lead/4"))
    await commit(store, "lead", envelope=envelope("lead/4", sid="lead"))
    tail = await tail_of(store)
    assert tail is not None
    assert (tail.streams, tail.envelope_ended) == (("lead/4",), True)


async def test_ps4_the_queue_version_rides_in_tails_and_in_recoverable_cuts(
    store: Store,
) -> None:
    await seeded(store, lead(1))
    await commit(store, "lead", queue=QueueSnapshot(version=7))
    owed = row(1, sid="owing", kind=RowKind.ASSISTANT, cut=owed_cut())
    await commit(
        store, "owing", create=session("owing"), rows=[owed], queue=QueueSnapshot(version=12)
    )
    await commit(store, "fresh", create=session("fresh"), rows=[row(1, sid="fresh")])
    found = await scan(store)
    assert [(t.session.id, t.queue_version) for t in found.tails] == [("fresh", 0), ("lead", 7)]
    assert [(c.session.id, c.queue_version) for c in found.cuts] == [("owing", 12)]


async def test_ps8_an_abandon_marker_rides_in_the_tail_and_in_load(
    make_store: Callable[[], Store],
) -> None:
    async with make_store() as store:
        await seeded(store, lead(3))
        await commit(store, "lead", abandon=GIVEN_UP)
        tail = await tail_of(store)
        assert tail is not None
        assert tail.abandon == GIVEN_UP
    async with make_store() as store:  # durable
        assert (await loaded(store)).abandon == GIVEN_UP


async def test_ps8_a_session_without_a_marker_loads_none(store: Store) -> None:
    await seeded(store, lead(3))
    assert (await loaded(store)).abandon is None


async def test_ps8_a_marker_replaces_the_stored_one(store: Store) -> None:
    await seeded(store, lead(3))
    await commit(store, "lead", abandon=GIVEN_UP)
    await commit(store, "lead", abandon=ABORTED)
    assert (await loaded(store)).abandon == ABORTED
    bare = AbandonMarker(reason="ProviderRefused")  # no user row
    await commit(store, "lead", abandon=bare)
    assert (await loaded(store)).abandon == bare


async def test_ps8_clear_abandon_removes_the_marker(store: Store) -> None:
    await seeded(store, lead(3))
    await commit(store, "lead", abandon=GIVEN_UP)
    await commit(store, "lead", clear_abandon=True)
    assert (await loaded(store)).abandon is None
    await commit(store, "lead", clear_abandon=True)  # none stored: nothing to remove
    assert (await loaded(store)).abandon is None


async def test_ps8_clear_abandon_with_a_marker_stores_the_marker(store: Store) -> None:
    await seeded(store, lead(3))
    await commit(store, "lead", abandon=GIVEN_UP)
    await commit(store, "lead", abandon=ABORTED, clear_abandon=True)
    assert (await loaded(store)).abandon == ABORTED


async def test_ps8_a_marker_rides_with_the_rest_of_a_boundary(store: Store) -> None:
    await commit(
        store, "lead", create=session("lead", model="gamma"), rows=[lead(3)], abandon=GIVEN_UP
    )
    await commit(store, "lead", rows=[lead(7)], queue=QueueSnapshot(version=2), abandon=ABORTED)
    found = await loaded(store)
    assert (found.rows, found.queue_version, found.abandon) == ((lead(3), lead(7)), 2, ABORTED)


@pytest.mark.parametrize(
    "boundary",
    [Boundary(abandon=GIVEN_UP), Boundary(clear_abandon=True)],
    ids=["abandon", "clear"],
)
async def test_ps8_a_marker_of_an_unknown_session_is_refused(
    store: Store, boundary: Boundary
) -> None:
    with pytest.raises(UsageError, match="unknown session 'ghost'"):
        await store.commit("ghost", boundary, owner=owner(store))
    assert await store.load("ghost") is None
    assert await store.sessions() == []


#: Markers a reader would call damaged, and the start of the refusal.
REFUSED = {
    "reason-empty": (AbandonMarker(reason=""), "Boundary.abandon: $.reason: empty"),
    "reason-integer": (AbandonMarker(reason=5), "Boundary.abandon: $.reason: int, not text"),  # type: ignore[arg-type]
    "reason-bytes": (
        AbandonMarker(reason=b"aborted"),  # type: ignore[arg-type]
        "Boundary.abandon: $.reason: bytes, not text",
    ),
    "reason-surrogate": (
        AbandonMarker(reason="aborted \udcff"),
        "Boundary.abandon: $.reason: not encodable as UTF-8",
    ),
    "reason-too-long": (
        AbandonMarker(reason="é" * (MAX_ABANDON_REASON_BYTES // 2) + "x"),
        f"Boundary.abandon: $.reason: {MAX_ABANDON_REASON_BYTES + 1:,} bytes, more than "
        f"{MAX_ABANDON_REASON_BYTES:,}",
    ),
    "user-row-integer": (
        AbandonMarker(reason="aborted", user_row=3),  # type: ignore[arg-type]
        "Boundary.abandon: $.user_row: int, not text",
    ),
    "user-row-surrogate": (
        AbandonMarker(reason="aborted", user_row="lead:\udcff"),
        "Boundary.abandon: $.user_row: not encodable as UTF-8",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
async def test_ps8_a_marker_a_reader_would_call_damaged_is_refused_writing_nothing(
    store: Store, case: str
) -> None:
    marker, said = REFUSED[case]
    await seeded(store, lead(3))
    await commit(store, "lead", abandon=GIVEN_UP)
    with pytest.raises(UsageError) as caught:
        await commit(store, "lead", rows=[lead(4)], abandon=marker)
    assert str(caught.value).startswith(said), caught.value
    assert str(caught.value).endswith("; nothing was written")
    assert await history(store, "lead") == [lead(3)]
    assert (await loaded(store)).abandon == GIVEN_UP


async def test_ps8_the_longest_reason_is_stored_whole(store: Store) -> None:
    longest = AbandonMarker(reason="é" * (MAX_ABANDON_REASON_BYTES // 2), user_row="")
    await seeded(store, lead(3))
    await commit(store, "lead", abandon=longest)
    assert (await loaded(store)).abandon == longest


async def test_ps8_a_session_created_by_the_same_boundary_takes_a_marker(store: Store) -> None:
    await commit(store, "lead", create=session("lead", model="gamma"), abandon=ABORTED)
    assert (await loaded(store)).abandon == ABORTED
