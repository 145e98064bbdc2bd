"""``turnkeeper inspect`` lists delegated handles (issue 23): text and ``--json``, redacted."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import msgspec

from agent_session.harness.inspection import inspect_command
from persistence import HandleStatus, SqliteStore
from tests.persistence.helpers import plain_sqlite
from tests.persistence.test_handles_store import ACTIVE, SETTLED
from tests.store_kit import commit

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

#: A settlement the owner has not accepted yet, its reason holding a credential-like token.
SECRET = "FAKEpass0000"
UNDELIVERED = msgspec.structs.replace(
    SETTLED,
    handle_id="h-9",
    owner="scout",
    target="fixer",
    status=HandleStatus.ERROR,
    reason=f"deploy failed: mysql -u app --password {SECRET} db",
    report=None,
    delivered=False,
)


async def seeded(tmp_path: Path) -> str:
    path = tmp_path / "h.db"
    async with SqliteStore(path) as store:
        await commit(store, "lead", handles=[SETTLED, ACTIVE, UNDELIVERED])
    return str(path)


async def test_inspect_lists_each_handle_waiting_or_settled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = await seeded(tmp_path)
    assert await inspect_command(db, None, as_json=False) == 0
    out = capsys.readouterr().out
    assert "delegated handles: 3" in out
    assert "h-3: lead → fixer (turn fixer:r2), active: waiting on fixer/1" in out
    assert "h-7: lead → scout (turn scout:r4), settled completed: report filed\n" in out
    assert "h-7 report: three hosts patched" in out
    assert (
        "h-9: scout → fixer (turn scout:r4), settled error: deploy failed: mysql -u app "
        "--password [redacted] db (not yet delivered)"
    ) in out
    assert SECRET not in out


async def test_inspect_json_lists_handles_and_flags_undelivered_settlements(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = await seeded(tmp_path)
    assert await inspect_command(db, None, as_json=True) == 0
    out = capsys.readouterr().out
    assert SECRET not in out
    handles = json.loads(out)["handles"]
    assert [h["handle_id"] for h in handles] == ["h-3", "h-7", "h-9"]
    active, settled, undelivered = handles
    assert active == {
        **json.loads(msgspec.json.encode(ACTIVE)),
        "waiting_on": ["fixer/1"],
        "undelivered": False,
    }
    assert settled["report"] == "three hosts patched"
    assert (settled["waiting_on"], settled["undelivered"]) == ([], False)
    assert undelivered["reason"] == "deploy failed: mysql -u app --password [redacted] db"
    assert undelivered["undelivered"] is True


async def test_inspect_of_a_session_lists_the_handles_it_owns_or_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = await seeded(tmp_path)
    for session, expected in (
        ("fixer", ["h-3", "h-9"]),  # the target of both
        ("scout", ["h-7", "h-9"]),  # the target of one, the owner of the other
        ("lead", ["h-3", "h-7"]),
        ("nobody", []),
    ):
        assert await inspect_command(db, session, as_json=True) == 0
        found = json.loads(capsys.readouterr().out)["handles"]
        assert [h["handle_id"] for h in found] == expected, session
    assert await inspect_command(db, "nobody", as_json=False) == 0
    assert "delegated handles: none" in capsys.readouterr().out


async def test_inspect_reports_a_corrupt_handle_row_and_exits_4(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = await seeded(tmp_path)
    with plain_sqlite(tmp_path / "h.db") as conn:
        conn.execute("UPDATE handles SET status = 'paused' WHERE handle_id = 'h-3'")
    detail = "handles[h-3]: $.status: the record says 'active', the status column says 'paused'"
    assert await inspect_command(db, None, as_json=False) == 4
    captured = capsys.readouterr()
    assert f"turnkeeper inspect: skipped corrupt handle h-3: {detail}" in captured.err
    assert "delegated handles: 2" in captured.out
    assert await inspect_command(db, "fixer", as_json=True) == 4
    report = json.loads(capsys.readouterr().out)
    assert [h["handle_id"] for h in report["handles"]] == ["h-9"]
    assert report["corrupt"] == [{"at": "skipped corrupt handle h-3", "detail": detail}]
