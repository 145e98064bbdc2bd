"""One owner per SQLite store (``persistence._lock``): a live owner refuses every other opener.

The owner in another process is a child that opens the store, prints ``ready`` and blocks on
its standard input; the tests wait for that line, never for a while. "Left intact" is checked
by comparing every file in the folder (database, WAL, SHM, lock file) byte for byte.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import msgspec
import pytest

from agent_session import Engine
from agent_session.cli import main
from persistence import (
    Boundary,
    MemoryStore,
    NotATurnkeeperStore,
    SqliteStore,
    StaleOwner,
    StoreError,
    StoreLocked,
    TurnkeeperError,
    _lock,
)
from stream_manager import ScriptedModel
from tests.store_kit import commit, history

from .helpers import row, session, snapshot

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[2]
HOLD = """
import sys

import anyio

from persistence import SqliteStore


async def hold() -> None:
    async with SqliteStore(sys.argv[1]) as store:
        print("ready", store.owner, flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
    print("closed", flush=True)


anyio.run(hold)
"""
#: Any library scenario: the run must be refused before it reads it.
SCENARIO = ROOT / "docs" / "scenarios" / "withdrawn-wake.toml"
TOKEN = re.compile(r"[0-9a-f]{32}")


class Holder:
    """A child process that owns the store until it is told to close or is killed."""

    def __init__(self, process: subprocess.Popen[bytes], owner: str) -> None:
        self.process = process
        self.owner = owner

    @property
    def pid(self) -> int:
        return self.process.pid

    def close(self) -> None:
        """Let the child close the store and exit; wait for both."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(b"\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline() == b"closed\n"
        assert self.process.wait() == 0


@contextmanager
def child(*args: str, close_fds: bool = True) -> Iterator[subprocess.Popen[bytes]]:
    """``python -c ARGS...``, killed and reaped afterwards whatever happened."""
    process = subprocess.Popen(
        [sys.executable, "-c", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        close_fds=close_fds,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


@contextmanager
def holder(db: Path) -> Iterator[Holder]:
    """A child process holding ``db`` open read-write, once it said it is ready."""
    with child(HOLD, str(db)) as process:
        assert process.stdout is not None
        line = process.stdout.readline()  # blocks until the child holds the store (or died)
        if not line.startswith(b"ready "):
            process.kill()
            _, err = process.communicate()
            pytest.fail(f"the holder did not start: {line!r} {err.decode()}")
        yield Holder(process, line.split()[1].decode())


async def make_store_file(db: Path) -> None:
    async with SqliteStore(db) as store:
        await commit(store, "s1", create=session(), rows=[row(1)])


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "t.db"


# -- another process ----------------------------------------------------------------------------


async def test_a_live_owner_elsewhere_refuses_a_second_open_and_loses_nothing(
    tmp_path: Path, db: Path
) -> None:
    await make_store_file(db)
    with holder(db) as owner:
        before = snapshot(tmp_path)
        assert {f"{db.name}.lock", db.name} <= before.keys()
        with pytest.raises(StoreLocked) as caught:
            await SqliteStore(db).open()
        error = caught.value
        assert (error.path, error.pid, error.this_process) == (str(db), owner.pid, False)
        assert isinstance(error, StoreError)
        assert isinstance(error, TurnkeeperError)
        assert str(error).startswith(
            f"{db} is in use by another process (pid {owner.pid} since {error.since}): "
            "one process owns a SQLite store at a time; inspect and receipts can still read it"
        )
        assert snapshot(tmp_path) == before  # database, WAL, SHM and the owner's lock file
        # Reading takes no lock: inspect and receipts work beside the owner.
        async with SqliteStore(db, readonly=True) as reader:
            assert await reader.sessions() == [session()]
            assert [r.row_id for r in await history(reader)] == ["r1"]
        assert owner.process.poll() is None
        owner.close()  # the owner closes cleanly, its store whole
    async with SqliteStore(db) as store:
        assert await store.sessions() == [session()]


async def test_the_lock_dies_with_its_holder_even_on_sigkill(db: Path) -> None:
    await make_store_file(db)
    with holder(db) as owner:
        with pytest.raises(StoreLocked):
            await SqliteStore(db).open()
        owner.process.kill()  # SIGKILL: no close, no cleanup, the lock file keeps its pid
        assert owner.process.wait() == -9
        assert str(owner.pid) in db.with_name(f"{db.name}.lock").read_text()
        async with SqliteStore(db) as store:  # the kernel dropped the lock with its holder
            assert await store.sessions() == [session()]
            assert store.owner is not None
            assert store.owner != owner.owner
            with pytest.raises(StaleOwner):  # the dead holder's token fences nothing in
                await store.commit("s1", Boundary(rows=(row(2),)), owner=owner.owner)
            assert [r.row_id for r in await history(store)] == ["r1"]
            await commit(store, "s1", rows=[row(2)])


def test_the_cli_run_on_an_owned_store_exits_2_with_one_line(
    tmp_path: Path, db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with holder(db) as owner:
        before = snapshot(tmp_path)
        assert main(["run", str(SCENARIO), "--db", str(db)]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.count("\n") == 1
        assert captured.err.startswith(
            f"turnkeeper run: {db} is in use by another process (pid {owner.pid} since "
        )
        assert "inspect and receipts can still read it" in captured.err
        assert snapshot(tmp_path) == before
        assert main(["inspect", "--db", str(db)]) == 0  # reading beside the owner works
        owner.close()
    anyio.run(make_store_file, db)  # free once its owner closed it


def test_the_cli_demo_on_an_owned_store_exits_2_and_removes_nothing(
    tmp_path: Path, db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with holder(db) as owner:
        before = snapshot(tmp_path)
        assert main(["demo", "--db", str(db), "--plain"]) == 2
        captured = capsys.readouterr()
        assert captured.err == (
            f"turnkeeper demo: {db} is in use by another process (pid {owner.pid} since "
            f"{_since(db)}): one process owns a SQLite store at a time; inspect and receipts "
            "can still read it\n"
        )
        assert snapshot(tmp_path) == before  # the live owner's store was not replaced
        assert owner.process.poll() is None


def _since(db: Path) -> str:
    """The start time the holder wrote into its lock file."""
    since = msgspec.json.decode(db.with_name(f"{db.name}.lock").read_bytes())["since"]
    assert isinstance(since, str)
    return since


# -- this process -------------------------------------------------------------------------------


async def test_a_second_store_in_this_process_is_refused_until_the_first_closes(
    db: Path,
) -> None:
    first = SqliteStore(db)
    await first.open()
    second = SqliteStore(db)
    try:
        with pytest.raises(StoreLocked, match="in use by another store in this process") as got:
            await second.open()
        assert (got.value.pid, got.value.this_process) == (os.getpid(), True)
        await commit(first, "s1", create=session(), rows=[row(1)])  # the owner goes on
    finally:
        await first.close()
    async with second:
        assert [r.row_id for r in await history(second)] == ["r1"]
        with pytest.raises(StoreLocked):
            await first.open()  # and now the first one is the second
    async with first:
        assert await first.sessions() == [session()]


async def test_the_holder_file_is_private_names_its_holder_and_goes_on_close(
    db: Path,
) -> None:
    lock = db.with_name(f"{db.name}.lock")
    async with SqliteStore(db):
        assert stat.S_IMODE(lock.stat().st_mode) & 0o077 == 0  # 0600, less any umask bits
        holder_facts = msgspec.json.decode(lock.read_bytes())
        assert holder_facts["pid"] == os.getpid()
        assert isinstance(holder_facts["since"], str)
    assert not lock.exists()  # words only (the lock is the database file's), none stale


async def test_a_readonly_open_takes_no_lock(tmp_path: Path, db: Path) -> None:
    await make_store_file(db)
    async with SqliteStore(db) as owner:
        async with SqliteStore(db, readonly=True) as reader:
            assert reader.owner is None
            assert await reader.sessions() == [session()]
        await commit(owner, "s1", rows=[row(2)])  # the reader held nothing the owner needs
    before = snapshot(tmp_path)
    assert f"{db.name}.lock" not in before
    async with SqliteStore(db, readonly=True):
        assert snapshot(tmp_path) == before


async def test_a_child_process_never_inherits_the_lock(db: Path) -> None:
    # A child spawned while the store is open, without closing descriptors (a tool the engine
    # starts, say): had it inherited the lock's descriptor, it would hold the lock after close.
    store = SqliteStore(db)
    await store.open()
    script = "import sys; print('ready', flush=True); sys.stdin.readline()"
    with child(script, close_fds=False) as process:
        assert process.stdout is not None
        assert process.stdout.readline() == b"ready\n"
        await store.close()
        async with SqliteStore(db) as again:
            assert again.owner is not None
        assert process.poll() is None  # the child was alive all along


async def test_a_database_file_replaced_before_it_was_locked_is_taken_again(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A taker opens the database file, then its holder removes it (SqliteStore.remove) and
    # someone creates a new one: locking the old, unlinked file would make two owners.
    real_pin = _lock.pin
    pins: list[int] = []

    def replaced_first(database: str, *, create: bool) -> _lock.Pin:
        taken = real_pin(database, create=create)
        if not pins:
            os.unlink(database)
            os.close(os.open(database, os.O_CREAT | os.O_WRONLY, 0o600))
        pins.append(os.fstat(taken.file.fd).st_ino)
        return taken

    monkeypatch.setattr(_lock, "pin", replaced_first)
    async with SqliteStore(db) as store:
        assert len(pins) == 2  # started over on the file the path names now
        assert pins[1] == os.stat(db).st_ino != pins[0]
        assert store.owner is not None
        monkeypatch.setattr(_lock, "pin", real_pin)
        with pytest.raises(StoreLocked):
            await SqliteStore(db).open()


async def test_without_fcntl_a_readwrite_open_is_refused_before_anything_is_created(
    tmp_path: Path, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await make_store_file(db)
    before = snapshot(tmp_path)
    monkeypatch.setattr(_lock, "HAVE_FLOCK", False)
    with pytest.raises(StoreError, match=r"need POSIX file locks \(fcntl.flock\)"):
        await SqliteStore(db).open()
    with pytest.raises(StoreError, match="refusing to open it unlocked"):
        await SqliteStore(tmp_path / "new.db").open()
    assert snapshot(tmp_path) == before
    async with SqliteStore(db, readonly=True) as reader:  # reading needs no lock
        assert await reader.sessions() == [session()]


# -- owner tokens -------------------------------------------------------------------------------


async def test_every_open_mints_a_fresh_owner_token(db: Path) -> None:
    for store in (SqliteStore(db), MemoryStore()):
        tokens: list[str | None] = [owner_of(store)]
        for _ in range(2):
            async with store:
                tokens.append(owner_of(store))
            tokens.append(owner_of(store))
        closed, first, after_first, second, after_second = tokens
        assert (closed, after_first, after_second) == (None, None, None), store
        assert first is not None
        assert second is not None
        assert TOKEN.fullmatch(first)
        assert TOKEN.fullmatch(second)
        assert first != second


def owner_of(store: SqliteStore | MemoryStore) -> str | None:
    return store.owner


# -- removing a store ---------------------------------------------------------------------------


async def test_remove_deletes_a_store_but_never_a_live_one_or_another_file(
    tmp_path: Path, db: Path
) -> None:
    assert await SqliteStore.remove(db) is False  # nothing there: nothing deleted or left
    assert snapshot(tmp_path) == {}
    await make_store_file(db)
    async with SqliteStore(db):
        before = snapshot(tmp_path)
        with pytest.raises(StoreLocked):
            await SqliteStore.remove(db)
        assert snapshot(tmp_path) == before
    assert await SqliteStore.remove(db) is True
    assert snapshot(tmp_path) == {}
    await anyio.Path(db).write_bytes(b"precious")
    with pytest.raises(NotATurnkeeperStore):
        await SqliteStore.remove(db)
    assert snapshot(tmp_path) == {db.name: b"precious"}


# -- one owner per database file, whatever the name ---------------------------------------------


async def test_a_hard_link_to_a_store_owned_elsewhere_is_refused(tmp_path: Path, db: Path) -> None:
    # The lock is the database file's own (its inode): a second name for it is the same file.
    await make_store_file(db)
    link = tmp_path / "second-name.db"
    os.link(db, link)
    with holder(db) as owner:
        before = snapshot(tmp_path)
        with pytest.raises(StoreLocked) as caught:
            await SqliteStore(link).open()
        assert (caught.value.path, caught.value.this_process) == (str(link), False)
        engine = Engine(store=SqliteStore(link), models={"M": ScriptedModel("M", [])})
        with pytest.raises(StoreLocked):
            async with engine:
                pytest.fail("an engine opened a store another process owns")
        assert snapshot(tmp_path) == before
        owner.close()
    async with SqliteStore(link) as store:  # free once its owner closed it
        assert await store.sessions() == [session()]


async def test_a_hard_link_to_a_store_owned_in_this_process_is_refused(
    tmp_path: Path, db: Path
) -> None:
    link = tmp_path / "alias.db"
    async with SqliteStore(db) as first:
        os.link(db, link)
        with pytest.raises(StoreLocked, match="another store in this process"):
            await SqliteStore(link).open()
        with pytest.raises(StoreLocked):
            await SqliteStore.remove(link)
        await commit(first, "s1", create=session(), rows=[row(1)])  # the owner goes on
    async with SqliteStore(link) as second:
        assert [r.row_id for r in await history(second)] == ["r1"]


async def test_a_deleted_lock_sidecar_gives_no_second_owner(tmp_path: Path, db: Path) -> None:
    await make_store_file(db)
    sidecar = db.with_name(f"{db.name}.lock")
    with holder(db) as owner:
        sidecar.unlink()
        with pytest.raises(StoreLocked) as caught:
            await SqliteStore(db).open()
        assert caught.value.pid is None  # nothing says who, but the kernel says someone
        assert not sidecar.exists()  # a refused open writes nothing, not even the sidecar
        owner.close()
    sidecar.write_bytes(b"stale words of a holder long gone")
    async with SqliteStore(db) as store:  # a sidecar decides nothing either way
        assert await store.sessions() == [session()]


def sqlite_locks(db: Path) -> list[str]:
    """The POSIX (``fcntl``) locks this process holds on ``db``'s inode, as the kernel lists them.

    SQLite's shared lock on the database file is one of them; the kernel drops every one the
    moment any descriptor of the file in this process is closed.
    """
    inode = f":{db.stat().st_ino} "
    with open("/proc/locks", encoding="ascii") as table:
        return [
            line.split(":", 1)[1].strip()  # without the kernel's running index
            for line in table
            if " POSIX " in line and f" {os.getpid()} " in line and inode in line
        ]


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs Linux's /proc/locks")
async def test_no_refused_or_readonly_open_drops_a_live_stores_sqlite_locks(
    tmp_path: Path, db: Path
) -> None:
    # Opening and closing any descriptor of the database file would drop SQLite's fcntl locks
    # of the live store in this process: no path may open the file but through the store's one.
    link = tmp_path / "alias.db"
    async with SqliteStore(db) as owner:
        await commit(owner, "s1", create=session(), rows=[row(1)])
        os.link(db, link)
        held = set(sqlite_locks(db))
        assert held, "SQLite holds a shared lock on the database file of an open WAL store"
        # Still held, each one (a checkpoint on its own thread may add a lock for a moment).
        for name in (db, link):
            with pytest.raises(StoreLocked):
                await SqliteStore(name).open()
            assert held <= set(sqlite_locks(db)), name
            with pytest.raises(StoreLocked):
                await SqliteStore.remove(name)
            assert held <= set(sqlite_locks(db)), name
        async with SqliteStore(db, readonly=True) as reader:
            assert await reader.sessions() == [session()]
        assert held <= set(sqlite_locks(db))
        await commit(owner, "s1", rows=[row(2)])
