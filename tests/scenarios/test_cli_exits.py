"""Every exit path of ``turnkeeper`` is one line and an exit code, never a traceback.

Bad ``--db`` and ``--trace`` targets are refused before anything runs (no store written);
an exception nothing expected is ``turnkeeper: internal error: ...`` and exit 70.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from agent_session import cli
from agent_session.cli import EXIT_INTERNAL, main

LIBRARY = Path(__file__).resolve().parents[2] / "docs" / "scenarios"
SCENARIO = str(LIBRARY / "plain-text-owes-nothing.toml")


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("folder", "is a directory"),
        ("missing/x.db", "no such folder"),
        ("text.db", "not a turnkeeper store (not a SQLite file)"),
    ],
)
def test_a_bad_db_target_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, reason: str
) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "text.db").write_text("not a database")
    assert main(["run", SCENARIO, "--db", str(tmp_path / target)]) == 2
    line = one_line(capsys)
    assert line.startswith(f"turnkeeper run: --db {tmp_path / target}: {reason}")
    assert (tmp_path / "text.db").read_text() == "not a database"


def test_a_sqlite_file_that_is_not_a_store_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as connection:
        connection.execute("create table x (a)")
    connection.close()
    assert main(["run", SCENARIO, "--db", str(other)]) == 2
    assert "is not a turnkeeper store" in one_line(capsys)


@pytest.mark.parametrize("target", ["folder", "missing/t.jsonl"])
def test_an_unwritable_trace_is_refused_before_any_store_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    (tmp_path / "folder").mkdir()
    db = tmp_path / "run.db"
    assert main(["run", SCENARIO, "--db", str(db), "--trace", str(tmp_path / target)]) == 2
    assert one_line(capsys).startswith(f"turnkeeper run: --trace {tmp_path / target}: ")
    assert not db.exists()


def test_demo_refuses_a_bad_trace_before_it_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "demo.db"
    assert main(["demo", "--db", str(db), "--trace", str(tmp_path), "--plain"]) == 2
    assert one_line(capsys) == f"turnkeeper demo: --trace {tmp_path}: is a directory"
    assert not db.exists()


def test_an_unexpected_exception_is_one_line_and_exit_70(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def explode(args: object) -> int:
        raise ExceptionGroup("group", [ValueError("boom " + "x" * 1000)])

    monkeypatch.setattr(cli, "_dispatch", explode)
    assert main(["run", SCENARIO]) == EXIT_INTERNAL
    line = one_line(capsys)
    assert line.startswith("turnkeeper: internal error: ValueError: boom xxx")
    assert line.endswith("(1005 chars)")


def test_argparse_usage_errors_keep_their_exit_code() -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run"])
    assert exited.value.code == 2
