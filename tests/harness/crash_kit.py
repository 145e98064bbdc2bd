"""What the crash-harness tests share: does this SqliteStore read startup-retry tails yet?

SQLite's half of the startup retry (``RecoveryScan.tails``) lands from another branch; until
then a turn a kill cut mid-stream is not retried on SQLite, and the crash sweep's ``in-flight``
class and the kill -9 loop's unanswered count say so. The tests that run them ask this probe and
name the gap instead of passing silently.
"""

from __future__ import annotations

import tempfile
from functools import cache
from pathlib import Path

import anyio

from persistence import Boundary, HistoryRow, RowKind, SessionRecord, SqliteStore

TAILS_MISSING = "SqliteStore reads no startup-retry tails yet (RecoveryScan.tails, branch h-tails)"


async def _probe(db: Path) -> bool:
    async with SqliteStore(db) as store:
        row = HistoryRow(session="p", seq=1, row_id="p:r1", kind=RowKind.USER, body=b'{"text":"x"}')
        boundary = Boundary(create=SessionRecord(id="p", model="m"), rows=(row,))
        await store.commit("p", boundary, owner=store.owner)
        return bool((await store.scan_recoverable()).tails)


@cache
def sqlite_reads_tails() -> bool:
    with tempfile.TemporaryDirectory() as scratch:
        return anyio.run(_probe, Path(scratch) / "probe.db")
