"""``turnkeeper migrate`` and the read-only commands on a store of an older schema (issue 24).

``inspect`` and ``receipts`` refuse a schema-4 store in one line naming ``turnkeeper migrate
--db PATH`` and leave its folder as it was; ``migrate`` brings it to the newest schema (exit 0,
and exit 0 again once it is current), and refuses, untouched, what is not a store of ours.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

from agent_session.cli import main
from persistence import SqliteStore, _sqlite
from tests.persistence.helpers import plain_sqlite, row, session, snapshot
from tests.persistence.test_store_lock import holder
from tests.store_kit import commit

if TYPE_CHECKING:
    from pathlib import Path

NEWEST = len(_sqlite.migrations())


def schema_4_store(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store as the code before migration 0005 made it (one session, one row)."""

    async def make() -> None:
        async with SqliteStore(path) as store:
            await commit(store, "dev", create=session("dev"), rows=[row(1, sid="dev")])

    known = _sqlite.migrations()
    with monkeypatch.context() as patched:
        patched.setattr(_sqlite, "migrations", lambda: known[:4])
        anyio.run(make)


def version(path: Path) -> list[tuple[int]]:
    with plain_sqlite(path) as conn:
        return conn.execute("SELECT version FROM schema_version").fetchall()


@pytest.mark.parametrize("command", [["inspect"], ["inspect", "--json"], ["receipts"]])
def test_a_read_only_command_refuses_an_older_store_naming_turnkeeper_migrate(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: list[str],
) -> None:
    db = tmp_path / "old store.db"
    schema_4_store(db, monkeypatch)
    before = snapshot(tmp_path)
    assert main([command[0], "--db", str(db), *command[1:]]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"turnkeeper {command[0]}: {db} has schema version 4 and needs migrating to {NEWEST}; "
        f"read-only commands never migrate: run `turnkeeper migrate --db '{db}'`\n"
    )
    assert snapshot(tmp_path) == before


def test_migrate_brings_an_older_store_to_the_newest_schema_then_says_it_is_current(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "old.db"
    schema_4_store(db, monkeypatch)
    assert main(["migrate", "--db", str(db)]) == 0
    assert capsys.readouterr().out == (
        f"turnkeeper migrate: {db} migrated from schema version 4 to {NEWEST}\n"
    )
    assert version(db) == [(NEWEST,)]
    assert main(["migrate", "--db", str(db)]) == 0
    assert (
        capsys.readouterr().out
        == f"turnkeeper migrate: {db} is at schema version {NEWEST} already\n"
    )
    assert main(["inspect", "--db", str(db)]) == 0
    assert "sessions: dev" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "no such file (migrate creates nothing)"),
        (b"", "the file is empty"),
        (b"notes, not a database", "not a SQLite database"),
    ],
    ids=["missing", "empty", "not-sqlite"],
)
def test_migrate_refuses_what_is_no_store_and_leaves_the_folder_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, said: str
) -> None:
    db = tmp_path / "t.db"
    if content is not None:
        db.write_bytes(content)
    before = snapshot(tmp_path)
    assert main(["migrate", "--db", str(db)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"turnkeeper migrate: {db} is not a turnkeeper store: {said}")
    assert captured.err.count("\n") == 1
    assert snapshot(tmp_path) == before


def test_migrate_refuses_a_damaged_store_a_newer_one_and_an_owned_one_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "t.db"
    schema_4_store(db, monkeypatch)
    with plain_sqlite(db) as conn:
        conn.execute("DROP TABLE handles")  # schema 4 has it: damaged
    before = snapshot(tmp_path)
    assert main(["migrate", "--db", str(db)]) == 4
    assert "schema version 4 has no table handles" in capsys.readouterr().err
    assert snapshot(tmp_path) == before
    with plain_sqlite(db) as conn:
        conn.execute("UPDATE schema_version SET version = 99")
    before = snapshot(tmp_path)
    assert main(["migrate", "--db", str(db)]) == 2
    assert "has schema version 99, newer than" in capsys.readouterr().err
    assert snapshot(tmp_path) == before
    owned = tmp_path / "owned.db"
    with holder(owned):  # a live owner elsewhere
        assert main(["migrate", "--db", str(owned)]) == 2
        assert "is in use by another process" in capsys.readouterr().err


def test_migrate_needs_a_db(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["migrate"])
    assert caught.value.code == 2
    assert "--db" in capsys.readouterr().err
