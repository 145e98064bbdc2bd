"""aiosqlite connections and the translation of ``sqlite3`` errors into turnkeeper's."""

from __future__ import annotations

import os
import sqlite3
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiosqlite
import anyio

from persistence._errors import (
    DamagedStore,
    NotATurnkeeperStore,
    StoreError,
    TurnkeeperError,
    UsageError,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence
    from types import TracebackType


class Translate:
    """Turn a ``sqlite3`` error escaping a block into one of ours (the store's boundary)."""

    __slots__ = ("_path",)

    def __init__(self, path: str) -> None:
        self._path = path

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, sqlite3.Error):
            raise translate(exc, self._path) from exc
        if isinstance(exc, UnicodeDecodeError):  # a damaged TEXT value, read back
            reason = f"a stored text value is not UTF-8 ({exc.reason} at byte {exc.start})"
            raise DamagedStore(self._path, reason) from exc


def translate(exc: sqlite3.Error, path: str) -> TurnkeeperError:
    """Our error for a ``sqlite3`` error that no verb handled more precisely."""
    if isinstance(exc, sqlite3.IntegrityError):
        return UsageError(f"{path}: {exc}")
    name = getattr(exc, "sqlite_errorname", "")
    if name == "SQLITE_READONLY":
        return UsageError(f"{path} is open read-only: {exc}")
    if name in _DAMAGED:
        return DamagedStore(path, str(exc))
    return StoreError(f"{path}: {exc}")


#: SQLite's words for a file it cannot read whole (a damaged page, a truncated file).
_DAMAGED = frozenset({"SQLITE_CORRUPT", "SQLITE_CORRUPT_INDEX", "SQLITE_CORRUPT_SEQUENCE"})
#: The first 16 bytes of every SQLite database file.
SQLITE_HEADER = b"SQLite format 3\x00"


def file_facts(path: str) -> tuple[int | None, str]:
    """The file's size (``None`` when it is missing or not a file) and its read-only URI."""
    size = os.path.getsize(path) if os.path.isfile(path) else None
    return size, Path(path).absolute().as_uri() + "?mode=ro"


def check_path(path: str, *, readonly: bool) -> int:
    """What the path is, read without opening it in SQLite: the file's size (0: none yet).

    Run before anything touches the path (a lock file, a connection), so a refusal leaves the
    folder exactly as it was.

    Raises:
        NotATurnkeeperStore: A directory; a folder that does not exist; read-only, a missing
            or empty file; a file that does not start with SQLite's header.
        StoreError: The path cannot be examined (permissions).
    """
    target = Path(path)
    try:
        if target.is_dir():
            raise NotATurnkeeperStore(path, "it is a directory")
        if not target.exists():
            folder = target.absolute().parent
            if not folder.is_dir():
                raise NotATurnkeeperStore(path, f"the folder {folder} does not exist")
            if readonly:
                raise NotATurnkeeperStore(path, "no such file (read-only opens create nothing)")
            return 0
        if not target.is_file():
            raise NotATurnkeeperStore(path, "it is not a regular file")
        size = target.stat().st_size
        if size == 0:
            if readonly:
                raise NotATurnkeeperStore(path, "the file is empty")
            return 0
        with target.open("rb") as file:
            header = file.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise StoreError(f"{path}: cannot be examined ({exc.strerror or exc})") from None
    if header != SQLITE_HEADER:
        raise NotATurnkeeperStore(path, "not a SQLite database (its first bytes are not SQLite's)")
    return size


def probe_uri(path: str) -> str:
    """The URI the read-only open checks what the file is through.

    With no ``-wal`` beside the file, every committed change is in the file itself, and it is
    read ``immutable``: SQLite then creates no ``-wal`` or ``-shm`` file, so a refused file's
    folder stays as it was. With a ``-wal`` (a live owner, or one that died), a plain
    read-only open, which reads the WAL too.
    """
    uri = Path(path).absolute().as_uri() + "?mode=ro"
    return uri if os.path.exists(f"{path}-wal") else uri + "&immutable=1"


def create_private(path: str) -> None:
    """Create the database file ``0600`` when it is missing, before SQLite opens it.

    SQLite gives the ``-wal`` and ``-shm`` files the main file's permission bits, so a store
    created here keeps all three private to its user whatever the umask. An existing file is
    never touched (its mode is its owner's choice); a path SQLite treats specially (``:memory:``,
    a ``file:`` URI) is left to SQLite, and so is any error: the open that follows reports it.
    Blocking file I/O: run it on a worker thread.
    """
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    try:
        os.close(os.open(path, flags, 0o600))
    except OSError:
        return  # it exists (kept as it is), or the open below explains what is wrong


async def connect(database: str, *, uri: bool = False) -> aiosqlite.Connection:
    """Open an aiosqlite connection; on failure, let its worker thread finish first.

    When connecting fails, aiosqlite stops its worker thread with a result posted to the
    running loop that nobody awaits; if the loop closed before the thread got there, the
    thread would raise "Event loop is closed". Joining the thread keeps that inside the loop.
    """
    connection = aiosqlite.connect(database, uri=uri, isolation_level=None)
    try:
        return await connection
    except BaseException:
        with anyio.CancelScope(shield=True):
            worker = connection._thread  # aiosqlite 0.22's worker (pinned); see the docstring
            if worker.is_alive():
                await anyio.to_thread.run_sync(worker.join, 5.0)
            await anyio.lowlevel.checkpoint()
        raise


async def one(db: aiosqlite.Connection, sql: str, params: Sequence[object] = ()) -> Sequence[Any]:
    """The single row a query returns (one call).

    Raises:
        StoreError: The query returned no row.
    """
    rows = list(await db.execute_fetchall(sql, params))
    if not rows:
        raise StoreError(f"no row from {sql!r}")
    return tuple(rows[0])


@asynccontextmanager
async def transaction(db: aiosqlite.Connection) -> AsyncIterator[None]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on any error, shielded from cancellation.

    The shield makes sure a transaction is finished before the caller's lock is released;
    a cancellation is delivered at the caller's next checkpoint.
    """
    with anyio.CancelScope(shield=True):
        await db.execute("BEGIN IMMEDIATE")
        try:
            yield
            await db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                await db.execute("ROLLBACK")
            raise
