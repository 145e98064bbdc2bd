"""``turnkeeper inspect`` shows a session whose auto-retry preference is off (AS-32).

Text: one line ``auto-retry: off for session ID`` per such session, nothing for one that is
on (the default). ``--json``: the session's entry carries ``"auto_retry": false``, and no key
when on. A damaged preference (``retry_settings[lead]: $.auto_retry: ...``) reads as off and is
reported like other damage (exit 4).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from agent_session.harness.inspection import inspect_command
from persistence import Boundary, SqliteStore
from tests.persistence.helpers import plain_sqlite, row, session
from tests.store_kit import commit, owner

if TYPE_CHECKING:
    from pathlib import Path

    import pytest


async def seeded(tmp_path: Path) -> str:
    """``lead`` and ``scout`` switched off (``scout`` in the boundary creating it), ``calm`` on."""
    path = tmp_path / "a.db"
    async with SqliteStore(path) as store:
        await commit(store, "lead", create=session("lead"), rows=[row(3, "lead:r3", sid="lead")])
        await store.commit("lead", Boundary(auto_retry=False), owner=owner(store))
        create = Boundary(create=session("scout"), auto_retry=False)
        await store.commit("scout", create, owner=owner(store))
        await commit(store, "calm", create=session("calm"))
        await store.commit("calm", Boundary(auto_retry=False), owner=owner(store))
        await store.commit("calm", Boundary(auto_retry=True), owner=owner(store))
    return str(path)


def off_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("auto-retry")]


async def test_as32_inspect_shows_each_session_whose_auto_retry_is_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = await seeded(tmp_path)
    assert await inspect_command(db, None, as_json=False) == 0
    lines = capsys.readouterr().out.splitlines()
    assert off_lines("\n".join(lines)) == [
        "auto-retry: off for session lead",
        "auto-retry: off for session scout",
    ]
    assert (
        lines.index("auto-retry: off for session lead") == lines.index("abandoned turns: none") + 1
    )
    assert await inspect_command(db, "scout", as_json=False) == 0
    assert off_lines(capsys.readouterr().out) == ["auto-retry: off for session scout"]
    assert await inspect_command(db, "calm", as_json=False) == 0
    assert off_lines(capsys.readouterr().out) == []


async def test_as32_inspect_json_says_auto_retry_false_only_when_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = await seeded(tmp_path)
    assert await inspect_command(db, None, as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["sessions"] == [
        {"id": "calm", "model": "alpha", "abandon": None},
        {"id": "lead", "model": "alpha", "abandon": None, "auto_retry": False},
        {"id": "scout", "model": "alpha", "abandon": None, "auto_retry": False},
    ]
    assert await inspect_command(db, "calm", as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["sessions"] == [
        {"id": "calm", "model": "alpha", "abandon": None}
    ]


async def test_as32_inspect_reports_a_damaged_preference_shows_it_off_and_exits_4(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = await seeded(tmp_path)
    with plain_sqlite(tmp_path / "a.db") as conn:
        conn.execute("INSERT INTO retry_settings VALUES ('calm', 7)")
    said = "retry_settings[calm]: $.auto_retry: 7 is not 0 or 1 (read as off)"
    where = "damaged auto-retry preference of session calm"
    assert await inspect_command(db, None, as_json=False) == 4
    captured = capsys.readouterr()
    assert f"turnkeeper inspect: {where}: {said}" in captured.err
    assert off_lines(captured.out) == [
        "auto-retry: off for session calm",
        "auto-retry: off for session lead",
        "auto-retry: off for session scout",
    ]
    assert await inspect_command(db, "calm", as_json=True) == 4
    report = json.loads(capsys.readouterr().out)
    assert report["sessions"] == [
        {"id": "calm", "model": "alpha", "abandon": None, "auto_retry": False}
    ]
    assert {"at": where, "detail": said} in report["corrupt"]
    with plain_sqlite(tmp_path / "a.db") as conn:  # read-only: the row is as it was
        assert conn.execute("SELECT * FROM retry_settings WHERE session = 'calm'").fetchall() == [
            ("calm", 7)
        ]
