"""A huge stored value is never shown whole: text ``inspect`` and log lines cut it, saying its size.

Text ``inspect`` once took over 60 s on a 20 MB value (rich wraps a long line into lines of
the console's width and re-partitions the rest of the text for each one: quadratic), and the
recovery log carried the whole 20 MB string. ``inspect --json`` keeps a sound value whole (it
is the machine-readable report); a damaged one is reported with its size instead.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from contextlib import closing
from typing import TYPE_CHECKING

import anyio
import msgspec
import pytest

from agent_session import Engine, Recovered
from agent_session.cli import main
from persistence import SqliteStore
from stream_manager import ScriptedModel
from tests.agent_session.support import X
from tests.agent_session.test_recovery import seed
from tests.scenarios.test_cli_resolve import STUCK, make_store

if TYPE_CHECKING:
    from pathlib import Path

HUGE = 20 * 1024 * 1024
#: What text output may print about one value, at most (a few hundred characters and its size).
BOUND = 4096


def _store(path: Path, statement: str, value: str) -> None:
    async def both() -> None:
        await seed(SqliteStore(path), "big")
        await seed(SqliteStore(path), "small")

    anyio.run(both)
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute(statement, (value,))


def test_a_long_model_name_is_cut_in_text_inspect_and_whole_in_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sound cut record whose model name is 60,000 characters (within what a record holds)."""
    path = tmp_path / "tk.db"
    name = "m" * 60_000
    _store(
        path,
        "UPDATE history_rows SET cut = CAST(json_set(cut, '$.model', ?) AS BLOB) "
        "WHERE session = 'big' AND cut_state = 'owed'",
        name,
    )
    assert main(["inspect", "--db", str(path)]) == 0
    out, err = capsys.readouterr()
    assert len(out + err) < 2 * BOUND, len(out + err)
    assert "(60,000 bytes, cut)" in out, out
    assert main(["inspect", "--db", str(path), "--json"]) == 0
    assert name in capsys.readouterr().out


def test_a_20_mb_damaged_value_is_cut_in_text_inspect_with_its_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tk.db"
    _store(path, "UPDATE history_rows SET kind = ? WHERE session = 'big' AND seq = 1", "k" * HUGE)
    for command in (["inspect"], ["inspect", "--json"], ["inspect", "big"]):
        assert main([command[0], "--db", str(path), *command[1:]]) == 4
        out, err = capsys.readouterr()
        assert len(out + err) < 2 * BOUND, (command, len(out), len(err))
        assert "$.kind" in err, err
        assert f"({HUGE + 2:,} bytes, cut)" in err, err  # its repr: the quotes count


async def _start(path: Path) -> list[Recovered]:
    told: list[Recovered] = []
    engine = Engine(
        store=SqliteStore(path),
        models={"M": ScriptedModel("M", [X("answered")])},
        observers=[lambda e: told.append(e) if isinstance(e, Recovered) else None],
    )
    with anyio.fail_after(60):
        async with engine:
            await engine.wait_idle()
    return told


@pytest.mark.parametrize(
    ("damage", "value"),
    [
        ("UPDATE history_rows SET kind = ? WHERE session = 'big' AND seq = 2", "k" * HUGE),
        ("UPDATE history_rows SET session = ? WHERE session = 'big' AND seq = 2", "s" * HUGE),
        (
            "UPDATE history_rows SET cut = CAST(json_set(cut, '$.model', ?) AS BLOB) "
            "WHERE session = 'big' AND cut_state = 'owed'",
            "m" * HUGE,
        ),
    ],
    ids=["kind", "session", "cut-model"],
)
def test_a_recovery_log_line_stays_bounded_when_the_damaged_value_is_huge(
    damage: str, value: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tk.db"
    _store(path, damage, value)
    with caplog.at_level(logging.INFO):
        told = anyio.run(_start, path)
    assert [e.session for e in told if e.action == "resume"] == ["small"], told
    abandoned = [e for e in told if e.action == "abandon"]
    assert abandoned, told
    assert all(len(e.why) < BOUND for e in abandoned), [len(e.why) for e in abandoned]
    assert any("bytes" in e.why for e in abandoned), abandoned  # its size is said
    sizes = [len(record.getMessage()) for record in caplog.records]
    assert max(sizes) < BOUND, sizes


def test_a_long_receipt_explanation_is_cut_in_text_receipts_and_whole_in_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A receipt's explanation of 50,000 characters (a tool server's long error, say)."""
    path = tmp_path / "tk.db"
    explanation = "the server said: " + "x" * 49_983
    make_store(path, msgspec.structs.replace(STUCK, explanation=explanation))
    assert main(["receipts", "--db", str(path)]) == 0
    out, err = capsys.readouterr()
    assert len(out + err) < 2 * BOUND, len(out + err)
    assert "(50,000 bytes, cut)" in out, out
    assert main(["receipts", "--db", str(path), "--json"]) == 0
    (record,) = json.loads(capsys.readouterr().out)["receipts"]
    assert record["explanation"] == explanation
