"""``turnkeeper inspect`` shows the durable queue (issue 24): text and ``--json``, redacted.

Each session's queued entries (id, kind, mode, adds, withdrawn, text) by position; a damaged
stored entry, and a body that does not decode, reported by key with what was wrong (exit 4).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from agent_session.harness.inspection import inspect_command
from message_queue import DispatchMode, EntryKind, EntryState, MessageState, encode_entry
from persistence import QueuedEntryRecord, QueueSnapshot, SqliteStore
from tests.persistence.helpers import plain_sqlite, session
from tests.store_kit import commit

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

SECRET = "FAKEpass0000"
LONG = "l" * 600


def record(sid: str, position: int, state: EntryState) -> QueuedEntryRecord:
    return QueuedEntryRecord(
        session=sid,
        entry_id=state.id,
        position=position,
        kind=state.kind.value,
        body=encode_entry(state),
    )


BATCHED = EntryState(
    id="q1",
    kind=EntryKind.USER,
    mode=DispatchMode.TOOL_END,
    messages=(MessageState(id="q1", text="fix the tests"), MessageState(id="q4", text="and docs")),
)
WITHDRAWN = EntryState(
    id="q2",
    kind=EntryKind.WAKE,
    mode=DispatchMode.TOOL_END,
    messages=(MessageState(id="q2", text=f"deploy: mysql -u app --password {SECRET} db"),),
    withdrawable=True,
    withdrawn=True,
    withdrawn_reason="superseded",
)
REPORT = EntryState(
    id="q7",
    kind=EntryKind.REPORT,
    mode=DispatchMode.TURN_END,
    messages=(MessageState(id="q7", text=LONG),),
)


async def seeded(tmp_path: Path, *extra: QueuedEntryRecord) -> str:
    path = tmp_path / "q.db"
    async with SqliteStore(path) as store:
        dev = (record("dev", 8, WITHDRAWN), record("dev", 3, BATCHED), *extra)
        await commit(
            store, "dev", create=session("dev"), queue=QueueSnapshot(version=5, entries=dev)
        )
        ops = QueueSnapshot(version=2, entries=(record("ops", 1, REPORT),))
        await commit(store, "ops", create=session("ops"), queue=ops)
        await commit(store, "calm", create=session("calm"))
    return str(path)


async def test_inspect_lists_each_sessions_queued_entries_by_position(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = await seeded(tmp_path)
    assert await inspect_command(db, None, as_json=False) == 0
    out = capsys.readouterr().out
    assert "queued entries: 3\n" in out
    lines = [line for line in out.splitlines() if line.startswith("  dev/") or "ops/" in line]
    assert lines == [
        "  dev/q1: user, tool-end, 2 adds: fix the tests ⏎ and docs",
        "  dev/q2: wake, tool-end, 1 add, withdrawn: deploy: mysql -u app --password [redacted] db",
        f"  ops/q7: report, turn-end, 1 add: {'l' * 200}… (600 bytes, cut)",
    ]
    assert SECRET not in out
    assert await inspect_command(db, "calm", as_json=False) == 0
    assert "queued entries: none" in capsys.readouterr().out


async def test_inspect_json_shows_the_queue_whole_and_redacted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = await seeded(tmp_path)
    assert await inspect_command(db, None, as_json=True) == 0
    out = capsys.readouterr().out
    assert SECRET not in out
    report = json.loads(out)
    assert report["corrupt_queued"] == []
    assert report["queued"] == [
        {
            "session": "dev",
            "entry": "q1",
            "position": 3,
            "kind": "user",
            "mode": "tool-end",
            "adds": 2,
            "withdrawn": False,
            "text": "fix the tests\nand docs",
        },
        {
            "session": "dev",
            "entry": "q2",
            "position": 8,
            "kind": "wake",
            "mode": "tool-end",
            "adds": 1,
            "withdrawn": True,
            "text": "deploy: mysql -u app --password [redacted] db",
        },
        {
            "session": "ops",
            "entry": "q7",
            "position": 1,
            "kind": "report",
            "mode": "turn-end",
            "adds": 1,
            "withdrawn": False,
            "text": LONG,
        },
    ]
    assert await inspect_command(db, "ops", as_json=True) == 0
    assert [e["entry"] for e in json.loads(capsys.readouterr().out)["queued"]] == ["q7"]


async def test_inspect_reports_damaged_queued_entries_by_key_and_exits_4(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    undecodable = QueuedEntryRecord(
        session="dev", entry_id="q3", position=5, kind="user", body=b'{"id":"q3"}'
    )
    db = await seeded(tmp_path, undecodable)
    with plain_sqlite(tmp_path / "q.db") as conn:
        conn.execute("UPDATE queued_entries SET kind = 'robot' WHERE entry_id = 'q2'")
    stored = "queued_entries[dev/q2]: $.kind: 'robot' is not one of follow-up, report, system"
    body = "queued_entries[dev/q3]: $: Object missing required field `kind`"
    assert await inspect_command(db, "dev", as_json=False) == 4
    captured = capsys.readouterr()
    assert f"turnkeeper inspect: skipped corrupt queued entry dev/q2: {stored}" in captured.err
    assert f"turnkeeper inspect: skipped corrupt queued entry dev/q3: {body}" in captured.err
    assert "queued entries: 1, 2 damaged" in captured.out
    assert "  dev/q1: user, tool-end, 2 adds" in captured.out
    assert f"  dev/q2: damaged: {stored}" in captured.out
    assert f"  dev/q3: damaged: {body}" in captured.out
    assert await inspect_command(db, None, as_json=True) == 4
    report = json.loads(capsys.readouterr().out)
    assert [e["entry"] for e in report["queued"]] == ["q1", "q7"]
    assert [(d["entry"], d["detail"][: len(stored)]) for d in report["corrupt_queued"]] == [
        ("dev/q2", stored),
        ("dev/q3", body[: len(stored)]),
    ]
    assert {"at": "skipped corrupt queued entry dev/q3", "detail": body} in report["corrupt"]
