"""The owner's remaining rules of delegated turns: TD-3 self-heal, TD-8 removal, TD-9 report
wake-ups, and the startup completion of a turn whose stop row outlived its settlement (PS-6).

As in ``test_delegation.py``: scenarios through ``turnkeeper run`` (memory and SQLite), the
owner ``lead-2`` delegating to ``worker-5`` under the handle ``task-17``.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from agent_session import Engine
from agent_session._delegation import final_report
from agent_session._events import HandleSettled
from agent_session._rows import RowBody, encode_body
from agent_session.cli import main
from persistence import (
    HandleRecord,
    HandleStatus,
    HistoryRow,
    MemoryStore,
    RowKind,
    SessionLoad,
    SessionRecord,
    SqliteStore,
    TurnEnvelope,
    UsageError,
)
from stream_manager import ScriptedModel, ScriptStep, StreamStarted, VirtualClock
from tests.agent_session.test_delegation import (
    CUT_SCRIPT,
    HANG_S,
    HEAD,
    STORES,
    WAKE,
    at_claim,
    cut_by,
    of,
    settled,
)

BUSY_HEAD = HEAD.replace(
    '[[actions]]\nat = "start"\ndo = { op = "delegate"',
    '[[actions]]\nat = "start"\ndo = { op = "send", session = "worker-5", text = "first" }\n\n'
    '[[actions]]\nat = "start"\n'
    'do = { op = "send", session = "worker-5", entry = "other-9", text = "then this" }\n\n'
    '[[actions]]\nat = "start"\ndo = { op = "delegate"',
)


def run(
    tmp_path: Path, store: tuple[str, ...], text: str, *, db: Path | None = None
) -> list[dict[str, object]]:
    scenario, trace = tmp_path / "owner.toml", tmp_path / "trace.jsonl"
    scenario.write_text(text, encoding="utf-8")
    where = ("--db", str(db)) if db is not None and not store else store
    assert main(["run", *where, "--trace", str(trace), str(scenario)]) == 0
    return [json.loads(line) for line in trace.read_bytes().splitlines()]


def statuses(lines: list[dict[str, object]]) -> list[object]:
    return [line["status"] for line in lines if line["event"] == "settled"]


def handles_of(lines: list[dict[str, object]]) -> list[object]:
    return [line["handle"] for line in lines if line["event"] == "stream-start"]


# ---------------------------------------------------------------- TD-8


@pytest.mark.parametrize("store", STORES)
def test_td8_interrupting_a_handle_removes_only_its_queued_prompt(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    script = """
[scripts.alpha]
steps = [
  { text = "first answer", delay_ms = 40 },
  { text = "answer to the other message" },
  { text = "the delegated answer" },
]
"""
    interrupt = """
[[actions]]
at = { time_ms = 15 }
do = { op = "handle", handle = "task-17", state = "interrupted" }
"""
    expect = '[expect]\nhandles = { task-17 = "interrupted" }\nstreams = { worker-5 = 2 }\n'
    lines = run(tmp_path, store, BUSY_HEAD + script + interrupt + expect)

    queued = [line for line in lines if line["event"] == "queued"]
    assert queued[0]["entry"] == "other-9"
    prompt = queued[1]["entry"]
    canceled = of(lines, "entry-canceled")
    assert [c["entry"] for c in canceled] == [prompt]  # that handle's prompt, nothing else
    assert handles_of(lines) == [None, None]  # the delegated prompt never ran
    assert statuses(lines) == ["interrupted"]
    assert [line["stream"] for line in lines if line["event"] == "stream-abort"] == []


# ---------------------------------------------------------------- TD-3 self-heal

CORRELATED_WAKE = (
    '{ op = "enqueue", session = "worker-5", entry = "w-4", kind = "wake", text = "go on", '
    'handle = "task-17", mode = "turn-end" }'
)


@pytest.mark.parametrize("store", STORES)
def test_td3_a_later_correlated_stop_heals_an_error_settlement_to_completed(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    script = '\n[scripts.alpha]\nsteps = [{ error = "terminal" }, { text = "Report: healed." }]\n'
    wake = f"""
[[actions]]
at = {{ event = "stream-start", session = "worker-5", nth = 1 }}
do = {CORRELATED_WAKE}
"""
    expect = '[expect]\nhandles = { task-17 = "completed" }\n'
    lines = run(tmp_path, store, HEAD + script + wake + expect)

    assert of(lines, "settled") == [settled("error"), settled("completed")]
    assert handles_of(lines) == ["task-17", "task-17"]
    persisted = [
        line["seq"]
        for line in lines
        if line["event"] == "persisted" and line["what"] == "handle" and line["session"] == "lead-2"
    ]
    second = [line["seq"] for line in lines if line["event"] == "settled"][1]
    assert persisted[-1] == int(str(second)) - 1  # durable before told


@pytest.mark.parametrize("store", STORES)
def test_td3_a_later_correlated_stop_heals_a_superseded_interrupted_settlement(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    script = """
[scripts.alpha]
steps = [
  { tool_calls = [{ tool = "bash", args = { cmd = "start" } }] },
  { tool_calls = [{ tool = "task_await" }] },
  { text = "the other answer" },
  { text = "Report: 3 of 3 green." },
]
"""
    user = '{ op = "send", session = "worker-5", text = "something else" }'
    lines = run(tmp_path, store, HEAD + script + cut_by(user) + cut_by(CORRELATED_WAKE))

    assert statuses(lines) == ["interrupted", "completed"]
    assert handles_of(lines) == ["task-17", None, "task-17"]


@pytest.mark.parametrize("store", STORES)
def test_td3_td8_an_owner_interrupted_handle_is_never_settled_again(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    interrupt = at_claim('{ op = "handle", handle = "task-17", state = "interrupted" }')
    expect = '[expect]\nhandles = { task-17 = "interrupted" }\n'
    lines = run(tmp_path, store, HEAD + CUT_SCRIPT + cut_by(WAKE) + interrupt + expect)

    assert handles_of(lines) == ["task-17"]  # the wake's turn is refused (TD-8, R41)
    assert statuses(lines) == ["interrupted"]


@pytest.mark.parametrize("store", STORES)
def test_td3_td5_a_user_stopped_handle_is_never_settled_again(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    script = '\n[scripts.alpha]\nsteps = [{ text = "slow", delay_ms = 30 }, { text = "late" }]\n'
    stop_then_wake = f"""
[[actions]]
at = {{ time_ms = 10 }}
do = {{ op = "stop", session = "worker-5" }}

[[actions]]
at = {{ event = "stream-abort", session = "worker-5", nth = 1 }}
do = {CORRELATED_WAKE}
"""
    lines = run(tmp_path, store, HEAD + script + stop_then_wake)

    assert handles_of(lines) == ["task-17"]  # the stopped turn's wake is refused (TD-8)
    assert statuses(lines) == ["interrupted"]


# ---------------------------------------------------------------- startup completion


@pytest.mark.parametrize("store", STORES)
def test_ps6_a_stop_row_durable_before_its_settlement_completes_the_handle_at_start(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    script = '\n[scripts.alpha]\nsteps = [{ text = "Report: 5 of 5 green." }]\n'
    crash = '[[actions]]\nat = { event = "stream-end", session = "worker-5", nth = 1 }\n'
    crash += 'do = { op = "crash" }\n'
    expect = '[expect]\nhandles = { task-17 = "completed" }\n'
    db = tmp_path / "store.db"
    lines = run(tmp_path, store, HEAD + script + crash + expect, db=db)

    crashed = next(line["seq"] for line in lines if line["event"] == "crash")
    after = [line for line in lines if int(str(line["seq"])) > int(str(crashed))]
    assert of(after, "settled") == [settled("completed")]
    if not store:  # the SQLite store outlives the run: the report is the stop row's text
        record = anyio.run(_handle_in, db)
        assert (record.status, record.report) == (HandleStatus.COMPLETED, "Report: 5 of 5 green.")


async def _handle_in(db: Path) -> HandleRecord:
    async with SqliteStore(db) as sqlite:
        (record,) = (await sqlite.handles()).records
    return record


def _load(*rows: tuple[str, RowKind, str | None], streams: tuple[str, ...]) -> SessionLoad:
    """``worker-5``'s history: ``(stream, kind, finish)`` rows; ``streams`` ran for task-17."""
    history = tuple(
        HistoryRow(
            session="worker-5",
            seq=seq,
            row_id=f"worker-5:r{seq}",
            kind=kind,
            body=encode_body(RowBody(text=f"said {seq}", finish=finish)),
            stream=stream,
        )
        for seq, (stream, kind, finish) in enumerate(rows, start=1)
    )
    envelopes = tuple(
        TurnEnvelope(session="worker-5", stream=s, model="alpha", budget=7, cause="send",
                     handle="task-17")
        for s in streams
    )  # fmt: skip
    return SessionLoad(
        record=SessionRecord(id="worker-5", model="alpha"), rows=history, envelopes=envelopes
    )


def test_ps6_only_a_stop_row_of_the_handles_last_stream_is_its_final_report() -> None:
    stop, cut = (
        ("worker-5/2", RowKind.ASSISTANT, "stop"),
        ("worker-5/2", RowKind.ASSISTANT, "tool-calls"),
    )
    assert final_report("task-17", _load(stop, streams=("worker-5/2",))) == "said 1"
    assert final_report("task-17", _load(cut, streams=("worker-5/2",))) is None
    assert final_report("task-99", _load(stop, streams=("worker-5/2",))) is None
    partial = ("worker-5/2", RowKind.PARTIAL, None)
    assert final_report("task-17", _load(stop, partial, streams=("worker-5/2",))) is None
    # its last stream (worker-5/3) started and wrote nothing: the turn did not finish
    assert final_report("task-17", _load(stop, streams=("worker-5/2", "worker-5/3"))) is None
    length = ("worker-5/2", RowKind.ASSISTANT, "length")
    assert final_report("task-17", _load(length, streams=("worker-5/2",))) is None


# ---------------------------------------------------------------- TD-9 report wake-ups


def report(entry: str, **extra: str) -> str:
    """An action's op: a report wake-up for task-17 queued into worker-5 (its target)."""
    more = "".join(f', {key} = "{value}"' for key, value in extra.items())
    return (
        f'{{ op = "enqueue", session = "worker-5", entry = "{entry}", kind = "report", '
        f'text = "child says 2 of 3 done", handle = "task-17"{more} }}'
    )


@pytest.mark.parametrize("store", STORES)
def test_td9_a_report_with_nothing_unrelated_ahead_carries_the_correlation(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    expect = '[expect]\nhandles = { task-17 = "completed" }\n'
    lines = run(tmp_path, store, HEAD + CUT_SCRIPT + cut_by(report("rep-3")) + expect)

    assert of(lines, "claim")[0]["answer"] == "defer"
    assert handles_of(lines) == ["task-17", "task-17"]
    assert statuses(lines) == ["completed"]


@pytest.mark.parametrize("store", STORES)
def test_td9_a_report_behind_an_unrelated_entry_carries_no_correlation(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    script = CUT_SCRIPT.replace('green." },\n', 'green." },\n  { text = "the report turn" },\n')
    user = '{ op = "send", session = "worker-5", text = "something else" }'
    text = HEAD + script + cut_by(user) + cut_by(report("rep-3"))
    lines = run(tmp_path, store, text)

    assert handles_of(lines) == ["task-17", None, None]  # the report ran uncorrelated
    assert statuses(lines) == ["interrupted"]


@pytest.mark.parametrize("store", STORES)
def test_td9_td3_a_removed_report_settles_interrupted_and_the_turn_s_stop_heals_it(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    script = '\n[scripts.alpha]\nsteps = [{ text = "Report: all 3 done.", delay_ms = 30 }]\n'
    actions = f"""
[[actions]]
at = {{ event = "stream-start", session = "worker-5", nth = 1 }}
do = {report("rep-3", dedupe_key="report:task-17", mode="turn-end")}

[[actions]]
at = {{ event = "queued", entry = "rep-3", nth = 1 }}
do = {{ op = "remove_dedupe", session = "worker-5", prefix = "report:" }}
"""
    lines = run(tmp_path, store, HEAD + script + actions)

    canceled = of(lines, "entry-canceled")
    assert [(c["entry"], c["reason"]) for c in canceled] == [("rep-3", "removed")]
    # the cancellation settles the turn; the turn then ends stop and heals it (TD-3)
    assert statuses(lines) == ["interrupted", "completed"]


@pytest.mark.parametrize("store", STORES)
def test_td9_a_report_failing_before_its_stream_settles_error(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    claim = at_claim('{ op = "fail_next", what = "pre_stream", count = 1 }')
    lines = run(tmp_path, store, HEAD + CUT_SCRIPT + cut_by(report("rep-3")) + claim)

    assert statuses(lines)[0] == "error"


async def test_td9_a_report_that_cannot_be_queued_settles_error() -> None:
    model = ScriptedModel("alpha", [ScriptStep(text="done")], record=False)
    engine = Engine(store=MemoryStore(), models={"alpha": model}, clock=VirtualClock())
    told: list[str] = []
    refused: list[UsageError] = []

    def observe(event: object) -> None:
        if isinstance(event, HandleSettled):
            told.append(event.status)
        if isinstance(event, StreamStarted) and event.handle == "task-17":
            try:  # a blank report: the queue refuses it
                engine.queue_report("worker-5", "  ", entry="rep-3", handle="task-17")
            except UsageError as error:
                refused.append(error)

    async with engine:
        await engine.open_session("lead-2", model="alpha")
        await engine.open_session("worker-5", model="alpha")
        engine.add_observer(observe)
        engine.delegate("lead-2", "worker-5", "task-17", "run it")
        await engine.wait_idle()
        with anyio.fail_after(HANG_S):  # a guard against a hang, not a wait for time
            await engine.delegations.wait_settled("task-17")
    assert [str(e) for e in refused] == [
        "session worker-5: a message needs non-blank text or attachments"
    ]
    assert told[0] == "error"
