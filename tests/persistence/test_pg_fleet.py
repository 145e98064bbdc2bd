"""Two, then four, engine processes over one PostgreSQL database (LS-1 to LS-3).

Each process is a ``bench.pg_fleet --worker`` (its own ``PostgresStore``, its own sessions)
running ``bench.many_sessions``'s turn: 19 model steps that each call a tool, then a text step.
They start together (a barrier), so their commits interleave in the database. Then the
database is read whole: every session's history is contiguous and answered, written under
one epoch, each of its tool calls has one receipt, and nothing of one process's sessions was
written by another. ``TURNKEEPER_FLEET`` sets the sessions in all (``make test`` 100,
``make test-pg`` 1,000).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from bench.many_sessions import STEPS
from tests.pg_kit import sql

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = int(os.environ.get("TURNKEEPER_FLEET", "100"))


def run_fleet(url: str, processes: int) -> None:
    share = SESSIONS // processes
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.pg_fleet", "--worker", url, f"p{n}-", str(share)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(processes)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready"
        for worker in workers:  # all at once
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        for worker in workers:
            _, err = worker.communicate(timeout=600)
            assert worker.returncode == 0, err[-3000:]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.communicate(timeout=10)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("processes", [2, 4])
def test_ls3_processes_sharing_a_database_each_write_their_own_sessions_whole(
    fresh_pg_url: Any, processes: int
) -> None:
    url = fresh_pg_url()
    run_fleet(url, processes)
    rows = sql(url, "SELECT session, seq, kind, epoch FROM history_rows ORDER BY session, seq")
    by_session: dict[str, list[tuple[int, str, int]]] = defaultdict(list)
    for sid, seq, kind, epoch in rows:
        by_session[sid].append((seq, kind, epoch))
    assert len(by_session) == SESSIONS // processes * processes
    for sid, history in by_session.items():
        seqs = [seq for seq, _, _ in history]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), sid  # contiguous
        assert history[-1][1] == "assistant", sid  # answered
        assert {epoch for _, _, epoch in history} == {1}, sid  # one run of writes, one epoch
    receipts = sql(
        url, "SELECT session, count(*), count(DISTINCT op_id) FROM operations GROUP BY session"
    )
    assert len(receipts) == len(by_session)
    for sid, count, distinct in receipts:
        assert count == distinct == STEPS - 1, sid  # one receipt per tool call, none twice
    owners = sql(url, "SELECT count(DISTINCT owner) FROM sessions")
    assert owners == [(0,)]  # every process closed cleanly: every lease given back
    states = sql(url, "SELECT DISTINCT state FROM operations")
    assert states == [("completed",)]
