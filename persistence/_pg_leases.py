"""What one engine incarnation knows of its session leases, and the task that renews them.

:class:`Leases` is the store's book: the epoch each held session was taken at (only takes that
committed count), the sessions lost to a peer (never written again until taken anew), and
when the last renewal succeeded. A holder whose renewals have failed for longer than the lease
minus a margin is *stale* (:attr:`Leases.fresh` is false): a peer may take its sessions at any
moment, so it must start no new side effect (self-fencing); its writes stay fenced by the
database either way.

:class:`Renewer` renews every lease of the incarnation with one statement, on an asyncio task
and a connection of its own, so a busy write connection never delays a renewal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

import anyio
import msgspec
import psycopg

from persistence import _pg_sql as sql
from persistence._pg_owner import OWNER as _OWNER

log = logging.getLogger("turnkeeper.persistence")

#: The share of the lease a holder keeps back: it self-fences this long before a peer may take.
MARGIN = 0.2


class LeaseRow(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One session's lease as the database holds it (``PostgresStore.lease_rows``).

    Attributes:
        session: The session id.
        owner: The owning incarnation's id (``None``: unowned).
        epoch: The fence's epoch (bumped by every take).
        expires: When the lease runs out (ISO 8601, UTC; ``None``: no lease).
        expired: Whether it ran out, by the database's clock (``None``: no lease).
        problem: Why the row is malformed and never taken (LS-7), else ``None``.
    """

    session: str
    owner: str | None
    epoch: int
    expires: str | None
    expired: bool | None
    problem: str | None = None


def lease_problem(owner: object, epoch: object, expires: object) -> str | None:
    """Why a session row's lease columns are malformed (never taken: LS-7), else ``None``."""
    if type(epoch) is not int or epoch < 0:
        return f"epoch {epoch!r} is not a count from 0"
    if owner is None:
        return None
    if not isinstance(owner, str) or _OWNER.fullmatch(owner) is None:
        return f"owner {str(owner)[:80]!r} is not an owner id turnkeeper mints"
    if expires is None:
        return "an owner without a lease expiry"
    return None


class Leases:
    """The sessions this incarnation holds, the ones it lost, and how fresh its renewals are."""

    __slots__ = ("_clock", "_held", "_lease", "_lost", "_renewed", "failures", "renewals")

    def __init__(self, *, lease: float, clock: Callable[[], float] | None = None) -> None:
        self._lease = lease
        self._clock = clock or time.monotonic
        self._held: dict[str, int] = {}
        self._lost: set[str] = set()
        self._renewed = self._clock()
        #: Renewals that succeeded, and ones that failed since the last success.
        self.renewals = 0
        self.failures = 0

    def reset(self) -> None:
        """Forget everything (a new incarnation: nothing held, nothing lost)."""
        self._held.clear()
        self._lost.clear()
        self._renewed = self._clock()
        self.failures = 0

    @property
    def lease(self) -> float:
        """Seconds a lease lasts after its last renewal."""
        return self._lease

    @property
    def held(self) -> Mapping[str, int]:
        """Each held session's epoch."""
        return self._held

    @property
    def lost(self) -> frozenset[str]:
        """The sessions a peer took from this incarnation."""
        return frozenset(self._lost)

    def epoch(self, session: str) -> int | None:
        """The epoch ``session`` is held at (``None``: not held)."""
        return self._held.get(session)

    def committed(self, taken: Mapping[str, int], lost: set[str]) -> None:
        """A transaction committed: its takes are held, its losses are lost."""
        for session, epoch in taken.items():
            self._held[session] = epoch
            self._lost.discard(session)
        for session in lost:
            if session not in taken:
                self._held.pop(session, None)
                self._lost.add(session)

    def released(self, sessions: set[str] | frozenset[str]) -> None:
        """``sessions`` were given back (nothing of them is held or lost any more)."""
        for session in sessions:
            self._held.pop(session, None)
            self._lost.discard(session)

    def renewed(self, rows: list[tuple[str, int]], before: Mapping[str, int]) -> set[str]:
        """A renewal returned ``rows``; what was held ``before`` it and is missing is lost.

        ``before``: the sessions held when the renewal's statement was sent. A session taken
        while it ran (committed after the statement's snapshot) is not in its rows, and is
        not lost; one whose epoch changed meanwhile (taken anew) is not judged either.
        """
        self._renewed = self._clock()
        self.renewals += 1
        self.failures = 0
        kept = dict(rows)
        gone = {
            s
            for s, e in before.items()
            if kept.get(s) != e and self._held.get(s) == e  # still held as it was, not renewed
        }
        self.committed({}, gone)
        return gone

    def failed(self) -> None:
        """A renewal failed (the database did not answer, or refused)."""
        self.failures += 1

    @property
    def fresh(self) -> bool:
        """Whether the last good renewal is recent enough to start a side effect."""
        return self._clock() - self._renewed < self._lease * (1 - MARGIN)


def start_task(work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
    """Run ``work`` on a task of its own, on the running event loop."""
    return asyncio.get_running_loop().create_task(work, name=name)


async def stop_task(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (if any) and wait for it to end."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class Renewer:
    """Renews an incarnation's leases every ``every`` seconds on a task of its own."""

    __slots__ = ("_conn", "_connect", "_every", "_leases", "_owner", "_task")

    def __init__(
        self,
        *,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
        owner: str,
        leases: Leases,
        every: float,
    ) -> None:
        self._connect = connect
        self._owner = owner
        self._leases = leases
        self._every = every
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start renewing (on the running event loop)."""
        self._task = start_task(self._run(), "turnkeeper-renew")

    async def stop(self) -> None:
        """Stop renewing and close the connection."""
        task, self._task = self._task, None
        await stop_task(task)
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def renew(self) -> set[str]:
        """Renew once; the sessions found lost. A failure is counted and logged, never raised."""
        try:
            conn = self._conn
            if conn is None or conn.closed or conn.broken:
                self._conn = conn = await self._connect()
            params = {"owner": self._owner, "lease": self._leases.lease}
            before = dict(self._leases.held)  # what the statement's snapshot can see, at most
            cursor = await conn.execute(sql.RENEW, params)
            rows = [(str(session), int(epoch)) for session, epoch in await cursor.fetchall()]
        except Exception as exc:  # a renewal that fails is an ordinary input
            self._leases.failed()
            log.warning("lease renewal failed (%d in a row): %s", self._leases.failures, exc)
            return set()
        gone = self._leases.renewed(rows, before)
        if gone:
            log.warning("leases lost to a peer: %s", ", ".join(sorted(gone)))
        return gone

    async def _run(self) -> None:
        while True:
            await anyio.sleep(self._every)
            await self.renew()


#: The channel peers hear on (``LISTEN``): ``released`` when an incarnation gave its leases
#: back, so a peer claims at once instead of at its next round.
CHANNEL = "turnkeeper"
RELEASED = "released"


class Listener:
    """Hears the database's notifications on a connection of its own (``LISTEN``).

    Each notification's payload is handed to ``heard``. A connection that drops is made again
    after a pause (the claim rounds go on meanwhile: polling is the fallback), and a failure
    is logged, never raised.
    """

    __slots__ = ("_connect", "_heard", "_task", "drops")

    def __init__(
        self,
        *,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
        heard: Callable[[str], None],
    ) -> None:
        self._connect = connect
        self._heard = heard
        self._task: asyncio.Task[None] | None = None
        #: Connections lost (and made again).
        self.drops = 0

    def start(self) -> None:
        """Start listening (on the running event loop)."""
        self._task = start_task(self._run(), "turnkeeper-listen")

    async def stop(self) -> None:
        """Stop listening."""
        task, self._task = self._task, None
        await stop_task(task)

    async def _run(self) -> None:
        while True:
            try:
                conn = await self._connect()
                try:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    async for notice in conn.notifies():
                        self._heard(notice.payload)
                finally:
                    with anyio.CancelScope(shield=True):
                        await conn.close()
            except Exception as exc:  # a dropped listener: polling goes on meanwhile
                self.drops += 1
                log.warning("notification listener lost its connection: %s", exc)
            await anyio.sleep(1.0)
