"""``turnkeeper inspect`` shows the compaction follow-ups still pending on summary rows (AS-37).

A summary row whose follow-up was cleared (its follow-up row was written, or it was dropped)
shows nothing; a pending one shows its session, row, stream and the budget as stored, even a
malformed one (a person sees what startup will drop).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from agent_session.harness.inspection import inspect_command
from persistence import Boundary, HistoryRow, RowKind, SqliteStore
from tests.persistence.helpers import session
from tests.store_kit import owner

if TYPE_CHECKING:
    from pathlib import Path

    import pytest


def summary(sid: str, seq: int, follow_up: bytes | None) -> HistoryRow:
    body = b'{"text":"so far"' + (b',"follow_up":' + follow_up if follow_up else b"") + b"}"
    return HistoryRow(
        session=sid,
        seq=seq,
        row_id=f"{sid}:r{seq}",
        kind=RowKind.SUMMARY,
        body=body,
        stream=f"{sid}/2",
    )


async def seeded(tmp_path: Path) -> str:
    path = tmp_path / "f.db"
    async with SqliteStore(path) as store:
        pending = b'{"step_budget":4,"model":"m","requested_model":"m"}'
        rows = (summary("lead", 1, pending),)
        await store.commit("lead", Boundary(create=session("lead"), rows=rows), owner=owner(store))
        rows = (summary("calm", 1, None),)
        await store.commit("calm", Boundary(create=session("calm"), rows=rows), owner=owner(store))
        bad = b'{"step_budget":"5","model":"m","requested_model":"m"}'
        rows = (summary("odd", 1, bad),)
        await store.commit("odd", Boundary(create=session("odd"), rows=rows), owner=owner(store))
    return str(path)


async def test_as37_inspect_shows_each_pending_follow_up_with_its_stored_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = await seeded(tmp_path)
    assert await inspect_command(db, None, as_json=False) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "follow-up" in line]
    assert lines == [
        "pending follow-up: lead summary lead:r1 of lead/2 (4 steps left on m)",
        "pending follow-up: odd summary odd:r1 of odd/2 ('5' steps left on m)",
    ]
    assert await inspect_command(db, "calm", as_json=False) == 0
    assert "pending follow-ups: none" in capsys.readouterr().out
    assert await inspect_command(db, "lead", as_json=True) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["follow_ups"] == [
        {"session": "lead", "row": "lead:r1", "cut": "lead/2", "remaining": 4, "model": "m"}
    ]
