"""``inspect`` says what SQLite's quick_check found, and a refusal leaves the folder as it was."""

from __future__ import annotations

import json
import os
import sqlite3
from typing import TYPE_CHECKING

from agent_session.cli import main
from tests.persistence import corrupt_kit

if TYPE_CHECKING:
    from pathlib import Path

    import pytest


def test_inspect_runs_quick_check_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "t.db"
    assert main(["run", "--db", str(db), str(corrupt_kit.SCENARIOS / "withdrawn-wake.toml")]) == 0
    capsys.readouterr()
    assert main(["inspect", "--db", str(db)]) == 0
    assert "integrity (SQLite quick_check): ok" in capsys.readouterr().out
    assert main(["inspect", "--db", str(db), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["integrity"] == {"check": "quick_check", "ok": True, "problems": []}
    assert report["corrupt"] == []
    corrupt_kit.zero_page(None)(db)  # a data page: the store opens, quick_check fails
    before = corrupt_kit.digest(db)
    assert main(["inspect", "--db", str(db), "--json"]) == 4
    report = json.loads(capsys.readouterr().out)
    assert report["integrity"]["ok"] is False
    assert report["integrity"]["problems"]
    assert corrupt_kit.digest(db) == before


def test_a_refused_store_gets_no_sidecar_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "t.db"
    assert main(["run", "--db", str(db), str(corrupt_kit.SCENARIOS / "withdrawn-wake.toml")]) == 0
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE schema_version SET version = 99")
    conn.close()
    before, names = corrupt_kit.digest(db), sorted(os.listdir(tmp_path))
    assert main(["inspect", "--db", str(db)]) == 2
    assert main(["receipts", "--db", str(db), "--json"]) == 2
    err = capsys.readouterr().err
    assert err.count("schema version 99") == 2
    assert corrupt_kit.digest(db) == before
    assert sorted(os.listdir(tmp_path)) == names  # no -wal, no -shm
