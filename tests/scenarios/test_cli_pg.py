"""The commands on a PostgreSQL URL (``--db postgresql://...``, ``docs/cli.md``).

``run`` leaves its rows in the database; ``inspect`` shows each session's lease (owner, epoch,
expiry, whether it ran out) and reports a malformed one as damage (LS-7); ``receipts`` and
``resolve`` work as on SQLite (a receipt whose session a live engine holds is resolved by
that engine, asked: LS-10); ``migrate`` brings an older schema to this one. The URL's
password never shows in any output.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from agent_session import Engine, EngineConfig
from agent_session.cli import main
from agent_session.harness import inspection
from agent_session.harness.inspection import resolve_command
from persistence import _postgres
from persistence.postgres import PostgresStore, pg_schema_version
from tests.pg_kit import sql, tables

from .pg_kit import SECRET, lease, seed, with_password

LIBRARY = Path(__file__).resolve().parents[2] / "docs" / "scenarios"
#: Crashes mid-tool: leaves session ``dev`` and an indeterminate receipt ``dev/1/2/0``.
CRASH = str(LIBRARY / "crash-during-tool.toml")
OP = "dev/1/2/0"
#: Owner ids as turnkeeper mints them (``host/pid/random``).
LIVE_OWNER = "web-3/4242/0123456789ab"
GONE_OWNER = "web-9/77/fedcba987654"


def outputs(capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert SECRET not in captured.out + captured.err
    return captured.out, captured.err


def test_run_on_a_postgresql_url_passes_and_leaves_its_rows(
    pg_url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = with_password(pg_url)
    trace = tmp_path / "t.jsonl"
    assert main(["run", CRASH, "--db", url, "--json", "--trace", str(trace)]) == 0
    out, _ = outputs(capsys)
    assert json.loads(out)["passed"] is True
    assert any(json.loads(line)["event"] == "crash" for line in trace.read_text().splitlines())
    assert sql(pg_url, "SELECT id, owner FROM sessions") == [("dev", None)]  # released
    assert sorted(sql(pg_url, "SELECT op_id, state FROM operations")) == [
        ("dev/1/1/0", "completed"),
        (OP, "indeterminate"),
    ]
    assert sql(pg_url, "SELECT count(*) FROM history_rows WHERE session = 'dev'")[0][0] > 3


def test_ls7_inspect_shows_each_lease_and_reports_a_malformed_one(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(pg_url, "ada", "bob", "cyd", "dan")
    lease(pg_url, "ada", owner=LIVE_OWNER, epoch=7, expires="now() + interval '1 hour'")
    lease(pg_url, "bob", owner=GONE_OWNER, epoch=3, expires="now() - interval '1 minute'")
    lease(pg_url, "cyd", owner=None, epoch=4, expires="NULL")
    lease(pg_url, "dan", owner="someone", epoch=2, expires="now() + interval '1 hour'")
    url = with_password(pg_url).replace("postgresql://", "postgres://", 1)

    assert main(["inspect", "--db", url]) == 4
    out, err = outputs(capsys)
    assert "store: postgres://postgres:[redacted]@" in out
    assert "integrity: not checked (PostgreSQL)" in out
    assert "leases: 4, 1 malformed" in out
    lines = {line.split(":", 1)[0].strip(): line.strip() for line in out.splitlines()}
    assert lines["ada"].startswith(f"ada: owner {LIVE_OWNER}, epoch 7, expires 20")
    assert lines["ada"].endswith("(live)")
    assert lines["bob"].startswith(f"bob: owner {GONE_OWNER}, epoch 3, expired 20")
    assert lines["bob"].endswith("(ran out: another process may take it)")
    assert lines["cyd"] == "cyd: unowned, epoch 4"
    assert lines["dan"] == (
        "dan: malformed, never taken: owner 'someone' is not an owner id turnkeeper mints"
    )
    assert err.splitlines() == [
        "turnkeeper inspect: malformed lease of session dan: owner 'someone' is not an owner "
        "id turnkeeper mints"
    ]

    assert main(["inspect", "--db", url, "--json"]) == 4
    report = json.loads(outputs(capsys)[0])
    assert report["integrity"] == {"check": None, "ok": None, "problems": []}
    by_id = {entry["session"]: entry for entry in report["leases"]}
    assert list(by_id) == ["ada", "bob", "cyd", "dan"]
    assert by_id["ada"]["owner"] == LIVE_OWNER
    assert (by_id["ada"]["epoch"], by_id["ada"]["expired"], by_id["ada"]["problem"]) == (
        7,
        False,
        None,
    )
    assert by_id["bob"]["expired"] is True
    assert by_id["bob"]["expires"].startswith("20")
    assert by_id["cyd"] == {
        "session": "cyd",
        "owner": None,
        "epoch": 4,
        "expires": None,
        "expired": None,
        "problem": None,
    }
    assert "not an owner id" in by_id["dan"]["problem"]
    assert report["corrupt"] == [
        {"at": "malformed lease of session dan", "detail": by_id["dan"]["problem"]}
    ]

    assert main(["inspect", "--db", url, "ada", "--json"]) == 0
    assert [entry["session"] for entry in json.loads(outputs(capsys)[0])["leases"]] == ["ada"]
    # Nothing was written, nothing taken: the rows are as the test left them.
    assert sql(pg_url, "SELECT id, owner, epoch FROM sessions ORDER BY id") == [
        ("ada", LIVE_OWNER, 7),
        ("bob", GONE_OWNER, 3),
        ("cyd", None, 4),
        ("dan", "someone", 2),
    ]


def test_ls7_a_malformed_epoch_is_reported_with_its_session(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(pg_url, "eve")
    lease(pg_url, "eve", owner=LIVE_OWNER, epoch=-4, expires="now() + interval '1 hour'")
    assert main(["inspect", "--db", pg_url]) == 4
    out, err = outputs(capsys)
    assert "eve: malformed, never taken: epoch -4 is not a count from 0" in out
    assert err.strip() == (
        "turnkeeper inspect: malformed lease of session eve: epoch -4 is not a count from 0"
    )


def test_receipts_and_resolve_on_postgresql(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = with_password(pg_url)
    assert main(["run", CRASH, "--db", url]) == 0
    outputs(capsys)
    assert main(["receipts", "--db", url, "--state", "indeterminate", "--json"]) == 0
    listed = json.loads(outputs(capsys)[0])
    assert [r["op_id"] for r in listed["receipts"]] == [OP]
    assert main(["receipts", "--db", url]) == 0
    assert OP in outputs(capsys)[0]

    note = "checked the v42 schema by hand: applied"
    assert main(["resolve", OP, "--db", url, "--as", "completed", "--note", note]) == 0
    out, _ = outputs(capsys)
    assert out.strip() == (
        f"turnkeeper resolve: {OP} resolved as completed: completed (operator_completed), "
        "by operator"
    )
    assert main(["receipts", "--db", url, "--json"]) == 0
    settled = {r["op_id"]: r for r in json.loads(outputs(capsys)[0])["receipts"]}[OP]
    assert (settled["state"], settled["resolved_by"], settled["note"]) == (
        "completed",
        "operator",
        note,
    )
    assert sql(pg_url, "SELECT owner FROM sessions") == [(None,)]  # the lease given back

    assert main(["resolve", OP, "--db", url, "--as", "failed", "--note", "again"]) == 2
    _, err = outputs(capsys)
    assert "it is completed" in err
    assert len(err.splitlines()) == 1


def test_ls10_resolve_asks_a_holder_that_never_answers_and_withdraws(
    pg_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["run", CRASH, "--db", pg_url]) == 0
    outputs(capsys)
    epoch = sql(pg_url, "SELECT epoch FROM sessions")[0][0]
    lease(pg_url, "dev", owner=LIVE_OWNER, epoch=epoch, expires="now() + interval '1 hour'")
    monkeypatch.setattr(inspection, "HOLDER_WAIT_S", 0.3)  # a holder that never answers
    assert main(["resolve", OP, "--db", pg_url, "--as", "not-run", "--note", "looked"]) == 2
    _, err = outputs(capsys)
    assert len(err.splitlines()) == 1
    assert err.strip() == (
        "turnkeeper resolve: the holder of session 'dev' did not answer the resolve in 0.3s: "
        "it was withdrawn and not carried out"
    )
    assert sql(pg_url, f"SELECT state FROM operations WHERE op_id = '{OP}'") == [("indeterminate",)]
    assert sql(pg_url, "SELECT owner, epoch FROM sessions") == [(LIVE_OWNER, epoch)]
    assert sql(pg_url, "SELECT count(*) FROM requests") == [(0,)]


@pytest.mark.timeout(60)
async def test_ls10_resolve_is_carried_out_by_the_engine_that_holds_the_session(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await anyio.to_thread.run_sync(main, ["run", CRASH, "--db", pg_url]) == 0
    outputs(capsys)
    assert (OP, "indeterminate") in sql(pg_url, "SELECT op_id, state FROM operations")
    config = EngineConfig(recover_at_start=False, claim_every_s=3_600.0)
    async with Engine(store=PostgresStore(pg_url), models={}, config=config) as holder:
        epoch = await holder.store.acquire("dev")  # type: ignore[attr-defined]
        code = await resolve_command(pg_url, OP, "not-run", "nothing ran: the log is empty")
        assert code == 0
        out, _ = outputs(capsys)
        assert out.strip() == (
            f"turnkeeper resolve: {OP} resolved as not-run: cancelled (operator_not_run), "
            "by operator"
        )
        # Written by the holder, under its epoch; the lease stays the holder's.
        assert sql(pg_url, f"SELECT state, epoch FROM operations WHERE op_id = '{OP}'") == [
            ("cancelled", epoch)
        ]
        assert sql(pg_url, "SELECT epoch FROM sessions") == [(epoch,)]
        assert "dev" in holder.store.leases.held  # type: ignore[attr-defined]
    assert sql(pg_url, "SELECT count(*) FROM requests") == [(0,)]


def _one_more_migration(monkeypatch: pytest.MonkeyPatch) -> int:
    """This code, as a newer turnkeeper that knows one more PostgreSQL migration."""
    known = _postgres.pg_migrations()
    newer = (*known, (len(known) + 1, "0099_notes.sql", "CREATE TABLE tk_notes (id int);"))
    monkeypatch.setattr(_postgres, "pg_migrations", lambda: newer)
    return len(newer)


def test_migrate_brings_an_older_postgresql_schema_to_this_one(
    pg_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(pg_url, "dev")
    old = pg_schema_version()
    url = with_password(pg_url)
    new = _one_more_migration(monkeypatch)

    shown = url.replace(SECRET, "[redacted]")
    for command in (["inspect"], ["receipts"], ["inspect", "--json"]):
        assert main([*command, "--db", url]) == 2
        _, err = outputs(capsys)
        assert err.splitlines() == [
            f"turnkeeper {command[0]}: {shown} has schema version {old} and needs migrating to "
            f"{new}; read-only commands never migrate: run `turnkeeper migrate --db "
            f"{shlex.quote(shown)}`"
        ]
    assert "tk_notes" not in tables(pg_url)

    assert main(["migrate", "--db", url]) == 0
    out, _ = outputs(capsys)
    assert out.strip().endswith(f"migrated from schema version {old} to {new}")
    assert out.startswith("turnkeeper migrate: postgresql://postgres:[redacted]@")
    assert "tk_notes" in tables(pg_url)
    assert sql(pg_url, "SELECT version FROM schema_version") == [(new,)]
    assert main(["migrate", "--db", url]) == 0
    assert outputs(capsys)[0].strip().endswith(f"is at schema version {new} already")
    assert main(["inspect", "--db", url]) == 0
    assert "sessions: dev" in outputs(capsys)[0]


def test_migrate_creates_nothing_in_an_empty_database(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["migrate", "--db", pg_url]) == 2
    _, err = outputs(capsys)
    assert len(err.splitlines()) == 1
    assert "is not a turnkeeper store: an empty database" in err
    assert tables(pg_url) == set()
