"""A ``crash`` or ``restart`` at any event of any library scenario ends the run, in bounded time.

For every scenario of ``docs/scenarios`` and every ``persisted`` event k of its unkilled run,
the scenario is run again with one more action, ``crash`` (and, separately, ``restart``) at
``{ event = "persisted", nth = k }``. Whatever the run then makes of the scenario's own
expectations, it must *end*: an exit code 0, 1 or 3 within a real-time guard. A hang (the
guard fires) or an exception escaping ``run_scenario`` is the failure.

``make test`` runs every persisted event on the in-memory store and a sample on SQLite and on
PostgreSQL;
``TURNKEEPER_FUZZ=full`` (``make fuzz``) runs every persisted event on SQLite too, and every
event of every kind (not only ``persisted``) on the in-memory store.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from agent_session.harness.runner import run_scenario
from persistence import MemoryStore, SqliteStore, Store
from persistence.postgres import PostgresStore
from tests.scenarios.sweep_kit import FULL, library, loaded, run_guarded, with_action

if TYPE_CHECKING:
    from collections.abc import Callable

#: SQLite runs in ``make test``: the scenarios whose crash lands while a tool runs.
SQLITE_SAMPLE = ("crash-during-tool", "tool-deadline-timed-out", "user-stop-during-tool")


@dataclass(frozen=True)
class Point:
    """One trial: ``op`` at the ``nth`` trace event named ``event`` of ``scenario``."""

    scenario: str
    op: str
    event: str
    nth: int


@cache
def unkilled_events(name: str) -> tuple[str, ...]:
    result = anyio.run(run_scenario, loaded(name), MemoryStore())
    assert result.exit_code == 0, (name, result.error, result.failures)
    return tuple(line["event"] for line in result.trace)


def points(*, every_event: bool) -> list[Point]:
    found: list[Point] = []
    for path in library():
        seen: Counter[str] = Counter()
        for event in unkilled_events(path.stem):
            seen[event] += 1
            if every_event or event == "persisted":
                found.extend(Point(path.stem, op, event, seen[event]) for op in OPS)
    return found


OPS = ("crash", "restart")


def trial(point: Point, store: Store) -> int:
    faulted = with_action(loaded(point.scenario), point.event, point.nth, {"op": point.op})
    result = anyio.run(run_guarded, faulted, store)
    assert result.exit_code in (0, 1, 3), point
    if result.exit_code == 3:  # an error says what failed, in one line
        assert result.error, point
        assert "\n" not in result.error, (point, result.error)
    crashed = any(line["event"] == "crash" for line in result.trace)
    assert crashed or point.op == "restart" or result.exit_code == 3, (point, result.error)
    return result.exit_code


#: In ``make test``: every n-th point of the every-event sweep (all of them when FULL).
EVENT_SAMPLE_EVERY = 13


def test_a_crash_or_restart_at_every_persisted_event_ends_the_run() -> None:
    outcomes: Counter[int] = Counter()
    for point in points(every_event=False):
        outcomes[trial(point, MemoryStore())] += 1
    assert sum(outcomes.values()) >= 200, outcomes


def test_a_crash_or_restart_while_a_tool_runs_ends_the_run_on_sqlite(tmp_path: Path) -> None:
    chosen = [p for p in points(every_event=False) if FULL or p.scenario in SQLITE_SAMPLE]
    assert chosen
    for index, point in enumerate(chosen):
        trial(point, SqliteStore(tmp_path / f"{index}.db"))


def test_a_crash_or_restart_while_a_tool_runs_ends_the_run_on_postgresql(
    fresh_pg_url: Callable[[], str],
) -> None:
    """The same sample on a real PostgreSQL server: each trial in a schema of its own."""
    chosen = [p for p in points(every_event=False) if FULL or p.scenario in SQLITE_SAMPLE]
    assert chosen
    for point in chosen:
        trial(point, PostgresStore(fresh_pg_url()))


def test_a_crash_or_restart_at_every_event_of_any_kind_ends_the_run() -> None:
    chosen = list(points(every_event=True))
    for point in chosen if FULL else chosen[::EVENT_SAMPLE_EVERY]:  # all of them: make fuzz
        trial(point, MemoryStore())


def test_a_crash_while_the_next_engine_recovers_ends_the_run() -> None:
    # The second receipt of crash-during-tool is the one the recovering engine writes while
    # it opens: a crash there once escaped as ProcessCrashed from opening the sessions.
    point = Point("crash-during-tool", "crash", "receipt", 2)
    assert trial(point, MemoryStore()) in (0, 1)


def test_a_crashed_engines_refused_writes_are_not_a_failure_of_the_run() -> None:
    # hard-stop: a crash inside the stream-abort's emission leaves a task that goes on to
    # write; the sealed store refuses it, which is the crash, not an engine failure.
    point = Point("hard-stop", "crash", "stream-abort", 1)
    assert trial(point, MemoryStore()) in (0, 1)
