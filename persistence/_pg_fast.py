"""The PostgreSQL store's fast batch: every commit of a batch in one pipelined round trip.

A batch's commits run one after another in savepoints (``_pg_commit``): four round trips
each, so a batch of hundreds of sessions' writes waits on hundreds of round trips. Most
boundaries need no answer from the database before their next statement: a session this
process holds, writing rows, receipts, envelopes, handles, cut states and partial parts. For a
batch made only of those, every statement of every commit is sent at once (psycopg's pipeline
mode) inside one transaction, the fence of each commit first; the answers are read once, at
the pipeline's sync. If every fence holds and every statement did what it must (a cut state
moved exactly one row), the transaction commits. Otherwise nothing of it is kept: it is
rolled back whole and the batch runs again the careful way, commit by commit, where each
commit's refusal is named and the others are kept.
"""

from __future__ import annotations

from typing import Any

import psycopg

from persistence import _pg_sql as sql
from persistence._pg_commit import Plan, Txn


class Careful(Exception):
    """The fast batch cannot stand: roll it back and run the batch commit by commit."""


def fast(plan: Plan, txn: Txn) -> bool:
    """Whether ``plan`` can ride in a pipelined batch (a held session, no answer needed)."""
    return (
        plan.create is None
        and plan.queue_version is None
        and plan.abandon is None
        and not plan.clear_abandon
        and plan.auto_retry is None
        and not plan.inbox
        and txn.held.get(plan.session) is not None
    )


class _Sent:
    """The cursors of one plan's statements, read after the sync."""

    __slots__ = ("cuts", "deleted", "fence", "plan")

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.fence: psycopg.AsyncCursor[Any] | None = None
        self.deleted: psycopg.AsyncCursor[Any] | None = None
        self.cuts: list[psycopg.AsyncCursor[Any]] = []


async def _send(txn: Txn, plan: Plan) -> _Sent:
    conn, session = txn.conn, plan.session
    epoch = txn.held[session]
    sent = _Sent(plan)
    sent.fence = await conn.execute(sql.FENCE, {"id": session, "owner": txn.owner})
    if plan.doomed:
        sent.deleted = await conn.execute(sql.DELETE_ROWS, (session, plan.doomed))
    for _, params in plan.rows:
        await conn.execute(sql.INSERT_ROW, (*params, epoch))
    for row_id, state in plan.cuts:
        moved = {"state": state, "session": session, "row_id": row_id}
        sent.cuts.append(await conn.execute(sql.SET_CUT_STATE, moved))
    if plan.envelope is not None:
        await conn.execute(sql.PUT_ENVELOPE, plan.envelope)
    for receipt in plan.operations:
        await conn.execute(sql.PUT_OPERATION, (*receipt, epoch))
    for handle in plan.handles:
        await conn.execute(sql.PUT_HANDLE, handle)
    for drop in plan.part_drops:
        await conn.execute(sql.DROP_PARTS, drop)
    for part in plan.parts:
        await conn.execute(sql.PUT_PART, part)
    return sent


async def run_fast(txn: Txn, plans: list[Plan]) -> list[int]:
    """Every plan in the open transaction, pipelined; each one's deleted count.

    Raises:
        Careful: A fence did not hold, or a statement did not do what it must: the caller
            rolls the transaction back and runs the batch the careful way.
        psycopg.Error: A statement failed (the caller does the same).
    """
    async with txn.conn.pipeline():
        sent = [await _send(txn, plan) for plan in plans]
    deleted: list[int] = []
    for one in sent:
        assert one.fence is not None
        found = await one.fence.fetchone()
        if found is None or found[0] != txn.held[one.plan.session]:
            raise Careful(f"the lease of {one.plan.session!r} did not hold")
        if any(cursor.rowcount != 1 for cursor in one.cuts):
            raise Careful(f"a cut state of {one.plan.session!r} moved no row")
        deleted.append(max(one.deleted.rowcount, 0) if one.deleted is not None else 0)
    return deleted
