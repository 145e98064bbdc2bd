"""Stops and sends told inside an event's emission (a scenario action runs there): the engine
stays consistent and reaches idle (SM-14, AS-13).

Found by the generated interleavings of ``test_idle_drain.py``: each of these wedged the
session (an illegal transition raised inside the turn, the session left streaming or a phase
move made twice).
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from agent_session import (
    ContinuationEnded,
    ContinuationOwed,
    EngineConfig,
    EngineEvent,
    EntryDequeued,
    Phase,
    ResumeAttempted,
)
from agent_session.harness import load_scenario
from agent_session.harness.fakes import Faults, FaultyStore
from agent_session.harness.runner import SUPPORTED_OPS, run_scenario
from message_queue import EntryKind
from persistence import CutState, MemoryStore, RowKind, SqliteStore
from stream_manager import (
    LoopStopped,
    Persisted,
    ScriptStep,
    StreamAborted,
    StreamFailed,
    StreamStarted,
    ToolCallPart,
    ToolCallStarted,
)
from tests.agent_session.support import T_, HookTool, P, X, session_rig
from tests.agent_session.test_as_queue_stream_rules import _resume_held
from tests.agent_session.test_as_send_rules import CUT_SCRIPT, BlockingGate, wake_tool


async def test_sm14_a_hard_stop_landing_while_a_step_fails_aborts_the_stream() -> None:
    """The step raises after the stop moved the stream to stopping: the abort wins."""
    async with session_rig({"M": [ScriptStep(error="retryable")]}) as r:
        session = r.session()

        def stop_at_start(event: EngineEvent) -> None:
            if isinstance(event, StreamStarted):
                session.stop()

        r.on(stop_at_start)
        session.send("go")
        await r.settle()
        assert [e.reason for e in r.of(StreamAborted)] == ["user"]
        assert r.of(StreamFailed) == []
        assert session.phase is Phase.IDLE


async def test_sm14_a_hard_stop_told_inside_the_loop_stopped_event_aborts_the_stream() -> None:
    """A Stop inside ``stop`` (the loop's decision, before ``stream-end``): the abort wins."""
    script = [T_("bash"), X("never said")]
    async with session_rig({"M": script}, tools=[HookTool("bash")]) as r:
        session = r.session()

        def wake_then_stop(event: EngineEvent) -> None:
            if isinstance(event, LoopStopped):
                session.stop()

        def wake(_: ToolCallPart) -> None:
            session.enqueue("w", kind=EntryKind.WAKE, entry="w")

        r.tools["bash"].before = wake
        r.on(wake_then_stop)
        session.send("go")
        await r.settle()
        assert [e.reason for e in r.of(StreamAborted)] == ["user"]
        assert session.phase is Phase.IDLE
        assert not session.owes()


async def test_as13_an_entry_queued_inside_the_dequeued_event_queues_behind_it() -> None:
    async with session_rig({"M": [X("first"), X("second")]}) as r:
        session = r.session()

        def queue_another(event: EngineEvent) -> None:
            if isinstance(event, EntryDequeued) and event.entry == "w1":
                session.enqueue("second", kind=EntryKind.WAKE, entry="w2")

        r.on(queue_another)
        session.enqueue("first", kind=EntryKind.WAKE, entry="w1")
        await r.settle()
        assert [e.entry for e in r.of(EntryDequeued)] == ["w1", "w2"]
        assert session.phase is Phase.IDLE
        assert len(r.of(StreamAborted)) == 0
        assert len(session.queue) == 0


async def test_as23_a_partial_whose_write_failed_is_told_as_a_store_write_error() -> None:
    """The aborted stream's partial could not be written: nothing of it is durable, and the
    host hears so (``stream-error`` type ``store_write`` after ``stream-abort``); it is never
    treated as written."""
    faults = Faults()
    store = FaultyStore(MemoryStore(), faults)
    async with session_rig({"M": [ScriptStep(text="half an answer", hang=True)]}, store=store) as r:
        session = r.session()

        def fail_the_partial(event: EngineEvent) -> None:
            if isinstance(event, StreamAborted):
                faults.arm("store_write", 1)  # the next commit is the partial row

        r.on(fail_the_partial)
        session.send("go")
        await anyio.wait_all_tasks_blocked()
        session.stop()
        await r.settle()
        names = r.names()
        assert names.index("stream-abort") < names.index("stream-error")
        (failed,) = r.of(StreamFailed)
        assert failed.type == "store_write"
        assert [row.kind for row in await r.history()] == [RowKind.USER]
        assert not any(isinstance(e, Persisted) and e.what == "partial" for e in r.events)


async def test_ps6_a_withdrawal_whose_write_failed_is_written_by_the_idle_sweep() -> None:
    """A Stop withdraws a continuation whose resume is preparing, and that record's write
    fails. Nothing else writes before the session is idle again: the idle sweep retries the
    change, so the store says withdrawn and a restart could not resume the stopped turn."""
    faults = Faults()
    store = FaultyStore(MemoryStore(), faults)
    gate = BlockingGate("resume")
    async with session_rig(
        {"M": CUT_SCRIPT}, tools=[wake_tool(lambda: r)], gate=gate, store=store
    ) as r:
        await _resume_held(r, gate)
        faults.arm("store_write", 1)  # the withdrawal's write
        r.session().stop()
        gate.hold.release()
        await r.settle()
        assert r.session().phase is Phase.IDLE
        (ended,) = r.of(ContinuationEnded)
        assert (ended.how, ended.why) == ("withdrawn", "user stop")
        rows = await r.history()
    (carrying,) = [row for row in rows if row.cut is not None]
    assert carrying.cut is not None
    assert carrying.cut.state is CutState.WITHDRAWN


async def test_st3_a_soft_stop_cut_whose_partial_failed_to_write_owes_nothing() -> None:
    """The soft-stop cut's one write (the partial carrying the cut record, R58) failed: no
    record is durable, so nothing is told owed, nothing is owed, and no resume follows; the
    host hears ``store_write``, and the queued wake goes next as after any abort."""
    faults = Faults()
    store = FaultyStore(MemoryStore(), faults)
    async with session_rig({"M": [T_("bash"), P("web"), X("the wake's turn")]}, store=store) as r:
        session = r.session()

        def wake_then_fail(event: EngineEvent) -> None:
            if isinstance(event, ToolCallStarted) and event.provider and len(session.queue) == 0:
                session.enqueue("search done", kind=EntryKind.WAKE, entry="w")
            elif isinstance(event, StreamAborted):
                faults.arm("store_write", 1)  # the partial row that carries the cut record

        r.on(wake_then_fail)
        session.send("search the web")
        await r.settle()
        assert not session.owes()
        assert r.of(ContinuationOwed) == []
        assert [e.type for e in r.of(StreamFailed)] == ["store_write"]
        assert [e.entry for e in r.of(EntryDequeued)] == ["w"]
        assert r.of(ResumeAttempted) == []
        rows = await r.history()
        # PS-2: the parts whose row failed are committed by the next row, before it, and
        # without the cut record (nothing is owed)
        assert [row.kind for row in rows] == [
            RowKind.USER,
            RowKind.PARTIAL,
            RowKind.USER,
            RowKind.ASSISTANT,
        ]
        assert rows[1].cut is None


async def test_st3_r65_a_soft_stop_cut_with_no_steps_left_writes_no_record() -> None:
    """The provider-tool soft stop lands on the turn's last step (2 of 2 spent): the partial
    is written without a cut record, nothing is owed, and the wake goes next."""
    async with session_rig(
        {"M": [T_("bash"), P("web"), X("the wake's turn")]},
        config=EngineConfig(max_stream_steps=2),
    ) as r:
        session = r.session()

        def wake(event: EngineEvent) -> None:
            if isinstance(event, ToolCallStarted) and event.provider and len(session.queue) == 0:
                session.enqueue("search done", kind=EntryKind.WAKE, entry="w")

        r.on(wake)
        session.send("search the web")
        await r.settle()
        (aborted,) = r.of(StreamAborted)
        assert (aborted.reason, aborted.remaining) == ("queued-message", 0)
        assert r.of(ContinuationOwed) == []
        assert not session.owes()
        rows = await r.history()
        (partial,) = [row for row in rows if row.kind is RowKind.PARTIAL]
        assert partial.cut is None
        assert [e.entry for e in r.of(EntryDequeued)] == ["w"]


def stop_at_the_resumed_start(tmp_path: Path) -> Path:
    """``withdrawn-wake`` with a user Stop inside the resumed stream's ``stream-start``."""
    library = Path(__file__).resolve().parents[2] / "docs" / "scenarios"
    text = (library / "withdrawn-wake.toml").read_text("utf-8")
    text = text[: text.index("[expect]")] + (
        '[[actions]]\nat = { event = "stream-start", session = "dev", cause = "resume" }\n'
        'do = { op = "stop", session = "dev" }\n'
    )
    path = tmp_path / "stop-at-start.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_as30_r11_a_user_stop_inside_the_resumed_stream_start_runs_no_step(
    tmp_path: Path, kind: str
) -> None:
    """A Stop told inside the resume's own ``stream-start`` (the phase still PREPARING) ends
    the continuation and stops the stream before its first step, with the user's reason."""
    path = stop_at_the_resumed_start(tmp_path)
    store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "s.db")
    result = await run_scenario(load_scenario(path, supported_ops=SUPPORTED_OPS), store)

    assert result.error is None, result.error
    resumed = [line for line in result.trace if line.get("stream") == "dev/2"]
    assert [line["event"] for line in resumed] == ["stream-start", "stream-abort"]
    assert resumed[-1]["reason"] == "user"
    (ended,) = [line for line in result.trace if line["event"] == "continuation-ended"]
    assert (ended["how"], ended["why"]) == ("withdrawn", "user stop")
    (resume,) = [line for line in result.trace if line["event"] == "resume"]
    assert resume["outcome"] == "withdrawn"  # ST-10: its continuation never ran
