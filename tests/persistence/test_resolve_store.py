"""A person settles an indeterminate receipt, at the store (issue 12; OP-8's last move).

``persistence.resolve_operation`` on both stores: each resolution's state, outcome,
acknowledgement, ``resolved_by``, time and note are stored; anything but an indeterminate
receipt is refused and nothing is written (a SQLite file stays byte-identical); and a store of
schema 2 migrates to 3, keeping its receipts and gaining the ``resolved_by``/``resolved_at``
columns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
import pytest

from persistence import (
    OPERATOR,
    OPERATOR_OUTCOMES,
    NotResolvable,
    OperationRecord,
    OpState,
    Resolution,
    SqliteStore,
    UsageError,
    _sqlite,
    resolve_operation,
)
from stream_manager import OutcomeCode
from tests.store_kit import put_receipts, receipt

from .helpers import client, plain_sqlite, snapshot

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from persistence import Store

OP = "s3/4/2/1"
#: An indeterminate receipt with values that differ from every default.
STUCK = OperationRecord(
    op_id=OP,
    session="s3",
    stream="s3/4",
    call_id="c9",
    capability=client("deploy"),
    target="client:deploy#77aa",
    started_at=40.25,
    deadline_at=100.25,
    state=OpState.INDETERMINATE,
    cancel_requested_at=100.25,
    cancel_reason="deadline",
    ended_at=102.25,
    outcome_code="timeout",
    explanation="cancellation requested, termination not confirmed",
)
AT = 1_700_000_123.5
NOTE = "checked the deploy log on host b7: release 41 is live"

EXPECTED = {
    Resolution.COMPLETED: (OpState.COMPLETED, "operator_completed", False),
    Resolution.FAILED: (OpState.FAILED, "operator_failed", False),
    Resolution.NOT_RUN: (OpState.CANCELLED, "operator_not_run", True),
}


@pytest.mark.parametrize("as_", list(Resolution))
async def test_op8_each_resolution_is_stored_with_who_when_and_why(
    make_store: Callable[[], Store], as_: Resolution
) -> None:
    async with make_store() as store:
        await put_receipts(store, STUCK)
        returned = await resolve_operation(store, OP, as_.value, note=f"  {NOTE}\n", at=AT)
    async with make_store() as store:  # reopened: it is durable
        stored = await receipt(store, OP)
    assert stored == returned
    state, outcome, acknowledged = EXPECTED[as_]
    assert stored == msgspec.structs.replace(
        STUCK,
        state=state,
        outcome_code=outcome,
        termination_acknowledged=acknowledged,
        explanation=stored.explanation,
        resolved_by=OPERATOR,
        resolved_at=AT,
        note=NOTE,  # stripped of its surrounding blanks
    )
    assert stored.explanation is not None
    assert stored.explanation.startswith("an operator checked")
    assert not stored.resolved_late  # that flag is the tool layer's own late answer
    assert stored.ended_at == STUCK.ended_at  # when it became indeterminate, kept


def test_op12_the_operator_outcome_codes_are_outcome_codes() -> None:
    assert {
        OutcomeCode.OPERATOR_COMPLETED.value,
        OutcomeCode.OPERATOR_FAILED.value,
        OutcomeCode.OPERATOR_NOT_RUN.value,
    } == OPERATOR_OUTCOMES


@pytest.mark.parametrize(
    ("op", "state"),
    [("s3/9/9/9", None), ("done", OpState.COMPLETED), ("late", OpState.CANCELLED)],
)
async def test_only_an_indeterminate_receipt_can_be_resolved(
    make_store: Callable[[], Store], op: str, state: OpState | None
) -> None:
    done = msgspec.structs.replace(STUCK, op_id="done", state=OpState.COMPLETED)
    late = msgspec.structs.replace(STUCK, op_id="late", state=OpState.CANCELLED, resolved_late=True)
    async with make_store() as store:
        await put_receipts(store, STUCK, done, late)
        before = (await store.receipts()).records
        with pytest.raises(NotResolvable) as caught:
            await resolve_operation(store, op, Resolution.FAILED, note=NOTE, at=AT)
        assert isinstance(caught.value, UsageError)
        assert (caught.value.op_id, caught.value.state) == (op, state)
        assert op in str(caught.value)
        if state is not None:
            assert f"it is {state.value}" in str(caught.value)
        assert (await store.receipts()).records == before


async def test_a_resolved_receipt_cannot_be_resolved_again(make_store: Callable[[], Store]) -> None:
    async with make_store() as store:
        await put_receipts(store, STUCK)
        first = await resolve_operation(store, OP, Resolution.NOT_RUN, note=NOTE, at=AT)
        with pytest.raises(NotResolvable, match="it is cancelled"):
            await resolve_operation(store, OP, Resolution.COMPLETED, note="other", at=AT + 1)
        assert await receipt(store, OP) == first


@pytest.mark.parametrize(("as_", "note"), [("done", NOTE), ("completed", " \n ")])
async def test_a_bad_resolution_or_an_empty_note_is_refused(
    make_store: Callable[[], Store], as_: str, note: str
) -> None:
    async with make_store() as store:
        await put_receipts(store, STUCK)
        with pytest.raises(UsageError):
            await resolve_operation(store, OP, as_, note=note, at=AT)
        assert await receipt(store, OP) == STUCK


async def test_a_refused_resolution_leaves_a_sqlite_file_byte_identical(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    done = msgspec.structs.replace(STUCK, op_id="done", state=OpState.COMPLETED)
    async with SqliteStore(path) as store:
        await put_receipts(store, done)
    before = snapshot(tmp_path)
    async with SqliteStore(path) as store:
        for op in ("done", "nope"):
            with pytest.raises(NotResolvable):
                await resolve_operation(store, op, Resolution.COMPLETED, note=NOTE, at=AT)
    assert snapshot(tmp_path) == before


async def test_sqlite_keeps_who_and_when_in_their_columns(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    other = msgspec.structs.replace(STUCK, op_id="other")
    async with SqliteStore(path) as store:
        await put_receipts(store, STUCK, other)
        await resolve_operation(store, OP, Resolution.FAILED, note=NOTE, at=AT)
    with plain_sqlite(path) as conn:
        rows = conn.execute(
            "SELECT op_id, state, resolved_by, resolved_at FROM operations ORDER BY op_id"
        ).fetchall()
    assert rows == [("other", "indeterminate", None, None), (OP, "failed", "operator", AT)]


async def test_a_schema_2_store_migrates_keeping_its_receipts_and_gains_the_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    known = _sqlite.migrations()
    assert [m.name for m in known][2] == "0003_operator_resolution.sql"
    with monkeypatch.context() as patched:  # a store as the code before migration 0003 made it
        patched.setattr(_sqlite, "migrations", lambda: known[:2])
        async with SqliteStore(path):
            pass
    old_bytes = (
        b'{"op_id":"s3/4/2/1","session":"s3","stream":"s3/4","call_id":"c9",'
        b'"capability":"client:deploy","target":"client:deploy#77aa","started_at":40.25,'
        b'"deadline_at":100.25,"state":"indeterminate","cancel_requested_at":100.25,'
        b'"cancel_reason":"deadline","cancel_acknowledged_at":null,"ended_at":102.25,'
        b'"termination_acknowledged":false,"outcome_code":"timeout",'
        b'"explanation":"cancellation requested, termination not confirmed",'
        b'"resolved_late":false,"blocked_by":null}'
    )
    with plain_sqlite(path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(2,)]
        conn.execute(
            "INSERT INTO operations (op_id, session, state, capability, target, record) "
            "VALUES (?, 's3', 'indeterminate', 'client:deploy', 'client:deploy#77aa', ?)",
            (OP, old_bytes),
        )
        conn.commit()
    async with SqliteStore(path) as store:  # migrates to the newest version
        assert await receipt(store, OP) == STUCK  # the new fields decode as unset
        await resolve_operation(store, OP, Resolution.COMPLETED, note=NOTE, at=AT)
    with plain_sqlite(path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [
            (_sqlite.schema_version(),)
        ]
        columns = [name for (_, name, *_) in conn.execute("PRAGMA table_info(operations)")]
        assert columns[-2:] == ["resolved_by", "resolved_at"]
        assert conn.execute("SELECT resolved_by, resolved_at FROM operations").fetchall() == [
            ("operator", AT)
        ]
