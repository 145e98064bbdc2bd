"""Delegated turns between two sessions of one engine (TD-1 to TD-10, ST-15, R54), end to end.

Each test runs a scenario through ``turnkeeper run`` (memory and SQLite) and reads the trace:
the owner ``lead-2`` delegates to ``worker-5`` under the handle ``task-17``; the worker's
streams carry the handle, and the owner defers on a claimed cut or settles, each told after
the handle record is durable.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from agent_session import Engine, EngineConfig
from agent_session._delegation import (
    ChildEnded,
    ChildForfeited,
    Delegations,
    HandleInUse,
    UnknownHandle,
)
from agent_session.cli import main
from message_queue import Correlation
from persistence import (
    Boundary,
    Committed,
    HandleRecord,
    HandleStatus,
    MemoryStore,
    StoreError,
    UsageError,
)
from stream_manager import FinishReason, ScriptedModel, ScriptStep, VirtualClock

STORES = [pytest.param((), id="sqlite"), pytest.param(("--memory",), id="memory")]
HANG_S = 10.0

HEAD = """
name = "delegation"

[engine]
max_stream_steps = 7

[[models]]
id = "alpha"

[[tools]]
name = "bash"
kind = "client"
result = "started"

[[tools]]
name = "task_await"
kind = "client"
result = "pending"

[[sessions]]
id = "lead-2"
model = "alpha"

[[sessions]]
id = "worker-5"
model = "alpha"

[[actions]]
at = "start"
do = { op = "delegate", owner = "lead-2", target = "worker-5", handle = "task-17", text = "run it" }
"""

CUT_SCRIPT = """
[scripts.alpha]
steps = [
  { tool_calls = [{ tool = "bash", args = { cmd = "start" } }] },
  { tool_calls = [{ tool = "task_await" }] },
  { text = "Report: 3 of 3 green." },
]
"""


def settled(status: str) -> dict[str, object]:
    """The owner's ``settled`` line for ``task-17`` (as :func:`of` gives it)."""
    return {"event": "settled", "session": "lead-2", "handle": "task-17", "status": status}


def run(
    tmp_path: Path, store: tuple[str, ...], text: str, code: int = 0
) -> list[dict[str, object]]:
    scenario, trace = tmp_path / "delegated.toml", tmp_path / "trace.jsonl"
    scenario.write_text(text, encoding="utf-8")
    assert main(["run", *store, "--trace", str(trace), str(scenario)]) == 0
    return [json.loads(line) for line in trace.read_bytes().splitlines()]


def of(lines: list[dict[str, object]], *names: str) -> list[dict[str, object]]:
    """The lines of those events, without ``seq``, ``t`` and ``session``."""
    return [
        {k: v for k, v in line.items() if k not in ("seq", "t")}
        for line in lines
        if line["event"] in names
    ]


def cut_by(entry: str) -> str:
    """An action: at the worker's ``task_await`` start, ``entry`` is queued (it cuts the loop)."""
    return f"""
[[actions]]
at = {{ event = "op-start", tool = "task_await", nth = 1 }}
do = {entry}
"""


#: A wake the worker's monitor queues: it cuts the worker's first stream at its tool boundary.
WAKE = '{ op = "enqueue", session = "worker-5", entry = "w", kind = "wake", text = "done" }'


def at_claim(do: str) -> str:
    """An action: ``do`` inside the owner's first ``claim`` of ``task-17``."""
    return f'\n[[actions]]\nat = {{ event = "claim", handle = "task-17", nth = 1 }}\ndo = {do}\n'


def deferred_then(do: str) -> str:
    """The worker cut by ``WAKE``, taken back at the stream's end (so the owner's claim defers
    on the owed cut), then ``do`` inside that ``claim``."""
    withdraw = '{ op = "withdraw", session = "worker-5", entry = "w" }'
    at_end = '{ event = "stream-end", session = "worker-5", nth = 1 }'
    taken_back = f"\n[[actions]]\nat = {at_end}\ndo = {withdraw}\n"
    return CUT_SCRIPT + cut_by(WAKE) + taken_back + at_claim(do)


@pytest.mark.parametrize("store", STORES)
def test_td2_st15_a_live_wake_defers_and_its_turn_completes_the_delegated_turn(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    text = HEAD + CUT_SCRIPT + cut_by(WAKE) + '[expect]\nhandles = { task-17 = "completed" }\n'
    lines = run(tmp_path, store, text)

    assert of(lines, "claim", "settled") == [
        {"event": "claim", "session": "worker-5", "handle": "task-17", "cut": "worker-5/1",
         "answer": "defer"},
        settled("completed"),
    ]  # fmt: skip
    starts = [line["handle"] for line in lines if line["event"] == "stream-start"]
    assert starts == ["task-17", "task-17"]  # the wake's turn inherits the correlation


@pytest.mark.parametrize("store", STORES)
def test_td3_st15_an_unrelated_message_cuts_the_turn_and_the_owner_settles_interrupted(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    user = '{ op = "send", session = "worker-5", text = "something else" }'
    text = HEAD + CUT_SCRIPT + cut_by(user)
    lines = run(tmp_path, store, text)

    assert of(lines, "claim", "settled") == [
        {"event": "claim", "session": "worker-5", "handle": "task-17", "cut": "worker-5/1",
         "answer": "settle"},
        settled("interrupted"),
    ]  # fmt: skip
    ended = of(lines, "continuation-ended")
    assert [(e["cut"], e["how"]) for e in ended] == [("worker-5/1", "voided")]  # binding no


@pytest.mark.parametrize("store", STORES)
def test_td5_a_user_stop_of_the_delegated_stream_settles_interrupted(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    stop = '{ op = "stop", session = "worker-5" }'
    text = HEAD + CUT_SCRIPT + cut_by(stop)
    lines = run(tmp_path, store, text)

    assert of(lines, "settled") == [settled("interrupted")]


@pytest.mark.parametrize("store", STORES)
def test_td8_the_owner_interrupts_its_handle_and_the_stream_stops(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    interrupt = '{ op = "handle", handle = "task-17", state = "interrupted" }'
    text = (
        HEAD + CUT_SCRIPT + cut_by(interrupt) + '[expect]\nhandles = { task-17 = "interrupted" }\n'
    )
    lines = run(tmp_path, store, text)

    assert of(lines, "settled") == [settled("interrupted")]
    aborts = of(lines, "stream-abort")
    assert [(a["stream"], a["reason"]) for a in aborts] == [("worker-5/1", "system")]


@pytest.mark.parametrize("store", STORES)
def test_td3_a_stream_error_of_the_delegated_turn_settles_error(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    script = '\n[scripts.alpha]\nsteps = [{ error = "terminal" }]\n'
    lines = run(tmp_path, store, HEAD + script + '[expect]\nhandles = { task-17 = "error" }\n')

    assert of(lines, "settled") == [settled("error")]


@pytest.mark.parametrize("store", STORES)
def test_r54_a_failed_settlement_is_retried_on_the_clock_until_it_is_written(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    script = '\n[scripts.alpha]\nsteps = [{ text = "all done" }]\n'
    fail = '[[actions]]\nat = "start"\ndo = { op = "fail_next", what = "settlement", count = 2 }\n'
    text = HEAD + script + fail + '[expect]\nhandles = { task-17 = "completed" }\n'
    lines = run(tmp_path, store, text)

    settled = [line for line in lines if line["event"] == "settled"]
    assert [(line["status"], line["t"]) for line in settled] == [("completed", 3000)]  # 1 s + 2 s


@pytest.mark.parametrize("store", STORES)
def test_st6_r24_r27_disposing_the_target_forfeits_and_settles_the_delegated_turn(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    text = HEAD + deferred_then('{ op = "dispose", session = "worker-5" }')
    lines = run(tmp_path, store, text)

    assert of(lines, "claim", "settled") == [
        {"event": "claim", "session": "worker-5", "handle": "task-17", "cut": "worker-5/1",
         "answer": "defer"},
        settled("interrupted"),
    ]  # fmt: skip
    assert [line["stream"] for line in lines if line["event"] == "stream-start"] == ["worker-5/1"]


# ---------------------------------------------------------------- bad input


async def test_delegating_to_an_unknown_session_or_reusing_a_handle_is_refused() -> None:
    model = ScriptedModel("alpha", [ScriptStep(text="done")] * 3, record=False)
    engine = Engine(
        store=MemoryStore(),
        models={"alpha": model},
        clock=VirtualClock(),
        config=EngineConfig(max_stream_steps=7),
    )
    async with engine:
        await engine.open_session("lead-2", model="alpha")
        await engine.open_session("worker-5", model="alpha")
        with pytest.raises(UsageError, match="no open session 'ghost-1'"):
            engine.delegate("lead-2", "ghost-1", "task-17", "run it")
        with pytest.raises(UsageError, match="cannot delegate a turn to itself"):
            engine.delegate("lead-2", "lead-2", "task-17", "run it")
        delegation = engine.delegate("lead-2", "worker-5", "task-17", "run it")
        with pytest.raises(HandleInUse, match="'task-17' is taken"):
            engine.delegate("lead-2", "worker-5", "task-17", "again")
        with pytest.raises(UnknownHandle, match="'task-99'"):
            engine.interrupt_handle("task-99")
        settled = await delegation.settled()
        assert (settled.status.value, settled.report) == ("completed", "done")


@pytest.mark.parametrize("store", STORES)
def test_td7_r52_a_hard_stop_of_the_target_settles_its_delegated_turn_once(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    hard = '{ op = "hard_stop", session = "worker-5" }'
    text = HEAD + CUT_SCRIPT + cut_by(hard) + '[expect]\nhandles = { task-17 = "interrupted" }\n'
    lines = run(tmp_path, store, text)

    assert of(lines, "settled") == [settled("interrupted")]


@pytest.mark.parametrize("store", STORES)
def test_td4_an_uncorrelated_stream_end_in_the_target_supersedes_the_delegated_turn(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    # the wake is withdrawn (the owner defers on the owed marker); a user message then runs
    send = '{ op = "send", session = "worker-5", text = "unrelated" }'
    lines = run(tmp_path, store, HEAD + deferred_then(send))

    assert of(lines, "claim", "settled") == [
        {"event": "claim", "session": "worker-5", "handle": "task-17", "cut": "worker-5/1",
         "answer": "defer"},
        settled("interrupted"),
    ]  # fmt: skip
    starts = [line["handle"] for line in lines if line["event"] == "stream-start"]
    assert starts == ["task-17", None]


@pytest.mark.parametrize("store", STORES)
def test_td4_a_stream_that_ended_before_the_delegated_turn_began_supersedes_nothing(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    busy = HEAD.replace(
        '[[actions]]\nat = "start"\ndo = { op = "delegate"',
        '[[actions]]\nat = "start"\ndo = { op = "send", session = "worker-5", text = "first" }\n\n'
        '[[actions]]\nat = "start"\ndo = { op = "delegate"',
    )
    script = (
        '\n[scripts.alpha]\nsteps = [{ text = "first answer" }, { text = "delegated answer" }]\n'
    )
    lines = run(tmp_path, store, busy + script + '[expect]\nhandles = { task-17 = "completed" }\n')

    assert [line["status"] for line in lines if line["event"] == "settled"] == ["completed"]
    starts = [line["handle"] for line in lines if line["event"] == "stream-start"]
    assert starts == [None, "task-17"]


async def test_td10_a_settlement_changes_nothing_unless_the_handle_is_still_active() -> None:
    writes: list[str] = []
    told: list[object] = []

    async def write(session: str, boundary: Boundary) -> object:
        writes.extend(f"{r.handle_id}:{r.status}" for r in boundary.handles)
        return None

    delegations = Delegations(
        clock=VirtualClock(),
        emit=told.append,
        spawn=lambda work: None,
        write=write,
        claimer=lambda target: None,
    )
    _, correlation = delegations.open("lead-2", "worker-5", "task-17")
    done = ChildEnded(
        target="worker-5", correlation=correlation, stream="worker-5/3", finish=FinishReason.STOP
    )
    first = delegations.on_child(done)
    assert first is not None
    await first
    again = ChildForfeited(target="worker-5", correlation=correlation, why="disposed")
    stale = Correlation(handle_id="task-17", owner_session="lead-2", turn_id="another-turn")
    assert delegations.on_child(again) is None  # settled already: nothing to write
    assert (
        delegations.on_child(ChildForfeited(target="worker-5", correlation=stale, why="x")) is None
    )
    assert writes == ["task-17:completed"]
    assert delegations.record("task-17").deferred == ()


async def test_ps6_an_active_handle_nothing_continues_after_a_restart_settles_interrupted() -> None:
    store = MemoryStore()
    async with store:
        left = HandleRecord(handle_id="task-31", owner="lead-2", target="worker-5", turn_id="t-8")
        await store.commit("lead-2", Boundary(handles=(left,)), owner=store.owner)
    model = ScriptedModel("alpha", [], record=False)
    engine = Engine(store=store, models={"alpha": model}, clock=VirtualClock())
    async with engine:
        await engine.wait_idle()
        with anyio.fail_after(HANG_S):  # a guard against a hang, not a wait for time
            await engine.delegations.wait_settled("task-31")
        record = engine.delegations.record("task-31")
    assert (record.status, record.reason) == (
        HandleStatus.INTERRUPTED,
        "its turn did not survive the restart: nothing owed continues it",
    )
    async with store:
        assert [r.status for r in (await store.handles()).records] == [HandleStatus.INTERRUPTED]


class _HandlelessStore(MemoryStore):
    """A store whose handle writes fail (the task store is down)."""

    async def commit(self, session: str, boundary: Boundary, *, owner: str | None) -> Committed:
        if boundary.handles:
            raise StoreError("the task store is down")
        return await super().commit(session, boundary, owner=owner)


async def test_a_delegation_whose_handle_cannot_be_written_never_starts() -> None:
    model = ScriptedModel("alpha", [ScriptStep(text="done")], record=False)
    engine = Engine(store=_HandlelessStore(), models={"alpha": model}, clock=VirtualClock())
    async with engine:
        await engine.open_session("lead-2", model="alpha")
        worker = await engine.open_session("worker-5", model="alpha")
        delegation = engine.delegate("lead-2", "worker-5", "task-17", "run it")
        with anyio.fail_after(HANG_S), pytest.raises(StoreError, match="task store is down"):
            await delegation.settled()
        await engine.wait_idle()
        assert model.steps_played == 0  # the prompt was never sent
        assert worker.phase.value == "idle"
        with pytest.raises(UnknownHandle):
            engine.delegations.record("task-17")


#: After the worker's cut is withdrawn and the owner deferred: one forfeit of the continuation.
FORFEITS = {
    "hard-stop-clear": '{ op = "clear_queue", session = "worker-5", hard_stop = true }',
    "dispose": '{ op = "dispose", session = "worker-5" }',
    "attempt-cap": '{ op = "fail_next", what = "pre_stream", count = 3 }',
}


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("forfeit", sorted(FORFEITS))
def test_td11_st6_every_forfeit_of_a_deferred_turn_settles_its_owner_once(
    tmp_path: Path, store: tuple[str, ...], forfeit: str
) -> None:
    text = HEAD + deferred_then(FORFEITS[forfeit])
    lines = run(tmp_path, store, text + '[expect]\nhandles = { task-17 = "interrupted" }\n')

    ended = [line for line in lines if line["event"] == "continuation-ended"]
    assert [line["how"] for line in ended] == ["forfeited"]
    assert of(lines, "settled") == [settled("interrupted")]  # the hook, exactly once
    assert [line["stream"] for line in lines if line["event"] == "stream-start"] == ["worker-5/1"]


async def test_td1_an_end_of_a_missing_foreign_or_deferred_handle_changes_nothing() -> None:
    writes: list[str] = []

    async def write(session: str, boundary: Boundary) -> object:
        writes.extend(f"{r.handle_id}:{r.status}:{r.deferred}" for r in boundary.handles)
        return None

    class Yes:
        def claim(self, correlation: Correlation, stream: str) -> bool:
            return True

    delegations = Delegations(
        clock=VirtualClock(),
        emit=lambda event: None,
        spawn=lambda work: None,
        write=write,
        claimer=lambda target: Yes(),
    )
    _, correlation = delegations.open("lead-2", "worker-5", "task-17")

    def end(target: str, corr: Correlation, stream: str) -> object:
        return delegations.on_child(
            ChildEnded(target=target, correlation=corr, stream=stream, finish=FinishReason.STOP)
        )

    missing = Correlation(handle_id="task-99", owner_session="lead-2", turn_id="task-99")
    assert end("worker-5", missing, "worker-5/1") is None  # no such handle
    assert end("worker-8", correlation, "worker-8/1") is None  # another session's stream
    other_turn = Correlation(handle_id="task-17", owner_session="lead-2", turn_id="t-0")
    assert end("worker-5", other_turn, "worker-5/1") is None  # another turn of the handle
    cut = ChildEnded(
        target="worker-5",
        correlation=correlation,
        stream="worker-5/2",
        finish=FinishReason.TOOL_CALLS,
    )
    first = delegations.on_child(cut)
    assert first is not None
    await first
    assert delegations.on_child(cut) is None  # deferred on that stream already
    assert writes == ["task-17:active:('worker-5/2',)"]
