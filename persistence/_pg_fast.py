"""The PostgreSQL store's fast batch: every commit of a batch in a few statements, one round trip.

A batch's commits run one after another in savepoints (``_pg_commit``): four round trips
each, so a batch of hundreds of sessions' writes waits on hundreds of round trips. Most
boundaries need no answer from the database before their next statement: a session this
process holds, writing rows, receipts, envelopes, handles, cut states and partial parts. A
batch made only of those is written set-wise: one fence for all its sessions, then one
statement per table for all of them (each column an array, ``unnest``), all sent at once in
psycopg's pipeline mode with the transaction's ``BEGIN`` and ``COMMIT``: one round trip. The
statement count per batch no longer grows with the batch, which is what the driver's CPU
follows (``bench/README.md``).

A session that appears twice in a batch starts a new *wave*: waves are written in order, each
one set-wise, so a session's second boundary sees its first (its rows, its cut states) as it
would one commit after another. Within a wave each session has one boundary, whose
statements keep ``Boundary``'s order (delete, insert, cut states, envelope, receipts, handles,
parts dropped, parts put); a key written twice in one statement keeps its first position and
its last value, as sequential upserts would.

``BEGIN`` and ``COMMIT`` ride in the same round trip: the fence and the cut-state count are
checked on the server (``turnkeeper_check``, migration 0003), so a batch that cannot stand
fails before its ``COMMIT``. Then nothing of it is kept: it is rolled back whole and the
batch runs again the careful way, commit by commit, where each commit's refusal is named and
the others are kept.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from persistence import _pg_sql as sql
from persistence._pg_commit import Plan, Txn


class Careful(Exception):
    """The fast batch cannot stand: roll it back and run the batch commit by commit."""


def fast(plan: Plan, txn: Txn) -> bool:
    """Whether ``plan`` can ride in a fast batch (a held session, no answer needed)."""
    return (
        plan.create is None
        and plan.queue_version is None
        and plan.abandon is None
        and not plan.clear_abandon
        and plan.auto_retry is None
        and not plan.inbox
        and txn.held.get(plan.session) is not None
    )


def waves(plans: list[Plan]) -> list[list[Plan]]:
    """``plans`` in order, cut where a session appears again (see module)."""
    out: list[list[Plan]] = [[]]
    seen: set[str] = set()
    for plan in plans:
        if plan.session in seen:
            out.append([])
            seen = set()
        out[-1].append(plan)
        seen.add(plan.session)
    return out


def _last_wins(items: Iterable[tuple[Hashable, tuple[object, ...]]]) -> list[tuple[object, ...]]:
    """Keyed tuples, one per key: its first position, its last value (sequential upserts)."""
    return list(dict(items).values())


def _arrays(rows: Sequence[tuple[object, ...]]) -> list[list[object]]:
    """Column arrays of ``rows`` (the ``unnest`` statements' parameters)."""
    return [list(column) for column in zip(*rows, strict=True)]


class _Wave:
    """One wave's plans and its delete's cursor, read after the sync."""

    __slots__ = ("deleted", "plans")

    def __init__(self, plans: list[Plan]) -> None:
        self.plans = plans
        self.deleted: psycopg.AsyncCursor[Any] | None = None


async def _send(txn: Txn, plans: list[Plan]) -> _Wave:
    conn, held = txn.conn, txn.held
    wave = _Wave(plans)
    doomed = [(p.session, row_id) for p in plans for row_id in p.doomed or ()]
    if doomed:
        wave.deleted = await conn.execute(sql.DELETE_ROWS_MANY, _arrays(doomed))
    rows = [(*params, held[p.session]) for p in plans for _, params in p.rows]
    if rows:
        await conn.execute(sql.INSERT_ROWS, _arrays(rows))
    cuts = _last_wins(
        ((p.session, row_id), (p.session, row_id, state)) for p in plans for row_id, state in p.cuts
    )
    if cuts:
        sessions, row_ids, states = _arrays(cuts)
        moved = {"sessions": sessions, "rows": row_ids, "states": states, "n": len(cuts)}
        await conn.execute(sql.SET_CUT_STATES, moved)
    envelopes = _last_wins((e[:2], e) for p in plans if (e := p.envelope) is not None)
    if envelopes:
        await conn.execute(sql.PUT_ENVELOPES, _arrays(envelopes))
    receipts = _last_wins((r[0], (*r, held[p.session])) for p in plans for r in p.operations)
    if receipts:
        await conn.execute(sql.PUT_OPERATIONS, _arrays(receipts))
    handles = _last_wins((h[0], h) for p in plans for h in p.handles)
    if handles:
        await conn.execute(sql.PUT_HANDLES, _arrays(handles))
    drops = [drop for p in plans for drop in p.part_drops]
    if drops:
        await conn.execute(sql.DROP_PARTS_MANY, _arrays(drops))
    parts = _last_wins((part[:3], part) for p in plans for part in p.parts)
    if parts:
        await conn.execute(sql.PUT_PARTS, _arrays(parts))
    return wave


async def run_fast(txn: Txn, plans: list[Plan]) -> list[int]:
    """Every plan in one transaction, set-wise, in one round trip; each one's deleted count.

    ``BEGIN``, the fence, every wave's statements and ``COMMIT`` are sent at once (pipeline
    mode). A check that fails on the server fails the transaction before its ``COMMIT``,
    which then does not run; the transaction is rolled back here.

    Raises:
        Careful: A lease did not hold, or a cut state moved no row (the caller runs the batch
            the careful way).
        psycopg.Error: A statement failed; nothing of the batch is kept (the caller does the
            same, unless the connection broke).
    """
    conn = txn.conn
    sessions = sorted({plan.session for plan in plans})
    held = {"ids": sessions, "epochs": [txn.held[s] for s in sessions]}
    try:
        async with conn.pipeline():
            await conn.execute("BEGIN")
            await conn.execute(sql.FENCE_MANY, {**held, "n": len(sessions), "owner": txn.owner})
            sent = [await _send(txn, wave) for wave in waves(plans)]
            await conn.execute("COMMIT")
    except psycopg.Error as error:
        if not conn.broken and conn.info.transaction_status != TransactionStatus.IDLE:
            await conn.execute("ROLLBACK")
        if error.sqlstate == sql.CHECK_FAILED:
            raise Careful(str(error).splitlines()[0]) from None
        raise
    deleted: list[int] = []  # the waves hold the plans in their order
    for wave in sent:
        counts: dict[str, int] = {}
        if wave.deleted is not None:
            for (session,) in await wave.deleted.fetchall():
                counts[session] = counts.get(session, 0) + 1
        deleted.extend(counts.get(plan.session, 0) for plan in wave.plans)
    return deleted
