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


def readonly_uri(path: str) -> str:
    """The file's read-only URI."""
    return Path(path).absolute().as_uri() + "?mode=ro"


def check_path(path: str, *, readonly: bool) -> int:
    """What the path is, from its metadata alone: the file's size (0: none yet, or empty).

    Run before anything opens the path, so a refusal leaves the folder exactly as it was and
    opens no descriptor of the file (closing one would drop SQLite's locks of a live store of
    this process, see ``persistence._lock``). Its first bytes are checked by
    :func:`check_header`, read through the store's shared descriptor.

    Raises:
        NotATurnkeeperStore: A directory; a folder that does not exist; read-only, a missing
            or empty file; not a regular file.
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
    except OSError as exc:
        raise StoreError(f"{path}: cannot be examined ({exc.strerror or exc})") from None
    if size == 0 and readonly:
        raise NotATurnkeeperStore(path, "the file is empty")
    return size


def check_header(path: str, size: int, header: bytes, *, readonly: bool) -> None:
    """Refuse a file whose first bytes are not SQLite's (an empty one too, read-only).

    Raises:
        NotATurnkeeperStore: They are not.
    """
    if size == 0:
        if readonly:
            raise NotATurnkeeperStore(path, "the file is empty")
        return
    if header != SQLITE_HEADER:
        raise NotATurnkeeperStore(path, "not a SQLite database (its first bytes are not SQLite's)")


def probe_uri(path: str) -> str:
    """The URI the read-only open checks what the file is through.

    With no ``-wal`` beside the file, every committed change is in the file itself, and it is
    read ``immutable``: SQLite then creates no ``-wal`` or ``-shm`` file, so a refused file's
    folder stays as it was. With a ``-wal`` (a live owner, or one that died), a plain
    read-only open, which reads the WAL too.
    """
    uri = readonly_uri(path)
    return uri if os.path.exists(f"{path}-wal") else uri + "&immutable=1"


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
