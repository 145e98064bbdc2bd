"""``turnkeeper run`` and ``turnkeeper demo``: options, outputs and exit codes (``docs/cli.md``)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agent_session.cli import main

BASIC = """
name = "basic"
[[models]]
id = "m"
[[tools]]
name = "bash"
[[sessions]]
id = "s1"
model = "m"
[scripts.m]
steps = [ { tool_calls = [{ tool = "bash" }] }, { text = "done" } ]
[[actions]]
at = "start"
do = { op = "send", session = "s1", text = "go" }
[expect]
phases = { s1 = "idle" }
streams = { s1 = 1 }
"""


def write(tmp_path: Path, text: str, name: str = "s.toml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_run_passes_and_prints_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--json", write(tmp_path, BASIC)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["passed"] is True
    assert summary["exit"] == 0
    assert summary["events"] > 5


def test_run_trace_to_stdout_is_json_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--memory", "--trace", "-", write(tmp_path, BASIC)]) == 0
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert [line["seq"] for line in lines] == list(range(1, len(lines) + 1))
    assert all(list(line)[:4] == ["seq", "t", "event", "session"] for line in lines)
    assert "PASS" in captured.err  # the human report stays off the trace


def test_failed_expectation_exits_1_and_says_which(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, BASIC.replace("streams = { s1 = 1 }", "streams = { s1 = 2 }"))
    assert main(["run", path]) == 1
    assert "streams.s1: expected 2 stream-start, got 1" in capsys.readouterr().out


def test_invalid_scenario_exits_2_naming_the_field_and_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write(tmp_path, BASIC, "good.toml")
    bad = write(tmp_path, BASIC.replace('model = "m"', 'model = "nope"'), "bad.toml")
    db = tmp_path / "run.db"
    assert main(["run", bad, "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: $.sessions[0].model" in err
    assert not db.exists()  # the engine never started
    assert main(["run", good, bad]) == 2
    assert "PASS" not in capsys.readouterr().out


def test_script_running_out_exits_3_naming_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, BASIC.replace(', { text = "done" }', ""))
    assert main(["run", path]) == 3
    assert "model 'm' ran out of scripted steps" in capsys.readouterr().out


def test_op2_a_hanging_tool_times_out_and_the_turn_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = BASIC.replace('name = "bash"', 'name = "bash"\nhang = true\ndeadline_ms = 500')
    path = write(tmp_path, text.replace("streams = { s1 = 1 }", "receipts = { timed_out = 1 }"))
    assert main(["run", path, "--trace", str(tmp_path / "t.jsonl")]) == 0, capsys.readouterr()
    lines = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    receipt = next(line for line in lines if line["event"] == "receipt")
    assert (receipt["state"], receipt["acknowledged"], receipt["t"]) == ("timed_out", True, 500)


def test_virtual_time_limit_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slow = BASIC.replace('name = "bash"', 'name = "bash"\nduration_ms = 5000')
    path = write(tmp_path, slow + "[limits]\nmax_virtual_ms = 1000\n")
    assert main(["run", path]) == 3
    assert "limits.max_virtual_ms" in capsys.readouterr().out


def test_db_takes_one_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one, two = write(tmp_path, BASIC, "a.toml"), write(tmp_path, BASIC, "b.toml")
    assert main(["run", one, two, "--db", str(tmp_path / "x.db")]) == 2
    assert "--db takes one scenario" in capsys.readouterr().err


def test_demo_resumes_the_stranded_turn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db, trace = tmp_path / "demo.db", tmp_path / "demo.jsonl"
    assert main(["demo", "--db", str(db), "--trace", str(trace), "--plain"]) == 0
    out = capsys.readouterr().out
    assert "verdict: the turn cut for a withdrawn wake was resumed under its 6" in out
    events = [json.loads(line)["event"] for line in trace.read_text().splitlines()]
    assert events.index("owed") < events.index("withdrawn") < events.index("continuation-ended")
    assert main(["demo", "--db", str(db), "--plain"]) == 0  # started fresh on its own store
    with sqlite3.connect(db) as conn:
        assert conn.execute("select count(*) from sessions").fetchone() == (1,)


def test_demo_refuses_to_replace_a_foreign_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    precious = tmp_path / "notes.db"
    precious.write_bytes(b"my notes, not a database")
    assert main(["demo", "--db", str(precious), "--plain"]) == 2
    assert "refusing to replace it" in capsys.readouterr().err
    assert precious.read_bytes() == b"my notes, not a database"


def test_receipts_and_inspect_read_a_demo_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "demo.db"
    assert main(["demo", "--db", str(db), "--plain"]) == 0
    capsys.readouterr()
    before = db.read_bytes()
    assert main(["receipts", "--db", str(db), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert [r["state"] for r in found["receipts"]] == ["completed", "completed"]
    assert {r["capability"] for r in found["receipts"]} == {"client:bash", "client:task_await"}
    assert main(["receipts", "--db", str(db), "--state", "indeterminate"]) == 0
    assert "no receipts" in capsys.readouterr().out
    assert main(["inspect", "--db", str(db), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [s["id"] for s in report["sessions"]] == ["agent"]
    assert report["owed"] == []
    assert main(["inspect", "--db", str(db)]) == 0
    assert "owed continuations: none" in capsys.readouterr().out
    assert db.read_bytes() == before  # read-only: nothing written


def test_receipts_refuses_a_file_that_is_not_a_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "notes.db"
    notes.write_bytes(b"just notes")
    assert main(["receipts", "--db", str(notes)]) == 2
    assert "not a SQLite database" in capsys.readouterr().err
    assert notes.read_bytes() == b"just notes"
    assert main(["inspect", "--db", str(tmp_path / "missing.db")]) == 2
    assert main(["receipts", "--db", str(notes), "--state", "weird"]) == 2


# ---------------------------------------------------------------- a reader that goes away


def _with_closed_stdout(*args: str) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m agent_session ARGS`` with a stdout pipe whose reader already left."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write now fails with EPIPE: deterministic, no race with a reader
    try:
        return subprocess.run(
            [sys.executable, "-m", "agent_session", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            check=False,
            timeout=120,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    "command",
    [
        ("inspect", "--json"),
        ("inspect",),
        ("receipts",),
        ("receipts", "--json"),
        ("run",),
        ("demo",),
    ],
)
def test_a_command_whose_reader_goes_away_ends_quietly(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    db = tmp_path / "store.db"
    assert main(["run", "--db", str(db), write(tmp_path, BASIC)]) == 0
    if command == ("run",):
        args = ["run", "--memory", "--trace", "-", write(tmp_path, BASIC, "again.toml")]
    elif command == ("demo",):
        args = ["demo", "--plain", "--db", str(tmp_path / "demo.db")]
    else:
        args = [*command, "--db", str(db)]
    done = _with_closed_stdout(*args)
    assert done.stderr == b""  # no traceback, no "Exception ignored" at exit
    assert done.returncode == 141  # 128 + SIGPIPE, as shell tools report a closed pipe
