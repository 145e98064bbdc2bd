"""Every durable write of a scenario run, with where in the trace it committed.

The failed-write sweep needs to know which write it failed and what each told event stands on.
:class:`LoggedStore` is the run's store (a ``MemoryStore``) that records, for each commit that
reached it, the facts it made durable and how many engine events had been emitted when it was
asked for and when it returned. The harness's ``FaultyStore`` wraps it, so an injected failure
never reaches it: a write missing from the log is one that failed (or that a crash refused).

A fact is a small tuple naming one durable thing, e.g. ``("row", "dev:r2")``, ``("cut-owed",
"dev/1")`` (a row carrying the owed cut record of stream ``dev/1``), ``("cut-state", "dev:r2",
"consumed")``, ``("envelope", "dev/2")``, ``("receipt", "dev/1/3/0", "completed")``.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from persistence import Boundary, Committed, CutState, MemoryStore
from persistence.postgres import PostgresStore

Fact = tuple[str, ...]


def facts_of(session: str, boundary: Boundary) -> frozenset[Fact]:
    """The durable facts one boundary of ``session`` writes."""
    facts: set[Fact] = set()
    if boundary.create is not None:
        facts.add(("create", session))
    facts.update(("delete", row_id) for row_id in boundary.delete)
    for row in boundary.rows:
        facts.add(("row", row.row_id))
        if row.cut is not None and row.stream is not None and row.cut.state is CutState.OWED:
            facts.add(("cut-owed", row.stream, row.row_id))
    facts.update(("cut-state", moved.row_id, moved.state.value) for moved in boundary.cut_states)
    if boundary.envelope is not None:
        facts.add(("envelope", boundary.envelope.stream))
    facts.update(("receipt", op.op_id, op.state.value) for op in boundary.operations)
    return frozenset(facts)


@dataclass(frozen=True)
class Write:
    """One committed boundary: its session, facts and the events emitted around it."""

    session: str
    facts: frozenset[Fact]
    #: Engine events emitted when the commit was asked for, and when it returned.
    asked: int
    done: int


class _Log:
    """What both logged stores keep: the writes, and the engine events emitted so far."""

    def __init__(self) -> None:
        self.writes: list[Write] = []
        #: Engine events emitted so far (``crash`` is the harness's, not counted).
        self.events = 0

    def observe(self, _event: Any) -> None:
        """Count one engine event (the run's observer)."""
        self.events += 1

    async def logged(
        self, session: str, boundary: Boundary, commit: Awaitable[Committed]
    ) -> Committed:
        """Await ``commit``, and log the write once it returned."""
        asked = self.events
        committed = await commit
        self.writes.append(Write(session, facts_of(session, boundary), asked, self.events))
        return committed


class LoggedStore(MemoryStore):
    """A ``MemoryStore`` that logs each commit; pass :meth:`observe` as a run's observer."""

    def __init__(self) -> None:
        super().__init__()
        self.log = _Log()
        self.writes = self.log.writes
        self.observe = self.log.observe

    async def commit(self, session: str, boundary: Boundary, *, owner: str | None) -> Committed:
        """Commit, and log the write once it returned."""
        return await self.log.logged(
            session, boundary, super().commit(session, boundary, owner=owner)
        )


class LoggedPgStore(PostgresStore):
    """The same log over a real PostgreSQL schema (the sweep's PostgreSQL sample)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.log = _Log()
        self.writes = self.log.writes
        self.observe = self.log.observe

    async def commit(self, session: str, boundary: Boundary, *, owner: str | None) -> Committed:
        """Commit, and log the write once it returned."""
        return await self.log.logged(
            session, boundary, super().commit(session, boundary, owner=owner)
        )
