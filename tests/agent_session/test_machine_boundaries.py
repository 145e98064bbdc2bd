"""PS-6: one decision, one transaction: record changes ride in the boundary of a stream's row.

Record changes the machine decided and has not yet made durable when it commits a stream's row
(the final row, the partial) go in that row's boundary: both become durable, or neither does.
Driven on the machine alone: inputs in, effects out.
"""

from __future__ import annotations

import msgspec

from agent_session import _inputs as _in
from agent_session._continuation import Marker
from agent_session._effects import Commit, Next, Reply
from agent_session._events import ContinuationEnded
from agent_session._machine import TurnMachine
from persistence import CutState, CutStateChange
from stream_manager import (
    Ended,
    FinishReason,
    ModelFallbackProgress,
    Persisted,
    StopWhy,
    TextPart,
    WriteFailed,
)

PROGRESS = ModelFallbackProgress(requested_model="model-q", refused_models=(), chain=())
MARKER = Marker(cut="s-9/4", model="model-q", step_budget=6, progress=PROGRESS)
ENDED = Ended(
    stream="s-9/5",
    model="model-q",
    finish=FinishReason.STOP,
    why=StopWhy.FINISHED,
    steps=2,
    remaining=3,
    progress=PROGRESS,
    queued_stop=None,
    parts=(TextPart(text="the answer"),),
)


def _machine_with_a_withdrawn_cut() -> TurnMachine:
    """A machine whose owed cut (carried by row ``s-9:r12``) a Stop withdrew, unwritten yet."""
    machine = TurnMachine(
        "s-9", "model-q", known_models=frozenset({"model-q"}), resume_attempt_cap=4, next_seq=20
    )
    machine.handle(_in.AdoptOwed(MARKER, "s-9:r12"))
    machine.handle(_in.Stop())  # the withdrawal is decided; no flush ran yet
    assert machine.pending
    return machine


def test_ps6_a_pending_record_change_rides_in_the_final_rows_boundary() -> None:
    machine = _machine_with_a_withdrawn_cut()
    [commit] = machine.handle(_in.FinalReady(ENDED))
    assert isinstance(commit, Commit)
    assert [row.row_id for row in commit.boundary.rows] == ["s-9:r20"]
    assert commit.boundary.cut_states == (
        CutStateChange(row_id="s-9:r12", state=CutState.WITHDRAWN),
    )
    told = [type(event).__name__ for event in commit.tell]
    assert told == ["Persisted", "Persisted", "ContinuationEnded"]  # the row's report first
    assert not machine.pending  # taken by this boundary, not by a second write


def test_ps6_a_failed_row_boundary_puts_its_record_changes_back_for_a_retry() -> None:
    machine = _machine_with_a_withdrawn_cut()
    [commit] = machine.handle(_in.FinalReady(ENDED))
    assert isinstance(commit, Commit)
    assert commit.failed is not None
    failed = msgspec.structs.replace(commit.failed, error=OSError("disk gone"))
    effects = machine.handle(failed)
    assert machine.pending  # the withdrawal waits for the idle sweep's retry
    [reply] = [e for e in effects if isinstance(e, Reply)]
    assert isinstance(reply.value, WriteFailed)
    [retry] = machine.handle(_in.FlushRecords())
    assert isinstance(retry, Commit)
    assert retry.boundary.cut_states == commit.boundary.cut_states
    assert [e for e in retry.tell if isinstance(e, ContinuationEnded)] == [
        e for e in commit.tell if isinstance(e, ContinuationEnded)
    ]


def test_ps6_a_written_row_boundary_goes_on_with_the_rows_own_path() -> None:
    machine = _machine_with_a_withdrawn_cut()
    [commit] = machine.handle(_in.FinalReady(ENDED))
    assert isinstance(commit, Commit)
    assert commit.then is not None
    assert machine.handle(commit.then) == []  # no cut on this row: nothing more to write
    assert machine.handle(_in.FlushRecords()) == []  # the change is not written twice
    assert isinstance(commit.tell[0], Persisted)
    assert commit.tell[0].what == "assistant"
    assert not any(isinstance(e, Next) for e in machine.handle(_in.Sweep()))
