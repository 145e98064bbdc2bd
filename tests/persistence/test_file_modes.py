"""Files a store, a run or a demo creates are private to their user (``0600``), whatever the umask.

SQLite gives ``-wal`` and ``-shm`` the main file's permission bits, so the store creates the
main file ``0600`` itself before SQLite opens it (and locks it, ``persistence._lock``); the
holder file and trace files are created ``0600`` too. A file that already exists keeps its mode.
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

import pytest

from agent_session.cli import main
from persistence import NotATurnkeeperStore, SqliteStore
from tests.store_kit import commit

from .helpers import row, session

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

SCENARIO = "docs/scenarios/withdrawn-wake.toml"


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """The common umask (``022``), which would make every new file world-readable."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def modes(folder: Path, prefix: str = "") -> dict[str, int]:
    """The permission bits of every file in ``folder`` whose name starts with ``prefix``."""
    return {p.name: mode(p) for p in folder.iterdir() if p.name.startswith(prefix)}


async def test_store_file_its_wal_shm_and_lock_are_created_0600(tmp_path: Path) -> None:
    database = tmp_path / "agent.db"
    async with SqliteStore(database) as store:
        await commit(store, "s1", create=session("s1"), rows=[row(1)])
        created = modes(tmp_path)
    assert {"agent.db", "agent.db-wal", "agent.db-shm", "agent.db.lock"} <= set(created)
    assert created == dict.fromkeys(created, 0o600)


async def test_an_existing_store_file_keeps_its_mode(tmp_path: Path) -> None:
    database = tmp_path / "agent.db"
    async with SqliteStore(database):
        pass
    database.chmod(0o640)
    async with SqliteStore(database) as store:
        await commit(store, "s1", create=session("s1"))
    assert mode(database) == 0o640


async def test_private_creation_never_touches_an_existing_file(tmp_path: Path) -> None:
    existing = tmp_path / "kept.db"
    existing.write_bytes(b"data")
    existing.chmod(0o644)
    with pytest.raises(NotATurnkeeperStore):
        await SqliteStore(existing).open()
    assert (existing.read_bytes(), mode(existing)) == (b"data", 0o644)
    assert snapshot_names(tmp_path) == ["kept.db"]


def test_run_trace_and_run_db_are_created_0600(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, database = tmp_path / "run.jsonl", tmp_path / "run.db"
    code = main(["run", SCENARIO, "--db", str(database), "--trace", str(trace)])
    capsys.readouterr()
    assert code == 0
    created = modes(tmp_path, "run.")
    assert {"run.jsonl", "run.db"} <= set(created)
    assert created == dict.fromkeys(created, 0o600)


def test_demo_trace_and_demo_db_are_created_0600(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, database = tmp_path / "demo.jsonl", tmp_path / "demo.db"
    code = main(["demo", "--db", str(database), "--trace", str(trace), "--plain"])
    capsys.readouterr()
    assert code == 0
    assert (mode(trace), mode(database)) == (0o600, 0o600)


def snapshot_names(folder: Path) -> list[str]:
    return sorted(entry.name for entry in folder.iterdir())
