"""``turnkeeper inspect`` shows each session's abandon marker (PS-8): text and ``--json``.

The marker says why startup will not retry the session's last turn and which user row that
turn answered; its reason is redacted and, in text, cut like every printed value. A damaged
marker is reported by table, session and field (exit 4), never shown as "no marker".
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from agent_session.harness.inspection import inspect_command
from persistence import AbandonMarker, SqliteStore
from tests.persistence.helpers import plain_sqlite, row, session
from tests.store_kit import commit

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

SECRET = "FAKEpass0000"
GIVEN_UP = AbandonMarker(
    reason=f"ModelNotFound: mysql -u app --password {SECRET} db", user_row="lead:r3"
)
LONG = AbandonMarker(reason="r" * 600)


async def seeded(tmp_path: Path) -> str:
    path = tmp_path / "a.db"
    async with SqliteStore(path) as store:
        await commit(
            store,
            "lead",
            create=session("lead"),
            rows=[row(3, "lead:r3", sid="lead")],
            abandon=GIVEN_UP,
        )
        await commit(store, "scout", create=session("scout"), abandon=LONG)
        await commit(store, "calm", create=session("calm"))
    return str(path)


async def test_ps8_inspect_shows_each_abandon_marker_with_its_user_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = await seeded(tmp_path)
    assert await inspect_command(db, None, as_json=False) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    start = lines.index("abandoned turns (not retried at startup): 2")
    assert lines[start + 1 : start + 3] == [
        "  lead (user row lead:r3): ModelNotFound: mysql -u app --password [redacted] db",
        f"  scout: {'r' * 200}… (600 bytes, cut)",
    ]
    assert SECRET not in out
    assert await inspect_command(db, "calm", as_json=False) == 0
    assert "abandoned turns: none" in capsys.readouterr().out


async def test_ps8_inspect_json_shows_the_marker_whole_and_redacted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = await seeded(tmp_path)
    assert await inspect_command(db, None, as_json=True) == 0
    out = capsys.readouterr().out
    assert SECRET not in out
    assert json.loads(out)["sessions"] == [
        {"id": "calm", "model": "alpha", "abandon": None},
        {
            "id": "lead",
            "model": "alpha",
            "abandon": {
                "reason": "ModelNotFound: mysql -u app --password [redacted] db",
                "user_row": "lead:r3",
            },
        },
        {"id": "scout", "model": "alpha", "abandon": {"reason": "r" * 600, "user_row": None}},
    ]
    assert await inspect_command(db, "scout", as_json=True) == 0
    [scout] = json.loads(capsys.readouterr().out)["sessions"]
    assert scout["abandon"] == {"reason": "r" * 600, "user_row": None}


async def test_ps8_inspect_reports_a_damaged_marker_and_exits_4(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = await seeded(tmp_path)
    with plain_sqlite(tmp_path / "a.db") as conn:
        conn.execute("UPDATE abandon_markers SET user_row = x'7233' WHERE session = 'lead'")
    said = "abandon_markers[lead]: $.user_row: bytes, not text"
    assert await inspect_command(db, None, as_json=False) == 4
    captured = capsys.readouterr()
    assert f"turnkeeper inspect: session lead cannot be loaded: {said}" in captured.err
    assert f"turnkeeper inspect: skipped corrupt recovery of session lead: {said}" in captured.err
    assert "  scout: " in captured.out  # the other markers are shown
    assert "  lead" not in captured.out
    assert await inspect_command(db, None, as_json=True) == 4
    report = json.loads(capsys.readouterr().out)
    assert {"at": "session lead cannot be loaded", "detail": said} in report["corrupt"]
