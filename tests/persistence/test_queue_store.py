"""The durable message queue in both stores (issue 24): snapshots, the version guard, keep.

``Boundary.queue`` holds a session's whole queue after the boundary (``QueueSnapshot``): a
version above the stored one replaces the session's queue (every stored entry neither in
``entries`` nor in ``keep`` is deleted, the entries are upserted), any other is skipped while
the rest of the boundary is written. ``load`` serves the queue by position, ``queued()`` every
session's, ``scan_recoverable().queued`` names the sessions holding one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
import pytest

from message_queue import DispatchMode, EntryKind, EntryState, MessageState, encode_entry
from persistence import Boundary, QueuedEntryRecord, QueueQuery, QueueSnapshot, UsageError
from persistence.records import MAX_QUEUED_BYTES, MAX_SEQ
from tests.store_kit import commit, history

from .helpers import row, session
from .test_handles_store import ACTIVE
from .test_resolve_store import STUCK

if TYPE_CHECKING:
    from collections.abc import Callable

    from persistence import SessionLoad, Store


def entry(
    entry_id: str,
    position: int,
    *,
    sid: str = "lead",
    kind: EntryKind = EntryKind.USER,
    text: str = "fix the flaky test",
) -> QueuedEntryRecord:
    """A queued entry whose body is what the queue writes (``encode_entry``)."""
    state = EntryState(
        id=entry_id,
        kind=kind,
        mode=DispatchMode.TURN_END,
        messages=(MessageState(id=entry_id, text=text),),
    )
    return QueuedEntryRecord(
        session=sid, entry_id=entry_id, position=position, kind=kind.value, body=encode_entry(state)
    )


Q1 = entry("q1", 4)
Q2 = entry("q2", 9, kind=EntryKind.WAKE, text="build finished")
Q3 = entry("q3", 12, kind=EntryKind.REPORT, text="three hosts patched")


def snapshot(
    version: int, *entries: QueuedEntryRecord, keep: tuple[str, ...] = ()
) -> QueueSnapshot:
    return QueueSnapshot(version=version, entries=entries, keep=keep)


async def loaded(store: Store, sid: str = "lead") -> SessionLoad:
    found = await store.load(sid)
    assert found is not None
    assert found.queue_corrupt == ()
    return found


async def queued(store: Store, sid: str | None = None) -> QueueQuery:
    """``store.queued(...)``, asserting nothing is corrupt (a typed store holds nothing so)."""
    query = await store.queued(sid)
    assert query.corrupt == ()
    return query


async def seeded(store: Store, *entries: QueuedEntryRecord, version: int = 3) -> None:
    await commit(store, "lead", create=session("lead"), queue=snapshot(version, *entries))


async def test_queue_a_snapshot_round_trips_by_position_and_survives_a_reopen(
    make_store: Callable[[], Store],
) -> None:
    async with make_store() as store:
        await seeded(store, Q3, Q1, Q2)
        found = await loaded(store)
        assert (found.queue, found.queue_version) == ((Q1, Q2, Q3), 3)
    async with make_store() as store:
        assert (await loaded(store)).queue == (Q1, Q2, Q3)
        assert await queued(store) == QueueQuery(records=(Q1, Q2, Q3), versions=(("lead", 3),))


async def test_queue_a_newer_snapshot_replaces_the_queue(store: Store) -> None:
    await seeded(store, Q1, Q2)
    moved = msgspec.structs.replace(Q2, position=2, body=entry("q2", 2, text="rebuilt").body)
    await commit(store, "lead", queue=snapshot(4, moved, Q3))
    found = await loaded(store)
    assert (found.queue, found.queue_version) == ((moved, Q3), 4)  # q1 gone, q2 upserted


async def test_queue_an_empty_snapshot_empties_the_queue_and_keeps_its_version(
    store: Store,
) -> None:
    await seeded(store, Q1, Q2)
    await commit(store, "lead", queue=snapshot(7))
    found = await loaded(store)
    assert (found.queue, found.queue_version) == ((), 7)
    assert await queued(store) == QueueQuery(versions=(("lead", 7),))


@pytest.mark.parametrize("stale", [3, 2, 1], ids=["equal", "older", "first"])
async def test_queue_a_stale_snapshot_is_skipped_and_the_rest_is_written(
    store: Store, stale: int
) -> None:
    await seeded(store, Q1, version=3)
    await commit(store, "lead", rows=[row(1, sid="lead")], queue=snapshot(stale, Q2, Q3))
    found = await loaded(store)
    assert (found.queue, found.queue_version) == ((Q1,), 3)
    assert found.rows == (row(1, sid="lead"),)


async def test_queue_the_one_decided_last_wins_whatever_order_the_writes_land_in(
    store: Store,
) -> None:
    await seeded(store, Q1, version=1)
    await commit(store, "lead", queue=snapshot(6, Q3))
    await commit(store, "lead", queue=snapshot(5, Q2))  # decided before version 6, landed after
    assert (await loaded(store)).queue == (Q3,)


async def test_queue_keep_spares_the_stored_entries_it_names(store: Store) -> None:
    await seeded(store, Q1, Q2)
    await commit(store, "lead", queue=snapshot(4, Q3, keep=("q1", "q-unknown")))
    found = await loaded(store)
    assert (found.queue, found.queue_version) == ((Q1, Q3), 4)
    await commit(store, "lead", queue=snapshot(5, Q3))  # no longer kept: deleted
    assert (await loaded(store)).queue == (Q3,)


async def test_queue_an_entry_in_keep_and_entries_is_written_once_as_given(
    store: Store,
) -> None:
    await seeded(store, Q1)
    rewritten = msgspec.structs.replace(Q1, position=20)
    await commit(store, "lead", queue=snapshot(4, rewritten, keep=("q1",)))
    assert (await loaded(store)).queue == (rewritten,)


async def test_queue_entries_read_back_by_position_then_entry_id(store: Store) -> None:
    tied = [entry("q8", 5), entry("q5", 5), entry("q7", 0), entry("q6", MAX_SEQ)]
    await seeded(store, *tied)
    assert [e.entry_id for e in (await loaded(store)).queue] == ["q7", "q5", "q8", "q6"]


async def test_queue_a_session_created_by_the_same_boundary_takes_a_queue(
    store: Store,
) -> None:
    await commit(store, "lead", create=session("lead"), queue=snapshot(1, Q1))
    assert (await loaded(store)).queue == (Q1,)


async def test_queue_rides_with_the_rest_of_a_boundary(store: Store) -> None:
    await commit(store, "lead", create=session("lead"))
    await commit(store, "lead", rows=[row(1, sid="lead")], queue=snapshot(2, Q1))
    assert await history(store, "lead") == [row(1, sid="lead")]
    assert (await loaded(store)).queue == (Q1,)


async def test_queue_rides_with_receipts_past_their_short_path(store: Store) -> None:
    await commit(store, "s3", create=session("s3"))
    await commit(store, "s3", operations=[STUCK], queue=snapshot(2, entry("q1", 0, sid="s3")))
    assert (await store.receipts()).records == (STUCK,)
    assert (await loaded(store, "s3")).queue == (entry("q1", 0, sid="s3"),)


async def test_queue_queued_is_filtered_by_session(store: Store) -> None:
    await seeded(store, Q1, Q2)
    other = entry("q1", 0, sid="scout")
    await commit(store, "scout", create=session("scout"), queue=snapshot(8, other))
    everything = await queued(store)
    assert everything.records == (Q1, Q2, other)
    assert everything.versions == (("lead", 3), ("scout", 8))
    assert await queued(store, "scout") == QueueQuery(records=(other,), versions=(("scout", 8),))
    assert await queued(store, "nobody") == QueueQuery()


async def test_queue_the_scan_names_every_session_holding_an_entry(store: Store) -> None:
    await seeded(store, Q1)
    await commit(
        store, "scout", create=session("scout"), queue=snapshot(2, entry("q4", 1, sid="scout"))
    )
    await commit(store, "fixer", create=session("fixer"), queue=snapshot(2))  # versioned, empty
    await commit(store, "idle", create=session("idle"))
    assert (await store.scan_recoverable()).queued == ("lead", "scout")
    await commit(store, "scout", queue=snapshot(3))
    assert (await store.scan_recoverable()).queued == ("lead",)


async def test_queue_a_session_without_a_queue_loads_version_0(store: Store) -> None:
    await commit(store, "lead", create=session("lead"), rows=[row(1, sid="lead")])
    found = await loaded(store)
    assert (found.queue, found.queue_version) == ((), 0)
    assert await queued(store) == QueueQuery()


async def test_queue_a_closed_store_refuses_queue_reads_and_writes(
    make_store: Callable[[], Store],
) -> None:
    async with make_store() as store:
        await seeded(store, Q1)
        token = store.owner
    with pytest.raises(UsageError, match="not open"):
        await store.queued()
    with pytest.raises(UsageError):
        await store.commit("lead", Boundary(queue=snapshot(9, Q2)), owner=token)


# -- refusals: one test per rule, each writes nothing (not even the boundary's row) ----------


async def refused(store: Store, match: str, queue: QueueSnapshot, sid: str = "lead") -> None:
    """Commit ``queue`` with a row; assert the refusal names ``match`` and nothing is written."""
    await seeded(store, Q1, version=2)
    with pytest.raises(UsageError, match=match) as caught:
        await commit(store, sid, rows=[row(1, sid=sid)], queue=queue)
    assert "\n" not in str(caught.value)
    found = await loaded(store)
    assert (found.queue, found.queue_version, found.rows) == ((Q1,), 2, ())
    assert await queued(store) == QueueQuery(records=(Q1,), versions=(("lead", 2),))


async def test_queue_an_entry_of_another_session_is_refused(store: Store) -> None:
    foreign = entry("q2", 1, sid="scout")
    await refused(
        store,
        r"Boundary.queue.entries\[1\] \(entry q2\) belongs to session 'scout', not to 'lead'",
        snapshot(3, Q3, foreign),
    )


async def test_queue_an_entry_id_given_twice_is_refused(store: Store) -> None:
    again = msgspec.structs.replace(Q3, position=30)
    await refused(
        store, r"entries\[1\] \('q3'\): the entry id is given twice", snapshot(3, Q3, again)
    )


async def test_queue_a_snapshot_of_an_unknown_session_is_refused(store: Store) -> None:
    await refused(
        store, "unknown session 'nobody'", snapshot(1, entry("q1", 0, sid="nobody")), "nobody"
    )


async def test_queue_a_refused_queue_part_takes_the_handles_before_it_back(store: Store) -> None:
    await seeded(store, Q1)
    with pytest.raises(UsageError, match="unknown session 'ghost'"):
        await commit(
            store, "ghost", handles=[ACTIVE], queue=snapshot(1, entry("q1", 0, sid="ghost"))
        )
    assert (await store.handles()).records == ()
    assert await queued(store) == QueueQuery(records=(Q1,), versions=(("lead", 3),))


@pytest.mark.parametrize("version", [0, -1, MAX_SEQ + 1, "4"])
async def test_queue_a_version_out_of_range_is_refused(store: Store, version: object) -> None:
    bad = QueueSnapshot(version=version, entries=(Q2,))  # type: ignore[arg-type]
    await refused(store, r"Boundary.queue: version .* is not an integer in 1\.\.", bad)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("entry_id", "", r"\$.entry_id: not a non-empty string"),
        ("position", -3, r"\$.position: -3 is not an integer"),
        ("position", 2.5, r"\$.position: 2.5 is not an integer"),
        ("kind", "robot", r"\$.kind: 'robot' is not one of follow-up, report, system, user, wake"),
        ("body", b"", r"\$.body: not a non-empty byte string"),
        ("body", "text", r"\$.body: not a non-empty byte string"),
        ("body", b"x" * (MAX_QUEUED_BYTES + 1), r"\$.body: 4194305 bytes, more than 4194304"),
    ],
)
async def test_queue_an_entry_a_reader_would_call_damaged_is_refused(
    store: Store, field: str, value: object, match: str
) -> None:
    bad = msgspec.structs.replace(Q3, **{field: value})
    await refused(store, r"Boundary.queue.entries\[0\] .*" + match, snapshot(3, bad))


async def test_queue_a_kept_id_that_is_not_text_is_refused(store: Store) -> None:
    bad = QueueSnapshot(version=3, keep=("q1", 7))  # type: ignore[arg-type]
    await refused(store, r"Boundary.queue.keep\[1\]: 7 is not an entry id", bad)
