"""The Store conformance suite: every implementation passes the same tests.

Parametrized over ``MemoryStore`` and ``SqliteStore(tmp_path / "t.db")`` by the ``store`` and
``make_store`` fixtures (conftest.py). A future PostgreSQL store joins the parametrization.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import msgspec
import pytest

from persistence import CutState, HistoryRow, RowKind, TurnkeeperError, UsageError

from .helpers import cut, envelope, row, session

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from persistence import Store


async def test_sessions_are_listed_by_id(store: Store) -> None:
    for sid in ("s3", "s1", "s2"):
        await store.create_session(session(sid))
    assert [record.id for record in await store.sessions()] == ["s1", "s2", "s3"]


async def test_sessions_round_trip_every_field(store: Store) -> None:
    record = session("s1", model="beta", created_seq=7, goal="ship it")
    await store.create_session(record)
    assert await store.sessions() == [record]


async def test_create_session_is_idempotent_for_an_identical_record(store: Store) -> None:
    await store.create_session(session("s1", goal="g"))
    await store.create_session(session("s1", goal="g"))
    assert await store.sessions() == [session("s1", goal="g")]


async def test_create_session_refuses_a_different_record_with_the_same_id(store: Store) -> None:
    await store.create_session(session("s1", model="alpha"))
    with pytest.raises(UsageError, match="'s1'"):
        await store.create_session(session("s1", model="beta"))
    assert await store.sessions() == [session("s1", model="alpha")]


async def test_append_and_history_round_trip_every_field_byte_exact(store: Store) -> None:
    await store.create_session(session())
    rows = [
        row(1, kind=RowKind.USER, body=b'{"text":"hi \\u00e9"}'),
        row(2, kind=RowKind.ASSISTANT, body=bytes(range(256)), stream="st1", cut=cut()),
        row(3, kind=RowKind.PARTIAL, body=b"", stream="st1"),
        row(4, kind=RowKind.SENTINEL),
        row(5, kind=RowKind.SYSTEM),
    ]
    await store.append(rows)
    got = await store.history("s1")
    assert got == rows
    assert [r.body for r in got] == [r.body for r in rows]
    assert all(type(r.kind) is RowKind for r in got)


async def test_history_is_ordered_by_seq_not_by_append_order(store: Store) -> None:
    await store.create_session(session())
    await store.append([row(5)])
    await store.append([row(2), row(9)])
    await store.append([row(1)])
    assert [r.seq for r in await store.history("s1")] == [1, 2, 5, 9]


async def test_history_of_an_unknown_session_is_empty(store: Store) -> None:
    assert await store.history("nobody") == []


async def test_history_keeps_sessions_apart(store: Store) -> None:
    await store.create_session(session("s1"))
    await store.create_session(session("s2"))
    await store.append([row(1, sid="s1"), row(1, sid="s2"), row(2, sid="s2")])
    assert [(r.session, r.seq) for r in await store.history("s2")] == [("s2", 1), ("s2", 2)]
    assert [(r.session, r.seq) for r in await store.history("s1")] == [("s1", 1)]


async def test_one_append_may_span_sessions(store: Store) -> None:
    await store.create_session(session("s1"))
    await store.create_session(session("s2"))
    await store.append([row(1, sid="s2"), row(1, sid="s1")])
    assert len(await store.history("s1")) == len(await store.history("s2")) == 1


async def test_an_empty_append_does_nothing(store: Store) -> None:
    await store.append([])
    assert await store.sessions() == []


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
async def test_append_refuses_a_taken_row_id_and_writes_none_of_the_batch(
    store: Store, batch: bool
) -> None:
    await store.create_session(session())
    await store.append([row(1, "r1")])
    rows = [row(2, "r2"), row(3, "r1")] if batch else [row(3, "r1")]
    with pytest.raises(UsageError, match="s1/r1"):
        await store.append(rows)
    assert [r.row_id for r in await store.history("s1")] == ["r1"]


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
async def test_append_refuses_a_taken_seq_and_writes_none_of_the_batch(
    store: Store, batch: bool
) -> None:
    await store.create_session(session())
    await store.append([row(1, "r1")])
    rows = [row(2, "r2"), row(1, "r9")] if batch else [row(1, "r9")]
    with pytest.raises(UsageError, match=r"seq 1 of session 's1' is already taken .*s1/r1"):
        await store.append(rows)
    assert [r.row_id for r in await store.history("s1")] == ["r1"]


@pytest.mark.parametrize(
    ("rows", "named"),
    [
        ([row(1, "a"), row(2, "a")], "s1/a appears twice"),
        ([row(1, "a"), row(1, "b")], "seq 1 of session 's1' is already taken by history row s1/a"),
    ],
    ids=["row_id", "seq"],
)
async def test_append_refuses_a_key_repeated_within_the_batch(
    store: Store, rows: list[HistoryRow], named: str
) -> None:
    await store.create_session(session())
    with pytest.raises(UsageError, match=named):
        await store.append(rows)
    assert await store.history("s1") == []


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
async def test_append_refuses_an_unknown_session_and_writes_nothing(
    store: Store, batch: bool
) -> None:
    await store.create_session(session("s1"))
    rows = [row(1, sid="s1"), row(1, sid="ghost")] if batch else [row(1, sid="ghost")]
    with pytest.raises(UsageError, match="unknown session 'ghost'"):
        await store.append(rows)
    assert await store.history("s1") == []
    assert await store.history("ghost") == []


async def test_update_row_replaces_kind_body_stream_and_cut(store: Store) -> None:
    await store.create_session(session())
    await store.append([row(1), row(2, kind=RowKind.PARTIAL, body=b"{}"), row(3)])
    final = row(2, kind=RowKind.ASSISTANT, body=b'{"text":"done"}', stream="st2", cut=cut(5))
    await store.update_row(final)
    assert await store.history("s1") == [row(1), final, row(3)]
    assert await store.owed_cuts("s1") == [final]
    cleared = row(2, kind=RowKind.ASSISTANT, body=b"{}")
    await store.update_row(cleared)
    assert (await store.history("s1"))[1] == cleared
    assert await store.owed_cuts() == []


async def test_update_row_refuses_an_absent_row(store: Store) -> None:
    await store.create_session(session())
    with pytest.raises(UsageError, match="no history row s1/r1"):
        await store.update_row(row(1))
    with pytest.raises(UsageError, match="no history row ghost/r1"):
        await store.update_row(row(1, sid="ghost"))
    assert await store.history("s1") == []


async def test_update_row_refuses_a_changed_seq(store: Store) -> None:
    await store.create_session(session())
    await store.append([row(1, "r1")])
    with pytest.raises(UsageError, match="s1/r1 has seq 1, not 2"):
        await store.update_row(row(2, "r1", body=b"changed"))
    assert await store.history("s1") == [row(1, "r1")]


async def test_delete_rows_deletes_atomically_and_counts_what_existed(store: Store) -> None:
    await store.create_session(session("s1"))
    await store.create_session(session("s2"))
    await store.append([row(n) for n in range(1, 6)] + [row(1, "r2", sid="s2")])
    deleted = await store.delete_rows("s1", ["r2", "r4", "missing", "r4"])
    assert deleted == 2
    assert [r.row_id for r in await store.history("s1")] == ["r1", "r3", "r5"]
    assert [r.row_id for r in await store.history("s2")] == ["r2"]


async def test_delete_rows_frees_the_seq_and_row_id(store: Store) -> None:
    await store.create_session(session())
    await store.append([row(1, "r1")])
    assert await store.delete_rows("s1", ["r1"]) == 1
    await store.append([row(1, "r1", body=b"again")])
    assert await store.history("s1") == [row(1, "r1", body=b"again")]


async def test_delete_rows_of_nothing_or_of_an_unknown_session_deletes_nothing(
    store: Store,
) -> None:
    await store.create_session(session())
    await store.append([row(1)])
    assert await store.delete_rows("s1", []) == 0
    assert await store.delete_rows("ghost", ["r1"]) == 0
    assert len(await store.history("s1")) == 1


async def test_owed_cuts_returns_only_owed_rows_ordered_by_session_then_seq(store: Store) -> None:
    await store.create_session(session("s1"))
    await store.create_session(session("s2"))
    owed_s2 = row(3, sid="s2", kind=RowKind.ASSISTANT, cut=cut(2))
    owed_s1_late = row(7, sid="s1", kind=RowKind.ASSISTANT, cut=cut(1))
    owed_s1_early = row(4, sid="s1", kind=RowKind.ASSISTANT, cut=cut(4))
    await store.append(
        [
            owed_s2,
            owed_s1_late,
            row(5, sid="s1", kind=RowKind.ASSISTANT, cut=cut(3, CutState.CONSUMED)),
            row(6, sid="s1", kind=RowKind.ASSISTANT, cut=cut(3, CutState.VOIDED)),
            row(1, sid="s1"),
            owed_s1_early,
        ]
    )
    assert await store.owed_cuts() == [owed_s1_early, owed_s1_late, owed_s2]
    assert await store.owed_cuts("s1") == [owed_s1_early, owed_s1_late]
    assert await store.owed_cuts("s2") == [owed_s2]
    assert await store.owed_cuts("ghost") == []


@pytest.mark.parametrize("state", list(CutState))
async def test_set_cut_state_updates_the_stored_cut_record(store: Store, state: CutState) -> None:
    await store.create_session(session())
    original = row(1, kind=RowKind.ASSISTANT, stream="st1", cut=cut(4))
    await store.append([original])
    await store.set_cut_state("s1", "r1", state)
    assert original.cut is not None
    expected = msgspec.structs.replace(
        original, cut=msgspec.structs.replace(original.cut, state=state)
    )
    assert await store.history("s1") == [expected]
    assert await store.owed_cuts() == ([expected] if state is CutState.OWED else [])


async def test_set_cut_state_can_void_and_restore(store: Store) -> None:
    await store.create_session(session())
    await store.append([row(1, kind=RowKind.ASSISTANT, cut=cut())])
    await store.set_cut_state("s1", "r1", CutState.WITHDRAWN)
    assert await store.owed_cuts() == []
    await store.set_cut_state("s1", "r1", CutState.OWED)
    assert [r.row_id for r in await store.owed_cuts()] == ["r1"]


async def test_set_cut_state_refuses_a_row_without_a_cut_or_an_absent_row(store: Store) -> None:
    await store.create_session(session())
    await store.append([row(1)])
    with pytest.raises(UsageError, match="s1/r1 has no cut record"):
        await store.set_cut_state("s1", "r1", CutState.VOIDED)
    with pytest.raises(UsageError, match="no history row s1/r9"):
        await store.set_cut_state("s1", "r9", CutState.VOIDED)
    assert await store.history("s1") == [row(1)]


async def test_put_envelope_upserts_by_session_and_stream(store: Store) -> None:
    await store.create_session(session("s1"))
    await store.create_session(session("s2"))
    await store.put_envelope(envelope("st2"))
    await store.put_envelope(envelope("st1"))
    await store.put_envelope(envelope("st1", sid="s2"))
    await store.put_envelope(envelope("st2", budget=3))
    assert await store.envelopes("s1") == [envelope("st2", budget=3), envelope("st1")]
    assert await store.envelopes("s2") == [envelope("st1", sid="s2")]
    assert await store.envelopes("ghost") == []


async def test_put_envelope_refuses_an_unknown_session(store: Store) -> None:
    with pytest.raises(UsageError, match="unknown session 's1'"):
        await store.put_envelope(envelope())


async def test_returned_lists_are_the_callers_own(store: Store) -> None:
    await store.create_session(session())
    await store.append([row(1)])
    await store.put_envelope(envelope())
    for got in (await store.history("s1"), await store.sessions(), await store.envelopes("s1")):
        got.clear()
    assert len(await store.history("s1")) == len(await store.sessions()) == 1
    assert len(await store.envelopes("s1")) == 1


async def test_everything_survives_close_and_reopen(make_store: Callable[[], Store]) -> None:
    async with make_store() as store:
        await store.create_session(session("s1", goal="g"))
        await store.append([row(1), row(2, kind=RowKind.ASSISTANT, cut=cut())])
        await store.set_cut_state("s1", "r2", CutState.FORFEITED)
        await store.put_envelope(envelope())
    async with make_store() as store:
        assert await store.sessions() == [session("s1", goal="g")]
        history = await store.history("s1")
        assert [r.row_id for r in history] == ["r1", "r2"]
        assert history[1].cut is not None
        assert history[1].cut.state is CutState.FORFEITED
        assert await store.envelopes("s1") == [envelope()]


async def test_a_closed_store_refuses_every_verb(make_store: Callable[[], Store]) -> None:
    store = make_store()
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.create_session(session()),
        store.sessions,
        lambda: store.append([row(1)]),
        lambda: store.update_row(row(1)),
        lambda: store.delete_rows("s1", ["r1"]),
        lambda: store.history("s1"),
        store.owed_cuts,
        lambda: store.set_cut_state("s1", "r1", CutState.VOIDED),
        lambda: store.put_envelope(envelope()),
        lambda: store.envelopes("s1"),
    ]
    for call in calls:
        with pytest.raises(UsageError, match="not open"):
            await call()
    await store.close()  # closing a closed store does nothing


async def test_opening_an_open_store_is_refused(store: Store) -> None:
    with pytest.raises(UsageError, match="already open"):
        await store.open()


async def test_concurrent_writers_do_not_leak_into_a_refused_batch(store: Store) -> None:
    await store.create_session(session("s1"))
    await store.create_session(session("s2"))
    await store.append([row(1, "taken", sid="s2")])
    refused: list[TurnkeeperError] = []

    async def doomed_batch() -> None:
        try:
            await store.append(
                [row(n, sid="s2") for n in range(2, 30)] + [row(99, "taken", sid="s2")]
            )
        except UsageError as exc:
            refused.append(exc)

    async def single(n: int) -> None:
        await store.append([row(n)])

    async with anyio.create_task_group() as tg:
        tg.start_soon(doomed_batch)
        for n in range(1, 11):
            tg.start_soon(single, n)
    assert len(refused) == 1
    assert [r.seq for r in await store.history("s1")] == list(range(1, 11))
    assert [r.row_id for r in await store.history("s2")] == ["taken"]


async def test_set_cut_state_refuses_an_unknown_state(store: Store) -> None:
    await store.create_session(session())
    await store.append([row(1, kind=RowKind.ASSISTANT, cut=cut())])
    with pytest.raises(UsageError, match="unknown cut state 'paid'"):
        await store.set_cut_state("s1", "r1", "paid")  # type: ignore[arg-type]
    assert [r.row_id for r in await store.owed_cuts()] == ["r1"]
