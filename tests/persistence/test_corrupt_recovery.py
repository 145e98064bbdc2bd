"""Startup recovery on a store with damaged rows (issue 12, R61): sessions are isolated.

Two sessions, each left by a crash with a cut owed. A damage in one session is reported (a
damaged cut record by the scan, as ``recovered`` ``abandon`` naming the table, key and field; a
damaged history row by its resume, given up at once and logged) and writes nothing to it; the
other session is resumed regardless. A damaged row the resume does not need fails nothing.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import TYPE_CHECKING

import pytest

from agent_session import Recovered, ResumeAttempted
from persistence import SqliteStore
from stream_manager import StreamStarted
from tests.agent_session.support import X, session_rig
from tests.agent_session.test_recovery import seed

if TYPE_CHECKING:
    from pathlib import Path


async def _two_owed(path: Path, damage: str) -> bytes:
    """Sessions ``bad`` and ``good``, each with an owed cut; ``damage`` is run; bad's rows."""
    await seed(SqliteStore(path), "bad")
    await seed(SqliteStore(path), "good")
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute(damage)
    conn.close()
    return _rows_of(path, "bad")


def _rows_of(path: Path, session: str) -> bytes:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT seq, kind, cut_state, cut, body FROM history_rows WHERE session = ?",
            (session,),
        ).fetchall()
    conn.close()
    return repr(rows).encode()


async def _recover(path: Path) -> tuple[dict[str, Recovered], list[str]]:
    async with session_rig({"M": [X()]}, store=SqliteStore(path), sessions=()) as r:
        await r.settle()
        return {e.session or "": e for e in r.of(Recovered)}, [
            s.stream for s in r.of(StreamStarted)
        ]


async def test_r61_a_damaged_history_row_gives_up_its_resume_and_the_other_resumes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The damage is found where the resume reads the history (recovery stays one scan).

    The resume of ``bad`` is given up at once, never retried to the cap and forfeited: its
    record stays owed for a person to repair, and the log names the damaged row.
    """
    path = tmp_path / "tk.db"
    before = await _two_owed(
        path, "UPDATE history_rows SET body = x'7b' WHERE session = 'bad' AND seq = 1"
    )
    with caplog.at_level(logging.ERROR, logger="turnkeeper.session"):
        async with session_rig({"M": [X()]}, store=SqliteStore(path), sessions=()) as r:
            await r.settle()
            resumes = [(e.session, e.attempt, e.outcome) for e in r.of(ResumeAttempted)]
            streams = [s.stream for s in r.of(StreamStarted)]
            assert r.session("bad").owes() is False  # given up in memory: no retry loop
    assert ("bad", 1, "failed") in resumes
    assert ("good", 1, "started") in resumes
    assert [e for e in resumes if e[0] == "bad"] == [("bad", 1, "failed")]  # never retried
    assert streams == ["good/2"]
    assert "history_rows[bad/bad:r1]" in caplog.text
    assert _rows_of(path, "bad") == before  # still owed, untouched: no forfeit, no void


async def test_r61_an_unknown_cut_state_is_reported_by_recovery_not_hidden(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tk.db"
    before = await _two_owed(
        path, "UPDATE history_rows SET cut_state = 'bogus' WHERE session = 'bad' AND seq = 2"
    )
    told, streams = await _recover(path)
    assert told["bad"].action == "abandon"
    assert "history_rows[bad/bad:r2]: $.cut_state: Invalid enum value 'bogus'" in told["bad"].why
    assert told["good"].action == "resume"
    assert streams == ["good/2"]
    assert _rows_of(path, "bad") == before


async def test_r61_a_damaged_cut_record_that_owes_nothing_does_not_stop_the_resume(
    tmp_path: Path,
) -> None:
    """An older, consumed cut of the owed session has a damaged record: the resume does not
    need it, so the session resumes, and the damaged record stays as it was."""
    path = tmp_path / "tk.db"
    await seed(SqliteStore(path), "s1")
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute("UPDATE history_rows SET seq = 5, row_id = 's1:r5' WHERE seq = 2")
        conn.execute(
            "INSERT INTO history_rows (session, seq, row_id, kind, stream, cut_state, cut, body) "
            "VALUES ('s1', 2, 's1:r2', 'assistant', 's1/0', 'consumed', x'7b', "
            'CAST(\'{"text":"old"}\' AS BLOB))'
        )
    conn.close()
    told, streams = await _recover(path)
    assert told["s1"].action == "resume", told
    assert streams == ["s1/2"]
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT cut FROM history_rows WHERE seq = 2").fetchone() == (b"{",)
    conn.close()
