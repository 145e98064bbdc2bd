"""aiosqlite connections and the translation of ``sqlite3`` errors into turnkeeper's."""

from __future__ import annotations

import os
import sqlite3
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiosqlite
import anyio

from persistence._errors import StoreError, TurnkeeperError, UsageError

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


def translate(exc: sqlite3.Error, path: str) -> TurnkeeperError:
    """Our error for a ``sqlite3`` error that no verb handled more precisely."""
    if isinstance(exc, sqlite3.IntegrityError):
        return UsageError(f"{path}: {exc}")
    if getattr(exc, "sqlite_errorname", "") == "SQLITE_READONLY":
        return UsageError(f"{path} is open read-only: {exc}")
    return StoreError(f"{path}: {exc}")


def file_facts(path: str) -> tuple[int | None, str]:
    """The file's size (``None`` when it is missing or not a file) and its read-only URI."""
    size = os.path.getsize(path) if os.path.isfile(path) else None
    return size, Path(path).absolute().as_uri() + "?mode=ro"


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
