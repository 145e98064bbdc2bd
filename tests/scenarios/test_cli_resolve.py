"""``turnkeeper resolve`` (docs/cli.md): a person settles an indeterminate operation.

Found with ``receipts --state indeterminate``; settled with one line on standard output (exit
0) and shown by ``receipts`` with who settled it, when and their note (text and ``--json``).
Every refusal is one line on standard error, exit 2 (4 for a damaged receipt), and leaves the
file byte-identical.
"""

from __future__ import annotations

import json
import shutil
from typing import TYPE_CHECKING

import anyio
import msgspec
import pytest

from agent_session.cli import main
from agent_session.harness.inspection import resolve_command
from persistence import OperationRecord, OpState, SqliteStore, _sqlite
from stream_manager import VirtualClock
from tests.persistence.helpers import client, plain_sqlite, snapshot
from tests.persistence.test_store_lock import holder
from tests.store_kit import put_receipts

if TYPE_CHECKING:
    from pathlib import Path

OP = "dev/3/2/0"
STUCK = OperationRecord(
    op_id=OP,
    session="dev",
    stream="dev/3",
    call_id="c4",
    capability=client("migrate_db"),
    target="client:migrate_db#5e5e",
    started_at=1_700_000_000.0,
    deadline_at=1_700_000_060.0,
    state=OpState.INDETERMINATE,
    ended_at=1_700_000_062.0,
    outcome_code="process_restart",
    explanation="the process stopped while it was open; termination not confirmed",
)
DONE = msgspec.structs.replace(STUCK, op_id="dev/2/1/0", state=OpState.COMPLETED, outcome_code="ok")
NOTE = "ran SELECT on prod: migration 0042 applied; token=abc123secret"


def make_store(path: Path, *records: OperationRecord) -> None:
    async def write() -> None:
        async with SqliteStore(path) as store:
            await put_receipts(store, *records)

    anyio.run(write)


def test_resolve_settles_what_receipts_lists_as_indeterminate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "t.db"
    make_store(db, STUCK, DONE)
    assert main(["receipts", "--db", str(db), "--state", "indeterminate"]) == 0
    listed = capsys.readouterr().out
    assert OP in listed
    assert DONE.op_id not in listed

    code = main(["resolve", OP, "--db", str(db), "--as", "not-run", "--note", NOTE])
    out, err = capsys.readouterr()
    assert code == 0
    assert err == ""
    assert out == (
        f"turnkeeper resolve: {OP} resolved as not-run: cancelled (operator_not_run), by operator\n"
    )

    assert main(["receipts", "--db", str(db), "--state", "indeterminate"]) == 0
    assert "no receipts" in capsys.readouterr().out
    assert main(["receipts", "--db", str(db), "--json"]) == 0
    rows = {r["op_id"]: r for r in json.loads(capsys.readouterr().out)["receipts"]}
    settled = rows[OP]
    assert (settled["state"], settled["outcome_code"], settled["resolved_by"]) == (
        "cancelled",
        "operator_not_run",
        "operator",
    )
    assert settled["termination_acknowledged"] is True
    assert settled["resolved_late"] is False
    assert isinstance(settled["resolved_at"], float)
    assert settled["note"] == "ran SELECT on prod: migration 0042 applied; token=[redacted]"
    assert rows[DONE.op_id]["resolved_by"] is None
    assert main(["receipts", "--db", str(db)]) == 0
    text = capsys.readouterr().out
    assert f"{OP}: resolved by operator at " in text
    assert "migration 0042 applied; token=[redacted]" in text
    assert "abc123secret" not in text


async def test_resolve_records_the_clock_it_is_given(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    async with SqliteStore(db) as store:
        await put_receipts(store, STUCK)
    assert await resolve_command(str(db), OP, "failed", NOTE, VirtualClock(1_700_000_500.25)) == 0
    with plain_sqlite(db) as conn:
        row = conn.execute("SELECT state, resolved_by, resolved_at FROM operations").fetchone()
    assert row == ("failed", "operator", 1_700_000_500.25)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            [OP, "--as", "done", "--note", NOTE],
            "unknown resolution 'done' (completed, failed, not-run)",
        ),
        (
            [OP, "--as", "completed", "--note", " "],
            "a resolution needs a note saying what was checked",
        ),
        (
            ["dev/9/9/9", "--as", "completed", "--note", NOTE],
            "operation dev/9/9/9 cannot be resolved: no receipt has that id",
        ),
        (
            [DONE.op_id, "--as", "failed", "--note", NOTE],
            f"operation {DONE.op_id} cannot be resolved: it is completed; only an indeterminate "
            "operation can be resolved",
        ),
    ],
)
def test_resolve_refuses_in_one_line_exit_2_and_leaves_the_file_byte_identical(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], line: str
) -> None:
    db = tmp_path / "t.db"
    make_store(db, STUCK, DONE)
    before = snapshot(tmp_path)
    assert main(["resolve", *args, "--db", str(db)]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"turnkeeper resolve: {line}\n")
    assert snapshot(tmp_path) == before  # no new file either: no -wal, -shm or .lock


def test_a_refused_resolve_of_a_store_an_owner_left_a_wal_of_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "t.db"
    make_store(db, STUCK, DONE)
    with plain_sqlite(db) as conn:  # an owner that died: its WAL beside the file, unmerged
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute("UPDATE operations SET state = state")
        conn.commit()
        shutil.copyfile(f"{db}-wal", tmp_path / "kept-wal")
        shutil.copyfile(f"{db}-shm", tmp_path / "kept-shm")
    (tmp_path / "kept-wal").rename(f"{db}-wal")
    (tmp_path / "kept-shm").rename(f"{db}-shm")
    before = snapshot(tmp_path)
    assert before[f"{db.name}-wal"] != b""
    assert main(["resolve", DONE.op_id, "--db", str(db), "--as", "failed", "--note", NOTE]) == 2
    assert "it is completed" in capsys.readouterr().err
    after = snapshot(tmp_path)
    assert after.keys() == before.keys()
    # Every reader of a WAL store writes its read marks into the -shm index (shared memory,
    # never stored data); the database and the unmerged WAL are untouched.
    del after[f"{db.name}-shm"], before[f"{db.name}-shm"]
    assert after == before


def test_resolve_refused_by_an_owner_elsewhere_leaves_the_folder_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "t.db"
    make_store(db, STUCK)
    with holder(db) as owner:
        before = snapshot(tmp_path)
        assert main(["resolve", OP, "--db", str(db), "--as", "completed", "--note", NOTE]) == 2
        [line] = capsys.readouterr().err.splitlines()
        assert line.startswith(f"turnkeeper resolve: {db} is in use by another process")
        assert snapshot(tmp_path) == before
        owner.close()


def test_resolve_refuses_what_is_not_a_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "notes.db"
    notes.write_bytes(b"just notes")
    assert main(["resolve", OP, "--db", str(notes), "--as", "completed", "--note", NOTE]) == 2
    assert "not a SQLite database" in capsys.readouterr().err
    assert snapshot(tmp_path) == {notes.name: b"just notes"}
    missing = tmp_path / "missing.db"
    assert main(["resolve", OP, "--db", str(missing), "--as", "completed", "--note", NOTE]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1
    assert not missing.exists()


async def test_resolve_refuses_a_store_another_owner_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "t.db"
    async with SqliteStore(db) as store:
        await put_receipts(store, STUCK)
        assert await resolve_command(str(db), OP, "completed", NOTE) == 2
        [line] = capsys.readouterr().err.splitlines()
        assert line.startswith(f"turnkeeper resolve: {db} is in use by another store")
        assert (await store.receipts(op_id=OP)).records[0].state is OpState.INDETERMINATE


def test_resolve_migrates_a_schema_2_store_and_settles_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "old.db"
    known = _sqlite.migrations()
    with monkeypatch.context() as patched:
        patched.setattr(_sqlite, "migrations", lambda: known[:2])
        make_store(db)
    blob = msgspec.json.encode(msgspec.structs.replace(STUCK, capability="client:migrate_db"))
    with plain_sqlite(db) as conn:
        conn.execute(
            "INSERT INTO operations (op_id, session, state, capability, target, record) "
            "VALUES (?, 'dev', 'indeterminate', 'client:migrate_db', ?, ?)",
            (OP, STUCK.target, blob),
        )
        conn.commit()
    assert main(["resolve", OP, "--db", str(db), "--as", "completed", "--note", NOTE]) == 0
    assert "resolved as completed: completed (operator_completed)" in capsys.readouterr().out
    with plain_sqlite(db) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [
            (_sqlite.schema_version(),)
        ]
        assert conn.execute("SELECT resolved_by FROM operations").fetchall() == [("operator",)]
