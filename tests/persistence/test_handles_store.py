"""Delegated-turn handle records in both stores (PS-1's owner handle writes, B10; issue 23).

``Boundary.handles`` upserts whole records (no session record needed), ``Store.handles()``
reads them by id, filtered by owner and target; a handle a store could not read back sanely is
refused at the commit with nothing written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
import pytest

from persistence import HandleQuery, HandleRecord, HandleStatus, UsageError
from persistence.records import MAX_HANDLE_BYTES
from tests.store_kit import commit, history

from .helpers import row, session

if TYPE_CHECKING:
    from collections.abc import Callable

    from persistence import Store

#: A settled handle whose every field differs from its default.
SETTLED = HandleRecord(
    handle_id="h-7",
    owner="lead",
    target="scout",
    turn_id="scout:r4",
    status=HandleStatus.COMPLETED,
    deferred=("scout/2", "scout/3"),
    reason="report filed",
    report="three hosts patched",
    delivered=True,
    created_at=12.5,
    settled_at=19.75,
)
#: A running handle the owner deferred on.
ACTIVE = HandleRecord(
    handle_id="h-3",
    owner="lead",
    target="fixer",
    turn_id="fixer:r2",
    deferred=("fixer/1",),
    created_at=4.25,
)


async def handles(store: Store, **filters: str) -> HandleQuery:
    """``store.handles(...)``, asserting no record is corrupt (a typed store holds none)."""
    query = await store.handles(**filters)
    assert query.corrupt == ()
    return query


async def test_ps1_a_handle_round_trips_whole_and_survives_a_reopen(
    make_store: Callable[[], Store],
) -> None:
    async with make_store() as store:
        await commit(store, "lead", handles=[SETTLED, ACTIVE])
        assert (await handles(store)).records == (ACTIVE, SETTLED)  # by handle_id
    async with make_store() as store:
        assert (await handles(store)).records == (ACTIVE, SETTLED)


async def test_ps1_a_handle_write_replaces_the_record_with_its_id(store: Store) -> None:
    await commit(store, "lead", handles=[ACTIVE])
    settled = msgspec.structs.replace(
        ACTIVE, status=HandleStatus.INTERRUPTED, reason="owner stopped it", settled_at=8.5
    )
    await commit(store, "fixer", handles=[settled])  # the target's boundary decided it
    assert (await handles(store)).records == (settled,)


async def test_handles_are_filtered_by_owner_and_by_target(store: Store) -> None:
    other = msgspec.structs.replace(ACTIVE, handle_id="h-1", owner="scout", target="lead")
    await commit(store, "lead", handles=[SETTLED, ACTIVE, other])
    assert (await handles(store, owner="lead")).records == (ACTIVE, SETTLED)
    assert (await handles(store, target="lead")).records == (other,)
    assert (await handles(store, owner="lead", target="scout")).records == (SETTLED,)
    assert (await handles(store, owner="nobody")).records == ()


async def test_a_handles_only_boundary_needs_no_session_record(store: Store) -> None:
    await commit(store, "ghost", handles=[ACTIVE])
    assert (await handles(store)).records == (ACTIVE,)
    assert await store.sessions() == []


async def test_handles_ride_with_the_rest_of_a_boundary(store: Store) -> None:
    await commit(store, "lead", create=session("lead"), rows=[row(1, sid="lead")], handles=[ACTIVE])
    assert await history(store, "lead") == [row(1, sid="lead")]
    assert (await handles(store)).records == (ACTIVE,)


async def test_a_boundary_refused_for_another_part_writes_no_handle(store: Store) -> None:
    await commit(store, "lead", create=session("lead"), rows=[row(1, sid="lead")])
    with pytest.raises(UsageError, match="seq 1 of session 'lead' is already taken"):
        await commit(store, "lead", rows=[row(1, "r9", sid="lead")], handles=[ACTIVE])
    assert (await handles(store)).records == ()
    with pytest.raises(UsageError, match="unknown session 'nobody'"):
        await commit(store, "nobody", rows=[row(1, sid="nobody")], handles=[ACTIVE])
    assert (await handles(store)).records == ()


# -- refusals: one test per rule, each writes nothing (not even the boundary's row) ----------


async def refused(store: Store, match: str, *records: HandleRecord) -> None:
    """Commit ``records`` with a row; assert the refusal names ``match`` and nothing is written."""
    await commit(store, "lead", create=session("lead"))
    with pytest.raises(UsageError, match=match) as caught:
        await commit(store, "lead", rows=[row(1, sid="lead")], handles=records)
    assert "\n" not in str(caught.value)
    assert (await handles(store)).records == ()
    assert await history(store, "lead") == []


def changed(**fields: object) -> HandleRecord:
    return msgspec.structs.replace(ACTIVE, **fields)


async def test_a_handle_with_an_empty_id_is_refused(store: Store) -> None:
    await refused(store, r"Boundary.handles\[0\] \(''\).handle_id: empty", changed(handle_id=""))


async def test_a_handle_with_an_empty_owner_is_refused(store: Store) -> None:
    await refused(store, r"handles\[0\] \('h-3'\).owner: empty", changed(owner=""))


async def test_a_handle_with_an_empty_target_is_refused(store: Store) -> None:
    await refused(store, r"handles\[0\] \('h-3'\).target: empty", changed(target=""))


async def test_a_handle_with_an_empty_turn_id_is_refused(store: Store) -> None:
    await refused(store, r"handles\[0\] \('h-3'\).turn_id: empty", changed(turn_id=""))


async def test_a_handle_whose_owner_is_its_target_is_refused(store: Store) -> None:
    await refused(store, r"\.target: 'lead' is the owner", changed(target="lead"))


async def test_a_handle_with_an_empty_deferred_id_is_refused(store: Store) -> None:
    await refused(store, r"\.deferred\[1\]: empty", changed(deferred=("fixer/1", "")))


async def test_a_handle_deferring_twice_on_one_id_is_refused(store: Store) -> None:
    repeated = changed(deferred=("fixer/1", "fixer/4", "fixer/1"))
    await refused(store, r"\.deferred\[2\]: 'fixer/1' is there twice", repeated)


async def test_a_handle_status_that_is_not_a_handle_status_is_refused(store: Store) -> None:
    await refused(
        store, r"\.status: 'completed' is not a HandleStatus", changed(status="completed")
    )


async def test_a_settled_handle_without_a_reason_is_refused(store: Store) -> None:
    await refused(store, r"\.reason: a error handle needs one", changed(status=HandleStatus.ERROR))


async def test_an_active_handle_with_a_reason_is_refused(store: Store) -> None:
    await refused(store, r"\.reason: an active handle has none", changed(reason="early"))


async def test_a_report_on_a_handle_that_did_not_complete_is_refused(store: Store) -> None:
    stopped = changed(status=HandleStatus.INTERRUPTED, reason="stopped", report="half done")
    await refused(store, r"\.report: only a completed handle has one", stopped)


async def test_an_active_handle_marked_delivered_is_refused(store: Store) -> None:
    await refused(store, r"\.delivered: only a settled handle", changed(delivered=True))


async def test_a_handle_id_twice_in_one_boundary_is_refused(store: Store) -> None:
    again = changed(deferred=("fixer/1", "fixer/2"))
    await refused(store, r"handle 'h-3' appears twice in one boundary", ACTIVE, again)


async def test_a_handle_too_large_to_read_back_is_refused(store: Store) -> None:
    huge = msgspec.structs.replace(SETTLED, report="r" * MAX_HANDLE_BYTES)
    await refused(store, r"handles\[0\] \('h-7'\): 1,048,\d+ bytes, more than", huge)


async def test_a_handle_reason_that_is_not_text_is_refused(store: Store) -> None:
    coded = changed(status=HandleStatus.ERROR, reason=503)
    await refused(store, r"\.reason: int, not text", coded)
