"""The SQLite store, on aiosqlite.

Cost model (``docs/persistence.md``): one aiosqlite call is a thread hop of about 180 µs while
the commit itself is about 26 µs, so the number of calls sets the price of a durable write.
Every commit (one boundary) is one *job* (``_writes``) run on the connection's thread inside
one transaction, one aiosqlite call; with group commit (the default) the jobs of concurrent writers
share that call and its transaction (``_group``), and reads are jobs too, riding in the same
calls. The connection runs in autocommit mode (``isolation_level=None``); only the migration
opens a transaction of several calls.

One lock serializes the store's calls, so no statement ever lands inside another transaction.
Values read back are validated (typed msgspec decoders and column checks); a bad
one raises :class:`~persistence.CorruptRecord` and is left where it is.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
from typing import TYPE_CHECKING, Any, Literal, Self, TypeVar

import aiosqlite
import anyio

from persistence import _checks, _lock, _writes
from persistence._checkpoint import Checkpointer
from persistence._connection import (
    SQLITE_HEADER,
    Translate,
    check_header,
    check_path,
    connect,
    one,
    probe_uri,
    readonly_uri,
    transaction,
)
from persistence._decode import (
    decode_abandon,
    decode_handle,
    decode_load,
    decode_operation,
    decode_queue_query,
    decode_session,
    recovery_scan,
)
from persistence._errors import (
    CorruptRecord,
    DamagedStore,
    ForeignStore,
    MigrationRequired,
    NotATurnkeeperStore,
    StoreError,
    UnsupportedSchemaVersion,
    UsageError,
)
from persistence._group import GroupCommit, sqlite_execute
from persistence._migrations import Migration, load_migrations
from persistence._open_receipts import OpenReceipts, decode_open, open_query
from persistence._partial import check_chunk
from persistence._text import clip, tolerant
from persistence.records import (
    AbandonMarker,
    AbandonQuery,
    Boundary,
    Committed,
    HandleQuery,
    HandleRecord,
    OperationRecord,
    OpState,
    QueueQuery,
    ReceiptQuery,
    RecoveryScan,
    SessionList,
    SessionLoad,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import TracebackType

    from persistence._lock import HeldLock, Pin

    Precheck = Callable[["SqliteStore"], Awaitable[None]]

Synchronous = Literal["NORMAL", "FULL"]
T = TypeVar("T")

_SYNCHRONOUS: dict[str, str] = {
    "NORMAL": "PRAGMA synchronous = NORMAL",
    "FULL": "PRAGMA synchronous = FULL",
}

SELECT_SESSIONS = "SELECT id, record FROM sessions ORDER BY id"
SELECT_VERSION_TABLE = (
    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
)
SELECT_OPERATION = "SELECT op_id, state, record FROM operations WHERE op_id = ?"
SELECT_OPERATIONS = "SELECT op_id, state, record FROM operations ORDER BY rowid"
SELECT_OPERATIONS_IN_SESSION = (
    "SELECT op_id, state, record FROM operations WHERE session = ? ORDER BY rowid"
)
_HANDLE_COLUMNS = "SELECT handle_id, owner, target, status, record FROM handles"
#: The handles query, by which filters it has: ``(owner given, target given)``.
SELECT_HANDLES = {
    (False, False): f"{_HANDLE_COLUMNS} ORDER BY handle_id",
    (True, False): f"{_HANDLE_COLUMNS} WHERE owner = ? ORDER BY handle_id",
    (False, True): f"{_HANDLE_COLUMNS} WHERE target = ? ORDER BY handle_id",
    (True, True): f"{_HANDLE_COLUMNS} WHERE owner = ? AND target = ? ORDER BY handle_id",
}
SELECT_VERSION = "SELECT version FROM schema_version"
SELECT_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table'"
INSERT_VERSION = "INSERT INTO schema_version (version) VALUES (?)"
UPDATE_VERSION = "UPDATE schema_version SET version = ?"

_NOTHING = Committed()
#: The largest label (``PRAGMA user_version`` is a signed 32-bit integer).
_MAX_LABEL = 2**31 - 1


# -- migrations -------------------------------------------------------------------------------


def _read_alone(db: sqlite3.Connection, job: _writes.Job[T]) -> T:
    """On the connection's thread: one read job in a read transaction (one snapshot)."""
    db.execute("BEGIN")
    try:
        return job(db)
    finally:
        db.execute("COMMIT")


def migrations() -> tuple[Migration, ...]:
    """The numbered migrations this code applies (a test may substitute this function)."""
    return load_migrations()


def schema_version() -> int:
    """The newest schema version this code knows."""
    return migrations()[-1].version


def tables_at(version: int) -> frozenset[str]:
    """The tables a store of ``version`` holds: those its migrations create."""
    return frozenset(
        match.group(1)
        for migration in migrations()[:version]
        for statement in migration.statements
        for match in [re.search(r"CREATE TABLE (\w+)", statement)]
        if match is not None
    )


async def _take_lock(database: str, *, create: bool = True) -> HeldLock | None:
    """Take the file's lock on a worker thread; a cancellation waits for the outcome.

    The shield makes sure a lock that was taken reaches the caller, who releases it on the
    cancellation delivered at its next checkpoint.
    """
    with anyio.CancelScope(shield=True):
        held = await anyio.to_thread.run_sync(lambda: _lock.acquire(database, create=create))
    return held


async def _give_up(held: HeldLock | Pin, *, unlink: tuple[str, ...] = ()) -> None:
    """Delete ``unlink`` (still holding), then release the lock or pin, even when cancelled."""

    def release() -> None:
        try:
            for name in unlink:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name)
        finally:
            held.release()

    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(release)


async def _checked_pin(path: str, pinned: Pin, *, readonly: bool) -> None:
    """Refuse a file whose first bytes are not SQLite's, read through its shared descriptor."""
    size, header = await anyio.to_thread.run_sync(pinned.facts, len(SQLITE_HEADER))
    check_header(path, size, header, readonly=readonly)


def _pin_readonly(path: str) -> Pin:
    """Share the file's descriptor for a read-only open; it creates nothing."""
    check_path(path, readonly=True)
    try:
        return _lock.pin(path, create=False)
    except FileNotFoundError:
        raise NotATurnkeeperStore(path, "no such file (read-only opens create nothing)") from None


def _empty(path: str) -> bool:
    try:
        return os.path.getsize(path) == 0
    except OSError:
        return False


# -- the store --------------------------------------------------------------------------------


class SqliteStore:
    """A :class:`~persistence.Store` in one SQLite file (WAL, foreign keys on).

    Args:
        path: The database file. A missing or empty file is created and migrated (read-write
            only); an existing file must be a turnkeeper store.
        synchronous: ``NORMAL`` (the default: a power loss may undo the last commits but
            never corrupts the file) or ``FULL`` (every commit reaches the disk first).
        readonly: Open with ``mode=ro`` (for inspection): never create, migrate, lock or write
            the database file; writes raise :class:`~persistence.UsageError`. Like any WAL
            reader, SQLite may create the ``-wal`` and ``-shm`` files beside it when they are
            missing.
        group_commit: Let writes that arrive while a commit is in flight share the next
            transaction (one aiosqlite call for all of them; see ``persistence._group``). No
            writer returns before the commit holding its write did, so a crash loses nothing
            a caller was told is durable. Off: one transaction per write.

        label: Read-write only: an integer (1 to 2**31 - 1) written into the file's header
            (``PRAGMA user_version``, in the transaction that creates the store) when this
            open creates the store; an existing store keeps its own. See :meth:`read_label`
            and :meth:`remove`.
        precheck: Read-write only: before the read-write connection is made, and holding the
            file's lock, call ``precheck`` with the file opened read-only (through SQLite's
            ``immutable`` view when no ``-wal`` is beside it, exact since no other owner can
            write); what it raises refuses the open, leaving the folder exactly as it was.
            Skipped for a store that needs a migration (the read-only view cannot read it).

    One owner per file: a read-write open first takes an exclusive ``flock`` on the database
    file itself (``persistence._lock``), whatever name it is opened by, and holds it until
    :meth:`close`, so a second read-write open of the file, from another process or this one,
    raises :class:`~persistence.StoreLocked` instead of racing the owner. POSIX only: without
    ``fcntl`` a read-write open raises :class:`~persistence.StoreError`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "NORMAL",
        readonly: bool = False,
        group_commit: bool = True,
        precheck: Precheck | None = None,
        label: int = 0,
    ) -> None:
        if synchronous not in _SYNCHRONOUS:
            raise UsageError(f"synchronous must be 'NORMAL' or 'FULL', not {synchronous!r}")
        if readonly and (precheck is not None or label):
            raise UsageError("precheck and label are for a read-write open")
        if type(label) is not int or not 0 <= label <= _MAX_LABEL:
            raise UsageError(f"label must be an integer from 0 to {_MAX_LABEL}, not {label!r}")
        self._label = label
        self._path = os.fspath(path)
        self._synchronous = synchronous
        self._readonly = readonly
        self._precheck = precheck
        #: A read-only view under an owner's lock (``precheck``): read ``immutable`` throughout.
        self._settled = False
        #: The schema version this open migrated from (0: it created the store), else ``None``.
        self._migrated_from: int | None = None
        self._db: aiosqlite.Connection | None = None
        self._checkpointer: Checkpointer | None = None
        self._held: HeldLock | None = None
        #: A read-only store's share of the file's descriptor (``persistence._lock``).
        self._pin: Pin | None = None
        self._lock = anyio.Lock(fast_acquire=True)
        self._errors = Translate(self._path)
        self._group: GroupCommit[_writes.Job[Any]] = GroupCommit(
            execute=sqlite_execute(self._writer), lock=self._lock, batching=group_commit
        )

    def __repr__(self) -> str:
        state = "open" if self._db is not None else "closed"
        mode = "readonly" if self._readonly else f"synchronous={self._synchronous}"
        return f"<SqliteStore {self._path!r} {state} {mode}>"

    # -- lifecycle ------------------------------------------------------------------------------

    async def open(self) -> None:
        """Open the store: create and migrate it if needed, then set the connection's PRAGMAs.

        A read-write open takes the file's lock first, before it reads or writes anything.

        Raises:
            StoreLocked: Read-write, and another store (another process, or another
                ``SqliteStore`` in this one) holds the file. Nothing was read or written.
            NotATurnkeeperStore: The file is not SQLite, or SQLite without turnkeeper's
                ``schema_version`` table (or, read-only, missing or empty). It is left as is.
            UnsupportedSchemaVersion: The store is newer than this code. It is left as is.
            MigrationRequired: Read-only, and the store is older than this code.
            StoreError: SQLite failed (I/O error, locked too long), or the lock could not be
                taken (no ``fcntl`` on this platform, the file cannot be opened).
            UsageError: The store is already open.
        """
        async with self._lock:
            if self._db is not None:
                raise UsageError(f"{self._path} is already open")
            if self._readonly:
                pinned = await anyio.to_thread.run_sync(_pin_readonly, self._path)
                try:
                    await _checked_pin(self._path, pinned, readonly=True)
                    with self._errors:
                        self._db = await self._open_readonly()
                except BaseException:
                    await _give_up(pinned)
                    raise
                self._pin = pinned
                return
            # What the path is, before the file is created or opened: a refusal leaves the
            # folder as it was.
            await anyio.to_thread.run_sync(lambda: check_path(self._path, readonly=False))
            held = await _take_lock(self._path)
            if held is None:  # pragma: no cover - create=True makes a missing file
                raise StoreError(f"{self._path}: it vanished while it was opened")
            try:
                await _checked_pin(self._path, held.pin, readonly=False)
                if self._precheck is not None:
                    await self._run_precheck(self._precheck)
                with self._errors:
                    db = await self._open_readwrite()
            except BaseException:
                # An empty file this open created goes again: the folder is left as it was.
                created = (self._path,) if held.created and _empty(self._path) else ()
                await _give_up(held, unlink=created)
                raise
            await anyio.to_thread.run_sync(held.announce)
            self._db, self._held = db, held
            self._checkpointer = Checkpointer(self._path)
            self._checkpointer.start()
            self._group.on_commit = self._checkpointer.committed

    @classmethod
    def _held_view(cls, path: str) -> SqliteStore:
        """A read-only store of a file whose lock the caller holds.

        It reads ``immutable`` when no ``-wal`` is beside the file: exact, since no other
        owner can write meanwhile, and it makes no ``-wal`` or ``-shm`` file.
        """
        view = cls(path, readonly=True)
        view._settled = True
        return view

    async def _run_precheck(self, precheck: Precheck) -> None:
        """Run ``precheck`` on a read-only view of the file this open holds the lock of."""
        view = SqliteStore._held_view(self._path)
        try:
            await view.open()
        except MigrationRequired:
            return  # the read-write open migrates it; the caller checks again afterwards
        try:
            await precheck(view)
        finally:
            await view.close()

    async def close(self) -> None:
        """Close the store, even in a cancelled scope. Closing a closed store does nothing.

        The file's lock (or a read-only store's share of the file's descriptor) is released
        last, once the connection (and its last checkpoint) is closed, so the next owner never
        meets this one's writes and SQLite's own locks of the file stay whole.
        """
        with anyio.CancelScope(shield=True):
            async with self._lock:
                db, self._db = self._db, None
                checkpointer, self._checkpointer = self._checkpointer, None
                held: HeldLock | Pin | None = self._held or self._pin
                self._held = self._pin = None
                self._group.on_commit = None
                try:
                    if checkpointer is not None:
                        await checkpointer.stop()
                    if db is not None:
                        with self._errors:
                            await db.close()
                finally:
                    if held is not None:
                        await _give_up(held)

    @property
    def owner(self) -> str | None:
        """This owner's token: random hex minted when the open took the file's lock.

        ``None`` while the store is closed, and always for a read-only store (it owns nothing).
        A later reopen mints a new one, and :meth:`commit` refuses every other token
        (:class:`~persistence.StaleOwner`). Between processes the lock is what makes one
        owner (the kernel drops it with its holder); the token fences a writer of this
        process that outlived its open, and is the fence a store shared by several processes
        (with leases) checks in the same transaction as the write.
        """
        return None if self._held is None else self._held.owner

    async def read_label(self) -> int:
        """The label the store's creator gave it (``label``); 0 when it has none."""
        (value,) = (await self._read(_writes.select("PRAGMA user_version", ())))[0]
        return int(value)

    @classmethod
    async def remove(cls, path: str | os.PathLike[str], *, label: int | None = None) -> bool:
        """Delete the store at ``path`` (the file, its ``-wal``, ``-shm`` and holder file).

        It holds the file's lock while it checks and deletes, so a live owner's store is never
        removed from under it. Returns ``False`` when there is no file (nothing is deleted).
        With ``label``, only a store carrying that label is deleted.

        Raises:
            StoreLocked: An owner holds the store; nothing is deleted.
            ForeignStore: ``label`` was given and the store carries another; nothing is
                deleted.
            NotATurnkeeperStore: The file is not a turnkeeper store; it is left as is (so are
                ``UnsupportedSchemaVersion`` and ``MigrationRequired``, from the read-only
                check of what the file is).
        """
        database = os.fspath(path)
        if await anyio.Path(database).is_dir():
            raise NotATurnkeeperStore(database, "it is a directory")
        held = await _take_lock(database, create=False)
        if held is None:
            return False
        files: tuple[str, ...] = ()
        try:
            # Raises for anything that is not a turnkeeper store, touching nothing.
            try:
                async with cls._held_view(database) as store:
                    found = await store.read_label()
            except MigrationRequired:  # a store of ours an older version made: its label reads
                found = await anyio.to_thread.run_sync(_read_label, database)
            if label is not None and found != label:
                raise ForeignStore(database, found, label)
            files = (database, f"{database}-wal", f"{database}-shm", _lock.holder_path(database))
        finally:
            await _give_up(held, unlink=files)
        return True

    @classmethod
    async def migrate(cls, path: str | os.PathLike[str]) -> tuple[int, int]:
        """Bring the store at ``path`` to this code's schema; ``(version found, version now)``.

        The missing migrations run in one transaction (as any read-write open runs them), so
        a failure leaves the store at its old version. Unlike an open, it never creates a
        store: a missing or empty file is refused, and the folder is left as it was.

        Raises:
            NotATurnkeeperStore: No such file, an empty one, or not a turnkeeper store.
            UnsupportedSchemaVersion: The store is newer than this code; it is left as is.
            DamagedStore: The store cannot be read whole; nothing was written.
            StoreLocked: Another store owns the file; nothing was read or written.
            StoreError: A migration failed (the store is left at its old version).
        """
        database = os.fspath(path)
        if not await anyio.Path(database).exists():
            raise NotATurnkeeperStore(database, "no such file (migrate creates nothing)")
        store = cls(database, precheck=_current)  # the read-only view refuses what is no store
        async with store:
            found = store._migrated_from
        return (schema_version() if found is None else found), schema_version()

    async def __aenter__(self) -> Self:
        """Open the store and return it."""
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the store."""
        await self.close()

    async def _open_readwrite(self) -> aiosqlite.Connection:
        fresh = not await anyio.to_thread.run_sync(os.path.getsize, self._path)
        db = await connect(self._path)
        try:
            # Nothing up to the migration writes to the file: a refused file stays byte-identical.
            await db.execute("PRAGMA busy_timeout = 5000")
            version = 0 if fresh else await self._probe(db)
            await db.execute("PRAGMA foreign_keys = ON")
            await db.execute(_SYNCHRONOUS[self._synchronous])
            if version < schema_version():
                await self._migrate(db)
            # Setting WAL writes the header, so it comes after every check.
            (mode,) = await one(db, "PRAGMA journal_mode = WAL")
            if mode != "wal":
                raise StoreError(f"{self._path}: could not switch to WAL (journal mode {mode!r})")
            # Checkpoints run on the checkpointer's thread, never inside a commit (_checkpoint).
            await db.execute("PRAGMA wal_autocheckpoint = 0")
        except BaseException:
            with anyio.CancelScope(shield=True):
                await db.close()
            raise
        return db

    async def _open_readonly(self) -> aiosqlite.Connection:
        """Check what the file is, then open it ``mode=ro`` for reading.

        The checks read the file ``immutable`` when no ``-wal`` is beside it
        (``_connection.probe_uri``), so a refused file gets no sidecar files either.
        """
        uri = readonly_uri(self._path)
        probe = await anyio.to_thread.run_sync(probe_uri, self._path)
        db = await connect(probe, uri=True)
        try:
            await db.execute("PRAGMA busy_timeout = 5000")
            version = await self._probe(db)
            if version < schema_version():
                raise MigrationRequired(self._path, version, schema_version())
            if probe != uri and not self._settled:  # checked immutable: read through a real one
                await db.close()
                db = await connect(uri, uri=True)
            await db.execute("PRAGMA busy_timeout = 5000")
            await db.execute("PRAGMA query_only = ON")
        except BaseException:
            with anyio.CancelScope(shield=True):
                await db.close()
            raise
        return db

    async def _probe(self, db: aiosqlite.Connection) -> int:
        """The schema version of an existing file, reading only.

        Raises:
            NotATurnkeeperStore: Not SQLite, or no ``schema_version`` table.
            UnsupportedSchemaVersion: Newer than this code.
            DamagedStore: ``schema_version`` is not one version from 1 up, or a table that
                version has is missing.
        """
        try:
            (tables,) = await one(db, SELECT_VERSION_TABLE)
        except sqlite3.DatabaseError as exc:
            if getattr(exc, "sqlite_errorname", "") != "SQLITE_NOTADB":
                raise
            raise NotATurnkeeperStore(self._path, f"not a SQLite database ({exc})") from None
        if tables == 0:
            raise NotATurnkeeperStore(
                self._path, "a SQLite database without turnkeeper's schema_version table"
            )
        try:
            version = await self._read_version(db)
        except CorruptRecord as error:
            raise DamagedStore(self._path, str(error)) from None
        if version > schema_version():
            raise UnsupportedSchemaVersion(self._path, version, schema_version())
        if version < 1:
            raise DamagedStore(self._path, f"schema_version says version {version}")
        present = {str(name) for (name,) in await db.execute_fetchall(SELECT_TABLES)}
        missing = sorted(tables_at(version) - present)
        if missing:
            raise DamagedStore(
                self._path, f"schema version {version} has no table {', '.join(missing)}"
            )
        ahead = sorted((tables_at(schema_version()) - tables_at(version)) & present)
        if ahead:  # a migration would fail on them: refuse before it writes anything
            raise DamagedStore(
                self._path,
                f"schema_version says {version}, but table {', '.join(ahead)} of a later "
                "version exists",
            )
        return version

    async def _read_version(self, db: aiosqlite.Connection) -> int:
        rows = list(await db.execute_fetchall(SELECT_VERSION))
        if len(rows) != 1 or type(rows[0][0]) is not int:
            found = [tuple(row) for row in rows]
            raise CorruptRecord(
                "schema_version", "version", f"$: expected one integer row, {found}"
            )
        version: int = rows[0][0]
        return version

    async def _migrate(self, db: aiosqlite.Connection) -> None:
        """Run the missing migrations and record the new version, all in one transaction."""
        async with transaction(db):
            (tables,) = await one(db, SELECT_VERSION_TABLE)
            version = await self._read_version(db) if tables else 0
            if version > schema_version():  # another process migrated it meanwhile
                raise UnsupportedSchemaVersion(self._path, version, schema_version())
            self._migrated_from = version
            for migration in migrations()[version:]:
                for statement in migration.statements:
                    await db.execute(statement)
            if version == 0:
                await db.execute(INSERT_VERSION, (schema_version(),))
                if self._label:  # checked to be an int in range: the PRAGMA takes no parameter
                    await db.execute(f"PRAGMA user_version = {self._label:d}")
            elif version < schema_version():
                await db.execute(UPDATE_VERSION, (schema_version(),))

    # -- helpers --------------------------------------------------------------------------------

    def _reader(self) -> aiosqlite.Connection:
        if self._db is None:
            raise _checks.not_open()
        return self._db

    def _writer(self) -> aiosqlite.Connection:
        db = self._reader()
        if self._readonly:
            raise UsageError(f"{self._path} is open read-only")
        return db

    async def _write(self, job: _writes.Job[Any]) -> Any:
        """Run a write job in a transaction (shared with concurrent writers under group commit)."""
        self._writer()
        with self._errors:
            return await self._group.run(job)

    async def _read(self, job: _writes.Job[T]) -> T:
        """Run a read job; concurrent reads and writes share one call (``_group``).

        A read-only store runs it alone, in a read transaction of its own. A TEXT value that is
        not UTF-8 reads as ``NotUtf8`` (``persistence._text``): one damaged row fails only
        its own decoding, never the whole read.
        """
        self._reader()
        job = tolerant(job)
        with self._errors:
            if not self._readonly:
                batched: T = await self._group.run(job)
                return batched
            async with self._lock:
                db = self._reader()
                alone: T = await db._execute(_read_alone, db._conn, job)  # type: ignore[no-untyped-call]
                return alone

    @property
    def commits(self) -> tuple[int, int]:
        """``(transactions, writes)`` committed since the store was made (group commit's gain)."""
        return self._group.batches, self._group.jobs

    # -- writes ---------------------------------------------------------------------------------

    async def commit(self, session: str, boundary: Boundary, *, owner: str | None) -> Committed:
        """Make one boundary of ``session`` durable in one transaction (one aiosqlite call).

        The owner is checked twice: here, and again on the connection's thread inside the
        transaction (a reopen between the two cannot let a stale writer through).

        Raises:
            StaleOwner: ``owner`` is not this store's current owner.
            UsageError: See ``Store.commit``; nothing of the boundary is written.
            CorruptRecord: A stored value the commit had to read fails validation.
        """
        if self._db is None or self._readonly:
            self._writer()  # raises: closed, or open read-only
        held = self._held
        if owner is None or held is None or owner != held.owner:  # ``fence``, inlined
            _checks.fence(session, self.owner, owner)
        if (
            boundary.create is None
            and boundary.envelope is None
            and boundary.queue is None
            and boundary.abandon is None
            and not boundary.clear_abandon
            and boundary.auto_retry is None
            and not (boundary.rows or boundary.delete or boundary.cut_states or boundary.handles)
        ):  # receipts (and partial parts), the most frequent boundary: its own short path
            _checks.check_receipts(session, boundary.operations)
            chunk, drops = boundary.partial, boundary.drop_partials
            if chunk is not None or drops:
                check_chunk(session, chunk, drops)
            job = _writes.receipts(session, boundary.operations, self, owner, chunk, drops)
        else:
            _checks.check_boundary(session, boundary)
            check_chunk(session, boundary.partial, boundary.drop_partials)
            job = _writes.commit(session, boundary, self._path, self, owner)  # fenced again in it
        if job is None:
            return _NOTHING
        with self._errors:  # ``_write``, inlined: one coroutine less per commit
            deleted: int = await self._group.run(job)
        return Committed(deleted=deleted) if deleted else _NOTHING

    # -- reads ----------------------------------------------------------------------------------

    async def load(self, session: str, *, envelopes: bool = True) -> SessionLoad | None:
        """The session's record, rows by seq, envelopes, queue, marker, partials: one snapshot.

        A damaged queued entry is reported in ``queue_corrupt`` and left out of ``queue``. A
        damaged partial part ends its stream's parts there, as a gap, and is logged
        (``persistence._partial.decode_parts``).

        Raises:
            CorruptRecord: A value of the session fails validation (it is reported, never
                skipped).
        """
        return decode_load(*await self._read(_writes.load(session, envelopes=envelopes)))

    async def sessions(self) -> SessionList:
        """Every session whose record validates, ordered by id; the others in ``corrupt``."""
        records = SessionList()
        corrupt: list[tuple[str, str]] = []
        for row in await self._read(_writes.select(SELECT_SESSIONS, ())):
            try:
                records.append(decode_session(row))
            except CorruptRecord as error:
                corrupt.append((str(row[0]), str(error)))
        records.corrupt = tuple(corrupt)
        return records

    async def quick_check(self) -> list[str]:
        """SQLite's ``PRAGMA quick_check``: what it found wrong (empty when it says ``ok``).

        Reads every page of the file (no index cross-check, which ``integrity_check`` adds);
        ``turnkeeper inspect`` runs it. A store too damaged to check raises
        :class:`~persistence.DamagedStore`.
        """
        rows = await self._read(_writes.select("PRAGMA quick_check", ()))
        found = [str(row[0]) for row in rows]
        return [] if found == ["ok"] else found

    async def scan_recoverable(self) -> RecoveryScan:
        """Every session with an owed cut record, read in one call (PS-6's startup scan).

        The owed rows are read through the partial index on ``cut_state``. A session whose
        owed rows, later rows or record fail validation is reported in ``corrupt`` and left
        out; nothing is written. ``queued`` names every session holding a queued entry, read
        in the same call (through the primary key's index).
        """
        return recovery_scan(await self._read(_writes.scan_recoverable))

    async def receipts(
        self,
        session: str | None = None,
        *,
        op_id: str | None = None,
        states: frozenset[OpState] | None = None,
        recent: int | None = None,
    ) -> ReceiptQuery:
        """Open receipts first (indeterminate, then requested and running), then recent others.

        A row that fails validation is reported by id in ``corrupt`` and skipped.
        """
        if op_id is not None:
            job = _writes.select(SELECT_OPERATION, (op_id,))
        elif session is None:
            job = _writes.select(SELECT_OPERATIONS, ())
        else:
            job = _writes.select(SELECT_OPERATIONS_IN_SESSION, (session,))
        records: list[OperationRecord] = []
        corrupt: list[tuple[str, str]] = []
        for row in await self._read(job):
            try:
                records.append(decode_operation(row))
            except CorruptRecord as error:
                corrupt.append((str(row[0]), str(error)))
        ordered = _checks.order_receipts(
            records, session=session, op_id=op_id, states=states, recent=recent
        )
        return ReceiptQuery(records=ordered, corrupt=tuple(corrupt))

    async def open_receipts(self, session: str | None = None) -> OpenReceipts:
        """The receipts that may still be running, through the ``operations_open`` index.

        A row in an open state that fails validation is reported in ``damaged`` with its
        indexed columns (``persistence._open_receipts``).
        """
        sql, params = open_query(session)
        return decode_open(await self._read(_writes.select(sql, params)))

    async def handles(self, *, owner: str | None = None, target: str | None = None) -> HandleQuery:
        """Handle records by ``handle_id`` (through the owner or target index when filtered).

        A row that fails validation is reported by id in ``corrupt`` and skipped (never
        dropped or rewritten).
        """
        sql = SELECT_HANDLES[owner is not None, target is not None]
        params = tuple(value for value in (owner, target) if value is not None)
        records: list[HandleRecord] = []
        corrupt: list[tuple[str, str]] = []
        for row in await self._read(_writes.select(sql, params)):
            try:
                records.append(decode_handle(row))
            except CorruptRecord as error:
                corrupt.append((clip(str(row[0])), str(error)))
        return HandleQuery(records=tuple(records), corrupt=tuple(corrupt))

    async def abandon_markers(self) -> AbandonQuery:
        """Every session's abandon marker, by session id (one read of the marker table).

        A row that fails validation is reported by session in ``corrupt`` and skipped.
        """
        markers: list[tuple[str, AbandonMarker]] = []
        corrupt: list[tuple[str, str]] = []
        for row in await self._read(_writes.select(_writes.SELECT_ALL_ABANDON, ())):
            try:
                markers.append((str(row[0]), decode_abandon(row)))
            except CorruptRecord as error:
                corrupt.append((clip(str(row[0])), str(error)))
        return AbandonQuery(markers=tuple(markers), corrupt=tuple(corrupt))

    async def queued(self, session: str | None = None) -> QueueQuery:
        """The durable queue's entries by session then position, and the queue versions.

        One read (through the index on ``(session, position)`` for one session). A damaged
        entry is reported in ``corrupt`` by its ``session/entry`` key, a damaged version by its
        session; each is skipped, never dropped or rewritten.
        """
        return decode_queue_query(*await self._read(_writes.queued(session)))


async def _current(view: SqliteStore) -> None:
    """``migrate``'s precheck: a store the read-only view opened needs no migration."""


def _read_label(database: str) -> int:
    """The label (``user_version``) of a store too old to open, read without changing it."""
    uri = f"file:{database}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        (value,) = conn.execute("PRAGMA user_version").fetchone()
    return int(value)
