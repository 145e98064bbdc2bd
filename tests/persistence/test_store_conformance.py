"""The Store conformance suite: every implementation passes the same tests.

Parametrized over ``MemoryStore`` and ``SqliteStore(tmp_path / "t.db")`` by the ``store`` and
``make_store`` fixtures (conftest.py). A future PostgreSQL store joins the parametrization.
Every verb is here: ``commit`` (each part of a boundary, all or nothing, records of one
session only, the owner fence, the deleted count), ``load`` (ordering), ``sessions``,
``scan_recoverable`` and ``receipts``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import msgspec
import pytest

from persistence import (
    MAX_SEQ,
    Boundary,
    Committed,
    CutState,
    CutStateChange,
    HistoryRow,
    OperationRecord,
    OpState,
    RowKind,
    SessionLoad,
    StaleOwner,
    TurnkeeperError,
    UsageError,
)
from tests.store_kit import commit, envelopes, history, owed, owner, receipt

from .helpers import client, cut, envelope, row, session

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from persistence import Store


def op(
    op_id: str = "s1/1/1/0", sid: str = "s1", state: OpState = OpState.RUNNING
) -> OperationRecord:
    return OperationRecord(
        op_id=op_id,
        session=sid,
        stream=f"{sid}/1",
        call_id=f"c-{op_id}",
        capability=client("bash"),
        target="client:bash#abc",
        started_at=2.5,
        state=state,
    )


async def nothing_of(store: Store, sid: str = "s1") -> None:
    """Assert the store holds no row, envelope or receipt of ``sid`` (beyond its record)."""
    assert await history(store, sid) == []
    assert await envelopes(store, sid) == []
    assert (await store.receipts(sid)).records == ()


# -- sessions -----------------------------------------------------------------------------------


async def test_sessions_are_listed_by_id(store: Store) -> None:
    for sid in ("s3", "s1", "s2"):
        await commit(store, sid, create=session(sid))
    assert [record.id for record in await store.sessions()] == ["s1", "s2", "s3"]


async def test_sessions_round_trip_every_field(store: Store) -> None:
    record = session("s1", model="beta", created_seq=7, goal="ship it")
    await commit(store, "s1", create=record)
    assert await store.sessions() == [record]
    loaded = await store.load("s1")
    assert loaded is not None
    assert loaded.record == record


async def test_create_is_idempotent_for_an_identical_record(store: Store) -> None:
    await commit(store, "s1", create=session("s1", goal="g"))
    await commit(store, "s1", create=session("s1", goal="g"), rows=[row(1)])
    assert await store.sessions() == [session("s1", goal="g")]
    assert await history(store) == [row(1)]


async def test_create_refuses_a_different_record_and_writes_nothing_of_the_boundary(
    store: Store,
) -> None:
    await commit(store, "s1", create=session("s1", model="alpha"))
    with pytest.raises(UsageError, match="'s1'"):
        await commit(
            store,
            "s1",
            create=session("s1", model="beta"),
            rows=[row(1)],
            envelope=envelope(),
            operations=[op()],
        )
    assert await store.sessions() == [session("s1", model="alpha")]
    await nothing_of(store)


# -- rows and load ------------------------------------------------------------------------------


async def test_rows_round_trip_every_field_byte_exact(store: Store) -> None:
    rows = [
        row(1, kind=RowKind.USER, body=b'{"text":"hi \\u00e9"}'),
        row(2, kind=RowKind.ASSISTANT, body=bytes(range(256)), stream="st1", cut=cut()),
        row(3, kind=RowKind.PARTIAL, body=b"", stream="st1"),
        row(4, kind=RowKind.SENTINEL),
        row(5, kind=RowKind.SYSTEM),
    ]
    await commit(store, "s1", create=session(), rows=rows)
    got = await history(store)
    assert got == rows
    assert [r.body for r in got] == [r.body for r in rows]
    assert all(type(r.kind) is RowKind for r in got)


async def test_load_orders_rows_by_seq_and_envelopes_by_first_write(store: Store) -> None:
    await commit(store, "s1", create=session(), rows=[row(5)], envelope=envelope("st2"))
    await commit(store, "s1", rows=[row(2), row(9)], envelope=envelope("st1"))
    await commit(store, "s1", rows=[row(1)], envelope=envelope("st2", budget=3))
    loaded = await store.load("s1")
    assert loaded == SessionLoad(
        record=session(),
        rows=(row(1), row(2), row(5), row(9)),
        envelopes=(envelope("st2", budget=3), envelope("st1")),
    )


async def test_load_without_envelopes_reads_the_record_and_rows_only(store: Store) -> None:
    await commit(store, "s1", create=session(), rows=[row(2), row(1)], envelope=envelope("st1"))
    loaded = await store.load("s1", envelopes=False)
    assert loaded == SessionLoad(record=session(), rows=(row(1), row(2)), envelopes=())
    assert await store.load("nobody", envelopes=False) is None


async def test_load_of_an_unknown_session_is_none(store: Store) -> None:
    assert await store.load("nobody") is None


async def test_load_keeps_sessions_apart(store: Store) -> None:
    await commit(store, "s1", create=session("s1"), rows=[row(1, sid="s1")])
    await commit(store, "s2", create=session("s2"), rows=[row(1, sid="s2"), row(2, sid="s2")])
    assert [(r.session, r.seq) for r in await history(store, "s2")] == [("s2", 1), ("s2", 2)]
    assert [(r.session, r.seq) for r in await history(store, "s1")] == [("s1", 1)]


@pytest.mark.parametrize("seq", [MAX_SEQ + 1, -3], ids=["past-max", "negative"])
async def test_r61_a_row_a_reader_would_call_damaged_is_never_written(
    store: Store, seq: int
) -> None:
    """The writer refuses the seq the reader refuses (``MAX_SEQ``): no damage by our hand."""
    await commit(store, "s1", create=session("s1"))
    with pytest.raises(UsageError) as caught:
        await store.commit("s1", Boundary(rows=(row(seq, "r9"),)), owner=owner(store))
    assert str(caught.value).startswith(f"Boundary.rows[0] (history row r9): seq {seq} is not")
    await nothing_of(store, "s1")


@pytest.mark.parametrize(
    ("field", "boundary"),
    [
        ("create", Boundary(create=session("s2"))),
        ("rows[1] (history row r1)", Boundary(rows=(row(2), row(1, sid="s2")))),
        ("envelope (stream st1)", Boundary(envelope=envelope(sid="s2"))),
        ("operations[0] (s2/1/1/0)", Boundary(operations=(op("s2/1/1/0", sid="s2"),))),
    ],
    ids=["create", "rows", "envelope", "operations"],
)
async def test_a_record_of_another_session_is_refused_naming_its_field(
    store: Store, field: str, boundary: Boundary
) -> None:
    await commit(store, "s1", create=session("s1"))
    await commit(store, "s2", create=session("s2"))
    with pytest.raises(UsageError) as caught:
        await store.commit("s1", boundary, owner=owner(store))
    assert str(caught.value).startswith(f"Boundary.{field} belongs to session 's2', not to 's1'")
    assert await store.sessions() == [session("s1"), session("s2")]
    await nothing_of(store, "s1")
    await nothing_of(store, "s2")


async def test_an_empty_boundary_writes_nothing(store: Store) -> None:
    assert await store.commit("s1", Boundary(), owner=owner(store)) == Committed(deleted=0)
    assert await store.sessions() == []


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
async def test_a_taken_row_id_is_refused_and_nothing_of_the_boundary_is_written(
    store: Store, batch: bool
) -> None:
    await commit(store, "s1", create=session(), rows=[row(1, "r1")])
    rows = [row(2, "r2"), row(3, "r1")] if batch else [row(3, "r1")]
    with pytest.raises(UsageError, match="s1/r1"):
        await commit(store, "s1", rows=rows, envelope=envelope(), operations=[op()])
    assert await history(store) == [row(1, "r1")]
    assert await envelopes(store) == []
    assert await receipt(store, op().op_id) is None


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
async def test_a_taken_seq_is_refused_and_nothing_of_the_boundary_is_written(
    store: Store, batch: bool
) -> None:
    await commit(store, "s1", create=session(), rows=[row(1, "r1")])
    rows = [row(2, "r2"), row(1, "r9")] if batch else [row(1, "r9")]
    with pytest.raises(UsageError, match=r"seq 1 of session 's1' is already taken .*s1/r1"):
        await commit(store, "s1", rows=rows, envelope=envelope())
    assert await history(store) == [row(1, "r1")]
    assert await envelopes(store) == []


@pytest.mark.parametrize(
    ("rows", "named"),
    [
        ([row(1, "a"), row(2, "a")], "s1/a appears twice"),
        ([row(1, "a"), row(1, "b")], "seq 1 of session 's1' is already taken by history row s1/a"),
    ],
    ids=["row_id", "seq"],
)
async def test_a_key_repeated_within_the_boundary_is_refused(
    store: Store, rows: list[HistoryRow], named: str
) -> None:
    await commit(store, "s1", create=session())
    with pytest.raises(UsageError, match=named):
        await commit(store, "s1", rows=rows)
    assert await history(store) == []


@pytest.mark.parametrize("part", ["rows", "envelope", "cut_states"])
async def test_an_unknown_session_is_refused_and_nothing_is_written(
    store: Store, part: str
) -> None:
    boundary = {
        "rows": Boundary(rows=(row(1, sid="ghost"),), operations=(op(sid="ghost"),)),
        "envelope": Boundary(envelope=envelope(sid="ghost"), operations=(op(sid="ghost"),)),
        "cut_states": Boundary(
            cut_states=(CutStateChange(row_id="r1", state=CutState.VOIDED),),
            operations=(op(sid="ghost"),),
        ),
    }[part]
    named = "no history row ghost/r1" if part == "cut_states" else "unknown session 'ghost'"
    with pytest.raises(UsageError, match=named):
        await store.commit("ghost", boundary, owner=owner(store))
    assert await store.load("ghost") is None
    assert (await store.receipts()).records == ()


def _void(row_id: str) -> Boundary:
    return Boundary(cut_states=(CutStateChange(row_id=row_id, state=CutState.VOIDED),))


@pytest.mark.parametrize(
    ("sid", "boundary", "named"),
    [
        ("s1", Boundary(rows=(row(2, "r1"),)), "history row s1/r1 already exists"),
        ("s1", Boundary(rows=(row(1, "r5"),)), "seq 1 of session 's1' is already taken by .*s1/r1"),
        ("s1", _void("r9"), "no history row s1/r9"),
        ("s1", _void("r1"), "history row s1/r1 has no cut record"),
        ("ghost", Boundary(rows=(row(1, sid="ghost"),)), "unknown session 'ghost'"),
        ("ghost", Boundary(envelope=envelope(sid="ghost")), "unknown session 'ghost'"),
        ("ghost", _void("r1"), "no history row ghost/r1"),
    ],
    ids=["row_id", "seq", "no_row", "no_cut", "row_ghost", "envelope_ghost", "cut_ghost"],
)
async def test_a_boundary_of_one_statement_is_refused_by_name(
    store: Store, sid: str, boundary: Boundary, named: str
) -> None:
    # The most frequent boundaries hold one statement and run without a plan (SqliteStore):
    # each refusal still names what it tripped over, and writes nothing.
    await commit(store, "s1", create=session(), rows=[row(1, "r1")])
    with pytest.raises(UsageError, match=named):
        await store.commit(sid, boundary, owner=owner(store))
    assert await history(store) == [row(1, "r1")]
    assert await envelopes(store) == []
    assert await store.load("ghost") is None


async def test_a_boundary_is_all_or_nothing_whichever_part_is_refused(store: Store) -> None:
    await commit(store, "s1", create=session(), rows=[row(1), row(2, kind=RowKind.ASSISTANT)])
    with pytest.raises(UsageError, match="s1/r2 has no cut record"):
        await commit(
            store,
            "s1",
            rows=[row(3, kind=RowKind.ASSISTANT, stream="st1", cut=cut())],
            delete=["r1"],
            cut_states=[("r3", CutState.CONSUMED), ("r2", CutState.VOIDED)],  # r2 has none
            envelope=envelope(),
            operations=[op("a"), op("b")],
        )
    assert [r.row_id for r in await history(store)] == ["r1", "r2"]
    assert await envelopes(store) == []
    assert (await store.receipts()).records == ()
    assert await owed(store) == []


async def test_operations_need_no_session_record(store: Store) -> None:
    await commit(store, "loose", operations=[op("loose/1/1/0", sid="loose")])
    assert await receipt(store, "loose/1/1/0") == op("loose/1/1/0", sid="loose")
    assert await store.sessions() == []


# -- replacing and deleting rows ------------------------------------------------------------


async def test_a_boundary_may_replace_a_row_by_deleting_and_re_adding_its_id(
    store: Store,
) -> None:
    await commit(
        store,
        "s1",
        create=session(),
        rows=[row(1), row(2, kind=RowKind.PARTIAL, body=b"{}"), row(3)],
    )
    final = row(2, kind=RowKind.ASSISTANT, body=b'{"text":"done"}', stream="st2", cut=cut(5))
    done = await commit(store, "s1", delete=["r2"], rows=[final])
    assert done == Committed(deleted=1)
    assert await history(store) == [row(1), final, row(3)]
    assert await owed(store, "s1") == [final]
    cleared = row(2, kind=RowKind.ASSISTANT, body=b"{}")
    await commit(store, "s1", delete=["r2"], rows=[cleared])
    assert (await history(store))[1] == cleared
    assert await owed(store) == []


async def test_delete_is_atomic_and_counts_what_existed(store: Store) -> None:
    await commit(store, "s1", create=session("s1"), rows=[row(n) for n in range(1, 6)])
    await commit(store, "s2", create=session("s2"), rows=[row(1, "r2", sid="s2")])
    done = await commit(store, "s1", delete=["r2", "r4", "missing", "r4"])
    assert done == Committed(deleted=2)
    assert [r.row_id for r in await history(store, "s1")] == ["r1", "r3", "r5"]
    assert [r.row_id for r in await history(store, "s2")] == ["r2"]


async def test_delete_frees_the_seq_and_row_id(store: Store) -> None:
    await commit(store, "s1", create=session(), rows=[row(1, "r1")])
    assert (await commit(store, "s1", delete=["r1"])).deleted == 1
    await commit(store, "s1", rows=[row(1, "r1", body=b"again")])
    assert await history(store) == [row(1, "r1", body=b"again")]


async def test_delete_of_nothing_or_of_an_unknown_session_deletes_nothing(store: Store) -> None:
    await commit(store, "s1", create=session(), rows=[row(1)])
    assert (await commit(store, "s1", delete=[])).deleted == 0
    assert (await commit(store, "ghost", delete=["r1"])).deleted == 0
    assert len(await history(store)) == 1


# -- cut states and the recovery scan -------------------------------------------------------


async def test_scan_recoverable_reads_owed_rows_and_the_rows_after_them(store: Store) -> None:
    await commit(store, "s1", create=session("s1"), envelope=envelope("st2"))
    await commit(store, "s1", envelope=envelope("st1"))
    await commit(store, "s2", create=session("s2", model="beta"))
    await commit(store, "s3", create=session("s3"), rows=[row(1, sid="s3")])
    owed_s2 = row(3, sid="s2", kind=RowKind.ASSISTANT, cut=cut(2))
    owed_s1_late = row(7, sid="s1", kind=RowKind.ASSISTANT, cut=cut(1))
    owed_s1_early = row(4, sid="s1", kind=RowKind.ASSISTANT, cut=cut(4))
    after = [row(8, sid="s1", kind=RowKind.SENTINEL), row(9, sid="s1")]
    await commit(store, "s2", rows=[owed_s2])
    await commit(
        store,
        "s1",
        rows=[
            owed_s1_late,
            row(5, sid="s1", kind=RowKind.ASSISTANT, cut=cut(3, CutState.CONSUMED)),
            row(6, sid="s1", kind=RowKind.ASSISTANT, cut=cut(3, CutState.VOIDED)),
            *reversed(after),
            row(1, sid="s1"),
            owed_s1_early,
        ],
    )
    scan = await store.scan_recoverable()
    assert scan.corrupt == ()
    assert [found.session for found in scan.cuts] == [session("s1"), session("s2", model="beta")]
    first, second = scan.cuts
    assert (first.owed, first.after, first.streams) == (
        (owed_s1_early, owed_s1_late),
        tuple(after),
        ("st2", "st1"),
    )
    assert (first.row, first.last_seq) == (owed_s1_late, 9)
    assert (second.owed, second.after, second.streams) == ((owed_s2,), (), ())
    assert (second.row, second.last_seq) == (owed_s2, 3)
    assert await owed(store) == [owed_s1_early, owed_s1_late, owed_s2]


@pytest.mark.parametrize("state", list(CutState))
async def test_a_cut_state_moves_the_stored_cut_record(store: Store, state: CutState) -> None:
    original = row(1, kind=RowKind.ASSISTANT, stream="st1", cut=cut(4))
    await commit(store, "s1", create=session(), rows=[original])
    await commit(store, "s1", cut_states=[("r1", state)])
    assert original.cut is not None
    expected = msgspec.structs.replace(
        original, cut=msgspec.structs.replace(original.cut, state=state)
    )
    assert await history(store) == [expected]
    assert await owed(store) == ([expected] if state is CutState.OWED else [])


async def test_a_cut_state_can_void_and_restore(store: Store) -> None:
    await commit(store, "s1", create=session(), rows=[row(1, kind=RowKind.ASSISTANT, cut=cut())])
    await commit(store, "s1", cut_states=[("r1", CutState.WITHDRAWN)])
    assert await owed(store) == []
    await commit(store, "s1", cut_states=[("r1", CutState.OWED)])
    assert [r.row_id for r in await owed(store)] == ["r1"]


async def test_a_cut_state_may_move_a_row_the_same_boundary_adds(store: Store) -> None:
    added = row(2, kind=RowKind.ASSISTANT, stream="st1", cut=cut(3))
    await commit(store, "s1", create=session(), rows=[row(1), added])
    replacement = row(3, kind=RowKind.ASSISTANT, stream="st2", cut=cut(2))
    await commit(
        store,
        "s1",
        rows=[replacement],
        cut_states=[("r2", CutState.FORFEITED), ("r3", CutState.CONSUMED)],
    )
    states = [None if r.cut is None else r.cut.state for r in await history(store)]
    assert states == [None, CutState.FORFEITED, CutState.CONSUMED]


async def test_a_cut_state_refuses_a_row_without_a_cut_or_an_absent_row(store: Store) -> None:
    await commit(store, "s1", create=session(), rows=[row(1)])
    with pytest.raises(UsageError, match="s1/r1 has no cut record"):
        await commit(store, "s1", cut_states=[("r1", CutState.VOIDED)])
    with pytest.raises(UsageError, match="no history row s1/r9"):
        await commit(store, "s1", cut_states=[("r9", CutState.VOIDED)])
    assert await history(store) == [row(1)]


async def test_a_cut_state_refuses_a_row_the_same_boundary_deletes(store: Store) -> None:
    await commit(store, "s1", create=session(), rows=[row(1, kind=RowKind.ASSISTANT, cut=cut())])
    with pytest.raises(UsageError, match="no history row s1/r1"):
        await commit(store, "s1", delete=["r1"], cut_states=[("r1", CutState.VOIDED)])
    assert [r.row_id for r in await owed(store)] == ["r1"]


async def test_a_cut_state_refuses_an_unknown_state(store: Store) -> None:
    await commit(store, "s1", create=session(), rows=[row(1, kind=RowKind.ASSISTANT, cut=cut())])
    with pytest.raises(UsageError, match="unknown cut state 'paid'"):
        await commit(store, "s1", cut_states=[("r1", "paid")])  # type: ignore[list-item]
    assert [r.row_id for r in await owed(store)] == ["r1"]
    await commit(store, "s1", cut_states=[("r1", "withdrawn")])  # type: ignore[list-item]
    assert [r.cut.state for r in await history(store) if r.cut] == [CutState.WITHDRAWN]


# -- envelopes ------------------------------------------------------------------------------


async def test_an_envelope_is_upserted_by_session_and_stream(store: Store) -> None:
    await commit(store, "s1", create=session("s1"), envelope=envelope("st2"))
    await commit(store, "s1", envelope=envelope("st1"))
    await commit(store, "s2", create=session("s2"), envelope=envelope("st1", sid="s2"))
    await commit(store, "s1", envelope=envelope("st2", budget=3))
    assert await envelopes(store, "s1") == [envelope("st2", budget=3), envelope("st1")]
    assert await envelopes(store, "s2") == [envelope("st1", sid="s2")]


# -- receipts -----------------------------------------------------------------------------------


async def test_receipts_filter_by_op_id(store: Store) -> None:
    await commit(store, "s1", operations=[op("a"), op("b", state=OpState.COMPLETED)])
    await commit(store, "s1", operations=[op("a", state=OpState.CANCELLED)])
    assert (await store.receipts(op_id="a")).records == (op("a", state=OpState.CANCELLED),)
    assert (await store.receipts(op_id="missing")).records == ()
    assert (await store.receipts("s2", op_id="a")).records == ()
    running = frozenset({OpState.RUNNING})
    assert (await store.receipts(op_id="b", states=running)).records == ()


# -- the owner fence ----------------------------------------------------------------------------


async def test_a_commit_with_a_token_that_is_not_the_current_owner_is_refused(
    store: Store,
) -> None:
    await commit(store, "s1", create=session())
    for stale in ("not-a-token", None):
        with pytest.raises(StaleOwner, match="'s1'") as caught:
            await store.commit("s1", Boundary(rows=(row(1),), operations=(op(),)), owner=stale)
        assert isinstance(caught.value, UsageError)
    with pytest.raises(StaleOwner):
        await store.commit("s2", Boundary(), owner="not-a-token")  # even an empty one
    await nothing_of(store)


async def test_a_reopened_store_refuses_the_previous_owner_and_writes_nothing(
    make_store: Callable[[], Store],
) -> None:
    async with make_store() as first:
        before = owner(first)
        await commit(first, "s1", create=session(), rows=[row(1)])
    assert first.owner is None  # a closed store owns nothing
    async with make_store() as store:
        now = owner(store)
        assert now != before
        with pytest.raises(StaleOwner):
            await store.commit(
                "s1",
                Boundary(rows=(row(2),), delete=("r1",), envelope=envelope(), operations=(op(),)),
                owner=before,
            )
        assert await history(store) == [row(1)]
        assert await envelopes(store) == []
        assert (await store.receipts()).records == ()
        await store.commit("s1", Boundary(rows=(row(2),)), owner=now)
        assert [r.seq for r in await history(store)] == [1, 2]


async def test_a_colliding_id_is_refused_and_changes_nothing(store: Store) -> None:
    # Ids come from positions ((session, seq) for rows): a writer that numbered from a stale
    # view mints an id another boundary already took. The store refuses it, never overwrites.
    first = row(2, "s1:r2", kind=RowKind.ASSISTANT, stream="s1/1", cut=cut())
    await commit(store, "s1", create=session(), rows=[row(1, "s1:r1"), first])
    await commit(store, "s1", envelope=envelope("s1/1"), operations=[op("s1/1/1/0")])
    before = await store.load("s1")
    receipts_before = await store.receipts()
    for colliding in (
        row(2, "s1:r2", body=b'{"text":"another process"}'),  # same seq, same id
        row(2, "s1:r9"),  # same seq
        row(3, "s1:r2"),  # same id
    ):
        with pytest.raises(UsageError, match=r"already (exists|taken)"):
            await commit(
                store,
                "s1",
                rows=[colliding],
                envelope=envelope("s1/2"),
                operations=[op("s1/2/1/0")],
            )
    assert await store.load("s1") == before
    assert await store.receipts() == receipts_before


# -- lifecycle ----------------------------------------------------------------------------------


async def test_everything_survives_close_and_reopen(make_store: Callable[[], Store]) -> None:
    async with make_store() as store:
        await commit(
            store,
            "s1",
            create=session("s1", goal="g"),
            rows=[row(1), row(2, kind=RowKind.ASSISTANT, cut=cut())],
        )
        await commit(store, "s1", cut_states=[("r2", CutState.FORFEITED)], envelope=envelope())
        await commit(store, "s1", operations=[op()])
    async with make_store() as store:
        assert await store.sessions() == [session("s1", goal="g")]
        rows = await history(store)
        assert [r.row_id for r in rows] == ["r1", "r2"]
        assert rows[1].cut is not None
        assert rows[1].cut.state is CutState.FORFEITED
        assert await envelopes(store) == [envelope()]
        assert await receipt(store, op().op_id) == op()


async def test_returned_lists_are_the_callers_own(store: Store) -> None:
    await commit(store, "s1", create=session(), rows=[row(1)])
    (await store.sessions()).clear()
    assert len(await store.sessions()) == 1


async def test_a_closed_store_refuses_every_verb(make_store: Callable[[], Store]) -> None:
    store = make_store()
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.commit("s1", Boundary(create=session()), owner="x"),
        lambda: store.commit("s1", Boundary(), owner=None),
        lambda: store.load("s1"),
        store.sessions,
        store.scan_recoverable,
        store.receipts,
        store.handles,
    ]
    for call in calls:
        with pytest.raises(UsageError, match="not open"):
            await call()
    await store.close()  # closing a closed store does nothing


async def test_opening_an_open_store_is_refused(store: Store) -> None:
    with pytest.raises(UsageError, match="already open"):
        await store.open()


async def test_concurrent_writers_do_not_leak_into_a_refused_boundary(store: Store) -> None:
    await commit(store, "s1", create=session("s1"))
    await commit(store, "s2", create=session("s2"), rows=[row(1, "taken", sid="s2")])
    refused: list[TurnkeeperError] = []

    async def doomed() -> None:
        try:
            await commit(
                store,
                "s2",
                rows=[row(n, sid="s2") for n in range(2, 30)] + [row(99, "taken", sid="s2")],
            )
        except UsageError as exc:
            refused.append(exc)

    async def single(n: int) -> None:
        await commit(store, "s1", rows=[row(n)])

    async with anyio.create_task_group() as tg:
        tg.start_soon(doomed)
        for n in range(1, 11):
            tg.start_soon(single, n)
    assert len(refused) == 1
    assert [r.seq for r in await history(store, "s1")] == list(range(1, 11))
    assert [r.row_id for r in await history(store, "s2")] == ["taken"]


async def test_ls9_a_boundary_naming_inbox_entries_commits_on_every_store(store: Store) -> None:
    """A store without an inbox has nothing to take off; one with it takes what is named."""
    await commit(store, "s1", create=session("s1"))
    boundary = Boundary(rows=(row(1, kind=RowKind.USER),), inbox_taken=("inbox-41", "u-7"))
    await store.commit("s1", boundary, owner=owner(store))
    assert [r.seq for r in await history(store)] == [1]
