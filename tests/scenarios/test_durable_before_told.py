"""Decide, persist, tell: no event reports a continuation's fate before the write that makes it
durable has committed (issue 11, PS-6, R60).

Over every scenario of the library, in memory and on SQLite: an ``owed`` comes right after the
``persisted cut`` that made the cut record durable, and a ``continuation-ended`` right after
the ``persisted cut-void`` that ended the record. A crash between the write and the event then
loses only the telling, never the fact: recovery reads the record as the event would have said.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_session.cli import main

LIBRARY = Path(__file__).resolve().parents[2] / "docs" / "scenarios"
FILES = sorted(LIBRARY.glob("*.toml"))

#: The event that tells a fact, and the ``persisted`` write that must have committed just before.
TOLD_AFTER = {"owed": "cut", "continuation-ended": "cut-void"}


def trace_of(path: Path, tmp_path: Path, *store: str) -> list[dict[str, object]]:
    trace = tmp_path / "trace.jsonl"
    assert main(["run", *store, "--trace", str(trace), str(path)]) == 0
    return [json.loads(line) for line in trace.read_bytes().splitlines()]


def untold_before_durable(lines: list[dict[str, object]]) -> list[str]:
    """Every telling event whose previous line is not its commit, as ``seq event``."""
    found = []
    retried = set()  # a startup retry's cut: no record stands for it, nothing to write first
    for before, line in zip([None, *lines], lines, strict=False):
        if line["event"] == "recovered" and line["action"] == "retry":
            retried.add(line["cut"])
        what = TOLD_AFTER.get(str(line["event"]))
        if what is None or line.get("cut") in retried:
            continue
        durable = (
            before is not None
            and before["event"] == "persisted"
            and before["what"] == what
            and before["session"] == line["session"]
        )
        if not durable:
            found.append(f"{line['seq']} {line['event']} {line.get('cut')}")
    return found


@pytest.mark.parametrize("store", [(), ("--memory",)], ids=["sqlite", "memory"])
@pytest.mark.parametrize("path", FILES, ids=[path.stem for path in FILES])
def test_r60_ps6_a_continuations_fate_is_told_only_after_it_is_durable(
    path: Path, store: tuple[str, ...], tmp_path: Path
) -> None:
    lines = trace_of(path, tmp_path, *store)
    assert untold_before_durable(lines) == []


def test_the_check_catches_an_event_told_before_its_write() -> None:
    lines: list[dict[str, object]] = [
        {"seq": 1, "event": "continuation-ended", "session": "s", "cut": "s/1"},
        {"seq": 2, "event": "persisted", "session": "s", "what": "cut-void", "id": "s:r2"},
        {"seq": 3, "event": "persisted", "session": "s", "what": "cut", "id": "s:r4"},
        {"seq": 4, "event": "owed", "session": "s", "cut": "s/2"},
    ]
    assert untold_before_durable(lines) == ["1 continuation-ended s/1"]
