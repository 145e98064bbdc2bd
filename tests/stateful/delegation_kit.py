"""A delegated turn under generated actions: its scenario, one run of it, and the properties.

The scenario: the session ``lead`` delegates a turn to ``worker`` under the handle ``h-9``;
the worker's first stream starts a job and waits on it, and a wake queued meanwhile cuts it at
the tool boundary (5 of 7 steps left), so the lead is asked to claim that cut (ST-15). Actions
are added as ``(trigger, op)`` pairs named by the keys of :data:`TRIGGERS` and :data:`OPS`.
:func:`run` runs it through the scenario runner in-process (the real engine, its sessions and
its in-process owner) on a ``MemoryStore`` or a ``SqliteStore``, and reads the store once the
run is quiescent; :func:`check` asserts the properties ``test_delegation_bookkeeping.py``
lists.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from agent_session.harness.loader import load_scenario
from agent_session.harness.runner import RunResult, run_scenario
from persistence import HandleStatus, MemoryStore, SqliteStore, Store

HANDLE = "h-9"
#: Real seconds one run may take (it takes milliseconds): past it, a hang.
GUARD_S = 30.0

HEAD = f"""
name = "delegated turn under generated bookkeeping"

[engine]
max_stream_steps = 7

[[models]]
id = "m"

[[tools]]
name = "bash"
duration_ms = 20
result = "job 4 started"

[[tools]]
name = "job_wait"
duration_ms = 200
result = "job 4 exited 0"

[[sessions]]
id = "lead"
model = "m"

[[sessions]]
id = "worker"
model = "m"

[scripts.m]
steps = [
  {{ tool_calls = [{{ tool = "bash", args = {{ cmd = "make job-4 &" }} }}] }},
  {{ tool_calls = [{{ tool = "job_wait", args = {{ job = 4 }} }}] }},
{"".join(f'  {{ text = "Report {n}: job 4 is green." }},{chr(10)}' for n in range(1, 21))}]

[[actions]]
at = "start"
do = {{ op = "delegate", owner = "lead", target = "worker", handle = "{HANDLE}", text = "job 4" }}

[[actions]]
at = {{ event = "op-start", tool = "job_wait", nth = 1 }}
do = {{ op = "enqueue", session = "worker", entry = "wk", kind = "wake", text = "job 4 done" }}
"""

#: Where generated actions fire: the delegated turn's trigger events (TOML inline tables).
TRIGGERS: dict[str, str] = {
    "start": '"start"',
    "bash-end": '{ event = "tool-call-end", tool = "bash", nth = 1 }',
    "wait-start": '{ event = "op-start", tool = "job_wait", nth = 1 }',
    "wait-end": '{ event = "tool-call-end", tool = "job_wait", nth = 1 }',
    "loop-stop": '{ event = "stop", session = "worker", why = "queued-message", nth = 1 }',
    "owed": '{ event = "owed", session = "worker", nth = 1 }',
    "cut-end": '{ event = "stream-end", session = "worker", nth = 1 }',
    "handle-1": '{ event = "persisted", what = "handle", nth = 1 }',
    "handle-2": '{ event = "persisted", what = "handle", nth = 2 }',
    "handle-3": '{ event = "persisted", what = "handle", nth = 3 }',
    "claim": f'{{ event = "claim", handle = "{HANDLE}", nth = 1 }}',
    "dequeued": '{ event = "dequeued", session = "worker", nth = 1 }',
    "canceled": '{ event = "entry-canceled", session = "worker", nth = 1 }',
    "preparing-2": '{ event = "phase", session = "worker", to = "preparing", nth = 2 }',
    "sentinel": '{ event = "persisted", session = "worker", what = "sentinel", nth = 1 }',
    "envelope-2": '{ event = "persisted", session = "worker", what = "envelope", nth = 2 }',
    "start-2": '{ event = "stream-start", session = "worker", nth = 2 }',
    "ended": '{ event = "continuation-ended", session = "worker", nth = 1 }',
    "resume": '{ event = "resume", session = "worker", nth = 1 }',
    "end-2": '{ event = "stream-end", session = "worker", nth = 2 }',
    "settled": f'{{ event = "settled", handle = "{HANDLE}", nth = 1 }}',
    "recovered": '{ event = "recovered", session = "worker", nth = 1 }',
    "t-100ms": "{ time_ms = 100 }",
    "t-220ms": "{ time_ms = 220 }",
    "t-1500ms": "{ time_ms = 1500 }",
}

#: What generated actions do (TOML inline tables), by a short name for examples.
OPS: dict[str, str] = {
    "withdraw": '{ op = "withdraw", session = "worker", entry = "wk" }',
    "clear": '{ op = "clear_queue", session = "worker" }',
    "clear-hard": '{ op = "clear_queue", session = "worker", hard_stop = true }',
    "send": '{ op = "send", session = "worker", text = "unrelated: rename the module" }',
    "send-turn-end": (
        '{ op = "send", session = "worker", text = "after that, tidy up", mode = "turn-end" }'
    ),
    "stop": '{ op = "stop", session = "worker" }',
    "dispose": '{ op = "dispose", session = "worker" }',
    "crash": '{ op = "crash" }',
    "restart": '{ op = "restart" }',
    "interrupt": f'{{ op = "handle", handle = "{HANDLE}", state = "interrupted" }}',
    **{
        f"fail-store-{n}": f'{{ op = "fail_next", what = "store_write", count = {n} }}'
        for n in (1, 2, 3)
    },
    **{
        f"fail-settlement-{n}": f'{{ op = "fail_next", what = "settlement", count = {n} }}'
        for n in (1, 3)
    },
}

Action = tuple[str, str]  # (trigger name, op name)
#: Ops that end an engine's life: at most two per run keep the runs small.
ENDINGS = frozenset({"crash", "restart"})


def scenario_text(actions: tuple[Action, ...]) -> str:
    """The scenario of one example: the delegated turn, then the generated actions in order."""
    parts = [HEAD]
    for trigger, op in actions:
        parts.append(f"\n[[actions]]\nat = {TRIGGERS[trigger]}\ndo = {OPS[op]}\n")
    return "".join(parts)


@dataclass
class Outcome:
    """One run: its result, and what the store holds at quiescence."""

    result: RunResult
    handles: dict[str, HandleStatus]
    owed_in: set[str]


async def run(text: str, folder: Path, kind: str) -> Outcome:
    path = folder / "scenario.toml"
    path.write_text(text, encoding="utf-8")
    scenario = load_scenario(path)
    store: Store = MemoryStore() if kind == "memory" else SqliteStore(folder / "turns.db")
    with anyio.fail_after(GUARD_S):
        result = await run_scenario(scenario, store)
    async with store:  # the run closed it; read what it holds at quiescence
        stored = await store.handles()
        scan = await store.scan_recoverable()
    assert not stored.corrupt, stored.corrupt
    handles = {record.handle_id: record.status for record in stored.records}
    return Outcome(result, handles, {cut.session.id for cut in scan.cuts})


def lines_of(trace: list[dict[str, Any]], event: str, **fields: object) -> list[int]:
    """The trace positions of the ``event`` lines whose fields equal ``fields``."""
    return [
        i
        for i, line in enumerate(trace)
        if line["event"] == event and all(line.get(k) == v for k, v in fields.items())
    ]


def told_lost_to_a_crash(trace: list[dict[str, Any]], handle: str) -> bool:
    """A crash came after the owner deferred: a settlement it decided may be untold.

    Its write can commit (SQLite commits in a worker thread) while the process dies before the
    event is told: the telling is lost, never the fact (the caller checks the store).
    """
    deferred = lines_of(trace, "claim", handle=handle, answer="defer")
    return bool(deferred) and any(i > deferred[0] for i in lines_of(trace, "crash"))


#: A ``fail_next store_write`` still armed when an engine goes away fails the next engine's
#: first write: the runner's opening of a scenario session (its ``create``). The run then stops
#: there, so only the trace's properties are checked, not the quiescent store's.
NEXT_ENGINE_NOT_OPENED = "injected store write failure (commit of lead (create))"


#: How a continuation ends that the brief's property 2 covers: the owner's "no" voids it.
NO: frozenset[str] = frozenset({"voided"})
#: Every ending but a successor's start: a withdrawal or a forfeit must never be resumed either.
ENDED: frozenset[str] = frozenset({"voided", "withdrawn", "forfeited"})


def check(outcome: Outcome, *, ended: frozenset[str] = NO) -> None:
    """Properties 1 to 3 (``test_delegation_bookkeeping.py``) of one run.

    ``ended``: the ``continuation-ended`` kinds after which no resume of that cut may start
    (a ``claim answer=settle`` always counts).
    """
    result, trace = outcome.result, outcome.result.trace
    shown = "\n".join(str(line) for line in trace)
    # an action that could not run is an outcome; an engine failure or a hang is a finding
    cut_short = result.error is not None and result.error.endswith(NEXT_ENGINE_NOT_OPENED)
    if result.error is not None and not cut_short:
        assert result.error.startswith("$.actions["), f"{result.error}\n{shown}"
    # 1: settled exactly once; a deferring owner's handle is settled in the store
    for handle in outcome.handles:
        settled = lines_of(trace, "settled", handle=handle)
        assert len(settled) <= 1, f"{handle} settled {len(settled)} times\n{shown}"
        if not cut_short and lines_of(trace, "claim", handle=handle, answer="defer"):
            assert outcome.handles[handle] is not HandleStatus.ACTIVE, f"{handle}\n{shown}"
            assert settled or told_lost_to_a_crash(trace, handle), f"{handle} untold\n{shown}"
    # 2: a no (and with ``ended``, any end but a successor's start) is never resumed
    ends = [
        (i, line["cut"])
        for i, line in enumerate(trace)
        if (line["event"] == "claim" and line["answer"] == "settle")
        or (line["event"] == "continuation-ended" and line["how"] in ended)
    ]
    for at, cut in ends:
        resumed = [i for i in lines_of(trace, "resume", cut=cut, outcome="started") if i > at]
        assert not resumed, f"{cut} ended at line {at + 1}, resumed at {resumed[0] + 1}\n{shown}"
    # 3: never both, never neither: an active handle has an owed cut in its target's store
    for handle, status in outcome.handles.items():
        if status is HandleStatus.ACTIVE and not cut_short:
            assert "worker" in outcome.owed_in, f"{handle} active, nothing owed\n{shown}"


def run_example(actions: tuple[Action, ...], kind: str) -> Outcome:
    """Run the scenario of ``actions`` on a fresh store of ``kind`` (``memory``, ``sqlite``)."""
    with tempfile.TemporaryDirectory(prefix="turnkeeper-hypo-") as folder:
        return anyio.run(run, scenario_text(actions), Path(folder), kind)
