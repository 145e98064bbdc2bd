"""A failed store write never wedges a session (issue 12: "failed writes are inputs").

For every library scenario, the sweep runs it once unfaulted, then once per trace event with
``fail_next store_write`` armed at that event (the next commit after it fails, whatever it
carries: a user row, a sentinel, an envelope, a receipt, a partial or final row, a cut
record's change, a recovery write). Every faulted run must:

* end, within a real-time hang guard, without an exception escaping the runner;
* leave no session busy (the runner's "did not reach quiescence" is the wedge);
* strand no queued entry: each one queued is dequeued, cancelled or cleared by the end;
* tell nothing that is not durable: a continuation told ended is not owed in the store, and
  none is told owed before the row carrying its record was written;
* resume no cut twice: a resume told ``failed`` (its consumed record was not written) runs no
  step of its stream.

A run may still end with a scenario-level error (its script expected the unfaulted path and
ran out of steps, or an action found no entry to withdraw) or with failed expectations: the
faulted run legitimately takes another path. ``make test`` runs a fixed sample of placements;
``TURNKEEPER_FUZZ=full`` runs every placement of every library scenario.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agent_session.harness.loader import load_scenario
from agent_session.harness.runner import RunResult
from agent_session.harness.scenario import Scenario
from persistence import CutState, MemoryStore
from tests.scenarios.sweep_kit import FULL, library, run_guarded, with_action

#: In ``make test``: every n-th placement of each scenario (all of them when FULL).
SAMPLE_EVERY = 1 if FULL else 7
#: Errors a faulted run may end with: its own script or actions assumed the unfaulted path, or
#: the host's own ``open_session`` raised (its session's create commit failed: the host was
#: told, as a typed error, and the harness cannot go on without that session).
PATH_ERRORS = ("ran out of scripted steps", "no queued entry", "(create))")


def _faulted(scenario: Scenario, event: str, nth: int) -> Scenario:
    return with_action(scenario, event, nth, {"op": "fail_next", "what": "store_write"})


def _placements(trace: list[dict[str, Any]]) -> list[tuple[str, int]]:
    seen: Counter[str] = Counter()
    placements = []
    for line in trace:
        event = line["event"]
        seen[event] += 1
        if event != "crash":
            placements.append((event, seen[event]))
    return placements


def _stranded_entries(trace: list[dict[str, Any]]) -> list[str]:
    """Entries queued (not batched into another) never dequeued, cancelled or cleared.

    The queue lives in memory (it is not durable yet): a ``crash`` ends its entries with the
    process, so only the last engine's entries are checked.
    """
    queued: list[str] = []
    ended: set[str] = set()
    for line in trace:
        event = line["event"]
        if event == "crash":
            queued, ended = [], set()
        elif event == "queued" and not line["into"]:
            queued.append(line["entry"])
        elif event in ("dequeued", "entry-canceled"):
            ended.add(line["entry"])
        elif event == "cleared":
            ended.update(line["entries"])
    return [entry for entry in queued if entry not in ended]


def _owed_untold_durable(trace: list[dict[str, Any]]) -> list[str]:
    """Cuts told ``owed`` with no ``persisted cut`` before it: a record that was never written.

    The row carrying a cut's record is written first (``persisted cut``), then ``owed`` is
    told (R60); a row whose write failed owes nothing, so nothing may be told owed.
    """
    written = 0
    wrong = []
    for line in trace:
        if line["event"] == "persisted" and line["what"] == "cut":
            written += 1
        elif line["event"] == "owed":
            if written == 0:
                wrong.append(f"{line['session']} {line['cut']}")
            else:
                written -= 1
    return wrong


def _failed_resumes_that_ran(trace: list[dict[str, Any]]) -> list[str]:
    """Streams of a resume told ``failed`` that still ran a step: a cut resumed twice.

    A resume whose consumed record could not be written is told ``failed`` and its stream must
    end before its first step: the cut is still owed and the next attempt resumes it, so a
    stream that ran anyway would run the cut's steps (and tools) a second time.
    """
    launched: dict[str, str] = {}  # session -> the stream its latest resume launched
    dead: set[str] = set()
    wrong: list[str] = []
    for line in trace:
        event = line["event"]
        if event == "stream-start" and line["cause"] == "resume":
            launched[line["session"]] = line["stream"]
        elif event == "resume" and line["outcome"] == "failed" and line["session"] in launched:
            dead.add(launched.pop(line["session"]))
        elif event == "step" and line["stream"] in dead:
            wrong.append(f"{line['session']} {line['stream']} step {line['n']}")
    return wrong


async def _told_but_owed(store: MemoryStore, trace: list[dict[str, Any]]) -> list[str]:
    """Cuts told ended whose durable record still says owed (told before durable)."""
    ended = {
        (line["session"], line["cut"]) for line in trace if line["event"] == "continuation-ended"
    }
    wrong = []
    async with store:
        for session, cut in sorted(ended):
            loaded = await store.load(session, envelopes=False)
            rows = () if loaded is None else loaded.rows
            owed = [r for r in rows if r.stream == cut and r.cut and r.cut.state is CutState.OWED]
            if owed:
                wrong.append(f"{session} {cut}")
    return wrong


#: Outcomes of the faulted runs by class, for the summary ``pytest -s`` prints.
OUTCOMES: Counter[str] = Counter()


def _outcome(result: RunResult) -> str:
    if result.error is not None and "(create))" in result.error:
        return "the host's open_session raised (its create commit failed)"
    if result.error is not None:
        return "ended with a path error (its script or an action assumed the unfaulted path)"
    if result.failures:
        return "ended idle, expectations differ (another path)"
    return "ended idle, every expectation still met"


@pytest.mark.parametrize("path", library(), ids=[p.stem for p in library()])
async def test_a_failed_store_write_at_any_event_never_wedges_a_session(path: Path) -> None:
    scenario = load_scenario(path)
    baseline = await run_guarded(scenario, MemoryStore())
    assert baseline.exit_code == 0, baseline.failures or baseline.error
    placements = _placements(baseline.trace)[::SAMPLE_EVERY]
    problems: list[str] = []
    for event, nth in placements:
        store = MemoryStore()
        result = await run_guarded(_faulted(scenario, event, nth), store)
        where = f"fail_next store_write at {event} #{nth}"
        OUTCOMES[_outcome(result)] += 1
        if result.error is not None and not any(p in result.error for p in PATH_ERRORS):
            problems.append(f"{where}: {result.error}")
        stranded = _stranded_entries(result.trace)
        if stranded:
            problems.append(f"{where}: queued entries stranded: {stranded}")
        ran = _failed_resumes_that_ran(result.trace)
        if ran:
            problems.append(f"{where}: a resume told failed ran its stream: {ran}")
        untold = _owed_untold_durable(result.trace)
        if untold:
            problems.append(f"{where}: told owed with no durable cut record: {untold}")
        told = await _told_but_owed(store, result.trace)
        if told:
            problems.append(f"{where}: told ended but still owed in the store: {told}")
    assert placements
    assert problems == []


def test_zz_print_the_outcomes() -> None:
    """Print the outcome counts (``pytest -s``): the figures a closing note reads."""
    if OUTCOMES:
        print(f"\nfailed-write sweep: {sum(OUTCOMES.values())} faulted runs")
        for outcome, count in sorted(OUTCOMES.items()):
            print(f"  {count:4d}  {outcome}")


def _ended_cuts(trace: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(e["session"], e["cut"]) for e in trace if e["event"] == "continuation-ended"}


async def test_a_cut_records_end_whose_write_failed_is_written_and_told_later() -> None:
    """PS-6: a withdrawal, forfeit or void whose write fails stands, and is written later.

    For every ``persisted cut-void`` of every library scenario, the write is failed (armed at
    the event just before it). The end must still become durable by the end of the run (the
    change waits and is written at the next flush or idle sweep) and be told, after
    that write: a lost change would leave the record owed, and a restart would resume a turn
    that had ended.
    """
    tried = 0
    for path in library():
        scenario = load_scenario(path)
        baseline = await run_guarded(scenario, MemoryStore())
        seen: Counter[str] = Counter()
        for before, line in zip(baseline.trace, baseline.trace[1:], strict=False):
            seen[before["event"]] += 1
            if line["event"] != "persisted" or line["what"] != "cut-void":
                continue
            if any(e["event"] == "crash" for e in baseline.trace[: line["seq"]]):
                continue  # a dead engine's pending change dies with it; recovery re-plans
            store = MemoryStore()
            faulted = _faulted(scenario, before["event"], seen[before["event"]])
            result = await run_guarded(faulted, store)
            ended, told = _ended_cuts(baseline.trace), _ended_cuts(result.trace)
            where = f"{path.stem}: cut-void write failed after {before['event']}"
            assert ended <= told, (where, ended - told)
            assert await _told_but_owed(store, result.trace) == [], where
            tried += 1
    assert tried >= 5
