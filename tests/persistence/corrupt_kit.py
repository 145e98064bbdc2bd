"""Damaged stores for the corrupt-store suite: real stores made by library scenarios, a table
of damages applied to copies of them, and the checks every read path must pass on each.

Two base stores, each made once per test session by running a scenario of ``docs/scenarios``:

* ``owed``: ``crash-mid-turn.toml`` whose process dies as the cut row commits; no later write
  reaches the file, so the store ends with the session's cut still owed (a recovery's input);
* ``plain``: ``withdrawn-wake.toml`` run to its end (sessions, rows, consumed cut, envelopes,
  receipts).

A damage is a function of the copied store's path that returns the path the commands get (a
folder or a missing path for the damages of the path itself).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio

from agent_session.harness.loader import load_scenario
from agent_session.harness.runner import run_scenario
from persistence import SqliteStore
from stream_manager import Persisted
from tests.operations.support import LedgerStore

SCENARIOS = Path(__file__).resolve().parents[2] / "docs" / "scenarios"
PAGE = 4096

Damage = Callable[[Path], Path]
#: A damage of one session's rows: the session's name gives the damage.
RowDamage = Callable[[str], Damage]


async def make_owed(path: Path) -> None:
    """``crash-mid-turn``, its process dying as the cut row commits: the cut stays owed."""
    scenario = load_scenario(SCENARIOS / "crash-mid-turn.toml")
    ledger = LedgerStore(SqliteStore(path))

    def die_at_the_cut(event: object) -> None:
        if isinstance(event, Persisted) and event.what == "cut":
            ledger.crash()  # no later write reaches the file

    await run_scenario(scenario, ledger, observers=(die_at_the_cut,))


async def make_plain(path: Path) -> None:
    """``withdrawn-wake`` run to its end."""
    result = await run_scenario(load_scenario(SCENARIOS / "withdrawn-wake.toml"), SqliteStore(path))
    assert result.exit_code == 0, result


def build_bases(folder: Path) -> dict[str, Path]:
    """Both base stores in ``folder`` (no WAL left beside them: they were closed cleanly)."""
    bases = {"owed": folder / "owed.db", "plain": folder / "plain.db"}
    anyio.run(make_owed, bases["owed"])
    anyio.run(make_plain, bases["plain"])
    for path in bases.values():
        assert not Path(f"{path}-wal").exists()
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA quick_check").fetchone() == ("ok",)
        db.close()
    return bases


def digest(path: Path) -> str | None:
    """The file's SHA-256, ``None`` for anything that is not a file."""
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def beside(path: Path) -> set[str]:
    """The names in the path's folder (sidecars appearing are a write)."""
    return set(os.listdir(path.parent)) if path.parent.is_dir() else set()


# ---------------------------------------------------------------- damages


def sql(*statements: str, checks: bool = True) -> Damage:
    """Damage by SQL run on the file (check constraints off when ``checks`` is false)."""

    def damage(path: Path) -> Path:
        db = sqlite3.connect(path, isolation_level=None)
        try:
            if not checks:
                db.execute("PRAGMA ignore_check_constraints = ON")
            for statement in statements:
                db.execute(statement)
        finally:
            db.close()
        assert not Path(f"{path}-wal").exists()
        return path

    return damage


def zero_page(number: int | None) -> Damage:
    """Overwrite one page with zeros (``None``: the last page)."""

    def damage(path: Path) -> Path:
        data = bytearray(path.read_bytes())
        pages = len(data) // PAGE
        index = pages - 1 if number is None else min(number, pages) - 1
        data[index * PAGE : (index + 1) * PAGE] = bytes(PAGE)
        path.write_bytes(bytes(data))
        return path

    return damage


def scribble(seed: int, count: int = 8) -> Damage:
    """Overwrite ``count`` random bytes past the header (seeded)."""

    def damage(path: Path) -> Path:
        data = bytearray(path.read_bytes())
        rng = random.Random(seed)
        for _ in range(count):
            data[rng.randrange(100, len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data))
        return path

    return damage


def truncate(keep: float | int) -> Damage:
    """Cut the file short: a fraction of it, or a number of bytes."""

    def damage(path: Path) -> Path:
        data = path.read_bytes()
        size = int(len(data) * keep) if isinstance(keep, float) else keep
        path.write_bytes(data[:size])
        return path

    return damage


def replace_with(content: bytes) -> Damage:
    def damage(path: Path) -> Path:
        path.write_bytes(content)
        return path

    return damage


def a_folder(path: Path) -> Path:
    path.unlink()
    path.mkdir()
    return path


def missing_folder(path: Path) -> Path:
    return path.parent / "no-such-folder" / path.name


def missing_file(path: Path) -> Path:
    path.unlink()
    return path


def edit_cut(session: str, change: Callable[[dict[str, object]], None]) -> Damage:
    """Damage by editing the owed cut record of ``session`` as JSON (Python's big integers)."""

    def damage(path: Path) -> Path:
        db = sqlite3.connect(path, isolation_level=None)
        try:
            where = "WHERE session = ? AND cut_state = 'owed'"
            found = db.execute(f"SELECT cut FROM history_rows {where}", (session,)).fetchone()
            if found is None:  # nothing owed in this base: as _owed_sql, nothing to damage
                return path
            record = json.loads(found[0])
            change(record)
            edited = json.dumps(record).encode()
            db.execute(f"UPDATE history_rows SET cut = ? {where}", (edited, session))
        finally:
            db.close()
        return path

    return damage


def _owed_sql(assignment: str) -> RowDamage:
    return lambda session: sql(
        f"UPDATE history_rows SET {assignment} WHERE session = '{session}' AND cut_state = 'owed'"
    )


def _first_sql(assignment: str) -> RowDamage:
    return lambda session: sql(
        f"UPDATE history_rows SET {assignment} WHERE session = '{session}' AND seq = 1"
    )


#: A JSON array nested 5,000 deep (msgspec's decoder recurses into it).
DEEP = "[" * 5000 + "]" * 5000
#: ``{"model":"<0xff>"}``: JSON whose string is not UTF-8.
NOT_UTF8 = "x'7b226d6f64656c223a22ff227d'"

#: Damages of one session's rows that once stopped every session in the store (a raw
#: ``RecursionError``, a refused store, a session left preparing, a forfeited turn) or were
#: read without a word; each must stop only its own session (test_corrupt_store).
ROW_DAMAGES: dict[str, RowDamage] = {
    "cut-nested-deep": _owed_sql(
        f"""cut = CAST('{{"deep":{DEEP},"remaining":1,"model":"m","requested_model":"m"}}' """
        "AS BLOB)"
    ),
    "cut-text-not-utf8": _owed_sql(f"cut = CAST({NOT_UTF8} AS TEXT)"),
    "cut-seq-int64-max": _owed_sql("seq = 9223372036854775807"),
    "cut-remaining-2-70": lambda session: edit_cut(session, lambda r: r.update(remaining=2**70)),
    "cut-remaining-over-ceiling": lambda session: edit_cut(
        session, lambda r: r.update(remaining=5000)
    ),
    "cut-stream-integer": _owed_sql("stream = 123"),
    "cut-stream-other-session": _owed_sql("stream = 'elsewhere/1'"),
    "body-text-not-utf8": _first_sql(f"body = CAST({NOT_UTF8} AS TEXT)"),
    "body-blob-not-utf8": _first_sql(f"body = {NOT_UTF8}"),
    "body-nested-deep": _first_sql(f"body = CAST('{{\"deep\":{DEEP}}}' AS BLOB)"),
}


def _queued(values: str) -> Damage:
    """A queued entry row of these raw values, written past every check (foreign keys off)."""
    return sql(f"INSERT INTO queued_entries VALUES ({values})")


def _abandon(session: str, reason: str, user_row: str = "NULL") -> Damage:
    """An abandon marker of these raw values for ``session`` (its reason, its user row)."""
    return sql(f"INSERT INTO abandon_markers VALUES ('{session}', {reason}, {user_row})")


#: A session ``idle`` whose history ends on a user row: a startup-retry tail.
_IDLE_TAIL = (
    'INSERT INTO sessions VALUES (\'idle\', CAST(\'{"id":"idle","model":"m"}\' AS BLOB))',
    "INSERT INTO history_rows VALUES "
    "('idle', 1, 'idle:r1', 'user', NULL, NULL, NULL, CAST('{\"text\":\"hi\"}' AS BLOB))",
)


def _tail_abandon(reason: str, user_row: str = "'idle:r1'") -> Damage:
    """The ``idle`` tail, its abandon marker of these raw values."""
    marker = f"INSERT INTO abandon_markers VALUES ('idle', {reason}, {user_row})"
    return sql(*_IDLE_TAIL, marker)


OWED = "WHERE cut_state = 'owed'"
CUT_ROW = "WHERE cut IS NOT NULL"


@dataclass(frozen=True)
class Case:
    """One damage, and what ``inspect`` (every session) must exit with on it.

    ``inspect`` exits 0 for a sound store, 2 when it refuses the path, 4 when it read a
    damaged store and reported the damage (docs/cli.md). ``names`` must appear in what it
    printed (the table, key and field of a damaged value, or what is wrong with the path).
    """

    damage: Damage
    inspect_exit: int
    names: tuple[str, ...] = ()


#: Every damage of the bounded suite (``make test``), by name.
CASES: dict[str, Case] = {
    "cut-json": Case(
        sql(f"UPDATE history_rows SET cut = x'7b22' {OWED}"), 4, ("history_rows[dev/dev:r2]",)
    ),
    "cut-remaining-text": Case(
        sql(f"UPDATE history_rows SET cut = json_set(cut, '$.remaining', 'three') {OWED}"),
        4,
        ("history_rows[dev/dev:r2]", "$.cut.remaining"),
    ),
    "cut-remaining-negative": Case(
        sql(f"UPDATE history_rows SET cut = json_set(cut, '$.remaining', -2) {OWED}"),
        4,
        ("$.cut.remaining",),
    ),
    "cut-blob-integer": Case(
        sql(f"UPDATE history_rows SET cut = 42 {OWED}"), 4, ("history_rows[dev/dev:r2]", "$.cut")
    ),
    "cut-state-unknown": Case(
        sql(f"UPDATE history_rows SET cut_state = 'bogus' {OWED}"),
        4,
        ("history_rows[dev/dev:r2]", "$.cut_state"),
    ),
    "cut-state-integer": Case(
        sql(f"UPDATE history_rows SET cut_state = 7 {OWED}"), 4, ("$.cut_state",)
    ),
    "cut-state-disagrees": Case(
        sql(f"UPDATE history_rows SET cut_state = 'consumed' {OWED}"), 4, ("$.cut.state",)
    ),
    "cut-without-state": Case(
        sql(f"UPDATE history_rows SET cut_state = NULL {OWED}", checks=False),
        4,
        ("$.cut.state",),
    ),
    "state-without-cut": Case(
        sql(f"UPDATE history_rows SET cut = NULL {OWED}", checks=False),
        4,
        ("history_rows[dev/dev:r2]", "$.cut.state"),
    ),
    "body-not-bytes": Case(
        sql("UPDATE history_rows SET body = 'text' WHERE seq = 1"), 4, ("$.body",)
    ),
    "body-not-json": Case(
        sql("UPDATE history_rows SET body = x'7b' WHERE seq = 1"), 4, ("history_rows[dev/dev:r1]",)
    ),
    "kind-unknown": Case(
        sql("UPDATE history_rows SET kind = 'robot' WHERE seq = 1"), 4, ("$.kind",)
    ),
    "seq-text": Case(sql("UPDATE history_rows SET seq = 'one' WHERE seq = 1"), 4, ("$.seq",)),
    "session-json": Case(sql("UPDATE sessions SET record = x'00ff'"), 4, ("sessions[dev]",)),
    "session-integer": Case(sql("UPDATE sessions SET record = 5"), 4, ("sessions[dev]",)),
    "session-other-id": Case(
        sql("UPDATE sessions SET record = json_set(record, '$.id', 'other')"),
        4,
        ("sessions[dev]", "$.id"),
    ),
    "envelope-json": Case(sql("UPDATE turn_envelopes SET record = x'7b'"), 4, ("turn_envelopes",)),
    "receipt-json": Case(
        sql("UPDATE operations SET record = x'7b' WHERE rowid = 1"), 4, ("operations[",)
    ),
    "receipt-state-column": Case(
        sql("UPDATE operations SET state = 'weird' WHERE rowid = 1"), 4, ("operations[",)
    ),
    "receipt-field": Case(
        sql("UPDATE operations SET record = json_set(record, '$.started_at', 'noon')"),
        4,
        ("$.started_at",),
    ),
    "receipt-integer": Case(sql("UPDATE operations SET record = 3"), 4, ("operations[",)),
    "schema-version-text": Case(
        sql("UPDATE schema_version SET version = 'x'"), 4, ("schema_version",)
    ),
    "schema-version-two-rows": Case(
        sql("INSERT INTO schema_version VALUES (2)"), 4, ("schema_version",)
    ),
    "schema-version-no-row": Case(sql("DELETE FROM schema_version"), 4, ("schema_version",)),
    "schema-version-zero": Case(sql("UPDATE schema_version SET version = 0"), 4, ("version 0",)),
    "schema-version-newer": Case(
        sql("UPDATE schema_version SET version = 99"), 2, ("schema version 99",)
    ),
    "schema-version-older": Case(
        sql("UPDATE schema_version SET version = 1"), 4, ("of a later version exists",)
    ),
    "schema-version-older-truly": Case(
        sql(
            "UPDATE schema_version SET version = 1",
            "DROP TABLE operations",
            "DROP TABLE handles",
            "DROP TABLE queued_entries",
            "DROP TABLE queue_versions",
            "DROP TABLE abandon_markers",
            "DROP TABLE partial_parts",
            "DROP TABLE retry_settings",
        ),
        2,
        ("needs migrating",),
    ),
    "schema-version-dropped": Case(
        sql("DROP TABLE schema_version"), 2, ("without turnkeeper's schema_version",)
    ),
    "table-operations-dropped": Case(sql("DROP TABLE operations"), 4, ("operations",)),
    "table-history-dropped": Case(sql("DROP TABLE history_rows"), 4, ("history_rows",)),
    "table-sessions-dropped": Case(sql("DROP TABLE sessions"), 4, ("sessions",)),
    "index-dropped": Case(sql("DROP INDEX history_rows_cut_state"), 0),
    "table-queued-dropped": Case(sql("DROP TABLE queued_entries"), 4, ("queued_entries",)),
    # The durable queue: a damaged stored entry is reported by key and field, never dropped.
    "queued-kind-unknown": Case(
        _queued("'dev', 'q9', 1, 'robot', x'7b7d'"), 4, ("queued_entries[dev/q9]", "$.kind")
    ),
    "queued-position-text": Case(
        _queued("'dev', 'q9', 'one', 'user', x'7b7d'"), 4, ("queued_entries[dev/q9]", "$.position")
    ),
    "queued-body-text": Case(
        _queued("'dev', 'q9', 1, 'wake', 'text'"), 4, ("queued_entries[dev/q9]", "$.body")
    ),
    "queued-body-not-utf8": Case(
        _queued(f"'dev', 'q9', 1, 'wake', CAST({NOT_UTF8} AS TEXT)"), 4, ("$.body",)
    ),
    "queued-body-undecodable": Case(  # sound columns; the body is no entry (the engine's read)
        _queued("'dev', 'q9', 1, 'user', x'7b7d'"), 4, ("queued_entries[dev/q9]", "$: Object")
    ),
    "queued-entry-id-blob": Case(
        _queued("'dev', x'7139', 1, 'user', x'7b7d'"), 4, ("queued_entries[dev/b'q9']",)
    ),
    "queue-version-text": Case(
        sql("INSERT OR REPLACE INTO queue_versions VALUES ('dev', 'three')"),
        4,
        ("queue_versions[dev]", "$.version"),
    ),
    # Abandon markers (PS-8): a damaged one is reported by session and field, never read as
    # "no marker". dev owes a cut (its load reports it); idle is a startup-retry tail (the
    # scan reports it too, and its recovery is abandoned).
    "abandon-reason-blob": Case(
        _abandon("dev", "x'61626f72746564'"), 4, ("abandon_markers[dev]", "$.reason")
    ),
    "abandon-reason-empty": Case(_abandon("dev", "''"), 4, ("abandon_markers[dev]", "$.reason")),
    "abandon-user-row-not-utf8": Case(
        _abandon("dev", "'aborted'", f"CAST({NOT_UTF8} AS TEXT)"),
        4,
        ("abandon_markers[dev]", "$.user_row"),
    ),
    "abandon-tail-reason-blob": Case(
        _tail_abandon("x'61626f72746564'"),
        4,
        ("skipped corrupt recovery of session idle", "abandon_markers[idle]: $.reason"),
    ),
    "abandon-tail-user-row-blob": Case(
        _tail_abandon("'aborted'", "x'6964'"), 4, ("abandon_markers[idle]: $.user_row",)
    ),
    # The auto-retry preference (AS-32): a damaged one reads as off and is reported by session
    # and field; dev owes a cut (its load reports it), idle is a startup-retry tail.
    "retry-pref-integer": Case(
        sql("INSERT INTO retry_settings VALUES ('dev', 7)"),
        4,
        ("damaged auto-retry preference of session dev", "retry_settings[dev]: $.auto_retry"),
    ),
    "retry-pref-tail-text": Case(
        sql(*_IDLE_TAIL, "INSERT INTO retry_settings VALUES ('idle', 'x')"),
        4,
        ("retry_settings[idle]: $.auto_retry: 'x' is not 0 or 1 (read as off)",),
    ),
    "page-2-zeroed": Case(zero_page(2), 4, ("damaged",)),
    "last-page-zeroed": Case(zero_page(None), 4, ("damaged",)),
    "header-zeroed": Case(zero_page(1), 2, ("not a SQLite database",)),
    "truncated-half": Case(truncate(0.5), 4, ("damaged",)),
    "truncated-to-header": Case(truncate(100), 4, ("damaged",)),
    "truncated-inside-header": Case(truncate(50), 4, ("damaged",)),
    "not-sqlite": Case(replace_with(b"just some notes\n" * 40), 2, ("not a SQLite database",)),
    "empty-file": Case(replace_with(b""), 2, ("empty",)),
    "a-directory": Case(a_folder, 2, ("is a directory",)),
    "missing-folder": Case(missing_folder, 2, ("no-such-folder",)),
    "missing-file": Case(missing_file, 2, ("no such file",)),
    "cut-nested-deep": Case(
        ROW_DAMAGES["cut-nested-deep"]("dev"), 4, ("history_rows[dev/dev:r2]", "$.cut")
    ),
    "cut-text-not-utf8": Case(
        ROW_DAMAGES["cut-text-not-utf8"]("dev"), 4, ("history_rows[dev/dev:r2]", "$.cut")
    ),
    "cut-seq-int64-max": Case(
        ROW_DAMAGES["cut-seq-int64-max"]("dev"), 4, ("history_rows[dev/dev:r2]", "$.seq")
    ),
    "cut-remaining-2-70": Case(
        ROW_DAMAGES["cut-remaining-2-70"]("dev"), 4, ("history_rows[dev/dev:r2]", "$.cut.remaining")
    ),
    # Within what a store holds, beyond this engine's turn ceiling (max_stream_steps 100):
    # inspect shows it owed; recovery leaves it owed, saying why.
    "cut-remaining-over-ceiling": Case(
        ROW_DAMAGES["cut-remaining-over-ceiling"]("dev"), 0, ("5000 steps",)
    ),
    "cut-stream-integer": Case(
        ROW_DAMAGES["cut-stream-integer"]("dev"), 4, ("history_rows[dev/dev:r2]", "$.stream")
    ),
    "cut-stream-other-session": Case(
        ROW_DAMAGES["cut-stream-other-session"]("dev"), 4, ("history_rows[dev/dev:r2]", "$.stream")
    ),
    "body-text-not-utf8": Case(
        ROW_DAMAGES["body-text-not-utf8"]("dev"), 4, ("history_rows[dev/dev:r1]", "$.body")
    ),
    "body-blob-not-utf8": Case(
        ROW_DAMAGES["body-blob-not-utf8"]("dev"), 4, ("history_rows[dev/dev:r1]",)
    ),
    "body-nested-deep": Case(
        ROW_DAMAGES["body-nested-deep"]("dev"), 4, ("history_rows[dev/dev:r1]",)
    ),
}


def fuzz_cases(pages: int) -> dict[str, Case]:
    """The fuller variant's extra damages: every page zeroed, seeded scribbles.

    Their outcome is not fixed in advance: each must end as 0, 2 or 4, cleanly.
    """
    extra: dict[str, Case] = {}
    for number in range(2, pages + 1):
        extra[f"page-{number}-zeroed"] = Case(zero_page(number), -1)
    for seed in range(40):
        extra[f"scribble-{seed}"] = Case(scribble(seed), -1)
    for fraction in (0.1, 0.25, 0.75, 0.9):
        extra[f"truncated-{fraction}"] = Case(truncate(fraction), -1)
    return extra


def copy_base(base: Path, folder: Path) -> Path:
    """A fresh copy of a base store, alone in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / "store.db"
    shutil.copyfile(base, copy)
    return copy
