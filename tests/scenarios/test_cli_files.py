"""No command writes over a file it reads or that is not its own (``docs/cli.md``).

``--trace`` may not name the store, its ``-wal``, ``-shm`` or ``.lock``, or a scenario the run
reads: compared by the file itself (a symlink, a hard link, another spelling of the path), and
by the resolved path for a file that does not exist yet. ``demo`` replaces only a store it made
itself (labelled so when it created it); any other file, a turnkeeper store or not, is refused
in one line, exit 2, and left exactly as it was.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from pathlib import Path

import anyio
import pytest

from agent_session.cli import main
from persistence import SqliteStore, _sqlite
from tests.persistence.helpers import snapshot

SCENARIO = Path(__file__).resolve().parents[2] / "docs" / "scenarios" / "withdrawn-wake.toml"


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    """A copy of a library scenario in the test's folder (so the folder is the whole picture)."""
    copy = tmp_path / "wake.toml"
    copy.write_bytes(SCENARIO.read_bytes())
    return copy


@pytest.fixture
def store(tmp_path: Path, scenario: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A real store: the run of a scenario, closed."""
    db = tmp_path / "agent.db"
    assert main(["run", str(scenario), "--db", str(db)]) == 0
    capsys.readouterr()
    return db


def refused(command: list[str], capsys: pytest.CaptureFixture[str], why: str) -> None:
    """``command`` exits 2 with one line naming ``why``, printing nothing on stdout."""
    assert main(command) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert why in err, err


def count_sessions(db: Path) -> int:
    with closing(sqlite3.connect(db)) as conn:
        (count,) = conn.execute("SELECT count(*) FROM sessions").fetchone()
    assert isinstance(count, int)
    return count


# -- --trace --------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm", ".lock"])
def test_run_trace_may_not_be_the_store_or_its_files(
    tmp_path: Path,
    scenario: Path,
    store: Path,
    capsys: pytest.CaptureFixture[str],
    suffix: str,
) -> None:
    before = snapshot(tmp_path)
    trace = f"{store}{suffix}"
    command = ["run", str(scenario), "--db", str(store), "--trace", trace]
    refused(command, capsys, f"turnkeeper run: --trace {trace}: is the store {store}")
    assert snapshot(tmp_path) == before


def test_run_trace_may_not_be_the_store_by_another_name(
    tmp_path: Path,
    scenario: Path,
    store: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    os.link(store, tmp_path / "hard.db")
    (tmp_path / "soft.db").symlink_to(store)
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    for trace in ("hard.db", "soft.db", "./agent.db", "../" + tmp_path.name + "/agent.db-wal"):
        command = ["run", str(scenario), "--db", "agent.db", "--trace", trace]
        refused(command, capsys, f"--trace {trace}: is the store agent.db")
    assert snapshot(tmp_path) == before


def test_run_trace_may_not_be_a_scenario_it_reads(
    tmp_path: Path, scenario: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.toml"
    other.write_bytes(scenario.read_bytes())
    os.link(other, tmp_path / "other-link.toml")
    before = snapshot(tmp_path)
    for trace in (scenario, other, tmp_path / "other-link.toml"):
        for where in (["--memory"], []):
            command = ["run", str(scenario), str(other), *where, "--trace", str(trace)]
            refused(command, capsys, f"--trace {trace}: is the scenario ")
    assert snapshot(tmp_path) == before


def test_run_trace_may_replace_an_old_trace(
    tmp_path: Path, scenario: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "run.jsonl"
    trace.write_bytes(b"an old trace\n")
    assert main(["run", str(scenario), "--memory", "--trace", str(trace)]) == 0
    capsys.readouterr()
    assert trace.read_bytes().startswith(b'{"')


def test_demo_trace_may_not_be_its_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "demo.db"
    for trace in (db, Path(f"{db}-wal")):
        refused(
            ["demo", "--db", str(db), "--trace", str(trace), "--plain"],
            capsys,
            f"turnkeeper demo: --trace {trace}: is the store {db}",
        )
        assert snapshot(tmp_path) == {}


# -- demo replaces only its own store -------------------------------------------------------


def test_demo_refuses_to_replace_a_store_it_did_not_make(
    tmp_path: Path, store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sessions = count_sessions(store)
    before = snapshot(tmp_path)
    refused(
        ["demo", "--db", str(store), "--plain"],
        capsys,
        f"turnkeeper demo: {store} is a turnkeeper store that turnkeeper demo did not make; "
        "refusing to replace it",
    )
    assert snapshot(tmp_path) == before
    assert count_sessions(store) == sessions


@pytest.mark.parametrize(
    "content",
    [b"just some notes\n", bytes(range(256)) * 3, b"SQLite format 3\x00" + b"\x01" * 200, b""],
    ids=["text", "random-bytes", "sqlite-header-only", "empty"],
)
def test_demo_refuses_a_file_that_is_no_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    precious = tmp_path / "precious.db"
    precious.write_bytes(content)
    refused(["demo", "--db", str(precious), "--plain"], capsys, "refusing to replace it")
    assert snapshot(tmp_path) == {precious.name: content}


def test_demo_replaces_a_store_it_made(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "demo.db"
    assert main(["demo", "--db", str(db), "--plain"]) == 0
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(
            "INSERT INTO sessions (id, record) SELECT id || '-extra', record FROM sessions"
        )
    assert count_sessions(db) == 2
    assert main(["demo", "--db", str(db), "--plain"]) == 0  # replaced: started fresh
    capsys.readouterr()
    assert count_sessions(db) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.db"]


def test_demo_replaces_a_store_an_older_demo_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After an upgrade that adds a migration, ``make demo`` must not stop on its own old file."""
    db = tmp_path / "demo.db"
    assert main(["demo", "--db", str(db), "--plain"]) == 0
    newest = len(_sqlite.migrations())
    added = sorted(_sqlite.tables_at(newest) - _sqlite.tables_at(newest - 1))
    assert added  # the newest migration makes a table
    with closing(sqlite3.connect(db)) as conn, conn:  # as the code before the newest one left it
        for table in added:
            conn.execute(f"DROP TABLE {table}")
        conn.execute("UPDATE schema_version SET version = ?", (newest - 1,))
    assert main(["demo", "--db", str(db), "--plain"]) == 0  # replaced, at the current version
    capsys.readouterr()
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT max(version) FROM schema_version").fetchone() == (newest,)


def test_demo_refuses_an_older_store_it_did_not_make(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "work.db"
    known = _sqlite.migrations()

    async def make() -> None:
        async with SqliteStore(db):
            pass

    with monkeypatch.context() as patched:
        patched.setattr(_sqlite, "migrations", lambda: known[:-1])
        anyio.run(make)
    before = db.read_bytes()
    refused(["demo", "--db", str(db), "--plain"], capsys, "did not make")
    assert db.read_bytes() == before
