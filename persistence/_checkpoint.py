"""WAL checkpoints on a thread of their own, off the commit path.

SQLite's automatic checkpoint runs inside whichever commit makes the WAL cross 1,000 pages:
that commit, and every writer waiting behind it on the store's one connection, pays for copying
the WAL back into the database (about 4 ms here; measured in ``bench/resume.py``). The store
turns the automatic checkpoint off on its connection and asks this checkpointer instead, every
``every`` committed writes. The checkpointer has its own plain ``sqlite3`` connection on its
own thread and runs ``PRAGMA wal_checkpoint(PASSIVE)``, which never blocks writers or readers:
commits go on appending to the WAL while it copies, and SQLite restarts the WAL from its start
at the next commit after a complete checkpoint.

Durability is unchanged: a checkpoint moves committed pages, it never decides what is committed.
A failed checkpoint is logged and tried again at the next request; the WAL only grows meanwhile.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from queue import SimpleQueue

import anyio

log = logging.getLogger("turnkeeper.persistence")

#: Committed writes between two checkpoint requests (a write is one row or record, a few pages:
#: about the 1,000 pages at which SQLite would have checkpointed by itself).
CHECKPOINT_EVERY = 300


class Checkpointer:
    """Runs ``PRAGMA wal_checkpoint(PASSIVE)`` on its own thread when asked (see module)."""

    __slots__ = ("_every", "_path", "_pending", "_queue", "_since", "_thread", "failures", "runs")

    def __init__(self, path: str, *, every: int = CHECKPOINT_EVERY) -> None:
        self._path = path
        self._every = every
        self._since = 0
        self._pending = False
        self._queue: SimpleQueue[threading.Event | bool | None] = SimpleQueue()
        self._thread = threading.Thread(target=self._work, name="turnkeeper-checkpoint")
        self._thread.daemon = True
        #: Checkpoints run, and those that failed (for tests and benchmarks).
        self.runs = 0
        self.failures = 0

    def start(self) -> None:
        """Start the thread (it opens its connection there)."""
        self._thread.start()

    def committed(self, writes: int) -> None:
        """``writes`` more writes were committed: ask for a checkpoint when enough have been."""
        self._since += writes
        if self._since >= self._every and not self._pending:
            self._since = 0
            self._pending = True
            self._queue.put_nowait(True)

    async def settle(self) -> None:
        """Wait until every checkpoint asked for so far has run."""
        done = threading.Event()
        self._queue.put_nowait(done)
        await anyio.to_thread.run_sync(done.wait)

    async def stop(self) -> None:
        """Stop the thread (after what it was asked to do) and close its connection."""
        if self._thread.is_alive():
            self._queue.put_nowait(None)
            await anyio.to_thread.run_sync(self._thread.join)

    def _work(self) -> None:
        db: sqlite3.Connection | None = None
        try:
            db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA busy_timeout = 5000")
        except sqlite3.Error as error:  # every request then fails; the WAL only grows
            log.error("cannot open %s to checkpoint it: %s", self._path, error)
            db = None
        try:
            while (item := self._queue.get()) is not None:
                if isinstance(item, threading.Event):
                    item.set()
                else:
                    self._checkpoint(db)
        finally:
            if db is not None:
                db.close()

    def _checkpoint(self, db: sqlite3.Connection | None) -> None:
        try:
            if db is None:
                raise sqlite3.OperationalError("no connection")
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            self.runs += 1
        except sqlite3.Error as error:
            self.failures += 1
            log.warning("WAL checkpoint of %s failed: %s", self._path, error)
        finally:
            self._pending = False
