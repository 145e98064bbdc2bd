"""Group commit: writes that arrive while a commit is in flight share the next transaction.

An aiosqlite call costs a thread hop that is several times the commit itself
(``docs/persistence.md``), so when many sessions write at once, one call that commits all their
writes is much cheaper than one call each. The protocol is leader/follower, with no background task:

* A writer adds its job to the *pending* batch. If no batch is being committed, it commits the
  pending batch itself (it is the leader), at once: a lone writer waits for no one (but for
  the gathering turns below, where a store asks for them).
* Writers arriving while a commit is in flight add their jobs to the next pending batch and
  wait. When the commit in flight ends, one of them leads the next batch.
* A leader may first let the event loop run ``gather_turns`` turns (a checkpoint each)
  before it takes the batch: the writers that the same wake-up made ready (a commit's
  end resumes every session that waited on it, and each reaches its next write a few turns
  later) join the batch instead of each leading a batch of their own. PostgreSQL, whose
  per-transaction cost is the driver's statements and the server's commit, gathers
  (``_postgres``); SQLite, whose batches already hold hundreds of writes behind one thread
  hop, does not.
* A batch is one aiosqlite call: ``BEGIN IMMEDIATE``, the jobs, ``COMMIT``. Every job is all
  or nothing by itself (``_writes``), so a job that raises has written nothing and only its
  writer gets the error; the others are committed. If the commit itself fails, every writer
  of the batch gets the error.
* Nobody is told their write is durable before the ``COMMIT`` that holds it returned: every
  writer waits for its own batch's commit (shielded from cancellation, which is delivered once
  the commit ended, so a writer never walks away from a write that may still land).

With ``batching`` off, each job is its own transaction, one call each (the same code path).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import aiosqlite
import anyio
import anyio.lowlevel

from persistence._writes import Job

J = TypeVar("J")


@dataclass(slots=True)
class Outcome:
    """What one job of a batch came to: its value, or what it raised."""

    value: object = None
    error: BaseException | None = None


#: Runs one batch of jobs in one transaction: one outcome per job, in order. What it raises
#: (the transaction failed) reaches every writer of the batch.
Execute = Callable[[list[J]], Awaitable[list[Outcome]]]


def sqlite_execute(connection: Callable[[], aiosqlite.Connection]) -> Execute[Job[Any]]:
    """The SQLite store's batches: one aiosqlite call each, on the connection's thread."""

    async def execute(jobs: list[Job[Any]]) -> list[Outcome]:
        db = connection()
        raw = db._conn  # aiosqlite 0.22 (pinned): its sqlite3 connection, for its thread
        outcomes: list[Outcome] = await db._execute(_run_batch, raw, jobs)  # type: ignore[no-untyped-call]
        return outcomes

    return execute


class _Signal:
    """A one-shot event whose future is made only when someone waits (a lone writer never)."""

    __slots__ = ("_set", "_waiter")

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self) -> None:
        if self._set:
            return
        if self._waiter is None:
            self._waiter = asyncio.get_running_loop().create_future()
        await self._waiter  # waits are shielded (``GroupCommit.run``): never cancelled here


@dataclass(slots=True)
class _Batch(Generic[J]):
    jobs: list[J] = field(default_factory=list)
    outcomes: list[Outcome] | None = None
    started: bool = False
    done: _Signal = field(default_factory=_Signal)
    #: Set when the commit in flight ended and this batch is next: one waiter leads it.
    free: _Signal = field(default_factory=_Signal)


class GroupCommit(Generic[J]):
    """Runs write jobs through one connection, batching concurrent ones (see module).

    ``execute`` runs a batch in one transaction (:func:`sqlite_execute` for SQLite); the
    protocol is the same for every store.
    """

    __slots__ = (
        "_batching",
        "_execute",
        "_flushing",
        "_gather_turns",
        "_lock",
        "_pending",
        "batches",
        "jobs",
        "on_commit",
    )

    def __init__(
        self,
        *,
        execute: Execute[J],
        lock: anyio.Lock,
        batching: bool,
        gather_turns: int = 0,
    ) -> None:
        self._execute = execute
        self._gather_turns = gather_turns
        self._lock = lock
        self._batching = batching
        self._pending: _Batch[J] | None = None
        self._flushing = False
        #: Told how many jobs each transaction held, once it committed (the checkpointer).
        self.on_commit: Callable[[int], None] | None = None
        #: Transactions committed and jobs run (for the benchmarks' figures).
        self.batches = 0
        self.jobs = 0

    async def run(self, job: J) -> Any:
        """Run ``job`` in a transaction; return its value once that transaction committed.

        Raises:
            Exception: What the job raised (its writes rolled back), or what the commit raised.
        """
        with anyio.CancelScope(shield=True):
            if not self._batching:
                batch, index = _Batch[J](jobs=[job]), 0
                await self._commit(batch)
            else:
                batch = self._join()
                batch.jobs.append(job)
                index = len(batch.jobs) - 1
                while batch.outcomes is None:
                    if not self._flushing:
                        await self._flush()
                    elif batch.started:
                        await batch.done.wait()
                    else:
                        await batch.free.wait()
        assert batch.outcomes is not None
        return _unwrap(batch.outcomes[index])

    def _join(self) -> _Batch[J]:
        if self._pending is None:
            self._pending = _Batch[J]()
        return self._pending

    async def _flush(self) -> None:
        batch = self._join()
        batch.started = True  # its writers now wait for its end, not for a turn to lead
        self._flushing = True
        try:
            for _ in range(self._gather_turns):
                await anyio.lowlevel.cancel_shielded_checkpoint()  # writers made ready join
            self._pending = None
            await self._commit(batch)
        finally:
            self._flushing = False
            self._wake_next()

    def _wake_next(self) -> None:
        if self._pending is not None:
            self._pending.free.set()

    async def _commit(self, batch: _Batch[J]) -> None:
        batch.started = True
        try:
            async with self._lock:
                batch.outcomes = await self._execute(batch.jobs)
                self.batches += 1
                self.jobs += len(batch.jobs)
                if self.on_commit is not None:
                    self.on_commit(len(batch.jobs))
        except BaseException as error:
            batch.outcomes = [Outcome(error=error) for _ in batch.jobs]
        finally:
            batch.done.set()


def _unwrap(outcome: Outcome) -> object:
    if outcome.error is not None:
        raise outcome.error
    return outcome.value


def _run_batch(db: sqlite3.Connection, jobs: Sequence[Job[Any]]) -> list[Outcome]:
    """On the connection's thread: every job in one transaction (each all or nothing itself)."""
    outcomes: list[Outcome] = []
    db.execute("BEGIN IMMEDIATE")
    try:
        for job in jobs:
            try:
                outcomes.append(Outcome(value=job(db)))
            except Exception as error:
                outcomes.append(Outcome(error=error))
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return outcomes
