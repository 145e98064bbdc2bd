"""``Store.open_receipts``: what the overlap guard reads (OP-9), on both stores.

Every receipt that may still be running (``requested``, ``running``, ``indeterminate``), of one
session or of all, in the order first written; never a terminal one. A row in an open state
that fails validation is reported with its indexed columns, never skipped; SQLite reads it
through the ``operations_open`` index.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from persistence import (
    Capability,
    DamagedReceipt,
    OperationRecord,
    OpState,
    SqliteStore,
    ToolKind,
)
from persistence._open_receipts import open_query
from tests.operations.conftest import Backend
from tests.persistence.helpers import plain_sqlite
from tests.store_kit import put_receipts

if TYPE_CHECKING:
    from pathlib import Path

BASH = Capability(kind=ToolKind.CLIENT, name="bash")


def receipt(op_id: str, state: OpState, session: str = "s1") -> OperationRecord:
    return OperationRecord(
        op_id=op_id,
        session=session,
        stream=f"{session}/4",
        call_id=f"c-{op_id}",
        capability=BASH,
        target=f"client:bash#{op_id.encode().hex()[:16]:0<16}",
        started_at=17.5,
        deadline_at=77.5,
        state=state,
    )


SEEDED = [
    receipt("s1/4/1/0", OpState.COMPLETED),
    receipt("s1/4/2/0", OpState.INDETERMINATE),
    receipt("s2/1/1/0", OpState.RUNNING, "s2"),
    receipt("s1/4/3/0", OpState.REQUESTED),
    receipt("s1/4/3/1", OpState.CANCELLED),
    receipt("s1/4/3/2", OpState.RUNNING),
    receipt("s2/1/2/0", OpState.TIMED_OUT, "s2"),
    receipt("s2/1/3/0", OpState.FAILED, "s2"),
]


async def test_op9_open_receipts_are_the_open_ones_in_first_written_order(
    backend: Backend,
) -> None:
    async with backend.make() as store:
        await put_receipts(store, *SEEDED)
        await put_receipts(  # an upsert keeps its place; a receipt that ended leaves
            store,
            msgspec.structs.replace(SEEDED[1], ended_at=30.0),
            msgspec.structs.replace(SEEDED[5], state=OpState.COMPLETED),
        )
        everything = await store.open_receipts()
        assert [r.op_id for r in everything.records] == ["s1/4/2/0", "s2/1/1/0", "s1/4/3/0"]
        assert everything.records[0].ended_at == 30.0
        assert everything.damaged == ()
        one = await store.open_receipts("s1")
        assert [r.op_id for r in one.records] == ["s1/4/2/0", "s1/4/3/0"]
        assert (await store.open_receipts("nobody")).records == ()


async def test_op9_a_damaged_open_receipt_is_reported_with_its_columns(tmp_path: Path) -> None:
    # SQLite only: a MemoryStore holds records, never bytes, so nothing in it can be damaged.
    path = tmp_path / "ops.db"
    async with SqliteStore(path) as store:
        await put_receipts(store, *SEEDED)
    with plain_sqlite(path) as conn:
        for op_id in ("s1/4/2/0", "s1/4/1/0"):  # an open one and a terminal one
            conn.execute(
                "UPDATE operations SET record = CAST(json_set(CAST(record AS TEXT), "
                "'$.started_at', 'at noon') AS BLOB) WHERE op_id = ?",
                (op_id,),
            )
        conn.execute(  # a target column that is not text
            "UPDATE operations SET target = CAST(X'ff00' AS TEXT), record = X'00' "
            "WHERE op_id = 's2/1/1/0'"
        )
    async with SqliteStore(path, readonly=True) as store:
        found = await store.open_receipts()
        assert [r.op_id for r in found.records] == ["s1/4/3/0", "s1/4/3/2"]
        first, second = found.damaged
        assert msgspec.structs.replace(first, detail="") == DamagedReceipt(
            op_id="s1/4/2/0",
            session="s1",
            target=SEEDED[1].target,
            state="indeterminate",
            detail="",
        )
        assert "started_at" in first.detail
        assert (second.op_id, second.session, second.target, second.state) == (
            "s2/1/1/0",
            "s2",
            None,
            "running",
        )
        assert [d.op_id for d in (await store.open_receipts("s1")).damaged] == ["s1/4/2/0"]


async def test_op9_open_receipts_read_the_open_states_index(tmp_path: Path) -> None:
    path = tmp_path / "ops.db"
    async with SqliteStore(path):
        pass
    with plain_sqlite(path) as conn:
        for session in (None, "s1"):
            sql, params = open_query(session)
            plan = " ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))
            assert "USING INDEX operations_open" in plan, plan
