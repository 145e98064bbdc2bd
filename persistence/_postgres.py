"""The PostgreSQL store, on psycopg 3 (async): many engine processes, one database.

The same Store port and the same records as ``SqliteStore`` (the conformance suite runs on
both), plus session *leases* (``docs/deploying.md``): each open read-write store is one engine
incarnation with an owner id of its own (host, pid and a random part, never a configured
name); a session is written only by the process holding its lease, and every commit checks
that lease in its own transaction (``_pg_commit``'s fence). A lease runs out ``lease`` seconds
after its last renewal, on the database's clock; one statement per process renews them all, on
a task and a connection of their own (:class:`~persistence._pg_leases.Renewer`).

Writes share transactions (group commit, ``_group``): the commits that arrive while one is in
flight make the next batch, one ``BEGIN`` .. ``COMMIT`` holding a savepoint per commit, so one
``fsync`` serves many sessions. Reads run on a connection of their own, each in one
``REPEATABLE READ READ ONLY`` snapshot.

A URL that does not connect, a database of another application, a schema newer than the code
or a role without the rights it needs is one :class:`~persistence.TurnkeeperError` at
:meth:`PostgresStore.open`, naming the URL (its password masked) and what was wrong; nothing
is written.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.resources
import logging
import os
import re
import secrets
import socket
from collections.abc import Collection, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import anyio
import psycopg
from psycopg import errors as pg_errors

from persistence import _checks, _pg_commit, _pg_fast
from persistence import _pg_sql as sql
from persistence._decode import (
    Scan,
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
    LeaseLost,
    MigrationRequired,
    NotATurnkeeperStore,
    StoreError,
    TurnkeeperError,
    UnsupportedSchemaVersion,
    UsageError,
)
from persistence._group import GroupCommit, Outcome
from persistence._open_receipts import OpenReceipts, decode_open
from persistence._partial import check_chunk
from persistence._pg_commit import Params
from persistence._pg_leases import RELEASED, LeaseRow, Leases, Listener, Renewer, lease_problem
from persistence._pg_owner import OWNER_PATTERN
from persistence._requests import (
    KINDS,
    Reply,
    Request,
    RequestKind,
    Withdrawn,
    decode_reply,
    decode_request,
    encode,
)
from persistence._text import clip
from persistence._urls import masked, scrubbed, secrets_of
from persistence._writes import handle_params
from persistence.records import (
    INBOX_ENTRY,
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
    from collections.abc import Callable

_NOTHING = Committed()
log = logging.getLogger("turnkeeper.persistence")
APPLICATION = "turnkeeper"
#: The default lease: a crashed holder's sessions are taken up this long after its last renewal.
DEFAULT_LEASE_S = 10.0


@functools.cache
def pg_migrations() -> tuple[tuple[int, str, str], ...]:
    """The PostgreSQL migrations ``(version, name, script)``, numbered 1..N."""
    folder = importlib.resources.files("persistence").joinpath("migrations", "postgres")
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_\w+\.sql", entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort()
    if [version for version, _, _ in found] != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..N: {[name for _, name, _ in found]}")
    return tuple(found)


def pg_schema_version() -> int:
    """The newest PostgreSQL schema version this code knows."""
    return pg_migrations()[-1][0]


def pg_tables_at(version: int) -> frozenset[str]:
    """The tables a PostgreSQL store of ``version`` holds."""
    return frozenset(
        match
        for _, _, script in pg_migrations()[:version]
        for match in re.findall(r"CREATE TABLE (\w+)", script)
    )


def mint_owner() -> str:
    """A new owner id: unique to this incarnation (``host/pid/random``)."""
    host = re.sub(r"[/\s]", "-", socket.gethostname()) or "host"
    return f"{host}/{os.getpid()}/{secrets.token_hex(6)}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


#: Event-loop turns a group commit's leader waits for writers made ready with it
#: (``persistence._group``): four engine processes over 1,000 sessions (``bench.pg_fleet``)
#: ran 1,849-3,015 steps/s with none and 2,606-3,962 with four, in six rounds run alternately
#: (eight turns: 3,065-3,521, with a higher p50).
GATHER_TURNS = 4
#: How long a read whose caller was cancelled may still run to its end (``PostgresStore._read``).
READ_GRACE_S = 5.0


class _Translate:
    """Turn a psycopg error escaping a block into one of ours (the store's boundary).

    The driver's message may quote the connection's password back: it is scrubbed.
    """

    __slots__ = ("_secrets", "_url")

    def __init__(self, url: str, secrets: tuple[str, ...] = ()) -> None:
        self._url = url
        self._secrets = secrets

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, pg_errors.InsufficientPrivilege):
            raise StoreError(
                f"{self._url}: the role lacks a right turnkeeper needs "
                f"({scrubbed(_first_line(exc), self._secrets)})"
            ) from None
        if isinstance(exc, psycopg.Error):
            raise StoreError(f"{self._url}: {scrubbed(_first_line(exc), self._secrets)}") from None


class PostgresStore:
    """A :class:`~persistence.Store` in one PostgreSQL database, shared by many processes.

    Args:
        url: A libpq URL or connection string (``postgresql://user@host/db``; a Unix socket
            folder as ``?host=/path``).
        lease: Seconds a session's lease lasts after its last renewal (at least 1).
        readonly: Open for inspection: never create, migrate or write; no owner, no leases.
        group_commit: Let commits that arrive while one is in flight share the next
            transaction. Off: one transaction per commit.
        renew_every: Seconds between renewals (default a third of ``lease``).
        connect_timeout: Seconds a connection attempt may take.
        clock: A monotonic clock in seconds, for self-fencing (the database judges expiry).
    """

    def __init__(
        self,
        url: str,
        *,
        lease: float = DEFAULT_LEASE_S,
        readonly: bool = False,
        group_commit: bool = True,
        renew_every: float | None = None,
        connect_timeout: float = 5.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not url:
            raise UsageError(f"a PostgreSQL URL must be a non-empty string, not {url!r}")
        if not 1.0 <= lease <= 86_400.0:
            raise UsageError(f"lease must be from 1 to 86400 seconds, not {lease!r}")
        self._url = url
        self._shown = masked(url)
        self._lease = float(lease)
        self._readonly = readonly
        self._timeout = connect_timeout
        self._writer: psycopg.AsyncConnection[Any] | None = None
        self._reader: psycopg.AsyncConnection[Any] | None = None
        self._lock = anyio.Lock(fast_acquire=True)
        self._read_lock = anyio.Lock(fast_acquire=True)
        self._secrets = secrets_of(url)
        self._errors = _Translate(self._shown, self._secrets)
        self._group: GroupCommit[_pg_commit.Plan] = GroupCommit(
            execute=self._execute,
            lock=self._lock,
            batching=group_commit,
            gather_turns=GATHER_TURNS,
        )
        self._owner: str | None = None
        self._open = False
        #: The leases this incarnation holds and lost (``persistence._pg_leases``).
        self.leases = Leases(lease=self._lease, clock=clock)
        self._renewer: Renewer | None = None
        self._renew_every = renew_every if renew_every is not None else self._lease / 3
        self._listener: Listener | None = None
        #: Batches committed pipelined, and batches that fell back to commit by commit.
        self.fast_batches = 0
        self.careful_batches = 0
        #: Called when a peer gave its leases back (``watch_releases``), and when a message is
        #: posted to a session (``watch_inbox``).
        self._on_released: Callable[[], None] | None = None
        self._on_mail: Callable[[str], None] | None = None
        #: Called when a request is posted for a session, and when one is answered (LS-10).
        self._on_request: Callable[[str], None] | None = None
        self._on_answer: Callable[[int], None] | None = None
        #: Called when a handle of an owner session is written in another process (LS-11).
        self._on_handle: Callable[[str], None] | None = None

    def __repr__(self) -> str:
        state = "open" if self._open else "closed"
        return f"<PostgresStore {self._shown!r} {state}{' readonly' if self._readonly else ''}>"

    @property
    def url(self) -> str:
        """The store's URL with its password masked."""
        return self._shown

    # -- lifecycle ------------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect, check the schema (creating or migrating it read-write), start renewing.

        Raises:
            StoreError: The URL does not connect, or the role lacks a right it needs.
            NotATurnkeeperStore: The database holds another application's tables.
            UnsupportedSchemaVersion: The schema is newer than this code.
            MigrationRequired: Read-only, and the schema is older than this code.
            DamagedStore: ``schema_version`` is unreadable, or a table of its version is gone.
            UsageError: The store is already open.
        """
        async with self._lock:
            if self._open:
                raise UsageError(f"{self._shown} is already open")
            writer = None
            reader = await self._connect(read=True)
            try:
                await self._check_schema(reader)
                if not self._readonly:
                    writer = await self._connect(read=False)
                    await self._migrate(writer)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await reader.close()
                    if writer is not None:
                        await writer.close()
                raise
            self._reader, self._writer = reader, writer
            self._open = True
            if not self._readonly:
                self._owner = mint_owner()
                self.leases.reset()
                self._renewer = Renewer(
                    connect=lambda: self._connect(read=False),
                    owner=self._owner,
                    leases=self.leases,
                    every=self._renew_every,
                )
                self._renewer.start()
                self._listener = Listener(
                    connect=lambda: self._connect(read=False), heard=self._heard
                )
                self._listener.start()

    def watch_releases(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` whenever a peer gives its leases back (its clean close).

        Heard through ``LISTEN`` on a connection of the store's own; a peer's release is told
        in the transaction that releases, so the sessions are claimable when it is heard.
        """
        self._on_released = callback

    def watch_inbox(self, callback: Callable[[str], None] | None) -> None:
        """Call ``callback(session)`` whenever a message is posted to ``session`` (LS-9)."""
        self._on_mail = callback

    def _heard(self, payload: str) -> None:
        if payload == RELEASED and self._on_released is not None:
            self._on_released()
        elif payload.startswith("inbox:") and self._on_mail is not None:
            self._on_mail(payload.removeprefix("inbox:"))
        elif payload.startswith("handle:") and self._on_handle is not None:
            self._on_handle(payload.removeprefix("handle:"))
        elif payload.startswith("request:") and self._on_request is not None:
            self._on_request(payload.removeprefix("request:"))
        elif payload.startswith("answer:") and self._on_answer is not None:
            number = payload.removeprefix("answer:")
            if number.isdigit():
                self._on_answer(int(number))

    def watch_requests(self, callback: Callable[[str], None] | None) -> None:
        """Call ``callback(session)`` whenever a request is posted for ``session`` (LS-10)."""
        self._on_request = callback

    def watch_answers(self, callback: Callable[[int], None] | None) -> None:
        """Call ``callback(request id)`` whenever a holder answers a request (LS-10)."""
        self._on_answer = callback

    async def close(self) -> None:
        """Release this incarnation's leases (a peer may take them at once) and disconnect.

        Closing a closed store does nothing; a release that fails leaves the leases to run
        out, as a crash would.
        """
        with anyio.CancelScope(shield=True):
            async with self._lock:
                if not self._open:
                    return
                self._open = False
                renewer, self._renewer = self._renewer, None
                if renewer is not None:
                    await renewer.stop()
                listener, self._listener = self._listener, None
                if listener is not None:
                    await listener.stop()
                owner, self._owner = self._owner, None
                if owner is not None:
                    await self._release_on_close(owner)
                self.leases.reset()
                for conn in (self._writer, self._reader):
                    if conn is not None:
                        await conn.close()
                self._writer = self._reader = None

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _release_on_close(self, owner: str) -> None:
        """Give every lease back on a clean close, on a connection made again if need be.

        The write connection may have been closed under a cancelled query (the engine's tasks
        are cancelled as it shuts down): a fresh one is made for the release. Bounded by the
        connect timeout; a release that fails is logged and the leases run out by themselves.
        """
        with anyio.move_on_after(self._timeout + 1):
            try:
                conn = await self._writer_conn()
                await self._release_all(conn, owner)
                return
            except (psycopg.Error, StoreError) as exc:
                log.warning("leases of %s not given back at close: %s", owner, exc)
                return
        log.warning("leases of %s not given back at close: it took too long", owner)

    @staticmethod
    async def _release_all(conn: psycopg.AsyncConnection[Any], owner: str) -> None:
        """Give back every lease of ``owner`` and tell the peers, in one transaction."""
        async with conn.transaction():
            released = await conn.execute(sql.RELEASE_ALL, {"owner": owner})
            if released.rowcount:
                await conn.execute(sql.NOTIFY_RELEASED)

    @property
    def owner(self) -> str | None:
        """This incarnation's owner id (``None`` while closed or read-only)."""
        return self._owner

    async def _connect(self, *, read: bool) -> psycopg.AsyncConnection[Any]:
        try:
            conn = await psycopg.AsyncConnection.connect(
                self._url,
                autocommit=True,
                connect_timeout=max(1, round(self._timeout)),
                application_name=APPLICATION,
            )
        except psycopg.Error as exc:
            reason = scrubbed(_first_line(exc), self._secrets)
            raise StoreError(f"{self._shown}: cannot connect: {reason}") from None
        if read:
            try:
                await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
                await conn.set_read_only(True)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await conn.close()
                raise
        return conn

    async def _check_schema(self, conn: psycopg.AsyncConnection[Any]) -> int:
        """The schema version found, or 0 for an empty database (read-write only).

        Raises:
            NotATurnkeeperStore, UnsupportedSchemaVersion, MigrationRequired, DamagedStore,
            StoreError: See :meth:`open`.
        """
        with self._errors:
            tables = {str(name) for (name,) in await _fetch(conn, sql.SELECT_TABLES, ())}
            if "schema_version" not in tables:
                if tables:
                    shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
                    raise NotATurnkeeperStore(
                        self._shown, f"a database of another application (tables: {shown})"
                    )
                if self._readonly:
                    raise NotATurnkeeperStore(
                        self._shown, "an empty database (read-only opens create nothing)"
                    )
                return 0
            found = await _fetch(conn, sql.SELECT_VERSION, ())
        if len(found) != 1 or type(found[0][0]) is not int:
            raise DamagedStore(self._shown, f"schema_version holds {clip(repr(found))}")
        version, application = found[0]
        if application != APPLICATION:
            raise NotATurnkeeperStore(
                self._shown, f"its schema_version is the application {clip(str(application))}'s"
            )
        if version > pg_schema_version():
            raise UnsupportedSchemaVersion(self._shown, version, pg_schema_version())
        if version < 1:
            raise DamagedStore(self._shown, f"schema_version says version {version}")
        if self._readonly and version < pg_schema_version():
            raise MigrationRequired(self._shown, version, pg_schema_version())
        missing = sorted(pg_tables_at(version) - tables)
        if missing:
            raise DamagedStore(
                self._shown, f"schema version {version} has no table {', '.join(missing)}"
            )
        return int(version)

    async def _migrate(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Run the missing migrations and record the version: one transaction, one migrator."""
        with self._errors:
            async with conn.transaction():
                await conn.execute(sql.LOCK_MIGRATIONS)
                version = await self._check_schema(conn)  # again, under the lock
                for _, _, script in pg_migrations()[version:]:
                    await conn.execute(script.encode())  # several statements, no parameters
                if version == 0:
                    await conn.execute(sql.INSERT_VERSION, (pg_schema_version(),))
                elif version < pg_schema_version():
                    await conn.execute(sql.UPDATE_VERSION, (pg_schema_version(),))

    # -- helpers --------------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if not self._open:
            raise _checks.not_open()
        if self._readonly:
            raise UsageError(f"{self._shown} is open read-only")

    async def _writer_conn(self) -> psycopg.AsyncConnection[Any]:
        """The write connection, made again when the last one broke (the caller holds the lock)."""
        conn = self._writer
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                await conn.close()
            self._writer = conn = await self._connect(read=False)
        return conn

    async def _execute(self, plans: list[_pg_commit.Plan]) -> list[Outcome]:
        """One batch in one transaction: pipelined when it can be, else commit by commit.

        The fast way (``_pg_fast``) sends every statement of every commit at once; when one
        of its checks fails (a fence, a cut state) or a statement fails, the transaction is
        rolled back whole and the batch runs the careful way: each commit in a savepoint of
        its own, so a refused one is named and writes nothing while the others commit.
        """
        owner = self._owner
        if owner is None:
            raise _checks.not_open()
        conn = await self._writer_conn()
        txn = _pg_commit.Txn(
            conn=conn,
            owner=owner,
            lease=self._lease,
            held=self.leases.held,
            lost_before=self.leases.lost,
        )
        if len(plans) > 1 and all(_pg_fast.fast(plan, txn) for plan in plans):
            try:
                with self._errors:
                    deleted = await _pg_fast.run_fast(txn, plans)
                self.fast_batches += 1
                return [Outcome(value=value) for value in deleted]
            except (_pg_fast.Careful, StoreError):
                if conn.broken or conn.closed:
                    raise
                self.careful_batches += 1  # rolled back whole: commit by commit, then
        outcomes: list[Outcome] = []
        with self._errors:
            async with conn.transaction():
                for plan in plans:
                    try:
                        outcomes.append(Outcome(value=await _pg_commit.job(plan)(txn)))
                    except (TurnkeeperError, pg_errors.DataError) as error:
                        outcomes.append(Outcome(error=error))
        self.leases.committed(txn.taken, txn.lost)
        return outcomes

    async def _read(self, statements: Sequence[tuple[str, Params]]) -> list[list[Any]]:
        """Run read statements in one snapshot; each one's rows.

        The read runs on a task of its own, so a caller cancelled in the middle of it (an
        engine closing while a session loads) does not cut the query half-way: the driver
        would cancel it on the server, anyio's repeated cancellation would interrupt that
        too, and the connection would be dropped with a warning. The caller's cancellation
        is delivered once the read ended, or after ``READ_GRACE_S``, when the read is
        cancelled once (the driver then cancels it on the server cleanly).
        """
        if not self._open:
            raise _checks.not_open()
        task = asyncio.ensure_future(self._read_now(statements))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            with anyio.CancelScope(shield=True), anyio.move_on_after(READ_GRACE_S):
                await asyncio.wait({task})
            if not task.done():
                task.cancel()
                with anyio.CancelScope(shield=True):
                    await asyncio.wait({task})
            if not task.cancelled():
                task.exception()  # retrieved: the caller is cancelled, not told
            raise

    async def _read_now(self, statements: Sequence[tuple[str, Params]]) -> list[list[Any]]:
        async with self._read_lock:
            with self._errors:
                conn = self._reader
                if conn is None or conn.closed or conn.broken:
                    if conn is not None:
                        await conn.close()
                    self._reader = conn = await self._connect(read=True)
                if len(statements) == 1:
                    return [await _fetch(conn, *statements[0])]
                async with conn.transaction():
                    return [await _fetch(conn, query, params) for query, params in statements]

    # -- writes ---------------------------------------------------------------------------------

    async def commit(self, session: str, boundary: Boundary, *, owner: str | None) -> Committed:
        """Make one boundary of ``session`` durable, fenced by the session's lease.

        Raises:
            StaleOwner: ``owner`` is not this incarnation's owner id.
            LeaseLost: A peer holds the session's lease (or took it since this process did);
                nothing was written, and the session must stop here.
            UsageError: See ``Store.commit``; nothing of the boundary is written.
            CorruptRecord: A stored value the commit had to read fails validation.
            StoreError: The database failed (the connection is made again next time).
        """
        self._check_writable()
        _checks.fence(session, self._owner, owner)
        _checks.check_boundary(session, boundary)
        check_chunk(session, boundary.partial, boundary.drop_partials)
        made = _pg_commit.plan(session, boundary)
        if made is None:
            return _NOTHING
        deleted: int = await self._group.run(made)
        return Committed(deleted=deleted) if deleted else _NOTHING

    # -- leases ---------------------------------------------------------------------------------

    async def acquire(self, session: str) -> int | None:
        """Take ``session``'s lease for this incarnation; the epoch it holds it at.

        A session this incarnation holds already keeps its epoch (checked against the
        database). ``None`` when a peer holds a live lease, or the session does not exist.
        A session lost earlier may be taken again this way (its epoch goes up).

        Raises:
            StoreError: The database failed.
        """
        self._check_writable()
        owner = self._owner
        assert owner is not None
        async with self._lock:
            conn = await self._writer_conn()
            with self._errors:
                async with conn.transaction():
                    held = self.leases.epoch(session)
                    if held is not None:
                        found = await _fetch(conn, sql.FENCE, {"id": session, "owner": owner})
                        if found and found[0][0] == held:
                            return held
                    params = {
                        "id": session,
                        "owner": owner,
                        "lease": self._lease,
                        "pattern": OWNER_PATTERN,
                    }
                    taken = await _fetch(conn, sql.TAKE, params)
        if not taken:
            if held is not None:
                self.leases.committed({}, {session})
            return None
        epoch = int(taken[0][0])
        self.leases.committed({session: epoch}, set())
        return epoch

    async def claim(self, limit: int) -> dict[str, int]:
        """Take up to ``limit`` sessions a dead or departed owner left with work (LS-8).

        A session is claimable when it is unowned or its lease ran out (by the database's
        clock), its lease row is sound (LS-7), and it has something to recover: an owed cut
        record, a receipt left requested or running, a queued entry, or a history whose last
        non-system row is not an assistant row. Rows a peer is claiming or writing are
        skipped (``SKIP LOCKED``), so no session is claimed twice.

        Returns:
            Each claimed session's new epoch.
        """
        self._check_writable()
        if type(limit) is not int or limit < 1:
            raise UsageError(f"claim limit must be a positive integer, not {limit!r}")
        params = {
            "owner": self._owner,
            "lease": self._lease,
            "limit": limit,
            "pattern": OWNER_PATTERN,
        }
        async with self._lock:
            conn = await self._writer_conn()
            with self._errors:
                rows = await _fetch(conn, sql.CLAIM, params)
        claimed = {str(sid): int(epoch) for sid, epoch in rows}
        self.leases.committed(claimed, set())
        return claimed

    async def release(self, sessions: Sequence[str]) -> set[str]:
        """Give back the leases of ``sessions`` this incarnation holds; the ones released."""
        self._check_writable()
        async with self._lock:
            conn = await self._writer_conn()
            with self._errors:
                async with conn.transaction():
                    params = {"owner": self._owner, "ids": list(sessions)}
                    rows = await _fetch(conn, sql.RELEASE, params)
                    if rows:  # told when the release commits: a peer may claim at once
                        await conn.execute(sql.NOTIFY_RELEASED)
        released = {str(row[0]) for row in rows}
        self.leases.released(set(sessions))
        return released

    # -- the inbox (LS-9) ------------------------------------------------------------------------

    async def post(self, session: str, text: str) -> str:
        """Post ``text`` to ``session`` from any process; the queue entry id it will have.

        One transaction: the inbox row and a ``pg_notify`` the session's holder (or, when
        nobody holds it, any listening engine) hears. No lease is needed. The holder takes it
        into the session's durable queue as the entry ``inbox-<id>``.

        Raises:
            UsageError: The session does not exist, or ``text`` is empty (nothing posted).
            StoreError: The database failed (nothing posted).
        """
        self._check_writable()
        if not text.strip():
            raise UsageError(f"a message posted to {session!r} must not be blank")
        number = await self._posted(session, sql.POST, (session, text.encode()), sql.NOTIFY_INBOX)
        return f"{INBOX_ENTRY}{number}"

    async def _posted(self, session: str, insert: str, params: Params, notify: str) -> int:
        """Insert a row for ``session`` and notify, in one transaction; the row's number."""
        async with self._lock:
            conn = await self._writer_conn()
            try:
                with self._errors:
                    async with conn.transaction():
                        (number,) = (await _fetch(conn, insert, params))[0]
                        await conn.execute(notify, (session,))
            except StoreError as error:
                if isinstance(error.__context__, pg_errors.ForeignKeyViolation):
                    raise _checks.unknown_session(session) from None
                raise
        return int(number)

    async def inbox(self, session: str) -> tuple[tuple[str, str, str | None], ...]:
        """The messages posted to ``session`` and not yet queued, in order.

        Each is ``(entry id, text, handle)``: ``handle`` names the delegated turn a prompt
        starts (LS-11), ``None`` for a message. A body that is not UTF-8 is reported as a
        ``CorruptRecord`` naming its key.
        """
        found = []
        for number, body, handle in (await self._read([(sql.SELECT_INBOX, (session,))]))[0]:
            try:
                text = bytes(body).decode()
            except UnicodeDecodeError as exc:
                raise CorruptRecord("inbox", f"{session}/{number}", f"$: {exc}") from None
            found.append((f"{INBOX_ENTRY}{number}", text, None if handle is None else str(handle)))
        return tuple(found)

    async def drop_mail(self, session: str, entry: str) -> None:
        """Take ``entry`` off ``session``'s inbox unqueued (a prompt whose turn settled)."""
        number = entry.removeprefix(INBOX_ENTRY)
        if number.isdigit():
            await self._one_write(sql.DROP_INBOX, (session, int(number)))

    # -- a delegated turn across processes (LS-11) ---------------------------------------------

    async def delegate(self, record: HandleRecord, text: str) -> str:
        """Write ``record`` and post its prompt ``text`` to its target, in one transaction.

        Fenced by the lease of the owner session (``record.owner``) this process holds; the
        prompt is an inbox row of ``record.target`` naming the handle, with a ``pg_notify``
        the target's holder (or, when nobody holds it, any listening engine) hears. Returns
        the prompt's queue entry id.

        Raises:
            LeaseLost: This process does not hold the owner session's lease (nothing written).
            UsageError: The record is malformed, its handle id exists already, or the target
                does not exist (nothing written).
            StoreError: The database failed (nothing written).
        """
        self._check_writable()
        _checks.check_handles((record,))
        if not text.strip():
            raise UsageError(f"the prompt of the delegated turn {record.handle_id!r} is blank")
        owner, session = self._owner, record.owner
        held = self.leases.epoch(session)
        async with self._lock:
            conn = await self._writer_conn()
            try:
                with self._errors:
                    async with conn.transaction():
                        found = await _fetch(conn, sql.FENCE, {"id": session, "owner": owner})
                        if held is None or not found or found[0][0] != held:
                            holder = await _fetch(conn, sql.HOLDER, {"id": session})
                            lost = LeaseLost(
                                session,
                                held=held,
                                epoch=holder[0][1] if holder else None,
                                holder=holder[0][0] if holder else None,
                            )
                        else:
                            lost = None
                            put = await _fetch(conn, sql.INSERT_HANDLE, handle_params(record))
                            if not put:
                                raise UsageError(
                                    f"the handle {record.handle_id!r} is taken: a handle id is "
                                    "never reused; nothing was written"
                                )
                            params = (record.target, text.encode(), record.handle_id)
                            (number,) = (await _fetch(conn, sql.POST_PROMPT, params))[0]
                            await conn.execute(sql.NOTIFY_INBOX, (record.target,))
            except StoreError as error:
                if isinstance(error.__context__, pg_errors.ForeignKeyViolation):
                    raise _checks.unknown_session(record.target) from None
                raise
        if lost is not None:
            if held is not None:
                self.leases.committed({}, {session})
            raise lost
        return f"{INBOX_ENTRY}{number}"

    async def handles_into(self, sessions: Sequence[str]) -> HandleQuery:
        """The handles of turns delegated into any of ``sessions`` (a claim's), any status."""
        if not sessions:
            return HandleQuery()
        return self._handle_query(
            (await self._read([(sql.SELECT_HANDLES_INTO, (list(sessions),))]))[0]
        )

    async def notify_handle(self, owner: str) -> None:
        """Tell ``owner``'s engine that a handle of ``owner``'s was written here (LS-11)."""
        await self._one_write(sql.NOTIFY_HANDLE, (owner,))

    def watch_handles(self, callback: Callable[[str], None] | None) -> None:
        """Call ``callback(owner)`` whenever a handle of ``owner`` is written elsewhere."""
        self._on_handle = callback

    async def mail_for(self, sessions: Sequence[str]) -> set[str]:
        """Which of ``sessions`` have messages waiting in the inbox (the polling fallback)."""
        if not sessions:
            return set()
        rows = (await self._read([(sql.SELECT_MAIL_FOR, (list(sessions),))]))[0]
        return {str(sid) for (sid,) in rows}

    # -- requests to a session's holder (LS-10) ------------------------------------------------

    async def ask(self, session: str, kind: RequestKind, body: dict[str, str]) -> int:
        """Ask ``session``'s holder, whichever process it is, to carry out ``kind``; its id.

        One transaction: the ``requests`` row and a ``pg_notify`` the holder (or, when nobody
        holds the session, any listening engine) hears. The asker waits for the answer
        (``take_answer``, woken by ``watch_answers``) or gives up (``withdraw``).

        Raises:
            UsageError: The session does not exist, or ``kind`` is unknown (nothing asked).
            StoreError: The database failed (nothing asked).
        """
        self._check_writable()
        if kind not in KINDS:
            raise UsageError(f"a request must be one of {', '.join(KINDS)}, not {kind!r}")
        params = (session, kind, encode(body))
        return await self._posted(session, sql.ASK, params, sql.NOTIFY_REQUEST)

    async def requests(self, session: str) -> tuple[Request, ...]:
        """The requests for ``session`` not answered yet, oldest first.

        Raises:
            CorruptRecord: A row's kind or body is damaged (it is named; nothing is deleted).
        """
        rows = (await self._read([(sql.SELECT_REQUESTS, (session,))]))[0]
        return tuple(
            decode_request(int(number), str(sid), str(kind), bytes(body))
            for number, sid, kind, body in rows
        )

    async def asked_for(self, sessions: Sequence[str]) -> set[str]:
        """Which of ``sessions`` have requests not answered yet (the polling fallback)."""
        if not sessions:
            return set()
        rows = (await self._read([(sql.SELECT_ASKED_FOR, (list(sessions),))]))[0]
        return {str(sid) for (sid,) in rows}

    async def answer(self, request: int, reply: Reply) -> bool:
        """Write the holder's ``reply`` to ``request``, with a ``pg_notify``, in one transaction.

        ``False`` when the request is not begun, gone (its asker withdrew it) or answered
        already: the reply is then not written and nobody is told.
        """
        self._check_writable()
        async with self._lock:
            conn = await self._writer_conn()
            with self._errors:
                async with conn.transaction():
                    found = await _fetch(conn, sql.ANSWER, (encode(reply), request))
                    if found:
                        await conn.execute(sql.NOTIFY_ANSWER, (str(request),))
        return bool(found)

    async def take_answer(self, request: int) -> Reply | None:
        """The reply to ``request``, taken (its row deleted); ``None`` while not answered.

        Raises:
            CorruptRecord: The stored reply is damaged (the row stays).
        """
        self._check_writable()
        async with self._lock:
            conn = await self._writer_conn()
            with self._errors:
                async with conn.transaction():
                    found = await _fetch(conn, sql.SELECT_ANSWER, (request,))
                    if not found:
                        return None
                    reply = decode_reply(request, bytes(found[0][0]))
                    await conn.execute(sql.DELETE_REQUEST, (request,))
        return reply

    async def begin(self, request: int) -> bool:
        """The holder takes ``request`` on; ``False`` when its asker withdrew it (leave it)."""
        return await self._one_write(sql.BEGIN_REQUEST, (request,)) is not None

    async def withdraw(self, request: int) -> Withdrawn:
        """Withdraw ``request`` unanswered (the asker gave up); what became of it.

        ``withdrawn``: the holder had not begun it and never will. ``begun``: the holder began
        it and has not answered (whether it was carried out is not known; its answer, if it
        comes, finds no row). ``answered``: an answer is there to take.
        """
        found = await self._one_write(sql.WITHDRAW, (request,))
        if found is None:
            return "answered"
        return "begun" if found[0] else "withdrawn"

    async def _one_write(self, statement: str, params: Params) -> Any:
        """Run one writing statement in a transaction of its own; its first row (or ``None``)."""
        self._check_writable()
        async with self._lock:
            conn = await self._writer_conn()
            with self._errors:
                async with conn.transaction():
                    found = await _fetch(conn, statement, params)
        return found[0] if found else None

    async def lease_rows(self) -> tuple[LeaseRow, ...]:
        """Every session's lease as the database holds it, by id (for ``inspect``).

        A malformed row (LS-7) carries its ``problem``; it is reported, never taken.
        """
        rows = (await self._read([(sql.LEASES, ())]))[0]
        return tuple(
            LeaseRow(
                session=str(sid),
                owner=owner if owner is None else str(owner),
                epoch=epoch if type(epoch) is int else -1,
                expires=None if expires is None else expires.isoformat(),
                expired=expired,
                problem=lease_problem(owner, epoch, expires),
            )
            for sid, owner, epoch, expires, expired in rows
        )

    async def renew(self) -> set[str]:
        """Renew every lease now (the renewal task does it on its own); the sessions lost."""
        self._check_writable()
        assert self._renewer is not None
        return await self._renewer.renew()

    # -- reads ----------------------------------------------------------------------------------

    async def load(self, session: str, *, envelopes: bool = True) -> SessionLoad | None:
        """The session's record, rows, envelopes, queue, marker, partials: one snapshot."""
        one = (session,)
        found = await self._read(
            [
                (sql.SELECT_SESSION, one),
                (sql.SELECT_HISTORY, one),
                *([(sql.SELECT_ENVELOPES, one)] if envelopes else []),
                (sql.SELECT_QUEUED, one),
                (sql.SELECT_QUEUE_VERSION, one),
                (sql.SELECT_ABANDON, one),
                (sql.SELECT_PARTS, one),
                (sql.SELECT_RETRY, one),
            ]
        )
        if not envelopes:
            found.insert(2, [])
        return decode_load(*found)

    async def sessions(self) -> SessionList:
        """Every session whose record validates, ordered by id; the others in ``corrupt``."""
        records = SessionList()
        corrupt: list[tuple[str, str]] = []
        for row in (await self._read([(sql.SELECT_SESSIONS, ())]))[0]:
            try:
                records.append(decode_session(row))
            except CorruptRecord as error:
                corrupt.append((str(row[0]), str(error)))
        records.corrupt = tuple(corrupt)
        return records

    async def scan_recoverable(self) -> RecoveryScan:
        """Every session with an owed cut record or an unanswered tail (one snapshot)."""
        return await self._scan(
            [
                (sql.SCAN_OWED, ()),
                (sql.SCAN_TRAILING, ()),
                (sql.SCAN_SESSIONS, ()),
                (sql.SCAN_STREAMS, ()),
                (sql.SCAN_QUEUED, ()),
                (sql.SCAN_TAIL_ROWS, ()),
            ]
        )

    async def scan_recoverable_of(self, sessions: Collection[str]) -> RecoveryScan:
        """The startup scan of ``sessions`` only (a claim's, LS-8): what they need recovered.

        Reads through the same indexes as :meth:`scan_recoverable`, bounded by the sessions
        named: a claim of a few sessions never reads the whole store.
        """
        only = {"only": sorted(sessions)}
        return await self._scan(
            [
                (sql.SCAN_OWED_OF, only),
                (sql.SCAN_TRAILING_OF, only),
                (sql.SCAN_SESSIONS_OF, only),
                (sql.SCAN_STREAMS_OF, only),
                (sql.SCAN_QUEUED_OF, only),
                (sql.SCAN_TAIL_ROWS_OF, only),
            ]
        )

    async def _scan(self, first: list[tuple[str, Params]]) -> RecoveryScan:
        """The startup scan from its first six reads, then the tails' and versions' reads."""
        owed, trailing, sessions, streams, queued, tail_rows = await self._read(first)
        tails = sorted({row[0] for row in tail_rows})
        both = sorted({row[0] for row in (*owed, *tail_rows)})
        versions, tail_sessions, tail_streams, last, abandon, retry = await self._read(
            [
                (sql.SCAN_VERSIONS, (both,)),
                (sql.SCAN_TAIL_SESSIONS, (tails,)),
                (sql.SCAN_TAIL_STREAMS, (tails,)),
                (sql.SCAN_LAST_ENVELOPES, (tails,)),
                (sql.SCAN_ABANDON, (tails,)),
                (sql.SCAN_RETRY, (tails,)),
            ]
        )
        return recovery_scan(
            Scan(
                owed=owed,
                trailing=trailing,
                sessions=sessions,
                streams=streams,
                queued=queued,
                versions=versions,
                tail_rows=tail_rows,
                tail_sessions=tail_sessions,
                tail_streams=tail_streams,
                last_envelopes=last,
                abandon=abandon,
                retry=retry,
            )
        )

    async def receipts(
        self,
        session: str | None = None,
        *,
        op_id: str | None = None,
        states: frozenset[OpState] | None = None,
        recent: int | None = None,
    ) -> ReceiptQuery:
        """Open receipts first (indeterminate, then requested and running), then recent others."""
        if op_id is not None:
            statement: tuple[str, tuple[object, ...]] = (sql.SELECT_OPERATION, (op_id,))
        elif session is None:
            statement = (sql.SELECT_OPERATIONS, ())
        else:
            statement = (sql.SELECT_OPERATIONS_IN_SESSION, (session,))
        records: list[OperationRecord] = []
        corrupt: list[tuple[str, str]] = []
        for row in (await self._read([statement]))[0]:
            try:
                records.append(decode_operation(row))
            except CorruptRecord as error:
                corrupt.append((str(row[0]), str(error)))
        ordered = _checks.order_receipts(
            records, session=session, op_id=op_id, states=states, recent=recent
        )
        return ReceiptQuery(records=ordered, corrupt=tuple(corrupt))

    async def open_receipts(self, session: str | None = None) -> OpenReceipts:
        """The receipts that may still be running, through the ``operations_open`` index."""
        if session is None:
            rows = await self._read([(sql.SELECT_OPEN, ())])
        else:
            rows = await self._read([(sql.SELECT_OPEN_IN_SESSION, (session,))])
        return decode_open(rows[0])

    async def handles(self, *, owner: str | None = None, target: str | None = None) -> HandleQuery:
        """Handle records by ``handle_id``; a damaged one is reported in ``corrupt``."""
        query = sql.SELECT_HANDLES[owner is not None, target is not None]
        params = tuple(value for value in (owner, target) if value is not None)
        return self._handle_query((await self._read([(query, params)]))[0])

    @staticmethod
    def _handle_query(rows: Sequence[Any]) -> HandleQuery:
        records: list[HandleRecord] = []
        corrupt: list[tuple[str, str]] = []
        for row in rows:
            try:
                records.append(decode_handle(row))
            except CorruptRecord as error:
                corrupt.append((clip(str(row[0])), str(error)))
        return HandleQuery(records=tuple(records), corrupt=tuple(corrupt))

    async def abandon_markers(self) -> AbandonQuery:
        """Every session's abandon marker, by session id."""
        markers: list[tuple[str, AbandonMarker]] = []
        corrupt: list[tuple[str, str]] = []
        for row in (await self._read([(sql.SELECT_ALL_ABANDON, ())]))[0]:
            try:
                markers.append((str(row[0]), decode_abandon(row)))
            except CorruptRecord as error:
                corrupt.append((clip(str(row[0])), str(error)))
        return AbandonQuery(markers=tuple(markers), corrupt=tuple(corrupt))

    async def queued(self, session: str | None = None) -> QueueQuery:
        """The durable queue's entries by session then position, and the queue versions."""
        if session is None:
            statements: list[tuple[str, tuple[object, ...]]] = [
                (sql.SELECT_ALL_QUEUED, ()),
                (sql.SELECT_QUEUE_VERSIONS, ()),
            ]
        else:
            statements = [(sql.SELECT_QUEUED, (session,)), (sql.SELECT_QUEUE_VERSION, (session,))]
        entries, versions = await self._read(statements)
        return decode_queue_query(entries, versions)


async def _fetch(conn: psycopg.AsyncConnection[Any], query: str, params: Params) -> list[Any]:
    cursor = await conn.execute(query, params)
    return await cursor.fetchall()
