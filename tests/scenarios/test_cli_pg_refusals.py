"""A PostgreSQL URL the commands refuse: one line on standard error, an exit code, no traceback.

A URL that does not connect, a malformed one, a database of another application, a schema
newer than the code, an empty database for a command that creates nothing, psycopg missing:
each is one line (the password masked) and the exit code the SQLite equivalent has (2: a
refused store); nothing is written. ``demo`` runs only on an empty database and never writes
over a store it did not make (``docs/cli.md``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_session.cli import main
from tests.pg_kit import sql, tables

from .pg_kit import SECRET, seed, with_password

LIBRARY = Path(__file__).resolve().parents[2] / "docs" / "scenarios"
SCENARIO = str(LIBRARY / "plain-text-owes-nothing.toml")
ROOT = Path(__file__).resolve().parents[2]

#: Every command that takes ``--db``, with the rest of its arguments.
COMMANDS = {
    "run": ["run", SCENARIO],
    "inspect": ["inspect"],
    "inspect-json": ["inspect", "--json"],
    "receipts": ["receipts"],
    "resolve": ["resolve", "dev/1/1/0", "--as", "failed", "--note", "checked"],
    "migrate": ["migrate"],
    "demo": ["demo", "--plain"],
}
#: The commands that never create a store (read-only, or refusing an empty database).
CREATE_NOTHING = ("inspect", "inspect-json", "receipts", "resolve", "migrate")


def refused(capsys: pytest.CaptureFixture[str], command: str) -> str:
    """The one line a refusal printed; nothing on standard output."""
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert SECRET not in captured.out + captured.err
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"turnkeeper {COMMANDS[command][0]}: "), lines[0]
    return lines[0]


def call(command: str, url: str) -> int:
    return main([*COMMANDS[command], "--db", url])


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_url_that_does_not_connect_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    url = f"postgresql://postgres:{SECRET}@/nowhere?host=/tmp/tk-no-such-socket-dir"
    assert call(command, url) == 2
    line = refused(capsys, command)
    assert "cannot connect" in line
    assert "postgresql://postgres:[redacted]@/nowhere" in line


@pytest.mark.parametrize("command", ["run", "inspect", "migrate"])
def test_a_malformed_url_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    url = f"postgres://postgres:{SECRET}@localhost:notaport/db"
    assert call(command, url) == 2
    assert "cannot connect" in refused(capsys, command)


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(
    "url",
    [
        "postgresql://postgres:Pw7 kq9zmT@/x?host=/tmp/tk-no-such-socket-dir",
        "postgresql://postgres@/x?host=/tmp/tk-no-such-socket-dir&password=Pw7 kq9zmT",
    ],
    ids=["userinfo", "query"],
)
def test_a_password_the_driver_quotes_back_never_shows(
    capsys: pytest.CaptureFixture[str], command: str, url: str
) -> None:
    """psycopg's message quotes what it cannot parse: here, the password itself (a space)."""
    assert call(command, url) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert len(captured.err.splitlines()) == 1, captured.err
    assert "kq9zmT" not in captured.out + captured.err
    assert "cannot connect" in captured.err


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_database_of_another_application_is_refused_untouched(
    pg_url: str, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    sql(pg_url, "CREATE TABLE invoices (id int)")
    assert call(command, with_password(pg_url)) == 2
    assert "a database of another application (tables: invoices)" in refused(capsys, command)
    assert tables(pg_url) == {"invoices"}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_schema_newer_than_the_code_is_refused_untouched(
    pg_url: str, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    seed(pg_url, "dev")
    sql(pg_url, "UPDATE schema_version SET version = 41")
    assert call(command, with_password(pg_url)) == 2
    assert "has schema version 41, newer than the newest" in refused(capsys, command)
    assert sql(pg_url, "SELECT version FROM schema_version") == [(41,)]
    assert sql(pg_url, "SELECT id, owner FROM sessions") == [("dev", None)]


@pytest.mark.parametrize("command", CREATE_NOTHING)
def test_an_empty_database_is_refused_and_nothing_is_created(
    pg_url: str, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    assert call(command, with_password(pg_url)) == 2
    assert "is not a turnkeeper store: an empty database" in refused(capsys, command)
    assert tables(pg_url) == set()


@pytest.mark.parametrize("command", ["run", "inspect", "resolve", "migrate", "demo"])
def test_without_psycopg_a_url_is_one_line_naming_the_extra(tmp_path: Path, command: str) -> None:
    """The ``postgres`` extra missing: psycopg cannot be imported (``None`` in sys.modules)."""
    argv = [*COMMANDS[command], "--db", f"postgresql://u:{SECRET}@db.example/x"]
    code = (
        "import sys; sys.modules['psycopg'] = None; "
        "from agent_session.cli import main; "
        f"sys.exit(main({argv!r}))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"turnkeeper {COMMANDS[command][0]}: ")
    assert "pip install 'turnkeeper[postgres]'" in lines[0]
    assert SECRET not in done.stderr
    assert not any(tmp_path.iterdir())  # the SQLite default (demo's file) is never made


def test_demo_on_an_empty_database_runs_and_leaves_its_rows(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--db", with_password(pg_url), "--plain"]) == 0
    captured = capsys.readouterr()
    assert SECRET not in captured.out + captured.err
    shown = " ".join(captured.out.split())  # the timeline wraps long lines
    assert "store: postgresql://postgres:[redacted]@" in shown
    assert "(PostgreSQL)" in shown
    assert sql(pg_url, "SELECT count(*) FROM sessions")[0][0] >= 1
    assert sql(pg_url, "SELECT count(*) FROM operations")[0][0] >= 1


@pytest.mark.parametrize("earlier", ["demo", "run"])
def test_demo_refuses_a_database_holding_a_turnkeeper_store_and_writes_nothing(
    pg_url: str, capsys: pytest.CaptureFixture[str], earlier: str
) -> None:
    """Even a store an earlier demo made: the demo never deletes or writes over rows."""
    if earlier == "demo":
        assert main(["demo", "--db", pg_url, "--plain"]) == 0
    else:
        assert main(["run", SCENARIO, "--db", pg_url]) == 0
    capsys.readouterr()
    before = {
        table: sorted(map(repr, sql(pg_url, f"SELECT * FROM {table}")))
        for table in sorted(tables(pg_url))
    }
    assert main(["demo", "--db", with_password(pg_url), "--plain"]) == 2
    line = refused(capsys, "demo")
    assert "already holds a turnkeeper store (1 session)" in line
    assert "runs only on an empty database" in line
    after = {
        table: sorted(map(repr, sql(pg_url, f"SELECT * FROM {table}")))
        for table in sorted(tables(pg_url))
    }
    assert after == before


def test_demo_refuses_an_empty_turnkeeper_store_too(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(pg_url)  # the schema, no session
    assert main(["demo", "--db", pg_url, "--plain"]) == 2
    assert "already holds a turnkeeper store (0 sessions)" in refused(capsys, "demo")
    assert sql(pg_url, "SELECT count(*) FROM sessions") == [(0,)]
