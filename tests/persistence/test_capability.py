"""A receipt's capability is a pair in memory and its text in storage (OP-11).

``OperationRecord.capability`` is a ``Capability(kind, name)``. A store keeps it as
``kind:name``, in the ``capability`` column and in the record's bytes, exactly as before the
pair existed, so store files written earlier read unchanged; it is turned into text when
written and back into the pair when read, nowhere else. A stored value of another shape is a
``CorruptRecord`` naming the table, the receipt and the field; a pair no store could read back
is refused at commit by both stores alike.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

import msgspec
import pytest

from persistence import CorruptRecord, OperationRecord, OpState, SqliteStore, UsageError
from persistence._decode import decode_operation
from persistence._writes import operation_params
from persistence.records import Capability, ToolKind
from tests.store_kit import commit, put_receipts, receipt

from .helpers import plain_sqlite

if TYPE_CHECKING:
    from pathlib import Path

    from persistence import Store

#: A receipt as a store written before the pair existed holds it (byte for byte).
STORED = (
    b'{"op_id":"s1/2/1/0","session":"s1","stream":"s1/2","call_id":"c7",'
    b'"capability":"client:mcp:files:read","target":"client:mcp:files:read#0a1b",'
    b'"started_at":12.5,"deadline_at":72.5,"state":"indeterminate","cancel_requested_at":70.0,'
    b'"cancel_reason":"deadline","cancel_acknowledged_at":null,"ended_at":73.0,'
    b'"termination_acknowledged":false,"outcome_code":"timeout",'
    b'"explanation":"cancellation requested, termination not confirmed","resolved_late":false,'
    b'"blocked_by":null}'
)
#: The record ``STORED`` holds.
RECORD = OperationRecord(
    op_id="s1/2/1/0",
    session="s1",
    stream="s1/2",
    call_id="c7",
    capability=Capability(kind=ToolKind.CLIENT, name="mcp:files:read"),
    target="client:mcp:files:read#0a1b",
    started_at=12.5,
    deadline_at=72.5,
    state=OpState.INDETERMINATE,
    cancel_requested_at=70.0,
    cancel_reason="deadline",
    ended_at=73.0,
    outcome_code="timeout",
    explanation="cancellation requested, termination not confirmed",
)


def of(kind: ToolKind, name: str, op: str = "s1/1/1/0") -> OperationRecord:
    return msgspec.structs.replace(
        RECORD, op_id=op, capability=Capability(kind=kind, name=name), state=OpState.RUNNING
    )


def stored_row(path: Path, op: str) -> tuple[str, bytes]:
    with plain_sqlite(path) as conn:
        capability, blob = conn.execute(
            "SELECT capability, record FROM operations WHERE op_id = ?", (op,)
        ).fetchone()
    return capability, bytes(blob)


def test_op11_a_receipt_is_stored_as_the_bytes_it_always_had() -> None:
    params = operation_params(RECORD)
    assert params[3] == "client:mcp:files:read"  # the capability column
    assert params[-1] == STORED  # the record: the pair as its text, every field in place


def test_op11_a_receipt_stored_before_the_pair_reads_back_as_the_pair() -> None:
    assert decode_operation(("s1/2/1/0", "indeterminate", STORED)) == RECORD


@pytest.mark.parametrize("kind", list(ToolKind))
@pytest.mark.parametrize("name", ["bash", "mcp:files:read", " a b\nc\n", ":"])
def test_op11_every_pair_survives_the_stored_text(kind: ToolKind, name: str) -> None:
    record = of(kind, name)
    blob = operation_params(record)[-1]
    assert isinstance(blob, bytes)
    assert decode_operation((record.op_id, record.state.value, blob)) == record


@pytest.mark.parametrize("kind", list(ToolKind))
async def test_op11_a_receipt_round_trips_the_pair_through_a_store(
    store: Store, kind: ToolKind
) -> None:
    first, second = of(kind, "web_search"), of(kind, "mcp:files:read", op="s1/1/1/1")
    await commit(store, "s1", operations=[first, second])  # one boundary of two receipts
    for record in (first, second):
        back = await receipt(store, record.op_id)
        assert back == record
        assert back is not None
        assert type(back.capability) is Capability
        assert type(back.capability.kind) is ToolKind
    moved = msgspec.structs.replace(first, state=OpState.COMPLETED, ended_at=14.0)
    await put_receipts(store, moved)  # an upsert keeps the pair
    assert await receipt(store, first.op_id) == moved


async def test_op11_sqlite_keeps_the_pairs_text_in_its_column_and_record(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    async with SqliteStore(path) as store:
        await put_receipts(store, RECORD, of(ToolKind.PROVIDER, "web_search"))
    assert stored_row(path, RECORD.op_id) == ("client:mcp:files:read", STORED)
    column, blob = stored_row(path, "s1/1/1/0")
    assert column == "provider:web_search"
    assert b'"capability":"provider:web_search"' in blob


async def test_op11_a_store_file_written_before_the_pair_reads_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    async with SqliteStore(path):
        pass  # the schema
    with plain_sqlite(path) as conn:  # a receipt as older code wrote it
        conn.execute(
            "INSERT INTO operations (op_id, session, state, capability, target, record) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            ("s1/2/1/0", "s1", "indeterminate", "client:mcp:files:read", RECORD.target, STORED),
        )
    async with SqliteStore(path, readonly=True) as store:
        query = await store.receipts()
    assert (query.records, query.corrupt) == ((RECORD,), ())
    assert stored_row(path, RECORD.op_id) == ("client:mcp:files:read", STORED)  # untouched


SHAPES = ["bash", "client:", "weird:bash", ":bash", "Client:bash", " client:bash", ""]


@pytest.mark.parametrize("stored", SHAPES)
def test_op11_a_stored_capability_of_another_shape_is_a_corrupt_record(stored: str) -> None:
    blob = STORED.replace(
        b'"capability":"client:mcp:files:read"', b'"capability":' + msgspec.json.encode(stored)
    )
    with pytest.raises(CorruptRecord) as caught:
        decode_operation(("s1/2/1/0", "indeterminate", blob))
    assert (caught.value.table, caught.value.key) == ("operations", "s1/2/1/0")
    assert caught.value.detail.startswith("$.capability: Expected str matching regex")


@pytest.mark.parametrize(
    ("stored", "detail"),
    [
        ('"weird:bash"', "$.capability: Expected str matching regex"),
        ("42", "$.capability: Expected str, got int"),
        ('{"kind":"client","name":"bash"}', "$.capability: Expected str, got object"),
    ],
)
async def test_op11_sqlite_reports_a_malformed_capability_by_receipt_and_field(
    tmp_path: Path, stored: str, detail: str
) -> None:
    path = tmp_path / "t.db"
    async with SqliteStore(path) as store:
        await put_receipts(store, RECORD, of(ToolKind.CLIENT, "bash"))
    with plain_sqlite(path) as conn:
        conn.execute(
            "UPDATE operations SET record = CAST(json_set(CAST(record AS TEXT), "
            "'$.capability', json(?)) AS BLOB) WHERE op_id = ?",
            (stored, RECORD.op_id),
        )
    async with SqliteStore(path, readonly=True) as store:
        everything = await store.receipts()
        alone = await store.receipts(op_id=RECORD.op_id)
    assert [r.op_id for r in everything.records] == ["s1/1/1/0"]  # the other one reads
    assert [op for op, _ in everything.corrupt] == [RECORD.op_id]
    assert alone.records == ()
    [(op, why)] = alone.corrupt
    assert op == RECORD.op_id
    assert why.startswith(f"operations[{RECORD.op_id}]: {detail}")
    with sqlite3.connect(path) as conn:  # never dropped or rewritten
        assert conn.execute("SELECT count(*) FROM operations").fetchone() == (2,)


@pytest.mark.parametrize(
    "capability",
    [
        "client:bash",  # the text, where the pair belongs
        Capability(kind=ToolKind.CLIENT, name=""),  # no name
        Capability(kind="client", name="bash"),  # type: ignore[arg-type]  # not a ToolKind
        Capability(kind=ToolKind.CLIENT, name=7),  # type: ignore[arg-type]
    ],
)
async def test_op11_a_pair_no_store_could_read_back_is_refused_at_commit(
    store: Store, capability: object
) -> None:
    good = of(ToolKind.CLIENT, "bash", op="s1/1/1/1")
    bad = msgspec.structs.replace(RECORD, capability=capability)
    with pytest.raises(UsageError, match=r"Boundary\.operations\[1\] \(s1/2/1/0\)\.capability"):
        await commit(store, "s1", operations=[good, bad])
    assert (await store.receipts()).records == ()  # nothing of the boundary is written
