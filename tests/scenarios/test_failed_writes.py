"""A failed store write never wedges a session, nor runs, tells or loses anything twice (issue 12).

For every library scenario, the sweep runs it once unfaulted, then once per trace event with
``fail_next store_write`` armed at that event (the next commit after it fails, whatever it
carries: a user row, a sentinel, an envelope, a receipt, a partial or final row, a cut
record's change, a recovery write), and once more with ``fail_next queue_write`` (the durable
queue's own writes: the message stays queued in memory). Every faulted run must:

* end, within a real-time hang guard, without an exception escaping the runner;
* leave no session busy (the runner's "did not reach quiescence" is the wedge);
* strand no queued entry: each one queued is dequeued, cancelled or cleared by the end (a
  user's entry made durable before a ``crash`` by the next engine);
* resume no cut twice, and run no operation twice;
* answer the failed write: tell the host, or write it again (``write_checks``);
* tell nothing before it is durable: each ``owed``, ``continuation-ended``, ``resume``
  started, ``stream-start``, operation event and ``recovered`` abandon follows its write, and
  a continuation told ended is not owed in the store at the end.

A run may still end with failed expectations, or with a scenario-level error its own script
or actions explain: an action found no entry to withdraw, the host's ``open_session`` raised
(its create commit failed), or a turn the unfaulted run never had (a cut whose row was not
written owes nothing, so its queued entry runs as a new turn) found its model's script used
up. A *resume* that runs out of scripted steps is a problem: its cut had run its steps once.
``make test`` runs a fixed sample of placements; ``TURNKEEPER_FUZZ=full`` runs every placement
of every library scenario.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent_session.harness.loader import load_scenario
from agent_session.harness.runner import RunResult
from agent_session.harness.scenario import Scenario
from persistence import CutState, MemoryStore, Store
from tests.scenarios import write_checks as checks
from tests.scenarios.sweep_kit import FULL, library, loaded, run_guarded, with_action
from tests.scenarios.write_log import LoggedPgStore, LoggedStore, Write

#: In ``make test``: every n-th placement of each scenario (all of them when FULL).
SAMPLE_EVERY = 1 if FULL else 7
#: Errors a faulted run may end with: an action assumed the unfaulted path, or the host's own
#: ``open_session`` raised (its session's create commit failed: the host was told, as a typed
#: error, and the harness cannot go on without that session). A model running out of
#: scripted steps is judged by ``_path_error`` (only a new turn may).
PATH_ERRORS = ("no queued entry", "(create))")


def _faulted(scenario: Scenario, event: str, nth: int, what: str = "store_write") -> Scenario:
    return with_action(scenario, event, nth, {"op": "fail_next", "what": what})


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

    A ``crash`` ends with the process the entries that were not durable (agent-initiated ones,
    and a user's whose queue write failed); a user's entry whose ``persisted queue`` came
    before the crash survives it and must be taken up by the next engine.
    """
    queued: list[str] = []
    durable: set[str] = set()
    ended: set[str] = set()
    for line in trace:
        event = line["event"]
        if event == "crash":
            queued = [entry for entry in queued if entry in durable and entry not in ended]
        elif event == "persisted" and line["what"] == "queue":
            durable.add(line["id"])
        elif event == "queued" and not line["into"]:
            queued.append(line["entry"])
        elif event in ("dequeued", "entry-canceled"):
            ended.add(line["entry"])
        elif event == "cleared":
            ended.update(line["entries"])
    return [entry for entry in queued if entry not in ended]


async def _told_but_owed(store: Store, trace: list[dict[str, Any]]) -> list[str]:
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
    if result.error is not None and _exhausted(result.trace):
        return "ended with a new turn the script has no steps for (a cut that owes nothing)"
    if result.error is not None:
        return "ended with a path error (an action assumed the unfaulted path)"
    if result.failures:
        return "ended idle, expectations differ (another path)"
    return "ended idle, every expectation still met"


def _exhausted(trace: list[dict[str, Any]]) -> list[str]:
    return [
        e["message"]
        for e in trace
        if e["event"] == "stream-error" and e["type"] == "script_exhausted"
    ]


def _path_error(result: RunResult) -> bool:
    """Whether the run's error is one its own script or actions explain (see the module doc)."""
    error = result.error
    if error is None:
        return True
    if any(p in error for p in PATH_ERRORS):
        return True
    exhausted = _exhausted(result.trace)  # a resume's are reported by ``resumes_out_of_script``
    return bool(exhausted) and error == "; ".join(exhausted)


async def _problems(
    scenario: Scenario,
    baseline: RunResult,
    writes: list[Write],
    event: str,
    nth: int,
    what: str = "store_write",
    make: Callable[[], LoggedStore | LoggedPgStore] = LoggedStore,
) -> list[str]:
    """What is wrong with the run that fails the next ``what`` write after ``event`` #``nth``."""
    store = make()
    result = await run_guarded(_faulted(scenario, event, nth, what), store, (store.observe,))
    OUTCOMES[_outcome(result)] += 1
    trace = result.trace
    placement = checks.placement(baseline.trace, event, nth)
    found: dict[str, list[str]] = {
        "error": [] if _path_error(result) else [str(result.error)],
        "queued entries stranded": _stranded_entries(trace),
        "a cut resumed twice": checks.cuts_resumed_twice(trace),
        "a resume told failed ran its stream": checks.failed_resumes_that_ran(trace),
        "a resume ran out of scripted steps": checks.resumes_out_of_script(trace),
        "an operation ran twice": checks.operations_run_twice(trace),
        "told before durable": checks.told_before_durable(trace, store.writes),
        "told ended but still owed in the store": await _told_but_owed(store, trace),
    }
    if what == "store_write":  # a failed queue write's answer is the queue in memory
        unanswered = checks.failed_write_unanswered(
            baseline.trace, writes, placement, trace, store.writes
        )
        if unanswered is not None:
            found["a failed write unanswered"] = [unanswered]
    where = f"fail_next {what} at {event} #{nth}"
    return [f"{where}: {what}: {items}" for what, items in found.items() if items]


@pytest.mark.parametrize("what", ["store_write", "queue_write"])
@pytest.mark.parametrize("path", library(), ids=[p.stem for p in library()])
async def test_a_failed_store_write_at_any_event_never_wedges_a_session(
    path: Path, what: str
) -> None:
    """Also for the durable queue's own writes (``queue_write``): a failed one leaves the
    message queued in memory, and it must still run once, nothing else twice."""
    scenario = load_scenario(path)
    store = LoggedStore()
    baseline = await run_guarded(scenario, store, (store.observe,))
    assert baseline.exit_code == 0, baseline.failures or baseline.error
    assert checks.told_before_durable(baseline.trace, store.writes) == []
    placements = _placements(baseline.trace)[::SAMPLE_EVERY]
    problems: list[str] = []
    for event, nth in placements:
        problems += await _problems(scenario, baseline, store.writes, event, nth, what)
    assert placements
    assert problems == []


#: The PostgreSQL sample of ``make test``: a tool call, a stop during one, a queued message.
PG_SAMPLE = ("crash-during-tool", "user-stop-during-tool", "user-message-during-tool")
#: What runs on PostgreSQL: the sample, or (``TURNKEEPER_FUZZ=full``, ``make fuzz``) every
#: library scenario, every placement.
PG_SCENARIOS = tuple(path.stem for path in library()) if FULL else PG_SAMPLE


@pytest.mark.parametrize("name", PG_SCENARIOS)
async def test_a_failed_store_write_never_wedges_a_session_on_postgresql(
    name: str, fresh_pg_url: Callable[[], str]
) -> None:
    """The same sweep on a real server (each run its own schema): in ``make test`` three
    scenarios at every other placement, in ``make fuzz`` every scenario at every placement."""
    scenario = loaded(name)

    def make() -> LoggedPgStore:
        return LoggedPgStore(fresh_pg_url())

    store = make()
    baseline = await run_guarded(scenario, store, (store.observe,))
    assert baseline.exit_code == 0, baseline.failures or baseline.error
    assert checks.told_before_durable(baseline.trace, store.writes) == []
    placements = _placements(baseline.trace)[:: 1 if FULL else 2]
    problems: list[str] = []
    for event, nth in placements:
        problems += await _problems(
            scenario, baseline, store.writes, event, nth, "store_write", make
        )
    assert placements
    assert problems == []


def test_zz_print_the_outcomes() -> None:
    """Print the outcome counts (``pytest -s``): the figures a closing note reads."""
    if OUTCOMES:
        print(f"\nfailed-write sweep: {sum(OUTCOMES.values())} faulted runs")
        for outcome, count in sorted(OUTCOMES.items()):
            print(f"  {count:4d}  {outcome}")
        for gap, count in sorted(checks.KNOWN_GAPS.items()):
            print(f"  {count:4d}  known gap: {gap}")


def _ended_cuts(trace: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """Ended continuations with a durable record (a startup retry's has none to write)."""
    retried = {e["cut"] for e in trace if e["event"] == "recovered" and e["action"] == "retry"}
    return {
        (e["session"], e["cut"])
        for e in trace
        if e["event"] == "continuation-ended" and e["cut"] not in retried
    }


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


async def test_op3_a_stopped_calls_receipt_whose_write_failed_is_told() -> None:
    """OP-3: a user Stop cancels the running ``migrate``; its ``cancelled`` receipt fails.

    The host hears it: a ``store_write`` stream error right after the ``stream-abort``, as for
    a failed partial. The store keeps the operation ``running`` (a startup calls it
    indeterminate), and nothing of the unwritten receipt is told.
    """
    scenario = _faulted(loaded("user-stop-during-tool"), "op-cancel-requested", 1)
    store = LoggedStore()
    result = await run_guarded(scenario, store, (store.observe,))
    ending = [
        (e["event"], e.get("type"))
        for e in result.trace
        if e["event"] in ("stream-abort", "stream-error") and e["stream"] == "dev/1"
    ]
    assert ending == [("stream-abort", None), ("stream-error", "store_write")]
    assert not [e for e in result.trace if e["event"] == "receipt"]
    async with store:
        (receipt,) = (await store.receipts("dev")).records
    assert receipt.state.value == "running"
